//! Running one assignment to its end: a command, a function or a ghost, each turned into the
//! [`TaskFinished`] report the head expects.
//!
//! | kind     | runs as                                   | ends with                          |
//! |----------|-------------------------------------------|------------------------------------|
//! | command  | a child process ([`run_command`])         | `Exited { code }`, or `Err(spawn)` |
//! | function | its handler, in its own tokio task        | `Returned(bytes)`, or `Err(why)`   |
//! | ghost    | nothing: a timer and a cancellation token | `Released`                         |
//!
//! A command that exits with a code other than 0 after stating `out_of_memory used_mib=..
//! limit_mib=..` in its outcome file (`ESCHER_OUTCOME_FILE`, beside its logs) ends with
//! `OutOfMemory { used_mib, limit_mib }` instead of its exit code. A command is held to the
//! limits its request gives ([`LimitPolicy`](crate::exec::LimitPolicy)), and one that failed
//! after the kernel's OOM killer killed a process of it in its memory cgroup ends with the
//! error "exceeded its memory request of N". So is the Python interpreter that runs a Python
//! task or actor (its context carries the limits, `python/mod.rs` writes them); a Rust
//! function or actor runs inside the worker, in no cgroup of its own, and is held to none.
//!
//! Every kind honours the task's `timeout` (`timed_out: true`) and the cancellation token (the
//! head's `CancelTask`, or the worker shutting down). A handler runs in a task of its own so
//! that a panic is caught as a `JoinError` and reported as the task's error, and so that
//! cancelling it is dropping it. A ghost costs one small tokio task: no process, no thread.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use escher_proto::types::{
    Assignment, MAX_OUTCOME_BYTES, OUTCOME_FILE_ENV, OUTPUT_TAIL_BYTES, OutputTail, TaskFinished,
    parse_outcome,
};
use escher_proto::{Namespace, NodeId, TaskId, TaskKind, TaskResult};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::context::{TaskContext, TaskLogs};
use crate::exec::{
    AttemptLogs, CgroupUsage, CommandOutcome, CommandSpec, Isolation, LaunchOptions, LogRetention,
    Stream, UsageSend, UsageSink, run_command,
};
use crate::functions::FunctionRegistry;
use crate::head_conn::HeadConn;
use crate::spawn_latency::SpawnLatency;

/// The task label that names the application namespace of a task (set by the head).
pub use escher_proto::types::NAMESPACE_LABEL;

/// The largest result a Python interpreter's frame may carry to the worker (one message's
/// worth: the head's default message limit is 64 MiB, `--max-message-bytes`, less a little
/// room). What the head receives is smaller: a result above 100 KiB stays in this node's store
/// as an object and the head is told only its size and checksum (`objects/result.rs`).
pub const MAX_RESULT_BYTES: usize = 64 * 1024 * 1024 - 64 * 1024;

/// What every runner of one worker shares.
#[derive(Debug)]
pub(crate) struct RunEnv {
    /// This node's objects (its store): the head's `DeleteObjects` removes released copies.
    pub(crate) objects: crate::objects::NodeObjects,
    /// Where command logs go.
    pub(crate) log_dir: PathBuf,
    /// What of the worker's environment commands start with.
    pub(crate) base_env: Vec<(String, String)>,
    /// Whom commands run as.
    pub(crate) isolation: Arc<Isolation>,
    /// How long, and how much of, them to keep.
    pub(crate) log_retention: LogRetention,
    /// SIGTERM-to-SIGKILL time for commands.
    pub(crate) grace: Duration,
    /// The head, for task contexts and `ESCHER_HEAD`.
    pub(crate) head: HeadConn,
    /// The registered functions.
    pub(crate) functions: FunctionRegistry,
    /// The worker's name, for messages.
    pub(crate) worker_name: Arc<str>,
    /// How long tasks take to start, for heartbeats.
    pub(crate) spawn_latency: Arc<SpawnLatency>,
    /// Where each command gets a cgroup of its own (`None`: its process group only).
    pub(crate) cgroups: Option<Arc<crate::exec::TaskCgroups>>,
    /// How a command's request becomes the limits its cgroup holds it to.
    pub(crate) limits: crate::exec::LimitPolicy,
    /// The most bytes of each output stream a command's log keeps.
    pub(crate) log_bytes: u64,
    /// The actors this worker hosts.
    pub(crate) actors: Arc<crate::actors::ActorHost>,
    /// The free space kept on the worker's file systems: no task starts while under it.
    pub(crate) disk: Arc<crate::exec::DiskReserve>,
    /// Where command tasks get scratch directories of their own, if they do.
    pub(crate) scratch: Option<Arc<crate::exec::Scratch>>,
}

