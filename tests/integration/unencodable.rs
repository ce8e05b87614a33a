//! Text user code makes that UTF-8 cannot encode: a Python `str` may hold lone surrogates
//! (`chr(0xd800)`, a `surrogateescape`d byte, a `json.loads` of `"\ud800"`). In an
//! exception's message, a repr, a rich output or a global's name it is reported like any
//! other text; it never kills the worker, and never loses a session's state.

use serde_json::json;

use crate::harness::{Server, variable_names};

/// A class whose repr holds a lone surrogate.
const SURROGATE_REPR: &str =
    "class A:\n    def __repr__(self):\n        return 'x' + chr(0xD800)\n";

#[tokio::test]
async fn lone_surrogates_in_errors_reprs_and_outputs_are_reported_not_fatal() {
    let s = Server::start().await;

    // An uncaught exception whose message holds one: an ordinary error, with the
    // traceback as CPython prints it (stderr escapes the surrogate).
    let r = s.run("raise ValueError('bad ' + chr(0xD800))").await;
    assert_eq!(r["verdict"], "error", "{r}");
    assert_eq!(r["exit_code"], 1, "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(stderr.ends_with("ValueError: bad \\ud800\n"), "{r}");
    assert!(
        !stderr.contains("snakecage"),
        "the runner shows through: {r}"
    );

    // The last expression's repr: echoed escaped, as CPython's displayhook does.
    let r = s.run(&format!("{SURROGATE_REPR}A()")).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["stdout"], "x\\ud800\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    assert_eq!(r["results"], json!([{"text/plain": "x\\ud800"}]), "{r}");

    // A rich output (`_repr_html_`) holding one.
    let r = s
        .run(
            "class H:\n    def __repr__(self):\n        return 'h'\n    \
             def _repr_html_(self):\n        return '<b>' + chr(0xD800) + '</b>'\n\
             display(H())\nprint('after')",
        )
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["stdout"], "h\nafter\n", "{r}");
    assert_eq!(
        r["results"],
        json!([{"text/plain": "h", "text/html": "<b>\\ud800</b>"}]),
        "{r}"
    );
}

#[tokio::test]
async fn a_session_survives_lone_surrogates_in_an_error_and_in_a_global_name() {
    let s = Server::start().await;
    let id = s.new_session().await;

    let r = s
        .session_run(&id, "x = 42\nraise ValueError(chr(0xD800))")
        .await;
    assert_eq!(r["verdict"], "error", "{r}");
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(r.get("notice").is_none(), "{r}");
    let r = s.session_run(&id, "print(x)").await;
    assert_eq!(r["stdout"], "42\n", "the session lost its state: {r}");

    // A global whose name holds one: listed (escaped), the session lives on.
    let r = s.session_run(&id, "globals()['v' + chr(0xD800)] = 1").await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert!(r.get("notice").is_none(), "{r}");
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert!(variable_names(&detail).contains(&"v\\ud800"), "{detail}");
    let r = s
        .session_run(&id, &format!("{SURROGATE_REPR}y = A()\nx"))
        .await;
    assert_eq!(r["stdout"], "42\n", "{r}");
}
