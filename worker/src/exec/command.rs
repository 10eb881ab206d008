//! [`run_command`]: runs one attempt of a command task as a child process, to its end.
//!
//! The child gets its own process group, `/dev/null` as stdin, and its stdout and stderr
//! redirected straight into the attempt's log files (see [`log_path`](super::log_path)): files,
//! not pipes, so a chatty child never blocks on a reader and its output survives the worker. It
//! inherits nothing of the worker's environment: it gets the options' `base_env` (the few
//! variables [`task_base_env`](super::task_base_env) keeps), then the spec's `env`, then the
//! worker's `extra_env`, the last winning, so that a spec cannot override what the worker sets
//! (`ESCHER_TASK_ID`, `CUDA_VISIBLE_DEVICES`, ...). Given a [`TaskUser`], it runs as that user,
//! in that user's directory unless the spec names another.
//!
//! ```text
//!   spawn ──► running ──exit──────────────────────────────► Exited(status)
//!                │
//!                ├─timeout──┐
//!                └─cancel───┴► SIGTERM group ─exit within grace─► TimedOut / Cancelled(status)
//!                                    └─grace passes─► SIGKILL group ─► TimedOut / Cancelled(status)
//! ```
//!
//! Whichever way the main process ends, what it left running in its group is then SIGKILLed,
//! and dropping the future before the end SIGKILLs the whole group (see `group.rs`).
//!
//! Its cgroup holds it to the options' [`TaskLimits`]; a command whose process the kernel's
//! OOM killer killed there ends as [`CommandOutcome::MemoryExceeded`]. Each log stream is held
//! to `log_bytes` ([`AttemptLogs::cap`], checked every [`LOG_CAP_EVERY`] and at the end).
//!
//! The command starts in one exec (`spawn.rs`): a child that shares the worker's memory until
//! it executes the program, and before that enters the task's cgroup, changes to the task's
//! user and sets `no_new_privs`, so that no exec of the task can gain privileges (a set-uid or
//! set-gid program, file capabilities) and nothing of it ever runs outside its cgroup or as
//! the worker's user. A kernel without pidfds (before Linux 5.3) gets the standard library's
//! spawn instead: there `no_new_privs` is set on the spawning thread, once ([`no_new_privs`]),
//! the user changed through `setpriv` (a second exec) or a forked child, and the cgroup entered
//! from outside right after the spawn.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::error::ExecError;
use super::group::ProcessGroup;
use super::isolation::TaskUser;
use super::limits::TaskLimits;
use super::logs::{AttemptLogs, CreatedLogs};
use super::outcome::{CommandOutcome, ProcessExit};
use super::scratch::PRIVATE_TMP_HOME;

/// How long a command gets between SIGTERM and SIGKILL, unless told otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// How often a running command's logs are held to their cap: what a task writes in this time
/// past the cap is on the disk until the next check cuts it.
pub const LOG_CAP_EVERY: Duration = Duration::from_millis(100);

/// What to run: the command part of a task spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandSpec {
    /// Program and arguments; `argv[0]` is looked up on `PATH` (the child's, if `env` sets one).
    pub argv: Vec<String>,
    /// Environment variables added to the worker's own.
    pub env: Vec<(String, String)>,
    /// Working directory; the worker's own if `None`.
    pub cwd: Option<PathBuf>,
}

impl CommandSpec {
    /// A spec that runs `argv` with no extra environment in the worker's directory.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        CommandSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
}

/// Called once a command's process is spawned (the worker times its tasks' starts with it).
#[derive(Clone)]
pub struct OnSpawn(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnSpawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnSpawn")
    }
}

/// How the worker launches commands: where logs go, what it adds, how long it waits.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Directory for the log files; created if missing.
    pub log_dir: PathBuf,
    /// The variables every command starts with, before the spec's (none of the worker's own
    /// environment is passed otherwise).
    pub base_env: Vec<(String, String)>,
    /// Environment variables set by the worker; they override the spec's.
    pub extra_env: Vec<(String, String)>,
    /// The user to run as, `None` for the worker's own.
    pub user: Option<TaskUser>,
    /// How long the command may run before it is stopped; `None` for no limit.
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when stopping the command.
    pub grace: Duration,
    /// Cancelled when the stop is to skip the grace: the command's group is killed
    /// (SIGKILL) at once, or as soon as it is cancelled during the grace (a forced cancel,
    /// `escher cancel --force`). `None`: every stop gives the grace.
    pub force: Option<CancellationToken>,
    /// Called once the process is spawned.
    pub on_spawn: Option<OnSpawn>,
    /// Where each command gets a cgroup of its own, killed whole; `None`: the process group
    /// only.
    pub cgroups: Option<Arc<super::TaskCgroups>>,
    /// Where what a command in a cgroup uses is sent while it runs; `None`: nowhere.
    pub usage: Option<UsageSink>,
    /// What the command may use, written into its cgroup (without cgroups, nothing holds it).
    pub limits: TaskLimits,
    /// The most bytes each of its log streams keeps; `None` for no cap.
    pub log_bytes: Option<u64>,
    /// The reserve of the node's disk: while under it, the log streams stop where they are.
    pub disk: Option<Arc<super::DiskReserve>>,
    /// The command's scratch, bound over `/tmp`, `/var/tmp` and `/dev/shm` in a mount
    /// namespace of its own, which is then its `HOME` and default working directory as
    /// `/tmp` (see [`private_tmp_available`](super::private_tmp_available)); `None`: the
    /// worker's mounts.
    pub private_tmp: Option<PathBuf>,
}

