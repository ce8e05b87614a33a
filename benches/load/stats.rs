//! What the load generator computes: latency summaries, CPU accounting from `/proc`, and
//! the floors (a paced socketpair round trip between two processes, fork + exit of an
//! interpreter with the zygote's preloads).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Latency percentiles in milliseconds.
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if ms.is_empty() {
                return f64::NAN;
            }
            ms[((ms.len() - 1) as f64 * p).round() as usize]
        };
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: at(1.0),
            mean: ms.iter().sum::<f64>() / ms.len().max(1) as f64,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            self.p50, self.p90, self.p99, self.max
        )
    }

    pub fn to_json(&self) -> Value {
        json!({"p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max, "mean": self.mean})
    }
}

/// One snippet against one server.
pub struct Row {
    /// Median private MiB of an idle worker, per tier.
    pub idle_private_mib: Vec<(String, f64)>,
    pub latency: Summary,
    pub durations: Vec<u64>,
    pub throughput: f64,
    pub paced_cpu: CpuPerRequest,
    pub busy_cpu: CpuPerRequest,
}

impl Row {
    /// How many paced requests reported `duration_ms` 0, 1, 2 and 3 or more.
    pub fn duration_histogram(&self) -> String {
        let mut h = [0usize; 4];
        for &d in &self.durations {
            h[(d as usize).min(3)] += 1;
        }
        format!("{}/{}/{}/{}", h[0], h[1], h[2], h[3])
    }

    pub fn one_line(&self) -> String {
        format!(
            "{}; duration_ms {}; {:.0} req/s; CPU/req tree {:.2} ms paced, {:.2} ms busy, machine {:.2} ms; faults/req {:.0}",
            self.latency.describe(),
            self.duration_histogram(),
            self.throughput,
            self.paced_cpu.tree_ms,
            self.busy_cpu.tree_ms,
            self.busy_cpu.machine_ms,
            self.busy_cpu.tree_faults
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "idle_worker_private_mib": self.idle_private_mib.iter().map(|(tier, mib)| (tier.clone(), json!(mib))).collect::<serde_json::Map<String, Value>>(),
            "latency_ms": self.latency.to_json(),
            "duration_ms": self.durations,
            "req_per_s": self.throughput,
            "cpu_ms_per_request_paced": self.paced_cpu.to_json(),
            "cpu_ms_per_request_busy": self.busy_cpu.to_json(),
            "minor_faults_per_request_busy": self.busy_cpu.tree_faults,
        })
    }
}

pub struct CpuPerRequest {
    /// The server's process tree: supervisor, zygote, workers (live and reaped).
    pub tree_ms: f64,
    /// That tree split: the supervisor, the zygotes themselves (the parent's side of each
    /// fork), the workers (live ones and those the zygotes reaped).
    pub split_ms: TreeSplit,
    /// Minor page faults in that tree.
    pub tree_faults: f64,
    /// Context switches (voluntary and not, every thread) of the supervisor and of the
    /// zygotes: each one is a wake-up.
    pub switches: Switches,
    /// Every CPU of the machine, minus this load generator's own time.
    pub machine_ms: f64,
}

impl CpuPerRequest {
    fn to_json(&self) -> Value {
        let s = self.split_ms;
        json!({
            "tree": self.tree_ms,
            "supervisor": s.supervisor,
            "zygotes": s.zygotes,
            "workers": s.workers,
            "machine": self.machine_ms,
            "switches_supervisor": self.switches.supervisor,
            "switches_zygotes": self.switches.zygotes,
            "schedstat_supervisor": self.switches.supervisor_cpu_ms,
            "schedstat_zygotes": self.switches.zygotes_cpu_ms,
        })
    }
}

/// CPU of the server's process tree by kind of process, in milliseconds.
#[derive(Clone, Copy, Default)]
pub struct TreeSplit {
    pub supervisor: f64,
    pub zygotes: f64,
    pub workers: f64,
}

impl TreeSplit {
    fn total(self) -> f64 {
        self.supervisor + self.zygotes + self.workers
    }

    fn minus(self, before: Self, n: f64) -> Self {
        Self {
            supervisor: (self.supervisor - before.supervisor) / n,
            zygotes: (self.zygotes - before.zygotes) / n,
            workers: (self.workers - before.workers) / n,
        }
    }
}

/// Context switches of the supervisor's threads and of the zygotes' (live threads only),
/// and their CPU time to the nanosecond (`schedstat`; the tick-sampled `stat` times above
/// are too coarse for a fraction of a millisecond per request).
#[derive(Clone, Copy, Default)]
pub struct Switches {
    pub supervisor: f64,
    pub zygotes: f64,
    pub supervisor_cpu_ms: f64,
    pub zygotes_cpu_ms: f64,
}

