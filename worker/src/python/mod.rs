//! Python function tasks: warm interpreters that run the functions of escher's Python package
//! (`@escher.remote`), behind one built-in function named [`FUNCTION`]; and Python actors
//! (`@escher.remote` on a class), each in an interpreter of its own, behind the built-in actor
//! class [`ACTOR_CLASS`] (`actor.rs`).
//!
//! A worker offers Python when it has a usable interpreter (CPython 3.9 or later that imports
//! `cloudpickle`, checked once at start by running it briefly as its tasks would run it, as
//! their user: `detect.rs`; the node's label [`LABEL`] says which, or why none): the one
//! `ESCHER_PYTHON` names (a path, or a name found on `PATH`; `auto` for `python3`, `off` for
//! none), else, for `escher-worker` ([`PythonDetection::Detect`]), `python3` on `PATH`;
//! `escher-worker --no-python` turns it off. It then registers [`FUNCTION`] and advertises the
//! resource [`RESOURCE`] (`shared/python`: in the `shared` namespace, so that every
//! application's tasks request the same name), one slot per CPU unless `ESCHER_PYTHON_SLOTS`
//! says how many. A worker without one has no such resource (its log says why), so a Python
//! task waits with the reason the head gives every task no node can hold: "resource
//! shared/python (requested 1) exists on no live node". The Python package's embedded cluster
//! (`escher.init()`) sets `ESCHER_PYTHON` to its own interpreter; a worker embedded otherwise
//! (a Rust `LocalCluster`) offers Python only when `ESCHER_PYTHON` asks.
//!
//! **Warm interpreters.** Each one is a child `python -u -c <runner.py>` in a process group of
//! its own and, where the worker gives command tasks cgroups (`exec/cgroup.rs`; not with
//! `--no-task-cgroups`), in a cgroup of the worker's pool of its own, started on the first task
//! that needs one and kept for the next: a task does not pay an interpreter start.
//! Interpreters are kept apart by namespace (a task never meets what another namespace's task
//! left behind), and a function is unpickled once per interpreter (by its content hash). An
//! interpreter runs one task at a time; when the task is cancelled or times out, the handler's
//! future is dropped and, with it, the interpreter: its whole process group and its cgroup are
//! killed (SIGKILL), as a command task's would be, so that what the function started goes too,
//! even a process that left the group (`setsid`); the next task starts a fresh one. What a
//! function started and left running when it returned stays in the interpreter's cgroup until
//! the interpreter goes. The fence supervisor holds each interpreter's group and cgroup like a
//! command task's (`crate::fence`): it kills them when the worker dies, stalls or loses its
//! lease; a worker SIGKILLed together with its supervisor leaves them to the next worker that
//! starts on the host, which kills what is left in dead workers' cgroups. An interpreter whose
//! worker dies also exits by itself (it watches its parent).
//!
//! **Limits.** Each Python task is held to what it asked for, as a command task is
//! (`exec/limits.rs`): before a task is sent to an interpreter, the interpreter's cgroup gets
//! that task's limits (its `cpu` as a CPU quota, its `memory` as a memory limit, or what no
//! running task asked for of the node's when it asked for none, and the worker's process
//! limit, `--task-pids-max`), so a warm interpreter reused by a task with another request
//! holds that task's. An interpreter the kernel's OOM killer ends there fails its task with
//! "exceeded its memory request of N", as a command does (and a function that fails after a
//! process it started was killed so says that too); the next task gets a fresh interpreter.
//! A warm interpreter takes a task with a memory limit only while the anonymous memory it
//! holds (what an earlier task left: modules, caches, objects; not the page cache, which the
//! kernel reclaims) is at most half of that limit: written below what it holds, the limit
//! would be refused (cgroup v1) or would kill the interpreter (v2), and written just above it
//! would leave the task little of its own request. Otherwise it is ended and the task gets a
//! fresh interpreter, which costs that task an interpreter start. A Python actor's
//! interpreter holds its actor's limits for its whole life (`actor.rs`). The limits are those
//! the worker's cgroups hold: where a controller is missing or the worker has no task cgroups
//! (`--no-task-cgroups`), Python tasks are no more held than command tasks are, which the
//! node's `escher.limits` and `escher.limits.missing` labels and the worker's start-up
//! warning say.
//!
//! Interpreters run as the user the worker gives the namespace's command tasks (a user of its
//! own where the worker may change user; the worker's otherwise), each in a scratch of its own
//! where command tasks get one (a tmpfs of the default scratch size, its `HOME`, `TMPDIR` and
//! working directory for its life, emptied when it ends: `exec/scratch.rs`), else in its
//! user's home directory, with the worker's `PATH`, locale, `TZ`, `TERM`, `TMPDIR` (but for
//! its scratch), `PYTHONPATH` and `VIRTUAL_ENV`
//! (so the interpreter and its packages must be readable by that user); the task's own
//! `ESCHER_*` variables are set in `os.environ` for each task (so `escher.report()` and `escher.set_resource(...,
//! escher.Local)` act as the task).
//!
//! # Wire format
//!
//! A task's argument bytes (made by the Python package, little-endian integers):
//!
//! ```text
//! "ESPY" version:u8=2 kind:u8
//!   kind 2 (store): the cloudpickled function; the task returns these bytes unchanged, so its
//!                   result holds the function for later calls (shipped once per hash)
//!   kind 1 (call):  vlen:u8 versions:[u8;vlen] (the driver's Python and cloudpickle,
//!                   "3.11.7 3.1.1"; not in version 1, which the worker still reads)
//!                   plen:u32 pip:[u8;plen] (version 3 only: runtime_env's pip
//!                   requirements, one a line, sorted; a call without any is sent as
//!                   version 2, which any worker of versions 2 and 3 reads)
//!                   hash:[u8;32] (SHA-256 of the function's bytes)
//!                   blob:u64 (the store task that holds the function, 0 when inline)
//!                   fn_len:u32 fn:[u8;fn_len] (the function inline; fn_len 0 with a blob)
//!                   ndeps:u32 dep:u64 × ndeps (tasks whose results are arguments)
//!                   args: the rest (cloudpickled arguments, made by the package)
//! ```
//!
//! Before anything else, the worker compares the driver's versions with its interpreter's
//! (`versions.rs`): a call whose Python or cloudpickle differ in major or minor version fails
//! with a text that names both, never with what unpickling would have raised. A call with pip
//! requirements then runs in an interpreter of their environment, which the worker makes once
//! per requirement set (`pip_env.rs`); warm interpreters are kept apart by environment as by
//! namespace. The worker
//! fetches the results of the `dep` tasks (and of the `blob` task, once per
//! namespace and hash: a small cache) from the head with the task's own credential, then sends
//! the interpreter one frame on its stdin (big-endian lengths):
//!
//! ```text
//! len:u32 | hlen:u32 header:JSON[hlen] | fn_len:u32 fn[fn_len] | ndeps:u32 (len:u32 bytes)×ndeps | args
//! ```
//!
//! The header carries the task's id, attempt, node, head, credential, namespace, the hash,
//! the dependency ids and `objects` (`[owner, index, size]` of each object argument this node's
//! store holds for the task, below); `fn_len` is 0 when this interpreter already holds the
//! function. Function
//! bytes are checked against their hash before an interpreter gets them (inline, or fetched
//! from a store task before they are cached): bytes under a hash that is not theirs fail the
//! task with a message, so that no one can plant a function under another's hash, which the
//! interpreter and the cache would then serve to the namespace's later calls. The store is
//! per namespace: a store task is fetched with the calling task's credential, which sees only
//! its own namespace's tasks, and cached by namespace and hash.
//!
//! **Output.** The interpreter's stderr is a Unix socket to the worker: before each frame the
//! worker makes the attempt's log files (`{task}-{attempt}.out` and `.err` in its log
//! directory, as a command task's) and sends their descriptors on it (`SCM_RIGHTS`); the
//! interpreter points its stdout and stderr at them for that task, and at `/dev/null` between
//! tasks. After them come the descriptors of the task's object arguments (the sealed files of
//! this node's store, opened read-only by the worker, in the header's `objects` order): the
//! interpreter maps each, so a reference given as an argument is read with no fetch and no
//! copy, whatever user the interpreter runs as (the store's directories stay the worker's). What a function prints is its task's output (`escher logs`, held to
//! `--task-log-bytes`, its end kept by the head), never the worker's. An actor's interpreter
//! keeps its construction task's files for its life. The interpreter answers on its stdout:
//! `len:u32 status:u8 body`, where status 0 is a result (the cloudpickled return value), 1 an
//! exception raised by the function (the text: `python exception MODULE.TYPE: message`, then
//! the remote traceback) and 2 a failure to load the function or its arguments (the text).
//! Before its answer, a task may ask the worker for an object on the same pipe (status 3: its
//! own `escher.get`, `objects.rs`), which the worker answers on the socket with the sealed
//! file of the copy it brought into this node's store.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use escher_proto::types::Labels;
use escher_proto::types::{
    Amount, ObjectId, TaskResult, TaskState, TaskStatus, WaitReply, WaitRequest,
};
use escher_proto::{ResourceName, ResourceSet, TaskId, wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::context::TaskContext;
use crate::error::WorkerError;
use crate::exec::{Isolation, TaskUser};
use crate::functions::{self, FunctionRegistry, FunctionResult};
use crate::runner::MAX_RESULT_BYTES;

mod actor;
mod detect;
mod objects;
mod pip_env;
mod versions;

pub use actor::ACTOR_CLASS;

pub use detect::PythonDetection;

/// The name of the built-in function that runs Python tasks.
pub const FUNCTION: &str = "escher.python";
/// The resource a worker with Python advertises, one unit per interpreter it may run at once.
pub const RESOURCE: &str = "shared/python";
/// The interpreter a worker runs Python tasks with: a path, a name on `PATH`, `auto`
/// (`python3` on `PATH`, if usable) or `off`.
pub const ENV_PYTHON: &str = "ESCHER_PYTHON";
/// How many Python tasks a worker runs at once (default: its CPUs).
pub const ENV_SLOTS: &str = "ESCHER_PYTHON_SLOTS";

/// The interpreter's side of the protocol.
const RUNNER: &str = include_str!("runner.py");
/// The magic of a task's argument bytes.
const MAGIC: &[u8; 4] = b"ESPY";
/// How many bytes of functions the worker keeps (by namespace and hash) for later calls.
const BLOB_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// How long the worker waits for the head to give it an argument's result.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a running Python task's log files are held to the cap.
const LOG_CAP_EVERY: Duration = Duration::from_secs(1);
/// A warm interpreter takes a task with a memory limit only while it holds at most
/// 1/`MAX_WARM_SHARE` of that limit in anonymous memory (`Interpreter::hold_to`).
const MAX_WARM_SHARE: u64 = 2;

/// The node label that says whether, and with which Python, the worker runs Python tasks:
/// its version (`3.11.2`), or `none:CAUSE` (`none:closed-to-task-users:/root`,
/// `none:no-cloudpickle`, `none:no-python3-on-path`, `none:turned-off`; the worker's log says
/// the whole story). Set by `escher-worker`, and by any worker asked for Python.
pub const LABEL: &str = "escher.python";
/// The node label with the cloudpickle version of a worker that runs Python tasks.
pub const CLOUDPICKLE_LABEL: &str = "escher.cloudpickle";

/// Registers [`FUNCTION`] and the actor class [`ACTOR_CLASS`] and adds the [`RESOURCE`] slots when this worker has a usable
/// interpreter ([`detect::resolve`]: the one `ESCHER_PYTHON` names, or, as `mode` says,
/// `python3` on `PATH`, checked as `isolation` runs tasks); does nothing otherwise. Either way,
/// where Python was asked for, `labels` gets [`LABEL`]. An interpreter `ESCHER_PYTHON` names
/// that cannot run Python tasks is an error that says why.
pub(crate) fn install(
    mode: PythonDetection,
    resources: &mut ResourceSet,
    labels: &mut Labels,
    functions: &mut FunctionRegistry,
    actors: &mut std::collections::BTreeMap<String, crate::actors::ActorClass>,
    isolation: Arc<Isolation>,
    scratch: Option<Arc<crate::exec::Scratch>>,
) -> Result<(), WorkerError> {
    let offer = detect::resolve(mode, &isolation)?;
    for (key, value) in offer.labels() {
        // Valid label text by construction (`Offer::labels`).
        let _ = labels.insert(key, &value);
    }
    let detect::Offer::Serve(found) = offer else {
        return Ok(());
    };
    let slots = match std::env::var(ENV_SLOTS) {
        Ok(text) if !text.trim().is_empty() => text.trim().parse::<u64>().map_err(|_| {
            WorkerError::config(
                "python-slots",
                format!("{ENV_SLOTS} is a whole number of interpreters, not {text:?}"),
            )
        })?,
        _ => {
            let cpu = resources.get("cpu").raw();
            cpu.div_ceil(Amount::ONE.raw()).max(1)
        }
    };
    let name = ResourceName::new(RESOURCE).expect("a valid resource name");
    if resources.get(RESOURCE).is_zero() && slots > 0 {
        let amount =
            Amount::units(slots).map_err(|e| WorkerError::config("python-slots", e.to_string()))?;
        resources.insert(name, amount);
    }
    let pool = Arc::new(Pool::new(found, isolation, scratch));
    actors.insert(ACTOR_CLASS.to_string(), actor::class(Arc::clone(&pool)));
    functions.insert(
        FUNCTION.to_string(),
        functions::raw(move |ctx, args| {
            let pool = Arc::clone(&pool);
            async move { pool.run(ctx, args).await }
        }),
    )
}

/// The command that starts `exe` as a task would: with the tasks' environment (the worker's
/// harmless variables and `HOME`, `PYTHONPATH`, `VIRTUAL_ENV`; never its token) and, where
/// tasks run as users of their own, as `user`, in its home. The check at start
/// (`detect.rs`) and the warm interpreters use it, so that what the check found is what tasks
/// get.
fn interpreter_command(exe: &Path, user: Option<&TaskUser>) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let pass = ["HOME", "PYTHONPATH", "VIRTUAL_ENV"].map(String::from);
    let mut command = std::process::Command::new(exe);
    command
        .env_clear()
        .envs(crate::exec::task_base_env(std::env::vars(), &pass));
    if let Some(user) = user {
        command
            .uid(user.uid)
            .gid(user.uid)
            .env("HOME", &user.home)
            .current_dir(&user.home);
    }
    command
}

