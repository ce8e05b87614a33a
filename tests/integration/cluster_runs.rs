//! Runs in a cluster: two replicas with replica ids and API keys (no load balancer, no
//! shared store: runs need neither). A run id names the replica running it; answering
//! one of its tool calls or cancelling it through another replica is forwarded to the
//! owner with the caller's key (another key still gets 404), and once the owner is gone
//! the answer is 410 `run_gone` naming it.

use serde_json::{Value, json};

use crate::auth::keys_add;
use crate::backing::free_port;
use crate::harness::{Options, Server, check_error_body};
use crate::streamed::Events;

const IDS: [&str; 2] = ["r0", "r1"];

async fn send(req: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status >= 400 {
        check_error_body(status, &body);
    }
    (status, headers, body)
}

/// The events of `events` up to the next one named `name`, and that one's data.
async fn until(events: &mut Events, name: &str) -> Value {
    while let Some((event, data)) = events.next().await {
        if event == name {
            return data;
        }
    }
    panic!("the stream ended before a {name} event");
}

#[tokio::test]
async fn run_calls_landing_on_another_replica_reach_the_owner_as_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let alice = keys_add(&keys, "alice", &[]);
    let bob = keys_add(&keys, "bob", &[]);
    let ports: Vec<u16> = IDS.iter().map(|_| free_port()).collect();
    let start = |i: usize| {
        let mut options = Options::default()
            .listen(&format!("127.0.0.1:{}", ports[i]))
            .env("SNAKECAGE_AUTH__KEYS_FILE", keys.display())
            .env("SNAKECAGE_CLUSTER__REPLICA_ID", IDS[i]);
        for (id, port) in IDS.iter().zip(&ports) {
            let key = format!("SNAKECAGE_CLUSTER__PEERS__{id}");
            options = options.env(&key, format!("http://127.0.0.1:{port}"));
        }
        Server::start_with(options)
    };
    let (owner, other) = tokio::join!(start(0), start(1));
    let http = reqwest::Client::new();
    let on = |s: &Server, path: &str| format!("{}{path}", s.base);

    // A run on r0 calls a tool its client declared; the answers go to r1.
    let code = "from snakecage import tools\n\
                print(tools.lookup(city='Zürich')['temp'])\n\
                print(tools.lookup(city='Genève')['temp'])";
    let tool = json!([{"name": "lookup", "description": "Die Temperatur einer Stadt",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let resp = http
        .post(on(&owner, "/v1/execute/stream"))
        .bearer_auth(&alice)
        .json(&json!({"code": code, "tools": tool, "timeout_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    assert!(run_id.starts_with("run_r0_"), "{run_id}");
    let mut events = Events::new(resp);
    for (city, temp) in [("Zürich", 21), ("Genève", 24)] {
        let call = until(&mut events, "tool_call").await;
        assert_eq!(call["arguments"]["city"], city, "{call}");
        let path = format!(
            "/v1/runs/{run_id}/tool_calls/{}",
            call["call_id"].as_str().unwrap()
        );
        let answer = json!({"result": {"temp": temp}});
        // Another key: unknown, across the forward too.
        let (status, _, body) =
            send(http.post(on(&other, &path)).bearer_auth(&bob).json(&answer)).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("not_found")),
            "{body}"
        );
        assert!(body["detail"].as_str().unwrap().contains(&run_id), "{body}");
        // No key at all: refused before anything is forwarded.
        let (status, _, _) = send(http.post(on(&other, &path)).json(&answer)).await;
        assert_eq!(status, 401);
        let (status, headers, body) = send(
            http.post(on(&other, &path))
                .bearer_auth(&alice)
                .json(&answer),
        )
        .await;
        assert_eq!(status, 204, "{body}");
        assert_eq!(headers["x-snakecage-served-by"], "r0");
        if city == "Zürich" {
            // Answered already (the run still waits on its next call, so it is there).
            let (status, _, body) = send(
                http.post(on(&other, &path))
                    .bearer_auth(&alice)
                    .json(&answer),
            )
            .await;
            assert_eq!(status, 409, "{body}");
        }
    }
    let result = until(&mut events, "result").await;
    assert_eq!(result["stdout"], "21\n24\n", "{result}");
    assert_eq!(result["verdict"], "ok", "{result}");

    // A run on r0 cancelled through r1: bob cannot, alice can.
    let resp = http
        .post(on(&owner, "/v1/execute/stream"))
        .bearer_auth(&alice)
        .json(&json!({"code": "import time\nprint('läuft', flush=True)\ntime.sleep(60)", "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    let long_run = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    let output = until(&mut events, "output").await;
    assert_eq!(output["data"], "läuft\n", "{output}");
    let path = format!("/v1/runs/{long_run}");
    let (status, _, body) = send(http.delete(on(&other, &path)).bearer_auth(&bob)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, headers, body) = send(http.delete(on(&other, &path)).bearer_auth(&alice)).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(headers["x-snakecage-served-by"], "r0");
    let result = until(&mut events, "result").await;
    assert_eq!(result["verdict"], "killed", "{result}");
    assert!(
        result["stderr"].as_str().unwrap().contains("cancelled"),
        "{result}"
    );

    // The owner dies: its run ids are 410 `run_gone` on the other replica, naming it.
    let dead_run = long_run.clone();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(owner.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(owner);
    for req in [
        http.delete(on(&other, &format!("/v1/runs/{dead_run}"))),
        http.post(on(
            &other,
            &format!("/v1/runs/{dead_run}/tool_calls/call_x"),
        ))
        .json(&json!({"result": 1})),
    ] {
        let (status, _, body) = send(req.bearer_auth(&alice)).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (410, Some("run_gone")),
            "{body}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("'r0'") && detail.contains(&dead_run),
            "{detail}"
        );
    }
    // An id that names no replica is looked up where it lands: unknown there.
    let (status, _, body) = send(
        http.delete(on(&other, "/v1/runs/run_ünbekannt"))
            .bearer_auth(&alice),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
}