/// Runs `assignment` on node `node_id` until it ends, is cancelled or times out. `devices` are
/// the UUIDs of the GPU devices it was given, `None` on a node without GPUs: a command gets
/// them as `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` (on a GPU node a task given
/// none sees none: an empty list, and `none`), a function through its context. `force`, once
/// cancelled (a forced cancel), makes a command's stop skip its SIGTERM grace.
#[tracing::instrument(skip_all, fields(task_id = %a.task_id, attempt = a.attempt))]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_task(
    env: Arc<RunEnv>,
    node_id: NodeId,
    a: Assignment,
    assigned: Instant,
    cancel: CancellationToken,
    force: CancellationToken,
    devices: Option<Vec<String>>,
    ready: mpsc::UnboundedSender<(TaskId, u32)>,
) -> TaskFinished {
    let timeout = a.spec.timeout;
    let namespace = a.spec.labels.get(NAMESPACE_LABEL).map(str::to_owned);
    // A node under its disk reserve starts nothing: the task waits, unstarted, for space, and
    // its start is reported once it has room (the runtime held it back if it saw the disk
    // low; otherwise `ready` changes nothing).
    if matches!(
        a.spec.kind,
        TaskKind::Command { .. } | TaskKind::Function { .. }
    ) {
        if let Err(why) = disk_room(&env, &cancel).await {
            return TaskFinished {
                task_id: a.task_id,
                attempt: a.attempt,
                outcome: Err(why),
                timed_out: false,
                output: None,
            };
        }
        let _ = ready.send((a.task_id, a.attempt));
    }
    // The end of a command's output, read once it has ended.
    let mut output = None;
    let (outcome, timed_out) = match a.spec.kind {
        TaskKind::Command {
            argv,
            env: vars,
            cwd,
        } => {
            let spec = CommandSpec {
                argv,
                env: vars,
                cwd: cwd.map(PathBuf::from),
            };
            let user = match env.isolation.user_for(namespace.as_deref()) {
                Ok(user) => user,
                Err(why) => {
                    return TaskFinished {
                        task_id: a.task_id,
                        attempt: a.attempt,
                        outcome: Err(format!("cannot run the task as its own user: {why}")),
                        timed_out: false,
                        output: None,
                    };
                }
            };
            // Its own scratch, a tmpfs of its `disk` request: its HOME, TMPDIR and working
            // directory, unmounted when this runner ends (exec/scratch.rs).
            let scratch = match (&env.scratch, &user) {
                (Some(scratch), Some(u)) => {
                    let disk_mib = a.spec.resources.get("disk");
                    let disk_mib = (!disk_mib.is_zero())
                        .then(|| disk_mib.raw().div_ceil(escher_proto::Amount::ONE.raw()));
                    let name = format!("{}-{}", a.task_id.0, a.attempt);
                    match scratch.mount(&name, u.uid, scratch.bytes_for(disk_mib)) {
                        Ok(mounted) => Some(mounted),
                        Err(why) => {
                            return TaskFinished {
                                task_id: a.task_id,
                                attempt: a.attempt,
                                outcome: Err(format!("cannot give the task its scratch: {why}")),
                                timed_out: false,
                                output: None,
                            };
                        }
                    }
                }
                _ => None,
            };
            let user = match (user, &scratch) {
                (Some(u), Some(s)) => Some(crate::exec::TaskUser {
                    home: s.path().to_path_buf(),
                    ..u
                }),
                (user, _) => user,
            };
            let outcome_name = format!(".escher-{}-{}.outcome", a.task_id.0, a.attempt);
            let outcome_file = match &user {
                Some(user) => user.home.join(&outcome_name),
                None => outcome_path(&env.log_dir, a.task_id.0, a.attempt),
            };
            // Its scratch is also its /tmp, /var/tmp and /dev/shm, in a mount namespace of its
            // own (exec/scratch.rs): there it is /tmp to the task.
            let private_tmp = scratch
                .as_ref()
                .filter(|_| env.scratch.as_ref().is_some_and(|s| s.private_tmp()))
                .map(|s| s.path().to_path_buf());
            let outcome_seen = match &private_tmp {
                Some(_) => Path::new(crate::exec::PRIVATE_TMP_HOME).join(&outcome_name),
                None => outcome_file.clone(),
            };
            // Its hold on the node's memory lasts until it ends.
            let (limits, _memory) = env.limits.task(&a.spec.resources);
            let mut opts = LaunchOptions::new(&env.log_dir)
                .cgroups(env.cgroups.clone())
                .limits(limits)
                .log_bytes(Some(env.log_bytes))
                .disk(Some(Arc::clone(&env.disk)))
                .grace(env.grace)
                .force(force)
                .env("ESCHER_HEAD", env.head.list())
                .env("ESCHER_NODE_ID", node_id.to_string())
                .env("ESCHER_TASK_ID", a.task_id.to_string())
                .env("ESCHER_ATTEMPT", a.attempt.to_string())
                .env(escher_proto::access::ENV_TASK_TOKEN, &a.task_token)
                .env(OUTCOME_FILE_ENV, outcome_seen.display().to_string());
            opts.base_env = env.base_env.clone();
            if env.cgroups.is_some() {
                // What its cgroup uses, reported as the task's telemetry with its credential
                // (made at the first sample: a short command reports nothing).
                let (head, worker_name) = (env.head.clone(), Arc::clone(&env.worker_name));
                let (task_id, attempt, token) = (a.task_id, a.attempt, a.task_token.clone());
                let ns = namespace.clone();
                opts = opts.usage(Some(usage_reports(move || {
                    TaskContext::new(
                        node_id,
                        task_id,
                        attempt,
                        ns.as_deref().and_then(|ns| Namespace::new(ns).ok()),
                        Arc::clone(&worker_name),
                        head.clone(),
                        Vec::new(),
                        &token,
                    )
                })));
            }
            if user.is_none() {
                // Tasks share the worker's user, and so its home.
                if let Some(home) = std::env::var_os("HOME") {
                    opts = opts.env("HOME", home.to_string_lossy());
                }
            }
            if let Some(scratch) = &scratch {
                let tmpdir = match &private_tmp {
                    Some(_) => Path::new(crate::exec::PRIVATE_TMP_HOME),
                    None => scratch.path(),
                };
                opts = opts.env("TMPDIR", tmpdir.display().to_string());
            }
            opts = opts.private_tmp(private_tmp);
            opts = opts.user(user);
            if let Some(ns) = &namespace {
                opts = opts.env("ESCHER_NAMESPACE", ns);
            }
            // A task calling an https:// head trusts what its worker trusts.
            if let Some((ca, name)) = env.head.trust() {
                opts = opts.env("ESCHER_TLS_CA", ca);
                if let Some(name) = name {
                    opts = opts.env("ESCHER_TLS_NAME", name);
                }
            }
            if let Some(path) = path_with_escher_cli(&spec.env) {
                opts = opts.env("PATH", path);
            }
            if let Some(devices) = &devices {
                let list = devices.join(",");
                let nvidia = if list.is_empty() {
                    "none".to_string()
                } else {
                    list.clone()
                };
                opts = opts
                    .env("CUDA_VISIBLE_DEVICES", list)
                    .env("NVIDIA_VISIBLE_DEVICES", nvidia);
            }
            opts.timeout = timeout;
            let latency = Arc::clone(&env.spawn_latency);
            opts = opts.on_spawn(move || latency.observe(assigned.elapsed()));
            let (outcome, logs) = command(a.task_id.0, a.attempt, &spec, &opts, cancel).await;
            // A command that could not start wrote nothing worth keeping.
            output = logs.map(output_tail);
            let outcome = stated_outcome(outcome_file, outcome).await;
            let outcome = match (outcome, &scratch) {
                // A task that failed with its scratch full failed for want of room there.
                ((Ok(TaskResult::Exited { code }), t), Some(s)) if code != 0 && s.full() => {
                    (Err(format!("{} (exit code {code})", s.full_reason())), t)
                }
                (outcome, _) => outcome,
            };
            // Its scratch goes now: the worker's scratch thread empties it for its user's next
            // task (or unmounts it), off the task's path.
            drop(scratch);
            outcome
        }
        TaskKind::Function { name, args } => {
            // A Python task's interpreter is held to its request's limits; its hold on the
            // node's memory lasts until it ends.
            let (limits, _memory) = env.limits.task(&a.spec.resources);
            let ctx = in_process_context(
                &env,
                node_id,
                (a.task_id, a.attempt),
                &a.task_token,
                namespace,
                devices,
            )
            .with_limits(limits)
            .with_object_session_of(&a.spec.labels);
            let logs = ctx.logs().cloned();
            let copy_reports = ctx.copy_reports();
            env.spawn_latency.observe(assigned.elapsed());
            let fetched = tokio::select! {
                biased;
                () = cancel.cancelled() => Err("cancelled while its object arguments were \
                                                 fetched".to_string()),
                fetched = crate::objects::args::fetch_args(
                    &env.objects,
                    &ctx,
                    &a.spec.labels,
                    &a.objects,
                ) => fetched,
            };
            let outcome = match fetched {
                Ok(objects) => {
                    let ctx = ctx.with_object_args(objects);
                    function(&env, &name, ctx, args.into(), timeout, cancel).await
                }
                Err(why) => (Err(why), false),
            };
            // The copies it fetched were reported while it ran; the head knows them before it
            // learns the task ended (and the attempt's credential is still good for them).
            copy_reports.settle().await;
            // A Python task's output, in its log files: the head keeps their end too.
            output = logs.and_then(|logs| take_logs(&logs)).map(output_tail);
            outcome
        }
        TaskKind::Ghost { ttl, .. } => ghost(ttl, timeout, cancel).await,
        TaskKind::Actor(actor) => {
            // A Python actor's interpreter is held to its request's limits for its whole
            // life, and so is its hold on the node's memory.
            let (limits, _memory) = env.limits.task(&a.spec.resources);
            let ctx = in_process_context(
                &env,
                node_id,
                (a.task_id, a.attempt),
                &a.task_token,
                namespace,
                devices,
            )
            .with_limits(limits);
            env.spawn_latency.observe(assigned.elapsed());
            let key = (a.task_id, a.attempt);
            // The runtime reports the start once the constructor returned (and never after
            // the end: it reads readiness before ends).
            let ready = move || {
                let _ = ready.send(key);
            };
            // What the actor writes to its context's stdout and stderr (`TaskContext::stdout`)
            // is its task's output, as a function's is.
            let logs = ctx.logs().cloned();
            let copy_reports = ctx.copy_reports();
            let outcome = env
                .actors
                .run(ctx, &actor, &env.worker_name, timeout, cancel, ready)
                .await;
            copy_reports.settle().await;
            output = logs.and_then(|logs| take_logs(&logs)).map(output_tail);
            outcome
        }
    };
    let output = match output {
        Some(tail) => Some(tail.await),
        None => None,
    };
    TaskFinished {
        task_id: a.task_id,
        attempt: a.attempt,
        outcome,
        timed_out,
        output,
    }
}

