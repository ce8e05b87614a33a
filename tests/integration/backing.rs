//! The engines a cluster runs on, started for a test on loopback: SeaweedFS (a real
//! S3-compatible object store, `weed` from `.venv-cluster`) and HAProxy (round-robin with
//! health checks on `/ready`). `scripts/test` installs both.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;

use crate::harness::repo_root;

pub const ACCESS_KEY: &str = "snakecage-test";
pub const SECRET_KEY: &str = "snakecage-test-secret";
pub const BUCKET: &str = "snakecage";

/// The free space SeaweedFS's volume server keeps on its data directory's disk
/// (`-volume.minFreeSpace`): below it every volume turns read-only and no write succeeds.
/// Its default, 1 % of the filesystem's size measured against the space left to
/// unprivileged users, asks 2.5 GB of a 250 GB disk and 10 GB of a 1 TB one, however little
/// is stored; the tests store a few megabytes.
const MIN_FREE: &str = "512MiB";
const MIN_FREE_BYTES: u64 = 512 << 20;

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Seaweed {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
    /// `weed`'s arguments (its ports and data directory), to start it again as it was.
    args: Vec<String>,
}

impl Seaweed {
    /// Starts a one-node SeaweedFS (master, volume, filer, S3 gateway) on free loopback
    /// ports, with one identity for the tests, and creates the bucket. A `weed` that exits
    /// while starting (one of its nine ports taken by another process between `free_port`
    /// and its bind) is started again on fresh ports, up to three times.
    pub async fn start() -> Self {
        let mut exits = Vec::new();
        for _ in 0..3 {
            let mut seaweed = Self::spawn();
            match seaweed.create_bucket().await {
                Ok(()) => return seaweed,
                Err(log) => exits.push(log),
            }
        }
        panic!(
            "SeaweedFS exited while starting, three times:\n{}",
            exits.join("\n---\n")
        );
    }

