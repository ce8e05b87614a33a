//! SIGHUP reloads like `POST /v1/admin/reload`: a request in flight when it arrives
//! completes, the service keeps serving, a changed configuration becomes a new generation,
//! and each outcome (rolled over, nothing changed, refused) is logged. A SIGHUP during
//! another reload is logged as refused, and that reload goes through. It never exits.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::harness::{Options, Server, site_packages};
use crate::reliability::eventually;
use crate::rollover::{allowed_packages, generation, reload, start, write_config};

fn hangup(s: &Server) {
    kill(Pid::from_raw(s.pid() as i32), Signal::SIGHUP).unwrap();
}

/// The log lines (JSON) whose message is `message`.
fn logged(s: &Server, message: &str) -> Vec<serde_json::Value> {
    s.log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["fields"]["message"] == message)
        .collect()
}

#[tokio::test]
async fn sighup_reloads_while_a_request_runs_and_the_service_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"], "");
    let s = start(&config, Options::default()).await;
    assert_eq!(generation(&s).await, 1);

    let running = s.spawn_execute(json!({
        "code": "import time\ntime.sleep(3)\nprint('fertig ✓')",
        "timeout_ms": 30000,
    }));
    eventually(20, "the request is running", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    write_config(&config, &["numpy", "openpyxl"], "");
    hangup(&s);

    let ran = running.await.unwrap();
    assert_eq!(ran["stdout"], "fertig ✓\n", "{ran}");
    assert_eq!(ran["exit_code"], 0, "{ran}");
    eventually(60, "the SIGHUP reload rolled over", async || {
        generation(&s).await == 2
    })
    .await;
    assert!(allowed_packages(&s).await.contains(&"openpyxl".to_owned()));
    let rolled = logged(
        &s,
        "reload asked by SIGHUP: rolled over to a new generation",
    );
    assert_eq!(rolled.len(), 1, "{}", s.log());
    assert_eq!(rolled[0]["fields"]["generation"], 2);
    assert_eq!(s.health().await["generation"]["reason"], "reload");

    // Nothing edited: logged as such, no new generation.
    hangup(&s);
    let message = "reload asked by SIGHUP: no new generation";
    eventually(20, "the second SIGHUP was handled", async || {
        !logged(&s, message).is_empty()
    })
    .await;
    let unchanged = &logged(&s, message)[0];
    assert!(
        unchanged["fields"]["detail"]
            .as_str()
            .unwrap()
            .starts_with("nothing changed: "),
        "{unchanged}"
    );
    assert_eq!(unchanged["fields"]["generation"], 2, "{unchanged}");

    // A key a reload cannot apply: refused with the reason, still serving generation 2.
    write_config(
        &config,
        &["numpy", "openpyxl"],
        "\n[sessions]\nmax_sessions = 3\n",
    );
    hangup(&s);
    let message =
        "reload asked by SIGHUP refused; the serving generation and the API keys stay as they were";
    eventually(20, "the third SIGHUP was handled", async || {
        !logged(&s, message).is_empty()
    })
    .await;
    let refused = logged(&s, message)[0]["fields"]["error"].to_string();
    assert!(refused.contains("sessions.max_sessions"), "{refused}");
    assert_eq!(generation(&s).await, 2);
    assert_eq!(s.run("print('noch da')").await["stdout"], "noch da\n");
    let status = s.stop();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_sighup_during_a_reload_in_progress_is_logged_and_that_reload_goes_through() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"], "");
    let s = start(&config, Options::default()).await;
    // A new tier whose preload takes a while: the reload holds the rollover slot meanwhile.
    let site = site_packages(
        dir.path(),
        &[("gemächlich", "import time\ntime.sleep(3)\n")],
    );
    let extra = format!(
        "\n[python]\nsite_packages = [{:?}]\n\n[[tiers.profile]]\nname = \"slow\"\npreload = [\"gemächlich\"]\n",
        site.display().to_string()
    );
    write_config(&config, &["numpy", "gemächlich"], &extra);
    let base = s.base.clone();
    let client = s.client.clone();
    let http = tokio::spawn(async move {
        let response = client
            .post(format!("{base}/v1/admin/reload"))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<serde_json::Value>().await.unwrap())
    });
    // Logged once the reload holds the slot.
    eventually(20, "the HTTP reload started", async || {
        !logged(&s, "reloading the configuration").is_empty()
    })
    .await;
    hangup(&s);
    let message =
        "reload asked by SIGHUP refused; the serving generation and the API keys stay as they were";
    eventually(20, "the SIGHUP was handled", async || {
        !logged(&s, message).is_empty()
    })
    .await;
    let refused = logged(&s, message)[0]["fields"]["error"].to_string();
    assert!(
        refused.contains("a rollover is already in progress (reload)"),
        "{refused}"
    );
    let (status, body) = http.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], true, "{body}");
    assert_eq!(generation(&s).await, 2);
    assert_eq!(s.run("print('weiter')").await["stdout"], "weiter\n");
    // Nothing is left to reload: the next one finds nothing changed.
    let (status, body) = reload(&s, None).await;
    assert_eq!((status, body["rolled_over"].as_bool()), (200, Some(false)));
    let status = s.stop();
    assert!(status.success(), "{status:?}");
}
