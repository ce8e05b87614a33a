//! What an upload is called and how files are named back: a name past 255 bytes keeps its
//! extension (and its MIME type), cut at a character.

use reqwest::header::CONTENT_TYPE;
use serde_json::Value;

use crate::files::{list, upload};
use crate::harness::Server;

/// The listing's entry for `file_id`.
async fn listed(s: &Server, file_id: &Value) -> Value {
    list(s)
        .await
        .into_iter()
        .find(|f| &f["file_id"] == file_id)
        .unwrap_or_else(|| panic!("{file_id} not listed"))
}

#[tokio::test]
async fn a_long_name_keeps_its_extension_and_its_mime_type() {
    let s = Server::start().await;

    // 300 characters: the stem is cut, `.csv` and text/csv stay.
    let long = format!("{}.csv", "x".repeat(300));
    let stored = upload(&s, &long, b"a,b\n1,2\n".to_vec()).await;
    let name = stored["filename"].as_str().unwrap();
    assert_eq!(name, format!("{}.csv", "x".repeat(251)));
    assert_eq!(
        listed(&s, &stored["file_id"]).await["mime_type"],
        "text/csv"
    );
    let (status, headers, _) = s
        .get(&format!(
            "/v1/files/{}",
            stored["file_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers[CONTENT_TYPE], "text/csv");

    // Bytes, not characters: 日 is three bytes, and is never split.
    let long = format!("{}.tsv", "日".repeat(100));
    let stored = upload(&s, &long, b"a\tb\n".to_vec()).await;
    let name = stored["filename"].as_str().unwrap();
    assert_eq!(name, format!("{}.tsv", "日".repeat(83)));
    assert!(name.len() <= 255, "{} bytes", name.len());
    assert_eq!(
        listed(&s, &stored["file_id"]).await["mime_type"],
        "text/tab-separated-values"
    );
}
