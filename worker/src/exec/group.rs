//! [`ProcessGroup`]: signals for a command task's whole process group, and a guard that kills it.
//!
//! Every command runs as the leader of a new process group, so one `killpg` reaches the
//! program and everything it started (shell pipelines, `&` jobs, launchers' workers), unless a
//! descendant deliberately left the group with `setsid`/`setpgid`.
//!
//! The guard SIGKILLs the group when dropped while armed: if the future running a command is
//! dropped (its caller gave up, the worker shuts down), nothing of the task outlives it. If the
//! worker itself is SIGKILLed or stopped, its fence supervisor kills the group
//! (`crate::fence`), which every group is registered with while it lives.
//!
//! After the leader has been reaped, [`ProcessGroup::sweep`] kills what is left of the group.
//! Processes left in the group keep its id from being reused, so the signal reaches only them;
//! if none is left, the id could in principle be reused by an unrelated new group leader between
//! the reap and the sweep, which needs the kernel to wrap around the whole pid space in that
//! window.

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::error::ExecError;

/// The process group of one running command, led by its main process.
#[derive(Debug)]
pub(super) struct ProcessGroup {
    task_id: u64,
    /// `None` only if the child had no pid, which tokio gives only after reaping it.
    pgid: Option<Pid>,
    /// Whether dropping the guard SIGKILLs the group.
    armed: bool,
}

impl ProcessGroup {
    /// The group led by the process with id `leader`, armed.
    pub(super) fn new(task_id: u64, leader: Option<u32>) -> Self {
        let pgid = leader
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        if let Some(pgid) = pgid {
            crate::fence::hold(pgid.as_raw());
        }
        ProcessGroup {
            task_id,
            pgid,
            armed: true,
        }
    }

    /// Sends `signal` to every process in the group; a group that is already gone is fine.
    pub(super) fn signal(&self, signal: Signal) -> Result<(), ExecError> {
        let Some(pgid) = self.pgid else {
            return Ok(());
        };
        match killpg(pgid, signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(source) => Err(ExecError::Signal {
                task_id: self.task_id,
                pgid: pgid.as_raw(),
                signal: signal.as_str(),
                source,
            }),
        }
    }

    /// Once the leader has been reaped: SIGKILLs whatever is left of the group, and disarms.
    pub(super) fn sweep(&mut self) {
        self.armed = false;
        let Some(pgid) = self.pgid else {
            return;
        };
        let swept = killpg(pgid, Signal::SIGKILL);
        crate::fence::release(pgid.as_raw());
        match swept {
            Ok(()) => tracing::debug!(
                task_id = self.task_id,
                pgid = pgid.as_raw(),
                "killed processes the task left behind"
            ),
            Err(Errno::ESRCH) => {}
            Err(error) => tracing::warn!(
                task_id = self.task_id,
                pgid = pgid.as_raw(),
                %error,
                "cannot kill processes the task left behind"
            ),
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.armed
            && let Some(pgid) = self.pgid
        {
            // Best effort: there is no one left to report a failure to.
            let _ = killpg(pgid, Signal::SIGKILL);
            crate::fence::release(pgid.as_raw());
        }
    }
}