/// The context of an attempt that runs inside the worker (a function's handler, an actor): its
/// ids, namespace, devices and credential, and the worker's cgroups for what it starts.
fn in_process_context(
    env: &RunEnv,
    node_id: NodeId,
    (task_id, attempt): (TaskId, u32),
    token: &str,
    namespace: Option<String>,
    devices: Option<Vec<String>>,
) -> TaskContext {
    TaskContext::new(
        node_id,
        task_id,
        attempt,
        namespace.and_then(|ns| Namespace::new(&ns).ok()),
        Arc::clone(&env.worker_name),
        env.head.clone(),
        devices.unwrap_or_default(),
        token,
    )
    .with_cgroups(env.cgroups.clone())
    .with_node_objects(env.objects.clone())
    .with_logs(Arc::new(TaskLogs {
        dir: env.log_dir.clone(),
        max_bytes: env.log_bytes,
        files: std::sync::Mutex::new(None),
    }))
}

/// The log files an in-process attempt made (a Python task's), held to the cap one last time.
fn take_logs(logs: &TaskLogs) -> Option<AttemptLogs> {
    let mut files = logs
        .files
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()?;
    if let Err(error) = files.cap(logs.max_bytes) {
        tracing::warn!(%error, "cannot hold a Python task's log to its cap");
    }
    Some(files)
}

