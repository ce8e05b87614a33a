"""The fork + exit floor per tier with the zygote's heap anonymous, in huge pages or a memfd snapshot.

Imports a tier's preloads (and, for a tier with pandas, runs a groupby once, as the zygote's
warm-up prepares it), freezes the heap, treats its memory one of three ways (--memory: anon
as built; collapse: MADV_COLLAPSE as worker/src/hugepages.rs; snapshot: memfds as
worker/src/snapshot.rs), then forks --n children from a C loop that runs no Python in the
parent; each child runs --code (nothing by default) and _exits. Prints one line: the VMAs
of the parent, then per child the wall time, CPU (parent + child, getrusage) and minor
faults. No sandbox, no job protocol: the floor under a stateless request on that tier.

    gcc -O2 -shared -fPIC $(python3.12-config --includes) benches/snapshot_floor/floor.c \\
        -o /tmp/snapshot_floor.so
    .venv/bin/python -I benches/snapshot_floor/floor.py --lib /tmp/snapshot_floor.so \\
        --preload numpy,pandas --memory snapshot --code 'print(1+1)'
"""

import argparse
import ctypes
import gc
import importlib
import os
import resource
import time

GROUPBY = (
    "import numpy as np, pandas as pd\n"
    "df = pd.DataFrame({'k': np.arange(1000) % 7, 'v': np.arange(1000.0)})\n"
    "print(df.groupby('k')['v'].sum().iloc[3])"
)


def vmas():
    """(all VMAs, private writable anonymous ones, their MiB)."""
    total = anon = size = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            f = line.split()
            total += 1
            if f[1].startswith("rw") and f[1].endswith("p") and (len(f) < 6 or f[5] == "[heap]"):
                anon += 1
                start, end = (int(x, 16) for x in f[0].split("-"))
                size += end - start
    return total, anon, size >> 20


def cpu_ms(r):
    return (r.ru_utime + r.ru_stime) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True, help="floor.c built as a shared object")
    parser.add_argument("--preload", default="")
    parser.add_argument("--memory", choices=["anon", "collapse", "snapshot"], default="anon")
    parser.add_argument("--code", default="", help="what each child runs ('groupby': the snippet)")
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    code = GROUPBY if args.code == "groupby" else args.code
    lib = ctypes.PyDLL(args.lib)  # PyDLL: the GIL stays held, as in the zygote
    lib.snapshot.restype = ctypes.c_long
    lib.collapse.restype = ctypes.c_long
    lib.fork_loop.argtypes = [ctypes.c_int, ctypes.c_char_p]
    for name in filter(None, args.preload.split(",")):
        importlib.import_module(name)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    if "pandas" in args.preload:
        exec(GROUPBY, {})
    exec(compile(code or "pass", "<child>", "exec"), {})
    gc.collect()
    gc.freeze()
    total, anon, anon_mib = vmas()
    if args.memory == "collapse":
        lib.collapse()
    elif args.memory == "snapshot":
        assert lib.snapshot() >= 0, "snapshot failed"
    lib.fork_loop(5, code.encode())  # the parent's own first writes after the change
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    lib.fork_loop(args.n, code.encode())
    wall = (time.perf_counter() - t0) * 1e3 / args.n
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    parent = (cpu_ms(self1) - cpu_ms(self0)) / args.n
    child = (cpu_ms(kids1) - cpu_ms(kids0)) / args.n
    faults = (kids1.ru_minflt - kids0.ru_minflt) / args.n
    os.write(
        2,
        (
            f"preload {args.preload or '-'} | memory {args.memory} | child "
            f"{args.code or '(nothing)'!r} | {total} VMAs, {anon} anonymous ({anon_mib} MiB) | "
            f"per child: fork to reaped {wall:.3f} ms, CPU {parent + child:.3f} ms "
            f"(parent {parent:.3f}, child {child:.3f}), {faults:.0f} faults\n"
        ).encode(),
    )


if __name__ == "__main__":
    main()
