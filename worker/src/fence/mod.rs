//! Fencing and the lease: a task never runs on two nodes at once because its worker died,
//! stopped, or lost its way to the head (DESIGN §13).
//!
//! When a worker is SIGKILLed, its command tasks (each the leader of its own process group)
//! are orphaned and keep running; when it is SIGSTOPped, they keep running while it is frozen;
//! when it is cut off from the head, it keeps running them. In every case the head, hearing
//! nothing, declares the node lost after its heartbeat timeout and retries the tasks elsewhere:
//! without fencing, both attempts run.
//!
//! `escher-worker` therefore starts a **supervisor**: a second process (the same binary, run as
//! `escher-worker __escher-fence`) in a process group of its own, connected to the worker by a
//! pipe. The worker writes one short line per event:
//!
//! - `+PGID` when a command task's process group starts, `-PGID` when it is gone;
//! - `rPATH` once, when the worker starts: the directory its task cgroups are made in. The
//!   supervisor keeps it for good and, whenever it kills, kills every populated cgroup directly
//!   under it (an empty one, waiting in the pool, is left alone), so a task's cgroup costs the
//!   pipe no line; `cPATH`/`dPATH` hold and let go of a cgroup outside it (none today);
//! - `lMILLIS`, the lease period: half the head's heartbeat timeout, learnt at each
//!   registration;
//! - `hMILLIS`, a beat: kill everything unless another line comes within `MILLIS`. The worker
//!   beats several times per lease, from a task on its own runtime, and each beat carries what
//!   is left of its **lease**: the leading head renews the lease with each heartbeat it hears
//!   (`LeaseRenewed`), for a lease period from when the worker sent that heartbeat. A worker
//!   cut off from the leader beats with less and less, then with 0.
//!
//! The supervisor SIGKILLs every process group it holds when the pipe closes (the worker has
//! exited, however it died), when no line arrives for a lease (the worker is stopped or
//! wedged), and when the lease runs out (the worker cannot reach the leader). Since the head
//! retries a lost node's tasks only after a whole heartbeat timeout without a heartbeat, twice
//! the lease, the task processes are gone first. A worker that resumes or reconnects finds its
//! tasks killed and reports them as stopped by the fence, with the reason
//! (`stopped_since`); the head counts such an attempt as failed (retried under
//! `max_retries`) or, if it already declared the node lost, ignores the report.
//!
//! If the supervisor dies (killed by hand, or by the OOM killer, which it asks never to pick
//! it), the worker's watch thread (`watch.rs`) sees it at once and starts another, which it
//! tells everything the dead one held (the lease, what is left of it, every process group and
//! cgroup): the tasks stay fenced. A supervisor that cannot be started, or that dies more than
//! [`MAX_RESTARTS`] times in [`RESTART_WINDOW`], leaves the worker without a fence: it then
//! SIGKILLs its tasks itself, takes no new ones (it answers each assignment with the reason
//! and asks the head to drain its node), and stays attached so that its reports reach the head.
//! Every heartbeat says what happened to the fence (`Heartbeat.fence`, see `report`), and
//! `escher nodes` shows it.
//!
//! What this does not cover: a task that leaves its process group (`setsid`) escapes the kill;
//! and the instant between a task's spawn and its `+PGID` line (if the worker dies exactly
//! then). A worker embedded in another process (a `LocalCluster`, the library) starts no
//! supervisor: its tasks live and die with that process's runtime, which holds the head too.

pub mod countdown;
mod supervisor;
mod watch;

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

pub use supervisor::supervise;
pub use watch::{MAX_RESTARTS, RESTART_WINDOW};

/// The argument that makes `escher-worker` the supervisor.
pub const SUPERVISOR_ARG: &str = "__escher-fence";

/// How often the worker beats at most (a lease of a few seconds gets several beats).
const MAX_BEAT: Duration = Duration::from_millis(500);

/// How long a new supervisor must live before the worker counts it as started.
const STARTED_WITHIN: Duration = Duration::from_millis(50);

/// What a worker without a supervisor (one embedded in another program) tells the head.
const NO_SUPERVISOR: &str = "none: this worker runs inside another program without a fence \
    supervisor; its tasks are not stopped when it stalls or loses the head";

