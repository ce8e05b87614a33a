//! Worker uids: every worker runs under a uid of its own, so what the kernel counts per
//! uid (RLIMIT_NPROC: processes and threads) bounds one worker, never another tenant's.
//!
//! The instance claims a range of ids at start ([`UidRange::claim`]): a write lock on the
//! range's bytes of one host-wide file ([`LOCK_FILE`]), held for the process's life and
//! released by the kernel however it dies, so two instances on a host never share a
//! worker uid. An unset `sandbox.uid` takes the first free block of [`AUTO_FIRST`] to
//! [`AUTO_LAST`] that this process's user namespace maps (a user-namespaced pod maps only
//! 0–65535) and that holds no id the system names ([`super::uid_accounts`]: the search
//! moves on past one); a configured one is taken as it is, or start-up fails naming the
//! holder, or the accounts it holds. A block is also never taken while a process runs
//! under one of its ids ([`Occupant`]): the lock dies with an instance that is killed, but
//! its workers and their zombies outlive it for a while (they die with their zygote, and
//! whoever inherits them reaps them: PID 1 of this host took about 1.4 s), and until they
//! are gone they count against each id's RLIMIT_NPROC and own what it owns. The search
//! passes such a block over; a configured range waits for it ([`UidRange::vacated`]).
//!
//! [`WorkerUids`] hands the ids out, one per worker ([`UidLease`]), first freed first
//! reused; the range's first id is kept for the zygotes' start-up probe of the uid drop. A lease is shared by whatever must be gone before the id may serve again: the
//! zygote's route for the worker's exit (dropped once the zygote has reaped it: no
//! process or thread of it remains) and its workspace (dropped once the directory is
//! removed: nothing it wrote remains). When the zygote dies before reporting an exit, the
//! leases it held wait until no process of their uid is left ([`release_when_gone`]).
//! Taking and returning an id is a short mutex section: no allocation, no system call.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use super::uid_accounts::{self, Account, Lookup};

/// The host-wide file whose byte ranges are the instances' claimed uid ranges (`/run` is
/// the host's, or the container's own where each container has its own users).
pub const LOCK_FILE: &str = "/run/snakecage/worker-uids.lock";

/// The ids an unset `sandbox.uid` takes its block from: mapped in a user-namespaced pod
/// (0–65535), above the accounts a host usually has (1000 and up), below the ids
/// distributions and systemd reserve (60000 and up: systemd-homed, dynamic users, nobody).
pub const AUTO_FIRST: u32 = 40_000;
pub const AUTO_LAST: u32 = 59_999;

/// How long a configured range's start-up waits for the processes under its ids to go.
pub const VACATE_PATIENCE: Duration = Duration::from_secs(10);

/// Blocks of an unset `sandbox.uid` start at multiples of this past [`AUTO_FIRST`].
const AUTO_ALIGN: u32 = 64;

/// The range this instance claimed, locked until it is dropped.
#[derive(Debug)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
    /// Where the claim is held.
    pub lock_file: PathBuf,
    /// The named ids an unset `sandbox.uid`'s search moved on past.
    pub skipped: Vec<Account>,
    /// The processes under ids of the blocks an unset `sandbox.uid`'s search moved on
    /// past.
    pub passed_over: Vec<Occupant>,
    /// The processes under the range's own ids (a configured range's: the search takes
    /// none with any): [`UidRange::vacated`] waits for them before a worker may start.
    pub occupants: Vec<Occupant>,
    _lock: RangeLock,
}

/// A process found under an id of a block being claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occupant {
    pub pid: i32,
    pub uid: u32,
    /// Its command name (`/proc/PID/status`'s `Name`).
    pub name: String,
    /// Exited, not yet reaped by its parent.
    pub zombie: bool,
}

impl Occupant {
    fn describe(&self) -> String {
        match self.zombie {
            true => format!(
                "pid {} (uid {}, {}, exited, not yet reaped by its parent)",
                self.pid, self.uid, self.name
            ),
            false => format!("pid {} (uid {}, {})", self.pid, self.uid, self.name),
        }
    }

    /// A few of `occupants`, and how many more there are.
    pub fn describe_all(occupants: &[Occupant]) -> String {
        const SHOWN: usize = 3;
        let shown: Vec<String> = occupants.iter().take(SHOWN).map(Self::describe).collect();
        match occupants.len().checked_sub(SHOWN) {
            Some(more) if more > 0 => format!("{} and {more} more", shown.join(", ")),
            _ => shown.join(", "),
        }
    }
}

