//! Which isolation layers protect the workers here, decided once at zygote start-up:
//! the namespaces are entered, the seccomp policy is compiled, and a throwaway probe child
//! applies every per-worker layer and checks that a denial really happens (a socket is
//! refused, a file outside the rules cannot be opened). Workers then apply exactly the
//! layers the probe proved; a layer that fails in a worker stops that worker from ever
//! becoming ready.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::unistd::Pid;
use snakecage_worker::protocol::{
    CgroupPlan, Layer, LayerReport, LayerState, SandboxConfig, ZygoteConfig,
};

use super::{cgroup, landlock, namespaces, privileges, seccomp};

/// The layers each worker applies itself, in this order (DESIGN.md steps 4–6).
const WORKER_LAYERS: [Layer; 4] = [
    Layer::DropPrivileges,
    Layer::NoNewPrivs,
    Layer::Landlock,
    Layer::Seccomp,
];

pub struct Sandbox {
    config: SandboxConfig,
    /// Opened here, once: every worker inherits the descriptors.
    read_only: landlock::ReadOnlyRules,
    /// The cgroup's files every worker writes to join it, opened here, once.
    cgroup: cgroup::JoinFiles,
    /// The descriptors of both, sorted: what a worker keeps until its layers are on.
    inherited: Vec<RawFd>,
    seccomp: Option<seccomp::Filters>,
    /// Worker layers proven by the probe.
    apply: BTreeSet<Layer>,
    pub reports: Vec<LayerReport>,
}

fn report(layer: Layer, state: LayerState, detail: impl Into<String>) -> LayerReport {
    LayerReport {
        layer,
        state,
        detail: detail.into(),
    }
}

fn off(layer: Layer) -> LayerReport {
    report(layer, LayerState::Off, "switched off by sandbox.layers_off")
}

