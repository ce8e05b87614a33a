//! What the in-process criterion benches share: a runtime, the default configuration with
//! the checkout's `.venv`, and the service on a loopback port until its stop sender drops.

use std::path::Path;

use snakecage::config::{Config, Overrides};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The defaults, with the checkout's `.venv`, state below `state_dir` and quiet logs.
pub fn config(state_dir: &Path) -> Config {
    let mut config = Config::load(None, &Overrides::default()).expect("config");
    config.python.venv = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    config.worker.state_dir = state_dir.to_path_buf();
    config.log.level = "warn".into();
    config
}

/// Serves `config` on a free loopback port; returns its base URL (`http://127.0.0.1:N`) and
/// the sender whose drop stops the service.
pub fn serve(rt: &Runtime, config: Config) -> (String, oneshot::Sender<()>) {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    rt.spawn(async move {
        snakecage::server::serve(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    (base, stop)
}
