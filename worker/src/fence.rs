//! Fencing: a task never runs on two nodes at once because its worker died or stopped.
//!
//! When a worker is SIGKILLed, its command tasks (each the leader of its own process group)
//! are orphaned and keep running; when it is SIGSTOPped, they keep running while it is frozen.
//! Either way the head, hearing nothing, declares the node lost after its heartbeat timeout and
//! retries the tasks elsewhere: without fencing, both attempts run.
//!
//! `escher-worker` therefore starts a **supervisor**: a second process (the same binary, run as
//! `escher-worker __escher-fence`) in a process group of its own, connected to the worker by a
//! pipe. The worker writes one short line per event:
//!
//! - `+PGID` when a command task's process group starts, `-PGID` when it is gone;
//! - `lMILLIS`, the lease: half the head's heartbeat timeout, learnt at each registration;
//! - `h`, a heartbeat, several times per lease, from a task on the worker's own runtime.
//!
//! The supervisor SIGKILLs every process group it holds when the pipe closes (the worker has
//! exited, however it died) and when no line has arrived for a lease (the worker is stopped or
//! wedged). Since the lease is half the head's timeout, the task processes are gone before the
//! head can start a retry. A worker that resumes finds its tasks killed and reports them so; the
//! head counts such an attempt as failed (retried under `max_retries`) or, if it already
//! declared the node lost, ignores the report.
//!
//! What this does not cover: a worker that keeps running but cannot reach the head (a network
//! partition) keeps its tasks, so a task may run again elsewhere while the first attempt is
//! still running; a task that leaves its process group (`setsid`) escapes the kill; and the
//! instant between a task's spawn and its `+PGID` line (if the worker dies exactly then). A
//! worker embedded in another process (a `LocalCluster`, the library) starts no supervisor:
//! its tasks live and die with that process's runtime.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::Duration;

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
    };
    if FENCE.set(fence).is_err() {
        return Ok(());
    }
    tokio::spawn(async {
        loop {
            beat();
            let lease = Duration::from_millis(lease_ms());
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

fn lease_ms() -> u64 {
    FENCE
        .get()
        .map_or(0, |f| f.lease_ms.load(Ordering::Relaxed))
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
    send(format_args!("+{pgid}"));
}

/// A command task's process group is gone.
pub(crate) fn release(pgid: i32) {
    send(format_args!("-{pgid}"));
}

/// The head said after how long without a heartbeat it declares the node lost: the fence's
/// lease is half of it.
pub(crate) fn set_timeout(head_timeout: Duration) {
    let Some(fence) = FENCE.get() else {
        return;
    };
    let lease = (head_timeout / 2).max(Duration::from_millis(50));
    let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    fence.lease_ms.store(ms, Ordering::Relaxed);
    send(format_args!("l{ms}"));
}

fn beat() {
    send(format_args!("h"));
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
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    let mut lease: Option<Duration> = None;
    loop {
        let next = match lease {
            Some(lease) => rx.recv_timeout(lease),
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
                Some(("l", ms)) => {
                    lease = ms.parse().ok().map(Duration::from_millis);
                }
                _ => {}
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker has been silent for {:?}; killing its {} \
                         task process group(s) before the head retries them elsewhere",
                        lease.unwrap_or_default(),
                        groups.len()
                    );
                }
                kill_all(&mut groups);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker is gone; killing its {} task process group(s)",
                        groups.len()
                    );
                }
                kill_all(&mut groups);
                return;
            }
        }
    }
}

fn kill_all(groups: &mut BTreeSet<i32>) {
    for pgid in std::mem::take(groups) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}
