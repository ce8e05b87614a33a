//! The Grafana dashboard and the alerting rules against a real Prometheus: it scrapes a
//! real snakecage every second while traffic produces every outcome, then every panel's
//! query (variables substituted as Grafana would) must parse and return data, the rules
//! must evaluate cleanly, and the alert the traffic provokes must fire.
//!
//! With `DASHBOARD_SERIES=path.json` the test also writes every panel's series
//! there, for `scripts/plot-dashboard.py` to draw (deploy/dashboard.png).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::auth::keys_add;
use crate::grafana::{self, Query, Vars};
use crate::harness::{Options, Server};
use crate::prometheus::{Prometheus, Series, now};
use crate::zygote_death::{MARKER, run_while_its_zygote_dies};

const JOB: &str = "snakecage";

/// Every outcome the traffic produces, as `snakecage_executions_total` labels it.
const OUTCOMES: [&str; 7] = [
    "ok",
    "error",
    "timeout",
    "memory_limit",
    "output_limit",
    "killed",
    "rejected",
];

/// A server with one API key (so the per-key panel has data), a file-store quota (so the
/// quota panels have data; the key's own quota is the store's, not its default share of
/// it), two workers and room for one waiting request (so 429 is easy).
async fn server(keys_dir: &std::path::Path) -> Server {
    let keys = keys_dir.join("keys.toml");
    let key = keys_add(&keys, "ops-dashboard", &["--max-stored-mb", "1"]);
    let mut s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_AUTH__KEYS_FILE", keys.display())
            .env("SNAKECAGE_POOL__SIZE", 2)
            .env("SNAKECAGE_POOL__QUEUE_LENGTH", 1)
            .env("SNAKECAGE_FILES__QUOTA_MB", 1),
    )
    .await;
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    s.client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    s
}

/// One round of every kind of run, a session and an upload.
async fn round(s: &Server, i: usize) {
    let verdict = |r: Value| r["verdict"].as_str().unwrap_or_default().to_owned();
    for _ in 0..3 {
        let r = s.run("print(len('héllo'))").await;
        assert_eq!(r["verdict"], "ok", "{r}");
    }
    assert_eq!(verdict(s.run("1 / 0").await), "error");
    let r = s
        .run_with(json!({"code": "while True: pass", "timeout_ms": 300}))
        .await;
    assert_eq!(verdict(r), "timeout");
    assert_eq!(verdict(s.run("bytearray(10**10)").await), "memory_limit");
    assert_eq!(
        verdict(s.run("print('y' * 2_000_000)").await),
        "output_limit"
    );

    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap().to_owned();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "x = 41\nprint(x + 1)"}),
        )
        .await;
    assert_eq!((status, r["stdout"].as_str()), (200, Some("42\n")), "{r}");
    let resp = s
        .client
        .delete(format!("{}/v1/sessions/{id}", s.base))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());

    let part =
        reqwest::multipart::Part::bytes(vec![b'x'; 200_000]).file_name(format!("données-{i}.txt"));
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
}

fn sleeper(s: &Server, secs: f64) -> tokio::task::JoinHandle<u16> {
    let (client, url) = (s.client.clone(), format!("{}/v1/execute", s.base));
    let body = json!({"code": format!("import time\ntime.sleep({secs})"), "timeout_ms": 10_000});
    tokio::spawn(async move {
        let resp = client.post(url).json(&body).send().await.unwrap();
        resp.status().as_u16()
    })
}

