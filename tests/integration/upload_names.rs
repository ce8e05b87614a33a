//! What an upload is called and how files are named back: a name past 255 bytes keeps its
//! extension (and its MIME type), cut at a character; `filename*` (RFC 8187) is read; a
//! body with two `file` parts is refused with neither stored, nor ever visible; a page
//! cursor that is no file id is refused; file ids are taken in any case.

use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use crate::files::{download_bytes, list, upload};
use crate::harness::{Options, Server, check_error_body};

/// Posts a hand-written multipart body (boundary `B`) to `/v1/files`.
async fn upload_raw(s: &Server, body: &[u8]) -> (u16, Value) {
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .header(CONTENT_TYPE, "multipart/form-data; boundary=B")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    if status >= 400 {
        check_error_body(status, &body);
    }
    (status, body)
}

/// One part named `file` with `disposition` after `form-data; name="file"; ` and `content`.
fn part(disposition: &str, content: &str) -> String {
    format!(
        "--B\r\nContent-Disposition: form-data; name=\"file\"; {disposition}\r\n\r\n{content}\r\n"
    )
}

/// The listing's entry for `file_id`.
async fn listed(s: &Server, file_id: &Value) -> Value {
    list(s)
        .await
        .into_iter()
        .find(|f| &f["file_id"] == file_id)
        .unwrap_or_else(|| panic!("{file_id} not listed"))
}

#[tokio::test]
async fn a_long_name_keeps_its_extension_and_filename_star_is_read() {
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

    // filename* alone, before filename, after it: it names the file.
    for (disposition, expected) in [
        ("filename*=UTF-8''%E6%97%A5.txt", "日.txt"),
        (
            "filename*=UTF-8''Gr%C3%BC%C3%9Fe.csv; filename=\"Grusse.csv\"",
            "Grüße.csv",
        ),
        (
            "filename=\"Grusse.csv\"; filename*=utf-8'de'Gr%C3%BC%C3%9Fe.csv",
            "Grüße.csv",
        ),
    ] {
        let body = format!("{}--B--\r\n", part(disposition, "x"));
        let (status, stored) = upload_raw(&s, body.as_bytes()).await;
        assert_eq!(status, 201, "{disposition}: {stored}");
        assert_eq!(stored["filename"], expected, "{disposition}");
        let id = stored["file_id"].as_str().unwrap();
        assert_eq!(download_bytes(&s, id).await, b"x");
    }
    // One that cannot be read, with no filename to fall back on: 400 saying how to send it.
    let before = list(&s).await.len();
    let body = format!("{}--B--\r\n", part("filename*=KOI8-R''%E4%C1.txt", "x"));
    let (status, refused) = upload_raw(&s, body.as_bytes()).await;
    assert_eq!(status, 400, "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("its charset is \"KOI8-R\"") && detail.contains("filename*=UTF-8''"),
        "{detail}"
    );
    assert_eq!(list(&s).await.len(), before, "nothing stored");
}

/// One file per upload: the answer names one `file_id`. A second `file` part is refused
/// (400 naming the rule) and the first is not stored; other fields are still skipped; a
/// body cut off after a whole part stores nothing either.
#[tokio::test]
async fn two_file_parts_are_refused_with_neither_stored() {
    let s = Server::start().await;
    let two = format!(
        "{}{}--B--\r\n",
        part("filename=\"a.txt\"", "1"),
        part("filename=\"b.txt\"", "2")
    );
    let (status, body) = upload_raw(&s, two.as_bytes()).await;
    assert_eq!(status, 400, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("the multipart body has 2 `file` parts, and an upload stores one file")
            && detail.contains("send each file in a request of its own; none of these was stored"),
        "{detail}"
    );
    assert_eq!(list(&s).await, Vec::<Value>::new());

    // A file part, then another field: the file is stored.
    let other = format!(
        "{}--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nanalysis\r\n--B--\r\n",
        part("filename=\"über.txt\"", "1")
    );
    let (status, body) = upload_raw(&s, other.as_bytes()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["filename"], "über.txt");

    // A body cut off after a whole part (its boundary read, no `--` closing the body):
    // malformed, and the part is not stored.
    let cut = format!("{}--B", part("filename=\"c.txt\"", "3"));
    let (status, body) = upload_raw(&s, cut.as_bytes()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("malformed multipart body"),
        "{body}"
    );
    let names: Vec<Value> = list(&s)
        .await
        .into_iter()
        .map(|f| f["filename"].clone())
        .collect();
    assert_eq!(names, [json!("über.txt")]);
}