/// What a command's processes used so far, sent while it runs (see [`UsageSink`]).
pub type UsageSend = Arc<
    dyn Fn(super::CgroupUsage, bool) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// Where the resource use of a command in a cgroup is sent: every `every` while it runs, and
/// once more when it ends (`true`; awaited before the command's outcome is returned, so that it
/// reaches the head while the attempt still runs), for a command that ran at least `every`: a
/// short command sends nothing.
#[derive(Clone)]
pub struct UsageSink {
    /// Between two samples.
    pub every: Duration,
    /// Sends one sample (`true`: the last).
    pub send: UsageSend,
}

impl std::fmt::Debug for UsageSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageSink")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

impl LaunchOptions {
    /// Options that log into `log_dir`, start commands with the variables of the worker's
    /// environment that [`task_base_env`](super::task_base_env) keeps, as the worker's user,
    /// add nothing, set no timeout and give [`DEFAULT_GRACE`].
    pub fn new(log_dir: impl Into<PathBuf>) -> Self {
        LaunchOptions {
            log_dir: log_dir.into(),
            base_env: super::task_base_env(std::env::vars(), &[]),
            extra_env: Vec::new(),
            user: None,
            timeout: None,
            grace: DEFAULT_GRACE,
            force: None,
            on_spawn: None,
            cgroups: None,
            usage: None,
            limits: TaskLimits::none(),
            log_bytes: None,
            disk: None,
            private_tmp: None,
        }
    }

    /// Binds `scratch` over the command's `/tmp`, `/var/tmp` and `/dev/shm` (see
    /// [`LaunchOptions::private_tmp`]).
    pub fn private_tmp(mut self, scratch: Option<PathBuf>) -> Self {
        self.private_tmp = scratch;
        self
    }

    /// Stops each command's log streams where they are while `disk` is under its reserve.
    pub fn disk(mut self, disk: Option<Arc<super::DiskReserve>>) -> Self {
        self.disk = disk;
        self
    }

    /// Holds each command to `limits` in its cgroup.
    pub fn limits(mut self, limits: TaskLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Keeps at most `bytes` of each of a command's log streams (`None`: all of them).
    pub fn log_bytes(mut self, bytes: Option<u64>) -> Self {
        self.log_bytes = bytes;
        self
    }

    /// Sends what each command in a cgroup uses to `sink` while it runs.
    pub fn usage(mut self, sink: Option<UsageSink>) -> Self {
        self.usage = sink;
        self
    }

    /// Gives each command a cgroup of its own under `cgroups`.
    pub fn cgroups(mut self, cgroups: Option<Arc<super::TaskCgroups>>) -> Self {
        self.cgroups = cgroups;
        self
    }

    /// Calls `f` once the process is spawned.
    pub fn on_spawn(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_spawn = Some(OnSpawn(Arc::new(f)));
        self
    }

    /// Adds an environment variable that overrides the spec's.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_env.push((key.into(), value.into()));
        self
    }

