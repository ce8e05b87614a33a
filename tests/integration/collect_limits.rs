//! What a run leaves beyond the collection's bounds: past `workspace.max_entries` the
//! entries read until then are still stored, and the response says the rest was not
//! looked at.

use crate::files::download_bytes;
use crate::harness::{Options, Server};

#[tokio::test]
async fn a_directory_of_more_files_than_max_entries_keeps_the_ones_read() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_WORKSPACE__MAX_ENTRIES", 20)).await;
    let r = s
        .run("for i in range(30):\n    open(f'f{i:02}.txt', 'w').write(str(i))")
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let files = r["files"].as_array().unwrap();
    // The first 20 by name, whatever order the workspace's tmpfs lists them in (newest
    // first: before, the budget kept f10–f29 and never looked at the files written first).
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    let first: Vec<String> = (0..20).map(|i| format!("f{i:02}.txt")).collect();
    assert_eq!(paths, first, "{r}");
    for f in files {
        assert_eq!(f["kind"], "file", "{r}");
        let path = f["path"].as_str().unwrap();
        let n: u32 = path[1..3].parse().unwrap();
        let bytes = download_bytes(&s, f["file_id"].as_str().unwrap()).await;
        assert_eq!(bytes, n.to_string().as_bytes(), "{path}");
    }
    let skipped = r["skipped_files"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{r}");
    assert_eq!(skipped[0]["path"], ".", "{r}");
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains("more than 20 entries; the rest was not looked at"),
        "{r}"
    );
}

/// The files of the store's directory `sub` (`objects`, `meta`, `tmp`).
fn store_entries(s: &Server, sub: &str) -> usize {
    std::fs::read_dir(s.state_dir().join("files").join(sub))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The files `GET /v1/files` lists, and the bytes it says they are charged.
async fn listed(s: &Server) -> (usize, u64) {
    let (status, body) = s.get_json("/v1/files").await;
    assert_eq!(status, 200, "{body}");
    (
        body["files"].as_array().map_or(0, Vec::len),
        body["usage"]["charged_bytes"].as_u64().unwrap(),
    )
}

/// A client that leaves while its run's files are being stored: what was stored is
/// deleted again and nothing half-written stays on disk, since no answer will name any
/// of it. Before, the files stored until then stayed (listed and charged), and the copies
/// in progress stayed in the store's `tmp`, uncharged, until a restart.
#[tokio::test]
async fn a_client_that_leaves_during_the_collection_leaves_no_file_behind() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_WORKSPACE__MAX_TOTAL_MB", 100)).await;
    let request = s.client.post(format!("{}/v1/execute", s.base)).json(&serde_json::json!({
        "code": "for i in range(1000):\n    open(f'données_{i:04}.bin', 'wb').write(b'x' * 50_000)",
        "timeout_ms": 30_000,
    }));
    let leaving = tokio::spawn(async move { request.send().await });
    crate::reliability::eventually(60, "the collection has begun", async || {
        listed(&s).await.0 > 0
    })
    .await;
    leaving.abort();
    assert!(
        leaving.await.is_err_and(|e| e.is_cancelled()),
        "the run was answered first"
    );
    crate::reliability::eventually(60, "nothing of the left run stays", async || {
        listed(&s).await == (0, 0)
            && ["objects", "meta", "tmp"]
                .iter()
                .all(|sub| store_entries(&s, sub) == 0)
    })
    .await;
}