/// A parsed task argument.
#[derive(Debug)]
enum Envelope {
    /// Keep these function bytes as the task's result.
    Store(Vec<u8>),
    /// Run a function.
    Call {
        /// The driver's Python and cloudpickle (format 2; format 1 does not say).
        driver: Option<versions::Versions>,
        /// runtime_env's pip requirements, sorted (format 3; empty for none).
        pip: Vec<String>,
        hash: [u8; 32],
        blob: u64,
        inline: Option<Bytes>,
        deps: Vec<u64>,
        args: Bytes,
    },
}

/// Reads the envelope of a task's argument bytes.
fn parse(mut bytes: Vec<u8>) -> Result<Envelope, String> {
    let bad = |why: &str| {
        format!(
            "not a Python task's arguments ({why}): tasks of function {FUNCTION:?} are \
             submitted by escher's Python package (`@escher.remote`)"
        )
    };
    if bytes.len() < 6 || &bytes[..4] != MAGIC {
        return Err(bad("no ESPY header"));
    }
    let format = bytes[4];
    if !(1..=3).contains(&format) {
        return Err(bad(&format!(
            "format version {format}, this worker reads 1 to 3; upgrade the worker or the \
             package"
        )));
    }
    match bytes[5] {
        2 => Ok(Envelope::Store(bytes.split_off(6))),
        1 => {
            let all = Bytes::from(bytes);
            let mut at = 6;
            let mut take = |n: usize| -> Result<Bytes, String> {
                if all.len() < at + n {
                    return Err(bad("truncated"));
                }
                at += n;
                Ok(all.slice(at - n..at))
            };
            let driver = if format >= 2 {
                let len = take(1)?[0] as usize;
                let text = take(len)?;
                Some(
                    std::str::from_utf8(&text)
                        .ok()
                        .and_then(versions::Versions::parse)
                        .ok_or_else(|| bad("the driver's versions are unreadable"))?,
                )
            } else {
                None
            };
            let pip = if format >= 3 {
                let len = u32::from_le_bytes(take(4)?.as_ref().try_into().expect("4 bytes"));
                pip_env::parse(&take(len as usize)?)?
            } else {
                Vec::new()
            };
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&take(32)?);
            let blob = u64::from_le_bytes(take(8)?.as_ref().try_into().expect("8 bytes"));
            let fn_len = u32::from_le_bytes(take(4)?.as_ref().try_into().expect("4 bytes"));
            let inline = take(fn_len as usize)?;
            let ndeps = u32::from_le_bytes(take(4)?.as_ref().try_into().expect("4 bytes"));
            let mut deps = Vec::with_capacity(ndeps.min(1024) as usize);
            for _ in 0..ndeps {
                deps.push(u64::from_le_bytes(
                    take(8)?.as_ref().try_into().expect("8 bytes"),
                ));
            }
            let args = all.slice(at..);
            if fn_len == 0 && blob == 0 {
                return Err(bad("neither a function nor the task that stores it"));
            }
            Ok(Envelope::Call {
                driver,
                pip,
                hash,
                blob,
                inline: (fn_len > 0).then_some(inline),
                deps,
                args,
            })
        }
        kind => Err(bad(&format!("unknown kind {kind}"))),
    }
}

