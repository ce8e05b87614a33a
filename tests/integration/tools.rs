//! Code Mode end to end: sandboxed Python calls host tools (`from snakecage import tools`)
//! served by HTTP tools on loopback: search, loops, errors, limits, timeouts, redirects,
//! sessions, hostile frames, and the sandbox still closed with tools on. Caller-answered
//! tools are in `tools_caller`, upstream MCP servers and per-key scoping in `tools_mcp`.

use std::time::Duration;

use axum::Json;
use axum::extract::Query;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::harness::{Options, Server};

/// The routes of the loopback service behind the operator's HTTP tools; the state is the
/// port it listens on.
pub fn tool_routes() -> axum::Router<u16> {
    axum::Router::new()
        .route(
            "/weather",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let city = q.get("city").cloned().unwrap_or_default();
                    let temp = city.chars().count() as i64;
                    Json(json!({"city": city, "temp": temp}))
                },
            ),
        )
        .route(
            "/convert",
            post(|Json(body): Json<Value>| async move {
                let amount = body["amount"].as_f64().unwrap_or(0.0);
                (
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({"message": "no rate for that currency", "amount": amount})),
                )
            }),
        )
        .route(
            "/moved",
            get(|| async { axum::response::Redirect::temporary("/weather?city=Moved") }),
        )
        .route(
            "/offsite",
            get(
                |axum::extract::State(port): axum::extract::State<u16>| async move {
                    axum::response::Redirect::temporary(&format!(
                        "http://localhost:{port}/weather?city=Far"
                    ))
                },
            ),
        )
        .route(
            "/whoami",
            get(|headers: axum::http::HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                Json(json!({ "authorization": auth }))
            }),
        )
        .route(
            "/moved-whoami",
            get(|| async {
                (
                    axum::http::StatusCode::FOUND,
                    [(axum::http::header::LOCATION, "/whoami?über=1")],
                )
            }),
        )
        .route("/big", get(|| async { "x".repeat(100_000) }))
        .route(
            "/legacy",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    use axum::http::header::CONTENT_TYPE;
                    match q.get("form").map(String::as_str) {
                        Some("json") => (
                            [(CONTENT_TYPE, "application/json; charset=ISO-8859-1")],
                            b"{\"dish\": \"caf\xe9 cr\xe8me\"}".to_vec(),
                        ),
                        _ => (
                            [(CONTENT_TYPE, "text/plain; charset=\"windows-1252\"")],
                            b"caf\xe9: 2 \x80".to_vec(),
                        ),
                    }
                },
            ),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(600)).await;
                "late"
            }),
        )
}

/// A loopback service behind the operator's HTTP tools.
pub async fn tool_service() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = tool_routes().with_state(addr.port());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

pub async fn server_with_tools(extra: &str) -> (Server, tempfile::TempDir) {
    server_with_tools_env(extra, &[]).await
}

/// [`server_with_tools`], with `env` set for the service (secrets of `headers_from_env`).
pub async fn server_with_tools_env(
    extra: &str,
    env: &[(&str, &str)],
) -> (Server, tempfile::TempDir) {
    let base = tool_service().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[tools]
max_calls_per_run = 20
call_timeout_ms = 1500
max_result_bytes = 65536
{extra}

[[tools.http]]
name = "get_weather"
description = "Current temperature for a city"
parameters = {{ type = "object", properties = {{ city = {{ type = "string" }} }}, required = ["city"], additionalProperties = false }}
url = "{base}/weather"
method = "GET"

[[tools.http]]
name = "convert_currency"
description = "Convert an amount between currencies"
parameters = {{ type = "object", properties = {{ amount = {{ type = "number" }}, to = {{ type = "string" }} }}, required = ["amount", "to"] }}
url = "{base}/convert"

[[tools.http]]
name = "moved"
description = "Redirects to the same origin"
url = "{base}/moved"
method = "GET"

[[tools.http]]
name = "offsite"
description = "Redirects to another host"
url = "{base}/offsite"
method = "GET"

[[tools.http]]
name = "big"
description = "Answers more than max_result_bytes"
url = "{base}/big"
method = "GET"

[[tools.http]]
name = "slow_lookup"
description = "A lookup that never answers"
url = "{base}/slow"
method = "GET"
"#
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let options = env.iter().fold(
        Options::default().env("SNAKECAGE_CONFIG", path.display()),
        |options, (key, value)| options.env(key, value),
    );
    (Server::start_with(options).await, dir)
}

