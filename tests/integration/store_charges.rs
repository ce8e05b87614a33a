//! What stored files cost: each file is charged its size in whole blocks plus one block
//! (its metadata), a run stores at most `workspace.max_files` files, a key without its own
//! quota holds at most its share of the store, a full store tells a key how it compares
//! (never whose files fill it), sparse files are not stored, a file with several names is
//! stored once, and a store written before charges counts them when it opens.

use serde_json::{Value, json};

use crate::auth::{Tenant, keys_add};
use crate::files::{download_bytes, list};
use crate::harness::{Options, Server};

/// A server with the keys `names` (each with its `keys add` limits) and `options`.
async fn with_keys(
    names: &[(&str, &[&str])],
    options: Options,
) -> (Server, Vec<Tenant>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let secrets: Vec<String> = names
        .iter()
        .map(|(name, limits)| keys_add(&keys, name, limits))
        .collect();
    let server = Server::start_with(options.env("SNAKECAGE_AUTH__KEYS_FILE", keys.display())).await;
    let tenants = secrets
        .iter()
        .map(|k| Tenant::new(&server.base, k))
        .collect();
    (server, tenants, dir)
}

/// The caller's `usage` in `GET /v1/files`.
async fn usage(t: &Tenant) -> Value {
    let (status, body) = t.get("/v1/files").await;
    assert_eq!(status, 200, "{body}");
    body["usage"].clone()
}