#[tokio::test]
async fn a_cursor_that_is_no_file_id_is_400_and_ids_are_taken_in_any_case() {
    let s = Server::start().await;
    let mut ids = Vec::new();
    for name in ["eins.txt", "zwei.txt", "drei.txt"] {
        let stored = upload(&s, name, name.as_bytes().to_vec()).await;
        ids.push(stored["file_id"].as_str().unwrap().to_owned());
    }

    // A cursor that is no file id would read as an empty last page: a pager would stop.
    for bad in ["after=garbage", "after=%20", "after=../../etc"] {
        let (status, body) = s.get_json(&format!("/v1/files?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("after must be a file_id from a previous page (its next_after)"),
            "{bad}: {detail}"
        );
    }
    // An empty cursor is the first page, as a shell pager's `after=$NEXT` sends it first
    // (the README's example).
    let (status, page) = s.get_json("/v1/files?limit=2&after=").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["files"][0]["file_id"], ids[0], "{page}");
    assert_eq!(page["next_after"], ids[1], "{page}");
    // A cursor in upper case pages as the same id.
    for after in [ids[0].clone(), ids[0].to_uppercase()] {
        let (status, page) = s
            .get_json(&format!("/v1/files?limit=1&after={after}"))
            .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["files"][0]["file_id"], ids[1], "{page}");
        assert_eq!(page["next_after"], ids[1], "{page}");
    }

    // Download, staging into a run and delete take an id in upper case.
    let upper = ids[2].to_uppercase();
    assert_eq!(download_bytes(&s, &upper).await, b"drei.txt");
    let ran = s
        .run_with(json!({
            "code": "print(open('d/drei.txt').read())",
            "files": [{"path": "d/drei.txt", "file_id": upper}],
        }))
        .await;
    assert_eq!(ran["stdout"], "drei.txt\n", "{ran}");
    let deleted = s
        .client
        .delete(format!("{}/v1/files/{upper}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let (status, _, _) = s.get(&format!("/v1/files/{}", ids[2])).await;
    assert_eq!(status, 404);
    // Another form of UUID is no file id.
    let simple = ids[0].replace('-', "");
    let (status, _, _) = s.get(&format!("/v1/files/{simple}")).await;
    assert_eq!(status, 404);
}

/// The first `file` part of [`a_second_file_part_refuses_the_upload_unseen`], in bytes.
const FIRST_PART: usize = 600 << 10;

/// With a store quota of 1 MB: a two-`file`-part upload sent in pieces. The first part,
/// then another field begun: the store has taken the first file's bytes
/// (`first_part_received` returns once it has) but not stored it. Then the second part
/// begun: the upload is refused. Meanwhile the first file is in no listing and takes none
/// of the quota (a file that fits only beside nothing else is stored); once the body is
/// whole the upload is a 400, and nothing of it is stored.
pub async fn a_second_file_part_refuses_the_upload_unseen(
    s: &Server,
    first_part_received: impl AsyncFnOnce(),
) {
    let (more, owed) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    let owed = futures_util::stream::unfold(owed, |mut owed| async {
        owed.recv().await.map(|chunk| (chunk, owed))
    });
    let answer = tokio::spawn(
        s.client
            .post(format!("{}/v1/files", s.base))
            .header(CONTENT_TYPE, "multipart/form-data; boundary=B")
            .body(reqwest::Body::wrap_stream(owed))
            .send(),
    );
    // Watched for a while: the first file would show as soon as it was committed.
    let unseen = async |when: &str| {
        for _ in 0..20 {
            assert_eq!(list(s).await, Vec::<Value>::new(), "listed {when}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let first = part("filename=\"first.bin\"", &"1".repeat(FIRST_PART));
    let other_begun = "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nana";
    more.send(Ok(first.into_bytes())).await.unwrap();
    more.send(Ok(other_begun.into())).await.unwrap();
    first_part_received().await;
    unseen("once the first part was read").await;

    let second_begun = "lysis\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; \
                        filename=\"second.bin\"\r\n\r\n2";
    more.send(Ok(second_begun.into())).await.unwrap();
    unseen("while the second part came").await;
    let beside = upload(s, "beside.bin", vec![b'b'; 600 << 10]).await;

    more.send(Ok(b"2\r\n--B--\r\n".to_vec())).await.unwrap();
    drop(more);
    let response = answer.await.unwrap().unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("the multipart body has 2 `file` parts"),
        "{body}"
    );
    let names: Vec<Value> = list(s)
        .await
        .into_iter()
        .map(|f| f["filename"].clone())
        .collect();
    assert_eq!(names, [json!("beside.bin")]);
    assert_eq!(beside["size_bytes"], 600 << 10);
    // The quota holds the file beside and nothing else: what is left of it fits.
    upload(s, "rest.bin", vec![b'r'; 400 << 10]).await;
}

#[tokio::test]
async fn a_second_file_part_refuses_the_upload_before_the_first_is_visible() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_FILES__QUOTA_MB", 1)).await;
    let store = s.state_dir().join("files");
    // The first part's bytes, all written (under tmp/ while it is not stored; objects/
    // once it is).
    let received = async || {
        for _ in 0..3000 {
            let whole = ["tmp", "objects"].iter().any(|dir| {
                std::fs::read_dir(store.join(dir)).is_ok_and(|entries| {
                    entries
                        .flatten()
                        .any(|e| e.metadata().is_ok_and(|m| m.len() == FIRST_PART as u64))
                })
            });
            if whole {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the first part never reached the store");
    };
    a_second_file_part_refuses_the_upload_unseen(&s, received).await;
}