    /// Runs commands as `user`, in its directory unless the spec names another.
    pub fn user(mut self, user: Option<TaskUser>) -> Self {
        self.user = user;
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the grace period between SIGTERM and SIGKILL.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Skips the grace of a stop once `force` is cancelled (see [`LaunchOptions::force`]).
    pub fn force(mut self, force: CancellationToken) -> Self {
        self.force = Some(force);
        self
    }
}

/// Runs attempt `attempt` of command task `task_id` to its end.
///
/// Returns when the command's main process has ended: by itself ([`CommandOutcome::Exited`]),
/// or stopped by the executor after `opts.timeout` ([`CommandOutcome::TimedOut`]) or after
/// `cancel` fired ([`CommandOutcome::Cancelled`]), with the attempt's log files to read the end
/// of its output from. A command that fails is an outcome, not an error; errors are for a
/// command that could not be started or watched (see [`ExecError`]).
#[tracing::instrument(skip_all, fields(task_id = task_id, attempt = attempt))]
pub async fn run_command(
    task_id: u64,
    attempt: u32,
    spec: &CommandSpec,
    opts: &LaunchOptions,
    cancel: CancellationToken,
) -> Result<(CommandOutcome, AttemptLogs), ExecError> {
    let (program, args) = spec.argv.split_first().ok_or(ExecError::EmptyArgv)?;
    if let Some(cwd) = &spec.cwd {
        check_cwd(cwd).await?;
    }
    let (mut logs, stdout, stderr) = open_logs(&opts.log_dir, task_id, attempt).await?;
    // Made before the spawn, so that a task is never started uncontained by a cgroup that
    // could not be made.
    let cgroup = match &opts.cgroups {
        Some(cgroups) => {
            Some(
                cgroups
                    .create_limited(&opts.limits)
                    .map_err(|source| ExecError::Cgroup {
                        path: cgroups.root().to_path_buf(),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let oom = cgroup.as_ref().and_then(super::TaskCgroup::oom_watch);
    let mut child = if super::spawn::available() {
        // In one exec, already in its cgroup (see `spawn.rs`).
        let child = spawn_in_one_exec(program, spec, opts, &stdout, &stderr, cgroup.as_ref());
        // The child has its copies of the log files; the worker keeps only `logs`' while it
        // runs.
        drop((stdout, stderr));
        Running::Launched(child?)
    } else {
        Running::Std(spawn_through_std(
            program,
            args,
            spec,
            opts,
            stdout,
            stderr,
            cgroup.as_ref(),
        )?)
    };
    // The fence holds the cgroup from now on.
    let _cgroup = cgroup.map(crate::fence::HeldCgroup::new);
    if let Some(OnSpawn(f)) = &opts.on_spawn {
        f();
    }
    let mut group = ProcessGroup::new(task_id, child.id());
    tracing::debug!(pid = child.id(), %program, "command started");

    let deadline = async {
        match opts.timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    // Samples of what its cgroup uses, while it runs.
    let sink = opts.usage.as_ref().zip(_cgroup.as_ref());
    let mut samples = sink.map(|(sink, _)| {
        let mut timer = tokio::time::interval(sink.every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.reset();
        timer
    });
    let mut sampled = false;
    let mut log_checks = opts.log_bytes.map(|_| {
        let mut timer = tokio::time::interval(LOG_CAP_EVERY);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.reset();
        timer
    });
    tokio::pin!(deadline);
    // An exit that is already there wins over a cancellation or timeout that is too.
    let stop_as: fn(ProcessExit) -> CommandOutcome = loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let exit = reaped(status, task_id, &mut group)?;
                tracing::debug!(%exit, "command exited");
                if let (Some((sink, cgroup)), true) = (sink, sampled) {
                    (sink.send)(cgroup.usage(), true).await;
                }
                // Read while the task still holds its cgroup.
                let exceeded = oom.as_ref().and_then(|w| w.exceeded_after(exit.success()));
                let outcome = match exceeded {
                    Some(limit) => CommandOutcome::MemoryExceeded { exit, limit },
                    None => CommandOutcome::Exited(exit),
                };
                cap_logs(&mut logs, opts.log_bytes, opts.disk.as_deref());
                return Ok((outcome, logs));
            }
            () = cancel.cancelled() => break CommandOutcome::Cancelled,
            () = &mut deadline => break CommandOutcome::TimedOut,
            () = next_sample(&mut samples), if samples.is_some() => {
                if let Some((sink, cgroup)) = sink {
                    sampled = true;
                    tokio::spawn((sink.send)(cgroup.usage(), false));
                }
            }
            () = next_sample(&mut log_checks), if log_checks.is_some() => {
                cap_logs(&mut logs, opts.log_bytes, opts.disk.as_deref());
            }
        }
    };
    let force = opts.force.clone().unwrap_or_default();
    let outcome = stop_as(stop(&mut child, &mut group, task_id, opts.grace, &force).await?);
    cap_logs(&mut logs, opts.log_bytes, opts.disk.as_deref());
    if let (Some((sink, cgroup)), true) = (sink, sampled) {
        (sink.send)(cgroup.usage(), true).await;
    }
    tracing::debug!(%outcome, "command stopped");
    Ok((outcome, logs))
}

/// A running command's main process: started in one exec by `spawn.rs`, or through the
/// standard library where this kernel has no pidfds.
enum Running {
    Launched(super::spawn::Launched),
    Std(Child),
}

impl Running {
    fn id(&self) -> Option<u32> {
        match self {
            Running::Launched(child) => Some(child.id()),
            Running::Std(child) => child.id(),
        }
    }

    async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        match self {
            Running::Launched(child) => child.wait().await,
            Running::Std(child) => child.wait().await,
        }
    }
}

/// Starts the command with `spawn.rs`: one exec, in its cgroup, as its user.
fn spawn_in_one_exec(
    program: &str,
    spec: &CommandSpec,
    opts: &LaunchOptions,
    stdout: &std::fs::File,
    stderr: &std::fs::File,
    cgroup: Option<&super::TaskCgroup>,
) -> Result<super::spawn::Launched, ExecError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let spawn_error = |source| ExecError::Spawn {
        program: program.to_owned(),
        source,
    };
    let c_string = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| {
            spawn_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            ))
        })
    };
    // Found as execvp would: in the PATH the child gets, else the worker's.
    let path = match resolve_in_child_path(program, spec, opts) {
        Some(path) => path,
        None if program.contains('/') => PathBuf::from(program),
        None => which::which(program)
            .map_err(|_| spawn_error(io::Error::from_raw_os_error(nix::libc::ENOENT)))?,
    };
    let argv = spec
        .argv
        .iter()
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    // The last of each name wins: the base, the spec's, the worker's, then the user's HOME.
    let mut env: std::collections::BTreeMap<&str, &std::ffi::OsStr> = Default::default();
    for (key, value) in opts.base_env.iter().chain(&spec.env).chain(&opts.extra_env) {
        env.insert(key, std::ffi::OsStr::new(value));
    }
    // With a private `/tmp`, its scratch is there: its home as the task sees it.
    let home = match (&opts.private_tmp, &opts.user) {
        (Some(_), _) => Some(Path::new(PRIVATE_TMP_HOME)),
        (None, Some(user)) => Some(user.home.as_path()),
        (None, None) => None,
    };
    if let Some(home) = home {
        env.insert("HOME", home.as_os_str());
    }
    let envp = env
        .into_iter()
        .map(|(key, value)| c_string(&[key.as_bytes(), b"=", value.as_bytes()].concat()))
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = spec.cwd.as_deref().or(home);
    // Its cgroups' `cgroup.procs`, kept open by the pool between tasks.
    let cgroups = cgroup.map_or(&[][..], super::TaskCgroup::procs_fds);
    let launch = super::spawn::Launch {
        path: c_string(path.as_os_str().as_bytes())?,
        argv,
        envp,
        cwd: cwd
            .map(|c| c_string(c.as_os_str().as_bytes()))
            .transpose()?,
        uid: opts.user.as_ref().map(|u| u.uid),
        stdout,
        stderr,
        cgroups,
        cgroup_dir: cgroup.and_then(super::TaskCgroup::dir_fd),
        private_tmp: opts
            .private_tmp
            .as_ref()
            .map(|scratch| c_string(scratch.as_os_str().as_bytes()))
            .transpose()?,
    };
    super::spawn::spawn(&launch).map_err(|failed| match failed {
        super::spawn::Failed::Spawn(source) => spawn_error(source),
        super::spawn::Failed::Cgroup(source) => ExecError::Cgroup {
            path: cgroup.map_or_else(PathBuf::new, |c| c.path().to_path_buf()),
            source,
        },
    })
}

