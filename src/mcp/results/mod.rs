//! What the model sees of a tool call: an API answer turned into MCP content (text, images),
//! flagged as an error when the run failed or the API refused the call, and always small
//! enough for an MCP client to read ([`budget`]).
//!
//! - [`budget`]: the size bound, and text cut to it (head and tail, saying what was cut).
//! - [`terminal`]: output with carriage returns rendered as a terminal shows them.

mod budget;
mod terminal;

use axum::http::StatusCode;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

use self::budget::{RESULT_BUDGET, head_and_tail, json_len};
use self::terminal::render_carriage_returns;

/// The most each output stream (stdout, stderr) takes of a run's result.
const STREAM_BUDGET: usize = 96 << 10;
/// The most the list of stored files, and that of files not stored, each take.
const LIST_BUDGET: usize = 16 << 10;
/// The most a short field (a notice, the exception's message, a session's names) takes.
const LINE_BUDGET: usize = 8 << 10;
/// The most the text of one rich output takes.
const BUNDLE_TEXT_BUDGET: usize = 8 << 10;
/// The rich outputs looked at (a run keeps at most 50, and one note about the rest).
const MAX_BUNDLES: usize = 51;
/// The most one note about a rich output left out takes; room for one per output is kept.
const MAX_NOTE: usize = 1024;
/// What to do about output too large to show, said wherever some is cut.
const GET_ALL_OF_IT: &str = "to read all of it, have the code write it to a file in the \
     working directory (files written are stored and listed under files with their file_id, \
     and a later run can stage one with `files` and print the part it needs), or print less";

/// Turns an API answer into what the model sees.
pub(super) fn tool_result(tool: &str, status: StatusCode, body: &Value) -> CallToolResult {
    if !status.is_success() {
        let detail = body["detail"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_owned);
        let code = body["code"].as_str().unwrap_or("unknown");
        return CallToolResult::error(vec![ContentBlock::text(cut(
            &format!("{tool} failed ({status}, code {code}): {detail}"),
            STREAM_BUDGET,
            "of the error",
        ))]);
    }
    match tool {
        "run_python" | "run_in_session" => run_result(body),
        "close_python_session" => {
            CallToolResult::success(vec![ContentBlock::text("session closed")])
        }
        _ => CallToolResult::success(vec![ContentBlock::text(cut(
            &pretty(body),
            RESULT_BUDGET / 2,
            "of the answer",
        ))]),
    }
}

