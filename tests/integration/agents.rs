//! What agents use beyond plain execution: markdown answers run as code, `code` as an array
//! of lines, tool definitions, MCP.

use serde_json::json;

use crate::harness::{Server, repo_root};

#[tokio::test]
async fn markdown_answers_run_their_python_blocks_in_order_as_one_program() {
    let s = Server::start().await;
    let answer = "Let me compute it.\n\n```python\nx = 20\n```\n\nThen:\n\n```py\nprint(x + 1)\n```\n\n```bash\necho not run\n```\n";
    let r = s
        .run_with(json!({"code": answer, "code_format": "markdown"}))
        .await;
    assert_eq!(r["stdout"], "21\n", "{r}");
    assert_eq!(r["exit_code"], 0);

    let (status, body) = s
        .post(
            "/v1/execute",
            &json!({"code": "No code here, just `prose`.", "code_format": "markdown"}),
        )
        .await;
    assert_eq!(status, 422);
    assert!(
        body["detail"].as_str().unwrap().contains("no ```python"),
        "{body}"
    );

    let (status, body) = s
        .post("/v1/execute", &json!({"code": "1", "code_format": "rst"}))
        .await;
    assert_eq!(status, 422, "{body}");
}

/// Runs the MCP client fixture (the official Python SDK) against the server.
fn mcp_client(base: &str, scenario: &str) -> serde_json::Value {
    mcp_client_with(base, scenario, &[])
}

/// The MCP client with extra arguments after the scenario (an API key, a session id).
pub fn mcp_client_with(base: &str, scenario: &str, extra: &[&str]) -> serde_json::Value {
    let out = mcp_client_output(base, scenario, extra);
    assert!(
        out.status.success(),
        "MCP client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs the MCP client, whatever becomes of it.
pub fn mcp_client_output(base: &str, scenario: &str, extra: &[&str]) -> std::process::Output {
    let python = repo_root().join(".venv-tools/bin/python");
    std::process::Command::new(&python)
        .arg(repo_root().join("tests/clients/mcp_client.py"))
        .arg(format!("{base}/mcp"))
        .arg(scenario)
        .args(extra)
        .env_remove("SNAKECAGE_API_KEY")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (scripts/test creates .venv-tools): {e}",
                python.display()
            )
        })
}

pub fn texts(result: &serde_json::Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn an_mcp_client_lists_and_calls_the_tools_and_gets_images_and_errors() {
    let s = Server::start().await;
    let base = s.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client(&base, "stateless"))
        .await
        .unwrap();
    assert_eq!(r["server"], "snakecage");
    assert_eq!(
        r["tools"],
        json!([
            "run_python",
            "list_packages",
            "create_python_session",
            "run_in_session",
            "close_python_session"
        ])
    );
    assert_eq!(r["hello"]["is_error"], false);
    assert!(texts(&r["hello"]).contains("42"), "{}", r["hello"]);
    // `code` as an array of lines, as a chat app's native tool mode sends it.
    assert_eq!(r["lines"]["is_error"], false, "{}", r["lines"]);
    assert!(texts(&r["lines"]).contains("42"), "{}", r["lines"]);
    // Closing the MCP session (DELETE /mcp) is answered the way the SDK accepts.
    assert_eq!(r["warnings"], json!([]), "the MCP client logged warnings");
    // The figure comes back as MCP image content, a real PNG.
    let image = r["plot"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .expect("an image block");
    assert_eq!(image["mime_type"], "image/png");
    assert_eq!(image["png_magic"], true);
    assert!(image["bytes"].as_u64().unwrap() > 1000);
    // An exception in user code is a tool result flagged as an error, with the traceback.
    assert_eq!(r["error"]["is_error"], true);
    assert!(
        texts(&r["error"]).contains("ZeroDivisionError: division by zero"),
        "{}",
        r["error"]
    );
    assert!(
        texts(&r["packages"]).contains("\"numpy\""),
        "{}",
        r["packages"]
    );
}

#[tokio::test]
async fn an_mcp_client_keeps_state_in_a_session_until_it_closes_it() {
    let s = Server::start().await;
    let base = s.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client(&base, "session"))
        .await
        .unwrap();
    assert_eq!(r["created"]["is_error"], false, "{}", r["created"]);
    assert_eq!(r["set"]["is_error"], false);
    assert!(
        texts(&r["get"]).contains("--- stdout ---\n42\n"),
        "{}",
        r["get"]
    );
    assert_eq!(r["closed"]["is_error"], false);
    assert_eq!(r["after_close"]["is_error"], true);
    assert!(
        texts(&r["after_close"]).contains("404"),
        "{}",
        r["after_close"]
    );
}