/// Both workers busy and the one queue slot taken: the next requests get 429.
async fn overload(s: &Server) {
    let busy = [sleeper(s, 1.5), sleeper(s, 1.5)];
    s.wait_for_pool("both sleepers running", |p| p["busy"] == 2)
        .await;
    let queued = sleeper(s, 0.1);
    s.wait_for_pool("a request in the queue", |p| p["queue_depth"] == 1)
        .await;
    let mut shed = 0;
    for _ in 0..3 {
        let (status, body) = s.post("/v1/execute", &json!({"code": "print(1)"})).await;
        assert!(status == 429 || status == 200, "{status} {body}");
        shed += usize::from(status == 429);
    }
    for task in busy {
        assert_eq!(task.await.unwrap(), 200);
    }
    // Shed itself when the pool had not refilled and a sleeper took the queue slot.
    let status = queued.await.unwrap();
    assert!(status == 200 || status == 429, "{status}");
    shed += usize::from(status == 429);
    assert!(shed >= 1, "nothing was shed");
}

/// A run whose zygote is killed under it: `killed` (it printed first, so it is not run
/// again), and a zygote restart.
async fn kill_the_zygote(s: &Server) {
    let code = format!(
        "print('läuft', flush=True)\nopen({MARKER:?}, 'w').close()\nimport time\ntime.sleep(5)"
    );
    let r = run_while_its_zygote_dies(s, &code, false).await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "läuft\n", "{r}");
    s.wait_for_idle(1).await;
}

/// Every query's answer, by panel title and refId.
type Answers = BTreeMap<(String, String), Vec<Series>>;

/// Runs every panel's query at `time`; the errors name the panel and the query.
async fn run_queries(
    prom: &Prometheus,
    queries: &[Query],
    vars: &Vars,
    time: f64,
) -> (Answers, Vec<String>) {
    let mut answers = Answers::new();
    let mut errors = Vec::new();
    for q in queries {
        let what = format!("panel {:?} query {} `{}`", q.panel, q.ref_id, q.expr);
        let expr = match grafana::substitute(&q.expr, vars) {
            Ok(expr) => expr,
            Err(e) => {
                errors.push(format!("{what}: {e}"));
                continue;
            }
        };
        match prom.query(&expr, time).await {
            Err(e) => errors.push(format!("{what}: does not run: {e}")),
            Ok(series) if series.is_empty() => errors.push(format!("{what}: no data")),
            Ok(series) if !series.iter().any(|s| s.last().is_finite()) => {
                errors.push(format!("{what}: only NaN/Inf: {series:?}"))
            }
            Ok(series) => {
                answers.insert((q.panel.clone(), q.ref_id.clone()), series);
            }
        }
    }
    (answers, errors)
}

/// The answer of one panel's query; panics when that panel or query is gone.
fn answer<'a>(answers: &'a Answers, panel: &str, ref_id: &str) -> &'a [Series] {
    answers
        .get(&(panel.to_owned(), ref_id.to_owned()))
        .unwrap_or_else(|| panic!("no panel {panel:?} query {ref_id}"))
}

/// The value of the series whose `label` is `value`.
fn by_label(series: &[Series], label: &str, value: &str) -> f64 {
    series
        .iter()
        .find(|s| s.label(label) == value)
        .map_or(0.0, Series::last)
}

