"""Side-by-side latency and throughput: snakecage against spawning CPython per request.

Starts the release snakecage (or uses --url), then runs the same snippets through
  * snakecage: POST /v1/execute over loopback HTTP (keep-alive connection per client);
  * spawn: a fresh `python3.11 -I -S -c CODE` per request (absolute path, no shim);
    for the numpy/pandas snippet `-I` without `-S`, from the venv, so the import works.
and prints p50/p99/mean per system, throughput at concurrency 4, the ratios, and the
private memory of each idle pre-forked worker.

Run it with the project venv's interpreter: `.venv/bin/python benches/compare.py`
(`scripts/bench` builds what it needs first).
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SNIPPETS = {
    "print": "print(1+1)",
    "numpy_pandas": (
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'k': np.arange(1000) % 7, 'v': np.arange(1000.0)})\n"
        "print(df.groupby('k')['v'].sum().iloc[3])"
    ),
}


def percentile(samples, p):
    ordered = sorted(samples)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Snakecage:
    name = "snakecage"

    def __init__(self, host, port):
        self.host, self.port = host, port

    def client(self):
        conn = http.client.HTTPConnection(self.host, self.port)

        def call(code):
            body = json.dumps({"code": code})
            conn.request("POST", "/v1/execute", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read())
            if resp.status != 200 or data["exit_code"] != 0:
                raise RuntimeError(f"snakecage answered {resp.status}: {data}")
            return data["stdout"]

        return call


class Spawn:
    def __init__(self, base_python, venv_python):
        self.base_python, self.venv_python = base_python, venv_python
        self.name = "spawn python -I -S"

    def client(self):
        def call(code):
            if "numpy" in code:
                argv = [self.venv_python, "-I", "-c", code]
            else:
                argv = [self.base_python, "-I", "-S", "-c", code]
            out = subprocess.run(argv, capture_output=True, check=True, text=True)
            return out.stdout

        return call


def measure_latency(system, code, n, warmup):
    call = system.client()
    for _ in range(warmup):
        call(code)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call(code)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def measure_throughput(system, code, concurrency, seconds):
    deadline = time.perf_counter() + seconds

    def worker():
        call = system.client()
        done = 0
        while time.perf_counter() < deadline:
            call(code)
            done += 1
        return done

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(lambda _: worker(), range(concurrency)))
    return total / (time.perf_counter() - t0)


def worker_private_memory(server_pid):
    """Private bytes (clean + dirty) of each idle worker: the zygote's children."""
    def children(pid):
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                out.append(int(entry))
        return out

    sizes = []
    for zygote in children(server_pid):
        for worker in children(zygote):
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


def start_server(binary, port, pool_size):
    state = tempfile.mkdtemp(prefix="snakecage-bench-")
    env = dict(os.environ, SNAKECAGE_WORKER__STATE_DIR=state, SNAKECAGE_POOL__SIZE=str(pool_size), RUST_LOG="warn")
    proc = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--venv", os.path.join(ROOT, ".venv")],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            health = json.loads(conn.getresponse().read())
            if health["pool"]["idle"] >= pool_size:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("snakecage did not become ready")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/snakecage"))
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("-n", type=int, default=2000, help="sequential requests per snakecage snippet")
    ap.add_argument("--spawn-n", type=int, default=100, help="sequential spawns per snippet")
    ap.add_argument("--seconds", type=float, default=5, help="duration of each throughput run")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    base_python = os.path.realpath(os.path.join(ROOT, ".venv/bin/python"))
    venv_python = os.path.join(ROOT, ".venv/bin/python")
    server = start_server(args.binary, args.port, args.pool_size)
    results = {}
    try:
        time.sleep(0.5)
        memory = worker_private_memory(server.pid)
        systems = [Snakecage("127.0.0.1", args.port), Spawn(base_python, venv_python)]
        for snippet, code in SNIPPETS.items():
            for system in systems:
                n = args.n if system.name == "snakecage" else args.spawn_n
                lat = measure_latency(system, code, n, warmup=max(10, n // 20))
                tput = measure_throughput(system, code, 4, args.seconds)
                results[(snippet, system.name)] = {
                    "p50_ms": percentile(lat, 50),
                    "p99_ms": percentile(lat, 99),
                    "mean_ms": statistics.fmean(lat),
                    "throughput_c4": tput,
                    "n": n,
                }
    finally:
        server.terminate()
        server.wait(timeout=30)

    print(f"machine: {os.cpu_count()} cores, {os.uname().release}; pool size {args.pool_size}")
    print(f"{'snippet':<14} {'system':<20} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'req/s c=4':>10} {'p50 ratio':>10}")
    for snippet in SNIPPETS:
        ours = results[(snippet, "snakecage")]
        for (s, name), r in results.items():
            if s != snippet:
                continue
            ratio = r["p50_ms"] / ours["p50_ms"]
            print(f"{snippet:<14} {name:<20} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} {r['mean_ms']:>9.3f} {r['throughput_c4']:>10.0f} {ratio:>9.1f}x")
    if memory:
        print(f"idle worker private memory: min {min(memory) / 2**20:.2f} MiB, "
              f"median {statistics.median(memory) / 2**20:.2f} MiB, max {max(memory) / 2**20:.2f} MiB "
              f"({len(memory)} workers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k[0]}/{k[1]}": v for k, v in results.items()} | {"idle_worker_private_bytes": memory}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
