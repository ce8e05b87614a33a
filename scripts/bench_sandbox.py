"""Request latency with every sandbox layer on versus every layer off.

Starts the release build twice on an ephemeral port (pool of 2, the same
machine), sends the same jobs one after another over a keep-alive connection,
and prints p50/p90/p99 of the end-to-end HTTP latency per job and layer set.
Hardening happens before a worker is Ready, so the difference should be what
the layers cost *during* a job (seccomp on each syscall, Landlock on each
open, the audit hook on each audit event, the import guard on each import).

Usage: scripts/bench-sandbox [requests per job, default 400]
"""

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "snakecage")
LAYERS = [
    "network_namespace", "mount_namespace", "rlimits", "drop_privileges",
    "no_new_privs", "landlock", "seccomp", "audit_hook", "import_guard",
]
JOBS = {
    "print": "print(1)",
    "files+numpy": (
        "import numpy as np, os, json\n"
        "a = np.arange(1000)\n"
        "with open('out.json', 'w') as f:\n"
        "    json.dump({'sum': int(a.sum())}, f)\n"
        "print(os.listdir('.'), open('out.json').read())\n"
    ),
    "pandas": (
        "import pandas as pd\n"
        "df = pd.DataFrame({'a': range(100), 'b': range(100)})\n"
        "df.to_csv('d.csv')\n"
        "print(pd.read_csv('d.csv')['b'].sum())\n"
    ),
}


# Measured from inside the job (its own clock), so only what the layers cost while user
# code runs counts: seccomp on every syscall, Landlock on every open, the audit hook on
# every audit event, the import guard on every import statement.
SYSCALL_HEAVY = (
    "import os, time, json\n"
    "t = time.perf_counter()\n"
    "for i in range(300):\n"
    "    with open('f%d.txt' % (i % 10), 'w') as f:\n"
    "        f.write('x' * 100)\n"
    "    os.stat('f0.txt')\n"
    "    import json, math\n"
    "    os.listdir('.')\n"
    "print((time.perf_counter() - t) * 1000)\n"
)


def start(layers_off):
    state = tempfile.mkdtemp(prefix="snakecage-bench-")
    os.chmod(state, 0o711)
    env = dict(os.environ)
    env.update({
        "SNAKECAGE_POOL__SIZE": "2",
        "SNAKECAGE_WORKER__STATE_DIR": state,
        "SNAKECAGE_SANDBOX__LAYERS_OFF": json.dumps(layers_off),
        "RUST_LOG": "warn,snakecage::server=info",
    })
    proc = subprocess.Popen(
        [BINARY, "--listen", "127.0.0.1:0", "--log-format", "json",
         "--venv", os.path.join(ROOT, ".venv")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in proc.stderr:
        match = re.search(r'"addr":"([^"]+)"', line)
        if match and "snakecage is listening" in line:
            host, port = match.group(1).rsplit(":", 1)
            return proc, host, int(port)
    raise SystemExit("the server did not start")


def run(conn, code):
    body = json.dumps({"code": code})
    conn.request("POST", "/v1/execute", body, {"content-type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    if reply["exit_code"] != 0:
        raise SystemExit("job failed: %r" % reply)
    return reply


def request(conn, code):
    started = time.perf_counter()
    run(conn, code)
    return time.perf_counter() - started


def wait_idle(conn, n):
    while True:
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        if health["pool"]["idle"] >= n:
            return health
        time.sleep(0.02)


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    # Both servers run at once and requests alternate between them (order flipped every
    # round), so load from anything else on the machine hits both sides alike.
    servers = {"on": start([]), "off": start(LAYERS)}
    try:
        conns = {}
        for label, (_, host, port) in servers.items():
            conns[label] = http.client.HTTPConnection(host, port)
            health = wait_idle(conns[label], 2)
            active = sum(1 for v in health["sandbox"].values() if v["state"] == "active")
            print("layers %-3s: %d/%d active" % (label, active, len(health["sandbox"])))
        for job, code in JOBS.items():
            samples = {"on": [], "off": []}
            for i in range(count + 20):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                for label in order:
                    wait_idle(conns[label], 2)  # a ready worker, as requests normally find
                    elapsed = request(conns[label], code)
                    if i >= 20:  # the first rounds warm caches
                        samples[label].append(elapsed)
            p50 = {k: statistics.median(v) * 1000 for k, v in samples.items()}
            p90 = {k: sorted(v)[int(len(v) * 0.9)] * 1000 for k, v in samples.items()}
            print("%-12s p50 on %.3f ms, off %.3f ms (%+.1f%%); p90 on %.3f, off %.3f ms" % (
                job, p50["on"], p50["off"], 100 * (p50["on"] / p50["off"] - 1), p90["on"], p90["off"]))
        inside = {"on": [], "off": []}
        for i in range(count):
            for label in (("on", "off") if i % 2 == 0 else ("off", "on")):
                wait_idle(conns[label], 2)
                inside[label].append(float(run(conns[label], SYSCALL_HEAVY)["stdout"]))
        p50 = {k: statistics.median(v) for k, v in inside.items()}
        print("%-12s p50 on %.3f ms, off %.3f ms (%+.1f%%), timed inside the job" % (
            "syscalls", p50["on"], p50["off"], 100 * (p50["on"] / p50["off"] - 1)))
    finally:
        for proc, _, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _, _ in servers.values():
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