/// Function bytes by namespace and hash, and how many bytes they hold together.
type Blobs = (HashMap<(String, [u8; 32]), Bytes>, usize);

/// The warm interpreters of one worker, and the functions it has fetched.
#[derive(Debug)]
struct Pool {
    /// The interpreter, and its Python's and cloudpickle's versions.
    found: detect::Found,
    /// Whom interpreters run as: each namespace's own user, as its command tasks do.
    isolation: Arc<Isolation>,
    /// Where each interpreter gets a scratch of its own (its `HOME` and `TMPDIR`, a tmpfs of
    /// the default scratch size), as command tasks do; `None` where they get none.
    scratch: Option<Arc<crate::exec::Scratch>>,
    /// Idle interpreters, by namespace ("" for none) and, for those of a pip environment, its
    /// interpreter (`NAMESPACE\0PATH`).
    idle: Mutex<HashMap<String, Vec<Interpreter>>>,
    /// Function bytes fetched from their store tasks, by namespace and hash, and their size.
    blobs: Mutex<Blobs>,
    /// The environments of runtime_env's pip requirement sets.
    envs: pip_env::Envs,
}

impl Pool {
    fn new(
        found: detect::Found,
        isolation: Arc<Isolation>,
        scratch: Option<Arc<crate::exec::Scratch>>,
    ) -> Pool {
        Pool {
            found,
            isolation,
            scratch,
            idle: Mutex::default(),
            blobs: Mutex::default(),
            envs: pip_env::Envs::default(),
        }
    }