#[tokio::test]
async fn a_program_searches_calls_in_a_loop_and_aggregates() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
found = tools.search('temperature city')
print([t['name'] for t in found][:1])
cities = ['Zürich', 'Genève', 'Bern']
temps = {c: tools.get_weather(city=c)['temp'] for c in cities}
print(sum(temps.values()), temps['Genève'])
print(tools.call('get_weather', city='東京')['city'])
print(sorted(t['name'] for t in tools.list()))";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "['get_weather']\n16 6\n東京\n['big', 'convert_currency', 'get_weather', 'moved', 'offsite', 'slow_lookup']\n",
        "{body}"
    );
    assert_eq!(body["exit_code"], 0);
    let (_, _, catalog) = s.get("/v1/tools/catalog?query=currency").await;
    let catalog: Value = serde_json::from_str(&catalog).unwrap();
    assert_eq!(catalog["tools"][0]["name"], "convert_currency", "{catalog}");
    // A model's markdown answer runs with the same tools.
    let answer = "Let me check.\n```python\nfrom snakecage import tools\nprint(tools.get_weather(city='Olten')['temp'])\n```\n";
    let body = s
        .run_with(json!({"code": answer, "code_format": "markdown"}))
        .await;
    assert_eq!(body["stdout"], "5\n", "{body}");
    // What a model is told names the tools and says how to use them.
    let (_, _, described) = s.get("/v1/tools").await;
    assert!(
        described.contains("from snakecage import tools"),
        "{described}"
    );
    assert!(
        described.contains("convert_currency (Convert an amount between currencies)"),
        "{described}"
    );
    let (_, _, status) = s.get("/v1/status").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tools"]["calls"], 5, "{status}");
    assert_eq!(status["tools"]["configured"], 6, "{status}");
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="ok",provider="http",tool="get_weather"} 5"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_calls_raise_clear_python_exceptions() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
for call in (lambda: tools.get_weather(city=3), lambda: tools.get_weather(town='x'),
             lambda: tools.call('launch_missiles'), lambda: tools.nope(),
             lambda: tools.convert_currency(amount=5, to='XYZ')):
    try:
        call()
    except tools.ToolError as e:
        print(type(e).__name__, '|', e.message, '|', e.data)\n";
    let body = s.run(code).await;
    let lines: Vec<&str> = body["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 5, "{body}");
    assert!(lines[0].starts_with("ToolArgumentsError | arguments of tool 'get_weather' do not match its schema: city: 3 is not of type \"string\""), "{}", lines[0]);
    assert!(
        lines[1].contains("ToolArgumentsError") && lines[1].contains("town"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(
            "UnknownToolError | unknown tool 'launch_missiles'; this run offers: get_weather"
        ),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("UnknownToolError | unknown tool 'nope'"),
        "{}",
        lines[3]
    );
    assert_eq!(
        lines[4],
        "ToolError | tool 'convert_currency' answered HTTP 422 Unprocessable Entity | {'amount': 5.0, 'message': 'no rate for that currency'}"
    );
    // Redirects: followed to the same origin only; a response over max_result_bytes is
    // refused as it is read.
    let code = "from snakecage import tools\nprint(tools.moved()['city'])\nfor name in ('offsite', 'big'):\n    try:\n        tools.call(name)\n    except tools.ToolError as e:\n        print(type(e).__name__, e.message)\n";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "Moved\nToolError tool 'offsite' answered HTTP 307 Temporary Redirect\nToolLimitError the tool's response is larger than the 65536 bytes allowed (tools.max_result_bytes)\n",
        "{body}"
    );
    // Refused in the worker: nothing reached the supervisor for the first four.
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_tool_calls_total{outcome="failed",provider="http",tool="convert_currency"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains(r#"provider="none""#), "{metrics}");
}

/// An answer in the charset its Content-Type declares is decoded by it, JSON or text: not
/// taken for UTF-8 and spoilt with U+FFFD.
#[tokio::test]
async fn an_http_tools_answer_is_decoded_by_its_declared_charset() {
    let legacy = format!(
        "[[tools.http]]\nname = \"legacy_menu\"\ndescription = \"Answers in a legacy charset\"\nurl = \"{}/legacy\"\nmethod = \"GET\"\n",
        tool_service().await
    );
    let (s, _dir) = server_with_tools(&legacy).await;
    let code = "from snakecage import tools\nprint(tools.legacy_menu(form='json'))\nprint(tools.legacy_menu(form='text'))\n";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"], "{'dish': 'café crème'}\ncafé: 2 €\n",
        "{body}"
    );
}

/// The operator's headers (a secret, here) go with the request to the tool's URL and with
/// a redirect to the same origin; a redirect elsewhere is not followed at all.
#[tokio::test]
async fn an_http_tools_headers_follow_a_same_origin_redirect() {
    let base = tool_service().await;
    let extra = format!(
        r#"
[[tools.http]]
name = "whoami"
description = "Says which Authorization it got"
url = "{base}/whoami"
method = "GET"
headers = {{ Authorization = "Bearer wx-geheim" }}

[[tools.http]]
name = "whoami_moved"
description = "The same, behind a 302 to the same origin"
url = "{base}/moved-whoami"
method = "GET"
headers_from_env = {{ Authorization = "WHOAMI_AUTH" }}
"#
    );
    let (s, _dir) = server_with_tools_env(&extra, &[("WHOAMI_AUTH", "Bearer wx-geheim")]).await;
    let body = s
        .run("from snakecage import tools\nprint(tools.whoami()['authorization'])\nprint(tools.whoami_moved()['authorization'])\n")
        .await;
    assert_eq!(
        body["stdout"], "Bearer wx-geheim\nBearer wx-geheim\n",
        "{body}"
    );
}

#[tokio::test]
async fn the_call_limit_and_the_call_timeout_raise_and_the_run_goes_on() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
n = 0
try:
    while True:
        tools.get_weather(city='x'); n += 1
except tools.ToolLimitError as e:
    print(n, e.message)\n";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "20 this run has made its 20 tool calls (tools.max_calls_per_run); do more work per call\n",
        "{body}"
    );
    let code = "from snakecage import tools
