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
    assert_eq!(files.len(), 20, "{r}");
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