impl Sandbox {
    /// Once, in the zygote, while it is single-threaded and before CPython starts (so the
    /// interpreter opens its prefix through the final mount table).
    pub fn setup(config: &ZygoteConfig, python_home: &Path) -> Self {
        let sc = &config.sandbox;
        let root = privileges::running_as_root();
        let mut reports = Vec::new();

        reports.push(if !sc.wants(Layer::NetworkNamespace) {
            off(Layer::NetworkNamespace)
        } else {
            match namespaces::unshare_network().and_then(|()| only_loopback()) {
                Ok(()) => report(
                    Layer::NetworkNamespace,
                    LayerState::Active,
                    "empty: no interface but a loopback that is down",
                ),
                Err(e) => report(
                    Layer::NetworkNamespace,
                    LayerState::Unavailable,
                    e.to_string(),
                ),
            }
        });

        let mut needed = vec![python_home.to_path_buf()];
        needed.extend(config.site_packages.iter().cloned());
        reports.push(if !sc.wants(Layer::MountNamespace) {
            off(Layer::MountNamespace)
        } else if !root {
            report(
                Layer::MountNamespace,
                LayerState::Unavailable,
                "needs root (workers keep this process's uid anyway)",
            )
        } else {
            match namespaces::private_mounts(&needed) {
                Ok(detail) => report(Layer::MountNamespace, LayerState::Active, detail),
                Err(e) => report(
                    Layer::MountNamespace,
                    LayerState::Unavailable,
                    e.to_string(),
                ),
            }
        });

        let limits = &config.limits;
        let cpu = match limits.cpu_life_seconds {
            Some(life) => format!("{} s a job, {life} s a session's life", limits.cpu_seconds),
            None => format!("{} s", limits.cpu_seconds),
        };
        let rlimits = format!(
            "CPU {cpu}, DATA zygote + {} MiB, FSIZE {} MiB, NOFILE {}, NPROC {} (per worker uid), CORE 0",
            limits.memory_limit_bytes >> 20,
            limits.max_file_bytes >> 20,
            limits.max_open_files,
            limits.max_processes,
        );
        reports.push(if sc.wants(Layer::Rlimits) {
            report(Layer::Rlimits, LayerState::Active, rlimits)
        } else {
            off(Layer::Rlimits)
        });

        // Made by the supervisor, which knows whether it could; every worker joins it.
        reports.push(if !sc.wants(Layer::Cgroup) {
            off(Layer::Cgroup)
        } else {
            match &sc.cgroup {
                CgroupPlan::Join { detail, .. } => {
                    report(Layer::Cgroup, LayerState::Active, detail.clone())
                }
                CgroupPlan::Unavailable(why) => {
                    report(Layer::Cgroup, LayerState::Unavailable, why.clone())
                }
            }
        });

        // Through the final mount table (the private mounts above), before CPython starts.
        let read_only = landlock::ReadOnlyRules::open(&landlock::read_only_paths(
            python_home,
            &config.site_packages,
            std::slice::from_ref(&config.mpl_config_dir),
        ));
        let cgroup = match (&sc.cgroup, sc.wants(Layer::Cgroup)) {
            (CgroupPlan::Join { procs, .. }, true) => cgroup::JoinFiles::open(procs),
            _ => cgroup::JoinFiles::default(),
        };
        let mut inherited = read_only.fds();
        inherited.extend(cgroup.fds());
        inherited.sort_unstable();
        let mut sandbox = Self {
            config: sc.clone(),
            read_only,
            inherited,
            cgroup,
            seccomp: None,
            apply: BTreeSet::new(),
            reports,
        };

        // Decide what the probe should try.
        let mut unavailable: Vec<LayerReport> = Vec::new();
        let mut try_layers = BTreeSet::new();
        for layer in WORKER_LAYERS {
            if !sc.wants(layer) {
                unavailable.push(off(layer));
                continue;
            }
            let blocked = match layer {
                Layer::DropPrivileges if !root => Some(format!(
                    "not running as root: workers keep uid {}",
                    nix::unistd::getuid()
                )),
                Layer::Landlock => landlock::kernel_abi().err(),
                Layer::Seccomp => match seccomp::Filters::compile() {
                    Ok(filters) => {
                        sandbox.seccomp = Some(filters);
                        None
                    }
                    Err(e) => Some(e),
                },
                _ => None,
            };
            match blocked {
                Some(reason) => unavailable.push(report(layer, LayerState::Unavailable, reason)),
                None => {
                    try_layers.insert(layer);
                }
            }
        }
        let probed = sandbox.probe(&try_layers, &config.mpl_config_dir);
        for layer in WORKER_LAYERS {
            if let Some(r) = unavailable.iter().find(|r| r.layer == layer) {
                sandbox.reports.push(r.clone());
                continue;
            }
            let r = match probed.iter().find(|(l, _)| *l == layer) {
                Some((_, Ok(detail))) => {
                    sandbox.apply.insert(layer);
                    report(layer, LayerState::Active, detail.clone())
                }
                Some((_, Err(e))) => report(layer, LayerState::Unavailable, e.clone()),
                None => report(
                    layer,
                    LayerState::Unavailable,
                    "the probe did not report it",
                ),
            };
            sandbox.reports.push(r);
        }
        sandbox
    }

    /// Steps 4–6 in a worker: drop privileges (then re-arm PDEATHSIG, which a credential
    /// change clears), no_new_privs, Landlock, seccomp last (it would deny the setup
    /// calls before it). Fails on the first layer that does not apply.
    /// `uid`: the worker's own, which no other live worker has.
    pub fn harden_worker(
        &self,
        workspace: BorrowedFd<'_>,
        zygote: Pid,
        uid: u32,
    ) -> Result<(), (&'static str, io::Error)> {
        for layer in WORKER_LAYERS {
            if !self.apply.contains(&layer) {
                continue;
            }
            self.apply_layer(layer, workspace, uid)
                .map_err(|e| (layer.as_str(), io::Error::other(e)))?;
            if layer == Layer::DropPrivileges {
                super::die_with_parent(Some(zygote)).map_err(|e| ("PR_SET_PDEATHSIG again", e))?;
            }
        }
        // The zygote's descriptors the layers needed go before any code of a job runs.
        super::fds::close_inherited().map_err(|e| ("closing the zygote's descriptors", e))
    }