/// The processes under any id of `first..=last`: [`occupants_of`] or, in tests, a stand-in.
pub type Occupants<'a> = &'a (dyn Fn(u32, u32) -> Vec<Occupant> + Sync);

impl UidRange {
    pub fn last(&self) -> u32 {
        self.first + (self.count - 1)
    }

    /// Claims `count` ids from `first`, or, with `first` unset, the first free block of
    /// [`AUTO_FIRST`]–[`AUTO_LAST`] mapped here; never an id the system names.
    /// `lock_file`: [`LOCK_FILE`] but in tests.
    pub fn claim(first: Option<u32>, count: u32, lock_file: &Path) -> Result<Self, String> {
        Self::claim_with(
            first,
            count,
            lock_file,
            &uid_accounts::account_of,
            &occupants_of,
        )
    }

    /// [`UidRange::claim`], asking `account` which ids the system names and `occupants`
    /// which processes run under them.
    fn claim_with(
        first: Option<u32>,
        count: u32,
        lock_file: &Path,
        account: Lookup<'_>,
        occupants: Occupants<'_>,
    ) -> Result<Self, String> {
        if count < 2 {
            return Err("sandbox.uid_count must be at least 2 (the probe's and a worker's)".into());
        }
        let mapped = mapped_ids().map_err(|e| format!("reading /proc/self/uid_map: {e}"))?;
        if let Some(dir) = lock_file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!("creating {} for the worker uids' lock: {e}", dir.display())
            })?;
        }
        let file =
            open_once(lock_file).map_err(|e| format!("opening {}: {e}", lock_file.display()))?;
        let claimed = |first: u32, lock: RangeLock, skipped, passed_over, occupants| Self {
            first,
            count,
            lock_file: lock_file.to_path_buf(),
            skipped,
            passed_over,
            occupants,
            _lock: lock,
        };
        if let Some(first) = first {
            let last = first
                .checked_add(count - 1)
                .filter(|&l| l < u32::MAX)
                .ok_or_else(|| {
                    format!(
                        "sandbox.uid {first} + sandbox.uid_count {count} runs past the largest uid"
                    )
                })?;
            if !is_mapped(&mapped, first, last) {
                return Err(format!(
                    "worker uids {first}–{last} (sandbox.uid, sandbox.uid_count) are not all mapped in this user namespace ({}); choose a range inside it",
                    describe_map(&mapped)
                ));
            }
            let named = uid_accounts::named_in(first, last, account);
            if !named.is_empty() {
                return Err(format!(
                    "worker uids {first}–{last} (sandbox.uid, sandbox.uid_count) include ids of the system's accounts: {}; a worker under one would act as that account on the files it can reach and count against its process limit: set sandbox.uid to the first id of a range that holds no account's id, or leave sandbox.uid unset to take a free block",
                    uid_accounts::describe(&named)
                ));
            }
            return match RangeLock::take(&file, lock_file, first, count) {
                // Checked under the lock: no instance can start a worker here meanwhile.
                Ok(Taken::Yes(lock)) => Ok(claimed(
                    first,
                    lock,
                    Vec::new(),
                    Vec::new(),
                    occupants(first, last),
                )),
                Ok(Taken::HeldBy(holder)) => Err(format!(
                    "worker uids {first}–{last} are claimed by another snakecage instance ({}) in {}: two instances must not share worker uids; set sandbox.uid (and sandbox.uid_count) to a range of its own, or leave sandbox.uid unset to take a free block",
                    holder.describe(),
                    lock_file.display()
                )),
                Err(e) => Err(format!("locking {}: {e}", lock_file.display())),
            };
        }
        let step = count.div_ceil(AUTO_ALIGN) * AUTO_ALIGN;
        let mut start = AUTO_FIRST;
        let mut held = 0;
        let mut skipped: Vec<Account> = Vec::new();
        let mut occupied: Vec<Occupant> = Vec::new();
        while let Some(last) = start.checked_add(count - 1).filter(|&l| l <= AUTO_LAST) {
            if is_mapped(&mapped, start, last) {
                let named = uid_accounts::named_in(start, last, account);
                if let Some(highest) = named.last().map(|a| a.uid) {
                    // On to the first aligned block past the highest named id: no block
                    // before it can hold `count` ids that name no one.
                    start =
                        AUTO_FIRST + (highest - AUTO_FIRST + 1).div_ceil(AUTO_ALIGN) * AUTO_ALIGN;
                    skipped.extend(named);
                    continue;
                }
                match RangeLock::take(&file, lock_file, start, count) {
                    Ok(Taken::Yes(lock)) => {
                        let found = occupants(start, last);
                        if found.is_empty() {
                            return Ok(claimed(start, lock, skipped, occupied, found));
                        }
                        // A dead instance's leftovers (or anyone's): not waited for, the
                        // next block is as good. Its lock is let go with `lock`.
                        occupied.extend(found);
                    }
                    Ok(Taken::HeldBy(_)) => held += 1,
                    Err(e) => return Err(format!("locking {}: {e}", lock_file.display())),
                }
            }
            start += step;
        }
        let accounts = match skipped.is_empty() {
            true => String::new(),
            false => format!(
                "; ids of the system's accounts skipped: {}",
                uid_accounts::describe(&skipped)
            ),
        };
        let processes = match occupied.is_empty() {
            true => String::new(),
            false => format!(
                "; blocks passed over because processes run under their ids: {}",
                Occupant::describe_all(&occupied)
            ),
        };
        Err(format!(
            "no free block of {count} worker uids in {AUTO_FIRST}–{AUTO_LAST} mapped here ({}; {held} held by other instances, see {}{accounts}{processes}): set sandbox.uid to the first id of a free range (and sandbox.uid_count)",
            describe_map(&mapped),
            lock_file.display()
        ))
    }

    /// Waits, for up to `patience`, until no process runs under an id of the range
    /// (`occupants`: [`occupants_of`] but in tests): those [`UidRange::claim`] found under
    /// a configured range are most likely the workers of an instance that was killed,
    /// going. How long it waited, or why the range cannot be used.
    pub async fn vacated(
        &mut self,
        patience: Duration,
        occupants: Occupants<'_>,
    ) -> Result<Duration, String> {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(10);
        while !self.occupants.is_empty() {
            if started.elapsed() >= patience {
                return Err(format!(
                    "worker uids {}–{} (sandbox.uid, sandbox.uid_count): processes still run under them after {} s: {}; a worker under one of these ids would share its process limit and the ownership of its files with such a process: stop them, or set sandbox.uid to the first id of a range no process runs under, or leave sandbox.uid unset to take a free block",
                    self.first,
                    self.last(),
                    patience.as_secs(),
                    Occupant::describe_all(&self.occupants),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
            self.occupants = occupants(self.first, self.last());
        }
        Ok(started.elapsed())
    }
}

/// A POSIX write lock on bytes `first..first + count` of the lock file. POSIX locks
/// belong to the process, so one process never conflicts with itself: the ranges this
/// process holds are kept in [`HELD`] and checked first, and its lock file is opened once
/// ([`LOCK_FILES`]: closing any descriptor of it would release every lock of the process).
#[derive(Debug)]
struct RangeLock {
    file: Arc<File>,
    path: PathBuf,
    first: u32,
    count: u32,
}

enum Taken {
    Yes(RangeLock),
    HeldBy(Holder),
}

/// Who holds a range we wanted.
enum Holder {
    /// This very process (a second pool in it).
    Us,
    /// Another process, by the pid the kernel reports (0: in a PID namespace we cannot see).
    Process(i32),
}

impl Holder {
    fn describe(&self) -> String {
        match self {
            Holder::Us => "this process".into(),
            Holder::Process(pid) if *pid > 0 => format!("pid {pid}"),
            Holder::Process(_) => "a process in another PID namespace".into(),
        }
    }
}

/// Each lock file, opened once for the process's life.
static LOCK_FILES: Mutex<Vec<(PathBuf, Arc<File>)>> = Mutex::new(Vec::new());

fn open_once(path: &Path) -> io::Result<Arc<File>> {
    let mut files = LOCK_FILES.lock().expect("uid lock files");
    if let Some((_, file)) = files.iter().find(|(p, _)| p == path) {
        return Ok(file.clone());
    }
    let file = Arc::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?,
    );
    files.push((path.to_path_buf(), file.clone()));
    Ok(file)
}

/// The ranges this process holds, by lock file.
static HELD: Mutex<Vec<(PathBuf, u32, u32)>> = Mutex::new(Vec::new());

fn flock(kind: libc::c_short, first: u32, count: u32) -> libc::flock {
    // SAFETY: flock is a plain C struct; all-zero is a valid value of it.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = libc::off_t::from(first);
    lock.l_len = libc::off_t::from(count);
    lock
}

impl RangeLock {
    fn take(file: &Arc<File>, path: &Path, first: u32, count: u32) -> io::Result<Taken> {
        let mut held = HELD.lock().expect("held uid ranges");
        let end = u64::from(first) + u64::from(count);
        if held.iter().any(|(p, f, c)| {
            p == path && u64::from(*f) < end && u64::from(first) < u64::from(*f) + u64::from(*c)
        }) {
            return Ok(Taken::HeldBy(Holder::Us));
        }
        let fd = file.as_fd();
        let want = flock(libc::F_WRLCK as libc::c_short, first, count);
        match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETLK(&want)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                let mut probe = flock(libc::F_WRLCK as libc::c_short, first, count);
                nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETLK(&mut probe))?;
                return Ok(Taken::HeldBy(Holder::Process(probe.l_pid)));
            }
            Err(e) => return Err(e.into()),
        }
        held.push((path.to_path_buf(), first, count));
        Ok(Taken::Yes(RangeLock {
            file: file.clone(),
            path: path.to_path_buf(),
            first,
            count,
        }))
    }
}