/// The worker's end of the fence.
struct Fence {
    /// The program the supervisor runs (this worker's own binary).
    program: PathBuf,
    /// The supervisor now running and what it holds.
    pipe: Mutex<Pipe>,
    /// The lease in milliseconds (0 until the first registration).
    lease_ms: AtomicU64,
    /// When the lease runs out, in milliseconds since [`Fence::epoch`] (0: no lease yet).
    lease_until_ms: AtomicU64,
    /// The clock of `lease_until_ms`.
    epoch: Instant,
    /// When the last beat went out, on the clock of `lease_until_ms`.
    last_beat_ms: AtomicU64,
    /// When the fence last stopped (or was about to stop) the tasks, and why.
    stopped: Mutex<Option<(Instant, String)>>,
}

/// The pipe to the supervisor that runs now, what it holds, and what became of the earlier
/// ones: under one lock, so that a new supervisor is told everything the dead one held and no
/// line falls in between.
#[derive(Debug, Default)]
struct Pipe {
    /// The supervisor's stdin; `None` while it is replaced, and for good once there is none.
    stdin: Option<ChildStdin>,
    /// The task process groups it holds.
    groups: BTreeSet<i32>,
    /// The task cgroups it holds one by one (those outside every root in `roots`).
    cgroups: BTreeSet<PathBuf>,
    /// The directories of this worker's task cgroups, registered once each: the supervisor
    /// kills every populated cgroup under them, so a task's cgroup there costs no line.
    roots: BTreeSet<PathBuf>,
    /// How many task cgroups under `roots` are held now.
    held_in_roots: usize,
    /// Whether a line this supervisor did not take was logged already.
    broken: bool,
    /// How many supervisors were started after one died.
    restarts: u32,
    /// How the last supervisor that died ended.
    last_death: Option<String>,
    /// Why no supervisor runs any more (and the worker stopped its tasks): set for good.
    down: Option<String>,
}

impl Pipe {
    /// Writes one line to the supervisor, in one `write` (formatted straight into the pipe,
    /// each piece of the line would be a system call of its own, and wake the supervisor); a
    /// supervisor that is gone is the watch thread's to replace, and is logged once.
    fn write(&mut self, line: std::fmt::Arguments<'_>) {
        let Some(stdin) = &mut self.stdin else {
            return;
        };
        let mut text = line.to_string();
        text.push('\n');
        if let Err(error) = stdin.write_all(text.as_bytes())
            && !std::mem::replace(&mut self.broken, true)
        {
            tracing::error!(%error, "the fence supervisor does not read its pipe (it died?)");
        }
    }

    /// Whether it holds a task.
    fn holds(&self) -> bool {
        !self.groups.is_empty() || !self.cgroups.is_empty() || self.held_in_roots > 0
    }

    /// Whether the cgroup at `path` lies under a registered root.
    fn under_root(&self, path: &std::path::Path) -> bool {
        self.roots
            .iter()
            .any(|root| path.parent() == Some(root.as_path()))
    }
}

static FENCE: OnceLock<Fence> = OnceLock::new();

