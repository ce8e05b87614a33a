"""Side by side: snakecage against what a user would otherwise pick, in one run on one machine.

The same snippets (print(1+1), a numpy/pandas aggregation, a matplotlib PNG) run through
  * snakecage         POST /v1/execute over loopback HTTP, one keep-alive connection per
                      client; the release server is started here (or --url for a running one);
  * spawn             a fresh `python3.12 -I -S -c CODE` per request; for the snippets that
                      import numpy/pandas/matplotlib, the sandbox venv's `python -I -c CODE`;
  * bwrap             the same spawn inside `bwrap --unshare-all` (only when bwrap is on PATH);
  * jupyter           a warm Jupyter kernel per client (jupyter_client), execute + wait for idle;
  * jupyter-fresh     start a kernel, execute, shut it down, per request;
  * monty             pydantic-monty's worker pool, one checkout (fresh session) per request;
                      snippets it cannot run are reported n/a with its error.
Sequentially (concurrency 1: p50/p99/mean, each request --pace-ms after the previous one,
the same gap for every system) and back to back at concurrency 4 (throughput). Prints a
table with ratios to snakecage and writes peers.md, peers.json (raw samples) and
latency.png (latency CDF per snippet) under --out (default bench-results/).

Run it with the benchmark venv (scripts/bench builds it and the release binaries):
    scripts/bench [-n 2000] [--systems snakecage,spawn,...]
"""

import argparse
import concurrent.futures
import datetime
import http.client
import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SNIPPETS = {
    "print": "print(1+1)",
    "numpy_pandas": (
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'k': np.arange(1000) % 7, 'v': np.arange(1000.0)})\n"
        "print(df.groupby('k')['v'].sum().iloc[3])"
    ),
    "matplotlib_png": (
        "import io\n"
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3))\n"
        "ax.plot([0, 1, 2, 3], [1, 3, 2, 4])\n"
        "buf = io.BytesIO()\n"
        "fig.savefig(buf, format='png')\n"
        "plt.close(fig)\n"
        "print(buf.getvalue()[:4] == b'\\x89PNG')"
    ),
}
# What each snippet must print; a system that prints anything else fails its probe.
EXPECTED = {"print": "2\n", "numpy_pandas": "71500.0\n", "matplotlib_png": "True\n"}
LABELS = {
    "print": "`print(1+1)`",
    "numpy_pandas": "numpy/pandas groupby",
    "matplotlib_png": "matplotlib PNG",
}
HEAVY = ("numpy", "pandas", "matplotlib")
CONCURRENCY = 4


class NotAvailable(Exception):
    """A peer that cannot run on this machine (missing binary or package)."""


def percentile(samples, p):
    ordered = sorted(samples)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def imports_packages(code):
    return any(name in code for name in HEAVY)


# --- the systems ----------------------------------------------------------------------
# Each has `name`, `tier` ("fast": -n samples, "spawn": --spawn-n, "kernel": --kernel-start-n),
# `start()`, `client()` returning `call(code) -> stdout`, and `close()`.