impl Drop for RangeLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().expect("held uid ranges");
        let unlock = flock(libc::F_UNLCK as libc::c_short, self.first, self.count);
        let _ = nix::fcntl::fcntl(self.file.as_fd(), nix::fcntl::FcntlArg::F_SETLK(&unlock));
        held.retain(|(p, f, c)| (p, *f, *c) != (&self.path, self.first, self.count));
    }
}

/// The id ranges this process's user namespace maps (`/proc/self/uid_map`: inside,
/// outside, length); the whole 32-bit space in the initial namespace.
fn mapped_ids() -> io::Result<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string("/proc/self/uid_map")?;
    Ok(parse_uid_map(&text))
}

fn parse_uid_map(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().map(str::parse::<u64>);
            let inside = fields.next()?.ok()?;
            let _outside = fields.next()?.ok()?;
            let len = fields.next()?.ok()?;
            Some((inside, len))
        })
        .collect()
}

fn is_mapped(mapped: &[(u64, u64)], first: u32, last: u32) -> bool {
    let (first, last) = (u64::from(first), u64::from(last));
    mapped
        .iter()
        .any(|&(inside, len)| inside <= first && last < inside + len)
}

fn describe_map(mapped: &[(u64, u64)]) -> String {
    let ranges: Vec<String> = mapped
        .iter()
        .map(|&(inside, len)| format!("{inside}–{}", (inside + len).saturating_sub(1)))
        .collect();
    format!("mapped: {}", ranges.join(", "))
}

