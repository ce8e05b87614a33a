//! Starts the real service for a test and talks to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub struct Server {
    child: Child,
    /// Started under a wrapper (`unshare … snakecage`): signals go to the wrapper's child.
    wrapped: bool,
    pub base: String,
    pub client: reqwest::Client,
    _state_dir: tempfile::TempDir,
    state_path: PathBuf,
    log: Arc<Mutex<StderrLog>>,
}

/// The service's stderr, read line by line as it comes (a pipe left unread would stop the
/// service at its next log line) by a thread and by [`Server::log`], each under the lock:
/// a line the service wrote before the test asks is in the log it gets (read by the
/// thread already, or by `log` from the pipe), however late the thread is scheduled.
struct StderrLog {
    pipe: std::process::ChildStderr,
    partial: Vec<u8>,
    lines: Vec<String>,
    /// Sent the address once the service says it listens.
    listening: Option<std::sync::mpsc::Sender<String>>,
    ended: bool,
}

impl StderrLog {
    fn new(pipe: std::process::ChildStderr, listening: std::sync::mpsc::Sender<String>) -> Self {
        nix::fcntl::fcntl(
            &pipe,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .expect("stderr pipe non-blocking");
        Self {
            pipe,
            partial: Vec::new(),
            lines: Vec::new(),
            listening: Some(listening),
            ended: false,
        }
    }

    /// Reads what the pipe holds now, without waiting.
    fn drain(&mut self) {
        use std::io::Read;
        let mut buf = [0u8; 16 << 10];
        while !self.ended {
            match self.pipe.read(&mut buf) {
                Ok(0) => self.ended = true,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["fields"]["message"] == "snakecage is listening"
                && let Some(tx) = self.listening.take()
            {
                let _ = tx.send(v["fields"]["addr"].as_str().unwrap_or_default().to_owned());
            }
            self.lines.push(line);
        }
        if self.ended && !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            self.lines.push(String::from_utf8_lossy(&rest).into_owned());
        }
    }

    /// The thread's part: waits for the pipe to have something, reads it, until it ends.
    fn follow(log: Arc<Mutex<Self>>) {
        use std::os::fd::AsFd;
        let pipe = log
            .lock()
            .unwrap()
            .pipe
            .as_fd()
            .try_clone_to_owned()
            .unwrap();
        loop {
            let mut fds = [nix::poll::PollFd::new(
                pipe.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16));
            let mut log = log.lock().unwrap();
            log.drain();
            if log.ended {
                return;
            }
        }
    }
}

/// How long a test server may take to listen, and then to have its first workers: a
/// bound for a start that failed, not a speed. On a loaded machine the zygotes' preloads
/// (numpy, pandas, matplotlib building its font cache in the fresh state dir) and the
/// workers, forked at background priority, take minutes rather than seconds.
const START_BOUND: Duration = Duration::from_secs(300);

/// Settings for one test server; the defaults keep it small.
pub struct Options {
    pub env: Vec<(String, String)>,
    /// Workspaces under the test's own state dir (hermetic: nothing is left in /dev/shm),
    /// unless a test wants the service's default location.
    pub workspaces_in_state_dir: bool,
    /// `--listen`.
    pub listen: String,
    /// More command-line arguments.
    pub args: Vec<String>,
    /// A command the service is started under (`unshare --pid --fork …`).
    pub wrapper: Vec<String>,
    /// Use this state directory instead of a fresh temporary one.
    pub state_dir: Option<PathBuf>,
    /// Return from `start` only once every tier has had a worker ready (`/ready` is 200
    /// as soon as one tier has), not as soon as one worker is idle.
    pub wait_for_every_tier: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            env: vec![("SNAKECAGE_POOL__SIZE".into(), "2".into())],
            workspaces_in_state_dir: true,
            listen: "127.0.0.1:0".into(),
            args: Vec::new(),
            wrapper: Vec::new(),
            state_dir: None,
            wait_for_every_tier: true,
        }
    }
}

impl Options {
    /// Keep the service's default workspace location.
    pub fn default_workspace_dir(mut self) -> Self {
        self.workspaces_in_state_dir = false;
        self
    }

    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = addr.into();
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn wrapper(mut self, command: &[impl AsRef<str>]) -> Self {
        self.wrapper = command.iter().map(|s| s.as_ref().to_owned()).collect();
        self
    }

