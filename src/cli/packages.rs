//! `snakecage packages list | add SPEC… | remove NAME… | sync FILE`: the admin package API
//! of a running service, with human-readable output; the server's `detail` and a non-zero
//! exit on any error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct PackagesArgs {
    /// The service's base URL; default: the configured listen address.
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// An API key with the admin scope.
    #[arg(long, env = "SNAKECAGE_API_KEY", global = true, hide_env_values = true)]
    pub key: Option<String>,
    #[command(subcommand)]
    pub command: PackagesCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum PackagesCommand {
    /// Lists the installed distributions, marking those the operator added.
    List,
    /// Installs requirements (`tabulate==0.9.0`) into a new environment generation and
    /// switches workers to it.
    Add {
        #[arg(required = true)]
        specs: Vec<String>,
        /// Extra constraints for this install (`wcwidth<1`); repeatable.
        #[arg(long = "constraint")]
        constraints: Vec<String>,
    },
    /// Removes distributions added earlier.
    Remove {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Makes the added set exactly the requirements in FILE.
    Sync { file: PathBuf },
}

/// Installs can take minutes (a cold cache, a large wheel, the rollover's probe).
const CHANGE_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the service at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{status}{code}: {detail}")]
    Server {
        status: u16,
        code: String,
        detail: String,
    },
    #[error(
        "--url {0:?} is not an http:// or https:// URL; give the service's base URL, e.g. \
         http://127.0.0.1:8000"
    )]
    BadUrl(String),
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The base URL for a service listening on `listen` (a wildcard address is reached on
/// loopback).
pub fn default_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".parse().unwrap(),
        ip if ip.is_unspecified() => "::1".parse().unwrap(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

/// `url` if it is an absolute http(s) URL. `localhost:8000` parses as a URL whose scheme
/// is `localhost`, and reqwest would then fail with a bare "builder error".
fn checked_url(url: String) -> Result<String, CliError> {
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(url),
        _ => Err(CliError::BadUrl(url)),
    }
}

/// Runs one command; returns what to print.
pub async fn run(args: PackagesArgs, listen: SocketAddr) -> Result<String, CliError> {
    let base = match args.url {
        Some(url) => checked_url(url)?,
        None => default_url(listen),
    };
    let base = base.trim_end_matches('/').to_owned();
    let url = format!("{base}/v1/admin/packages");
    let client = reqwest::Client::new();
    let with_key = |req: reqwest::RequestBuilder| match &args.key {
        Some(key) => req.bearer_auth(key),
        None => req,
    };
    let request = match args.command {
        PackagesCommand::List => with_key(client.get(&url)),
        PackagesCommand::Add { specs, constraints } => {
            let mut body = json!({ "add": specs });
            if !constraints.is_empty() {
                body["constraints"] = json!(constraints);
            }
            with_key(client.post(&url).json(&body)).timeout(CHANGE_TIMEOUT)
        }
        PackagesCommand::Remove { names } => {
            with_key(client.delete(&url).json(&json!({ "remove": names }))).timeout(CHANGE_TIMEOUT)
        }
        PackagesCommand::Sync { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|source| CliError::File { path: file, source })?;
            with_key(
                client
                    .post(format!("{url}/sync"))
                    .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(text),
            )
            .timeout(CHANGE_TIMEOUT)
        }
    };
    let unreachable = |source| CliError::Unreachable {
        url: base.clone(),
        source,
    };
    let response = request.send().await.map_err(unreachable)?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(unreachable)?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status >= 400 {
        return Err(CliError::Server {
            status,
            code: body["code"]
                .as_str()
                .map(|c| format!(" {c}"))
                .unwrap_or_default(),
            detail: body["detail"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| body.to_string()),
        });
    }
    Ok(if body.get("distributions").is_some() {
        render_listing(&body)
    } else {
        render_change(&body)
    })
}