/// Starts a supervisor running `program` (this worker's binary), in a process group of its own
/// (a Ctrl-C meant for the worker does not stop it first).
fn spawn(program: &Path) -> std::io::Result<(Child, ChildStdin)> {
    let mut child = Command::new(program)
        .arg(SUPERVISOR_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()?;
    match child.stdin.take() {
        Some(stdin) => Ok((child, stdin)),
        None => Err(std::io::Error::other(
            "the supervisor's stdin was not piped",
        )),
    }
}

/// Starts the supervisor, running `program` (this worker's own binary), the thread that
/// replaces it if it dies, and the heartbeat task on the current tokio runtime. Does nothing
/// if it runs already.
pub fn start(program: &Path) -> std::io::Result<()> {
    if FENCE.get().is_some() {
        return Ok(());
    }
    let (mut child, stdin) = spawn(program).map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!(
                "cannot run {} {SUPERVISOR_ARG} ({error}); the worker runs no task unfenced: \
                 check that this program is still installed where it was started from",
                program.display()
            ),
        )
    })?;
    // A supervisor that cannot run (a binary replaced by an incompatible one) ends at once.
    std::thread::sleep(STARTED_WITHIN);
    if let Some(status) = child.try_wait()? {
        if through_the_loader(program) {
            return Err(std::io::Error::other(format!(
                "this worker was started through the dynamic loader ({}), not as a program, so \
                 its binary cannot be run again as its fence supervisor ({status}); the worker \
                 runs no task unfenced: give escher-worker its execute permission, on a file \
                 system not mounted noexec, and start it as a program",
                program.display()
            )));
        }
        return Err(std::io::Error::other(format!(
            "{} {SUPERVISOR_ARG} ended as soon as it started ({status}); the worker runs no \
             task unfenced: run that command by hand to see why (it should wait for input)",
            program.display()
        )));
    }
    let fence = Fence {
        program: program.to_path_buf(),
        pipe: Mutex::new(Pipe {
            stdin: Some(stdin),
            ..Pipe::default()
        }),
        lease_ms: AtomicU64::new(0),
        lease_until_ms: AtomicU64::new(0),
        epoch: Instant::now(),
        last_beat_ms: AtomicU64::new(0),
        stopped: Mutex::new(None),
    };
    if FENCE.set(fence).is_err() {
        return Ok(());
    }
    let Some(fence) = FENCE.get() else {
        return Ok(());
    };
    watch::watch(fence, child)?;
    tokio::spawn(async move {
        loop {
            fence.beat();
            let lease = Duration::from_millis(fence.lease_ms.load(Ordering::Relaxed));
            let every = if lease.is_zero() {
                MAX_BEAT
            } else {
                (lease / 4).min(MAX_BEAT)
            };
            tokio::time::sleep(every).await;
        }
    });
    Ok(())
}

/// Whether `program` (this process's executable) is the dynamic loader: a binary that cannot
/// be executed (no execute permission, a `noexec` mount) can still be run as
/// `ld-linux-x86-64.so.2 ./escher-worker`, and then the kernel names the loader as the program.
fn through_the_loader(program: &Path) -> bool {
    program
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("ld-") && name.contains(".so"))
}

impl Fence {
    fn pipe(&self) -> MutexGuard<'_, Pipe> {
        self.pipe.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One beat: what is left of the lease goes to the supervisor, and a stall or a lease run
    /// out is remembered as the reason the tasks stop.
    fn beat(&self) {
        let mut pipe = self.pipe();
        let now = self.now_ms();
        if pipe.holds()
            && let Some(why) = self.verdict()
        {
            tracing::warn!(%why, "the fence stops this worker's tasks");
            self.stop_because(why);
        }
        self.last_beat_ms.store(now, Ordering::Relaxed);
        self.write_left(&mut pipe);
    }

    /// Tells the supervisor what is left of the lease (`h` alone before the first one).
    fn write_left(&self, pipe: &mut Pipe) {
        let lease_ms = self.lease_ms.load(Ordering::Relaxed);
        let until = self.lease_until_ms.load(Ordering::Relaxed);
        if lease_ms == 0 || until == 0 {
            // No lease yet (not registered): the supervisor waits for one.
            pipe.write(format_args!("h"));
            return;
        }
        let left = until.saturating_sub(self.now_ms()).min(lease_ms);
        pipe.write(format_args!("h{left}"));
    }