    /// Runs one task's envelope to its end.
    async fn run(&self, ctx: TaskContext, args: Vec<u8>) -> FunctionResult {
        let (driver, pip, hash, blob, inline, deps, args) = match parse(args)? {
            Envelope::Store(bytes) => return Ok(bytes),
            Envelope::Call {
                driver,
                pip,
                hash,
                blob,
                inline,
                deps,
                args,
            } => (driver, pip, hash, blob, inline, deps, args),
        };
        // Before anything is unpickled: what one Python or cloudpickle pickled, another may
        // not load (or load wrongly).
        if let Some(driver) = &driver
            && let Some(why) = versions::mismatch(driver, &self.found)
        {
            return Err(why);
        }
        let ns = ctx.namespace().map(|n| n.to_string()).unwrap_or_default();
        let exe = self.interpreter(&ns, &pip).await?;
        // Warm interpreters by namespace and, for a pip environment, by its interpreter.
        let key = match &exe {
            Some(exe) => format!("{ns}\0{}", exe.display()),
            None => ns.clone(),
        };
        let dep_results = results(&ctx, &deps, "argument").await?;
        // A result kept as an object in this node's store is handed over as its sealed file,
        // after the object arguments' (at most MAX_HANDED_OVER descriptors in all), and its
        // bytes are not in the frame: the interpreter maps it, as it maps an object argument.
        let mut handed: Vec<crate::objects::ObjectView> = Vec::new();
        let mut deps_inline: Vec<Bytes> = Vec::with_capacity(dep_results.len());
        for result in dep_results {
            match result {
                DepResult::Object(view)
                    if ctx.object_args().len() + handed.len() < MAX_HANDED_OVER =>
                {
                    deps_inline.push(Bytes::new());
                    handed.push(view);
                }
                DepResult::Object(view) => deps_inline.push(view.bytes()),
                DepResult::Inline(bytes) => deps_inline.push(bytes),
            }
        }
        let header = serde_json::json!({
            "task_id": ctx.task_id().0,
            "attempt": ctx.attempt(),
            "node_id": ctx.node_id().0,
            "head": ctx.head_list(),
            "token": ctx.token_text(),
            // The caller's object session (its label): the task's `put`s go into it.
            "object_session": ctx.object_session(),
            "tls_ca": ctx.head_trust().0,
            "tls_name": ctx.head_trust().1,
            "namespace": ns,
            "hash": hex(&hash),
            "deps": deps,
            // The object arguments this node's store holds for the task, in the order of the
            // descriptors that follow the log files (`give_output`): mapped, not fetched.
            "objects": ctx
                .object_args()
                .iter()
                .chain(&handed)
                .map(|v| [v.id().0, v.id().1, v.len()])
                .collect::<Vec<_>>(),
        })
        .to_string();
        let started = std::time::Instant::now();
        let limits = ctx.limits();
        // An idle interpreter may have died meanwhile: then a fresh one gets the task.
        for round in 0..2 {
            let (mut interp, reused) = match self.take_fitting(&key, &limits) {
                Some(interp) => (interp, true),
                None => (
                    self.spawn(&ns, exe.as_deref(), ctx.cgroups(), &limits)?,
                    false,
                ),
            };
            let function = if interp.known.contains(&hash) {
                Bytes::new()
            } else if let Some(inline) = &inline {
                // Never run under a hash it does not have: the interpreter keeps what it is
                // sent by hash, for the namespace's later calls.
                verify(&hash, inline, "function")?;
                inline.clone()
            } else {
                self.blob(&ctx, &ns, hash, blob).await?
            };
            let sent = match interp.give_output(&ctx, &handed).await {
                Ok(()) => {
                    interp
                        .send(header.as_bytes(), &function, &deps_inline, &args)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                if reused && round == 0 {
                    continue;
                }
                return Err(format!("cannot send the task to a Python interpreter: {e}"));
            }
            let (status, body) = match interp.receive_capped(&ctx).await {
                Ok(answer) => answer,
                Err(e) => {
                    // Killed with the worker's other tasks when it stalled or lost its lease.
                    if let Some(why) = crate::fence::stopped_since(started) {
                        return Err(format!("stopped by the fence: {why}"));
                    }
                    // Killed by the kernel for going past the task's memory limit.
                    if let Some(limit) = interp.process.memory_exceeded() {
                        let how = interp.process.ended().await;
                        return Err(crate::exec::memory_exceeded(limit, &how));
                    }
                    return Err(format!(
                        "the Python interpreter ({}) ended before answering: {e}; a function \
                         that exits the process or crashes it ends its task this way",
                        exe.as_deref().unwrap_or(&self.found.exe).display()
                    ));
                }
            };
            // A process the function started, killed for the task's memory limit while the
            // interpreter lived on (a v1 memory hierarchy kills one process): the task went
            // past its request, and fails even if the function carried on and returned.
            let exceeded = interp
                .process
                .cgroup
                .as_ref()
                .and_then(|c| c.cgroup().oom_watch())
                .and_then(|w| w.exceeded_after(status == 0));
            if status != 2 {
                interp.known.insert(hash);
            }
            self.give_back(&key, interp);
            return match (status, exceeded) {
                (0, None) => Ok(body),
                // The body is the function's result, not an error to show.
                (0, Some(limit)) => Err(crate::exec::memory_exceeded(
                    limit,
                    &"a process the function started",
                )),
                (_, Some(limit)) => Err(format!(
                    "{}\n{}",
                    crate::exec::memory_exceeded(limit, &"a process the function started"),
                    String::from_utf8_lossy(&body)
                )),
                // The function or its arguments could not be loaded: say which versions met.
                (2, None) => Err(versions::load_failure(
                    &String::from_utf8_lossy(&body),
                    driver.as_ref(),
                    &self.found,
                )),
                _ => Err(String::from_utf8_lossy(&body).into_owned()),
            };
        }
        unreachable!("the second round returns")
    }

    /// The interpreter of the environment of `pip` for namespace `ns`'s tasks (made now if
    /// it is not yet: `pip_env.rs`); `None` (the worker's own) for no requirements.
    async fn interpreter(
        &self,
        ns: &str,
        pip: &[String],
    ) -> Result<Option<std::path::PathBuf>, String> {
        if pip.is_empty() {
            return Ok(None);
        }
        let user = self
            .isolation
            .user_for((!ns.is_empty()).then_some(ns))
            .map_err(|why| format!("cannot run the task as its own user: {why}"))?;
        self.envs
            .interpreter(&self.found, ns, user.as_ref(), pip)
            .await
            .map(Some)
    }

    fn take(&self, ns: &str) -> Option<Interpreter> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.get_mut(ns).and_then(Vec::pop)
    }

    /// An idle interpreter of `key`, its cgroup now holding `limits` (the next task's), if
    /// one fits them ([`Interpreter::hold_to`]); one that does not is ended.
    fn take_fitting(&self, key: &str, limits: &crate::exec::TaskLimits) -> Option<Interpreter> {
        while let Some(mut interp) = self.take(key) {
            match interp.hold_to(limits) {
                Ok(()) => return Some(interp),
                Err(why) => {
                    tracing::debug!(%why, "a warm Python interpreter ended: a fresh one takes the task");
                }
            }
        }
        None
    }

