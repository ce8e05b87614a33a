//! Reads `deploy/grafana/snakecage.json` as Grafana would: every panel (rows' nested
//! panels included), every query, every template variable, and the variables substituted
//! into an expression. Checks, without a server, that it imports anywhere and names only
//! metrics that exist and series the rules record.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;
use snakecage::metrics::names;

use crate::harness::repo_root;

pub const DASHBOARD: &str = "deploy/grafana/snakecage.json";

pub fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap();
    serde_json::from_str(&text).expect("the dashboard is valid JSON")
}

/// One query of one panel.
#[derive(Debug, Clone)]
pub struct Query {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// Every panel, depth first: rows carry their panels in `panels` when collapsed.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query of every panel. A panel that shows data but has no query is an error:
/// it would show "No data".
pub fn queries(dashboard: &Value) -> Result<Vec<Query>, String> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        let kind = panel["type"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if matches!(kind, "row" | "text") {
            continue;
        }
        if targets.is_empty() {
            return Err(format!("panel {title:?} ({kind}) has no query"));
        }
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            if expr.trim().is_empty() {
                return Err(format!("panel {title:?} has a target without expr"));
            }
            out.push(Query {
                panel: title.clone(),
                ref_id: target["refId"].as_str().unwrap_or_default().to_owned(),
                expr: expr.to_owned(),
            });
        }
    }
    Ok(out)
}

/// What Grafana would put in place of its variables.
#[derive(Debug, Clone)]
pub struct Vars {
    pub job: String,
    pub instance: String,
    /// `$__rate_interval` (Grafana: at least four scrape intervals).
    pub rate_interval: String,
    /// `$__interval` (Grafana: the time range over the number of points).
    pub interval: String,
    /// `$__range`, in seconds: the dashboard's time range.
    pub range_seconds: u64,
}

/// `expr` with the variables (`$name` or `${name}`) substituted; an error names a
/// variable that is unknown.
pub fn substitute(expr: &str, vars: &Vars) -> Result<String, String> {
    let value = |name: &str| -> Option<String> {
        Some(match name {
            "__rate_interval" => vars.rate_interval.clone(),
            "__interval" => vars.interval.clone(),
            "__range" => format!("{}s", vars.range_seconds),
            "__range_s" => vars.range_seconds.to_string(),
            "__range_ms" => (vars.range_seconds * 1000).to_string(),
            "instance" => vars.instance.clone(),
            "job" => vars.job.clone(),
            "datasource" => "prometheus".to_owned(),
            _ => return None,
        })
    };
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
                (&braced[..end], end + 2)
            }
            None => {
                let end = after.find(|c| !is_name(c)).unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let v = value(name).ok_or_else(|| format!("unknown variable ${name} in {expr}"))?;
        out.push_str(&v);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A `label_values(selector, label)` variable query, split.
pub fn label_values_query(query: &str) -> Option<(String, String)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_owned(), label.trim().to_owned()))
}