try:
    tools.slow_lookup()
except tools.ToolTimeoutError as e:
    print(isinstance(e, TimeoutError), e.message)
print('after')";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "True tool 'slow_lookup' did not answer within 1500 ms (tools.call_timeout_ms)\nafter\n",
        "{body}"
    );
}

#[tokio::test]
async fn a_worker_that_sends_garbage_frames_is_killed_and_counted() {
    let (s, _dir) = server_with_tools("").await;
    // An oversized length prefix, then bytes that are no frame at all, on the job socket.
    for code in [
        "import os\nos.write(3, b'\\xff\\xff\\xff\\x7f' + b'garbage')\nimport time\ntime.sleep(5)",
        "import os\nos.write(3, b'\\x05\\x00\\x00\\x00{]x!!')\nimport time\ntime.sleep(5)",
        "import os, json\nm = json.dumps({'type': 'tool_call', 'id': 1, 'name': 'get_weather', 'arguments': {'city': 'x'}}).encode()\nf = len(m).to_bytes(4, 'little') + m\nos.write(3, f + f)\nimport time\ntime.sleep(5)",
        // Half a length prefix, then the job ends as usual: its result frame is garbled.
        "import os\nos.write(3, b'{}')\nprint('fin ✓')",
    ] {
        let body = s.run(code).await;
        assert_eq!(body["verdict"], "killed", "{body}");
        assert_eq!(body["exit_code"], Value::Null, "{body}");
        // Said as what it is, not as an exit before reporting (the last one exits 0).
        let stderr = body["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("broke the job protocol") && stderr.contains("fd 3"),
            "{body}"
        );
        assert!(!stderr.contains("before reporting"), "{body}");
    }
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_workers_killed_total{reason="protocol_violation"} 4"#),
        "{metrics}"
    );
    assert_eq!(s.run("print('still fine')").await["stdout"], "still fine\n");
}