class Snakecage:
    name = "snakecage"
    tier = "fast"

    def __init__(self, args, out_dir):
        self.args, self.out_dir = args, out_dir
        self.server = None
        self.log = None
        self.pool_size = args.pool_size

    def start(self):
        if self.args.url:
            parsed = urllib.parse.urlsplit(self.args.url)
            self.host, self.port = parsed.hostname, parsed.port or 80
        else:
            if not os.access(self.args.binary, os.X_OK):
                raise NotAvailable(f"{self.args.binary} missing: cargo build --release -p snakecage-worker -p snakecage")
            self.host, self.port = "127.0.0.1", free_port()
            state = tempfile.mkdtemp(prefix="snakecage-bench-")
            env = dict(
                os.environ,
                SNAKECAGE_WORKER__STATE_DIR=state,
                SNAKECAGE_POOL__SIZE=str(self.args.pool_size),
                RUST_LOG="warn",
            )
            self.log = open(os.path.join(self.out_dir, "snakecage.log"), "w")
            self.server = subprocess.Popen(
                [self.args.binary, "--listen", f"{self.host}:{self.port}", "--venv", self.args.venv],
                env=env,
                stdout=self.log,
                stderr=self.log,
            )
        health = self.wait_until_full()
        self.pool_size = health["pool"]["target_size"]

    def health(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())

    def wait_until_full(self):
        for _ in range(1200):
            if self.server is not None and self.server.poll() is not None:
                raise NotAvailable(f"snakecage exited with {self.server.returncode}; see snakecage.log")
            try:
                health = self.health()
                if health["pool"]["idle"] >= health["pool"]["target_size"]:
                    return health
            except OSError:
                pass
            time.sleep(0.05)
        raise NotAvailable("snakecage's pool did not fill within 60 s")

    def client(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

        def call(code):
            body = json.dumps({"code": code})
            conn.request("POST", "/v1/execute", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read())
            if resp.status != 200 or data["exit_code"] != 0:
                raise RuntimeError(f"snakecage answered {resp.status}: {data}")
            return data["stdout"]

        return call

    def idle_worker_private_memory(self):
        """Private bytes (clean + dirty) of each idle worker: the zygote's children."""
        if self.server is None:
            return []
        self.wait_until_full()
        time.sleep(0.2)
        sizes = []
        for zygote in child_pids(self.server.pid):
            for worker in child_pids(zygote):
                private = 0
                try:
                    with open(f"/proc/{worker}/smaps_rollup") as f:
                        for line in f:
                            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                                private += int(line.split()[1]) * 1024
                except OSError:
                    continue
                sizes.append(private)
        return sizes

    def close(self):
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        if self.log is not None:
            self.log.close()


class Spawn:
    """A new interpreter per request: `-I -S` for plain code; `-I` from the venv for imports."""

    name = "spawn python -I -S"
    tier = "spawn"

    def __init__(self, args, env):
        self.base_python, self.venv_python, self.env = args.python, args.venv_python, env

    def start(self):
        for exe in (self.base_python, self.venv_python):
            if not os.access(exe, os.X_OK):
                raise NotAvailable(f"{exe} missing")

    def argv(self, code):
        if imports_packages(code):
            return [self.venv_python, "-I", "-c", code]
        return [self.base_python, "-I", "-S", "-c", code]

    def client(self):
        def call(code):
            out = subprocess.run(self.argv(code), capture_output=True, check=True, text=True, env=self.env)
            return out.stdout

        return call

    def close(self):
        pass


class Bwrap(Spawn):
    """The same spawn, inside a fresh set of namespaces from bubblewrap."""

    name = "bwrap --unshare-all"

    def __init__(self, args, env):
        super().__init__(args, env)
        self.bwrap = shutil.which(args.bwrap)
        self.mpl_dir = env["MPLCONFIGDIR"]

    def start(self):
        if self.bwrap is None:
            raise NotAvailable("bwrap not on PATH (Debian package bubblewrap; scripts/bench installs it as root)")
        super().start()
        probe = subprocess.run([*self.wrap(), "/bin/true"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise NotAvailable(f"bwrap cannot create namespaces here: {probe.stderr.strip()}")

    def wrap(self):
        return [
            self.bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            # matplotlib's font cache, warmed by the probe, so no run rebuilds it.
            "--bind", self.mpl_dir, self.mpl_dir,
        ]  # fmt: skip

    def argv(self, code):
        return [*self.wrap(), *super().argv(code)]


class Jupyter:
    """A warm kernel per concurrent client: execute, collect stdout, wait for idle."""

    name = "jupyter warm kernel"
    tier = "fast"

    def __init__(self, env, log):
        self.env, self.log = env, log
        self.kernels = []

    def start(self):
        for module in ("jupyter_client", "ipykernel"):
            if importlib.util.find_spec(module) is None:
                raise NotAvailable(f"{module} not installed (run with the bench venv, .venv-bench)")

    def start_kernel(self):
        from jupyter_client import KernelManager

        km = KernelManager(kernel_name="python3")
        # The "python3" kernel is ipykernel in this interpreter (the bench venv).
        km.start_kernel(env=self.env, stdout=self.log, stderr=self.log)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        return km, kc

    @staticmethod
    def execute(kc, code):
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        reply = kc.execute_interactive(code, output_hook=hook, timeout=120, store_history=False)
        if reply["content"]["status"] != "ok":
            content = reply["content"]
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")
        return "".join(out)

    def client(self):
        km, kc = self.start_kernel()
        self.kernels.append((km, kc))
        return lambda code: self.execute(kc, code)

    def close(self):
        for km, kc in self.kernels:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


class JupyterFresh(Jupyter):
    """Per request: start a kernel, execute, shut it down (kill)."""

    name = "jupyter fresh kernel"
    tier = "kernel"

    def client(self):
        def call(code):
            km, kc = self.start_kernel()
            try:
                return self.execute(kc, code)
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)

        return call


class Monty:
    """pydantic-monty's pool of `monty` worker processes; a fresh session per request."""

    name = "pydantic-monty pool"
    tier = "fast"

    def __init__(self, pool_size):
        self.pool_size = pool_size
        self.pool = None

    def start(self):
        try:
            import pydantic_monty
        except ImportError:
            raise NotAvailable("pydantic_monty not installed (run with the bench venv, .venv-bench)")
        self.pydantic_monty = pydantic_monty
        self.pool = pydantic_monty.Monty(min_processes=self.pool_size, max_processes=self.pool_size)
        self.pool.__enter__()

    def client(self):
        def call(code):
            out = self.pydantic_monty.CollectString()
            # A checkout per request: session state is discarded when it is returned (the
            # worker process itself is reused), the closest match to one job per request.
            with self.pool.checkout() as session:
                session.feed_run(code, print_callback=out)
            return out.output

        return call

    def close(self):
        if self.pool is not None:
            self.pool.__exit__(None, None, None)


# --- measurement ----------------------------------------------------------------------


def measure_latency(call, code, n, warmup, pace_ms):
    """Sequential latency. With ``pace_ms``, each request starts at least that long after
    the previous one ended (the same gap for every system): the latency a request sees on
    a service that is not saturated. Back to back (0), a pre-forking service is measured at
    its refill rate instead: that is what the throughput column shows."""
    for _ in range(warmup):
        call(code)
    samples = []
    for _ in range(n):
        if pace_ms:
            time.sleep(pace_ms / 1000)
        t0 = time.perf_counter()
        call(code)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def measure_throughput(calls, code, seconds):
    """Completed requests per second with one thread per client, all started together."""
    start = threading.Barrier(len(calls) + 1)
    state = {}

    def worker(call):
        start.wait()
        done = 0
        while time.perf_counter() < state["deadline"]:
            call(code)
            done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(worker, call) for call in calls]
        t0 = time.perf_counter()
        state["deadline"] = t0 + seconds
        start.wait()
        total = sum(f.result() for f in futures)
    return total / (time.perf_counter() - t0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
            out.append(int(entry))
    return out


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    load = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem / 2**30, 1),
        "kernel": platform.release(),
        "load_average_1m": round(load[0], 2),
        "bench_python": sys.version.split()[0],
    }