/// CPU counters at one instant, in milliseconds.
pub struct CpuSnapshot {
    machine: f64,
    this_tool: f64,
    tree: TreeSplit,
    faults: f64,
    switches: Switches,
}

impl CpuSnapshot {
    pub fn take(server: u32) -> Self {
        let (tree, faults, switches) = tree_cpu_ms_and_faults(server);
        Self {
            machine: machine_busy_ms(),
            this_tool: own_cpu_ms(),
            tree,
            faults,
            switches,
        }
    }

    pub fn since(&self, before: &Self, requests: u64) -> CpuPerRequest {
        let n = requests.max(1) as f64;
        let tool = self.this_tool - before.this_tool;
        CpuPerRequest {
            tree_ms: (self.tree.total() - before.tree.total()) / n,
            split_ms: self.tree.minus(before.tree, n),
            tree_faults: (self.faults - before.faults) / n,
            switches: Switches {
                supervisor: (self.switches.supervisor - before.switches.supervisor) / n,
                zygotes: (self.switches.zygotes - before.switches.zygotes) / n,
                supervisor_cpu_ms: (self.switches.supervisor_cpu_ms
                    - before.switches.supervisor_cpu_ms)
                    / n,
                zygotes_cpu_ms: (self.switches.zygotes_cpu_ms - before.switches.zygotes_cpu_ms) / n,
            },
            machine_ms: (self.machine - before.machine - tool) / n,
        }
    }
}

fn clock_tick_ms() -> f64 {
    // SAFETY: sysconf takes a constant and returns a number.
    1e3 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// user + nice + system + irq + softirq over all CPUs (`/proc/stat`).
fn machine_busy_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let busy = [0, 1, 2, 5, 6]
        .iter()
        .map(|&i| fields.get(i).copied().unwrap_or(0.0))
        .sum::<f64>();
    busy * clock_tick_ms()
}

fn own_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// utime + stime + cutime + cstime of `pid` and every descendant (reaped workers are in
/// their zygote's cutime/cstime, live ones are counted themselves), split by kind of
/// process, the same sum of minor faults (minflt + cminflt), and the context switches of
/// the supervisor's and the zygotes' threads.
fn tree_cpu_ms_and_faults(pid: u32) -> (TreeSplit, f64, Switches) {
    let mut split = TreeSplit::default();
    let mut faults = 0.0;
    let mut switches = Switches::default();
    // (pid, depth): 0 the supervisor, 1 a zygote, 2 and more a worker.
    let mut stack = vec![(pid, 0u32)];
    while let Some((pid, depth)) = stack.pop() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces) start at field 3.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        let field = |i: usize| f.get(i).copied().unwrap_or(0.0) * clock_tick_ms();
        // utime + stime, then cutime + cstime (the reaped children's).
        let (own, reaped) = (field(11) + field(12), field(13) + field(14));
        match depth {
            0 => {
                split.supervisor += own;
                split.zygotes += reaped;
            }
            1 => {
                split.zygotes += own;
                split.workers += reaped;
            }
            _ => split.workers += own + reaped,
        }
        // minflt and cminflt (fields 10 and 11).
        faults += f.get(7).copied().unwrap_or(0.0) + f.get(8).copied().unwrap_or(0.0);
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            if depth < 2 {
                let n = context_switches(&task.path());
                let cpu = run_time_ms(&task.path());
                match depth {
                    0 => {
                        switches.supervisor += n;
                        switches.supervisor_cpu_ms += cpu;
                    }
                    _ => {
                        switches.zygotes += n;
                        switches.zygotes_cpu_ms += cpu;
                    }
                }
            }
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            stack.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok())
                    .map(|c| (c, depth + 1)),
            );
        }
    }
    (split, faults, switches)
}

/// The CPU time one thread has run, in milliseconds (`/proc/PID/task/TID/schedstat`).
fn run_time_ms(task: &Path) -> f64 {
    let stat = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
    let ns: f64 = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    ns / 1e6
}

