//! Closed-loop load generator in Rust (no Python client in the loop): starts release
//! `snakecage` servers as separate processes, then for each snippet measures
//!
//! - paced latency: `--paced` sequential requests, each `--pace-ms` after the previous
//!   answer (p50/p90/p99/max, and the histogram of the `duration_ms` the server reports);
//! - throughput: `--concurrency` clients back to back for `--seconds` (req/s);
//! - CPU per request over that window: the server's process tree (supervisor, zygote,
//!   live and reaped workers, from `/proc/PID/stat`) and the whole machine (`/proc/stat`
//!   busy time minus this tool's own `getrusage`);
//! - with `--floors`, the floors under those numbers: a paced wake-up over a Unix
//!   socketpair between two processes, and fork + exit of an interpreter with the same
//!   preloads (`benches/fork_floor.py`).
//!
//! Several `--server NAME=DIR` (DIR holds `snakecage` and `snakecage-worker`) are measured
//! in interleaved rounds, so an A/B comparison shares one run's machine state.
//!
//! With `--rollover`, instead: the cost of a zero-downtime rollover to the traffic around
//! it (`load/rollover.rs`): the switch time, and p50/p99 of stateless requests at
//! `--concurrency` before and during a `POST /v1/admin/reload`, for `--rounds` reloads.
//!
//! `cargo bench --bench load -- --help`; `scripts/bench --load` builds and runs it.

#[path = "load/rollover.rs"]
mod rollover;
#[path = "load/stats.rs"]
mod stats;
#[path = "load/target.rs"]
mod target;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use stats::{CpuSnapshot, Summary};
use target::Server;

const SNIPPETS: [(&str, &str); 5] = [
    ("print", "print(1+1)"),
    // Pure Python of the kind agents write: a function, comprehensions, an f-string, a
    // caught exception, the last expression displayed (bare tier).
    (
        "python",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\ndata = [{'name': f'item{i}', 'value': i * i} for i in range(50)]\ntotal = sum(d['value'] for d in data)\ntry:\n    int('x')\nexcept ValueError as e:\n    msg = str(e)\nprint(f'total={total} fib={fib(15)} {msg}')\nsorted(data, key=lambda d: -d['value'])[:2]",
    ),
    // A light job on the scientific tier: its fork and exit, not its work, dominate.
    ("numpy", "import numpy as np\nprint(np.arange(10).sum())"),
    (
        "numpy_pandas",
        "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.arange(1000) % 7, 'v': np.arange(1000.0)})\nprint(df.groupby('k')['v'].sum().iloc[3])",
    ),
    // Top-level await over a few coroutines (the async tier).
    (
        "asyncio",
        "import asyncio\nasync def twice(x):\n    await asyncio.sleep(0)\n    return 2 * x\nprint(sum(await asyncio.gather(*(twice(i) for i in range(10)))))",
    ),
];

const USAGE: &str =
    "usage: load [--server NAME=DIR]... [--rounds N] [--snippets print,numpy_pandas]
            [--paced N] [--pace-ms MS] [--concurrency C] [--seconds S] [--pool-size P]
            [--env KEY=VALUE]... [--server-env NAME:KEY=VALUE]... [--floors] [--json PATH]
            [--rollover]";

struct Options {
    servers: Vec<(String, PathBuf)>,
    rounds: usize,
    snippets: Vec<String>,
    paced: usize,
    pace: Duration,
    concurrency: usize,
    seconds: f64,
    pool_size: usize,
    env: Vec<(String, String)>,
    /// Environment for one server only (after `env`): (server name, key, value).
    server_env: Vec<(String, String, String)>,
    floors: bool,
    json: Option<PathBuf>,
    rollover: bool,
}