    fn give_back(&self, ns: &str, interp: Interpreter) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.entry(ns.to_string()).or_default().push(interp);
    }

    /// A fresh interpreter for the tasks of namespace `ns` (`""`: an admin's), as that
    /// namespace's user where the worker gives each one its own, in a cgroup of its own from
    /// `cgroups` where the worker has them, holding `limits` (its first task's, or its
    /// actor's): `exe` (a pip environment's) or the worker's own.
    fn spawn(
        &self,
        ns: &str,
        exe: Option<&Path>,
        cgroups: Option<&Arc<crate::exec::TaskCgroups>>,
        limits: &crate::exec::TaskLimits,
    ) -> Result<Interpreter, String> {
        let exe = exe.unwrap_or(&self.found.exe);
        let user = self
            .isolation
            .user_for((!ns.is_empty()).then_some(ns))
            .map_err(|why| format!("cannot run the task as its own user: {why}"))?;
        // A scratch of its own, as a command task's: its HOME, TMPDIR and working directory,
        // emptied when the interpreter goes (exec/scratch.rs).
        let scratch = match (&self.scratch, &user) {
            (Some(scratch), Some(user)) => {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(
                    scratch
                        .mount(&format!("python-{n}"), user.uid, scratch.default_bytes())
                        .map_err(|why| {
                            format!("cannot give a Python interpreter its scratch: {why}")
                        })?,
                )
            }
            _ => None,
        };
        let user = match (user, &scratch) {
            (Some(user), Some(s)) => Some(TaskUser {
                home: s.path().to_path_buf(),
                ..user
            }),
            (user, _) => user,
        };
        let mut command = Command::from(interpreter_command(exe, user.as_ref()));
        if let Some(scratch) = &scratch {
            command.env("TMPDIR", scratch.path());
        }
        command.arg("-u").arg("-c").arg(RUNNER);
        // Made before the spawn, so that an interpreter is never started uncontained by a
        // cgroup that could not be made.
        let cgroup = match cgroups {
            Some(cgroups) => Some(cgroups.create_limited(limits).map_err(|e| {
                format!(
                    "cannot create a cgroup holding the task's limits for a Python interpreter \
                     under {}: {e}",
                    cgroups.root().display()
                )
            })?),
            None => None,
        };
        // Its stderr is a socket, on which it gets each task's log files (`give_output`).
        let (ctl, child_ctl) = std::os::unix::net::UnixStream::pair()
            .and_then(|(ctl, child)| ctl.set_nonblocking(true).map(|()| (ctl, child)))
            .map_err(|e| format!("cannot make a socket for a Python interpreter: {e}"))?;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::os::fd::OwnedFd::from(child_ctl)))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start the Python interpreter {} ({ENV_PYTHON}): {e}",
                    exe.display()
                )
            })?;
        // Into its cgroup before it runs a task (see `exec/cgroup.rs`); the fence holds the
        // cgroup, and the process group, from now on.
        let cgroup = match (cgroup, child.id()) {
            (Some(cgroup), Some(pid)) => {
                if let Err(e) = cgroup.enter(pid) {
                    let _ = child.start_kill();
                    return Err(format!(
                        "cannot move a Python interpreter into its cgroup {}: {e}",
                        cgroup.path().display()
                    ));
                }
                Some(crate::fence::HeldCgroup::new(cgroup))
            }
            _ => None,
        };
        let pid = child.id().map(|id| id as i32);
        if let Some(pid) = pid {
            crate::fence::hold(pid);
        }
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Interpreter {
            process: Process {
                child,
                pid,
                cgroup,
                _scratch: scratch,
            },
            stdin,
            stdout,
            ctl,
            known: HashSet::new(),
        })
    }

    /// The function bytes stored by task `blob`, from the cache or the head.
    async fn blob(
        &self,
        ctx: &TaskContext,
        ns: &str,
        hash: [u8; 32],
        blob: u64,
    ) -> Result<Bytes, String> {
        let key = (ns.to_string(), hash);
        if let Some(bytes) = self
            .blobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(&key)
        {
            return Ok(bytes.clone());
        }
        let bytes = results(ctx, &[blob], "function")
            .await?
            .remove(0)
            .into_bytes();
        verify(&hash, &bytes, &format!("function stored by task {blob}"))?;
        let mut cache = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        if cache.1 + bytes.len() > BLOB_CACHE_BYTES {
            cache.0.clear();
            cache.1 = 0;
        }
        cache.1 += bytes.len();
        cache.0.insert(key, bytes.clone());
        Ok(bytes)
    }
}

/// A task's result as [`results`] finds it.
enum DepResult {
    /// Kept in the head (at most 100 KiB).
    Inline(Bytes),
    /// Kept as an object, now in this node's store (pinned while the view lives).
    Object(crate::objects::ObjectView),
}

impl DepResult {
    /// Its bytes (an object's: a view of the store's mapping, no copy).
    fn into_bytes(self) -> Bytes {
        match self {
            DepResult::Inline(bytes) => bytes,
            DepResult::Object(view) => view.bytes(),
        }
    }
}

/// The maximum number of store files handed to an interpreter with a task: object arguments
/// and results together (`runner.py`'s `_MAX_OBJECT_FDS`, less its two log files); a result
/// past it travels in the frame.
const MAX_HANDED_OVER: usize = 62;

/// The results of the tasks `ids` (each one succeeded: the scheduler started this task only
/// then), fetched from the head with the task's credential, in the order given.
async fn results(ctx: &TaskContext, ids: &[u64], what: &str) -> Result<Vec<DepResult>, String> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut unique: Vec<TaskId> = ids.iter().map(|id| TaskId(*id)).collect();
    unique.sort();
    unique.dedup();
    let request = WaitRequest {
        num_returns: unique.len() as u32,
        task_ids: unique,
        timeout: Some(FETCH_TIMEOUT),
    };
    let reply = ctx
        .cluster_client()
        .wait(wire::WaitRequest::from(request))
        .await
        .map_err(|s| {
            format!(
                "cannot fetch the {what} tasks' results from the head: {}",
                s.message()
            )
        })?;
    let reply = WaitReply::try_from(reply.into_inner())
        .map_err(|e| format!("the head's answer about the {what} tasks is malformed: {e}"))?;
    if let Some(id) = reply.not_ready.first() {
        return Err(format!(
            "{what} task {id} has not finished after {FETCH_TIMEOUT:?}; it should have before this \
             task started"
        ));
    }
    let by_id: HashMap<u64, _> = reply.ready.into_iter().map(|s| (s.id.0, s)).collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        // A result above 100 KiB is an object on the worker that made it: brought here worker
        // to worker (never through the head), then read from this node's store.
        if let Some(status) = by_id.get(id)
            && status.state == TaskState::Succeeded
            && let Some(TaskResult::Object { .. }) = status.result
        {
            let object = ObjectId::task_result(TaskId(*id));
            let Some(objects) = ctx.node_objects() else {
                return Err(format!(
                    "{what} task {id}'s result is object {object}, and this context has no store"
                ));
            };
            let view = crate::objects::args::bring(objects, ctx, object)
                .await
                .map_err(|e| format!("{what} task {id}'s result, object {object}: {e}"))?;
            out.push(Ok(DepResult::Object(view)));
            continue;
        }
        out.push(Err(*id));
    }
    out.into_iter()
        .map(|r| match r {
            Ok(result) => Ok(result),
            Err(id) => inline(&by_id, id, what).map(DepResult::Inline),
        })
        .collect()
}

