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
//! What this does not cover: a task that leaves its process group (`setsid`) escapes the kill;
//! and the instant between a task's spawn and its `+PGID` line (if the worker dies exactly
//! then). A worker embedded in another process (a `LocalCluster`, the library) starts no
//! supervisor: its tasks live and die with that process's runtime, which holds the head too.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The argument that makes `escher-worker` the supervisor.
pub const SUPERVISOR_ARG: &str = "__escher-fence";

/// How often the worker beats at most (a lease of a few seconds gets several beats).
const MAX_BEAT: Duration = Duration::from_millis(500);

/// The worker's end of the pipe.
struct Fence {
    stdin: Mutex<ChildStdin>,
    /// The supervisor; kept so that it is not reaped as a zombie while the worker runs.
    _child: Mutex<Child>,
    /// The lease in milliseconds (0 until the first registration).
    lease_ms: AtomicU64,
    /// When the lease runs out, in milliseconds since [`Fence::epoch`] (0: no lease yet).
    lease_until_ms: AtomicU64,
    /// The clock of `lease_until_ms`.
    epoch: Instant,
    /// How many process groups the supervisor holds.
    held: AtomicUsize,
    /// When the last beat went out, on the clock of `lease_until_ms`.
    last_beat_ms: AtomicU64,
    /// When the fence last stopped (or was about to stop) the tasks, and why.
    stopped: Mutex<Option<(Instant, String)>>,
}

static FENCE: OnceLock<Fence> = OnceLock::new();

