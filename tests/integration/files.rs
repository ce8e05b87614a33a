//! Files: upload, list, download, delete; staging into runs and getting what runs wrote
//! back; limits, validation, durability across a restart.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Options, Server, assert_peak_rss_grew_little, peak_rss};

pub async fn upload(s: &Server, name: &str, bytes: Vec<u8>) -> Value {
    let (status, body) = try_upload(s, name, bytes).await;
    assert_eq!(status, 201, "{body}");
    body
}

pub async fn try_upload(s: &Server, name: &str, bytes: Vec<u8>) -> (u16, Value) {
    let (status, _, body) = try_upload_with_headers(s, name, bytes).await;
    (status, body)
}

/// The refusal of a file of `size` (as the detail writes it) larger than a whole quota of
/// 1 MB (`whose`, and `quota`, the quota with its setting, as the detail names them),
/// refused as it streamed in,
/// whatever else is stored: 413 without `Retry-After` (no deletion and no wait makes room
/// for it), and a detail that says so with the file's whole size (the rest of the body is
/// read before the answer).
pub fn assert_larger_than_the_whole_quota(
    (status, headers, body): (u16, reqwest::header::HeaderMap, Value),
    size: &str,
    whose: &str,
    quota: &str,
) {
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "payload_too_large", "{body}");
    assert!(headers.get("retry-after").is_none(), "{headers:?}");
    assert_eq!(
        body["detail"],
        format!(
            "This file would take {whose} past {quota}: the file ({size}) is larger than the \
             whole quota; upload a smaller file"
        ),
        "{body}"
    );
}

async fn try_upload_with_headers(
    s: &Server,
    name: &str,
    bytes: Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned());
    let form = reqwest::multipart::Form::new()
        .text("purpose", "analysis")
        .part("file", part);
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body: Value = resp.json().await.unwrap();
    if status >= 400 {
        crate::harness::check_error_body(status, &body);
    }
    (status, headers, body)
}

async fn download(s: &Server, id: &str) -> reqwest::Response {
    s.client
        .get(format!("{}/v1/files/{id}", s.base))
        .send()
        .await
        .unwrap()
}

pub async fn download_bytes(s: &Server, id: &str) -> Vec<u8> {
    let resp = download(s, id).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap().to_vec()
}

pub async fn list(s: &Server) -> Vec<Value> {
    let resp = s
        .client
        .get(format!("{}/v1/files", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["files"].as_array().unwrap().clone()
}

fn id(v: &Value) -> String {
    v["file_id"].as_str().unwrap().to_owned()
}

/// The entry for `path` in an execute response's `files`.
fn output<'a>(r: &'a Value, path: &str) -> &'a Value {
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} not in {}", r["files"]))
}

const CSV: &str = "name,amount\nalice,10\nbob,32\ncarol,0.5\n";

#[tokio::test]
async fn upload_list_download_delete_then_404() {
    let s = Server::start().await;
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let up = upload(&s, "blob.bin", bytes.clone()).await;
    assert_eq!(up["filename"], "blob.bin");
    assert_eq!(up["size_bytes"], 300_000);
    let file_id = id(&up);

    let files = list(&s).await;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0]["file_id"], up["file_id"]);
    assert_eq!(files[0]["filename"], "blob.bin");
    assert_eq!(files[0]["size_bytes"], 300_000);
    let time = files[0]["upload_time"].as_str().unwrap();
    assert!(time.len() == 20 && time.ends_with('Z'), "{time}");

    let resp = download(&s, &file_id).await;
    assert_eq!(resp.headers()["content-type"], "application/octet-stream");
    assert_eq!(
        resp.headers()["content-disposition"],
        "attachment; filename=\"blob.bin\""
    );
    assert_eq!(resp.bytes().await.unwrap().to_vec(), bytes);
    // A download carries the type the listing reports, as an attachment never sniffed.
    let csv = upload(&s, "résumé.csv", CSV.as_bytes().to_vec()).await;
    let listed = list(&s).await;
    let listed = listed
        .iter()
        .find(|f| f["file_id"] == csv["file_id"])
        .unwrap();
    assert_eq!(listed["mime_type"], "text/csv", "{listed}");
    let resp = download(&s, &id(&csv)).await;
    assert_eq!(resp.headers()["content-type"], "text/csv");
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    assert!(
        resp.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment;")
    );

    let del = |id: String| s.client.delete(format!("{}/v1/files/{id}", s.base)).send();
    assert_eq!(del(id(&csv)).await.unwrap().status(), 204);
    assert_eq!(del(file_id.clone()).await.unwrap().status(), 204);
    let gone = download(&s, &file_id).await;
    assert_eq!(gone.status(), 404);
    let body: Value = gone.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains(&file_id),
        "{body}"
    );
    assert_eq!(del(file_id).await.unwrap().status(), 404);
    assert_eq!(download(&s, "../../etc/passwd").await.status(), 404);
    assert!(list(&s).await.is_empty());

    // A body that is not multipart, or has no `file` field, says what to send.
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let form = reqwest::multipart::Form::new().text("other", "x");
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
}

