//! Reads the Prometheus text format that `/metrics` serves, as a scraper would.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use crate::harness::Server;

/// One scrape: every sample by name and label set.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let value: f64 = value.parse().expect("a sample value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            samples.push((name.to_owned(), labels, value));
        }
        Self {
            text: text.to_owned(),
            samples,
        }
    }

    /// The sample of `name` whose labels are exactly `labels`; panics when there is none.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in\n{}", self.text))
    }

    /// Like [`Scrape::get`], 0 when the series does not exist yet.
    pub fn get_or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).unwrap_or(0.0)
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| *v)
    }

    /// The sum over every sample of `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// Every sample of `name` with its labels.
    pub fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l.clone(), *v))
            .collect()
    }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = &after[end..];
    }
    labels
}

impl Server {
    /// GET /metrics, checked to be the text format, parsed.
    pub async fn scrape(&self) -> Scrape {
        let resp = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        Scrape::parse(&resp.text().await.unwrap())
    }
}

/// Runs `promtool check metrics` on `text`; panics with its report when it objects.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn labels_with_escapes_and_commas_parse() {
    let s = Scrape::parse("a_total{x=\"1\",y=\"a,b\\\"c\"} 3\nb 4.5\n");
    assert_eq!(s.get("a_total", &[("x", "1"), ("y", "a,b\"c")]), 3.0);
    assert_eq!(s.get("b", &[]), 4.5);
    assert_eq!(s.sum("a_total", &[("x", "1")]), 3.0);
}
