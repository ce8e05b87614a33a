"""Where a stateless job's wall time goes, from the scheduler's point of view.

Reads `perf sched timehist -w` output recorded while the load generator sent paced
requests, and follows every job through four hops:

  1. the supervisor (a tokio thread) writes the job frame and wakes the worker;
  2. the worker waits to get a CPU (its scheduling delay) ...
  3. ... runs until it writes its result, which wakes a tokio thread;
  4. that tokio thread waits to get a CPU.

Prints percentiles of hops 2, 3 and 4 and how many jobs lost more than 1 ms in each, with
the CPU each hop ran on. No Python in the request path: this only reads a trace file.

    perf sched record -a -o sched.data -- sleep 8 &   # while: scripts/bench --load --paced 300 --seconds 0.1
    perf sched timehist -i sched.data -w > timehist.txt
    python3 benches/sched_timeline.py timehist.txt
"""

import collections
import re
import sys

WAKE = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(\S+)\s+awakened: (\S+)")
RUN = re.compile(r"^\s*([\d.]+)\s+\[(\d+)\]\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
WORKER = "snakecage-work"  # comm is cut to 15 characters: snakecage-worke
SUPERVISOR = "tokio"


def pid_of(task):
    m = re.search(r"\[(\d+)", task)
    return m.group(1) if m else task


def parse(lines):
    jobs, order = {}, []
    runs = collections.defaultdict(list)  # tid -> [(start, delay ms, run ms, cpu)]
    for line in lines:
        m = WAKE.match(line)
        if m:
            t, cpu, waker, wakee = m.groups()
            t, waker_pid, wakee_pid = float(t), pid_of(waker), pid_of(wakee)
            if waker.startswith(SUPERVISOR) and wakee.startswith(WORKER) and wakee_pid not in jobs:
                jobs[wakee_pid] = {"sent": t, "results": []}
                order.append(wakee_pid)
            elif waker.startswith(WORKER) and wakee.startswith(SUPERVISOR) and waker_pid in jobs:
                jobs[waker_pid]["results"].append((t, wakee_pid, cpu))
            continue
        m = RUN.match(line)
        if m:
            t, cpu, task, _wait, delay, run = m.groups()
            end, run_ms = float(t), float(run)
            runs[pid_of(task)].append((end - run_ms / 1e3, float(delay), run_ms, cpu))
    return jobs, order, runs


def timeline(jobs, order, runs):
    out = []
    for pid in order:
        job = jobs[pid]
        after = [r for r in runs[pid] if r[0] >= job["sent"] - 1e-6]
        if not after:
            continue
        start, _, _, worker_cpu = after[0]
        results = [r for r in job["results"] if r[0] >= start]
        if not results:
            continue
        result_t, tid, _ = results[0]
        tokio = [r for r in runs[tid] if r[0] >= result_t - 1e-6]
        if not tokio:
            continue
        out.append(
            {
                "worker_wait": (start - job["sent"]) * 1e3,
                "worker_run": (result_t - start) * 1e3,
                "supervisor_wait": (tokio[0][0] - result_t) * 1e3,
                "worker_cpu": worker_cpu,
                "supervisor_cpu": tokio[0][3],
            }
        )
    return out


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, round((len(s) - 1) * p))]


def main():
    jobs, order, runs = parse(open(sys.argv[1]))
    hops = timeline(jobs, order, runs)
    if not hops:
        sys.exit("no job found in the trace")
    print(f"{len(hops)} jobs")
    for key, label in (
        ("worker_wait", "job sent -> worker on a CPU"),
        ("worker_run", "worker on a CPU -> result written"),
        ("supervisor_wait", "result written -> supervisor thread on a CPU"),
    ):
        values = [h[key] for h in hops]
        slow = sum(1 for v in values if v > 1.0)
        print(
            f"{label:46s} p50 {pct(values, 0.5):7.3f} ms  p90 {pct(values, 0.9):7.3f}  "
            f"p99 {pct(values, 0.99):7.3f}  max {max(values):7.3f}  > 1 ms: {slow}"
        )
    total = [h["worker_wait"] + h["worker_run"] + h["supervisor_wait"] for h in hops]
    slow = sum(1 for v in total if v > 1.0)
    print(f"{'sum of the three':46s} p50 {pct(total, 0.5):7.3f} ms  p90 {pct(total, 0.9):7.3f}  > 1 ms: {slow}")


if __name__ == "__main__":
    main()