/// The inline result of task `id` among `by_id`, or why there is none.
fn inline(by_id: &HashMap<u64, TaskStatus>, id: u64, what: &str) -> Result<Bytes, String> {
    let status = by_id
        .get(&id)
        .ok_or_else(|| format!("the head did not answer for {what} task {id}"))?;
    match (&status.state, &status.result) {
        (TaskState::Succeeded, Some(TaskResult::Returned(bytes))) => Ok(bytes.clone()),
        (TaskState::Succeeded, _) if status.evicted => Err(format!(
            "{what} task {id} was evicted by the head's retention with its result; run it again"
        )),
        (state, _) => Err(format!(
            "{what} task {id} is {state:?} and returned no value{}",
            status
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )),
    }
}

/// One warm interpreter: a child in a process group of its own and, where the worker has task
/// cgroups, in a cgroup of its own too; both killed whole when it is dropped.
#[derive(Debug)]
struct Interpreter {
    process: Process,
    stdin: ChildStdin,
    /// Buffered: an answer's length, status and body come in one read.
    stdout: BufReader<ChildStdout>,
    /// The worker's end of the socket that is the interpreter's stderr: each task's log files
    /// travel on it.
    ctl: std::os::unix::net::UnixStream,
    /// The functions (by hash) it holds.
    known: HashSet<[u8; 32]>,
}

/// An interpreter's process, its group and its cgroup: killed whole when dropped.
#[derive(Debug)]
struct Process {
    child: Child,
    pid: Option<i32>,
    /// Its cgroup (killed, and back in the worker's pool, when dropped after the process
    /// group): what the functions it ran started is in it, whatever process group it left.
    /// It holds the limits of the task the interpreter runs (of its actor).
    cgroup: Option<crate::fence::HeldCgroup>,
    /// Its scratch, its `HOME` and `TMPDIR`: emptied after the process group and the cgroup
    /// are killed (dropped after them).
    _scratch: Option<crate::exec::TaskScratch>,
}

impl Process {
    /// The memory limit its task went past, when the kernel's OOM killer has killed one of
    /// its processes since the task began (its cgroup's count, `OomWatch`).
    fn memory_exceeded(&self) -> Option<u64> {
        memory_exceeded(self.cgroup.as_ref())
    }

    /// How the interpreter ended, waiting a moment for it: for a reason.
    async fn ended(&mut self) -> String {
        let pid = self.pid.unwrap_or_default();
        match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
            Ok(Ok(status)) => format!(
                "its Python interpreter, pid {pid}, {}",
                crate::exec::ProcessExit::from(status)
            ),
            _ => format!("its Python interpreter, pid {pid}, stopped answering"),
        }
    }
}

/// The memory limit of the task an interpreter's `cgroup` holds, when the kernel's OOM killer
/// has killed one of its processes since the task began (`OomWatch`).
fn memory_exceeded(cgroup: Option<&crate::fence::HeldCgroup>) -> Option<u64> {
    cgroup?.cgroup().oom_watch()?.exceeded()
}

impl Interpreter {
    /// Holds its cgroup to `limits`, the next task's, in place of the last task's; or says
    /// why this interpreter cannot take that task, which a fresh one then runs. A memory limit
    /// is written only over an interpreter whose anonymous memory (what the kernel cannot
    /// reclaim without swap; page cache it reclaims as the limit is written) is at most half
    /// of it ([`MAX_WARM_SHARE`]): a lower limit would be refused (cgroup v1) or kill the
    /// interpreter as it is written (v2), and one just above what an earlier task left would
    /// give this task little of its own request.
    fn hold_to(&mut self, limits: &crate::exec::TaskLimits) -> Result<(), String> {
        let Some(held) = self.process.cgroup.as_mut() else {
            return Ok(());
        };
        if let (Some(limit), Some(anon)) = (limits.memory, held.cgroup().anonymous_memory())
            && anon > limit / MAX_WARM_SHARE
        {
            return Err(format!(
                "it holds {anon} bytes of anonymous memory, more than 1/{MAX_WARM_SHARE} of \
                 the next task's memory limit of {limit} bytes"
            ));
        }
        held.cgroup_mut()
            .hold_to(limits)
            .map_err(|e| format!("cannot hold its cgroup to the next task's limits: {e}"))
    }

    async fn send(
        &mut self,
        header: &[u8],
        function: &[u8],
        deps: &[Bytes],
        args: &[u8],
    ) -> std::io::Result<()> {
        let too_big = || std::io::Error::other("the task's frame exceeds 4 GiB");
        let len = |n: usize| u32::try_from(n).map_err(|_| too_big());
        let body: usize = 4
            + header.len()
            + 4
            + function.len()
            + 4
            + deps.iter().map(|d| 4 + d.len()).sum::<usize>()
            + args.len();
        // One buffer, one write (a small task's frame reaches the interpreter in one wake-up);
        // copying the arguments costs less than the writes it saves.
        let mut frame = Vec::with_capacity(4 + body);
        frame.extend_from_slice(&len(body)?.to_be_bytes());
        frame.extend_from_slice(&len(header.len())?.to_be_bytes());
        frame.extend_from_slice(header);
        frame.extend_from_slice(&len(function.len())?.to_be_bytes());
        frame.extend_from_slice(function);
        frame.extend_from_slice(&len(deps.len())?.to_be_bytes());
        for dep in deps {
            frame.extend_from_slice(&len(dep.len())?.to_be_bytes());
            frame.extend_from_slice(dep);
        }
        frame.extend_from_slice(args);
        self.stdin.write_all(&frame).await?;
        self.stdin.flush().await
    }

