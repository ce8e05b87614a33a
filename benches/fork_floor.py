"""The floor under a stateless request's cost: fork + exit of an interpreter like the zygote.

Imports the zygote's default preloads, freezes the heap, then forks --n children back to
back; each child runs --child-code (nothing by default) and calls os._exit(0). Prints one line:
the wall time from fork to reaped (p50/p90), the parent's time inside fork(), and the CPU
per child over parent and children (getrusage). No sandbox, no job, no IPC: what is left of
a request once everything snakecage adds is taken away.

Run with the sandbox venv's interpreter: .venv/bin/python benches/fork_floor.py --n 200
"""

import argparse
import gc
import importlib
import os
import resource
import sys
import time

DEFAULT_PRELOAD = "numpy,pandas,matplotlib,matplotlib.pyplot"


def cpu_ms(who):
    r = resource.getrusage(who)
    return (r.ru_utime + r.ru_stime) * 1e3


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, round((len(s) - 1) * p))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--preload", default=DEFAULT_PRELOAD)
    parser.add_argument(
        "--child-code", default="", help="Python the child runs before it exits"
    )
    args = parser.parse_args()
    # `site` stays on so the venv's packages are found; under -I it imports neither
    # threading nor random, whose after-fork hooks would make the floor look worse.
    for name in filter(None, args.preload.split(",")):
        importlib.import_module(name)
    compiled = compile(args.child_code, "<child>", "exec")
    exec(compiled, {})  # the first run pays the one-off costs in the parent, as the zygote's warm-up does
    gc.collect()
    gc.freeze()
    wall, in_fork = [], []
    self0, kids0 = cpu_ms(resource.RUSAGE_SELF), cpu_ms(resource.RUSAGE_CHILDREN)
    for _ in range(args.n):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            if args.child_code:
                exec(compiled, {})
            os._exit(0)
        t1 = time.perf_counter()
        os.waitpid(pid, 0)
        t2 = time.perf_counter()
        in_fork.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    cpu = (
        cpu_ms(resource.RUSAGE_SELF) - self0 + cpu_ms(resource.RUSAGE_CHILDREN) - kids0
    ) / args.n
    print(
        f"fork to reaped p50 {pct(wall, 0.5):.3f} ms, p90 {pct(wall, 0.9):.3f} ms; "
        f"fork() in the parent p50 {pct(in_fork, 0.5):.3f} ms; "
        f"CPU {cpu:.3f} ms per child (parent + child); {args.n} children, "
        f"preloaded {args.preload or 'nothing'}, Python {sys.version.split()[0]}"
        + (f", child runs {args.child_code!r}" if args.child_code else "")
    )


if __name__ == "__main__":
    main()
