//! `POST /v1/admin/packages/sync` with requirements files as editors and pip-compile write
//! them: a byte order mark, Windows line ends and `\` continuations are read as pip reads
//! them; a hash-pinned file is refused with what to do (its hashes would not be verified),
//! and the refusal changes nothing of what was installed before.

use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::packages::managed;
use crate::packages_env::env_dirs;

/// A sync of `body`: the status and the answer.
async fn sync(s: &Server, body: &str) -> (u16, Value) {
    let resp = s
        .client
        .post(format!("{}/v1/admin/packages/sync", s.base))
        .header("content-type", "text/plain; charset=utf-8")
        .body(body.to_owned())
        .timeout(std::time::Duration::from_secs(600))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// The serving generation and the requested set, as `/v1/admin/packages` lists them.
async fn state(s: &Server) -> (u64, Value) {
    let (status, list) = s.get_json("/v1/admin/packages").await;
    assert_eq!(status, 200, "{list}");
    (
        list["generation"]["id"].as_u64().unwrap(),
        list["requested"].clone(),
    )
}

/// What `pip-compile --generate-hashes` writes for tabulate 0.9.0.
const HASH_PINNED: &str = "tabulate==0.9.0 \\\n    --hash=sha256:0095b12bf5966de529c0feb1fa08671671b3368eec77d7ef7ab114be2c068b3c\n";

/// Refused: names the line and the requirement, says why and what to do.
fn assert_hash_refusal(status: u16, body: &Value) {
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "invalid_request", "{body}");
    let detail = body["detail"].as_str().unwrap();
    for needle in [
        "requirements line 1: tabulate==0.9.0 is pinned by hash",
        "not verified",
        "without `--generate-hashes`",
    ] {
        assert!(detail.contains(needle), "{needle:?} in {detail}");
    }
}

#[tokio::test]
async fn a_sync_reads_bom_crlf_and_continuations_and_refuses_hash_pins_changing_nothing() {
    let s = Server::start_with(managed(Options::default())).await;
    let (first, requested) = state(&s).await;
    assert_eq!(requested, json!([]));

    let (status, body) = sync(&s, HASH_PINNED).await;
    assert_hash_refusal(status, &body);
    assert_eq!(state(&s).await, (first, json!([])));
    assert!(env_dirs(s.state_dir()).is_empty());

    // Saved by a Windows editor, continued with a backslash.
    let (status, body) = sync(&s, "\u{feff}# pinned\r\ntabulate \\\r\n    ==0.9.0\r\n").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], true, "{body}");
    assert_eq!(body["requested"], json!(["tabulate==0.9.0"]), "{body}");
    let (synced, requested) = state(&s).await;
    assert_eq!(synced, first + 1);
    assert_eq!(requested, json!(["tabulate==0.9.0"]));
    let envs = env_dirs(s.state_dir());
    assert_eq!(envs.len(), 1, "{envs:?}");

    // The hash-pinned file again: refused, and what was installed stays.
    let (status, body) = sync(&s, HASH_PINNED).await;
    assert_hash_refusal(status, &body);
    assert_eq!(state(&s).await, (synced, json!(["tabulate==0.9.0"])));
    assert_eq!(env_dirs(s.state_dir()), envs);
    let r = s.run("import tabulate\nprint(tabulate.__version__)").await;
    assert_eq!(r["stdout"], "0.9.0\n", "{r}");
}