    /// In the zygote, once it has preloaded and before its first fork: installs the bulk
    /// of the seccomp policy, which every worker inherits. If that fails, workers get no
    /// seccomp layer at all and it is reported unavailable (a `require`d layer then stops
    /// start-up).
    pub fn seal_zygote(&mut self) {
        if !self.apply.contains(&Layer::Seccomp) {
            return;
        }
        let Some(filters) = &self.seccomp else { return };
        if let Err(e) = filters.install_zygote_part() {
            self.apply.remove(&Layer::Seccomp);
            if let Some(r) = self.reports.iter_mut().find(|r| r.layer == Layer::Seccomp) {
                *r = report(
                    Layer::Seccomp,
                    LayerState::Unavailable,
                    format!("installing the zygote's part: {e}"),
                );
            }
        }
    }

    /// The descriptors a worker keeps from its zygote until its layers are on (the
    /// Landlock rules' paths, the cgroup's files): `fds::arrange` leaves them open, and
    /// `harden_worker` closes them, whether or not a layer used them.
    pub fn inherited_fds(&self) -> &[RawFd] {
        &self.inherited
    }

    /// Step 2 in a worker: into the instance's cgroup, where the layer is active.
    pub fn join_cgroup(&self) -> io::Result<()> {
        match (&self.config.cgroup, self.config.wants(Layer::Cgroup)) {
            (CgroupPlan::Join { .. }, true) => cgroup::join(&self.cgroup),
            _ => Ok(()),
        }
    }

    /// Whether workers set their resource limits (step 3).
    pub fn applies_rlimits(&self) -> bool {
        self.config.wants(Layer::Rlimits)
    }

    fn apply_layer(
        &self,
        layer: Layer,
        workspace: BorrowedFd<'_>,
        uid: u32,
    ) -> Result<String, String> {
        let text = |e: io::Error| e.to_string();
        match layer {
            Layer::DropPrivileges => privileges::drop_to(uid, self.config.gid)
                .map(|()| {
                    format!(
                        "a uid of its own for each worker (the probe's: {uid}), gid {}, no groups",
                        self.config.gid
                    )
                })
                .map_err(text),
            Layer::NoNewPrivs => privileges::no_new_privs()
                .map(|()| "no_new_privs, not dumpable".to_owned())
                .map_err(text),
            Layer::Landlock => landlock::restrict(&self.read_only, workspace),
            // The zygote's part is already in place (inherited, or installed first by the
            // probe child); a worker adds its own small part.
            Layer::Seccomp => match &self.seccomp {
                Some(filters) => filters
                    .install_worker_part()
                    .map(|()| {
                        format!(
                            "deny list: {} BPF instructions installed once in the zygote and inherited, {} per worker",
                            filters.zygote_instructions(),
                            filters.worker_instructions()
                        )
                    })
                    .map_err(text),
                None => Err("no compiled policy".into()),
            },
            other => Err(format!("{} is not a worker layer", other.as_str())),
        }
    }

