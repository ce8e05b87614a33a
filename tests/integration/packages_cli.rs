//! The `snakecage packages` CLI against a running service, and the admin scope: keys
//! without it get 403 on every package route (and the CLI says so, failing).

use std::process::Command;

use serde_json::{Value, json};

use crate::auth::keys_add;
use crate::harness::{Options, Server};
use crate::packages::{admin, managed};

/// `snakecage packages …` against the running service: its output and exit status.
fn cli(base: &str, key: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["packages", "--url", base])
        .args(args)
        .env("SNAKECAGE_API_KEY", key)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn only_admin_keys_manage_packages_and_the_cli_works_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let root = keys_add(&keys, "operator", &["--admin"]);
    let agent = keys_add(&keys, "agent", &[]);
    let s = Server::start_with(managed(
        Options::default().env("SNAKECAGE_AUTH__KEYS_FILE", keys.display()),
    ))
    .await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/admin/packages"),
        (reqwest::Method::POST, "/v1/admin/packages"),
        (reqwest::Method::DELETE, "/v1/admin/packages"),
        (reqwest::Method::POST, "/v1/admin/packages/sync"),
    ] {
        let (status, body) = admin(
            &s,
            method.clone(),
            path,
            Some(&agent),
            Some(json!({ "add": ["tabulate"] })),
        )
        .await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert_eq!(body["code"], "forbidden");
    }
    let (ok, _, err) = cli(&s.base, &agent, &["list"]);
    assert!(!ok && err.contains("403 forbidden"), "{err}");

    let (ok, out, err) = cli(&s.base, &root, &["list"]);
    assert!(ok, "{err}");
    assert!(out.contains("the base python.venv"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("numpy ")), "{out}");

    let (ok, out, err) = cli(&s.base, &root, &["add", "tabulate==0.9.0"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("installed tabulate 0.9.0 (import tabulate)"),
        "{out}"
    );
    assert!(out.contains("now serving generation"), "{out}");
    let (ok, out, _) = cli(&s.base, &root, &["list"]);
    assert!(ok);
    assert!(out.contains("(managed generation)"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("tabulate ") && l.contains("0.9.0") && l.contains("yes")),
        "{out}"
    );
    let r = s
        .client
        .post(format!("{}/v1/execute", s.base))
        .bearer_auth(&agent)
        .json(&json!({ "code": "import tabulate; print(tabulate.__version__)" }))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(r["stdout"], "0.9.0\n", "{r}");

    // A bad spec: the server's detail and a failed exit.
    let (ok, _, err) = cli(&s.base, &root, &["add", "not a package!"]);
    assert!(
        !ok && err.contains("422 invalid_request") && err.contains("not a valid requirement"),
        "{err}"
    );

    // A requirement whose marker excludes the service's Python: the detail, a failed exit,
    // and the package added before still serves.
    let (ok, _, err) = cli(&s.base, &root, &["add", "six; os_name == \"nt\""]);
    assert!(
        !ok && err.contains("422 invalid_request") && err.contains("environment marker"),
        "{err}"
    );
    let (ok, out, _) = cli(&s.base, &root, &["list"]);
    assert!(
        ok && out.contains("tabulate ") && !out.contains("six "),
        "{out}"
    );

    // sync with a requirements file that names nothing: every added package goes.
    let reqs = dir.path().join("requirements.txt");
    std::fs::write(&reqs, "# nothing added any more\n").unwrap();
    let (ok, out, err) = cli(&s.base, &root, &["sync", reqs.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("added by the operator now: (none)"), "{out}");
    let (ok, out, _) = cli(&s.base, &root, &["list"]);
    assert!(ok && !out.contains("tabulate"), "{out}");

    // The same sync again: nothing changed, said so.
    let (ok, out, err) = cli(&s.base, &root, &["sync", reqs.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.starts_with("nothing changed: "), "{out}");
    assert!(out.contains("keeps serving"), "{out}");
    // remove of what is installed nowhere: nothing to do.
    let (ok, out, err) = cli(&s.base, &root, &["remove", "tabulate"]);
    assert!(ok, "{err}");
    assert!(out.contains("tabulate installed nowhere"), "{out}");
    // remove of a base package: the detail, a failed exit.
    let (ok, _, err) = cli(&s.base, &root, &["remove", "numpy"]);
    assert!(!ok && err.contains("was not added"), "{err}");
    // A service that is not there.
    let (ok, _, err) = cli("http://127.0.0.1:9", &root, &["list"]);
    assert!(!ok && err.contains("cannot reach the service"), "{err}");
}
