//! Reads `deploy/grafana/snakecage.json` as Grafana would: every panel (rows' nested
//! panels included), every query, every template variable, and the variables substituted
//! into an expression.

use serde_json::Value;

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