#[tokio::test]
async fn tool_definitions_validate_and_a_tool_call_runs_against_execute() {
    let s = Server::start().await;
    for format in ["openai", "anthropic"] {
        let resp = s
            .client
            .get(format!("{}/v1/tools?format={format}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let tools: serde_json::Value = resp.json().await.unwrap();
        // Validated against each format's own schema by jsonschema, in Python.
        let out = std::process::Command::new(repo_root().join(".venv-tools/bin/python"))
            .arg(repo_root().join("tests/clients/validate_tools.py"))
            .arg(format)
            .arg(tools.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{format}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let run = tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "run_python" || t["function"]["name"] == "run_python")
            .unwrap();
        let description = run["description"]
            .as_str()
            .or(run["function"]["description"].as_str())
            .unwrap();
        assert!(
            description.contains("256 MB") && description.contains("no network"),
            "{description}"
        );
    }
    // A model's tool call: its arguments are a /v1/execute body (a subset of one).
    let arguments = json!({"code": "import statistics\nprint(statistics.mean([1, 2, 3, 4]))"});
    let r = s.run_with(arguments).await;
    assert_eq!(r["stdout"], "2.5\n");
    let (status, body) = s.post("/v1/tools?format=xml", &json!({})).await;
    assert_eq!(status, 405, "{body}");
    let resp = s
        .client
        .get(format!("{}/v1/tools?format=xml", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn the_package_list_matches_what_imports_succeed_and_fail() {
    let s = Server::start().await;
    let packages: serde_json::Value = s
        .client
        .get(format!("{}/v1/packages", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(packages["python_version"], "3.12.1");
    let stdlib: Vec<String> = packages["stdlib"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(stdlib.contains(&"json".to_owned()) && !stdlib.contains(&"subprocess".to_owned()));
    let third: Vec<String> = packages["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["installed"] == true)
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(third.contains(&"numpy".to_owned()), "{packages}");
    // Every listed module imports (third-party ones that are installed, too), in a hardened
    // worker; one that is not listed fails with the allowlist's message.
    let code = format!(
        "bad = []\nfor m in {:?}:\n    try:\n        __import__(m)\n    except Exception as e:\n        bad.append((m, repr(e)))\nprint(bad)",
        stdlib.iter().chain(third.iter()).collect::<Vec<_>>()
    );
    let r = s.run_with(json!({"code": code, "timeout_ms": 30000})).await;
    assert_eq!(r["stdout"], "[]\n", "{r}");
    for name in ["scipy", "PIL", "openpyxl"] {
        let p = packages["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        assert_eq!(p["installed"], true, "{p}");
        assert!(p["version"].is_string(), "{p}");
    }
    let r = s.run("import smtplib").await;
    assert_eq!(r["exit_code"], 1);
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ImportError: import of 'smtplib' is not allowed in this sandbox"),
        "{r}"
    );
}

/// Reads an SSE body and returns its `result` event's data.
async fn stream_result(resp: reqwest::Response) -> serde_json::Value {
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let data = text
        .split("\n\n")
        .find(|event| event.starts_with("event: result"))
        .and_then(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .unwrap_or_else(|| panic!("no result event in {text}"));
    serde_json::from_str(data).unwrap()
}

#[tokio::test]
async fn code_as_an_array_of_lines_runs_on_every_execute_route() {
    let s = Server::start().await;
    let lines = json!(["ñ = 20", "", "def f(x):", "    return x + 1", "print(f(ñ))"]);
    let r = s.run_with(json!({"code": lines})).await;
    assert_eq!(r["stdout"], "21\n", "{r}");
    let r = s
        .run_with(json!({"code": ["print('ñandú', '日本')"]}))
        .await;
    assert_eq!(r["stdout"], "ñandú 日本\n", "{r}");

    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": lines}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream_result(resp).await["stdout"], "21\n");

    let md = json!(["Here:", "```python", "print('md', 6 * 7)", "```"]);
    let r = s
        .run_with(json!({"code": md, "code_format": "markdown"}))
        .await;
    assert_eq!(r["stdout"], "md 42\n", "{r}");

    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = created["session_id"].as_str().unwrap();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": ["x = 40", "y = 2"]}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{sid}/execute/stream", s.base))
        .json(&json!({"code": ["print(x + y)"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream_result(resp).await["stdout"], "42\n");

    // Anything else is a 422 that says what was wrong.
    for (code, needle) in [
        (json!(["x = 1", 2]), "element 1 is a number"),
        (json!([null]), "element 0 is null"),
        (json!({"line": "x"}), "an array of strings"),
        (json!(7), "an array of strings"),
    ] {
        let (status, body) = s.post("/v1/execute", &json!({"code": code})).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["code"], "invalid_request");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
    }
    let (status, body) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": [1]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");

    // The tool schemas document both shapes.
    let (_, tools) = s.get_json("/v1/tools?format=anthropic").await;
    for tool in tools.as_array().unwrap() {
        let Some(code) = tool["input_schema"]["properties"].get("code") else {
            continue;
        };
        assert_eq!(
            code["anyOf"],
            json!([{"type": "string"}, {"type": "array", "items": {"type": "string"}}]),
            "{tool}"
        );
        assert!(
            code["description"]
                .as_str()
                .unwrap()
                .contains("array of strings"),
            "{code}"
        );
    }
}

#[tokio::test]
async fn the_readme_names_the_arguments_run_python_takes_as_its_schema_does() {
    let s = Server::start().await;
    let (_, tools) = s.get_json("/v1/tools?format=anthropic").await;
    let run = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "run_python")
        .unwrap();
    assert_eq!(run["input_schema"]["additionalProperties"], false, "{run}");
    let mut offered: Vec<String> = run["input_schema"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    offered.sort();
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let (_, rest) = readme
        .split_once("`run_python` takes ")
        .expect("README.md says what `run_python` takes");
    let (listed, _) = rest.split_once(" (").unwrap();
    let mut documented: Vec<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    documented.sort();
    assert_eq!(
        documented, offered,
        "README.md: `run_python` takes {listed}"
    );
}