/// Starts the command through the standard library (a kernel without pidfds): with
/// `posix_spawn`, through `setpriv` to change user where the machine has it, else with a fork;
/// then moves it into its cgroup.
fn spawn_through_std(
    program: &String,
    args: &[String],
    spec: &CommandSpec,
    opts: &LaunchOptions,
    stdout: std::fs::File,
    stderr: std::fs::File,
    cgroup: Option<&super::TaskCgroup>,
) -> Result<Child, ExecError> {
    let switch = opts
        .user
        .as_ref()
        .and_then(|u| Some((u.uid, u.switch.as_ref()?)));
    let mut command = match (switch, resolve_in_child_path(program, spec, opts)) {
        // Through `setpriv`, which changes user and executes the program: the program is found
        // here first, so that one found nowhere is the spawn error it always was.
        (Some((uid, setpriv)), resolved) => {
            let spawn_error = |source| ExecError::Spawn {
                program: program.clone(),
                source,
            };
            let target = match resolved {
                Some(path) => path,
                None if program.contains('/') => PathBuf::from(program),
                None => which::which(program)
                    .map_err(|_| spawn_error(io::Error::from(io::ErrorKind::NotFound)))?,
            };
            // What exec would refuse, refused here with the same error, rather than as
            // setpriv's exit code.
            use std::os::unix::fs::PermissionsExt;
            let meta = std::fs::metadata(&target).map_err(spawn_error)?;
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                return Err(spawn_error(io::Error::from(
                    io::ErrorKind::PermissionDenied,
                )));
            }
            let mut command = Command::new(setpriv);
            let id = uid.to_string();
            command
                .args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
                .arg(target);
            command
        }
        (None, Some(resolved)) => {
            let mut command = Command::new(resolved);
            command.arg0(program);
            command
        }
        (None, None) => Command::new(program),
    };
    command
        .args(args)
        .env_clear()
        .envs(opts.base_env.iter().map(|(k, v)| (k, v)))
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .envs(opts.extra_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    if let Some(user) = &opts.user {
        if user.switch.is_none() {
            // The standard library drops the supplementary groups too (setgroups) before
            // setuid.
            command.uid(user.uid).gid(user.uid);
        }
        command.env("HOME", &user.home).current_dir(&user.home);
    }
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    no_new_privs().map_err(|source| ExecError::Spawn {
        program: program.clone(),
        source,
    })?;
    let mut child = command.spawn().map_err(|source| ExecError::Spawn {
        program: program.clone(),
        source,
    })?;
    // Into its cgroup before it can have started anything (see `cgroup.rs`).
    if let (Some(cgroup), Some(pid)) = (cgroup, child.id())
        && let Err(source) = cgroup.enter(pid)
    {
        let _ = child.start_kill();
        return Err(ExecError::Cgroup {
            path: cgroup.path().to_path_buf(),
            source,
        });
    }
    Ok(child)
}

/// Holds the logs to `max` bytes a stream, if there is a cap. A failure is logged: the output
/// is the task's, the cap the worker's disk's, and neither is a reason to stop the task.
fn cap_logs(logs: &mut AttemptLogs, max: Option<u64>, disk: Option<&super::DiskReserve>) {
    let stop = disk.and_then(|d| d.low()).map(|why| {
        format!("the node's disk is under its reserve ({why}); the worker stopped its logs")
    });
    if let Some(max) = max
        && let Err(error) = logs.hold(max, stop.as_deref())
    {
        tracing::warn!(%error, max, "cannot hold a task's log to its cap");
    }
}