async fn run(t: &Tenant, code: &str) -> Value {
    let (status, body) = t.post("/v1/execute", json!({ "code": code })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
    body
}

/// How many of a run's skipped files give `reason`.
fn skipped_for(r: &Value, reason: &str) -> usize {
    r["skipped_files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["reason"] == reason)
        .count()
}

/// A run that writes many one-byte files stores `workspace.max_files` of them; each is
/// charged 8 KiB (a block of data and one of metadata), as `/v1/files` reports; the key's
/// share of the store then refuses the rest, and another key still stores.
#[tokio::test]
async fn many_tiny_files_are_bounded_per_run_and_charged_what_they_take() {
    let (s, t, _dir) = with_keys(
        &[("alice", &[]), ("bob", &[])],
        Options::default()
            .env("SNAKECAGE_FILES__QUOTA_MB", 1)
            .env("SNAKECAGE_FILES__KEY_SHARE_PERCENT", 50)
            .env("SNAKECAGE_WORKSPACE__MAX_FILES", 40),
    )
    .await;
    let (alice, bob) = (&t[0], &t[1]);
    let tiny = "for i in range(100):\n    open(f'ü{i:03}.txt', 'w').write('x')";
    let r = run(alice, tiny).await;
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 40, "{r}");
    assert_eq!(files[0]["path"], "ü000.txt");
    assert_eq!(files[39]["path"], "ü039.txt");
    let over = "the run left more than 40 files to store (workspace.max_files); the first 40 in \
                path order were stored";
    assert_eq!(skipped_for(&r, over), 60, "{r}");
    assert_eq!(r["skipped_files"][0]["path"], "ü040.txt", "{r}");

    // The state dir's file system has 4 KiB blocks: a one-byte file counts 8 KiB.
    let u = usage(alice).await;
    assert_eq!(
        u,
        json!({"files": 40, "charged_bytes": 40 * 8192, "quota_bytes": 512 << 10,
               "max_files": 10000, "block_bytes": 4096}),
    );
    // Its share (512 KiB) holds 64 such files: 24 more are stored, the rest refused.
    let r = run(alice, tiny).await;
    assert_eq!(r["files"].as_array().unwrap().len(), 24, "{r}");
    let full = "it would take the API key past its own share of the store of 512 KB \
                (files.key_share_percent; 512 KB used)";
    assert_eq!(skipped_for(&r, full), 76, "{r}");
    let u = usage(alice).await;
    assert_eq!(u["files"], 64, "{u}");
    assert_eq!(u["charged_bytes"], 512 << 10, "{u}");

    // Another key still stores.
    let (status, body) = bob.upload("bobs-ß.bin", vec![7; 100 << 10]).await;
    assert_eq!(status, 201, "{body}");
    let u = usage(bob).await;
    assert_eq!(u["files"], 1, "{u}");
    assert_eq!(u["charged_bytes"], (100 << 10) + 4096, "{u}");
    drop(s);
}

/// A key without `max_stored_mb` holds its default share of the store (a quarter) and is
/// told it is its own; another key still stores; once the store is full, each key is told
/// how much it holds beside the largest holder, and no other key's name.
#[tokio::test]
async fn a_key_fills_its_default_share_others_store_and_a_full_store_names_no_one() {
    let (s, t, _dir) = with_keys(
        &[
            ("alice", &[]),
            ("bob", &[]),
            ("carol", &["--max-stored-mb", "1"]),
            ("dave", &[]),
        ],
        Options::default().env("SNAKECAGE_FILES__QUOTA_MB", 1),
    )
    .await;
    let (alice, bob, carol, dave) = (&t[0], &t[1], &t[2], &t[3]);
    for i in 0..3 {
        let (status, body) = alice.upload(&format!("à{i}.bin"), vec![1; 80 << 10]).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = alice.upload("à3.bin", vec![1; 80 << 10]).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "tenant_limit", "{body}");
    assert_eq!(
        body["detail"],
        "This file would take API key 'alice' past its own share of the store, 256 KB \
         (files.key_share_percent of files.quota_mb, for a key without max_stored_mb): 252 KB \
         is used and the file is 80 KB, counted as 84 KB; delete files you no longer need and \
         retry",
    );
    let (status, body) = bob.upload("bob.bin", vec![2; 80 << 10]).await;
    assert_eq!(status, 201, "{body}");
    // carol's own quota (1 MB) is past the share: it is its own.
    let (status, body) = carol.upload("carol.bin", vec![3; 500 << 10]).await;
    assert_eq!(status, 201, "{body}");
    // 252 + 84 + 504 = 840 KB of 1 MB used.
    let (status, body) = carol.upload("encore.bin", vec![3; 200 << 10]).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(
        body["detail"],
        "This file would take file storage past its quota of 1 MB (files.quota_mb): 840 KB is \
         used and the file is 200 KB, counted as 204 KB; this API key holds 504 KB of it, the \
         most of the 3 key(s) holding files; delete files you no longer need and retry",
    );
    let (status, body) = dave.upload("dave.bin", vec![4; 200 << 10]).await;
    assert_eq!(status, 507, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert_eq!(
        detail,
        "This file would take file storage past its quota of 1 MB (files.quota_mb): 840 KB is \
         used and the file is 200 KB, counted as 204 KB; this API key holds nothing of it; the \
         largest holder, another key, holds 504 KB; retry once files expire or an operator \
         makes room",
    );
    for name in ["alice", "bob", "carol"] {
        assert!(!detail.contains(name), "{detail}");
    }
    // What fits still fits.
    let (status, body) = dave.upload("klein.txt", b"ok".to_vec()).await;
    assert_eq!(status, 201, "{body}");
    drop(s);
}

/// A file with 1 byte written at 99 MiB takes the workspace a block but would be stored as
/// 99 MB: it is skipped, saying so; the run's other files are stored.
#[tokio::test]
async fn a_sparse_file_is_not_stored_and_the_run_says_why() {
    let s = Server::start().await;
    let r = s
        .run(
            "with open('löcher.bin', 'wb') as f:\n    f.seek(99 << 20)\n    f.write(b'!')\n\
             open('données.txt', 'w').write('gut')",
        )
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{r}");
    assert_eq!(files[0]["path"], "données.txt");
    let skipped = r["skipped_files"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{r}");
    assert_eq!(skipped[0]["path"], "löcher.bin");
    let reason = skipped[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("a sparse file: 99 MB long, of which only ")
            && reason.ends_with(
                " is data and the rest holes; a file more than half holes (and over 1 MB of \
                 them) is not stored, as it would be stored and counted at its whole length"
            ),
        "{reason}"
    );
    assert_eq!(list(&s).await.len(), 1);
    let (_, body) = s.get_json("/v1/files").await;
    assert!(
        body["usage"]["charged_bytes"].as_u64().unwrap() < 64 << 10,
        "{body}"
    );
}

/// A file with two names in the workspace is stored once: both names are listed in
/// `files`, with the one id.
#[tokio::test]
async fn a_hard_linked_file_is_stored_once_under_both_names() {
    let s = Server::start().await;
    let r = s
        .run(
            "import os\nopen('original-ñ.csv', 'w').write('a,b\\n1,2\\n')\n\
             os.link('original-ñ.csv', 'zweiter-name.csv')",
        )
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["skipped_files"], json!([]), "{r}");
    let files = r["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["original-ñ.csv", "zweiter-name.csv"], "{r}");
    assert_eq!(files[0]["file_id"], files[1]["file_id"], "{r}");
    let stored = list(&s).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["filename"], "original-ñ.csv");
    assert_eq!(
        download_bytes(&s, files[1]["file_id"].as_str().unwrap()).await,
        b"a,b\n1,2\n"
    );
}

/// A store written before files were charged: its metadata has sizes only. It opens with
/// every file, counted in charges.
#[tokio::test]
async fn an_old_store_opens_with_its_files_counted_in_charges() {
    let files_dir = tempfile::tempdir().unwrap();
    for sub in ["objects", "meta", "tmp"] {
        std::fs::create_dir_all(files_dir.path().join(sub)).unwrap();
    }
    let mut ids = Vec::new();
    for (i, size) in [0usize, 1, 5000].into_iter().enumerate() {
        let id = uuid::Uuid::now_v7().to_string();
        std::fs::write(files_dir.path().join("objects").join(&id), vec![b'x'; size]).unwrap();
        let meta = json!({
            "file_id": id, "filename": format!("älter-{i}.txt"), "size_bytes": size,
            "mime_type": "text/plain",
            "created_unix_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64,
        });
        std::fs::write(
            files_dir.path().join("meta").join(format!("{id}.json")),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        ids.push(id);
    }
    let s = Server::start_with(
        Options::default().env("SNAKECAGE_FILES__DIR", files_dir.path().display()),
    )
    .await;
    let (status, body) = s.get_json("/v1/files").await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filename"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["älter-0.txt", "älter-1.txt", "älter-2.txt"]);
    // In 4 KiB blocks, 0 bytes: its metadata's; 1: one more; 5000: two more.
    assert_eq!(body["usage"]["block_bytes"], 4096, "{body}");
    assert_eq!(body["usage"]["files"], 3, "{body}");
    assert_eq!(body["usage"]["charged_bytes"], 6 * 4096, "{body}");
    assert_eq!(download_bytes(&s, &ids[2]).await, vec![b'x'; 5000]);
}

/// The store's and a key's file counts: an upload past a key's is its 429, past the
/// store's a 507, and a run's file past either is skipped saying which.
#[tokio::test]
async fn file_counts_bound_each_key_and_the_store() {
    let (s, t, _dir) = with_keys(
        &[("alice", &[]), ("bob", &[])],
        Options::default()
            .env("SNAKECAGE_FILES__MAX_FILES", 3)
            .env("SNAKECAGE_FILES__MAX_FILES_PER_KEY", 2),
    )
    .await;
    let (alice, bob) = (&t[0], &t[1]);
    for name in ["eins-ä.txt", "zwei-ö.txt"] {
        let (status, body) = alice.upload(name, b"1".to_vec()).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = alice.upload("drei.txt", b"3".to_vec()).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        body["detail"],
        "API key 'alice' holds 2 files, the most a key may hold (files.max_files_per_key); \
         delete files you no longer need and retry"
    );
    let r = run(alice, "open('noch-einer.txt', 'w').write('x')").await;
    assert_eq!(r["files"], json!([]), "{r}");
    assert_eq!(
        r["skipped_files"],
        json!([{"path": "noch-einer.txt", "reason": "the API key holds 2 stored files, the \
                most a key may hold (files.max_files_per_key)"}])
    );
    let (status, body) = bob.upload("b.txt", b"b".to_vec()).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = bob.upload("c.txt", b"c".to_vec()).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(
        body["detail"],
        "The file store holds 3 files, the most it may hold (files.max_files); delete files \
         you no longer need and retry"
    );
    let r = run(bob, "open('d.txt', 'w').write('d')").await;
    assert_eq!(
        r["skipped_files"],
        json!([{"path": "d.txt", "reason": "the file store holds 3 files, the most it may \
                hold (files.max_files)"}])
    );
    drop(s);
}