/// How often a command task's cgroup is sampled for its telemetry.
pub const USAGE_EVERY: Duration = Duration::from_secs(5);

/// The telemetry key of a command task's CPU time so far, in seconds (every process it ran).
pub const CPU_SECONDS: &str = "escher.cpu_seconds";
/// The telemetry key of the memory a command task's processes hold, in bytes.
pub const MEMORY_BYTES: &str = "escher.memory_bytes";
/// The telemetry key of the most memory a command task's processes were seen to hold, in
/// bytes (of the samples so far).
pub const MEMORY_PEAK_BYTES: &str = "escher.memory_peak_bytes";

/// A command's cgroup samples, reported as its task's telemetry through the context `make`
/// builds (with the attempt's credential) at the first sample: [`CPU_SECONDS`],
/// [`MEMORY_BYTES`] and [`MEMORY_PEAK_BYTES`] every [`USAGE_EVERY`], and the totals when it
/// ends. A report the head does not take within two seconds is dropped: telemetry never holds
/// a task up.
fn usage_reports(make: impl Fn() -> TaskContext + Send + Sync + 'static) -> UsageSink {
    let context = Arc::new(std::sync::OnceLock::<TaskContext>::new());
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let send: UsageSend = Arc::new(move |usage: CgroupUsage, last: bool| {
        let context = context.get_or_init(&make).clone();
        use std::sync::atomic::Ordering::Relaxed;
        let peak = match usage.memory {
            Some(now) => peak.fetch_max(now, Relaxed).max(now),
            None => peak.load(Relaxed),
        };
        Box::pin(async move {
            let mut samples = vec![(CPU_SECONDS, usage.cpu.as_secs_f64())];
            if let (Some(now), false) = (usage.memory, last) {
                samples.push((MEMORY_BYTES, now as f64));
            }
            if peak > 0 {
                samples.push((MEMORY_PEAK_BYTES, peak as f64));
            }
            let sent = tokio::time::timeout(Duration::from_secs(2), context.report(&samples));
            match sent.await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => tracing::debug!(%err, "a task's resource use was not reported"),
                Err(_) => tracing::debug!("a task's resource use was not reported in time"),
            }
        })
    });
    UsageSink {
        every: USAGE_EVERY,
        send,
    }
}

