//! How a command task ended: [`CommandOutcome`] (why) and [`ProcessExit`] (with what status).
//!
//! Exit codes follow the shell's convention, so that what a user sees in escher matches what
//! `echo $?` would have shown: a process killed by signal `N` reports code `128 + N`, and the
//! signal itself is kept alongside.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::Signal;

/// The exit status of a command's main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessExit {
    /// The exit code; `128 + signal` when a signal killed the process.
    pub code: i32,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
}

impl ProcessExit {
    /// A normal exit with `code`.
    pub fn exited(code: i32) -> Self {
        ProcessExit { code, signal: None }
    }

    /// Death by `signal`, reported with code `128 + signal`.
    pub fn killed_by(signal: i32) -> Self {
        ProcessExit {
            code: 128 + signal,
            signal: Some(signal),
        }
    }

    /// Whether the process exited by itself with code 0.
    pub fn success(&self) -> bool {
        self.code == 0 && self.signal.is_none()
    }

    /// The signal's name, such as `SIGKILL`, if a known signal killed the process.
    pub fn signal_name(&self) -> Option<&'static str> {
        self.signal
            .and_then(|s| Signal::try_from(s).ok())
            .map(Signal::as_str)
    }
}

impl From<ExitStatus> for ProcessExit {
    /// Converts a status from `wait`. A status with neither code nor signal (which `wait` does
    /// not produce) maps to code `-1`.
    fn from(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => ProcessExit::exited(code),
            (None, Some(signal)) => ProcessExit::killed_by(signal),
            (None, None) => ProcessExit::exited(-1),
        }
    }
}

impl fmt::Display for ProcessExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.signal, self.signal_name()) {
            (None, _) => write!(f, "exit code {}", self.code),
            (Some(_), Some(name)) => write!(f, "killed by {name} (exit code {})", self.code),
            (Some(n), None) => write!(f, "killed by signal {n} (exit code {})", self.code),
        }
    }
}

/// Why a command task ended, and the status its main process ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandOutcome {
    /// The process ended by itself (exit, or a signal nobody in escher sent).
    Exited(ProcessExit),
    /// The task's timeout passed; the executor stopped the process group.
    TimedOut(ProcessExit),
    /// The task was cancelled; the executor stopped the process group.
    Cancelled(ProcessExit),
    /// The kernel's OOM killer killed a process of the task in its memory cgroup: the task
    /// went past its memory limit, `limit` bytes, and fails however its main process ended
    /// (on a v2 hierarchy the kernel kills the whole task, `memory.oom.group`; on v1 one
    /// process, and the main process may have carried on).
    MemoryExceeded {
        /// How the main process ended.
        exit: ProcessExit,
        /// The task's memory limit, in bytes.
        limit: u64,
    },
}

impl CommandOutcome {
    /// The main process's exit status, whatever the reason it ended.
    pub fn exit(&self) -> ProcessExit {
        match *self {
            CommandOutcome::Exited(e)
            | CommandOutcome::TimedOut(e)
            | CommandOutcome::Cancelled(e)
            | CommandOutcome::MemoryExceeded { exit: e, .. } => e,
        }
    }

    /// Whether the command succeeded: it ended by itself with code 0.
    pub fn success(&self) -> bool {
        matches!(self, CommandOutcome::Exited(e) if e.success())
    }
}

impl fmt::Display for CommandOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandOutcome::Exited(e) => write!(f, "{e}"),
            CommandOutcome::TimedOut(e) => write!(f, "timed out, {e}"),
            CommandOutcome::Cancelled(e) => write!(f, "cancelled, {e}"),
            CommandOutcome::MemoryExceeded { exit, limit } => {
                f.write_str(&memory_exceeded(*limit, exit))
            }
        }
    }
}

/// Why a task that went past its memory limit of `limit` bytes failed, `how` saying what the
/// kernel's OOM killer ended (a command's exit status; a Python interpreter's): the reason
/// command tasks, Python tasks and Python actors all fail with.
pub fn memory_exceeded(limit: u64, how: &dyn fmt::Display) -> String {
    format!(
        "exceeded its memory request of {}: the kernel's out-of-memory killer ended it in its \
         cgroup ({how}); ask for more memory",
        bytes(limit)
    )
}

/// `n` bytes as a person reads them: whole MiB or GiB where they are, else bytes.
fn bytes(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    match n {
        n if n >= 1024 * MIB && n % (1024 * MIB) == 0 => format!("{} GiB", n / (1024 * MIB)),
        n if n >= MIB && n % MIB == 0 => format!("{} MiB", n / MIB),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_shell_convention() {
        // Raw wait statuses: exit code in bits 8..16, terminating signal in bits 0..7.
        assert_eq!(
            ProcessExit::from(ExitStatus::from_raw(3 << 8)),
            ProcessExit::exited(3)
        );
        let killed = ProcessExit::from(ExitStatus::from_raw(9));
        assert_eq!(
            killed,
            ProcessExit {
                code: 137,
                signal: Some(9)
            }
        );
        assert_eq!(killed.to_string(), "killed by SIGKILL (exit code 137)");
        assert_eq!(ProcessExit::exited(1).to_string(), "exit code 1");
    }

    #[test]
    fn only_a_clean_exit_is_success() {
        assert!(CommandOutcome::Exited(ProcessExit::exited(0)).success());
        assert!(!CommandOutcome::Exited(ProcessExit::exited(2)).success());
        assert!(!CommandOutcome::TimedOut(ProcessExit::exited(0)).success());
        assert!(!CommandOutcome::Cancelled(ProcessExit::killed_by(15)).success());
        assert_eq!(
            CommandOutcome::TimedOut(ProcessExit::killed_by(15)).to_string(),
            "timed out, killed by SIGTERM (exit code 143)"
        );
        let oom = CommandOutcome::MemoryExceeded {
            exit: ProcessExit::killed_by(9),
            limit: 64 * 1024 * 1024,
        };
        assert!(!oom.success());
        assert_eq!(
            oom.to_string(),
            "exceeded its memory request of 64 MiB: the kernel's out-of-memory killer ended it \
             in its cgroup (killed by SIGKILL (exit code 137)); ask for more memory"
        );
        assert_eq!(bytes(3 * 1024 * 1024 * 1024), "3 GiB");
        assert_eq!(bytes(1000), "1000 bytes");
    }
}