/// Every tier's zygote probes the uid drop with the range's first id, which no worker is
/// given: the probe shares a uid with no tenant's code.
pub(super) fn probe_with(settings: &mut super::PoolSettings, first: u32) {
    for tier in &mut settings.tiers {
        tier.zygote.sandbox.uid = first;
    }
}

/// The ids of the claimed range, handed out one per worker.
pub struct WorkerUids {
    range: UidRange,
    free: Mutex<VecDeque<u32>>,
    in_use: AtomicUsize,
    /// Held for good: a workspace that could not be removed keeps its uid out of use.
    kept: AtomicUsize,
    freed: Notify,
}

/// What `/health` shows of the worker uids.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UidStatus {
    pub first: u32,
    pub last: u32,
    pub count: u32,
    /// Leased: a worker has it, or has not been reaped yet, or its workspace not removed.
    pub in_use: usize,
    /// Out of use for the process's life (a workspace that could not be removed).
    pub withheld: usize,
    pub lock_file: PathBuf,
}

impl WorkerUids {
    pub fn new(range: UidRange) -> Arc<Self> {
        // The first id is the zygotes' start-up probe's.
        let free = (range.first + 1..=range.last()).collect();
        Arc::new(Self {
            range,
            free: Mutex::new(free),
            in_use: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    pub fn first(&self) -> u32 {
        self.range.first
    }

    pub fn status(&self) -> UidStatus {
        UidStatus {
            first: self.range.first,
            last: self.range.last(),
            count: self.range.count,
            in_use: self.in_use.load(Ordering::Relaxed),
            withheld: self.kept.load(Ordering::Relaxed),
            lock_file: self.range.lock_file.clone(),
        }
    }

    /// A free uid at once, or the first one freed within `wait`; never one in use.
    pub async fn lease(self: &Arc<Self>, wait: Duration) -> Result<Arc<UidLease>, String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(uid) = self.take() {
                return Ok(uid);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return self.take().ok_or_else(|| {
                    format!(
                        "every worker uid ({}–{}, sandbox.uid_count = {}) is in use; raise sandbox.uid_count",
                        self.range.first,
                        self.range.last(),
                        self.range.count
                    )
                });
            }
        }
    }

    fn take(self: &Arc<Self>) -> Option<Arc<UidLease>> {
        let uid = self.free.lock().expect("free uids").pop_front()?;
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Some(Arc::new(UidLease {
            uid,
            owner: self.clone(),
            kept: AtomicBool::new(false),
        }))
    }

    fn give_back(&self, uid: u32) {
        self.free.lock().expect("free uids").push_back(uid);
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        self.freed.notify_one();
    }
}

/// One worker's uid, returned to the range when the last holder drops it.
pub struct UidLease {
    uid: u32,
    owner: Arc<WorkerUids>,
    kept: AtomicBool,
}

impl std::fmt::Debug for UidLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UidLease({})", self.uid)
    }
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Keeps the uid out of use for good: what the worker left could not be removed, and
    /// the next worker with the id would own it.
    pub fn withhold(&self) {
        if !self.kept.swap(true, Ordering::AcqRel) {
            self.owner.kept.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        if self.kept.load(Ordering::Acquire) {
            tracing::error!(
                uid = self.uid,
                "a worker uid stays out of use: its workspace could not be removed"
            );
            return;
        }
        self.owner.give_back(self.uid);
    }
}