/// `list`: the environment, then one line per distribution.
pub fn render_listing(body: &Value) -> String {
    let mut out = String::new();
    let env = body["environment"].as_str().unwrap_or("(none)");
    let kind = if body["managed"].as_bool() == Some(true) {
        "managed generation"
    } else {
        "the base python.venv"
    };
    out.push_str(&format!("environment: {env} ({kind})\n"));
    if let Some(generation) = generation_label(&body["generation"]) {
        out.push_str(&format!("generation:  {generation}\n"));
    }
    out.push_str(&format!(
        "index:       {}\n",
        body["index_url"].as_str().unwrap_or_default()
    ));
    if body["uv_available"].as_bool() == Some(false) {
        out.push_str(&format!(
            "uv:          MISSING at {} (changes are refused until it is installed)\n",
            body["uv"].as_str().unwrap_or_default()
        ));
    }
    let dists = body["distributions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let width = dists
        .iter()
        .filter_map(|d| d["name"].as_str())
        .map(str::len)
        .chain([12])
        .max()
        .unwrap_or(12);
    out.push_str(&format!(
        "\n{:width$}  {:12}  {:5}  IMPORT NAMES\n",
        "NAME", "VERSION", "ADDED"
    ));
    for d in &dists {
        let imports = strings(&d["import_names"]);
        out.push_str(&format!(
            "{:width$}  {:12}  {:5}  {}\n",
            d["name"].as_str().unwrap_or_default(),
            d["version"].as_str().unwrap_or_default(),
            if d["added"].as_bool() == Some(true) {
                "yes"
            } else {
                ""
            },
            imports.join(", ")
        ));
    }
    let added = dists.iter().filter(|d| d["added"] == true).count();
    out.push_str(&format!(
        "\n{} distributions, {added} added by the operator\n",
        dists.len()
    ));
    out
}

/// The strings of a JSON array (none when it is not one).
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The requirements the operator added, as the answer lists them, or "(none)".
fn requested(body: &Value) -> String {
    let requested = strings(&body["requested"]);
    if requested.is_empty() {
        "(none)".to_owned()
    } else {
        requested.join(" ")
    }
}

/// `add`, `remove`, `sync`: what changed and the generation now serving (or, for a change
/// that changed nothing, that and why).
pub fn render_change(body: &Value) -> String {
    let mut out = String::new();
    if body["rolled_over"] == false {
        out.push_str(body["message"].as_str().unwrap_or("nothing changed"));
        out.push('\n');
        out.push_str(&format!("added by the operator: {}\n", requested(body)));
        return out;
    }
    for d in body["changed"].as_array().into_iter().flatten() {
        let imports = strings(&d["import_names"]);
        out.push_str(&format!(
            "installed {} {}{}\n",
            d["name"].as_str().unwrap_or_default(),
            d["version"].as_str().unwrap_or_default(),
            if imports.is_empty() {
                String::new()
            } else {
                format!(" (import {})", imports.join(", "))
            }
        ));
    }
    for name in body["removed"].as_array().into_iter().flatten() {
        out.push_str(&format!("removed {}\n", name.as_str().unwrap_or_default()));
    }
    out.push_str(&format!("added by the operator now: {}\n", requested(body)));
    let generation =
        generation_label(&body["generation"]).unwrap_or_else(|| "(unknown)".to_owned());
    out.push_str(&format!(
        "now serving generation {generation} on {} (install {} ms, rollover {} ms)\n",
        body["environment"].as_str().unwrap_or_default(),
        body["install_ms"].as_u64().unwrap_or_default(),
        body["rollover_ms"].as_u64().unwrap_or_default(),
    ));
    out
}

fn generation_label(generation: &Value) -> Option<String> {
    match generation {
        Value::Null => None,
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o
            .get("id")
            .or_else(|| o.get("generation"))
            .map(|v| v.to_string().trim_matches('"').to_owned())
            .or_else(|| Some(generation.to_string())),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listen_address_is_reached_on_loopback() {
        assert_eq!(
            default_url("0.0.0.0:8000".parse().unwrap()),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            default_url("[::]:9000".parse().unwrap()),
            "http://[::1]:9000"
        );
        assert_eq!(
            default_url("10.1.2.3:80".parse().unwrap()),
            "http://10.1.2.3:80"
        );
    }

    #[test]
    fn a_url_without_http_scheme_is_refused_with_an_example() {
        for good in [
            "http://localhost:8000",
            "https://sc.example/",
            "http://[::1]:9000",
        ] {
            assert_eq!(checked_url(good.into()).unwrap(), good);
        }
        for bad in [
            "localhost:19541",
            "127.0.0.1:8000",
            "ftp://h/",
            "http://",
            "",
            "ünï",
        ] {
            let err = checked_url(bad.into()).unwrap_err().to_string();
            assert!(
                err.contains("is not an http:// or https:// URL"),
                "{bad}: {err}"
            );
            assert!(err.contains("http://127.0.0.1:8000"), "{err}");
        }
    }

    #[test]
    fn listings_and_changes_read_as_text() {
        let listing = json!({
            "environment": "/srv/envs/env-1", "managed": true, "generation": {"id": 3},
            "index_url": "https://pypi.org/simple", "uv_available": true,
            "distributions": [
                {"name": "numpy", "version": "2.4.6", "added": false},
                {"name": "tabulate", "version": "0.9.0", "added": true,
                 "import_names": ["tabulate"]}
            ]
        });
        let text = render_listing(&listing);
        assert!(text.contains("(managed generation)"), "{text}");
        assert!(text.contains("generation:  3"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("tabulate") && l.contains("yes") && l.ends_with("tabulate")),
            "{text}"
        );
        assert!(text.contains("2 distributions, 1 added"), "{text}");
        let change = json!({
            "changed": [{"name": "tabulate", "version": "0.9.0", "import_names": ["tabulate"]}],
            "requested": ["tabulate==0.9.0"], "generation": {"id": 4},
            "environment": "/srv/envs/env-2", "install_ms": 900, "rollover_ms": 700
        });
        let text = render_change(&change);
        assert!(
            text.contains("installed tabulate 0.9.0 (import tabulate)"),
            "{text}"
        );
        assert!(text.contains("generation 4 on /srv/envs/env-2"), "{text}");
        let text = render_change(&json!({
            "rolled_over": false,
            "message": "nothing changed: tabulate==0.9.0 already installed as requested; generation 4 keeps serving",
            "changed": [], "removed": [], "requested": ["tabulate==0.9.0"],
            "generation": {"id": 4}, "environment": "/srv/envs/env-2", "install_ms": 0, "rollover_ms": 0
        }));
        assert!(
            text.starts_with("nothing changed: tabulate==0.9.0"),
            "{text}"
        );
        assert!(text.contains("generation 4 keeps serving"), "{text}");
        assert!(
            text.contains("added by the operator: tabulate==0.9.0"),
            "{text}"
        );
        assert!(!text.contains("now serving"), "{text}");
    }
}