    /// Forks a child (no CPython yet, one thread) that applies `layers` and then tries
    /// what they must stop. Returns each layer's outcome.
    fn probe(
        &self,
        layers: &BTreeSet<Layer>,
        scratch: &Path,
    ) -> Vec<(Layer, Result<String, String>)> {
        if layers.is_empty() {
            return Vec::new();
        }
        let fail_all = |e: String| layers.iter().map(|l| (*l, Err(e.clone()))).collect();
        let workspace = match std::fs::File::open(scratch) {
            Ok(dir) => OwnedFd::from(dir),
            Err(e) => return fail_all(format!("probe: opening {}: {e}", scratch.display())),
        };
        let (read_end, write_end) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(pair) => pair,
            Err(e) => return fail_all(format!("probe: pipe: {e}")),
        };
        // SAFETY: the zygote is single-threaded here (CPython has not started), so the child
        // may run arbitrary code; it only applies the layers, writes to the pipe and _exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return fail_all(format!("probe: fork: {}", io::Error::last_os_error()));
        }
        if pid == 0 {
            drop(read_end);
            let lines = self.probe_child(layers, workspace.as_fd());
            let mut out = std::fs::File::from(write_end);
            let _ = out.write_all(lines.as_bytes());
            // SAFETY: ends the probe child at once, without running the zygote's destructors.
            unsafe { libc::_exit(0) };
        }
        drop(write_end);
        let mut text = String::new();
        let _ = std::fs::File::from(read_end).read_to_string(&mut text);
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
        layers
            .iter()
            .map(|&layer| {
                let line = text
                    .lines()
                    .find_map(|l| l.strip_prefix(layer.as_str())?.strip_prefix('\t'));
                let outcome = match line.and_then(|l| l.split_once('\t')) {
                    Some(("ok", detail)) => Ok(detail.to_owned()),
                    Some((_, detail)) => Err(detail.to_owned()),
                    None => Err("the probe child died before reporting".to_owned()),
                };
                (layer, outcome)
            })
            .collect()
    }

    fn probe_child(&self, layers: &BTreeSet<Layer>, workspace: BorrowedFd<'_>) -> String {
        let mut results: Vec<(Layer, Result<String, String>)> = Vec::new();
        // A worker inherits the zygote's part of the seccomp policy before it hardens
        // itself: install it first here too, so the probe proves the same sequence.
        let zygote_part = match (&self.seccomp, layers.contains(&Layer::Seccomp)) {
            (Some(filters), true) => filters
                .install_zygote_part()
                .map_err(|e| format!("installing the zygote's part: {e}")),
            _ => Ok(()),
        };
        for &layer in layers {
            let result = match (&zygote_part, layer) {
                (Err(e), Layer::Seccomp) => Err(e.clone()),
                _ => self.apply_layer(layer, workspace, self.config.uid),
            };
            results.push((layer, result));
        }
        // Check that each layer that applied really denies.
        for (layer, result) in &mut results {
            let Ok(detail) = result else { continue };
            let verdict = match layer {
                Layer::DropPrivileges => (nix::unistd::getuid().as_raw() == self.config.uid)
                    .then_some(())
                    .ok_or_else(|| "still root after the drop".to_owned()),
                Layer::Landlock => match std::fs::File::open("/etc/passwd") {
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Ok(_) => Err("not enforced: /etc/passwd stayed readable".to_owned()),
                    Err(e) => Err(format!("unexpected: {e}")),
                },
                Layer::Seccomp => probe_fork_denied().and_then(|()| {
                    // SAFETY: socket() takes plain integers; a returned fd is closed below.
                    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                    let errno = io::Error::last_os_error().raw_os_error();
                    if fd >= 0 {
                        // SAFETY: we own the fd just returned.
                        drop(unsafe { OwnedFd::from_raw_fd(fd) });
                        Err("not enforced: socket() succeeded".to_owned())
                    } else if errno == Some(libc::EPERM) {
                        Ok(())
                    } else {
                        Err(format!("unexpected socket() error {errno:?}"))
                    }
                }),
                _ => Ok(()),
            };
            if let Err(e) = verdict {
                *result = Err(format!("{detail}; {e}"));
            }
        }
        results
            .into_iter()
            .map(|(layer, result)| match result {
                Ok(detail) => format!("{}\tok\t{}\n", layer.as_str(), one_line(&detail)),
                Err(e) => format!("{}\terr\t{}\n", layer.as_str(), one_line(&e)),
            })
            .collect()
    }
}

/// The per-worker part: a fork must fail with EPERM. Should it succeed, the new process
/// exits at once and the layer is reported as not enforced.
fn probe_fork_denied() -> Result<(), String> {
    // SAFETY: the probe child is single-threaded (CPython has not started); a forked
    // process _exits immediately.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: ends the unexpected grandchild at once.
        unsafe { libc::_exit(0) };
    }
    if pid > 0 {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
        return Err("not enforced: fork() succeeded".to_owned());
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EPERM) => Ok(()),
        errno => Err(format!("unexpected fork() error {errno:?}")),
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\t'], " ")
}

/// In a fresh network namespace only `lo` exists (and it is down).
fn only_loopback() -> io::Result<()> {
    let names: Vec<String> = nix::net::if_::if_nameindex()?
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .collect();
    if names.iter().any(|n| n != "lo") {
        return Err(io::Error::other(format!("interfaces present: {names:?}")));
    }
    Ok(())
}