/// The leases of workers whose zygote died before reporting their exit (with their pids,
/// where the zygote had reported the fork): each is dropped once no process of its uid is
/// left (the kernel killed them with their zygote, and whoever inherited them reaps them:
/// until then they still count against RLIMIT_NPROC). Called once the zygote is reaped:
/// by then each of its children is either killed (its PDEATHSIG was sent) or already
/// under its uid (a change of uid clears PDEATHSIG until the worker sets it again). Two
/// scans in a row must find none: a child forked just before could still have been
/// changing its uid during one.
///
/// As PID 1 of a PID namespace (a container without an init) the orphans are this
/// process's to reap: each known pid is reaped here, once (nothing else reaps in this
/// process but tokio, which waits for its own children's pids only).
pub fn release_when_gone(leases: Vec<(Option<i32>, Arc<UidLease>)>) {
    if leases.is_empty() {
        return;
    }
    let init = std::process::id() == 1;
    let wait = move || {
        let mut waiting: Vec<(Option<i32>, Arc<UidLease>, u8)> =
            leases.into_iter().map(|(pid, l)| (pid, l, 0)).collect();
        let _awaited = Awaited::add(waiting.iter().map(|(_, lease, _)| lease.uid).collect());
        let mut pause = Duration::from_millis(20);
        while !waiting.is_empty() {
            if init {
                for (pid, _, _) in &mut waiting {
                    if pid.is_some_and(reaped) {
                        *pid = None;
                    }
                }
            }
            let mut procs = processes();
            if init {
                // A worker whose fork its zygote never reported is ours too, reparented
                // and unknown: left, its zombie would hold its uid (and this wait, which
                // shutdown waits for) for good. Reaped, it is gone from this scan.
                let uids: std::collections::HashSet<u32> =
                    waiting.iter().map(|(_, lease, _)| lease.uid).collect();
                procs.retain(|p| {
                    let ours = p.ppid == 1 && p.zombie && p.uids.iter().any(|u| uids.contains(u));
                    !(ours && reaped(p.pid))
                });
            }
            // Every uid (real, effective, saved, file system) a process still has.
            let present: std::collections::HashSet<u32> =
                procs.into_iter().flat_map(|p| p.uids).collect();
            for (_, lease, clean) in &mut waiting {
                *clean = if present.contains(&lease.uid) {
                    0
                } else {
                    *clean + 1
                };
            }
            waiting.retain(|(_, _, clean)| *clean < 2);
            if waiting.is_empty() {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(wait)),
        Err(_) => wait(),
    }
}

/// The uids [`release_when_gone`] waits for, one entry per waiting lease: what a
/// shutdown that stopped waiting left behind ([`still_awaited`]).
static AWAITED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// A wait's uids in [`AWAITED`], removed when the wait ends (its thread is gone with the
/// process when a shutdown stops waiting, and then nothing removes them).
struct Awaited(Vec<u32>);

impl Awaited {
    fn add(uids: Vec<u32>) -> Self {
        AWAITED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(&uids);
        Self(uids)
    }
}

impl Drop for Awaited {
    fn drop(&mut self) {
        let mut awaited = AWAITED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for uid in &self.0 {
            if let Some(at) = awaited.iter().position(|u| u == uid) {
                awaited.swap_remove(at);
            }
        }
    }
}

/// The processes under the uids a [`release_when_gone`] still waits for: what keeps a
/// shutdown from completing (a worker stuck in the kernel, a process of the host's under
/// a worker's id).
pub fn still_awaited() -> Vec<Occupant> {
    let mut uids = AWAITED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    if uids.is_empty() {
        return Vec::new();
    }
    uids.sort_unstable();
    uids.dedup();
    occupants(|uid| uids.binary_search(&uid).is_ok())
}

/// Reaps `pid` if it is an exited child of this process; whether it was.
fn reaped(pid: i32) -> bool {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    matches!(
        waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// A process's ids, as `/proc/PID/status` gives them.
struct ProcessIds {
    pid: i32,
    ppid: i32,
    name: String,
    zombie: bool,
    /// Real, effective, saved and file-system uid.
    uids: Vec<u32>,
}

/// Every process in /proc, with its ids (one that exits during the scan is left out).
fn processes() -> Vec<ProcessIds> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            Some(parse_status(pid, &status))
        })
        .collect()
}