    /// Remembers why the tasks stop, for their reports ([`stopped_since`]).
    fn stop_because(&self, why: String) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        *stopped = Some((Instant::now(), why));
    }

    /// A supervisor died (`how`): starts another and tells it everything the dead one held.
    /// Called by the watch thread.
    fn restart(&self, how: &str) -> std::io::Result<Child> {
        let mut pipe = self.pipe();
        pipe.stdin = None;
        let (child, stdin) = spawn(&self.program)?;
        pipe.stdin = Some(stdin);
        pipe.broken = false;
        let lease = self.lease_ms.load(Ordering::Relaxed);
        if lease > 0 {
            pipe.write(format_args!("l{lease}"));
        }
        let groups: Vec<i32> = pipe.groups.iter().copied().collect();
        for pgid in &groups {
            pipe.write(format_args!("+{pgid}"));
        }
        let roots: Vec<PathBuf> = pipe.roots.iter().cloned().collect();
        for root in &roots {
            pipe.write(format_args!("r{}", root.display()));
        }
        let cgroups: Vec<PathBuf> = pipe.cgroups.iter().cloned().collect();
        for cgroup in &cgroups {
            pipe.write(format_args!("c{}", cgroup.display()));
        }
        self.write_left(&mut pipe);
        pipe.restarts += 1;
        pipe.last_death = Some(how.to_string());
        tracing::warn!(
            supervisor = child.id(),
            restarts = pipe.restarts,
            groups = groups.len(),
            cgroups = cgroups.len(),
            "the fence supervisor {how}; a new one holds this worker's tasks"
        );
        Ok(child)
    }

    /// No supervisor can run: the worker SIGKILLs what the supervisor held, itself, and from
    /// now on every task it is handed (the runtime takes none: see [`down`]).
    fn give_up(&self, why: &str) {
        let mut pipe = self.pipe();
        pipe.stdin = None;
        let held = pipe.groups.len() + pipe.cgroups.len() + pipe.held_in_roots;
        let Pipe {
            groups,
            cgroups,
            roots,
            ..
        } = &mut *pipe;
        supervisor::kill_all(groups, cgroups, roots);
        let why = format!(
            "{why}: this worker stopped its tasks and takes no new ones until it is restarted"
        );
        tracing::error!(%why, held, "the worker's tasks can no longer be fenced");
        self.stop_because(why.clone());
        pipe.down = Some(why);
    }

    /// Why the supervisor has killed, or is about to kill, the tasks now: the worker was
    /// stalled longer than a lease since its last beat, or its lease ran out.
    fn verdict(&self) -> Option<String> {
        let lease_ms = self.lease_ms.load(Ordering::Relaxed);
        let until = self.lease_until_ms.load(Ordering::Relaxed);
        if lease_ms == 0 || until == 0 {
            return None;
        }
        let secs = |ms: u64| Duration::from_millis(ms).as_secs_f64();
        let now = self.now_ms();
        let since_beat = now.saturating_sub(self.last_beat_ms.load(Ordering::Relaxed));
        if since_beat > lease_ms {
            return Some(format!(
                "the worker was stalled for {:.1}s, longer than its lease ({:.1}s)",
                secs(since_beat),
                secs(lease_ms)
            ));
        }
        (now >= until).then(|| {
            format!(
                "the worker could not renew its lease with the leading head for {:.1}s (its \
                 lease is {:.1}s; the head retries the tasks of a node it cannot hear)",
                secs(now - until.saturating_sub(lease_ms)),
                secs(lease_ms)
            )
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The worker's task cgroups are made under `root`: the supervisor holds every one of them
/// from now on by this one registration (it kills each populated cgroup under `root` when it
/// kills the tasks), so a task's cgroup there costs the pipe no line.
pub(crate) fn hold_task_cgroups(root: &std::path::Path) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let mut pipe = fence.pipe();
    if pipe.roots.insert(root.to_path_buf()) {
        pipe.write(format_args!("r{}", root.display()));
    }
}

/// A command task's process group started. With no supervisor left, it is killed at once.
pub(crate) fn hold(pgid: i32) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let mut pipe = fence.pipe();
    if pipe.down.is_some() {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        return;
    }
    pipe.groups.insert(pgid);
    pipe.write(format_args!("+{pgid}"));
}

/// A command task's process group is gone.
pub(crate) fn release(pgid: i32) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let mut pipe = fence.pipe();
    pipe.groups.remove(&pgid);
    pipe.write(format_args!("-{pgid}"));
}

/// Why this worker has no fence supervisor any more, if so: it stopped its tasks and takes no
/// new ones.
pub(crate) fn down() -> Option<String> {
    FENCE.get()?.pipe().down.clone()
}

/// Whether this process started a supervisor ([`start`]): a worker embedded in another
/// program has none.
pub(crate) fn running() -> bool {
    FENCE.get().is_some()
}

/// How many supervisors were started after one died.
pub(crate) fn restarts() -> u32 {
    FENCE.get().map_or(0, |fence| fence.pipe().restarts)
}

/// What the head is told about this worker's fence (`Heartbeat.fence`, shown by `escher
/// nodes`): nothing while the first supervisor runs; how many were restarted and how the last
/// one died; that there is none left, and why; or that this worker never had one.
pub(crate) fn report() -> Option<String> {
    let Some(fence) = FENCE.get() else {
        return Some(NO_SUPERVISOR.to_string());
    };
    let pipe = fence.pipe();
    if let Some(why) = &pipe.down {
        return Some(format!("down: {why}"));
    }
    let how = pipe.last_death.as_ref()?;
    Some(format!(
        "restarted {} time(s): the last supervisor {how}; the tasks stayed fenced",
        pipe.restarts
    ))
}