#[tokio::test]
async fn the_list_comes_in_pages_that_cover_it_once_in_order() {
    let s = Server::start().await;
    let mut uploaded = Vec::new();
    for i in 0..5 {
        let meta = upload(&s, &format!("données-{i}-✓.txt"), vec![b'x'; i]).await;
        uploaded.push(meta["file_id"].as_str().unwrap().to_owned());
    }
    let whole = list(&s).await;
    assert_eq!(whole.len(), 5);
    // Ids are UUIDv7 on every backend: id order is upload order.
    assert_eq!(whole.iter().map(id).collect::<Vec<_>>(), uploaded);
    let (status, body) = s.get_json("/v1/files").await;
    assert_eq!(status, 200);
    assert!(body.get("next_after").is_none(), "the Onyx shape: {body}");

    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            None => "/v1/files?limit=2".to_owned(),
            Some(a) => format!("/v1/files?limit=2&after={a}"),
        };
        let (status, page) = s.get_json(&path).await;
        assert_eq!(status, 200, "{page}");
        let files = page["files"].as_array().unwrap();
        assert!(files.len() <= 2, "{page}");
        paged.extend(files.iter().cloned());
        pages += 1;
        match page["next_after"].as_str() {
            Some(next) => {
                assert_eq!(next, files.last().unwrap()["file_id"], "{page}");
                after = Some(next.to_owned());
            }
            None => {
                assert_eq!(page["next_after"], Value::Null, "{page}");
                break;
            }
        }
        assert!(pages < 10, "the pages never ended: {page}");
    }
    assert_eq!(pages, 3);
    let ids: Vec<String> = paged.iter().map(id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "in id order, each once");
    let mut all: Vec<String> = whole.iter().map(id).collect();
    all.sort();
    assert_eq!(ids, all, "every file, in some page");

    // Past the last id: an empty last page. Bad limits say what a limit is.
    let (status, page) = s
        .get_json(&format!("/v1/files?after={}", ids.last().unwrap()))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["files"], json!([]), "{page}");
    assert_eq!(page["next_after"], Value::Null, "{page}");
    // Usage is of every file, whatever the page.
    assert_eq!(page["usage"]["files"], ids.len(), "{page}");
    for bad in ["limit=0", "limit=10001", "limit=deux", "limit=-1"] {
        let (status, body) = s.get_json(&format!("/v1/files?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["detail"].as_str().unwrap().contains("limit"),
            "{bad}: {body}"
        );
    }
}

#[tokio::test]
async fn a_staged_csv_is_summed_with_csv_and_with_pandas_and_is_not_returned() {
    let s = Server::start().await;
    let file_id = id(&upload(&s, "in.csv", CSV.into()).await);
    let code = "import csv\n\
                import pandas as pd\n\
                with open('data/in.csv', newline='') as f:\n\
                \x20   print(sum(float(row['amount']) for row in csv.DictReader(f)))\n\
                print(pd.read_csv('data/in.csv')['amount'].sum())";
    let r = s
        .run_with(json!({"code": code, "files": [{"path": "data/in.csv", "file_id": file_id}]}))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["stdout"], "42.5\n42.5\n");
    // Unchanged inputs (and the directories staging made) are not outputs.
    assert_eq!(r["files"], json!([]));
}