/// A run: a text summary (exit code, the exception, stdout, stderr, files), then each rich
/// output, images as image content while they fit the result's budget. A run that did not
/// end with exit code 0 is an error result, with its traceback.
fn run_result(body: &Value) -> CallToolResult {
    let text = run_summary(body);
    let mut used = json_len(&CallToolResult::error(Vec::new())) + json_len(&text) + 1;
    let mut content = vec![text];
    let bundles = body["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    // Room for a note about each output, whatever the images before it took.
    let mut reserved = MAX_NOTE * (bundles.len().min(MAX_BUNDLES) + 1);
    for (i, bundle) in bundles.iter().take(MAX_BUNDLES).enumerate() {
        reserved -= MAX_NOTE;
        let block = match (bundle["image/png"].as_str(), bundle["text/plain"].as_str()) {
            (Some(png), _) => {
                // The block's size without copying the image: an empty one's, plus the data.
                let size = json_len(&ContentBlock::image("", "image/png")) + json_len(png) - 2;
                if used + size + 1 + reserved <= RESULT_BUDGET {
                    ContentBlock::image(png, "image/png")
                } else {
                    ContentBlock::text(format!(
                        "[output {}: an image/png of {} bytes (base64) is left out: a tool \
                         result is kept under {} KiB so that MCP clients can read it. To get \
                         the figure, save it in the code (plt.savefig(\"figure.png\")): the \
                         file is stored and listed under files with its file_id. Or draw it \
                         smaller (figsize, dpi).]",
                        i + 1,
                        png.len(),
                        RESULT_BUDGET >> 10
                    ))
                }
            }
            (None, Some(plain)) => ContentBlock::text(cut(
                &render_carriage_returns(plain),
                // At least a note's room is free (reserved before); the block's own fields
                // take the rest of it.
                BUNDLE_TEXT_BUDGET
                    .min(RESULT_BUDGET.saturating_sub(used + reserved))
                    .saturating_sub(64),
                "of this output",
            )),
            (None, None) => continue,
        };
        used += json_len(&block) + 1;
        content.push(block);
    }
    if bundles.len() > MAX_BUNDLES {
        content.push(ContentBlock::text(format!(
            "[{} more outputs left out]",
            bundles.len() - MAX_BUNDLES
        )));
    }
    if body["exit_code"] == 0 {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

/// The text of a run: its verdict and exception, its session, its output, its files.
fn run_summary(body: &Value) -> ContentBlock {
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
    if let Some(kind) = body["error"]["type"].as_str() {
        let message = body["error"]["message"].as_str().unwrap_or_default();
        text.push_str(&cut(
            &format!("error: {kind}: {message}\n"),
            LINE_BUDGET,
            "of the error",
        ));
    }
    if let Some(notice) = body["notice"].as_str() {
        text.push_str(&cut(
            &format!("notice: {notice}\n"),
            LINE_BUDGET,
            "of the notice",
        ));
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
            cut(&names.join(", "), LINE_BUDGET, "of the names"),
            session["expires_at"].as_str().unwrap_or("?")
        ));
    }
    for stream in ["stdout", "stderr"] {
        let out = render_carriage_returns(body[stream].as_str().unwrap_or_default());
        if !out.is_empty() {
            text.push_str(&format!("--- {stream} ---\n"));
            text.push_str(&cut(&out, STREAM_BUDGET, &format!("of {stream}")));
            if !out.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    let listing = |entries: &[Value], line: &dyn Fn(&Value) -> String| {
        entries.iter().map(line).collect::<String>()
    };
    if let Some(files) = body["files"].as_array().filter(|f| !f.is_empty()) {
        text.push_str("--- files ---\n");
        let lines = listing(files, &|f| {
            format!(
                "{} ({}) file_id={}\n",
                f["path"].as_str().unwrap_or("?"),
                f["kind"].as_str().unwrap_or("?"),
                f["file_id"]
            )
        });
        text.push_str(&cut(&lines, LIST_BUDGET, "of the file list"));
    }
    if let Some(skipped) = body["skipped_files"].as_array().filter(|f| !f.is_empty()) {
        text.push_str("--- files not stored (not in files; no file_id) ---\n");
        let lines = listing(skipped, &|f| {
            format!(
                "{}: {}\n",
                f["path"].as_str().unwrap_or("?"),
                f["reason"].as_str().unwrap_or("?")
            )
        });
        text.push_str(&cut(&lines, LIST_BUDGET, "of the list of files not stored"));
    }
    ContentBlock::text(text)
}

/// `text` within `budget` bytes of JSON, its middle cut with a note that says how much of
/// `what` was cut and how to get all of it.
fn cut(text: &str, budget: usize, what: &str) -> String {
    head_and_tail(text, budget, |n| {
        format!(
            "[... {n} characters {what} cut here: a tool result is kept small; {GET_ALL_OF_IT} ...]"
        )
    })
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
    fn the_largest_answer_a_hostile_worker_can_cause_fits_one_sse_event() {
        // Every field at or past what the API lets through, of control characters where
        // text (six bytes of JSON each), and more outputs than a run keeps.
        let control = "\u{1}".repeat(1 << 20);
        let png = "A".repeat(3 << 20);
        let files: Vec<Value> = (0..1_000)
            .map(|i| json!({"path": format!("{i}{}", "\u{2}".repeat(4096)), "kind": "file", "file_id": "x"}))
            .collect();
        let bundles: Vec<Value> = (0..60)
            .map(|i| match i % 3 {
                0 if i < 12 => json!({"image/png": png}),
                1 => json!({"text/plain": control}),
                _ => json!({"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}),
            })
            .collect();
        let body = json!({"exit_code": 1, "verdict": "output_limit", "stdout": control,
            "stderr": control, "error": {"type": control, "message": control},
            "notice": control, "files": files, "skipped_files": files,
            "session": {"variables": 1, "names": [control], "expires_at": "?"},
            "results": bundles});
        let result = run_result(&body);
        assert!(json_len(&result) <= RESULT_BUDGET, "{}", json_len(&result));
        // As sent: a JSON-RPC response, framed as one SSE event.
        let event = format!(
            "id: 0\nevent: message\ndata: {}\n\n",
            json!({"jsonrpc": "2.0", "id": u64::MAX, "result": result})
        );
        assert!(event.len() < budget::SSE_EVENT_LIMIT, "{}", event.len());
        // Small images still come through, the large ones are named.
        let content = serde_json::to_value(&result.content).unwrap();
        let content = content.as_array().unwrap();
        assert!(content.iter().any(|c| c["type"] == "image"));
        let text = serde_json::to_string(content).unwrap();
        assert!(text.contains("an image/png of 3145728 bytes (base64) is left out"));
        assert!(
            text.contains("[9 more outputs left out]"),
            "{:.300}",
            &text[text.len() - 300..]
        );
    }

    #[test]
    fn an_oversized_answer_of_another_tool_is_cut_to_the_budget() {
        let body = json!({"packages": "\u{1}".repeat(1 << 20)});
        let r = tool_result("list_packages", StatusCode::OK, &body);
        assert!(json_len(&r) <= RESULT_BUDGET / 2 + 256, "{}", json_len(&r));
        assert!(
            serde_json::to_string(&r)
                .unwrap()
                .contains("characters of the answer cut here")
        );
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