/// Sets `no_new_privs` on the calling thread, once: every process it spawns from now on
/// inherits it, and no exec of theirs gains privileges (see the module's doc).
pub(super) fn no_new_privs() -> io::Result<()> {
    thread_local! {
        static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if SET.get() {
        return Ok(());
    }
    nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)?;
    SET.set(true);
    Ok(())
}

/// Waits for the next sample's time (never, without a timer).
async fn next_sample(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(timer) => {
            timer.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Stops a running command: SIGTERM to its group, then SIGKILL if `grace` passes first; with
/// `force` cancelled (before or during the grace), SIGKILL at once.
async fn stop(
    child: &mut Running,
    group: &mut ProcessGroup,
    task_id: u64,
    grace: Duration,
    force: &CancellationToken,
) -> Result<ProcessExit, ExecError> {
    if !force.is_cancelled() {
        group.signal(Signal::SIGTERM)?;
        tokio::select! {
            biased;
            status = child.wait() => return reaped(status, task_id, group),
            () = tokio::time::sleep(grace) => {
                tracing::debug!(?grace, "command outlived its grace period; killing it");
            }
            () = force.cancelled() => tracing::debug!("forced stop; killing the command"),
        }
    } else {
        tracing::debug!("forced stop; killing the command without a grace");
    }
    group.signal(Signal::SIGKILL)?;
    reaped(child.wait().await, task_id, group)
}

/// Turns the result of waiting for the main process into its exit, sweeping the group.
fn reaped(
    status: io::Result<std::process::ExitStatus>,
    task_id: u64,
    group: &mut ProcessGroup,
) -> Result<ProcessExit, ExecError> {
    let status = status.map_err(|source| ExecError::Wait { task_id, source })?;
    group.sweep();
    Ok(ProcessExit::from(status))
}

/// Fails with [`ExecError::Cwd`] unless `cwd` is an existing directory, so that the error names
/// the directory rather than blaming the program.
async fn check_cwd(cwd: &Path) -> Result<(), ExecError> {
    let cwd_err = |source| ExecError::Cwd {
        path: cwd.to_path_buf(),
        source,
    };
    let meta = tokio::fs::metadata(cwd).await.map_err(cwd_err)?;
    if !meta.is_dir() {
        return Err(cwd_err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    Ok(())
}

/// `program` found in the PATH the child gets, when that PATH is not the worker's own and
/// `program` is a bare name: the standard library then spawns with `posix_spawn` (vfork and
/// exec, whatever the worker's size) instead of falling back to fork and exec, which copies the
/// worker's page tables for every task. `None` leaves the lookup (and its error, when nothing
/// is found) to the standard library.
fn resolve_in_child_path(
    program: &str,
    spec: &CommandSpec,
    opts: &LaunchOptions,
) -> Option<PathBuf> {
    if program.contains('/') {
        return None;
    }
    // The worker's variables override the spec's; the last of each wins.
    let path = opts
        .extra_env
        .iter()
        .rev()
        .chain(spec.env.iter().rev())
        .chain(opts.base_env.iter().rev())
        .find(|(key, _)| key == "PATH")
        .map(|(_, value)| value)?;
    let cwd = match (&spec.cwd, &opts.user) {
        (Some(cwd), _) => cwd.clone(),
        (None, Some(user)) => user.home.clone(),
        (None, None) => std::env::current_dir().ok()?,
    };
    which::which_in(program, Some(path), cwd).ok()
}

/// Creates the attempt's two log files (truncating old ones), and the log directory if it is
/// missing, in one trip to a blocking thread.
async fn open_logs(log_dir: &Path, task_id: u64, attempt: u32) -> Result<CreatedLogs, ExecError> {
    let dir = log_dir.to_path_buf();
    tokio::task::spawn_blocking(move || AttemptLogs::create(&dir, task_id, attempt))
        .await
        .map_err(|e| ExecError::LogFile {
            path: log_dir.to_path_buf(),
            source: io::Error::other(e),
        })?
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::exec::logs::{Stream, log_path, read_log};

    /// No test waits longer than this for anything.
    const BOUND: Duration = Duration::from_secs(20);

    fn sh(script: &str) -> CommandSpec {
        CommandSpec::new(["sh", "-c", script])
    }

    async fn run(spec: &CommandSpec, opts: &LaunchOptions) -> Result<CommandOutcome, ExecError> {
        run_cancellable(spec, opts, CancellationToken::new()).await
    }

    async fn run_cancellable(
        spec: &CommandSpec,
        opts: &LaunchOptions,
        cancel: CancellationToken,
    ) -> Result<CommandOutcome, ExecError> {
        tokio::time::timeout(BOUND, run_command(1, 0, spec, opts, cancel))
            .await
            .expect("run_command did not end in time")
            .map(|(outcome, _logs)| outcome)
    }

    /// Task 1 attempt 0's whole log for `stream`, read in small chunks.
    async fn log(opts: &LaunchOptions, stream: Stream) -> String {
        let mut data = Vec::new();
        let mut offset = 0;
        loop {
            let chunk = read_log(&opts.log_dir, 1, 0, stream, offset, 3)
                .await
                .unwrap();
            assert_eq!(chunk.next_offset, offset + chunk.data.len() as u64);
            data.extend_from_slice(&chunk.data);
            offset = chunk.next_offset;
            if chunk.eof {
                return String::from_utf8(data).unwrap();
            }
        }
    }

    /// Waits until task 1's stdout has a first full line, and returns it.
    async fn first_line(opts: &LaunchOptions) -> String {
        let poll = async {
            loop {
                let path = log_path(&opts.log_dir, 1, 0, Stream::Stdout);
                if let Ok(text) = tokio::fs::read_to_string(path).await
                    && let Some((line, _)) = text.split_once('\n')
                {
                    return line.to_owned();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(BOUND, poll).await.expect("no output")
    }

    /// Whether process `pid` has ended (gone, or a zombie nobody reaped yet), waiting a little.
    async fn ended(pid: &str) -> bool {
        let stat = format!("/proc/{pid}/stat");
        for _ in 0..500 {
            match std::fs::read_to_string(&stat) {
                Err(_) => return true,
                Ok(s) => {
                    let state = s
                        .rsplit_once(") ")
                        .and_then(|(_, rest)| rest.chars().next());
                    if matches!(state, Some('Z' | 'X')) {
                        return true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    fn opts() -> (tempfile::TempDir, LaunchOptions) {
        let dir = tempfile::tempdir().unwrap();
        let opts = LaunchOptions::new(dir.path().join("logs")).grace(Duration::from_secs(5));
        (dir, opts)
    }

    /// How many descriptors this process holds open on files under `dir`.
    fn open_under(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.starts_with(dir))
            .count()
    }

    #[tokio::test]
    async fn a_running_command_holds_one_descriptor_per_log_and_none_once_read() {
        let (_dir, opts) = opts();
        let cancel = CancellationToken::new();
        let running = tokio::spawn({
            let (opts, cancel) = (opts.clone(), cancel.clone());
            async move { run_command(1, 0, &sh("echo started; exec sleep 30"), &opts, cancel).await }
        });
        let started = Instant::now();
        let stdout = log_path(&opts.log_dir, 1, 0, Stream::Stdout);
        while std::fs::read(&stdout).unwrap_or_default().is_empty() {
            assert!(started.elapsed() < BOUND, "the command did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The worker's own handle on each stream; the child's copies are the child's.
        assert_eq!(open_under(&opts.log_dir), 2);
        cancel.cancel();
        let (outcome, logs) = running.await.unwrap().unwrap();
        assert!(matches!(outcome, CommandOutcome::Cancelled(_)), "{outcome}");
        assert_eq!(logs.lens().unwrap(), (8, 0));
        assert_eq!(
            logs.tail(Stream::Stdout, 100).unwrap(),
            (b"started\n".to_vec(), 8)
        );
        drop(logs);
        assert_eq!(open_under(&opts.log_dir), 0);
    }

    #[tokio::test]
    async fn reports_exit_codes() {
        let (_dir, opts) = opts();
        let ok = run(&sh("exit 0"), &opts).await.unwrap();
        assert_eq!(ok, CommandOutcome::Exited(ProcessExit::exited(0)));
        assert!(ok.success());
        let failed = run(&sh("exit 3"), &opts).await.unwrap();
        assert_eq!(failed, CommandOutcome::Exited(ProcessExit::exited(3)));
        assert!(!failed.success());
        let killed = run(&sh("kill -KILL $$"), &opts).await.unwrap();
        assert_eq!(killed, CommandOutcome::Exited(ProcessExit::killed_by(9)));
        assert_eq!(killed.exit().code, 137);
    }

    #[tokio::test]
    async fn output_goes_to_the_attempt_log_files() {
        let (_dir, opts) = opts();
        let spec = sh("echo to-out; echo to-err >&2; printf 0123456789");
        let outcome = run(&spec, &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        assert_eq!(log(&opts, Stream::Stdout).await, "to-out\n0123456789");
        assert_eq!(log(&opts, Stream::Stderr).await, "to-err\n");
        let tail = read_log(&opts.log_dir, 1, 0, Stream::Stdout, 9, 4)
            .await
            .unwrap();
        assert_eq!(
            (tail.data.as_slice(), tail.next_offset, tail.eof),
            (&b"2345"[..], 13, false)
        );
        assert!(log_path(&opts.log_dir, 1, 0, Stream::Stderr).ends_with("1-0.err"));
    }

    #[tokio::test]
    async fn a_program_is_found_in_the_path_the_child_gets_and_keeps_its_name() {
        let (dir, opts) = opts();
        // A program only the child's PATH has (a relative entry, from the child's cwd), as in
        // execvp; found, it runs under the name it was given.
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let program = bin.join("escher-test-hello");
        std::fs::write(&program, "#!/bin/sh\necho hello from $(basename \"$0\")\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = CommandSpec::new(["escher-test-hello"])
            .env("PATH", "bin:/usr/bin:/bin")
            .cwd(dir.path());
        assert_eq!(
            resolve_in_child_path("escher-test-hello", &spec, &opts),
            Some(dir.path().join("bin/escher-test-hello"))
        );
        let outcome = run(&spec, &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        assert_eq!(
            log(&opts, Stream::Stdout).await,
            "hello from escher-test-hello\n"
        );

        // The worker's PATH wins over the spec's; argv[0] stays the bare name.
        let opts = opts.env("PATH", "/usr/bin:/bin");
        let spec = sh("tr '\\0' ' ' < /proc/$$/cmdline").env("PATH", "/nowhere");
        assert!(resolve_in_child_path("sh", &spec, &opts).is_some());
        let outcome = run(&spec, &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        let cmdline = log(&opts, Stream::Stdout).await;
        assert!(cmdline.starts_with("sh -c "), "{cmdline}");

        // No PATH for the child, or the name has a slash: the standard library looks it up,
        // and a program found nowhere is still the spawn error it was.
        let no_path = LaunchOptions {
            base_env: Vec::new(),
            ..LaunchOptions::new("/x")
        };
        assert_eq!(resolve_in_child_path("sh", &sh("true"), &no_path), None);
        assert_eq!(resolve_in_child_path("./sh", &spec, &opts), None);
        let missing = CommandSpec::new(["escher-no-such-program"]).env("PATH", "/nowhere");
        assert!(matches!(
            run(&missing, &opts).await,
            Err(ExecError::Spawn { .. })
        ));
    }

    #[tokio::test]
    async fn honours_env_and_cwd() {
        let (dir, opts) = opts();
        let opts = opts.env("ESCHER_TASK_ID", "1").env("FROM_WORKER", "w");
        let spec =
            sh(r#"printf '%s %s %s\n' "$FROM_SPEC" "$FROM_WORKER" "$ESCHER_TASK_ID"; pwd -P"#)
                .env("FROM_SPEC", "s")
                .env("ESCHER_TASK_ID", "spoofed")
                .cwd(dir.path());
        let outcome = run(&spec, &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(
            log(&opts, Stream::Stdout).await,
            format!("s w 1\n{}\n", cwd.display())
        );
    }

    #[tokio::test]
    async fn a_command_gets_its_base_env_and_nothing_else_of_the_workers() {
        let (_dir, opts) = opts();
        let opts = LaunchOptions {
            base_env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            ..opts
        }
        .env("ESCHER_TASK_ID", "1");
        // `env` lists the whole environment; the test process's own (CARGO_*, HOME, ...)
        // must not be in it.
        let outcome = run(&sh("env | cut -d= -f1 | sort"), &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        let names = log(&opts, Stream::Stdout).await;
        // `sh` itself may add PWD (and dash SHLVL): those are the shell's, not the worker's.
        let names: Vec<&str> = names
            .lines()
            .filter(|n| !matches!(*n, "PWD" | "SHLVL" | "_" | "OLDPWD"))
            .collect();
        assert_eq!(names, ["ESCHER_TASK_ID", "PATH"]);
    }

    /// As root (CI), the command runs as the given user in its directory and cannot read a
    /// file of the worker's; without the privilege, starting it is refused by the kernel.
    #[tokio::test]
    async fn a_command_runs_as_its_user() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, opts) = opts();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let root = nix::unistd::geteuid().is_root();
        if root {
            std::os::unix::fs::chown(&home, Some(300_200), Some(300_200)).unwrap();
            // The test's temporary directory is 0700: let the user reach its home.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        let script = format!(
            r#"printf '%s %s %s %s %s\n' "$(id -u)" "$(id -g)" "$(id -G)" "$HOME" "$(pwd -P)"; cat {} || echo refused"#,
            secret.display()
        );
        // With and without `setpriv` (which only the standard library's spawn uses, on a
        // kernel without pidfds): the user is the same either way.
        let switches = [None, which::which("setpriv").ok()];
        for switch in switches
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
        {
            let opts = opts.clone().user(Some(TaskUser {
                uid: 300_200,
                home: home.clone(),
                switch: switch.clone(),
            }));
            match run(&sh(&script), &opts).await {
                Ok(outcome) if root => {
                    assert!(outcome.success(), "{switch:?}: {outcome}");
                    let home = home.canonicalize().unwrap();
                    assert_eq!(
                        log(&opts, Stream::Stdout).await,
                        format!(
                            "300200 300200 300200 {} {}\nrefused\n",
                            home.display(),
                            home.display()
                        ),
                        "{switch:?}"
                    );
                }
                // Without the privilege, setpriv starts and fails to change user.
                Ok(outcome) => {
                    assert!(switch.is_some() && !outcome.success(), "{outcome}");
                }
                Err(e) => {
                    assert!(!root, "root could not start a command as another user: {e}");
                    assert!(
                        switch.is_none() && matches!(e, ExecError::Spawn { .. }),
                        "{e}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn timeout_terminates_the_command() {
        let (_dir, opts) = opts();
        let opts = opts.timeout(Duration::from_millis(200));
        let start = Instant::now();
        let outcome = run(&CommandSpec::new(["sleep", "30"]), &opts)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            CommandOutcome::TimedOut(ProcessExit::killed_by(15))
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
        let (_dir, opts) = opts();
        let grace = Duration::from_millis(300);
        let opts = opts.grace(grace);
        let spec = sh(r#"trap "" TERM; echo ready; sleep 30"#);
        let cancel = CancellationToken::new();
        let running = run_cancellable(&spec, &opts, cancel.clone());
        let stopping = async {
            assert_eq!(first_line(&opts).await, "ready");
            cancel.cancel();
            Instant::now()
        };
        let (outcome, cancelled_at) = tokio::join!(running, stopping);
        assert_eq!(
            outcome.unwrap(),
            CommandOutcome::Cancelled(ProcessExit::killed_by(9))
        );
        let took = cancelled_at.elapsed();
        assert!(took >= grace && took < Duration::from_secs(10), "{took:?}");
    }

    #[tokio::test]
    async fn cancellation_stops_the_command() {
        let (_dir, opts) = opts();
        let cancel = CancellationToken::new();
        let canceller = {
            let cancel = cancel.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                cancel.cancel();
            }
        };
        let sleep = CommandSpec::new(["sleep", "30"]);
        let start = Instant::now();
        let (outcome, ()) = tokio::join!(run_cancellable(&sleep, &opts, cancel), canceller);
        assert_eq!(
            outcome.unwrap(),
            CommandOutcome::Cancelled(ProcessExit::killed_by(15))
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );

        let cancelled = CancellationToken::new();
        cancelled.cancel();
        let outcome = run_cancellable(&sleep, &opts, cancelled).await.unwrap();
        assert!(matches!(outcome, CommandOutcome::Cancelled(_)), "{outcome}");
    }

    #[tokio::test]
    async fn stopping_reaches_the_whole_process_group() {
        let (_dir, opts) = opts();
        let cancel = CancellationToken::new();
        let spec = sh("sleep 30 & echo $!; wait");
        let running = run_cancellable(&spec, &opts, cancel.clone());
        let stopping = async {
            let grandchild = first_line(&opts).await;
            cancel.cancel();
            grandchild
        };
        let (outcome, grandchild) = tokio::join!(running, stopping);
        assert!(matches!(outcome.unwrap(), CommandOutcome::Cancelled(_)));
        assert!(
            ended(&grandchild).await,
            "grandchild {grandchild} still runs"
        );
    }

    #[tokio::test]
    async fn processes_left_behind_are_killed() {
        let (_dir, opts) = opts();
        let outcome = run(&sh("sleep 30 & echo $!"), &opts).await.unwrap();
        assert!(outcome.success(), "{outcome}");
        let leftover = first_line(&opts).await;
        assert!(ended(&leftover).await, "leftover {leftover} still runs");
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_process_group() {
        let (_dir, opts) = opts();
        let spec = sh("sleep 30 & echo $!; wait");
        let task = {
            let opts = opts.clone();
            tokio::spawn(
                async move { run_command(1, 0, &spec, &opts, CancellationToken::new()).await },
            )
        };
        let grandchild = first_line(&opts).await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert!(
            ended(&grandchild).await,
            "grandchild {grandchild} still runs"
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error_naming_it() {
        let (_dir, opts) = opts();
        let err = run(&CommandSpec::new(["escher-no-such-program", "x"]), &opts)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ExecError::Spawn { program, source }
                if program == "escher-no-such-program" && source.kind() == io::ErrorKind::NotFound),
            "{err:?}"
        );
        assert!(err.is_task_fault());
        let message = err.to_string();
        assert!(message.contains("`escher-no-such-program`"), "{message}");
        assert!(message.contains("No such file or directory"), "{message}");
    }

    #[tokio::test]
    async fn a_non_executable_program_is_a_spawn_error() {
        let (dir, opts) = opts();
        let script = dir.path().join("not-executable.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let program = script.to_str().unwrap().to_owned();
        let err = run(&CommandSpec::new([program.clone()]), &opts)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ExecError::Spawn { program: p, source }
                if *p == program && source.kind() == io::ErrorKind::PermissionDenied),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn bad_specs_and_log_dirs_are_errors() {
        let (dir, opts) = opts();
        let empty = run(&CommandSpec::default(), &opts).await.unwrap_err();
        assert!(matches!(empty, ExecError::EmptyArgv), "{empty:?}");

        let missing = dir.path().join("missing");
        let err = run(&sh("true").cwd(&missing), &opts).await.unwrap_err();
        assert!(
            matches!(&err, ExecError::Cwd { path, .. } if *path == missing),
            "{err:?}"
        );
        assert!(err.to_string().contains(missing.to_str().unwrap()), "{err}");

        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = run(&sh("true").cwd(&file), &opts).await.unwrap_err();
        assert!(matches!(err, ExecError::Cwd { .. }), "{err:?}");

        let under_file = file.join("logs");
        let err = run(&sh("true"), &LaunchOptions::new(&under_file))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ExecError::LogDir { path, .. } if *path == under_file),
            "{err:?}"
        );
        assert!(!err.is_task_fault());
        assert!(
            err.to_string().contains(under_file.to_str().unwrap()),
            "{err}"
        );
    }
}
