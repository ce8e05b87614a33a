"""Where a stateless job's wall time goes, from the scheduler's point of view.

Reads `perf sched timehist -w` output recorded while the load generator sent paced
requests, and follows every job through four hops:

  1. the supervisor (a tokio thread) writes the job frame and wakes the worker;
  2. the worker waits to get a CPU (its scheduling delay) ...
  3. ... runs until it writes its result, which wakes a tokio thread;
  4. that tokio thread waits to get a CPU.

Prints percentiles of hops 2, 3 and 4, how many jobs lost more than 1 ms in each, and for
those what the CPU was busy with while the woken task waited for it. No Python in the request path: this only reads a trace file.

    perf sched record -a -o sched.data -- sleep 8 &   # while: scripts/bench --load --paced 300 --seconds 0.1
    perf sched timehist -i sched.data -w > timehist.txt
    python3 benches/sched_timeline.py timehist.txt
"""

import bisect
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
    """Per worker: every time the supervisor woke it and every time it woke the supervisor;
    per task: every run stretch (start, scheduling delay ms, run ms, cpu)."""
    woken = collections.defaultdict(list)  # worker pid -> [time the supervisor woke it]
    woke = collections.defaultdict(list)  # worker pid -> [(time, supervisor tid)]
    runs = collections.defaultdict(list)
    by_cpu = collections.defaultdict(list)  # cpu -> [(start, end, task)]
    for line in lines:
        m = WAKE.match(line)
        if m:
            t, _cpu, waker, wakee = m.groups()
            t, waker_pid, wakee_pid = float(t), pid_of(waker), pid_of(wakee)
            if waker.startswith(SUPERVISOR) and wakee.startswith(WORKER):
                woken[wakee_pid].append(t)
            elif waker.startswith(WORKER) and wakee.startswith(SUPERVISOR):
                woke[waker_pid].append((t, wakee_pid))
            continue
        m = RUN.match(line)
        if m:
            t, cpu, task, _wait, delay, run = m.groups()
            end, run_ms = float(t), float(run)
            runs[pid_of(task)].append((end - run_ms / 1e3, float(delay), run_ms, cpu))
            by_cpu[cpu].append((end - run_ms / 1e3, end, task))
    return woken, woke, runs, by_cpu


def timeline(woken, woke, runs, by_cpu):
    """A stateless worker's job is the last time the supervisor woke it and, in the run
    stretch that followed, it woke the supervisor back (its result). Earlier wake-ups are
    its Ready exchange or spurious (the supervisor reading a socket wakes its peer too)."""
    out = []
    for pid, wakes in woken.items():
        job = None
        own_runs, replies = runs[pid], woke[pid]
        for sent in wakes:
            i = bisect.bisect_left(own_runs, sent - 1e-6, key=lambda r: r[0])
            if i == len(own_runs):
                continue
            start, _, run_ms, cpu = own_runs[i]
            j = bisect.bisect_left(replies, start, key=lambda w: w[0])
            if j < len(replies) and replies[j][0] <= start + run_ms / 1e3 + 1e-6:
                job = (sent, start, cpu, replies[j])
        if job is None:
            continue
        sent, start, worker_cpu, (result_t, tid) = job
        tokio_runs = runs[tid]
        i = bisect.bisect_left(tokio_runs, result_t - 1e-6, key=lambda r: r[0])
        tokio = tokio_runs[i] if i < len(tokio_runs) else None
        if tokio is None:
            continue
        out.append(
            {
                "worker_wait": (start - sent) * 1e3,
                "worker_run": (result_t - start) * 1e3,
                "supervisor_wait": (tokio[0] - result_t) * 1e3,
                "worker_wait_on": occupants(by_cpu[worker_cpu], sent, start, pid, woken),
                "supervisor_wait_on": occupants(
                    by_cpu[tokio[3]], result_t, tokio[0], pid, woken
                ),
            }
        )
    return out


def occupants(rows, since, until, worker, workers):
    """What ran on a CPU between `since` and `until`, in ms per task: the job's own worker,
    another snakecage worker (one a supervisor thread woke: on any server of the machine),
    or a command name. `rows` are in the order the trace printed them: by end time."""
    out = collections.Counter()
    first = bisect.bisect_right(rows, since, key=lambda row: row[1])
    for start, end, task in rows[first:]:
        if start >= until:
            break
        if end > since:
            pid = pid_of(task)
            if pid == worker:
                name = "the job's own worker"
            elif pid in workers:
                name = "another snakecage worker"
            else:
                name = re.sub(r"\[.*", "", task)
            out[name] += (min(end, until) - max(start, since)) * 1e3
    return out


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, round((len(s) - 1) * p))]


def main():
    hops = timeline(*parse(open(sys.argv[1])))
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
    for key, label in (
        ("worker_wait", "job sent -> worker on a CPU"),
        ("supervisor_wait", "result written -> supervisor on a CPU"),
    ):
        busy = collections.Counter()
        for h in hops:
            if h[key] > 1.0:
                busy.update(h[key + "_on"])
        if busy:
            top = ", ".join(f"{name} {ms:.1f} ms" for name, ms in busy.most_common(4))
            print(f"  {label}, waits over 1 ms, the CPU was running: {top}")
    total = [h["worker_wait"] + h["worker_run"] + h["supervisor_wait"] for h in hops]
    slow = sum(1 for v in total if v > 1.0)
    print(f"{'sum of the three':46s} p50 {pct(total, 0.5):7.3f} ms  p90 {pct(total, 0.9):7.3f}  > 1 ms: {slow}")


if __name__ == "__main__":
    main()
