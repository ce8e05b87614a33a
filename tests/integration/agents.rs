//! What agents use beyond plain execution: markdown answers run as code.

use serde_json::json;

use crate::harness::Server;

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