#[tokio::test]
async fn every_dashboard_panel_and_every_rule_works_against_a_real_prometheus() {
    let dashboard = grafana::dashboard();
    let queries = grafana::queries(&dashboard).unwrap();
    let keys_dir = tempfile::tempdir().unwrap();
    let s = server(keys_dir.path()).await;
    let target = s.base.trim_start_matches("http://").to_owned();
    let prom = Prometheus::start(JOB, &target).await;
    // Two scrapes before any traffic, so every counter's increase is seen.
    prom.wait_for(&format!("count_over_time(up{{job=\"{JOB}\"}}[1m])"), 2.0)
        .await;

    for i in 0..3 {
        round(&s, i).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    overload(&s).await;
    kill_the_zygote(&s).await;
    round(&s, 3).await;
    // The last traffic scraped and the rules evaluated on it.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The template variables, as Grafana would resolve them.
    let mut vars = Vars {
        job: JOB.into(),
        instance: target.clone(),
        rate_interval: String::new(),
        interval: "1s".into(),
        range_seconds: (now() - prom.started).ceil() as u64 + 5,
    };
    vars.rate_interval = format!("{}s", vars.range_seconds);
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let name = variable["name"].as_str().unwrap();
        match variable["type"].as_str().unwrap() {
            "datasource" => assert_eq!(variable["query"], "prometheus", "{variable}"),
            "query" => {
                let query = variable["query"]["query"].as_str().unwrap();
                let (selector, label) = grafana::label_values_query(query)
                    .unwrap_or_else(|| panic!("variable {name}: not label_values: {query}"));
                let selector = grafana::substitute(&selector, &vars).unwrap();
                let values = prom.label_values(&selector, &label).await.unwrap();
                let want = if name == "job" { JOB } else { target.as_str() };
                assert_eq!(values, [want], "variable {name}: {query}");
            }
            other => panic!("variable {name}: unexpected type {other}"),
        }
    }

    // Every query of every panel, at the end of the traffic, over all of it.
    let (answers, errors) = run_queries(&prom, &queries, &vars, now()).await;
    assert!(
        errors.is_empty(),
        "{} of {} dashboard queries fail:\n{}",
        errors.len(),
        queries.len(),
        errors.join("\n")
    );

    // What the traffic did shows where it should.
    let outcomes = answer(&answers, "Executions by outcome", "A");
    for outcome in OUTCOMES {
        assert!(
            by_label(outcomes, "outcome", outcome) > 0.0,
            "{outcome}: {outcomes:?}"
        );
    }
    let shed = answer(&answers, "Shed requests by reason", "A");
    assert!(by_label(shed, "reason", "queue_full") > 0.0, "{shed:?}");
    let killed = answer(&answers, "Workers killed by reason", "A");
    assert!(by_label(killed, "reason", "timeout") > 0.0, "{killed:?}");
    assert!(answer(&answers, "Zygote restarts", "A")[0].last() > 0.0);
    assert!(answer(&answers, "Sessions", "B")[0].last() > 0.0, "created");
    let tenants = answer(&answers, "Executions by API key", "A");
    assert!(by_label(tenants, "tenant", "ops-dashboard") > 0.0);
    let statuses = answer(&answers, "HTTP responses by status", "A");
    // A status's series starts at its first response, so its rate may read 0; it shows.
    assert!(
        statuses.iter().any(|s| s.label("status") == "429"),
        "{statuses:?}"
    );
    assert_eq!(answer(&answers, "Ready", "A")[0].last(), 1.0);
    let layers = answer(&answers, "Sandbox layers active", "A");
    assert_eq!(layers.len(), 10, "{layers:?}");
    assert!(layers.iter().all(|l| l.last() == 1.0), "{layers:?}");
    // Four uploads of 200 kB and the sleeper's empty marker file against a 1 MiB quota,
    // each charged its 4 KiB blocks and one more.
    let used = answer(&answers, "File store used (of quota)", "A")[0].last();
    assert!(
        (used - (4.0 * 204_800.0 + 4096.0) / 1_048_576.0).abs() < 1e-9,
        "{used}"
    );
    // The workspace file system: its own tmpfs where the service may mount (as root), with
    // room left, its inodes in use (the idle workers' workspaces; empty, on a tmpfs they
    // take no bytes).
    let bounded = answer(&answers, "Workspaces bounded", "A")[0].last();
    assert_eq!(
        bounded == 1.0,
        nix::unistd::geteuid().is_root(),
        "{bounded}"
    );
    let ws_used = answer(&answers, "Workspace used (of its bound)", "A")[0].last();
    assert!((0.0..0.9).contains(&ws_used), "{ws_used}");
    let inodes_used = answer(&answers, "Workspace inodes used", "A")[0].last();
    assert!(inodes_used > 0.0 && inodes_used < 0.9, "{inodes_used}");
    let space = answer(&answers, "Workspace space", "A")[0].last();
    let size = answer(&answers, "Workspace space", "B")[0].last();
    assert!(size > 0.0 && space < size, "{space} of {size}");
    let inodes = answer(&answers, "Workspace inodes", "B")[0].last();
    assert!(answer(&answers, "Workspace inodes", "A")[0].last() < inodes);
    // Killed and rejected runs spent budget; the burn rate panels read the recording rules.
    let budget = answer(&answers, "Availability error budget left", "A")[0].last();
    assert!(budget < 1.0, "{budget}");
    let burn = answer(&answers, "Availability burn rate", "A")[0].last();
    assert!(burn > 0.0, "{burn}");

    // The rules load and evaluate without error and each alert explains itself.
    let rules = prom.api("/api/v1/rules", &[]).await.unwrap();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            assert_eq!(rule["health"], "ok", "{rule}");
            if rule["type"] == "alerting" {
                alerts.insert(rule["name"].as_str().unwrap().to_owned());
                for annotation in ["summary", "description", "runbook"] {
                    let text = rule["annotations"][annotation].as_str().unwrap_or_default();
                    assert!(!text.is_empty(), "{} has no {annotation}", rule["name"]);
                }
            }
        }
    }
    assert!(alerts.len() >= 12, "{alerts:?}");
    // The zygote restart fired its alert; killed and rejected runs, a tenth of all, burn
    // the availability budget far beyond 14.4x through the recording rules.
    let firing = answer(&answers, "Snakecage alerts (pending and firing)", "A");
    for alert in ["SnakecageZygoteRestarted", "SnakecageErrorBudgetBurnFast"] {
        assert!(
            firing
                .iter()
                .any(|a| a.label("alertname") == alert && a.label("alertstate") == "firing"),
            "{alert} does not fire: {firing:?}"
        );
    }

    // Over time, as a time series panel asks (a range query, one point a second, the
    // rate window four scrape intervals as Grafana makes `$__rate_interval`): every query
    // runs and has points.
    let over_time = Vars {
        rate_interval: "4s".into(),
        ..vars.clone()
    };
    let (start, end) = (prom.started, now());
    let mut ranges = Answers::new();
    let mut errors = Vec::new();
    for q in &queries {
        let expr = grafana::substitute(&q.expr, &over_time).unwrap();
        match prom.query_range(&expr, start, end, 1.0).await {
            Ok(series)
                if series
                    .iter()
                    .any(|s| s.samples.iter().any(|v| v.1.is_finite())) =>
            {
                ranges.insert((q.panel.clone(), q.ref_id.clone()), series);
            }
            Ok(series) => errors.push(format!("{:?} {}: no points: {series:?}", q.panel, q.ref_id)),
            Err(e) => errors.push(format!("{:?} {}: {e}", q.panel, q.ref_id)),
        }
    }
    assert!(errors.is_empty(), "over time:\n{}", errors.join("\n"));

    if let Ok(path) = std::env::var("DASHBOARD_SERIES") {
        export(&dashboard, &ranges, (start, end), &path);
    }
}

/// Writes every panel's series over the test for scripts/plot-dashboard.py.
fn export(dashboard: &Value, ranges: &Answers, (start, end): (f64, f64), path: &str) {
    let mut panels = Vec::new();
    for panel in grafana::panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        let mut targets = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let ref_id = target["refId"].as_str().unwrap_or_default();
            let series: Vec<Value> = ranges
                .get(&(title.to_owned(), ref_id.to_owned()))
                .into_iter()
                .flatten()
                .map(|s| json!({"labels": s.labels, "samples": s.samples}))
                .collect();
            targets.push(json!({
                "legend": target["legendFormat"],
                "expr": target["expr"],
                "series": series,
            }));
        }
        panels.push(json!({
            "title": title,
            "type": panel["type"],
            "gridPos": panel["gridPos"],
            "unit": panel["fieldConfig"]["defaults"]["unit"],
            "targets": targets,
        }));
    }
    let out = json!({"title": dashboard["title"], "start": start, "end": end, "panels": panels});
    std::fs::write(path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
}