/// A worker that exits with an answer it never read still in its socket: the supervisor's
/// next read fails (`ECONNRESET`). That is a death, said as one, not a broken protocol.
#[tokio::test]
async fn a_worker_that_exits_with_an_answer_unread_died_and_broke_nothing() {
    let (s, _dir) = server_with_tools("").await;
    let code = "import os, json, time
m = json.dumps({'type': 'tool_call', 'id': 1, 'name': 'get_weather', 'arguments': {'city': 'Zürich'}}).encode()
os.write(3, len(m).to_bytes(4, 'little') + m)
time.sleep(0.5)
os._exit(3)";
    let body = s.run(code).await;
    assert_eq!(body["verdict"], "killed", "{body}");
    let stderr = body["stderr"].as_str().unwrap();
    assert!(
        stderr.ends_with("The worker exited with status 3 before reporting a result (os._exit() ends the process at once; sys.exit() sets the exit code)."),
        "{body}"
    );
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_workers_killed_total{reason="protocol_violation"} 0"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_sandbox_stays_closed_with_tools_enabled() {
    let (s, _dir) = server_with_tools("").await;
    for (code, last) in [
        (
            "from snakecage import tools\nimport socket",
            "ImportError: import of 'socket' is not allowed in this sandbox",
        ),
        (
            "from snakecage import tools\nimport os\nos.system('id')",
            "PermissionError: 'os.system' is not allowed in this sandbox",
        ),
        (
            "from snakecage import tools\nimport _snakecage_tools",
            "ImportError: import of '_snakecage_tools' is not allowed in this sandbox",
        ),
    ] {
        let body = s.run(code).await;
        let stderr = body["stderr"].as_str().unwrap();
        assert_eq!(stderr.trim_end().lines().last(), Some(last), "{body}");
    }
}

#[tokio::test]
async fn sessions_keep_tools_across_runs() {
    let (s, _dir) = server_with_tools("").await;
    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap();
    let path = format!("/v1/sessions/{id}/execute");
    let first_code = "from snakecage import tools\nw = tools.get_weather(city='Basel')";
    let (_, first) = s.post(&path, &json!({"code": first_code})).await;
    assert_eq!(first["exit_code"], 0, "{first}");
    let second_code = "print(w['temp'], tools.get_weather(city='Chur')['temp'])";
    let (_, second) = s.post(&path, &json!({"code": second_code})).await;
    assert_eq!(second["stdout"], "5 4\n", "{second}");
}

/// Tools are the program's, not its main thread's: a `ThreadPoolExecutor` fans calls out
/// (in flight together, see `tools_concurrent`) and every result comes back to its caller.
#[tokio::test]
async fn threads_of_a_program_call_tools_and_each_gets_its_own_answer() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
from concurrent.futures import ThreadPoolExecutor
import threading
cities = ['Zürich', 'Genève', 'Bern', 'Chur', '東京', 'Sion', 'Biel/Bienne', 'Aïre']
with ThreadPoolExecutor(max_workers=8) as pool:
    answers = list(pool.map(lambda c: tools.get_weather(city=c), cities))
print([(a['city'], a['temp']) for a in answers] == [(c, len(c)) for c in cities])
seen = []
def look():
    seen.append((sorted(t['name'] for t in tools.list())[:2],
                 tools.call('get_weather', city='Thun')['temp'],
                 [t['name'] for t in tools.search('temperature')][:1]))
t = threading.Thread(target=look)
t.start(); t.join()
print(seen)";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"], "True\n[(['big', 'convert_currency'], 4, ['get_weather'])]\n",
        "{body}"
    );
    assert_eq!(body["exit_code"], 0, "{body}");
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="ok",provider="http",tool="get_weather"} 9"#
        ),
        "{metrics}"
    );
}

/// The same with the Python layer off: the OS layers stop raw sockets and process
/// creation while the program uses tools (ctypes reaches the syscalls directly).
#[tokio::test]
async fn with_the_python_layer_off_the_os_layers_still_close_the_sandbox_around_tools() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let base = tool_service().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[tools.http]]\nname = \"get_weather\"\ndescription = \"d\"\nurl = \"{base}/weather\"\nmethod = \"GET\"\n"
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_CONFIG", path.display())
            .env(
                "SNAKECAGE_SANDBOX__REQUIRE",
                r#"["network_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp"]"#,
            )
            .env("SNAKECAGE_SANDBOX__LAYERS_OFF", r#"["audit_hook", "import_guard"]"#),
    )
    .await;
    let code = "from snakecage import tools
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(tools.get_weather(city='Sion')['temp'])
for name, call in [('socket', lambda: libc.socket(2, 1, 0)), ('fork', lambda: libc.syscall(57)),
                   ('execve', lambda: libc.execve(b'/bin/sh', None, None))]:
    r = call()
    print(name, r, os.strerror(ctypes.get_errno()))
print(tools.get_weather(city='Thun')['temp'])";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "4\nsocket -1 Operation not permitted\nfork -1 Operation not permitted\nexecve -1 Operation not permitted\n4\n",
        "{body}"
    );
}
