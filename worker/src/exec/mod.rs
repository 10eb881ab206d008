//! The command-task executor: runs a command task's attempt as a child process and serves its
//! logs. It does no networking; the worker runtime calls it and reports what it returns.
//!
//! - [`run_command`] runs one attempt to its end, in its own process group, with its output in
//!   log files, stopping it on timeout or cancellation (`command.rs`).
//! - [`read_log`] reads those logs back, [`AttemptLogs`] holds an attempt's files and reads
//!   the end of their output, [`sweep_logs`] removes old ones (`logs.rs`).
//! - [`CommandOutcome`] and [`ProcessExit`] say how a command ended, [`memory_exceeded`] why
//!   a task that went past its memory limit failed (`outcome.rs`).
//! - [`Isolation`] keeps tasks apart: the environment they start with, the user they run as
//!   (`isolation.rs`).
//! - [`TaskLimits`] is what a task may use (CPU, memory, processes), held in its cgroups (a
//!   command's, or the Python interpreter that runs it);
//!   [`Enforcement`] says which of them this host holds (`limits.rs`).
//! - [`DiskReserve`] keeps free space on the worker's file systems (`--disk-reserve`,
//!   `disk.rs`); [`Scratch`] gives each command task a size-limited directory of its own,
//!   gone when it ends, which is also its `/tmp`, `/var/tmp` and `/dev/shm` (`scratch.rs`).
//! - [`ExecError`] is what can go wrong (`error.rs`).
//!
//! Unix only: it relies on process groups and signals.

mod cgroup;
mod cgroup_pool;
mod command;
mod disk;
mod error;
mod group;
mod isolation;
mod limits;
mod logs;
mod outcome;
mod scratch;
mod spawn;

pub use cgroup::{
    CgroupUsage, Hierarchy, OomWatch, TaskCgroup, TaskCgroups, kill_cgroup,
    populated as cgroup_populated,
};
pub use command::{
    CommandSpec, DEFAULT_GRACE, LOG_CAP_EVERY, LaunchOptions, OnSpawn, UsageSend, UsageSink,
    run_command,
};
pub use disk::{
    CHECK_EVERY, DEFAULT_DISK_RESERVE, DISK_LABEL, DISK_RESERVE_LABEL, DISK_SCRATCH_LABEL,
    DiskReserve, Reserve, Space, space_of,
};
pub use error::ExecError;
pub use isolation::{
    DEFAULT_TASK_UIDS, Isolation, PASSED_ENV, TaskUser, TaskUsers, UidRange, UserPool,
    task_base_env,
};
pub use limits::{
    Controller, DEFAULT_TASK_PIDS_MAX, Enforcement, LIMITS_LABEL, LIMITS_MISSING_LABEL,
    LimitPolicy, MIN_UNREQUESTED_MEMORY, MemoryHeld, MemoryLedger, TaskLimits,
};
pub use logs::{
    AttemptLogs, CLUSTER_MARKER, DEFAULT_TASK_LOG_BYTES, LogChunk, LogRetention, MAX_LOG_CHUNK,
    Stream, Swept, claim_log_dir, log_path, read_log, sweep_logs,
};
pub use outcome::{CommandOutcome, ProcessExit, memory_exceeded};
pub use scratch::{
    DEFAULT_TASK_SCRATCH_BYTES, PRIVATE_TMP_HOME, Scratch, TMP_LABEL, TaskScratch,
    private_tmp_available,
};
