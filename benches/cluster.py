"""The cluster on one machine: what three replicas behind HAProxy buy, and what the cluster
machinery costs.

Starts SeaweedFS (`weed` from .venv-cluster), the release `snakecage` binaries and HAProxy
on loopback, then measures, in one run:
  * throughput of stateless `print(1+1)` through HAProxy with 1 and with 3 replicas
    (each replica pool.size 2, --concurrency clients on keep-alive connections, --seconds
    each, HAProxy round-robin);
  * a session call's latency sent to the owning replica directly and sent to another
    replica, which forwards it (p50/p99 over -n calls, sequential);
  * a run that stages a 100 kB input file, with the local file store and with the S3 store
    (p50/p99 over -n calls, sequential).
Prints a Markdown table. Run with the cluster venv's Python after building release binaries:
    source scripts/env.sh; ensure_cluster_venv; cargo build --release -p snakecage -p snakecage-worker
    .venv-cluster/bin/python benches/cluster.py [-n 300] [--seconds 10] [--concurrency 8]
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCESS, SECRET, BUCKET = "bench", "bench-secret", "snakecage"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never answered 200")


class Procs:
    def __init__(self):
        self.procs = []
        self.tmp = tempfile.mkdtemp(prefix="snakecage-cluster-bench-")

    def start(self, args, env=None, name="p"):
        log = open(os.path.join(self.tmp, f"{name}.log"), "wb")
        p = subprocess.Popen(args, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self, p):
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        self.procs.remove(p)

    def close(self):
        for p in list(self.procs):
            self.stop(p)
        shutil.rmtree(self.tmp, ignore_errors=True)


def start_weed(procs):
    data = os.path.join(procs.tmp, "weed")
    os.makedirs(data)
    iam = os.path.join(procs.tmp, "s3.json")
    with open(iam, "w") as f:
        json.dump({"identities": [{"name": "bench", "credentials": [
            {"accessKey": ACCESS, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
    s3 = free_port()
    ports = {k: free_port() for k in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc", "s3.port.grpc")}
    args = [os.path.join(ROOT, ".venv-cluster/bin/weed"), "server", f"-dir={data}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3", f"-s3.port={s3}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
            f"-s3.config={iam}", "-master.volumeSizeLimitMB=64", "-volume.max=16",
            # Its default, 1 % of the disk's size kept free, refuses writes on a large disk
            # with gigabytes free; the benchmark stores a few megabytes.
            "-volume.minFreeSpace=512MiB"]
    args += [f"-{k}={v}" for k, v in ports.items()]
    procs.start(args, name="weed")
    return f"http://127.0.0.1:{s3}"


def server_env(state, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKECAGE_")}
    env.update({
        "SNAKECAGE_WORKER__STATE_DIR": state,
        "SNAKECAGE_WORKSPACE__DIR": state,
        "SNAKECAGE_POOL__SIZE": "2",
        # No quota: an upload then lists nothing first, so the first one creates the bucket
        # (SeaweedFS does for an admin identity); quotas are not what is measured here.
        "SNAKECAGE_FILES__QUOTA_MB": "0",
        "SNAKECAGE_LOG__LEVEL": "warn",
    })
    env.update(extra)
    return env


def s3_env(endpoint, prefix):
    return {
        "SNAKECAGE_FILES__BACKEND": "s3", "SNAKECAGE_S3__BUCKET": BUCKET,
        "SNAKECAGE_S3__PREFIX": prefix, "SNAKECAGE_S3__ENDPOINT": endpoint,
        "SNAKECAGE_S3__PATH_STYLE": "true", "SNAKECAGE_S3__ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
    }


def start_replica(procs, port, extra, name):
    state = os.path.join(procs.tmp, name)
    os.makedirs(state, mode=0o711)
    os.chmod(state, 0o711)
    binary = os.path.join(ROOT, "target/release/snakecage")
    p = procs.start([binary, "--listen", f"127.0.0.1:{port}", "--venv", os.path.join(ROOT, ".venv")],
                    env=server_env(state, extra), name=name)
    wait_http(f"http://127.0.0.1:{port}/health")
    return p


def start_haproxy(procs, ports):
    port = free_port()
    cfg = os.path.join(procs.tmp, f"haproxy-{port}.cfg")
    servers = "".join(f"    server r{i} 127.0.0.1:{p} check\n" for i, p in enumerate(ports))
    with open(cfg, "w") as f:
        f.write("global\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 2s\n"
                "    timeout client 60s\n    timeout server 60s\n\n"
                f"frontend api\n    bind 127.0.0.1:{port}\n    default_backend replicas\n\n"
                "backend replicas\n    balance roundrobin\n    option httpchk GET /ready\n"
                "    default-server inter 1s fall 2 rise 2\n" + servers)
    p = procs.start(["/usr/sbin/haproxy", "-db", "-f", cfg], name=f"haproxy-{port}")
    wait_http(f"http://127.0.0.1:{port}/ready")
    time.sleep(2.5)  # every backend passed its checks
    return p, port


class Client:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.conn.request("POST", path, body=data, headers={"content-type": ctype})
        r = self.conn.getresponse()
        out = r.read()
        return r.status, out


def throughput(port, seconds, concurrency):
    stop = time.monotonic() + seconds
    counts, errors = [0] * concurrency, [0] * concurrency

    def worker(i):
        c = Client(port)
        while time.monotonic() < stop:
            status, _ = c.post("/v1/execute", {"code": "print(1+1)"})
            if status == 200:
                counts[i] += 1
            else:
                errors[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - started), sum(errors)


def latencies(fn, n):
    fn()  # warm
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]


def upload(port, name, data):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    status, out = Client(port).post("/v1/files", body, f"multipart/form-data; boundary={boundary}")
    assert status == 201, out
    return json.loads(out)["file_id"]


def staged_run(port, file_id):
    c = Client(port)
    body = {"code": "print(len(open('in.bin','rb').read()))",
            "files": [{"path": "in.bin", "file_id": file_id}]}

    def run():
        status, out = c.post("/v1/execute", body)
        assert status == 200 and b"100000" in out, out
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    procs = Procs()
    try:
        endpoint = start_weed(procs)
        ports = [free_port() for _ in range(3)]
        ids = ["r0", "r1", "r2"]
        peers = {f"SNAKECAGE_CLUSTER__PEERS__{i}": f"http://127.0.0.1:{p}" for i, p in zip(ids, ports)}
        for rid, port in zip(ids, ports):
            env = {**s3_env(endpoint, "bench"), **peers, "SNAKECAGE_CLUSTER__REPLICA_ID": rid}
            start_replica(procs, port, env, rid)
        deadline = time.monotonic() + 60
        while True:  # the first upload creates the bucket; then every replica is ready
            try:
                upload(ports[0], "probe.bin", b"x")
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/ready")

        rows = []
        _, lb1 = start_haproxy(procs, ports[:1])
        rps1, err1 = throughput(lb1, args.seconds, args.concurrency)
        _, lb3 = start_haproxy(procs, ports)
        rps3, err3 = throughput(lb3, args.seconds, args.concurrency)
        rows.append(("stateless `print(1+1)` via HAProxy, 1 replica", f"{rps1:,.0f} req/s", f"{err1} errors"))
        rows.append(("stateless `print(1+1)` via HAProxy, 3 replicas", f"{rps3:,.0f} req/s",
                     f"{err3} errors; {rps3 / rps1:.2f}x"))

        status, out = Client(ports[0]).post("/v1/sessions", {})
        sid = json.loads(out)["session_id"]
        direct, forwarded = Client(ports[0]), Client(ports[1])
        path = f"/v1/sessions/{sid}/execute"
        d50, d99 = latencies(lambda: direct.post(path, {"code": "x = 1"}), args.n)
        f50, f99 = latencies(lambda: forwarded.post(path, {"code": "x = 1"}), args.n)
        rows.append(("session call, to the owner", f"p50 {d50:.2f} ms", f"p99 {d99:.2f} ms"))
        rows.append(("session call, forwarded by another replica", f"p50 {f50:.2f} ms",
                     f"p99 {f99:.2f} ms; +{f50 - d50:.2f} ms p50"))

        data = os.urandom(100_000)
        s3_id = upload(ports[0], "in.bin", data)
        lport = free_port()
        start_replica(procs, lport, {}, "local")
        wait_http(f"http://127.0.0.1:{lport}/ready")
        local_id = upload(lport, "in.bin", data)
        l50, l99 = latencies(staged_run(lport, local_id), args.n)
        s50, s99 = latencies(staged_run(ports[0], s3_id), args.n)
        rows.append(("run staging a 100 kB file, local store", f"p50 {l50:.2f} ms", f"p99 {l99:.2f} ms"))
        rows.append(("run staging a 100 kB file, S3 store (SeaweedFS)", f"p50 {s50:.2f} ms",
                     f"p99 {s99:.2f} ms; +{s50 - l50:.2f} ms p50"))

        print(f"\n{os.cpu_count()} CPUs; pool.size 2 per replica; {args.concurrency} clients; "
              f"{args.seconds:g} s per throughput run; n={args.n}\n")
        print("| measurement | result | notes |\n| --- | --- | --- |")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} |")
    finally:
        procs.close()


if __name__ == "__main__":
    sys.exit(main())
