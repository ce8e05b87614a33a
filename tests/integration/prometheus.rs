//! A real Prometheus server (Debian's `prometheus` package) on loopback, scraping one
//! snakecage every second with the rules of `deploy/prometheus/` loaded, and a client for
//! its HTTP API.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::repo_root;

/// The rule file every deployment loads, and its unit tests.
pub const RULES: &str = "deploy/prometheus/snakecage.rules.yml";
pub const RULE_TESTS: &str = "deploy/prometheus/snakecage.rules.test.yml";

pub struct Prometheus {
    child: Child,
    pub base: String,
    client: reqwest::Client,
    /// When it started, in seconds since the Unix epoch.
    pub started: f64,
    _dir: tempfile::TempDir,
}

/// One series of a query's answer: its labels and its samples `(time, value)`.
#[derive(Debug, Clone)]
pub struct Series {
    pub labels: serde_json::Map<String, Value>,
    pub samples: Vec<(f64, f64)>,
}

impl Series {
    pub fn label(&self, name: &str) -> &str {
        self.labels
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The last sample's value (instant queries have exactly one).
    pub fn last(&self) -> f64 {
        self.samples.last().map_or(f64::NAN, |s| s.1)
    }
}

pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A loopback port nothing listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs promtool with `args` from the repository root; panics with its output on failure.
pub fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (host:port) as job `job` every second and
    /// evaluating the rules every second; returns once it is ready.
    pub async fn start(job: &str, target: &str) -> Self {
        // The port is picked free, but another process may take it first: try again then.
        for _ in 0..3 {
            if let Some(prometheus) = Self::try_start(job, target).await {
                return prometheus;
            }
        }
        panic!("prometheus did not start three times");
    }

    async fn try_start(job: &str, target: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let rules = repo_root().join(RULES);
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n",
            rules = rules.display(),
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/test installs it)");
        let mut prometheus = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            started: now(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = prometheus
                .client
                .get(format!("{}/-/ready", prometheus.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Some(prometheus);
            }
            if let Some(status) = prometheus.child.try_wait().unwrap() {
                eprintln!("prometheus exited ({status}):\n{}", prometheus.log());
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never got ready:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the `data` of a successful answer, or the error Prometheus gave.
    pub async fn api(&self, path: &str, params: &[(&str, String)]) -> Result<Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), params)
            .map_err(|e| e.to_string())?;
        let resp = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = resp.json().await.map_err(|e| e.to_string())?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!("{}: {}", body["errorType"], body["error"]))
        }
    }

    /// An instant query at `time`.
    pub async fn query(&self, expr: &str, time: f64) -> Result<Vec<Series>, String> {
        let data = self
            .api(
                "/api/v1/query",
                &[("query", expr.to_owned()), ("time", format!("{time:.3}"))],
            )
            .await?;
        Ok(parse_result(&data))
    }

    /// A range query from `start` to `end`, one point per `step` seconds (what a Grafana
    /// time series panel asks for).
    pub async fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, String> {
        let data = self
            .api(
                "/api/v1/query_range",
                &[
                    ("query", expr.to_owned()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", format!("{step}")),
                ],
            )
            .await?;
        Ok(parse_result(&data))
    }

    /// The values `label` takes in the series `selector` matches (Grafana's
    /// `label_values(selector, label)`).
    pub async fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, String> {
        let data = self
            .api(
                &format!("/api/v1/label/{label}/values"),
                &[("match[]", selector.to_owned())],
            )
            .await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// Waits until `expr` returns a series with a value of at least `min`.
    pub async fn wait_for(&self, expr: &str, min: f64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.query(expr, now()).await.unwrap_or_default();
            if got.iter().any(|s| s.last() >= min) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{expr} never reached {min}: {got:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn parse_result(data: &Value) -> Vec<Series> {
    let value = |v: &Value| -> (f64, f64) {
        let t = v[0].as_f64().unwrap_or(f64::NAN);
        let x = v[1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::NAN);
        (t, x)
    };
    match data["resultType"].as_str() {
        Some("scalar") => vec![Series {
            labels: Default::default(),
            samples: vec![value(&data["result"])],
        }],
        _ => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| Series {
                labels: s["metric"].as_object().cloned().unwrap_or_default(),
                samples: match s.get("values") {
                    Some(values) => values.as_array().unwrap().iter().map(value).collect(),
                    None => vec![value(&s["value"])],
                },
            })
            .collect(),
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `promtool check rules` and `promtool test rules`: the rules parse, every alert's unit
/// tests pass, and every alert has a test where it fires and one where it stays silent.
#[test]
fn the_alerting_rules_pass_promtool_and_every_alert_is_tested_both_ways() {
    let checked = promtool(&["check", "rules", RULES]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", RULE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    let rules = std::fs::read_to_string(repo_root().join(RULES)).unwrap();
    let tests = std::fs::read_to_string(repo_root().join(RULE_TESTS)).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 12, "{alerts:?}");
    // Each case of an alert_rule_test starts with its alertname; what follows up to the
    // next one is what it expects.
    let cases: Vec<&str> = tests.split("alertname: ").skip(1).collect();
    for alert in &alerts {
        let of_alert = || {
            cases
                .iter()
                .filter(move |c| c.starts_with(&format!("{alert}\n")))
        };
        assert!(
            of_alert().any(|c| c.contains("exp_alerts:\n") && c.contains("exp_annotations:")),
            "no unit test where {alert} fires"
        );
        assert!(
            of_alert().any(|c| c.contains("exp_alerts: []")),
            "no unit test where {alert} stays silent"
        );
    }
    // Every runbook line points at a runbook that exists.
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    let headings: Vec<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("#### "))
        .map(str::to_lowercase)
        .collect();
    for (at, m) in rules.match_indices("runbook: \"deploy/README.md#") {
        let rest = &rules[at + m.len()..];
        let anchor = &rest[..rest.find(':').unwrap()];
        assert!(
            headings.iter().any(|h| h == anchor),
            "deploy/README.md has no runbook #{anchor}"
        );
    }
    // Every alert says what happened and what to do.
    for annotation in ["summary: ", "description: ", "runbook: \"deploy/README.md#"] {
        let n = rules.matches(annotation).count();
        assert_eq!(
            n,
            alerts.len(),
            "{annotation:?}: {n} for {} alerts",
            alerts.len()
        );
    }
}