/// The end of both streams of an attempt's log, for the head to keep. Read from the handles the
/// worker kept, in one trip to a blocking thread, and none when nothing was written (most
/// commands). A stream that cannot be read is reported as empty: the report matters more than
/// its tail.
async fn output_tail(logs: AttemptLogs) -> OutputTail {
    if matches!(logs.lens(), Ok((0, 0))) {
        return OutputTail::default();
    }
    let read = move || {
        let tail = |stream| {
            logs.tail(stream, OUTPUT_TAIL_BYTES).unwrap_or_else(|e| {
                tracing::warn!(%stream, error = %e, "cannot read the end of the log");
                (Vec::new(), 0)
            })
        };
        let (stdout, stdout_len) = tail(Stream::Stdout);
        let (stderr, stderr_len) = tail(Stream::Stderr);
        OutputTail {
            stdout,
            stderr,
            stdout_len,
            stderr_len,
        }
    };
    tokio::task::spawn_blocking(read).await.unwrap_or_default()
}

type Outcome = (Result<TaskResult, String>, bool);

/// `O_NOFOLLOW | O_NONBLOCK`, for opening a file a task could have replaced.
fn libc_flags() -> i32 {
    use nix::fcntl::OFlag;
    (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits()
}

/// Where a command attempt may state its outcome ([`OUTCOME_FILE_ENV`]): beside its logs.
fn outcome_path(log_dir: &Path, task_id: u64, attempt: u32) -> PathBuf {
    log_dir.join(format!("{task_id}-{attempt}.outcome"))
}

/// A command's outcome, as its outcome file states it when it exited with a code other than 0
/// (an out-of-memory failure), else as it was. The file is removed either way; only a failure
/// pays for reading it (on a blocking thread), a success one `unlink` that usually finds
/// nothing.
async fn stated_outcome(path: PathBuf, outcome: Outcome) -> Outcome {
    let failed = matches!(outcome.0, Ok(TaskResult::Exited { code }) if code != 0);
    if !failed {
        let _ = std::fs::remove_file(&path);
        return outcome;
    }
    let read = move || {
        use std::io::Read;
        let mut text = String::new();
        // The file is in a directory the task owns when it runs as its own user: follow no
        // link it may have left there, and wait on no pipe.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_flags())
            .open(&path)
            .ok()?;
        if !file.metadata().ok()?.is_file() {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let _ = file
            .take(MAX_OUTCOME_BYTES as u64)
            .read_to_string(&mut text);
        let _ = std::fs::remove_file(&path);
        Some(text)
    };
    let text = tokio::task::spawn_blocking(read).await.ok().flatten();
    match text.as_deref().and_then(parse_outcome) {
        Some(stated) => (Ok(stated), outcome.1),
        None => outcome,
    }
}

/// Waits while the node's disk is under its reserve (checked every [`CHECK_EVERY`] times 4);
/// an error if the task is cancelled meanwhile.
///
/// [`CHECK_EVERY`]: crate::exec::CHECK_EVERY
async fn disk_room(env: &RunEnv, cancel: &CancellationToken) -> Result<(), String> {
    let mut said = false;
    while let Some(why) = env.disk.low() {
        if !said {
            tracing::warn!(%why, "the node's disk is under its reserve: the task waits, unstarted, for space");
            said = true;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                return Err(format!("cancelled while it waited for disk space: {why}"));
            }
            () = tokio::time::sleep(crate::exec::CHECK_EVERY * 4) => {}
        }
    }
    Ok(())
}

/// Runs a command attempt; its outcome, and its log files when it started.
async fn command(
    task_id: u64,
    attempt: u32,
    spec: &CommandSpec,
    opts: &LaunchOptions,
    cancel: CancellationToken,
) -> (Outcome, Option<AttemptLogs>) {
    let started = std::time::Instant::now();
    match run_command(task_id, attempt, spec, opts, cancel).await {
        Ok((CommandOutcome::Exited(exit), logs)) if exit.signal == Some(libc_sigkill()) => {
            // SIGKILLed by no one the worker knows of: the fence, if it stopped the tasks
            // since this one started, says why.
            let outcome = match crate::fence::stopped_since(started) {
                Some(why) => Err(format!("stopped by the fence: {why}")),
                None => Ok(TaskResult::Exited { code: exit.code }),
            };
            ((outcome, false), Some(logs))
        }
        Ok((outcome @ CommandOutcome::MemoryExceeded { .. }, logs)) => {
            ((Err(outcome.to_string()), false), Some(logs))
        }
        Ok((outcome, logs)) => {
            let code = outcome.exit().code;
            let timed_out = matches!(outcome, CommandOutcome::TimedOut(_));
            ((Ok(TaskResult::Exited { code }), timed_out), Some(logs))
        }
        Err(e) => ((Err(e.to_string()), false), None),
    }
}

/// SIGKILL's number.
fn libc_sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}

