//! What the model sees of a tool call: an API answer turned into MCP content (text, images),
//! flagged as an error when the run failed or the API refused the call.

use axum::http::StatusCode;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

/// Turns an API answer into what the model sees.
pub(super) fn tool_result(tool: &str, status: StatusCode, body: &Value) -> CallToolResult {
    if !status.is_success() {
        let detail = body["detail"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_owned);
        let code = body["code"].as_str().unwrap_or("unknown");
        return CallToolResult::error(vec![ContentBlock::text(format!(
            "{tool} failed ({status}, code {code}): {detail}"
        ))]);
    }
    match tool {
        "run_python" | "run_in_session" => run_result(body),
        "close_python_session" => {
            CallToolResult::success(vec![ContentBlock::text("session closed")])
        }
        _ => CallToolResult::success(vec![ContentBlock::text(pretty(body))]),
    }
}

/// A run: a text summary (exit code, stdout, stderr, files), then each image output.
/// A run that did not end with exit code 0 is an error result, with its traceback.
fn run_result(body: &Value) -> CallToolResult {
    let mut text = format!(
        "exit_code: {}\nverdict: {}\n",
        body["exit_code"]
            .as_i64()
            .map_or_else(|| "null".into(), |c| c.to_string()),
        body["verdict"].as_str().unwrap_or("unknown"),
    );
    if body["timed_out"] == true {
        text.push_str("timed_out: true\n");
    }
    if let Some(notice) = body["notice"].as_str() {
        text.push_str(&format!("notice: {notice}\n"));
    }
    if let Some(session) = body["session"].as_object() {
        let names: Vec<&str> = session["names"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        text.push_str(&format!(
            "session: {} variables ({}), expires at {}\n",
            session["variables"],
            names.join(", "),
            session["expires_at"].as_str().unwrap_or("?")
        ));
    }
    for stream in ["stdout", "stderr"] {
        let out = body[stream].as_str().unwrap_or_default();
        if !out.is_empty() {
            text.push_str(&format!("--- {stream} ---\n{out}"));
            if !out.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if let Some(files) = body["files"].as_array().filter(|f| !f.is_empty()) {
        text.push_str("--- files ---\n");
        for f in files {
            text.push_str(&format!(
                "{} ({}) file_id={}\n",
                f["path"].as_str().unwrap_or("?"),
                f["kind"].as_str().unwrap_or("?"),
                f["file_id"]
            ));
        }
    }
    let mut content = vec![ContentBlock::text(text)];
    for bundle in body["results"].as_array().into_iter().flatten() {
        if let Some(png) = bundle["image/png"].as_str() {
            content.push(ContentBlock::image(png, "image/png"));
        } else if let Some(plain) = bundle["text/plain"].as_str() {
            content.push(ContentBlock::text(plain));
        }
    }
    if body["exit_code"] == 0 {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_run_is_an_error_result_with_its_traceback() {
        let body = json!({"exit_code": 1, "verdict": "error", "stdout": "", "stderr": "Traceback ...\nZeroDivisionError: division by zero\n", "results": []});
        let r = run_result(&body);
        assert_eq!(r.is_error, Some(true));
        let text = serde_json::to_string(&r.content).unwrap();
        assert!(text.contains("ZeroDivisionError"), "{text}");
    }

    #[test]
    fn a_session_run_shows_its_state_and_any_notice() {
        let body = json!({"exit_code": 0, "verdict": "ok", "stdout": "", "stderr": "", "results": [],
            "replayed": 2, "notice": "a new worker replayed 2 runs",
            "session": {"variables": 2, "names": ["x", "df"], "expires_at": "2026-01-01T00:00:00Z"}});
        let text = serde_json::to_string(&run_result(&body).content).unwrap();
        assert!(
            text.contains("notice: a new worker replayed 2 runs"),
            "{text}"
        );
        assert!(text.contains("session: 2 variables (x, df)"), "{text}");
    }

    #[test]
    fn png_outputs_become_image_content() {
        let body = json!({"exit_code": 0, "verdict": "ok", "stdout": "hi\n", "stderr": "", "results": [{"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}]});
        let r = run_result(&body);
        assert_eq!(r.is_error, Some(false));
        let json = serde_json::to_value(&r.content).unwrap();
        assert_eq!(json[1]["type"], "image");
        assert_eq!(json[1]["mimeType"], "image/png");
    }

    #[test]
    fn an_api_refusal_is_an_error_result_that_quotes_the_detail() {
        let r = tool_result(
            "run_in_session",
            StatusCode::GONE,
            &json!({"detail": "session s was lost"}),
        );
        assert_eq!(r.is_error, Some(true));
        assert!(
            serde_json::to_string(&r.content)
                .unwrap()
                .contains("session s was lost")
        );
    }
}
