"""Start-up of release builds, interleaved: time from spawning the server to `GET /ready` 200,
and to every tier having an idle worker (`/health`), default configuration.

A start-up measurement, not a load benchmark: one poller at 5 ms intervals, one start-up at a
time, 1 s of quiet between start-ups. Each build is a directory holding `snakecage` and
`snakecage-worker` (e.g. a copy of target/release). Prints one line per start-up and a
summary per build.

    /path/to/python3.12 benches/startup.py --builds before=/tmp/a,after=/tmp/b [-n 10] \
        [--port 19300] [--venv .venv]
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

POLL = 0.005
BOUND = 60.0


def get(url: str):
    """(status, body) of a GET, or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def start_up(build: str, port: int, venv: str) -> tuple[float, float]:
    """Seconds from spawn to /ready 200, and to every tier with an idle worker."""
    with tempfile.TemporaryDirectory(prefix="startup-") as state:
        os.chmod(state, 0o711)
        env = dict(os.environ, SNAKECAGE_WORKER__STATE_DIR=state, SNAKECAGE_WORKSPACE__DIR=state)
        base = f"http://127.0.0.1:{port}"
        spawned = time.monotonic()
        server = subprocess.Popen(
            [os.path.join(build, "snakecage"), "--listen", f"127.0.0.1:{port}", "--venv", venv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready = every_tier = None
            while every_tier is None:
                now = time.monotonic() - spawned
                if now > BOUND:
                    raise RuntimeError(f"{build}: not started after {BOUND} s")
                if ready is None:
                    answer = get(base + "/ready")
                    if answer and answer[0] == 200:
                        ready = time.monotonic() - spawned
                answer = get(base + "/health")
                if answer and answer[0] == 200:
                    tiers = json.loads(answer[1]).get("pool", {}).get("tiers", [])
                    if tiers and all(t["idle"] >= 1 for t in tiers):
                        every_tier = time.monotonic() - spawned
                        if ready is None:
                            ready = every_tier
                time.sleep(POLL)
            return ready, every_tier
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", required=True, help="name=dir,name=dir")
    parser.add_argument("-n", type=int, default=10, help="start-ups per build")
    parser.add_argument("--port", type=int, default=19300)
    parser.add_argument("--venv", default=".venv")
    args = parser.parse_args()
    builds = dict(item.split("=", 1) for item in args.builds.split(","))
    venv = os.path.abspath(args.venv)
    results = {name: [] for name in builds}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for round_ in range(args.n):
        for name, build in builds.items():
            ready, every_tier = start_up(build, args.port, venv)
            results[name].append((ready, every_tier))
            print(f"{round_} {name}: /ready {ready:.3f} s, every tier idle {every_tier:.3f} s", flush=True)
            time.sleep(1)
    for name, samples in results.items():
        for what, column in (("/ready 200", 0), ("every tier idle", 1)):
            values = sorted(s[column] for s in samples)
            under = sum(v <= 1.0 for v in values)
            print(
                f"{name}: {what} {values[0]:.2f}-{values[-1]:.2f} s, "
                f"median {statistics.median(values):.2f} s, <= 1 s in {under} of {len(values)}"
            )


if __name__ == "__main__":
    sys.exit(main())
