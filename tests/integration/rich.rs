//! Rich results an agent can read without the data: NumPy arrays with their shape and dtype,
//! long DataFrames cut to a table plus a one-line summary; and what a run keeps of them when
//! there are too many, too little time or no memory left to report them.

use serde_json::json;

use crate::harness::{Options, Server};

#[tokio::test]
async fn arrays_and_long_dataframes_come_back_summarised() {
    let s = Server::start().await;
    let r = s
        .run("import numpy as np\nnp.random.default_rng(0).normal(size=(1000, 3))")
        .await;
    let text = r["results"][0]["text/plain"].as_str().unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    assert_eq!(first, "array(shape=(1000, 3), dtype=float64)", "{text}");
    assert!(
        rest.starts_with("array([[") && rest.contains("..."),
        "{text}"
    );
    assert!(text.lines().count() < 12, "{text}");
    assert_eq!(r["stdout"].as_str().unwrap(), format!("{text}\n"));

    let r = s
        .run("import pandas as pd\npd.DataFrame({'n': range(500), 'città': ['Zürich'] * 500})")
        .await;
    let bundle = &r["results"][0];
    let plain = bundle["text/plain"].as_str().unwrap();
    let last = plain.lines().last().unwrap();
    assert!(
        last.starts_with("500 rows × 2 columns; dtypes: n int64, città "),
        "{plain}"
    );
    assert!(
        plain.lines().count() < 26 && plain.contains("Zürich"),
        "{plain}"
    );
    assert!(
        bundle["text/markdown"].as_str().unwrap().contains(last),
        "{bundle}"
    );

    // The same in a session, with the session's state alongside.
    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = created["session_id"].as_str().unwrap();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": "import numpy as np\na = np.ones((2, 2), dtype=np.int8)\na"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["results"][0]["text/plain"],
        "array(shape=(2, 2), dtype=int8)\narray([[1, 1],\n       [1, 1]], dtype=int8)"
    );
    assert_eq!(r["session"]["names"], json!(["np", "a"]));
}

/// As in Jupyter, a last expression ending in `;` runs without being shown: the
/// `plt.plot(...);` of every plotting tutorial gives the figure, not a `Line2D` repr.
#[tokio::test]
async fn a_trailing_semicolon_quiets_the_last_expression_as_in_jupyter() {
    let s = Server::start().await;
    let r = s
        .run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]);")
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["stdout"], "", "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{r}");
    assert!(results[0]["image/png"].is_string(), "{r}");
    assert!(
        results[0]
            .get("text/plain")
            .is_none_or(|t| !t.as_str().unwrap().contains("Line2D")),
        "{r}"
    );

    // Without it the value is shown.
    let r = s.run("x = 6 * 7\nx").await;
    assert_eq!(r["stdout"], "42\n", "{r}");
}

/// A figure too large to draw under the memory limit (as a stranger met it: 20 × 20 inches
/// of an image) is not dropped in silence: its bundle and stderr say it was not rendered.
#[tokio::test]
async fn a_figure_too_large_for_the_memory_limit_says_it_was_not_rendered() {
    let s = Server::start().await;
    let (status, r) = s
        .post(
            "/v1/execute",
            &json!({
                "code": "import matplotlib.pyplot as plt, numpy as np\n\
                         fig = plt.figure(figsize=(40, 40), dpi=100)\n\
                         plt.imshow(np.random.rand(1000, 1000, 3))\n\
                         plt.title('très grand')\nNone",
                "timeout_ms": 30000,
            }),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{r}");
    let plain = results[0]["text/plain"].as_str().unwrap();
    assert!(
        plain.starts_with("<Figure size 4000x4000 with 1 Axes>\n[figure not rendered: MemoryError"),
        "{r}"
    );
    assert!(results[0].get("image/png").is_none(), "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.contains(
            "snakecage: <Figure size 4000x4000 with 1 Axes> [figure not rendered: MemoryError"
        ),
        "{r}"
    );
}

/// A run that leaves 120 figures open (as a stranger met it: 200 of them ended the worker
/// out of memory, every result lost) draws the fifty it can keep, closes the rest undrawn,
/// and says so, within a memory limit that drawing them all would exceed.
#[tokio::test]
async fn figures_left_open_past_the_fifty_kept_are_not_drawn() {
    // Drawing fifty figures takes seconds, many more on a loaded machine: a time limit far
    // past that, so that the cap, never the limit, is what leaves the other seventy undrawn.
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", 160)
            .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", 600_000),
    )
    .await;
    let r = s
        .run_with(json!({
            "code": "import matplotlib.pyplot as plt\n\
                     plt.rcParams['figure.max_open_warning'] = 0\n\
                     for i in range(120):\n    plt.figure(); plt.plot([1, i])\n\
                     print('made 120')",
            "timeout_ms": 600_000,
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{}", r["stderr"]);
    assert_eq!(r["stdout"], "made 120\n");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 51, "{}", r["stderr"]);
    assert!(
        results[..50].iter().all(|b| b["image/png"].is_string()),
        "{}",
        r["stderr"]
    );
    assert_eq!(
        results[50],
        json!({"text/plain": "[70 more outputs omitted: a run keeps at most 50]"})
    );
    assert_eq!(r["stderr"], "");
}

/// Figures are drawn after the program ends only while the run's time limit allows: one
/// that would take a minute is cut short, and the run reports before its deadline with
/// its output, the figure drawn before it, and a note (on stderr too), where it used to
/// be killed at the deadline with no results at all.
#[tokio::test]
async fn drawing_figures_left_open_stops_short_of_the_time_limit() {
    let s = Server::start().await;
    let r = s
        .run_with(json!({
            "code": "import matplotlib.pyplot as plt, time\n\
                     plt.figure(); plt.plot([1, 2])\n\
                     plt.figure().savefig = lambda *args, **kwargs: time.sleep(60)\n\
                     print('made 2')",
            "timeout_ms": 10000,
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(r["stdout"], "made 2\n");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{r}");
    assert!(results[0]["image/png"].is_string(), "{r}");
    let note = "[1 figure left open not rendered: too close to the run's time limit]";
    assert_eq!(results[1], json!({ "text/plain": note }));
    assert_eq!(
        r["stderr"],
        format!("snakecage: rendering the figures left open was cut short: {note}\n")
    );
}

/// Rich outputs there is no memory left to report (the program used up its limit after
/// displaying 40 MB of them) are dropped for a note; the run keeps its output and exit
/// code, and its verdict says why. The worker used to abort ("memory allocation of … bytes
/// failed", SIGABRT) and the run ended `killed`.
#[tokio::test]
async fn results_there_is_no_memory_to_report_are_dropped_for_a_note() {
    let s = Server::start().await;
    let r = s
        .run_with(json!({
            "code": "class Big:\n\
                     \x20   def __repr__(self): return 'Big()'\n\
                     \x20   def _repr_html_(self): return '<p>' + 'x' * 1_000_000 + '</p>'\n\
                     for i in range(40):\n    display(Big())\n\
                     blocks = []\n\
                     try:\n    while True: blocks.append(bytearray(1 << 20))\n\
                     except MemoryError:\n    pass\n\
                     blocks.pop()\n\
                     print('filled')",
            "timeout_ms": 30000,
        }))
        .await;
    assert_eq!(r["verdict"], "memory_limit", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], format!("{}filled\n", "Big()\n".repeat(40)));
    let note =
        "[results dropped: out of memory (the run's memory limit) while reporting 40 outputs]";
    assert_eq!(r["results"], json!([{ "text/plain": note }]));
    assert_eq!(r["stderr"], format!("snakecage: {note}\n"));
}