/// Every `snakecage_*` series a dashboard query names.
fn queried_metrics(dashboard: &Value) -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    if k == "expr" {
                        out.push(v.as_str().unwrap_or_default().to_owned());
                    } else {
                        walk(v, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    walk(dashboard, &mut exprs);
    assert!(!exprs.is_empty());
    let mut names = BTreeSet::new();
    for expr in exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("snakecage_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn the_grafana_dashboard_imports_and_queries_only_metrics_that_exist() {
    let path: PathBuf = repo_root().join("deploy/grafana/snakecage.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    assert_eq!(dashboard["title"], "snakecage");
    assert!(dashboard["uid"].is_string());
    // Importable anywhere: the data source is a variable every query uses, no instance or
    // job is written into a query.
    assert_eq!(dashboard["schemaVersion"], 41);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "{variables:?}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let uids: BTreeSet<&str> = text
        .match_indices("\"uid\": \"")
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(
        uids,
        BTreeSet::from(["${datasource}", "-- Grafana --", "snakecage-overview"])
    );
    assert!(!text.contains("127.0.0.1") && !text.contains("localhost"));
    let panels = panels(&dashboard);
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has an id of its own");
    let queried = queried_metrics(&dashboard);
    for name in &queried {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| names::ALL.contains(base))
            .unwrap_or(name);
        assert!(
            names::ALL.contains(&family),
            "{name} is not a snakecage metric"
        );
    }
    for needed in [
        names::EXECUTIONS_TOTAL,
        "snakecage_execution_duration_seconds_bucket",
        "snakecage_queue_wait_seconds_bucket",
        names::POOL_BUSY_WORKERS,
        names::POOL_QUEUE_DEPTH,
        names::WORKERS_KILLED_TOTAL,
        names::SESSIONS_ACTIVE,
        names::QUEUE_REJECTIONS_TOTAL,
        names::WORKSPACE_BOUNDED,
        names::WORKSPACE_SIZE_BYTES,
        names::WORKSPACE_USED_BYTES,
        names::WORKSPACE_INODES,
        names::WORKSPACE_USED_INODES,
    ] {
        assert!(
            queried.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    assert!(
        text.contains("histogram_quantile(0.99"),
        "latency percentiles"
    );
    // The recorded series the SLO panels read are recorded by deploy/prometheus's rules.
    let rules =
        std::fs::read_to_string(repo_root().join("deploy/prometheus/snakecage.rules.yml")).unwrap();
    let exprs: String = queries(&dashboard)
        .unwrap()
        .into_iter()
        .map(|q| q.expr + "\n")
        .collect();
    let mut recorded = 0;
    for (at, _) in exprs.match_indices("snakecage:") {
        let name: String = exprs[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        assert!(
            rules.contains(&format!("- record: {name}\n")),
            "{name} is not recorded by the rules"
        );
        recorded += 1;
    }
    assert!(
        recorded >= 8,
        "the SLO burn panels read the recording rules"
    );
}

#[test]
fn variables_are_substituted_longest_first_and_unknown_ones_are_refused() {
    let vars = Vars {
        job: "snakecage".into(),
        instance: "127.0.0.1:8000".into(),
        rate_interval: "4s".into(),
        interval: "1s".into(),
        range_seconds: 60,
    };
    let expr = "rate(x{job=~\"$job\",instance=~\"${instance}\"}[$__rate_interval]) \
                + increase(y[$__range]) + $__range_s + z[$__interval]";
    assert_eq!(
        substitute(expr, &vars).unwrap(),
        "rate(x{job=~\"snakecage\",instance=~\"127.0.0.1:8000\"}[4s]) \
         + increase(y[60s]) + 60 + z[1s]"
    );
    let err = substitute("rate(x[$__rate_intervall])", &vars).unwrap_err();
    assert!(err.contains("unknown variable"), "{err}");
    assert!(substitute("x{tier=\"$tier\"}", &vars).is_err());
    assert_eq!(
        label_values_query("label_values(snakecage_build_info{job=~\"$job\"}, instance)"),
        Some((
            "snakecage_build_info{job=~\"$job\"}".into(),
            "instance".into()
        ))
    );
}

#[test]
fn a_panel_without_a_query_is_refused_even_inside_a_collapsed_row() {
    let dashboard = serde_json::json!({"panels": [
        {"type": "row", "title": "r", "collapsed": true, "panels": [
            {"type": "timeseries", "title": "empty", "targets": []}
        ]}
    ]});
    let err = queries(&dashboard).unwrap_err();
    assert!(err.contains("\"empty\""), "{err}");
    let dashboard = serde_json::json!({"panels": [
        {"type": "row", "title": "r", "collapsed": true, "panels": [
            {"type": "stat", "title": "nested", "targets": [{"refId": "A", "expr": "up"}]}
        ]}
    ]});
    let found = queries(&dashboard).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].panel, "nested");
}