#[tokio::test]
async fn an_edited_input_comes_back_under_a_new_id_and_the_original_is_unchanged() {
    let s = Server::start().await;
    let original = id(&upload(&s, "in.csv", CSV.into()).await);
    let r = s
        .run_with(json!({
            "code": "with open('in.csv', 'a') as f:\n    f.write('dave,7\\n')",
            "files": [{"path": "in.csv", "file_id": original}],
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let edited = output(&r, "in.csv");
    assert_eq!(edited["kind"], "file");
    let new_id = id(edited);
    assert_ne!(new_id, original);
    assert_eq!(
        download_bytes(&s, &new_id).await,
        format!("{CSV}dave,7\n").into_bytes()
    );
    assert_eq!(download_bytes(&s, &original).await, CSV.as_bytes());
}

#[tokio::test]
async fn new_files_and_nested_directories_all_come_back() {
    let s = Server::start().await;
    let code = "import os\n\
                os.makedirs('out/nested')\n\
                os.makedirs('empty')\n\
                open('a.txt', 'w').write('a')\n\
                open('b.txt', 'w').write('bb')\n\
                open('out/nested/c.json', 'w').write('{}')";
    let r = s.run(code).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let paths: Vec<(&str, &str)> = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        paths,
        vec![
            ("a.txt", "file"),
            ("b.txt", "file"),
            ("empty", "directory"),
            ("out", "directory"),
            ("out/nested", "directory"),
            ("out/nested/c.json", "file"),
        ]
    );
    assert_eq!(output(&r, "out")["file_id"], Value::Null);
    assert_eq!(
        output(&r, "out/nested/c.json")["mime_type"],
        "application/json"
    );
    assert_eq!(download_bytes(&s, &id(output(&r, "b.txt"))).await, b"bb");
    let listed: Vec<String> = list(&s)
        .await
        .iter()
        .map(|f| f["filename"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");
}

/// A `\\` in the name of a file a program writes is part of the name on this host (only
/// an upload's client path may be a Windows one): stored, listed and downloaded as named,
/// not cut to what follows it.
#[tokio::test]
async fn a_backslash_in_a_written_files_name_stays_in_its_name() {
    let s = Server::start().await;
    let r = s
        .run("open('back\\\\slash é.txt', 'w').write('x')\nopen('dir\\\\a.txt', 'w').write('y')")
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let written = output(&r, "back\\slash é.txt");
    let mut listed: Vec<String> = list(&s)
        .await
        .iter()
        .map(|f| f["filename"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, ["back\\slash é.txt", "dir\\a.txt"]);
    let response = download(&s, &id(written)).await;
    assert_eq!(
        response.headers()["content-disposition"],
        "attachment; filename=\"back_slash _.txt\"; filename*=UTF-8''back%5Cslash%20%C3%A9.txt"
    );
    // An upload's client path is cut at either separator.
    let up = upload(&s, "C:\\Users\\zoë\\data.csv", b"a,b\n".to_vec()).await;
    assert_eq!(up["filename"], "data.csv", "{up}");
}

#[tokio::test]
async fn a_matplotlib_savefig_returns_a_valid_png() {
    let s = Server::start().await;
    let code = "import matplotlib\n\
                matplotlib.use('Agg')\n\
                import matplotlib.pyplot as plt\n\
                plt.plot([1, 2, 3], [4, 1, 9])\n\
                plt.title('chart')\n\
                plt.savefig('plot.png')";
    let r = s.run_with(json!({"code": code, "timeout_ms": 20000})).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let png = output(&r, "plot.png");
    assert_eq!(png["mime_type"], "image/png");
    let bytes = download_bytes(&s, &id(png)).await;
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(bytes.len() > 1000, "{} bytes", bytes.len());
    assert_eq!(png["size_bytes"], bytes.len());
}

#[tokio::test]
async fn an_excel_file_round_trips_through_openpyxl() {
    let s = Server::start().await;
    let write = "from openpyxl import Workbook\n\
                 wb = Workbook()\n\
                 ws = wb.active\n\
                 ws.title = 'sales'\n\
                 ws.append(['region', 'amount'])\n\
                 ws.append(['north', 3])\n\
                 ws.append(['south', 4])\n\
                 wb.save('book.xlsx')";
    let r = s
        .run_with(json!({"code": write, "timeout_ms": 20000}))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let book = id(output(&r, "book.xlsx"));
    let bytes = download_bytes(&s, &book).await;
    assert!(bytes.starts_with(b"PK"), "an xlsx is a zip");

    let read = "from openpyxl import load_workbook\n\
                wb = load_workbook('in/book.xlsx')\n\
                ws = wb['sales']\n\
                print(sum(row[1] for row in ws.iter_rows(min_row=2, values_only=True)))\n\
                ws.append(['east', 5])\n\
                wb.save('in/book.xlsx')";
    let r = s
        .run_with(json!({"code": read, "timeout_ms": 20000,
            "files": [{"path": "in/book.xlsx", "file_id": book}]}))
        .await;
    assert_eq!(r["stdout"], "7\n", "{r}");
    let edited = id(output(&r, "in/book.xlsx"));
    let check = "import pandas as pd\nprint(pd.read_excel('b.xlsx')['amount'].sum())";
    let r = s
        .run_with(json!({"code": check, "timeout_ms": 20000,
            "files": [{"path": "b.xlsx", "file_id": edited}]}))
        .await;
    assert_eq!(r["stdout"], "12\n", "{r}");
}

#[tokio::test]
async fn bad_paths_unknown_ids_and_bad_entrypoints_are_refused_with_a_detail() {
    let s = Server::start().await;
    let file_id = id(&upload(&s, "x.py", b"print(1)".to_vec()).await);
    let staged = |path: &str| json!([{"path": path, "file_id": file_id}]);
    let cases = vec![
        (
            json!({"code": "1", "files": staged("/etc/passwd")}),
            422,
            "File paths must be relative.".to_owned(),
        ),
        (
            json!({"code": "1", "files": staged("a/../../x.py")}),
            422,
            "'..'".to_owned(),
        ),
        (
            json!({"code": "1", "files": staged("__main__.py")}),
            422,
            "reserved".to_owned(),
        ),
        (
            json!({"code": "1", "files": [{"path": "in.csv", "file_id": "nope"}]}),
            404,
            "File with ID 'nope' not found for path 'in.csv'".to_owned(),
        ),
        (
            json!({"code": "1", "files": [
                {"path": "a.py", "file_id": file_id}, {"path": "./a.py", "file_id": file_id}]}),
            422,
            "given twice".to_owned(),
        ),
        (
            json!({"entrypoint": "other.py", "files": staged("x.py")}),
            422,
            "not one of the staged files".to_owned(),
        ),
        (
            json!({"code": "1", "entrypoint": "x.py", "files": staged("x.py")}),
            422,
            "exactly one of `code` and `entrypoint`".to_owned(),
        ),
        (
            json!({"files": staged("x.py")}),
            422,
            "missing field `code`".to_owned(),
        ),
        (
            json!({"code": "1", "args": ["--x"]}),
            422,
            "`args` are passed to an `entrypoint`".to_owned(),
        ),
    ];
    for (body, status, needle) in cases {
        let (got, resp) = s.post("/v1/execute", &body).await;
        assert_eq!(got, status, "{body} ⇒ {resp}");
        let detail = resp["detail"].as_str().unwrap();
        assert!(detail.contains(&needle), "{detail:?} lacks {needle:?}");
    }
    // A file used as a directory is refused at staging, before any code runs.
    let (got, resp) = s
        .post(
            "/v1/execute",
            &json!({"code": "1", "files": [
                {"path": "a", "file_id": file_id}, {"path": "a/b.py", "file_id": file_id}]}),
        )
        .await;
    assert_eq!(got, 422, "{resp}");
    assert_eq!(s.run("print(2)").await["stdout"], "2\n");
}

#[tokio::test]
async fn an_entrypoint_runs_as_main_with_its_args() {
    let s = Server::start().await;
    let script = "import sys, helper\n\
                  year = sys.argv[sys.argv.index('--year') + 1]\n\
                  print(__name__, sys.argv)\n\
                  open('report-' + year + '.txt', 'w').write(helper.title(year))\n";
    let script_id = id(&upload(&s, "report.py", script.into()).await);
    let helper_id = id(&upload(
        &s,
        "helper.py",
        b"def title(y):\n    return 'Report ' + y\n".to_vec(),
    )
    .await);
    let r = s
        .run_with(json!({
            "entrypoint": "scripts/report.py",
            "args": ["--year", "2024"],
            "files": [
                {"path": "scripts/report.py", "file_id": script_id},
                {"path": "scripts/helper.py", "file_id": helper_id},
            ],
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(
        r["stdout"],
        "__main__ ['scripts/report.py', '--year', '2024']\n"
    );
    let report = id(output(&r, "report-2024.txt"));
    assert_eq!(download_bytes(&s, &report).await, b"Report 2024");
}

#[tokio::test]
async fn two_concurrent_runs_never_see_each_others_workspace() {
    let s = Server::start().await;
    let a = id(&upload(&s, "in.txt", b"from a".to_vec()).await);
    let b = id(&upload(&s, "in.txt", b"from b".to_vec()).await);
    let code = "import os, time\n\
                mine = open('in.txt').read()\n\
                open(mine.replace(' ', '_') + '.out', 'w').write(mine)\n\
                time.sleep(0.5)\n\
                print(mine, sorted(os.listdir('.')))";
    let run = |file_id: String| {
        s.run_with(json!({"code": code, "files": [{"path": "in.txt", "file_id": file_id}]}))
    };
    let (ra, rb) = tokio::join!(run(a), run(b));
    assert_eq!(ra["stdout"], "from a ['from_a.out', 'in.txt']\n", "{ra}");
    assert_eq!(rb["stdout"], "from b ['from_b.out', 'in.txt']\n", "{rb}");
    assert_eq!(ra["files"].as_array().unwrap().len(), 1);
    assert_eq!(output(&ra, "from_a.out")["kind"], "file");
    assert_eq!(output(&rb, "from_b.out")["kind"], "file");
}

#[tokio::test]
async fn a_timed_out_run_still_returns_what_it_wrote_and_links_are_not_followed() {
    let s = Server::start().await;
    let code = "import os\n\
                open('partial.txt', 'w').write('so far')\n\
                try:\n\
                \x20   os.symlink('/etc/passwd', 'passwd')\n\
                except OSError:\n\
                \x20   pass\n\
                while True: pass";
    let r = s.run_with(json!({"code": code, "timeout_ms": 700})).await;
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(
        download_bytes(&s, &id(output(&r, "partial.txt"))).await,
        b"so far"
    );
    // A link is never stored (nor followed out of the workspace).
    assert!(
        r["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"] != "passwd")
    );
    if let Some(skipped) = r["skipped_files"].as_array().unwrap().first() {
        assert_eq!(skipped["path"], "passwd");
        assert!(
            skipped["reason"]
                .as_str()
                .unwrap()
                .contains("symbolic link")
        );
    }
}

#[tokio::test]
async fn an_upload_over_the_limit_is_413_without_the_service_holding_it() {
    let s = Server::start().await;
    let base = peak_rss(s.pid());
    let (status, body) = try_upload(&s, "big.bin", vec![b'x'; 101 << 20]).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["detail"], "File size exceeds maximum of 100 MB");
    assert_peak_rss_grew_little(s.pid(), base, "a refused 101 MB upload");
    assert!(list(&s).await.is_empty());
    // Just under the limit is fine.
    let up = upload(&s, "ok.bin", vec![b'y'; 100 << 20]).await;
    assert_eq!(up["size_bytes"], 100 << 20);
    assert_peak_rss_grew_little(s.pid(), base, "a stored 100 MB upload");
}

#[tokio::test]
async fn stored_files_survive_a_restart() {
    let files_dir = tempfile::tempdir().unwrap();
    let options = || Options::default().env("SNAKECAGE_FILES__DIR", files_dir.path().display());
    let s = Server::start_with(options()).await;
    let up = upload(&s, "keep.csv", CSV.into()).await;
    let r = s.run("open('made.txt', 'w').write('made')").await;
    let made = id(output(&r, "made.txt"));
    assert!(s.stop().success());

    let s = Server::start_with(options()).await;
    let files = list(&s).await;
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(download_bytes(&s, &id(&up)).await, CSV.as_bytes());
    assert_eq!(download_bytes(&s, &made).await, b"made");
}

#[tokio::test]
async fn files_expire_after_their_ttl_and_a_full_store_answers_507() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_FILES__TTL_SECONDS", 1)
            .env("SNAKECAGE_FILES__QUOTA_MB", 1),
    )
    .await;
    let first = id(&upload(&s, "a.bin", vec![0; 600 << 10]).await);
    let (status, body) = try_upload(&s, "b.bin", vec![0; 600 << 10]).await;
    assert_eq!(status, 507, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "This file would take file storage past its quota of 1 MB \
             (files.quota_mb): 604 KB is used and the file is 600 KB, counted as 604 KB; \
             delete files you no longer need and retry"
        ),
        "{detail}"
    );
    // A run's output that does not fit is reported, not silently dropped.
    let r = s.run("open('big.bin', 'wb').write(bytes(600 << 10))").await;
    assert_eq!(r["files"], json!([]));
    assert_eq!(r["skipped_files"][0]["path"], "big.bin");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(download(&s, &first).await.status(), 404);
    assert!(list(&s).await.is_empty());
    // The sweeper gave the space back (a bound for a sweeper that never runs, not a speed).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = try_upload(&s, "c.bin", vec![0; 600 << 10]).await;
        if status == 201 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "space never came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A file larger than the store's whole quota is too large (413): no deletion and no wait
/// makes room for it, so the detail says so and there is no `Retry-After`. One that fits
/// the quota but not beside what is stored stays 507.
#[tokio::test]
async fn a_file_larger_than_the_whole_store_quota_is_413_one_that_does_not_fit_507() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_FILES__QUOTA_MB", 1)).await;
    assert_larger_than_the_whole_quota(
        try_upload_with_headers(&s, "huge.bin", vec![0; 2 << 20]).await,
        "2 MB",
        "file storage",
        "its quota of 1 MB (files.quota_mb)",
    );
    upload(&s, "a.bin", vec![0; 600 << 10]).await;
    let (status, headers, body) = try_upload_with_headers(&s, "b.bin", vec![0; 600 << 10]).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["code"], "insufficient_storage", "{body}");
    assert!(headers.get("retry-after").is_none(), "{headers:?}");
    assert_eq!(
        body["detail"],
        "This file would take file storage past its quota of 1 MB (files.quota_mb): 604 KB \
         is used and the file is 600 KB, counted as 604 KB; delete files you no longer need \
         and retry",
        "{body}"
    );
    // With files stored, the store refuses a larger file as soon as what it read passes
    // what is left (~400 KB here); the rest of the body tells that no deletion makes room.
    assert_larger_than_the_whole_quota(
        try_upload_with_headers(&s, "ünïcode-huge.bin", vec![0; 2 << 20]).await,
        "2 MB",
        "file storage",
        "its quota of 1 MB (files.quota_mb)",
    );
    // The same for a file a run writes: its size on disk is whole.
    let r = s.run("open('grand.bin', 'wb').write(bytes(3 << 20))\nopen('petit.bin', 'wb').write(bytes(500 << 10))").await;
    assert_eq!(
        r["skipped_files"],
        json!([
            {"path": "grand.bin", "reason": "larger (3 MB) than the whole quota of file storage, 1 MB (files.quota_mb)"},
            {"path": "petit.bin", "reason": "it would take file storage past its quota of 1 MB (files.quota_mb; 604 KB used)"},
        ]),
        "{r}"
    );
    assert_eq!(list(&s).await.len(), 1, "nothing stored but a.bin");
}

/// A tmp cleaner removes the store's directory under the running service: the store
/// recreates it at the next write (or listing, or background check), uploads and run
/// outputs are stored again, the files stored before are gone from the listing as from
/// the disk, and `/health` says what happened and what was lost.
#[tokio::test]
async fn a_store_directory_removed_under_the_service_is_recreated_and_its_loss_reported() {
    let s = Server::start().await;
    let before = id(&upload(&s, "avant-été.csv", CSV.as_bytes().to_vec()).await);
    let (_, health) = s.get_json("/health").await;
    assert_eq!(health["file_store"].get("last_recovery"), None, "{health}");

    let dir = s.state_dir().join("files");
    std::fs::remove_dir_all(&dir).unwrap();

    let after = id(&upload(&s, "après-été.csv", "é,ü\n1,2\n".as_bytes().to_vec()).await);
    assert_eq!(download_bytes(&s, &after).await, "é,ü\n1,2\n".as_bytes());
    let r = s
        .run("open('résultat.txt', 'w', encoding='utf-8').write('données')")
        .await;
    let written = output(&r, "résultat.txt")["file_id"]
        .as_str()
        .unwrap_or_else(|| panic!("not stored: {r}"))
        .to_owned();
    assert_eq!(
        download_bytes(&s, &written).await,
        "données".as_bytes(),
        "{r}"
    );
    let mut listed: Vec<String> = list(&s).await.iter().map(id).collect();
    listed.sort();
    let mut expected = vec![after.clone(), written];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(download(&s, &before).await.status(), 404);

    let (_, health) = s.get_json("/health").await;
    let recovery = &health["file_store"]["last_recovery"];
    assert_eq!(recovery["lost_files"], 1, "{health}");
    assert_eq!(
        recovery["detail"],
        format!(
            "the file store's directory {} had been removed from outside the service; \
             recreated it: the 1 file(s) stored before are lost",
            dir.display()
        ),
        "{health}"
    );
    assert!(
        s.log()
            .contains("had been removed from outside the service"),
        "not logged"
    );
}

/// The store's directory is gone and cannot be recreated (a file where it was): the store
/// is unavailable, so an upload, a download, a listing, a deletion and a run that sends
/// files each get 503 `unavailable` with `Retry-After`, as an unreachable S3 store does,
/// and a `detail` naming the directory and why; never a 500. Once the directory is back,
/// the files stored before are served again: nothing was forgotten meanwhile.
#[tokio::test]
async fn a_store_directory_that_cannot_be_recreated_is_a_503_saying_why() {
    let s = Server::start().await;
    let kept = id(&upload(&s, "gardé.csv", CSV.as_bytes().to_vec()).await);
    let dir = s.state_dir().join("files");
    let aside = s.state_dir().join("files-aside");
    std::fs::rename(&dir, &aside).unwrap();
    std::fs::write(&dir, "a file where the store's directory was").unwrap();

    let check = |what: &str, status: u16, headers: &reqwest::header::HeaderMap, body: &Value| {
        assert_eq!(status, 503, "{what}: {body}");
        assert_eq!(
            crate::harness::check_error_body(status, body),
            "unavailable",
            "{what}: {body}"
        );
        assert_eq!(headers["retry-after"], "1", "{what}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("the file store is unavailable")
                && detail.contains(&dir.display().to_string())
                && detail.contains("Not a directory")
                && detail.contains("files.dir"),
            "{what}: {detail}"
        );
    };
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("x.txt"),
    );
    let requests = [
        (
            "upload",
            s.client
                .post(format!("{}/v1/files", s.base))
                .multipart(form),
        ),
        (
            "download",
            s.client.get(format!("{}/v1/files/{kept}", s.base)),
        ),
        ("listing", s.client.get(format!("{}/v1/files", s.base))),
        (
            "deletion",
            s.client.delete(format!("{}/v1/files/{kept}", s.base)),
        ),
        (
            "run with files",
            s.client
                .post(format!("{}/v1/execute", s.base))
                .json(&json!({
                    "code": "print(open('in/d.csv').read())",
                    "files": [{"path": "in/d.csv", "file_id": kept}],
                })),
        ),
    ];
    for (what, request) in requests {
        let resp = request.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body: Value = resp.json().await.unwrap();
        check(what, status, &headers, &body);
    }
    // Code that needs no file still runs.
    assert_eq!(s.run("print(6 * 7)").await["stdout"], "42\n");
    assert!(!s.log().contains("internal error"), "{}", s.log());

    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&aside, &dir).unwrap();
    assert_eq!(download_bytes(&s, &kept).await, CSV.as_bytes());
    assert_eq!(list(&s).await.iter().map(id).collect::<Vec<_>>(), [kept]);
}