    /// Makes the attempt's log files (as a command task's: `{task}-{attempt}.out` and
    /// `.err`) and hands them to the interpreter, which points its stdout and stderr at them
    /// for the task it is sent next: what the function prints is the task's output, which
    /// `escher logs` reads, never the worker's.
    async fn give_output(
        &mut self,
        ctx: &TaskContext,
        results: &[crate::objects::ObjectView],
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let files = match ctx.logs() {
            Some(logs) => {
                let (dir, task, attempt) = (logs.dir.clone(), ctx.task_id().0, ctx.attempt());
                let (kept, out, err) = tokio::task::spawn_blocking(move || {
                    crate::exec::AttemptLogs::create(&dir, task, attempt)
                })
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
                *logs.files.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
                (out, err)
            }
            None => {
                let null = || std::fs::OpenOptions::new().write(true).open("/dev/null");
                (null()?, null()?)
            }
        };
        // Then one descriptor per object argument, opened read-only by the worker (whose
        // user alone may open the store's directories): the interpreter maps the sealed file
        // itself, with no fetch and no copy, whichever user it runs as. The views in `ctx` pin
        // the files (neither spilled nor unlinked) until the task's answer.
        let objects = open_object_args(ctx, results)?;
        let mut fds = vec![files.0.as_raw_fd(), files.1.as_raw_fd()];
        fds.extend(objects.iter().map(|f| f.as_raw_fd()));
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        // One byte with the descriptors; the socket is empty (the interpreter took the
        // last task's), so this never waits.
        nix::sys::socket::sendmsg::<()>(
            self.ctl.as_raw_fd(),
            &[std::io::IoSlice::new(b"F")],
            &cmsg,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(std::io::Error::from)?;
        Ok(())
    }

    /// [`Self::receive`], holding the task's log files to the worker's cap meanwhile.
    async fn receive_capped(&mut self, ctx: &TaskContext) -> std::io::Result<(u8, Vec<u8>)> {
        let Some(logs) = ctx.logs() else {
            return self.receive(ctx).await;
        };
        let answer = self.receive(ctx);
        tokio::pin!(answer);
        let mut every = tokio::time::interval(LOG_CAP_EVERY);
        loop {
            tokio::select! {
                answer = &mut answer => return answer,
                _ = every.tick() => cap(logs),
            }
        }
    }

    /// The task's answer; meanwhile, each `escher.get` the task asks of the worker is served
    /// (`objects.rs`): the copies it hands over stay pinned until the answer.
    async fn receive(&mut self, ctx: &TaskContext) -> std::io::Result<(u8, Vec<u8>)> {
        let mut held = Vec::new();
        loop {
            let (status, body) = self.receive_frame().await?;
            if status != objects::GET {
                return Ok((status, body));
            }
            let id = objects::parse(&body).map_err(std::io::Error::other)?;
            let answer = objects::serve(ctx, id).await;
            objects::reply(&self.ctl, id, &answer).await?;
            held.extend(answer.ok());
        }
    }

    async fn receive_frame(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let len = self.stdout.read_u32().await? as usize;
        if len == 0 || len > MAX_RESULT_BYTES + 1 {
            return Err(std::io::Error::other(format!(
                "it answered with a frame of {len} bytes (at most {} are allowed)",
                MAX_RESULT_BYTES + 1
            )));
        }
        let status = self.stdout.read_u8().await?;
        let mut body = vec![0; len - 1];
        self.stdout.read_exact(&mut body).await?;
        Ok((status, body))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The whole group: whatever the function started goes with it (and, with the cgroup
        // next, what left the group).
        if let Some(pid) = self.pid {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            crate::fence::release(pid);
        }
        let _ = self.child.start_kill();
    }
}

/// Opens the sealed file of each of the task's object arguments (in `ctx.object_args()`'s
/// order), then of each result in `results`, read-only, for the interpreter to map
/// (`give_output`).
fn open_object_args(
    ctx: &TaskContext,
    results: &[crate::objects::ObjectView],
) -> std::io::Result<Vec<std::fs::File>> {
    ctx.object_args()
        .iter()
        .chain(results)
        .map(|view| {
            std::fs::File::open(view.path()).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot open object argument {}'s file {} for the interpreter: {e}",
                        view.id(),
                        view.path().display()
                    ),
                )
            })
        })
        .collect()
}

/// Holds an attempt's log files to the worker's cap (`--task-log-bytes`); a failure is logged,
/// never the task's.
fn cap(logs: &crate::context::TaskLogs) {
    let mut files = logs.files.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(files) = files.as_mut()
        && let Err(error) = files.cap(logs.max_bytes)
    {
        tracing::warn!(%error, "cannot hold a Python task's log to its cap");
    }
}

