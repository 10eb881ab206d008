//! [`ExecError`]: everything that can go wrong while launching a command task or reading its logs.
//!
//! A command that starts and then fails is *not* an error: it is a
//! [`CommandOutcome`](super::CommandOutcome) with a non-zero exit code. Errors are the cases where
//! the executor could not do its job. [`ExecError::is_task_fault`] separates those caused by the
//! task's spec (fix the spec; retrying on another node will not help) from those caused by this
//! worker (its disk, its permissions), which another node may not have.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use super::logs::Stream;

/// An error of the command executor.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command spec had no program to run.
    #[error("the command is empty: argv needs at least the program to run")]
    EmptyArgv,

    /// The working directory named by the spec cannot be used.
    #[error(
        "working directory {path} cannot be used: {source}; give an existing directory on the worker's node"
    )]
    Cwd {
        /// The directory from the spec.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },

    /// The program could not be started: not found on `PATH`, not executable, ...
    #[error(
        "cannot start program `{program}`: {source}; check that it is installed on the worker's node, on PATH and executable"
    )]
    Spawn {
        /// `argv[0]`, as given.
        program: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },

    /// The task's cgroup could not be made, or its process not moved into it.
    #[error(
        "cannot contain the task in a cgroup of its own at {path}: {source}; the worker holds \
         every command in one (a cgroup v2 hierarchy it may write to)"
    )]
    Cgroup {
        /// The cgroup (or the worker's directory of them).
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },

    /// The log directory could not be created.
    #[error(
        "cannot create log directory {path}: {source}; check the worker's --log-dir and its permissions"
    )]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },

    /// A log file could not be created.
    #[error("cannot create log file {path}: {source}")]
    LogFile {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },

    /// Waiting for the child failed.
    #[error("cannot wait for the process of task {task_id}: {source}")]
    Wait {
        /// The task.
        task_id: u64,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },

    /// A signal could not be sent to the task's process group.
    #[error("cannot send {signal} to process group {pgid} of task {task_id}: {source}")]
    Signal {
        /// The task.
        task_id: u64,
        /// The process group (the id of the task's main process).
        pgid: i32,
        /// The signal's name, such as `SIGTERM`.
        signal: &'static str,
        /// The operating system's reason.
        #[source]
        source: Errno,
    },

    /// No log exists for this task (and attempt): unknown task, or one that never started here.
    #[error(
        "no {}log for task {task_id}{}",
        stream.map(|s| format!("{s} ")).unwrap_or_default(),
        attempt.map(|a| format!(" attempt {a}")).unwrap_or_default()
    )]
    LogNotFound {
        /// The task.
        task_id: u64,
        /// The attempt, when the caller named one.
        attempt: Option<u32>,
        /// The stream, when the caller named one.
        stream: Option<Stream>,
    },

    /// A log file exists but could not be read.
    #[error("cannot read log file {path}: {source}")]
    LogRead {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
}

impl ExecError {
    /// Whether the task's spec caused the error (empty argv, unusable working directory, program
    /// that cannot be started), as opposed to this worker or the caller.
    ///
    /// A spawn that failed for lack of resources on this node (processes, memory, file
    /// descriptors) is the worker's fault, not the task's.
    pub fn is_task_fault(&self) -> bool {
        match self {
            ExecError::EmptyArgv | ExecError::Cwd { .. } => true,
            ExecError::Spawn { source, .. } => !matches!(
                source.raw_os_error().map(Errno::from_raw),
                Some(Errno::EAGAIN | Errno::ENOMEM | Errno::EMFILE | Errno::ENFILE)
            ),
            _ => false,
        }
    }
}