/// A task's cgroup, held by the fence while the task runs: the supervisor kills it whole with
/// the process groups; released (and the cgroup killed and removed) when dropped.
#[derive(Debug)]
pub(crate) struct HeldCgroup(crate::exec::TaskCgroup, Held);

/// How the fence holds a task's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Not at all (no supervisor in this process, or none left).
    No,
    /// By its own line.
    Alone,
    /// By the registration of its root ([`hold_task_cgroups`]).
    ByRoot,
}

impl HeldCgroup {
    /// With no supervisor left, the cgroup is killed at once.
    pub(crate) fn new(cgroup: crate::exec::TaskCgroup) -> HeldCgroup {
        let mut held = Held::No;
        if let Some(fence) = FENCE.get() {
            let mut pipe = fence.pipe();
            if pipe.down.is_some() {
                cgroup.kill();
            } else if pipe.under_root(cgroup.path()) {
                pipe.held_in_roots += 1;
                held = Held::ByRoot;
            } else {
                pipe.cgroups.insert(cgroup.path().to_path_buf());
                pipe.write(format_args!("c{}", cgroup.path().display()));
                held = Held::Alone;
            }
        }
        HeldCgroup(cgroup, held)
    }

    /// What the task's processes have used so far.
    pub(crate) fn usage(&self) -> crate::exec::CgroupUsage {
        self.0.usage()
    }

    /// The cgroup it holds: a warm Python interpreter's is held to each task's limits in turn
    /// (`python/mod.rs`).
    pub(crate) fn cgroup(&self) -> &crate::exec::TaskCgroup {
        &self.0
    }

    /// The cgroup it holds, to write limits into.
    pub(crate) fn cgroup_mut(&mut self) -> &mut crate::exec::TaskCgroup {
        &mut self.0
    }
}

impl Drop for HeldCgroup {
    fn drop(&mut self) {
        // Killed (by the `TaskCgroup`'s drop, next) before the supervisor lets go of it.
        self.0.kill();
        if let Some(fence) = FENCE.get() {
            let mut pipe = fence.pipe();
            match self.1 {
                Held::No => {}
                Held::ByRoot => pipe.held_in_roots = pipe.held_in_roots.saturating_sub(1),
                Held::Alone => {
                    pipe.cgroups.remove(self.0.path());
                    pipe.write(format_args!("d{}", self.0.path().display()));
                }
            }
        }
    }
}

/// The leading head renewed the lease with a heartbeat (or a registration) sent at `sent`:
/// it runs for a lease period from then.
pub(crate) fn renewed(sent: Instant) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let lease = fence.lease_ms.load(Ordering::Relaxed);
    let from =
        u64::try_from(sent.saturating_duration_since(fence.epoch).as_millis()).unwrap_or(u64::MAX);
    fence
        .lease_until_ms
        .fetch_max(from.saturating_add(lease).max(1), Ordering::Relaxed);
}

/// Why the fence stopped this worker's tasks, if it did after `started` (when a task that was
/// SIGKILLed started): its report then says so instead of "exited with code 137".
pub(crate) fn stopped_since(started: Instant) -> Option<String> {
    let fence = FENCE.get()?;
    // Not held while the pipe is locked (`down`): the pipe's lock comes first elsewhere.
    let recorded = fence
        .stopped
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .filter(|(at, _)| *at >= started)
        .map(|(_, why)| why.clone());
    // Recorded by a beat since the task started, or true now (the task's end may be seen
    // before the first beat after a stall, and a task handed over once no supervisor is left
    // is killed at once).
    recorded.or_else(|| fence.verdict()).or_else(down)
}

/// The lease that goes with the head's heartbeat timeout: half of it.
pub(crate) fn lease_of(head_timeout: Duration) -> Duration {
    (head_timeout / 2).max(Duration::from_millis(50))
}

/// The head said after how long without a heartbeat it declares the node lost: the fence's
/// lease is half of it.
pub(crate) fn set_timeout(head_timeout: Duration) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let lease = lease_of(head_timeout);
    let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    // Under the pipe's lock: a supervisor started meanwhile is told the same lease.
    let mut pipe = fence.pipe();
    fence.lease_ms.store(ms, Ordering::Relaxed);
    pipe.write(format_args!("l{ms}"));
}
