//! [`start_process`]: a long-lived process of the worker's that runs tasks' code (a Python
//! interpreter, which runs function tasks one after another, or an actor), started as a command
//! task is: by `spawn.rs` in one exec, born in its cgroup, as its user, with `no_new_privs`, in a
//! process group of its own and, where it has a private `/tmp`, in a mount namespace of its own
//! with its scratch bound over `/tmp`, `/var/tmp` and `/dev/shm` before it changes user. Where
//! the kernel has no pidfds (before Linux 5.3), through the standard library instead (a fork
//! that changes user, then a move into its cgroup), and then never with a private `/tmp`
//! ([`private_tmp_available`](super::private_tmp_available) is false there).

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use super::cgroup::TaskCgroup;

/// What to start.
#[derive(Debug)]
pub struct ProcessSpec<'a> {
    /// The program: a path (not looked up on `PATH`).
    pub program: &'a Path,
    /// Its arguments, after `argv[0]` (the program).
    pub args: Vec<OsString>,
    /// Its whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory (as it sees it: inside its private `/tmp` where it has one); the
    /// worker's if `None`.
    pub cwd: Option<&'a Path>,
    /// The uid (also the gid) it runs as; the worker's if `None`.
    pub uid: Option<u32>,
    /// Its standard input.
    pub stdin: BorrowedFd<'a>,
    /// Its standard output.
    pub stdout: BorrowedFd<'a>,
    /// Its standard error.
    pub stderr: BorrowedFd<'a>,
    /// The cgroup it runs in from its first instruction (moved in right after the spawn on
    /// the standard library's path).
    pub cgroup: Option<&'a TaskCgroup>,
    /// Its scratch, bound over `/tmp`, `/var/tmp` and `/dev/shm` in a mount namespace of its
    /// own; `None` leaves it the worker's.
    pub private_tmp: Option<&'a Path>,
}

/// A process [`start_process`] started. Dropped before it was reaped, it is SIGKILLed and
/// reaped.
#[derive(Debug)]
pub struct TaskProcess(Running);

#[derive(Debug)]
enum Running {
    Launched(super::spawn::Launched),
    Std(tokio::process::Child),
}

impl TaskProcess {
    /// Its pid (`None` once the standard library's child was reaped).
    pub fn id(&self) -> Option<u32> {
        match &self.0 {
            Running::Launched(child) => Some(child.id()),
            Running::Std(child) => child.id(),
        }
    }

    /// Waits for it to end, and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        match &mut self.0 {
            Running::Launched(child) => child.wait().await,
            Running::Std(child) => child.wait().await,
        }
    }

    /// SIGKILLs it, unless it has been reaped.
    pub fn start_kill(&mut self) {
        match &mut self.0 {
            Running::Launched(child) => child.start_kill(),
            Running::Std(child) => {
                let _ = child.start_kill();
            }
        }
    }
}

/// Why [`start_process`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Entering its cgroup (nothing of it ran).
    #[error("cannot enter its cgroup {path}: {source}")]
    Cgroup {
        /// The cgroup's directory.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// Anything else: the program, its directory, the user, its mounts, the system's resources.
    #[error("{0}")]
    Spawn(io::Error),
}

/// Starts `spec` (see the module's doc).
pub fn start_process(spec: &ProcessSpec<'_>) -> Result<TaskProcess, StartError> {
    if super::spawn::available() {
        return one_exec(spec).map(|c| TaskProcess(Running::Launched(c)));
    }
    if spec.private_tmp.is_some() {
        return Err(StartError::Spawn(io::Error::new(
            io::ErrorKind::Unsupported,
            "a private /tmp needs the one-exec spawn (pidfds, Linux 5.3)",
        )));
    }
    through_std(spec).map(|c| TaskProcess(Running::Std(c)))
}

fn c_string(bytes: &[u8]) -> Result<CString, StartError> {
    CString::new(bytes).map_err(|_| {
        StartError::Spawn(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        ))
    })
}

fn one_exec(spec: &ProcessSpec<'_>) -> Result<super::spawn::Launched, StartError> {
    let path = c_string(spec.program.as_os_str().as_bytes())?;
    let argv = std::iter::once(spec.program.as_os_str())
        .chain(spec.args.iter().map(OsString::as_os_str))
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = spec
        .env
        .iter()
        .map(|(key, value)| c_string(&[key.as_bytes(), b"=", value.as_bytes()].concat()))
        .collect::<Result<Vec<_>, _>>()?;
    let launch = super::spawn::Launch {
        path,
        argv,
        envp,
        cwd: spec
            .cwd
            .map(|c| c_string(c.as_os_str().as_bytes()))
            .transpose()?,
        uid: spec.uid,
        stdin: Some(spec.stdin),
        stdout: spec.stdout,
        stderr: spec.stderr,
        cgroups: spec.cgroup.map_or(&[][..], TaskCgroup::procs_fds),
        cgroup_dir: spec.cgroup.and_then(TaskCgroup::dir_fd),
        private_tmp: spec
            .private_tmp
            .map(|p| c_string(p.as_os_str().as_bytes()))
            .transpose()?,
    };
    super::spawn::spawn(&launch).map_err(|failed| match failed {
        super::spawn::Failed::Spawn(source) => StartError::Spawn(source),
        super::spawn::Failed::Cgroup(source) => StartError::Cgroup {
            path: spec
                .cgroup
                .map(|c| c.path().display().to_string())
                .unwrap_or_default(),
            source,
        },
    })
}

fn through_std(spec: &ProcessSpec<'_>) -> Result<tokio::process::Child, StartError> {
    use std::os::unix::process::CommandExt;
    let stdio = |fd: BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(Stdio::from)
            .map_err(StartError::Spawn)
    };
    let mut command = std::process::Command::new(spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(stdio(spec.stdin)?)
        .stdout(stdio(spec.stdout)?)
        .stderr(stdio(spec.stderr)?)
        .process_group(0);
    if let Some(cwd) = spec.cwd {
        command.current_dir(cwd);
    }
    if let Some(uid) = spec.uid {
        command.uid(uid).gid(uid);
    }
    let mut command = tokio::process::Command::from(command);
    let mut child = command
        .kill_on_drop(true)
        .spawn()
        .map_err(StartError::Spawn)?;
    if let (Some(cgroup), Some(pid)) = (spec.cgroup, child.id())
        && let Err(source) = cgroup.enter(pid)
    {
        let _ = child.start_kill();
        return Err(StartError::Cgroup {
            path: cgroup.path().display().to_string(),
            source,
        });
    }
    Ok(child)
}

/// A pipe, both ends close-on-exec (the child gets its end as a standard stream, which
/// `dup2` leaves open across its exec): (the read end, the write end).
#[allow(unsafe_code)]
pub fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1; 2];
    // SAFETY: pipe2(2) writes two new descriptors into `fds`, or fails.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the two descriptors are new and ours alone.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}