/// Starts the supervisor, running `program` (this worker's own binary), and the heartbeat
/// task on the current tokio runtime. Does nothing if it runs already.
pub fn start(program: &std::path::Path) -> std::io::Result<()> {
    if FENCE.get().is_some() {
        return Ok(());
    }
    let mut child = Command::new(program)
        .arg(SUPERVISOR_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own group: a Ctrl-C meant for the worker does not stop the supervisor first.
        .process_group(0)
        .spawn()?;
    let stdin = child.stdin.take().expect("stdin was piped");
    let fence = Fence {
        stdin: Mutex::new(stdin),
        _child: Mutex::new(child),
        lease_ms: AtomicU64::new(0),
        lease_until_ms: AtomicU64::new(0),
        epoch: Instant::now(),
        held: AtomicUsize::new(0),
        last_beat_ms: AtomicU64::new(0),
        stopped: Mutex::new(None),
    };
    if FENCE.set(fence).is_err() {
        return Ok(());
    }
    tokio::spawn(async {
        let Some(fence) = FENCE.get() else { return };
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

impl Fence {
    /// One beat: what is left of the lease goes to the supervisor, and a stall or a lease run
    /// out is remembered as the reason the tasks stop.
    fn beat(&self) {
        let lease_ms = self.lease_ms.load(Ordering::Relaxed);
        if lease_ms == 0 || self.lease_until_ms.load(Ordering::Relaxed) == 0 {
            // No lease yet (not registered): the supervisor waits for one.
            self.last_beat_ms.store(self.now_ms(), Ordering::Relaxed);
            send(format_args!("h"));
            return;
        }
        if self.held.load(Ordering::Relaxed) > 0
            && let Some(why) = self.verdict()
        {
            tracing::warn!(%why, "the fence stops this worker's tasks");
            let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
            *stopped = Some((Instant::now(), why));
        }
        let now = self.now_ms();
        self.last_beat_ms.store(now, Ordering::Relaxed);
        let until = self.lease_until_ms.load(Ordering::Relaxed);
        let left = until.saturating_sub(now).min(lease_ms);
        send(format_args!("h{left}"));
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

fn send(line: std::fmt::Arguments<'_>) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let mut stdin = fence.stdin.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(error) = stdin.write_fmt(format_args!("{line}\n")) {
        tracing::error!(%error, "the fence supervisor is gone; tasks are no longer fenced");
    }
}

/// A command task's process group started.
pub(crate) fn hold(pgid: i32) {
    if let Some(fence) = FENCE.get() {
        fence.held.fetch_add(1, Ordering::Relaxed);
    }
    send(format_args!("+{pgid}"));
}

/// A command task's process group is gone.
pub(crate) fn release(pgid: i32) {
    if let Some(fence) = FENCE.get() {
        let _ = fence
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
    send(format_args!("-{pgid}"));
}

/// A task's cgroup, held by the fence while the task runs: the supervisor kills it whole with
/// the process groups; released (and the cgroup killed and removed) when dropped.
#[derive(Debug)]
pub(crate) struct HeldCgroup(crate::exec::TaskCgroup);

impl HeldCgroup {
    pub(crate) fn new(cgroup: crate::exec::TaskCgroup) -> HeldCgroup {
        send(format_args!("c{}", cgroup.path().display()));
        HeldCgroup(cgroup)
    }

    /// What the task's processes have used so far.
    pub(crate) fn usage(&self) -> crate::exec::CgroupUsage {
        self.0.usage()
    }
}

impl Drop for HeldCgroup {
    fn drop(&mut self) {
        // Killed (by the `TaskCgroup`'s drop, next) before the supervisor lets go of it.
        self.0.kill();
        send(format_args!("d{}", self.0.path().display()));
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
    let stopped = fence.stopped.lock().unwrap_or_else(|e| e.into_inner());
    // Recorded by a beat since the task started, or true now (the task's end may be seen
    // before the first beat after a stall).
    stopped
        .as_ref()
        .filter(|(at, _)| *at >= started)
        .map(|(_, why)| why.clone())
        .or_else(|| fence.verdict())
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
    fence.lease_ms.store(ms, Ordering::Relaxed);
    send(format_args!("l{ms}"));
}

/// The supervisor: reads the worker's lines until the pipe closes, killing every process group
/// it holds when the worker has been silent for a lease, and when the pipe closes.
pub fn supervise() {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The supervisor is the same program as the worker: renamed, so that `pkill escher-worker`
    // (which matches the process name) leaves it to do its job.
    let _ = nix::sys::prctl::set_name(c"escher-fence");
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    let mut cgroups: BTreeSet<std::path::PathBuf> = BTreeSet::new();
    let mut lease: Option<Duration> = None;
    // How long the supervisor waits for the next line before it kills.
    let mut wait: Option<Duration> = None;
    loop {
        let next = match wait {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(line) => match line.split_at_checked(1) {
                Some(("+", pgid)) => {
                    groups.extend(pgid.parse::<i32>().ok().filter(|p| *p > 1));
                }
                Some(("-", pgid)) => {
                    if let Ok(pgid) = pgid.parse::<i32>() {
                        groups.remove(&pgid);
                    }
                }
                Some(("c", path)) => {
                    cgroups.insert(path.into());
                }
                Some(("d", path)) => {
                    cgroups.remove(std::path::Path::new(path));
                }
                Some(("l", ms)) => {
                    lease = ms.parse().ok().map(Duration::from_millis);
                    wait = lease;
                }
                Some(("h", "")) => wait = lease,
                Some(("h", ms)) => {
                    // What is left of the worker's lease, never more than a lease of silence.
                    let left = ms.parse().ok().map(Duration::from_millis);
                    wait = match (left, lease) {
                        (Some(left), Some(lease)) => Some(left.min(lease)),
                        (left, lease) => left.or(lease),
                    };
                }
                _ => {}
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker's lease ran out, or it has been silent for \
                         {:?}; killing its {} task process group(s) before the head retries \
                         them elsewhere",
                        wait.unwrap_or_default(),
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups);
                // Until the next line: a process group that starts then is held, not killed.
                wait = lease;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker is gone; killing its {} task process group(s)",
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups);
                return;
            }
        }
    }
}

fn kill_all(groups: &mut BTreeSet<i32>, cgroups: &mut BTreeSet<std::path::PathBuf>) {
    for pgid in std::mem::take(groups) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // What left its process group is still in its cgroup.
    for cgroup in std::mem::take(cgroups) {
        crate::exec::kill_cgroup(&cgroup);
    }
}