async fn function(
    env: &RunEnv,
    name: &str,
    ctx: TaskContext,
    args: Vec<u8>,
    timeout: Option<Duration>,
    cancel: CancellationToken,
) -> Outcome {
    let Some(handler) = env.functions.get(name).cloned() else {
        return (Err(env.functions.unknown(name, &env.worker_name)), false);
    };
    let (task, namespace) = (
        ctx.task_id(),
        ctx.namespace().map(|ns| ns.as_str().to_owned()),
    );
    // Calling the handler inside the spawned task catches a panic in its synchronous part too.
    let mut handle = tokio::spawn(async move { handler(ctx, args).await });
    let stopped = tokio::select! {
        biased;
        joined = &mut handle => {
            return match joined {
                // Above 100 KiB it stays here, in the store (`objects/result.rs`).
                Ok(Ok(bytes)) => (
                    crate::objects::result::keep_result(&env.objects, task, namespace, bytes),
                    false,
                ),
                Ok(Err(why)) => (Err(why), false),
                Err(e) if e.is_panic() => {
                    let why = panic_message(e.into_panic());
                    (Err(format!("function {name:?} panicked: {why}")), false)
                }
                Err(e) => (Err(format!("function {name:?} did not finish: {e}")), false),
            };
        }
        () = cancel.cancelled() => match env.actors.lease_overdue() {
            // The runtime ended it as its lease ran out (`Runtime::lease_ran_out`).
            Some(ago) => (
                format!(
                    "function {name:?} was fenced: worker {}'s lease ran out {:.1}s ago (it was \
                     stopped or cut off from the leading head, which retries the task \
                     elsewhere if it may)",
                    env.worker_name,
                    ago.as_secs_f64()
                ),
                false,
            ),
            None => (format!("function {name:?} was cancelled"), false),
        },
        () = sleep_or_forever(timeout) => (
            format!("function {name:?} timed out after {:?}", timeout.unwrap_or_default()),
            true,
        ),
    };
    handle.abort();
    // Wait until the handler's future is dropped, so that nothing of it outlives the report.
    let _ = handle.await;
    (Err(stopped.0), stopped.1)
}

async fn ghost(
    ttl: Option<Duration>,
    timeout: Option<Duration>,
    cancel: CancellationToken,
) -> Outcome {
    let timed_out = tokio::select! {
        biased;
        () = cancel.cancelled() => false,
        () = sleep_or_forever(ttl) => false,
        () = sleep_or_forever(timeout) => true,
    };
    (Ok(TaskResult::Released), timed_out)
}

async fn sleep_or_forever(limit: Option<Duration>) {
    match limit {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The text of a panic's payload, when it has one.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// The `PATH` a command task gets when an `escher` CLI sits next to this worker's executable
/// (an installed cluster): that directory first, so `escher resource set .. --local` works in
/// any task. `None` (keep the inherited `PATH`) when there is no such CLI. Whether there is
/// one is looked up once per process, at its first command task.
fn path_with_escher_cli(task_env: &[(String, String)]) -> Option<String> {
    static CLI_DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let dir = CLI_DIR
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            let dir = exe.parent()?;
            dir.join("escher").is_file().then(|| dir.to_path_buf())
        })
        .as_deref()?;
    let base = task_env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    Some(format!("{}:{base}", dir.display()))
}