def run_system(system, args, snippets, results):
    """Probes each snippet once (n/a with the error when it fails), then measures it."""
    n = {"fast": args.n, "spawn": args.spawn_n, "kernel": args.kernel_start_n}[system.tier]
    warmup = {"fast": max(3, n // 20), "spawn": 2, "kernel": 0}[system.tier]
    calls = [system.client()]
    for snippet in snippets:
        code = SNIPPETS[snippet]
        key = f"{snippet}/{system.name}"
        try:
            got = calls[0](code)
            if got != EXPECTED[snippet]:
                raise RuntimeError(f"printed {got!r}, expected {EXPECTED[snippet]!r}")
        except Exception as e:  # noqa: BLE001 - any failure of the peer is its result
            reason = " ".join(str(e).split())[:160] or type(e).__name__
            results[key] = {"snippet": snippet, "system": system.name, "na": reason}
            print(f"  {snippet:<15} n/a: {reason}", flush=True)
            continue
        latency = measure_latency(calls[0], code, n, warmup, args.pace_ms)
        while len(calls) < CONCURRENCY:
            calls.append(system.client())
        throughput = measure_throughput(calls, code, args.seconds)
        results[key] = {
            "snippet": snippet,
            "system": system.name,
            "n": n,
            "p50_ms": percentile(latency, 50),
            "p99_ms": percentile(latency, 99),
            "mean_ms": statistics.fmean(latency),
            "throughput_c4": throughput,
            "samples_ms": latency,
        }
        r = results[key]
        print(
            f"  {snippet:<15} p50 {r['p50_ms']:9.3f} ms  p99 {r['p99_ms']:9.3f} ms  "
            f"{throughput:9.1f} req/s at c={CONCURRENCY}  (n={n})",
            flush=True,
        )


# --- reporting ------------------------------------------------------------------------


def fmt_ms(v):
    return f"{v:.3f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_x(x, sign="x"):
    if x is None:
        return "-" if sign == "x" else "—"
    return f"{x:.1f}{sign}" if x >= 0.95 else f"{x:.2g}{sign}"


def ratios(results, snippet, r):
    ours = results.get(f"{snippet}/snakecage")
    if ours is None or "na" in ours or "na" in r:
        return None, None
    return r["p50_ms"] / ours["p50_ms"], ours["throughput_c4"] / r["throughput_c4"]


def table_rows(results, snippets, system_names):
    for snippet in snippets:
        for name in system_names:
            r = results.get(f"{snippet}/{name}")
            if r is not None:
                yield snippet, name, r


def print_console(results, snippets, system_names):
    head = f"{'snippet':<15} {'system':<22} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'req/s c=4':>10} {'p50 x':>8} {'req/s x':>8}"
    print("\n" + head)
    print("-" * len(head))
    for snippet, name, r in table_rows(results, snippets, system_names):
        if "na" in r:
            print(f"{snippet:<15} {name:<22} {'n/a: ' + r['na'][:60]}")
            continue
        lat_x, tput_x = ratios(results, snippet, r)
        lat, tput = fmt_x(lat_x), fmt_x(tput_x)
        print(
            f"{snippet:<15} {name:<22} {fmt_ms(r['p50_ms']):>9} {fmt_ms(r['p99_ms']):>9} "
            f"{fmt_ms(r['mean_ms']):>9} {r['throughput_c4']:>10.1f} {lat:>8} {tput:>8}"
        )
    print("p50 x = this system's p50 / snakecage's; req/s x = snakecage's req/s / this system's (> 1: snakecage is better)")


def targets(results, memory):
    """The issue's targets, each with what this run measured and whether it was met."""

    def get(snippet, name):
        r = results.get(f"{snippet}/{name}")
        return None if r is None or "na" in r else r

    rows = []
    sc, spawn, jup = get("print", "snakecage"), get("print", Spawn.name), get("print", Jupyter.name)
    if sc:
        rows.append(("print(1+1) end to end p50 <= 0.5 ms", f"{sc['p50_ms']:.3f} ms", sc["p50_ms"] <= 0.5))
        rows.append((
            f"print(1+1) >= 1,000 isolated executions/s at c={CONCURRENCY}",
            f"{sc['throughput_c4']:.0f} req/s",
            sc["throughput_c4"] >= 1000,
        ))  # fmt: skip
    if sc and spawn:
        x = spawn["p50_ms"] / sc["p50_ms"]
        rows.append(("print(1+1) >= 15x faster than a python3 -I -S spawn (p50)", f"{x:.1f}x", x >= 15))
    if sc and jup:
        x = jup["p50_ms"] / sc["p50_ms"]
        rows.append(("print(1+1) >= 8x faster than a warm Jupyter kernel (p50)", f"{x:.1f}x", x >= 8))
    sc_np, spawn_np = get("numpy_pandas", "snakecage"), get("numpy_pandas", Spawn.name)
    if sc_np and spawn_np:
        x = spawn_np["p50_ms"] / sc_np["p50_ms"]
        rows.append(("numpy/pandas >= 100x faster than a spawn that imports them (p50)", f"{x:.1f}x", x >= 100))
    if memory:
        median = statistics.median(memory) / 2**20
        rows.append(("idle worker private memory <= 2 MB (median)", f"{median:.2f} MiB", median * 2**20 <= 2e6))
    return rows


def write_markdown(path, meta, results, snippets, system_names, memory, target_rows):
    m = meta["machine"]
    lines = [
        f"Run {meta['started']} on {m['cores']} cores ({m['cpu'] or 'unknown CPU'}), {m['memory_gib']} GiB, "
        f"Linux {m['kernel']}; load average {m['load_average_1m']} at start; snakecage pool size "
        f"{meta['pool_size']}; `{meta['command']}`",
        "",
        f"Latency: sequential requests, each started {meta['pace_ms']:g} ms after the previous one "
        "ended (the same for every system: the latency a request sees on a service that is not "
        "saturated). Throughput: four clients back to back for the whole window.",
        "",
        "| snippet | system | p50 ms | p99 ms | mean ms | req/s at c=4 | p50 vs snakecage | req/s vs snakecage |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for snippet, name, r in table_rows(results, snippets, system_names):
        if "na" in r:
            lines.append(f"| {LABELS[snippet]} | {name} | n/a | | | | | {r['na'].replace('|', '/')} |")
            continue
        lat_x, tput_x = ratios(results, snippet, r)
        lines.append(
            f"| {LABELS[snippet]} | {name} | {fmt_ms(r['p50_ms'])} | {fmt_ms(r['p99_ms'])} | "
            f"{fmt_ms(r['mean_ms'])} | {r['throughput_c4']:.0f} | "
            f"{fmt_x(lat_x, '×')} | {fmt_x(tput_x, '×')} |"
        )
    lines += [
        "",
        "Ratios: the system's p50 over snakecage's, and snakecage's req/s over the system's; "
        "above 1× snakecage is better. For the snippets that import numpy/pandas/matplotlib, "
        "spawn and bwrap run the sandbox venv's `python -I` (site on, so the packages import).",
        "",
    ]
    if memory:
        lines.append(
            f"Idle worker private memory (Private_Clean + Private_Dirty): median "
            f"{statistics.median(memory) / 2**20:.2f} MiB, max {max(memory) / 2**20:.2f} MiB "
            f"over {len(memory)} workers."
        )
        lines.append("")
    if target_rows:
        lines += ["| target | measured | met |", "|---|---:|:---:|"]
        lines += [f"| {t} | {v} | {'yes' if ok else '**no**'} |" for t, v, ok in target_rows]
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(path, results, snippets, system_names):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: no plot (run with the bench venv)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, len(snippets), figsize=(5.5 * len(snippets), 4.2), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, snippet in zip(axes[0], snippets):
        for i, name in enumerate(system_names):
            r = results.get(f"{snippet}/{name}")
            if r is None or "na" in r:
                continue
            xs = sorted(r["samples_ms"])
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            ax.step(xs, ys, where="post", color=colors[i % len(colors)], label=f"{name} (p50 {fmt_ms(r['p50_ms'])} ms)")
        ax.set_xscale("log")
        ax.set_xlabel("latency per request, ms (log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(LABELS[snippet].strip("`"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    fig.suptitle("Sequential end-to-end latency (concurrency 1), CDF per system")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- main -----------------------------------------------------------------------------

SYSTEM_KEYS = ("snakecage", "spawn", "bwrap", "jupyter", "jupyter-fresh", "monty")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/snakecage"))
    ap.add_argument("--url", help="use a running snakecage (e.g. http://127.0.0.1:8000) instead of starting one")
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv"), help="the sandbox venv (numpy, pandas, matplotlib)")
    ap.add_argument("--python", help="CPython for the -I -S spawn (default: the sandbox venv's base interpreter)")
    ap.add_argument("--bwrap", default="bwrap", help="bubblewrap binary")
    ap.add_argument("--pool-size", type=int, default=4, help="snakecage pool size and monty's worker count")
    ap.add_argument("-n", type=int, default=2000, help="sequential samples per snippet for snakecage, jupyter, monty")
    ap.add_argument("--spawn-n", type=int, default=100, help="sequential samples per snippet for spawn and bwrap")
    ap.add_argument("--kernel-start-n", type=int, default=10, help="sequential samples for jupyter-fresh")
    ap.add_argument("--seconds", type=float, default=5, help="duration of each throughput run at concurrency 4")
    ap.add_argument(
        "--pace-ms",
        type=float,
        default=20,
        help="gap before each sequential latency sample, the same for every system (0: back to back)",
    )
    ap.add_argument("--systems", default=",".join(SYSTEM_KEYS), help=f"comma-separated subset of {','.join(SYSTEM_KEYS)}")
    ap.add_argument("--snippets", default=",".join(SNIPPETS), help=f"comma-separated subset of {','.join(SNIPPETS)}")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-results"), help="directory for peers.{md,json} and latency.png")
    args = ap.parse_args()
    args.venv_python = os.path.join(args.venv, "bin", "python")
    args.python = args.python or os.path.realpath(args.venv_python)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.snippets = [s.strip() for s in args.snippets.split(",") if s.strip()]
    for s in args.systems:
        if s not in SYSTEM_KEYS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(SYSTEM_KEYS)}")
    for s in args.snippets:
        if s not in SNIPPETS:
            ap.error(f"unknown snippet {s!r}; choose from {', '.join(SNIPPETS)}")
    return args


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["benches/peers.py", *sys.argv[1:]]),
        "machine": machine(),
        "pool_size": args.pool_size,
        "pace_ms": args.pace_ms,
        "args": {k: v for k, v in vars(args).items()},
    }
    # One matplotlib config/cache dir for every peer that runs CPython itself, so each
    # builds its font cache once (during the probe) rather than on every request.
    mpl_dir = tempfile.mkdtemp(prefix="snakecage-bench-mpl-")
    peer_env = dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=mpl_dir)
    kernel_log = open(os.path.join(args.out, "jupyter-kernels.log"), "w")
    builders = {
        "snakecage": lambda: Snakecage(args, args.out),
        "spawn": lambda: Spawn(args, peer_env),
        "bwrap": lambda: Bwrap(args, peer_env),
        "jupyter": lambda: Jupyter(peer_env, kernel_log),
        "jupyter-fresh": lambda: JupyterFresh(peer_env, kernel_log),
        "monty": lambda: Monty(args.pool_size),
    }
    results, memory, skipped, names = {}, [], {}, []
    try:
        for key in args.systems:
            system = builders[key]()
            print(f"{system.name}:", flush=True)
            try:
                system.start()
            except NotAvailable as e:
                skipped[system.name] = str(e)
                print(f"  skipped: {e}", flush=True)
                continue
            names.append(system.name)
            try:
                if isinstance(system, Snakecage):
                    # With --url the server's own pool size; monty gets as many workers.
                    meta["pool_size"] = args.pool_size = system.pool_size
                    memory = system.idle_worker_private_memory()
                run_system(system, args, args.snippets, results)
            finally:
                system.close()
    finally:
        kernel_log.close()
        shutil.rmtree(mpl_dir, ignore_errors=True)

    print(
        f"\nmachine: {meta['machine']['cores']} cores, {meta['machine']['cpu']}, Linux {meta['machine']['kernel']}, "
        f"load {meta['machine']['load_average_1m']}; snakecage pool size {meta['pool_size']}"
    )
    print_console(results, args.snippets, names)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    if memory:
        print(
            f"idle worker private memory: median {statistics.median(memory) / 2**20:.2f} MiB, "
            f"min {min(memory) / 2**20:.2f}, max {max(memory) / 2**20:.2f} ({len(memory)} workers)"
        )
    target_rows = targets(results, memory)
    if target_rows:
        print("\ntargets:")
        for t, v, ok in target_rows:
            print(f"  {'met   ' if ok else 'MISSED'} {t}: {v}")

    md = os.path.join(args.out, "peers.md")
    write_markdown(md, meta, results, args.snippets, names, memory, target_rows)
    png = os.path.join(args.out, "latency.png")
    plotted = write_plot(png, results, args.snippets, names)
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(
            meta | {"results": results, "skipped": skipped, "idle_worker_private_bytes": memory,
                    "targets": [{"target": t, "measured": v, "met": ok} for t, v, ok in target_rows]},
            f,
            indent=1,
        )  # fmt: skip
    print(f"\nwrote {md}, {os.path.join(args.out, 'peers.json')}" + (f", {png}" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