fn parse_args() -> Result<Options> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut o = Options {
        servers: Vec::new(),
        rounds: 1,
        snippets: vec!["print".into(), "numpy_pandas".into()],
        paced: 500,
        pace: Duration::from_millis(20),
        concurrency: 4,
        seconds: 5.0,
        pool_size: 4,
        env: Vec::new(),
        server_env: Vec::new(),
        floors: false,
        json: None,
        rollover: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--bench" => {} // cargo bench passes it
            "--server" => {
                let v = value()?;
                let (name, dir) = v.split_once('=').context("--server NAME=DIR")?;
                o.servers.push((name.into(), dir.into()));
            }
            "--rounds" => o.rounds = value()?.parse()?,
            "--snippets" => o.snippets = value()?.split(',').map(str::to_owned).collect(),
            "--paced" => o.paced = value()?.parse()?,
            "--pace-ms" => o.pace = Duration::from_millis(value()?.parse()?),
            "--concurrency" => o.concurrency = value()?.parse()?,
            "--seconds" => o.seconds = value()?.parse()?,
            "--pool-size" => o.pool_size = value()?.parse()?,
            "--env" => {
                let v = value()?;
                let (k, val) = v.split_once('=').context("--env KEY=VALUE")?;
                o.env.push((k.into(), val.into()));
            }
            "--server-env" => {
                let v = value()?;
                let (name, kv) = v.split_once(':').context("--server-env NAME:KEY=VALUE")?;
                let (k, val) = kv.split_once('=').context("--server-env NAME:KEY=VALUE")?;
                o.server_env.push((name.into(), k.into(), val.into()));
            }
            "--floors" => o.floors = true,
            "--rollover" => o.rollover = true,
            "--json" => o.json = Some(value()?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if o.servers.is_empty() {
        o.servers
            .push(("current".into(), root.join("target/release")));
    }
    for s in &o.snippets {
        if !SNIPPETS.iter().any(|(name, _)| name == s) {
            bail!("unknown snippet {s:?}");
        }
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = parse_args()?;
    if o.rollover {
        return rollovers(&o);
    }
    // Forked before any thread exists: the far end of the wake-up floor.
    let echo = if o.floors {
        Some(stats::EchoProcess::start()?)
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for round in 0..o.rounds {
        for (name, dir) in &o.servers {
            let mut env = o.env.clone();
            env.extend(
                o.server_env
                    .iter()
                    .filter(|(n, _, _)| n == name)
                    .map(|(_, k, v)| (k.clone(), v.clone())),
            );
            let server = Server::start(dir, o.pool_size, &env)
                .with_context(|| format!("starting {name} from {}", dir.display()))?;
            eprintln!(
                "round {round} {name}: pool of {} full {:.2} s after start",
                o.pool_size,
                server.started_in.as_secs_f64()
            );
            for snippet in &o.snippets {
                let code = SNIPPETS.iter().find(|(n, _)| n == snippet).unwrap().1;
                let row = rt.block_on(measure(&o, &server, code))?;
                eprintln!("round {round} {name} {snippet}: {}", row.one_line());
                rows.push((round, name.clone(), snippet.clone(), row));
            }
            server.stop();
        }
    }
    println!("\n{}", table(&o, &rows));
    let mut floors = json!(null);
    if let Some(echo) = echo {
        let wake = echo.paced_round_trips(o.paced.max(200), o.pace)?;
        let fork = stats::fork_floor(o.paced.clamp(100, 300))?;
        let python = stats::base_python()?;
        let spawn = stats::spawn_paced(&python, o.paced.clamp(50, 200), o.pace)?;
        println!("floors (paced {} ms):", o.pace.as_millis());
        println!(
            "  socketpair round trip between two processes: {}",
            wake.describe()
        );
        println!("  fork + exit of an interpreter with the same preloads: {fork}");
        println!(
            "for comparison, spawning {} -I -S -c 'print(1+1)' per request: {}",
            python.display(),
            spawn.describe()
        );
        floors = json!({
            "socketpair_round_trip_ms": wake.to_json(),
            "fork_exit": fork,
            "spawn_python_ms": spawn.to_json(),
        });
    }
    if let Some(path) = &o.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(round, name, snippet, r)| {
                json!({"round": round, "server": name, "snippet": snippet, "result": r.to_json()})
            })
            .collect();
        let out = json!({"rows": rows, "floors": floors, "load_at_start": stats::loadavg()});
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)?;
    }
    Ok(())
}

/// `--rollover`: for each server, `--rounds` reloads under load, then the table.
fn rollovers(o: &Options) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for (name, dir) in &o.servers {
        let server = Server::start(dir, o.pool_size, &o.env)
            .with_context(|| format!("starting {name} from {}", dir.display()))?;
        for round in 0..o.rounds {
            let row = rt.block_on(rollover::measure(&server, o.concurrency, o.seconds))?;
            eprintln!(
                "{name} round {round}: reload {:.0} ms (took_ms {}), p50 {:.2} → {:.2} ms, p99 {:.2} → {:.2} ms, {} failures",
                row.reload_wall.as_secs_f64() * 1e3,
                row.took_ms,
                row.before.p50,
                row.during.p50,
                row.before.p99,
                row.during.p99,
                row.failures.len()
            );
            rows.push((name.clone(), round, row));
        }
        server.stop();
    }
    println!(
        "\nrollover: {} clients of print(1+1), {} s before each reload; pool.size {}\n",
        o.concurrency, o.seconds, o.pool_size
    );
    println!(
        "| server | round | reload wall ms | took_ms | before p50 / p99 ms (n) | during p50 / p99 ms (n) | failed |"
    );
    println!("|---|---:|---:|---:|---|---|---:|");
    for (name, round, r) in &rows {
        println!(
            "| {name} | {round} | {:.0} | {} | {:.2} / {:.2} ({}) | {:.2} / {:.2} ({}) | {} |",
            r.reload_wall.as_secs_f64() * 1e3,
            r.took_ms,
            r.before.p50,
            r.before.p99,
            r.before_n,
            r.during.p50,
            r.during.p99,
            r.during_n,
            r.failures.len()
        );
    }
    if let Some(path) = &o.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(name, round, r)| json!({"server": name, "round": round, "result": r.to_json()}))
            .collect();
        let out = json!({"rollover": rows, "load_at_start": stats::loadavg()});
        std::fs::write(path, serde_json::to_vec_pretty(&out)?)?;
    }
    Ok(())
}