    fn spawn() -> Self {
        let weed = repo_root().join(".venv-cluster/bin/weed");
        assert!(
            weed.exists(),
            "{} is missing: run scripts/test (or `source scripts/env.sh; ensure_cluster_venv`)",
            weed.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let free = free_bytes(&data);
        assert!(
            free >= MIN_FREE_BYTES,
            "SeaweedFS needs {MIN_FREE} free on the disk of {} (below that it makes every \
             volume read-only); {} MiB are free to unprivileged users",
            data.display(),
            free >> 20
        );
        let iam = dir.path().join("s3.json");
        let identities = serde_json::json!({"identities": [{
            "name": "snakecage",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        std::fs::write(&iam, identities.to_string()).unwrap();
        let s3 = free_port();
        let port = |name: &str| format!("-{name}={}", free_port());
        let mut args = vec![
            "server".to_owned(),
            format!("-dir={}", data.display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            port("master.port"),
            port("master.port.grpc"),
            port("volume.port"),
            port("volume.port.grpc"),
            "-filer".into(),
            port("filer.port"),
            port("filer.port.grpc"),
            "-s3".into(),
            format!("-s3.port={s3}"),
            port("s3.port.grpc"),
        ];
        args.extend(["-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0"].map(String::from));
        args.push(format!("-s3.config={}", iam.display()));
        args.extend(["-master.volumeSizeLimitMB=64", "-volume.max=16"].map(String::from));
        args.push(format!("-volume.minFreeSpace={MIN_FREE}"));
        Self {
            child: run_weed(&weed, &args, dir.path()),
            endpoint: format!("http://127.0.0.1:{s3}"),
            _dir: dir,
            args,
        }
    }

    /// Starts the store again after [`Self::kill`], on the same ports with the same data
    /// (the end of an outage), and waits until it serves.
    pub async fn restart(&mut self) {
        self.kill();
        let weed = repo_root().join(".venv-cluster/bin/weed");
        self.child = run_weed(&weed, &self.args, self._dir.path());
        if let Err(log) = self.create_bucket().await {
            panic!("SeaweedFS exited on restarting:\n{log}");
        }
    }

    /// Writes one object until it works (the S3 gateway creates the bucket on an admin's
    /// first upload), then removes it: the store is up and the bucket exists. `Err` with
    /// its log if `weed` exited meanwhile; a `weed` still running but not serving within
    /// 180 s (starting its four servers takes seconds on a busy machine) fails the test.
    async fn create_bucket(&mut self) -> Result<(), String> {
        let store = Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(&self.endpoint)
                .with_bucket_name(BUCKET)
                .with_region("us-east-1")
                .with_access_key_id(ACCESS_KEY)
                .with_secret_access_key(SECRET_KEY)
                .with_allow_http(true)
                .with_virtual_hosted_style_request(false)
                .build()
                .unwrap(),
        );
        let key = object_store::path::Path::from("bootstrap");
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            match store.put(&key, b"x".to_vec().into()).await {
                Ok(_) => break,
                Err(e) => {
                    if let Some(status) = self.child.try_wait().unwrap() {
                        return Err(format!("weed {status}:\n{}", self.log()));
                    }
                    assert!(
                        Instant::now() < deadline,
                        "SeaweedFS did not come up: {e}\n{}",
                        self.log()
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        store.delete(&key).await.unwrap();
        Ok(())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("weed.log")).unwrap_or_default()
    }

    /// The environment that points a snakecage server at this store, under `prefix`.
    pub fn env(&self, prefix: &str) -> Vec<(String, String)> {
        [
            ("SNAKECAGE_FILES__BACKEND", "s3"),
            ("SNAKECAGE_S3__BUCKET", BUCKET),
            ("SNAKECAGE_S3__PREFIX", prefix),
            ("SNAKECAGE_S3__ENDPOINT", &self.endpoint),
            ("SNAKECAGE_S3__PATH_STYLE", "true"),
            ("SNAKECAGE_S3__ALLOW_HTTP", "true"),
            ("SNAKECAGE_S3__MAX_RETRIES", "0"),
            ("SNAKECAGE_S3__CONNECT_TIMEOUT_MS", "500"),
            ("SNAKECAGE_S3__REQUEST_TIMEOUT_MS", "20000"),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Stops the store (SIGKILL): what an outage looks like to the service.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes free to unprivileged users on the filesystem of `path`, as SeaweedFS counts them.
fn free_bytes(path: &std::path::Path) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    stat.blocks_available() * stat.fragment_size()
}

/// `weed ARGS`, logging to `dir/weed.log` (appended to across restarts).
fn run_weed(weed: &std::path::Path, args: &[String], dir: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("weed.log"))
        .unwrap();
    Command::new(weed)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start weed")
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Haproxy {
    child: Child,
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// HAProxy round-robin over `backends` (host:port), each checked on `GET /ready` every
    /// 200 ms: two failures take it out, two successes put it back.
    pub fn start(backends: &[String]) -> Self {
        let bin = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("haproxy (Debian package haproxy; scripts/test installs it)");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "global\n    maxconn 4096\n\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    \
             timeout server 60s\n    option http-server-close\n    retry-on conn-failure\n    \
             retries 2\n    option redispatch\n\n\
             frontend api\n    bind 127.0.0.1:{port}\n    default_backend replicas\n\n\
             backend replicas\n    balance roundrobin\n    option httpchk GET /ready\n    \
             http-check expect status 200\n    \
             default-server inter 200ms fall 2 rise 2\n"
        );
        for (i, backend) in backends.iter().enumerate() {
            config.push_str(&format!("    server r{i} {backend} check\n"));
        }
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config).unwrap();
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("haproxy.log")).unwrap())
            .spawn()
            .expect("start haproxy");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("haproxy.log")).unwrap_or_default()
    }

    /// Waits until `GET /ready` through it answers 200, then until every backend's checks
    /// have passed (two at 200 ms each).
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{}/ready", self.base))
            .await
            .map(|r| r.status().as_u16())
            .ok()
            != Some(200)
        {
            assert!(
                Instant::now() < deadline,
                "haproxy never ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
