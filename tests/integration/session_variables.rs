//! A session's variable listing (`GET /v1/sessions/{id}`, and the `session` line of each
//! run's response): shapes, bounds, and values that would run code if looked at.

use serde_json::json;

use crate::harness::Server;
use crate::sessions::{create, get, run};

#[tokio::test]
async fn variables_show_shapes_never_whole_values() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(
        &s,
        &id,
        "import numpy as np, pandas as pd\narr = np.zeros((300, 4))\ndf = pd.DataFrame({'a': range(5000)})\ntext = 'z' * 100000",
    )
    .await;
    let (_, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    let vars = info["variables"].as_array().unwrap();
    let find = |n: &str| vars.iter().find(|v| v["name"] == n).unwrap().clone();
    assert_eq!(find("arr")["shape"], json!([300, 4]));
    assert_eq!(find("arr")["type"], "ndarray");
    assert_eq!(find("df")["shape"], json!([5000, 1]));
    assert_eq!(find("df")["type"], "DataFrame");
    assert!(find("text")["repr"].as_str().unwrap().chars().count() <= 100);
}

#[tokio::test]
async fn a_global_whose_name_or_class_would_run_code_is_listed_without_running_it() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    // A name whose `startswith` raises, and a value whose `__class__` property sleeps (once
    // read by the listing's isinstance checks: before, the listing raised and the worker
    // died, or every listing waited for it).
    let code = "import time\nclass Nom(str):\n    def startswith(self, *a):\n        raise SystemExit('non')\nglobals()[Nom('nommé')] = 1\nclass Piège:\n    vus = 0\n    @property\n    def __class__(self):\n        Piège.vus += 1\n        time.sleep(30)\n        return int\npiège = Piège()";
    let r = run(&s, &id, code).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(
        r["session"]["names"],
        json!(["time", "Nom", "nommé", "Piège", "piège"]),
        "{r}"
    );
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    let vars = info["variables"].as_array().unwrap();
    let find = |n: &str| vars.iter().find(|v| v["name"] == n).unwrap().clone();
    assert_eq!(
        find("nommé"),
        json!({"name": "nommé", "type": "int", "repr": "1"})
    );
    assert_eq!(
        find("piège"),
        json!({"name": "piège", "type": "Piège", "repr": "<__main__.Piège object>"})
    );
    let r = run(&s, &id, "print(nommé + 1, Piège.vus)").await;
    assert_eq!(r["stdout"], "2 0\n", "{r}");
}

#[tokio::test]
async fn every_global_is_counted_though_only_the_first_500_are_listed() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let r = run(
        &s,
        &id,
        "g = globals()\nfor i in range(1200):\n    g[f'v{i}é'] = i",
    )
    .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["session"]["variables"], 1202, "{r}");
    assert_eq!(r["session"]["names"].as_array().unwrap().len(), 500, "{r}");
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["variables_total"], 1202, "{info}");
    assert_eq!(info["variables"].as_array().unwrap().len(), 500, "{info}");
}

/// A metaclass whose `__name__` is not a `str`, a 5 MB class name, 150 globals with 1 MB
/// names, and a subclass named `int` whose `__repr__` counts and prints.
const HOSTILE: &str = "\
class Meta(type):
    @property
    def __name__(cls):
        return 12345
class Odd(metaclass=Meta):
    pass
odd = Odd()
Huge = type('H' * 5_000_000, (), {})
huge = Huge()
for i in range(150):
    globals()[f'{i:03}' + 'n' * 1_000_000] = i
class int(int):
    def __repr__(self):
        global calls
        calls = calls + 1
        print('user __repr__ ran during a listing', flush=True)
        return 'user repr'
calls = 0
n = int(5)
";

#[tokio::test]
async fn hostile_names_and_types_leave_the_session_alive_and_its_listing_bounded() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    // Before: the worker died right after this run succeeded (exit 71, the state lost);
    // without it, each later response carried 150 MB of names.
    let r = run(&s, &id, HOSTILE).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert!(r["notice"].is_null(), "{r}");
    assert!(
        r.to_string().len() < 100_000,
        "{} bytes",
        r.to_string().len()
    );
    let names = r["session"]["names"].as_array().unwrap();
    assert!(
        names
            .iter()
            .all(|n| n.as_str().unwrap().chars().count() <= 100),
        "{r}"
    );
    let r = run(&s, &id, "print('calls =', calls, odd is not None)").await;
    assert_eq!(r["stdout"], "calls = 0 True\n", "{r}");
    assert!(
        r.to_string().len() < 100_000,
        "{} bytes",
        r.to_string().len()
    );
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    let text = info.to_string();
    assert!(text.len() < 100_000, "{} bytes", text.len());
    assert!(!text.contains("user repr"), "{info}");
    let vars = info["variables"].as_array().unwrap();
    let find = |n: &str| vars.iter().find(|v| v["name"] == n).unwrap().clone();
    assert_eq!(find("odd")["type"], "Odd", "{info}");
    assert_eq!(
        find("huge")["type"],
        format!("{}…", "H".repeat(99)),
        "{info}"
    );
    assert_eq!(
        find("n"),
        json!({"name": "n", "type": "int", "repr": "<__main__.int object>"})
    );
    assert_eq!(info["variables_total"], 150 + 9, "{info}");
    let r = run(&s, &id, "print('calls =', calls)").await;
    assert_eq!(r["stdout"], "calls = 0\n", "{r}");
}

#[tokio::test]
async fn a_listing_the_job_broke_says_so_and_the_session_lives() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    // The job replaces the runner's listing in its own process: it raises, then answers
    // entries that are not descriptions. Before: the worker exited with status 71.
    let broken = "import sys\nlisting = sys.modules['_snakecage_variables']\nlisting.variables = lambda namespace: 1 / 0\nx = 1";
    let r = run(&s, &id, broken).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert!(r["notice"].is_null(), "{r}");
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(
        info["variables"],
        json!([{"name": "?", "type": "?", "repr": "<variables not listed: ZeroDivisionError>"}]),
        "{info}"
    );
    let garbled = "listing.variables = lambda namespace: ([object(), {'name': 5}, {'name': 'y' * 10**6, 'type': 't', 'repr': 'r'}], 3)";
    let r = run(&s, &id, garbled).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    let unknown = json!({"name": "?", "type": "?", "repr": "<not described: the listing gave an unreadable entry>"});
    assert_eq!(info["variables"][0], unknown, "{info}");
    assert_eq!(info["variables"][1], unknown, "{info}");
    assert_eq!(
        info["variables"][2]["name"],
        format!("{}…", "y".repeat(99)),
        "{info}"
    );
    let r = run(&s, &id, "print(x + 1)").await;
    assert_eq!(r["stdout"], "2\n", "{r}");
}