/// One snippet against one server: paced latency, then throughput with CPU accounting.
async fn measure(o: &Options, server: &Server, code: &str) -> Result<stats::Row> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let body = json!({ "code": code });
    for _ in 0..20 {
        server.execute(&client, &body).await?;
    }
    server.wait_until_full(&client).await?;
    let idle_private_mib = stats::idle_private_mib(server.pid());
    let mut latency = Vec::with_capacity(o.paced);
    let mut durations = Vec::with_capacity(o.paced);
    let cpu0 = CpuSnapshot::take(server.pid());
    for _ in 0..o.paced {
        tokio::time::sleep(o.pace).await;
        let t0 = Instant::now();
        let duration_ms = server.execute(&client, &body).await?;
        latency.push(t0.elapsed());
        durations.push(duration_ms);
    }
    let paced_cpu = CpuSnapshot::take(server.pid()).since(&cpu0, o.paced as u64);
    server.wait_until_full(&client).await?;

    let window = Duration::from_secs_f64(o.seconds);
    let cpu0 = CpuSnapshot::take(server.pid());
    let started = Instant::now();
    let clients = (0..o.concurrency).map(|_| {
        let (client, body) = (client.clone(), body.clone());
        async move {
            let mut done = 0u64;
            while started.elapsed() < window {
                server.execute(&client, &body).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }
    });
    let done: u64 = futures_util::future::try_join_all(clients)
        .await?
        .into_iter()
        .sum();
    let elapsed = started.elapsed();
    let busy_cpu = CpuSnapshot::take(server.pid()).since(&cpu0, done);
    Ok(stats::Row {
        idle_private_mib,
        latency: Summary::of(&latency),
        durations,
        throughput: done as f64 / elapsed.as_secs_f64(),
        paced_cpu,
        busy_cpu,
    })
}

fn table(o: &Options, rows: &[(usize, String, String, stats::Row)]) -> String {
    let mut out = format!(
        "paced: {} requests, {} ms apart; throughput: concurrency {} for {} s; pool.size {}\n\n",
        o.paced,
        o.pace.as_millis(),
        o.concurrency,
        o.seconds,
        o.pool_size
    );
    out += "| round | server | snippet | p50 ms | p90 ms | p99 ms | max ms | duration_ms 0/1/2/3+ | req/s | CPU ms/req tree (paced) | of which supervisor / zygotes / workers | switches/req supervisor / zygotes (paced) | schedstat CPU ms/req supervisor / zygotes (paced) | CPU ms/req tree (busy) | CPU ms/req machine (busy) | faults/req | idle worker MiB, per tier |\n";
    out += "|---:|---|---|---:|---:|---:|---:|---|---:|---:|---|---|---|---:|---:|---:|---:|\n";
    for (round, name, snippet, r) in rows {
        out += &format!(
            "| {round} | {name} | {snippet} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.0} | {:.2} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.3} / {:.3} | {:.2} | {:.2} | {:.0} | {} |\n",
            r.latency.p50,
            r.latency.p90,
            r.latency.p99,
            r.latency.max,
            r.duration_histogram(),
            r.throughput,
            r.paced_cpu.tree_ms,
            r.paced_cpu.split_ms.supervisor,
            r.paced_cpu.split_ms.zygotes,
            r.paced_cpu.split_ms.workers,
            r.paced_cpu.switches.supervisor,
            r.paced_cpu.switches.zygotes,
            r.paced_cpu.switches.supervisor_cpu_ms,
            r.paced_cpu.switches.zygotes_cpu_ms,
            r.busy_cpu.tree_ms,
            r.busy_cpu.machine_ms,
            r.busy_cpu.tree_faults,
            stats::describe_idle(&r.idle_private_mib),
        );
    }
    out
}