fn parse_status(pid: i32, status: &str) -> ProcessIds {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .unwrap_or_default()
    };
    ProcessIds {
        pid,
        ppid: field("PPid:").parse().unwrap_or(0),
        name: field("Name:").to_owned(),
        zombie: field("State:").starts_with('Z'),
        uids: field("Uid:")
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect(),
    }
}

/// The processes with any of their uids in `first..=last`.
pub fn occupants_of(first: u32, last: u32) -> Vec<Occupant> {
    occupants(|uid| (first..=last).contains(&uid))
}

/// The processes with any of their uids `wanted`, each with the first such uid.
fn occupants(wanted: impl Fn(u32) -> bool) -> Vec<Occupant> {
    processes()
        .into_iter()
        .filter_map(|p| {
            let uid = *p.uids.iter().find(|&&u| wanted(u))?;
            Some(Occupant {
                pid: p.pid,
                uid,
                name: p.name,
                zombie: p.zombie,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody_runs(_: u32, _: u32) -> Vec<Occupant> {
        Vec::new()
    }

    /// [`UidRange::claim`] where the host's processes do not count: another test's (or a
    /// service's beside the tests) run under the ids these tests claim in lock files of
    /// their own.
    fn claim(first: Option<u32>, count: u32, lock: &Path) -> Result<UidRange, String> {
        UidRange::claim_with(first, count, lock, &uid_accounts::account_of, &nobody_runs)
    }

    #[test]
    fn the_uid_map_is_read_as_inside_ranges() {
        let map = parse_uid_map("         0     100000      65536\n");
        assert_eq!(map, vec![(0, 65536)]);
        assert!(is_mapped(&map, 40_000, 40_127));
        assert!(is_mapped(&map, 65_000, 65_535));
        assert!(!is_mapped(&map, 65_500, 65_536));
        let host = parse_uid_map("0 0 4294967295\n");
        assert!(is_mapped(&host, 100_000, 4_294_967_294));
        assert!(!is_mapped(&host, 100_000, u32::MAX));
    }

    #[test]
    fn claims_in_one_process_never_overlap_and_are_released_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("uids.lock");
        let a = claim(None, 100, &lock).unwrap();
        let b = claim(None, 100, &lock).unwrap();
        assert_eq!(a.first, AUTO_FIRST);
        assert_eq!(b.first, AUTO_FIRST + 128, "the next aligned block");
        let err = claim(Some(AUTO_FIRST + 50), 10, &lock).unwrap_err();
        assert!(
            err.contains("claimed by another snakecage instance (this process)"),
            "{err}"
        );
        assert!(err.contains("set sandbox.uid"), "{err}");
        drop(a);
        let again = claim(Some(AUTO_FIRST + 50), 10, &lock).unwrap();
        assert_eq!(
            (again.first, again.last()),
            (AUTO_FIRST + 50, AUTO_FIRST + 59)
        );
        let err = claim(Some(u32::MAX - 5), 10, &lock).unwrap_err();
        assert!(err.contains("runs past the largest uid"), "{err}");
    }

    #[test]
    fn ids_the_system_names_are_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("uids.lock");
        // Accounts at 40010 and 40070: the default search moves on to the first aligned
        // block past each, and says which it passed over.
        let accounts = |uid: u32| match uid {
            40_010 => Some("ana".to_owned()),
            40_070 => Some("bjørn".to_owned()),
            _ => None,
        };
        let range = UidRange::claim_with(None, 64, &lock, &accounts, &nobody_runs).unwrap();
        assert_eq!((range.first, range.last()), (40_128, 40_191));
        let skipped: Vec<u32> = range.skipped.iter().map(|a| a.uid).collect();
        assert_eq!(skipped, [40_010, 40_070]);
        assert_eq!(range.skipped[1].name, "bjørn");
        // A block held by another claim is passed over as before, the named ones too.
        let next = UidRange::claim_with(None, 100, &lock, &accounts, &nobody_runs).unwrap();
        assert_eq!(next.first, 40_256);
        // A range set by hand that holds one fails, naming it and the key to change.
        let err =
            UidRange::claim_with(Some(40_000), 20, &lock, &accounts, &nobody_runs).unwrap_err();
        assert!(
            err.contains("worker uids 40000–40019 (sandbox.uid, sandbox.uid_count) include ids of the system's accounts: 40010 (ana);"),
            "{err}"
        );
        assert!(
            err.contains("set sandbox.uid to the first id of a range"),
            "{err}"
        );
        // A few are listed, and how many more there are.
        let everyone = |uid: u32| Some(format!("user{uid}"));
        let err =
            UidRange::claim_with(Some(41_000), 10, &lock, &everyone, &nobody_runs).unwrap_err();
        assert!(
            err.contains("41000 (user41000), 41001 (user41001), 41002 (user41002), 41003 (user41003), 41004 (user41004) and 5 more;"),
            "{err}"
        );
        // Where every id is named there is no block to take: the error says why.
        let err = UidRange::claim_with(None, 64, &lock, &everyone, &nobody_runs).unwrap_err();
        assert!(err.contains("no free block of 64 worker uids"), "{err}");
        assert!(
            err.contains("ids of the system's accounts skipped: 40000 (user40000)"),
            "{err}"
        );
        // The system's own lookup: root is named, so a range holding 0 is refused.
        let err = UidRange::claim(Some(0), 2, &lock).unwrap_err();
        assert!(err.contains("0 (root)"), "{err}");
    }

    fn occupant(pid: i32, uid: u32, zombie: bool) -> Occupant {
        Occupant {
            pid,
            uid,
            name: "snakecage-wörker".into(),
            zombie,
        }
    }

    #[test]
    fn a_block_a_process_runs_under_is_passed_over_and_a_configured_one_is_held_to_wait() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("uids.lock");
        let none = |_: u32| None;
        // A killed instance's zombie under 40001, a live worker of it under 40070.
        let left = |first: u32, last: u32| -> Vec<Occupant> {
            [occupant(41, 40_001, true), occupant(42, 40_070, false)]
                .into_iter()
                .filter(|o| (first..=last).contains(&o.uid))
                .collect()
        };
        let range = UidRange::claim_with(None, 64, &lock, &none, &left).unwrap();
        assert_eq!((range.first, range.last()), (40_128, 40_191));
        assert_eq!(
            range.passed_over,
            [occupant(41, 40_001, true), occupant(42, 40_070, false)]
        );
        assert!(range.occupants.is_empty());
        drop(range);
        // The blocks passed over were not kept locked: they are free once their
        // processes are gone.
        let later = UidRange::claim_with(None, 64, &lock, &none, &nobody_runs).unwrap();
        assert_eq!(later.first, AUTO_FIRST);
        drop(later);
        // A configured range is claimed with its occupants, for the caller to wait on.
        let range = UidRange::claim_with(Some(40_000), 64, &lock, &none, &left).unwrap();
        assert_eq!(range.occupants, [occupant(41, 40_001, true)]);
        assert!(range.passed_over.is_empty());
        drop(range);
        // When every block is taken by processes the error says so.
        let everywhere = |first: u32, _: u32| vec![occupant(7, first, false)];
        let err = UidRange::claim_with(None, 64, &lock, &none, &everywhere).unwrap_err();
        assert!(
            err.contains(
                "blocks passed over because processes run under their ids: pid 7 (uid 40000, snakecage-wörker), pid 7 (uid 40064, snakecage-wörker), pid 7 (uid 40128, snakecage-wörker) and 309 more)"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_configured_range_waits_for_its_processes_to_go_and_refuses_if_they_stay() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("uids.lock");
        let none = |_: u32| None;
        let first = 3_000_000_000;
        let left = |f: u32, _: u32| vec![occupant(41, f + 1, true), occupant(42, f + 2, false)];
        // They go after a few scans: the wait ends then.
        let mut range = UidRange::claim_with(Some(first), 10, &lock, &none, &left).unwrap();
        assert_eq!(range.occupants.len(), 2);
        let scans = std::sync::atomic::AtomicU32::new(0);
        let going = |f: u32, l: u32| match scans.fetch_add(1, Ordering::Relaxed) {
            0 | 1 => left(f, l),
            _ => Vec::new(),
        };
        range
            .vacated(Duration::from_secs(60), &going)
            .await
            .unwrap();
        assert_eq!(scans.load(Ordering::Relaxed), 3);
        assert!(range.occupants.is_empty());
        drop(range);
        // They stay: the error names them, says why it matters and what to set.
        let mut range = UidRange::claim_with(Some(first), 10, &lock, &none, &left).unwrap();
        let err = range
            .vacated(Duration::from_millis(50), &left)
            .await
            .unwrap_err();
        assert_eq!(
            err,
            "worker uids 3000000000–3000000009 (sandbox.uid, sandbox.uid_count): processes still run under them after 0 s: pid 41 (uid 3000000001, snakecage-wörker, exited, not yet reaped by its parent), pid 42 (uid 3000000002, snakecage-wörker); a worker under one of these ids would share its process limit and the ownership of its files with such a process: stop them, or set sandbox.uid to the first id of a range no process runs under, or leave sandbox.uid unset to take a free block"
        );
    }

    #[test]
    fn a_process_is_found_under_any_of_its_uids() {
        let status = "Name:\tsleep\nState:\tZ (zombie)\nTgid:\t9\nPPid:\t1\nUid:\t0\t40005\t0\t40005\nGid:\t0\t0\t0\t0\n";
        let p = parse_status(9, status);
        assert_eq!(
            (p.pid, p.ppid, p.name.as_str(), p.zombie),
            (9, 1, "sleep", true)
        );
        assert_eq!(p.uids, [0, 40_005, 0, 40_005]);
        // This process, found by its own uid; none under an id no process has.
        let me = nix::unistd::getuid().as_raw();
        let pid = std::process::id() as i32;
        assert!(
            occupants_of(me, me)
                .iter()
                .any(|o| o.pid == pid && !o.zombie)
        );
        assert!(occupants_of(4_000_000_000, 4_000_000_100).is_empty());
    }

    #[tokio::test]
    async fn a_uid_is_reused_only_after_every_holder_let_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let range = claim(Some(3_000_000_000), 3, &dir.path().join("l")).unwrap();
        let uids = WorkerUids::new(range);
        assert_eq!(uids.first(), 3_000_000_000, "the probe's, never leased");
        let a = uids.lease(Duration::ZERO).await.unwrap();
        let b = uids.lease(Duration::ZERO).await.unwrap();
        assert_ne!(a.uid(), b.uid());
        assert_eq!(uids.status().in_use, 2);
        let err = uids.lease(Duration::from_millis(10)).await.unwrap_err();
        assert!(
            err.contains("every worker uid (3000000000–3000000002"),
            "{err}"
        );
        assert!(a.uid() > 3_000_000_000 && b.uid() > 3_000_000_000);
        assert!(err.contains("raise sandbox.uid_count"), "{err}");
        // Two holders (the exit route and the workspace): the first to let go frees nothing.
        let workspace = a.clone();
        let first = a.uid();
        drop(a);
        assert!(uids.lease(Duration::ZERO).await.is_err());
        // A waiting spawn gets the id as soon as the last holder lets it go.
        let waiter = {
            let uids = uids.clone();
            tokio::spawn(async move { uids.lease(Duration::from_secs(600)).await })
        };
        tokio::task::yield_now().await;
        drop(workspace);
        let c = waiter.await.unwrap().unwrap();
        assert_eq!(c.uid(), first);
        // A withheld one never comes back.
        c.withhold();
        drop(c);
        assert_eq!(uids.status().withheld, 1);
        assert!(uids.lease(Duration::ZERO).await.is_err());
        drop(b);
        assert_eq!(uids.status().in_use, 1);
    }
}