/// Voluntary and involuntary context switches of one thread (`/proc/PID/task/TID/status`).
fn context_switches(task: &Path) -> f64 {
    let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("voluntary_ctxt") || l.starts_with("nonvoluntary_ctxt"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

/// Median private memory (`Private_Clean + Private_Dirty`) of the idle workers of each
/// tier below `server` (each zygote's children), in MiB, by tier name. Tiers differ by
/// 10× (a `bare` worker holds well under 1 MiB, a `plotting` one several), so one median
/// over all of them would say only which tier had the most idle workers.
pub fn idle_private_mib(server: u32) -> Vec<(String, f64)> {
    // Children of every thread: the supervisor starts its zygotes from whichever runtime
    // thread runs that tier's start, and `/proc/PID/task/TID/children` lists a thread's own.
    let children = |pid: u32| -> Vec<u32> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|text| {
                text.split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    };
    let mut tiers: Vec<(String, f64)> = children(server)
        .into_iter()
        .filter_map(|zygote| {
            let tier = zygote_tier(zygote)?;
            let mut private: Vec<f64> = children(zygote)
                .into_iter()
                .filter_map(private_mib)
                .collect();
            private.sort_by(f64::total_cmp);
            Some((tier, private.get(private.len() / 2).copied()?))
        })
        .collect();
    tiers.sort_by(|a, b| a.0.cmp(&b.0));
    tiers
}

/// The tier a zygote serves, from the configuration the supervisor passed on its command
/// line (`--config JSON`); `None` for any other child (a package scan, a rollover's
/// helper).
fn zygote_tier(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|&b| b == 0);
    args.by_ref().find(|a| *a == b"--config")?;
    let config: Value = serde_json::from_slice(args.next()?).ok()?;
    Some(config["tier"].as_str()?.to_owned())
}

fn private_mib(pid: u32) -> Option<f64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: f64 = rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum();
    Some(kib / 1024.0)
}

/// `bare 0.70 / scientific 2.62`: the per-tier medians for a table cell.
pub fn describe_idle(tiers: &[(String, f64)]) -> String {
    if tiers.is_empty() {
        return "-".into();
    }
    tiers
        .iter()
        .map(|(tier, mib)| format!("{tier} {mib:.2}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// A child process that echoes every byte back over a socketpair.
pub struct EchoProcess {
    sock: UnixStream,
    pid: libc::pid_t,
}

impl EchoProcess {
    /// Must run before the process starts threads (it forks).
    pub fn start() -> Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        // SAFETY: called from main before any thread exists; the child only reads, writes
        // and _exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            drop(ours);
            let mut theirs = theirs;
            let mut b = [0u8; 1];
            while theirs.read_exact(&mut b).is_ok() && theirs.write_all(&b).is_ok() {}
            // SAFETY: ends the echo child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        Ok(Self { sock: ours, pid })
    }

    /// `n` one-byte round trips, each `pace` after the previous one.
    pub fn paced_round_trips(mut self, n: usize, pace: Duration) -> Result<Summary> {
        let mut samples = Vec::with_capacity(n);
        let mut b = [0u8; 1];
        for _ in 0..n {
            std::thread::sleep(pace);
            let t0 = Instant::now();
            self.sock.write_all(&b)?;
            self.sock.read_exact(&mut b)?;
            samples.push(t0.elapsed());
        }
        drop(self.sock);
        // SAFETY: waits for the child we forked.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        Ok(Summary::of(&samples))
    }
}

/// The base interpreter of the repository's `.venv` (from its `pyvenv.cfg`), by absolute
/// path: never a shim.
pub fn base_python() -> Result<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = std::fs::read_to_string(root.join(".venv/pyvenv.cfg"))?;
    let home = cfg
        .lines()
        .find_map(|l| l.strip_prefix("home")?.trim_start().strip_prefix('='))
        .context("no home in .venv/pyvenv.cfg")?
        .trim();
    Ok(Path::new(home).join("python3"))
}

/// `n` paced spawns of `python -I -S -c 'print(1+1)'`, each waited for: what a fresh
/// process per request costs without any pool.
pub fn spawn_paced(python: &Path, n: usize, pace: Duration) -> Result<Summary> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(pace);
        let t0 = Instant::now();
        let out = std::process::Command::new(python)
            .args(["-I", "-S", "-c", "print(1+1)"])
            .output()?;
        samples.push(t0.elapsed());
        if out.stdout != b"2\n" {
            bail!("{} printed {:?}", python.display(), out.stdout);
        }
    }
    Ok(Summary::of(&samples))
}

/// Runs `benches/fork_floor.py` with the sandbox venv's interpreter; returns its summary.
pub fn fork_floor(n: usize) -> Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg("-I")
        .arg(root.join("benches/fork_floor.py"))
        .arg("--n")
        .arg(n.to_string())
        .output()
        .context("running benches/fork_floor.py")?;
    if !out.status.success() {
        bail!("fork_floor.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