/// Refuses `bytes` that are not what `hash` (their SHA-256, as the driver computed it) names:
/// a function planted under another function's hash never reaches an interpreter.
fn verify(hash: &[u8; 32], bytes: &[u8], what: &str) -> Result<(), String> {
    use sha2::{Digest as _, Sha256};
    let actual: [u8; 32] = Sha256::digest(bytes).into();
    if &actual == hash {
        return Ok(());
    }
    Err(format!(
        "refused the {what}: its {} bytes have SHA-256 {}, not the {} the task names; the \
         bytes were changed or planted under another function's hash (submit the call with \
         escher's Python package, which hashes what it sends)",
        bytes.len(),
        hex(&actual),
        hex(hash)
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(fn_len: u32, blob: u64, deps: &[u64]) -> Vec<u8> {
        call_from(None, fn_len, blob, deps)
    }

    /// A call in format 1 (`versions` `None`) or 2.
    fn call_from(versions: Option<&str>, fn_len: u32, blob: u64, deps: &[u64]) -> Vec<u8> {
        let mut v = match versions {
            None => b"ESPY\x01\x01".to_vec(),
            Some(text) => {
                let mut v = b"ESPY\x02\x01".to_vec();
                v.push(text.len() as u8);
                v.extend_from_slice(text.as_bytes());
                v
            }
        };
        v.extend_from_slice(&[7u8; 32]);
        v.extend_from_slice(&blob.to_le_bytes());
        v.extend_from_slice(&fn_len.to_le_bytes());
        v.extend(std::iter::repeat_n(b'f', fn_len as usize));
        v.extend_from_slice(&(deps.len() as u32).to_le_bytes());
        for d in deps {
            v.extend_from_slice(&d.to_le_bytes());
        }
        v.extend_from_slice(b"args");
        v
    }

    #[test]
    fn parses_calls_and_stores() {
        match parse(call(3, 0, &[5, 9])).unwrap() {
            Envelope::Call {
                driver,
                pip,
                hash,
                blob,
                inline,
                deps,
                args,
            } => {
                assert_eq!(driver, None);
                assert!(pip.is_empty());
                assert_eq!(hash, [7u8; 32]);
                assert_eq!(blob, 0);
                assert_eq!(inline.as_deref(), Some(&b"fff"[..]));
                assert_eq!(deps, vec![5, 9]);
                assert_eq!(&args[..], b"args");
            }
            other => panic!("{other:?}"),
        }
        match parse(call(0, 12, &[])).unwrap() {
            Envelope::Call { blob, inline, .. } => assert_eq!((blob, inline), (12, None)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(b"ESPY\x01\x02abc".to_vec()).unwrap(),
            Envelope::Store(b) if b == b"abc"
        ));
    }

    #[test]
    fn format_2_carries_the_drivers_versions() {
        match parse(call_from(Some("3.12.3 3.1.1"), 3, 0, &[5])).unwrap() {
            Envelope::Call {
                driver,
                inline,
                deps,
                args,
                ..
            } => {
                let driver = driver.expect("versions");
                assert_eq!(
                    (driver.python.as_str(), driver.cloudpickle.as_str()),
                    ("3.12.3", "3.1.1")
                );
                assert_eq!(inline.as_deref(), Some(&b"fff"[..]));
                assert_eq!((deps, &args[..]), (vec![5], &b"args"[..]));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(b"ESPY\x02\x02abc".to_vec()).unwrap(),
            Envelope::Store(b) if b == b"abc"
        ));
        let e = parse(call_from(Some("3.12.3"), 3, 0, &[])).unwrap_err();
        assert!(e.contains("versions are unreadable"), "{e}");
    }

    #[test]
    fn format_3_carries_the_pip_requirements() {
        let mut v = b"ESPY\x03\x01".to_vec();
        v.push(12);
        v.extend_from_slice(b"3.12.3 3.1.1");
        let pip = b"zlib-thing==1\n./local_pkg\n";
        v.extend_from_slice(&(pip.len() as u32).to_le_bytes());
        v.extend_from_slice(pip);
        v.extend_from_slice(&call(3, 0, &[5])[6..]);
        match parse(v.clone()).unwrap() {
            Envelope::Call {
                driver,
                pip,
                inline,
                deps,
                args,
                ..
            } => {
                assert_eq!(driver.expect("versions").cloudpickle, "3.1.1");
                assert_eq!(pip, vec!["./local_pkg".to_string(), "zlib-thing==1".into()]);
                assert_eq!(inline.as_deref(), Some(&b"fff"[..]));
                assert_eq!((deps, &args[..]), (vec![5], &b"args"[..]));
            }
            other => panic!("{other:?}"),
        }
        // An option of pip is refused before anything runs.
        let mut bad = b"ESPY\x03\x01".to_vec();
        bad.push(12);
        bad.extend_from_slice(b"3.12.3 3.1.1");
        bad.extend_from_slice(&13u32.to_le_bytes());
        bad.extend_from_slice(b"--index-url=x");
        bad.extend_from_slice(&call(3, 0, &[])[6..]);
        assert!(parse(bad).unwrap_err().contains("option of pip"));
        // A length past the end is a truncated envelope.
        let mut short = v[..19].to_vec();
        short.extend_from_slice(&1000u32.to_le_bytes());
        assert!(parse(short).unwrap_err().contains("truncated"));
    }

    #[test]
    fn refuses_what_is_not_an_envelope() {
        assert!(
            parse(b"hello".to_vec())
                .unwrap_err()
                .contains("no ESPY header")
        );
        assert!(
            parse(b"ESPY\x04\x01".to_vec())
                .unwrap_err()
                .contains("version 4")
        );
        assert!(
            parse(b"ESPY\x01\x09".to_vec())
                .unwrap_err()
                .contains("unknown kind")
        );
        let mut short = call(3, 0, &[1]);
        short.truncate(50);
        assert!(parse(short).unwrap_err().contains("truncated"));
        assert!(parse(call(0, 0, &[])).unwrap_err().contains("neither"));
    }

    /// On a root worker whose tasks run as users of their own, an interpreter starts with a
    /// scratch of its own (a tmpfs of the default scratch size) as its `HOME`, `TMPDIR` and
    /// working directory, its user's; the scratch is emptied once the interpreter is gone. The
    /// "interpreter" is a script that prints what it got: what is tested is how the worker
    /// starts one, not Python.
    #[tokio::test]
    async fn needs_root_a_python_interpreter_gets_a_scratch_of_its_own() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        use tokio::io::AsyncBufReadExt;
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it mounts a tmpfs and changes user"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.path().join("python3");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho \"$HOME $TMPDIR $(pwd) $(id -u) $(stat -f -c '%b %S' \"$TMPDIR\")\"\n\
             exec sleep 60\n",
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tasks = tempfile::tempdir().unwrap();
        let isolation = Arc::new(
            Isolation::resolve(crate::exec::TaskUsers::Auto, None, Some(tasks.path())).unwrap(),
        );
        let uid = isolation.user_for(Some("ns")).unwrap().unwrap().uid;
        let scratch = Arc::new(crate::exec::Scratch::open(tasks.path(), 1 << 20).unwrap());
        let found = detect::Found {
            exe: exe.clone(),
            version: "3.11.2".into(),
            cloudpickle: "3.0.0".into(),
        };
        let pool = Pool::new(found, Arc::clone(&isolation), Some(Arc::clone(&scratch)));
        let mut interp = pool
            .spawn("ns", None, None, &crate::exec::TaskLimits::default())
            .unwrap();
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), interp.stdout.read_line(&mut line))
            .await
            .expect("the interpreter printed within 30 s")
            .unwrap();
        let got: Vec<&str> = line.split_whitespace().collect();
        let [home, tmpdir, cwd, id, blocks, block] = got[..] else {
            panic!("the interpreter printed {line:?}");
        };
        assert_eq!((tmpdir, cwd), (home, home), "{line}");
        assert_eq!(id, uid.to_string(), "{line}");
        let bytes = blocks.parse::<u64>().unwrap() * block.parse::<u64>().unwrap();
        assert_eq!(
            bytes,
            1 << 20,
            "its TMPDIR is not a scratch of 1 MiB: {line}"
        );
        let home = std::path::PathBuf::from(home);
        assert!(home.starts_with(tasks.path()), "{line}");
        let meta = std::fs::metadata(&home).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (uid, 0o700));
        std::fs::write(home.join("left"), b"by the interpreter").unwrap();
        drop(interp);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while home.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the interpreter's scratch stayed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(pool);
        drop(scratch);
    }
}