    /// Return from `start` as soon as one worker is idle.
    pub fn first_worker_only(mut self) -> Self {
        self.wait_for_every_tier = false;
        self
    }

    pub fn state_dir(mut self, dir: &std::path::Path) -> Self {
        self.state_dir = Some(dir.to_path_buf());
        self
    }

    pub fn env(mut self, key: &str, value: impl ToString) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.to_string()));
        self
    }
}

/// A wrapper (for [`Options::wrapper`], or a `Command` of its own) that runs the service in
/// a mount namespace of its own, after `script` (`sh`) has changed the mounts there.
pub fn in_private_mounts(script: &str) -> Vec<String> {
    let then_exec = format!("{script} && exec \"$@\"");
    [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &then_exec,
        "sh",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs `cmd` (the service, perhaps under a wrapper), which must refuse to start: its exit
/// status and what it printed to stderr. It gets a fresh state and workspace directory and
/// one slot unless `cmd` sets those itself; one still running after `patience` is stopped
/// and fails the test.
pub fn refused_start(mut cmd: Command, patience: Duration) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let state = tempfile::tempdir().unwrap();
    let defaults = [
        ("SNAKECAGE_WORKER__STATE_DIR", state.path().as_os_str()),
        ("SNAKECAGE_WORKSPACE__DIR", state.path().as_os_str()),
        ("SNAKECAGE_POOL__SIZE", "1".as_ref()),
    ];
    for (key, value) in defaults {
        if !cmd.get_envs().any(|(k, _)| k == key) {
            cmd.env(key, value);
        }
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + patience;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = status.unwrap_or_else(|| panic!("started instead of refusing: {stderr}"));
    (status, stderr)
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Makes `dir/site`, a directory for `python.site_packages` holding a module per
/// `(name, source)`, and opens `dir`, it and the modules to the workers' unprivileged uid.
pub fn site_packages(dir: &std::path::Path, modules: &[(&str, &str)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let site = dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    for path in [dir, &site] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for (name, source) in modules {
        let file = site.join(format!("{name}.py"));
        std::fs::write(&file, source).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    site
}

impl Server {
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Self {
        let every_tier = options.wait_for_every_tier;
        let state_dir = tempfile::tempdir().expect("temp dir");
        // Workers run as an unprivileged uid: let them reach their workspace by its absolute
        // path (they still cannot list or read anything here but their own workspace).
        std::fs::set_permissions(
            state_dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod state dir");
        let state_path = options
            .state_dir
            .clone()
            .unwrap_or_else(|| state_dir.path().to_path_buf());
        let mut cmd = match options.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(env!("CARGO_BIN_EXE_snakecage"));
                cmd
            }
            None => Command::new(env!("CARGO_BIN_EXE_snakecage")),
        };
        cmd.args(["--listen", &options.listen, "--log-format", "json"])
            .args(&options.args)
            .arg("--venv")
            .arg(repo_root().join(".venv"))
            .env("SNAKECAGE_WORKER__STATE_DIR", &state_path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if options.workspaces_in_state_dir {
            cmd.env("SNAKECAGE_WORKSPACE__DIR", &state_path);
        }
        for (k, v) in &options.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start snakecage");
        let stderr = child.stderr.take().expect("stderr");
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(StderrLog::new(stderr, addr_tx)));
        std::thread::spawn({
            let log = log.clone();
            move || StderrLog::follow(log)
        });
        let listening = tokio::task::spawn_blocking(move || addr_rx.recv_timeout(START_BOUND))
            .await
            .unwrap();
        let Ok(addr) = listening else {
            // Not left running (with its zygotes) to load the machine further.
            let _ = child.kill();
            let _ = child.wait();
            let log = log.lock().unwrap().lines.join("\n");
            panic!("snakecage did not start; log:\n{log}");
        };
        let server = Self {
            wrapped: !options.wrapper.is_empty(),
            child,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            _state_dir: state_dir,
            state_path,
            log,
        };
        server.wait_for_idle(1).await;
        if every_tier {
            server.wait_for_every_tier().await;
        }
        server
    }

    /// Waits until every tier serves: its zygote is up, and it has had a worker ready if
    /// it keeps idle workers (until then its jobs run on another tier).
    pub async fn wait_for_every_tier(&self) {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let health = self.health().await;
            let tiers = health["pool"]["tiers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !tiers.is_empty() && tiers.iter().all(|t| t["state"] == "serving") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "some tier never had a worker: {health}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The supervisor's pid (as this process sees it). Under a wrapper that runs it as a
    /// child (`unshare --fork`, a shell that waits), the wrapper's child; under one that
    /// execs it (`unshare --mount … exec`, `taskset`), the wrapper's own pid, whose first
    /// child is a zygote.
    pub fn pid(&self) -> u32 {
        let id = self.child.id();
        if self.wrapped && !runs_the_service(id) {
            return children_of(id).first().copied().unwrap_or(id);
        }
        id
    }

    /// The service's state directory (workspaces live below it).
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_path
    }

    pub fn log(&self) -> String {
        let mut log = self.log.lock().unwrap();
        log.drain();
        log.lines.join("\n")
    }

    pub async fn health(&self) -> Value {
        self.client
            .get(format!("{}/health", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits until at least `n` idle workers are ready.
    pub async fn wait_for_idle(&self, n: u64) {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let health = self.health().await;
            if health["pool"]["idle"].as_u64().unwrap_or(0) >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pool never reached {n} idle workers: {health}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the pool `/health` reports satisfies `reached` (say, a request sent on
    /// another task holds its worker, or its place in the queue): what a test must know
    /// before it counts on that, however long a busy machine takes to get there.
    pub async fn wait_for_pool(&self, what: &str, reached: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + START_BOUND;
        loop {
            let health = self.health().await;
            if reached(&health["pool"]) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the pool never had {what}: {health}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// GET `path`: the status, the response headers and the body.
    pub async fn get(&self, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        if status >= 400 {
            check_error_body(status, &serde_json::from_str(&text).unwrap_or(Value::Null));
        }
        (status, headers, text)
    }

    /// GET `path` as JSON.
    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let (status, _, text) = self.get(path).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self.post_response(path, body).await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status >= 400 {
            check_error_body(status, &body);
        }
        (status, body)
    }

    /// POST `body` to `path`: the response, as it starts.
    pub async fn post_response(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// POST /v1/execute that must succeed at the HTTP level.
    pub async fn run(&self, code: &str) -> Value {
        self.run_with(json!({ "code": code })).await
    }

    pub async fn run_with(&self, body: Value) -> Value {
        let (status, body) = self.post("/v1/execute", &body).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Starts `POST /v1/execute` with `body` on its own task, for requests that must be in
    /// flight together; the task yields the response body, which must be a 200.
    pub fn spawn_execute(&self, body: Value) -> tokio::task::JoinHandle<Value> {
        let request = self
            .client
            .post(format!("{}/v1/execute", self.base))
            .json(&body);
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert_eq!(status, 200, "{body}");
            body
        })
    }

    /// POST /v1/sessions with defaults, which must create one; returns its id.
    pub async fn new_session(&self) -> String {
        let (status, r) = self.post("/v1/sessions", &json!({})).await;
        assert_eq!(status, 201, "{r}");
        r["session_id"].as_str().unwrap().to_owned()
    }

    /// Runs `code` in session `id`; the call must succeed at the HTTP level.
    pub async fn session_run(&self, id: &str, code: &str) -> Value {
        let (status, r) = self
            .post(
                &format!("/v1/sessions/{id}/execute"),
                &json!({ "code": code }),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        r
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    /// Sends SIGTERM, waits for the exit (SIGKILL after 30 s) and returns it with the log.
    pub fn stop_with_log(mut self) -> (std::process::ExitStatus, String) {
        let status = self.terminate();
        (status, self.log())
    }

    /// Stops the service, which must exit cleanly, and waits up to 60 s (a busy machine
    /// reaps slowly) for every process of `below` (its [`descendants_of`], taken while it
    /// ran) to be gone: none may be left behind.
    pub fn stop_leaving_no_process(self, below: Vec<u32>) {
        let status = self.stop();
        assert!(status.success(), "{status:?}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while below.iter().any(|&p| process_exists(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<u32> = below.into_iter().filter(|&p| process_exists(p)).collect();
        assert!(left.is_empty(), "processes left behind: {left:?}");
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

/// The table of error codes in README.md: `(code, status)` per row.
pub fn documented_error_codes() -> Vec<(String, u16)> {
    documented_error_rows()
        .into_iter()
        .map(|(code, status, _)| (code, status))
        .collect()
}

/// What README.md's table of error codes says `code` is answered for (its "when").
pub fn documented_error_meaning(code: &str) -> String {
    documented_error_rows()
        .into_iter()
        .find(|(c, _, _)| c == code)
        .map(|(_, _, when)| when)
        .unwrap_or_else(|| panic!("README.md's table of error codes has no {code}"))
}

/// `(code, status, when)` per row of README.md's table of error codes.
fn documented_error_rows() -> Vec<(String, u16, String)> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let table = readme
        .split("<!-- error-codes -->")
        .nth(1)
        .expect("README.md has an <!-- error-codes --> table");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let code = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let when = cells[3..].join("|");
            Some((code.to_owned(), cells.get(2)?.parse().ok()?, when))
        })
        .collect()
}

/// Every 4xx/5xx body of the API: a `detail` and a `code` from the README's table, listed
/// there with this status. Returns the code.
/// The variable names a `GET /v1/sessions/{id}` answer lists, in its order.
pub fn variable_names(detail: &Value) -> Vec<&str> {
    detail["variables"]
        .as_array()
        .unwrap_or_else(|| panic!("no variables: {detail}"))
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect()
}

pub fn check_error_body(status: u16, body: &Value) -> String {
    let code = body["code"]
        .as_str()
        .unwrap_or_else(|| panic!("a {status} without a code: {body}"));
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "a {status} without a detail: {body}"
    );
    let documented = documented_error_codes();
    assert!(
        documented.iter().any(|(c, s)| c == code && *s == status),
        "{code} with status {status} is not in README.md's table of error codes {documented:?}"
    );
    code.to_owned()
}

/// Every worker's workspace of every instance under `state_dir`: the directories in each
/// instance root's (`workspaces-<pid>`) `mount` directory, its own tmpfs.
pub fn workspaces_under(state_dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|root| {
            root.file_name()
                .to_string_lossy()
                .starts_with("workspaces-")
        })
        .filter_map(|root| std::fs::read_dir(root.path().join("mount")).ok())
        .flat_map(|workspaces| workspaces.flatten().map(|ws| ws.path()))
        .collect()
}

/// Whether process `pid` runs this build's `snakecage` (a wrapper exec'd it).
fn runs_the_service(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
    let ours = std::fs::canonicalize(env!("CARGO_BIN_EXE_snakecage"));
    matches!((exe, ours), (Ok(exe), Ok(ours)) if exe == ours)
}

/// Processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The fields after the command name (which may contain spaces) start after ')'.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            out.push(child);
        }
    }
    out
}

/// Every process below `pid`.
pub fn descendants_of(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for c in children_of(p) {
            all.push(c);
            frontier.push(c);
        }
    }
    all
}

/// Whether `pid` runs: a zombie does not. A zombie's other threads may still be exiting
/// (and holding its fds): for a worker that is dead and done with, see [`reaped`].
pub fn process_exists(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

/// Whether `pid` is gone altogether: dead, every thread of it, and reaped (for a worker,
/// by its zygote, which reports its exit to the service next). A worker with threads is a
/// zombie as soon as its main thread has exited, while its other threads may still hold
/// its job socket open: a job sent to it then is taken by the socket and lost.
pub fn reaped(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Asserts that `pid`'s peak resident memory grew by less than 20 MiB since it was
/// `base` (an earlier [`peak_rss`]): far less than the 50-100 MB a test pushed through it,
/// whatever the build's own footprint (a debug supervisor starts at ~40 MiB).
pub fn assert_peak_rss_grew_little(pid: u32, base: u64, what: &str) {
    let peak = peak_rss(pid);
    assert!(
        peak.saturating_sub(base) < 20 << 20,
        "{what}: supervisor peak RSS {} MiB, {} MiB at start",
        peak >> 20,
        base >> 20
    );
}

/// Peak resident memory of a process, in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Current resident memory of a process, in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Threads with small stacks (the memory limit would otherwise stop them first), started
/// until the kernel refuses one, and kept: the program prints how many it holds.
pub const THREAD_HOG: &str = "import threading
threading.stack_size(256 << 10)
stop = threading.Event()
held = []
try:
    while True:
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        held.append(t)
except RuntimeError as e:
    print(f'{e} after {len(held)}')";

/// Another tenant's ordinary program: a few threads, started and joined.
pub const TWENTY_THREADS: &str = "import threading
threading.stack_size(256 << 10)
done = []
ts = [threading.Thread(target=done.append, args=(i,)) for i in range(20)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(len(done), 'threads ran')";
