//! [`WorkerBuilder`]: configures a [`Worker`] and registers its functions.
//!
//! ```no_run
//! # async fn demo() -> Result<(), escher_worker::WorkerError> {
//! use escher_worker::Worker;
//!
//! let worker = Worker::builder()
//!     .head("http://127.0.0.1:7600")
//!     .resources("ssd=1".parse().expect("valid"))
//!     .typed_function("add", |_ctx, (a, b): (u64, u64)| async move { Ok::<_, String>(a + b) })
//!     .build()?;
//! worker.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use escher_proto::mig::LatencyModel;
use escher_proto::{Labels, ResourceSet};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::actors::ActorClass;
use crate::config::WorkerConfig;
use crate::context::TaskContext;
use crate::discovery::{self, hostname};
use crate::error::WorkerError;
use crate::exec::{Isolation, LogRetention, TaskUsers};
use crate::functions::{self, FunctionRegistry, FunctionResult};
use crate::worker::{LogDir, Worker};

/// Counts the workers named by default in this process, so that each gets its own name.
static DEFAULT_NAMES: AtomicU32 = AtomicU32::new(0);

/// Builds a [`Worker`]; start with [`Worker::builder`].
#[derive(Debug, Default)]
pub struct WorkerBuilder {
    config: WorkerConfig,
    functions: FunctionRegistry,
    actors: std::collections::BTreeMap<String, ActorClass>,
    data_listen: Option<std::net::SocketAddr>,
    /// The first error met while registering functions, reported by `build`.
    error: Option<WorkerError>,
}

impl WorkerBuilder {
    /// A builder with every setting at its default.
    pub fn new() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    /// A builder that starts from `config`.
    pub fn from_config(config: WorkerConfig) -> WorkerBuilder {
        WorkerBuilder {
            config,
            ..WorkerBuilder::default()
        }
    }

    /// Hosts actors of `class` (see [`ActorClass`]); a class name is registered once.
    pub fn actor(mut self, class: ActorClass) -> Self {
        let name = class.name().to_string();
        if name.is_empty() || name.len() > escher_proto::convert::MAX_NAME_BYTES {
            self.error.get_or_insert(WorkerError::config(
                "actor",
                format!("an actor class name is 1 to 256 bytes, not {name:?}"),
            ));
        } else if self.actors.insert(name.clone(), class).is_some() {
            self.error.get_or_insert(WorkerError::config(
                "actor",
                format!("the actor class {name:?} is registered twice"),
            ));
        }
        self
    }

    /// Where the data plane (callers' actor calls) listens, instead of the default: loopback
    /// when every head replica is on loopback, else every interface (`--data-listen`).
    pub fn data_listen(mut self, addr: std::net::SocketAddr) -> Self {
        self.data_listen = Some(addr);
        self
    }

    /// The most bytes of objects the node's store holds in memory (`--object-store-memory`;
    /// default 30% of the node's memory).
    pub fn object_store_memory(mut self, bytes: u64) -> Self {
        self.config.object_store_memory = Some(bytes);
        self
    }

    /// The directory (a tmpfs) the object store keeps objects in (`--object-store-dir`;
    /// default `/dev/shm`).
    pub fn object_store_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.object_store_dir = Some(dir.into());
        self
    }

    /// The directory (a disk) cold objects are spilled to (`--object-spill-dir`; default the
    /// state directory, else `/var/tmp`).
    pub fn object_spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.object_spill_dir = Some(dir.into());
        self
    }

    /// The head's URL (default `http://127.0.0.1:7600`).
    pub fn head(mut self, url: impl Into<String>) -> Self {
        self.config.head = url.into();
        self
    }

    /// Joins with `token` (the worker join token of the head's access file, or an admin
    /// token) instead of the one it would find (see [`crate::join_token`]).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.config.token = Some(token.into());
        self
    }

    /// Keeps the worker's identity (node id and secret) in `dir`, so that it comes back as
    /// the same node after it restarts (default: in memory, for the life of the process).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.state_dir = Some(dir.into());
        self
    }

    /// The worker's name (default `{hostname}-{pid}`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Static resources added to the discovered ones; `cpu` or `memory` here replaces the
    /// discovered amount.
    pub fn resources(mut self, resources: ResourceSet) -> Self {
        self.config.resources = resources;
        self
    }

    /// The number of CPUs to report instead of the discovered number.
    pub fn cpus(mut self, cpus: u64) -> Self {
        self.config.cpus = Some(cpus);
        self
    }

    /// The MiB of memory to report instead of the discovered amount.
    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.config.memory_mib = Some(mib);
        self
    }

    /// The node's labels.
    pub fn labels(mut self, labels: Labels) -> Self {
        self.config.labels = labels;
        self
    }

    /// Whom command tasks run as (default [`TaskUsers::Auto`]: a user per namespace when the
    /// worker may change user, else the worker's own).
    pub fn task_users(mut self, users: TaskUsers) -> Self {
        self.config.task_users = users;
        self
    }

    /// Whether each command task gets a cgroup of its own where the worker may create one
    /// (default: yes).
    pub fn task_cgroups(mut self, on: bool) -> Self {
        self.config.task_cgroups = on;
        self
    }

    /// The processes (threads included) each task (a command, a Python task's or actor's
    /// interpreter) may have at once (default
    /// [`DEFAULT_TASK_PIDS_MAX`](crate::exec::DEFAULT_TASK_PIDS_MAX)).
    pub fn task_pids_max(mut self, max: u64) -> Self {
        self.config.task_pids_max = max;
        self
    }

    /// The most bytes of each output stream a command task's log keeps (default
    /// [`DEFAULT_TASK_LOG_BYTES`](crate::exec::DEFAULT_TASK_LOG_BYTES)).
    pub fn task_log_bytes(mut self, bytes: u64) -> Self {
        self.config.task_log_bytes = bytes;
        self
    }

    /// The node ends at a set time: the head drains it `margin` before (see
    /// [`Walltime`](crate::config::Walltime)).
    pub fn walltime(mut self, walltime: crate::config::Walltime) -> Self {
        self.config.walltime = Some(walltime);
        self
    }

    /// Where the tasks' homes and scratch directories are made (`--task-dir`; default: the
    /// system's temporary directory).
    pub fn task_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.task_dir = Some(dir.into());
        self
    }

    /// Binds each command task's scratch over its `/tmp`, `/var/tmp` and `/dev/shm` too, where
    /// tasks get a scratch (on by default; `false` is `--no-private-tmp`).
    pub fn private_tmp(mut self, on: bool) -> Self {
        self.config.private_tmp = on;
        self
    }

    /// The scratch size of a command task that asks for no `disk` (`--task-scratch-bytes`);
    /// `None` gives tasks no scratch of their own (`--no-task-scratch`).
    pub fn task_scratch(mut self, bytes: Option<u64>) -> Self {
        self.config.task_scratch = bytes.is_some();
        if let Some(bytes) = bytes {
            self.config.task_scratch_bytes = bytes;
        }
        self
    }

    /// The free space to keep on the file systems of the log directory and the tasks'
    /// directory (`--disk-reserve`).
    pub fn disk_reserve(mut self, reserve: crate::exec::Reserve) -> Self {
        self.config.disk_reserve = reserve;
        self
    }

    /// Refuse to start unless every limit is held in the tasks' cgroups (default: start, and
    /// say which are not in a warning and the node's labels).
    pub fn require_limits(mut self, on: bool) -> Self {
        self.config.require_limits = on;
        self
    }

    /// Which cgroup hierarchy holds the task cgroups (default: the unified one where the
    /// worker may create cgroups, else the v1 freezer).
    pub fn task_cgroup_hierarchy(mut self, hierarchy: crate::exec::Hierarchy) -> Self {
        self.config.task_cgroup_hierarchy = hierarchy;
        self
    }

    /// Whether the worker looks for a Python interpreter by itself when `ESCHER_PYTHON` names
    /// none (default: it does not; `escher-worker` does).
    pub fn python(mut self, detection: crate::python::PythonDetection) -> Self {
        self.config.python = detection;
        self
    }

    /// Refuse to build unless command tasks run as users of their own.
    pub fn require_isolation(mut self, require: bool) -> Self {
        self.config.require_isolation = require;
        self
    }

    /// Passes the worker's variable `name` to command tasks (their environment holds nothing
    /// else of the worker's but [`PASSED_ENV`](crate::exec::PASSED_ENV)).
    pub fn pass_env(mut self, name: impl Into<String>) -> Self {
        self.config.pass_env.push(name.into());
        self
    }

    /// Where command logs go (default: a temporary directory removed with the worker).
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.log_dir = Some(dir.into());
        self
    }

    /// How long, and how much of, the command logs to keep (default: a week, and 1 GiB); the
    /// logs of running attempts always stay.
    pub fn log_retention(mut self, retention: LogRetention) -> Self {
        self.config.log_retention = retention;
        self
    }

    /// Adds a simulated GPU (repeatable), such as `h100-80gb` (a whole GPU) or
    /// `a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb` (MIG mode with those slices); see
    /// [`SimGpuSpec`](crate::SimGpuSpec). An illegal one makes `build` fail with the reason.
    pub fn sim_gpu(mut self, spec: impl Into<String>) -> Self {
        self.config.sim_gpus.push(spec.into());
        self
    }

    /// Whether to look for real NVIDIA GPUs through NVML (default yes). Workers sharing one
    /// machine (a [`LocalCluster`](https://docs.rs/escher)) should not all report its GPUs.
    pub fn discover_gpus(mut self, discover: bool) -> Self {
        self.config.discover_gpus = discover;
        self
    }

    /// How long simulated MIG reconfigurations take (default: MIGRator's figures, 6 s per
    /// replaced slice; [`scaled_latency`](crate::scaled_latency) scales them).
    pub fn sim_mig_latency(mut self, latency: LatencyModel) -> Self {
        self.config.sim_mig_latency = latency;
        self
    }

    /// Time a stopped command gets between SIGTERM and SIGKILL (default 5 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.config.grace = grace;
        self
    }

    /// How long running tasks may go on after shutdown is asked for (default 10 s).
    pub fn drain(mut self, drain: Duration) -> Self {
        self.config.drain = drain;
        self
    }

    /// The back-off between attempts to reach the head: from `initial`, doubling to `max`
    /// (default 50 ms to 2 s).
    pub fn reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.reconnect_initial = initial;
        self.config.reconnect_max = max;
        self
    }

    /// Registers `handler` for function tasks named `name`: it gets the task's context and
    /// argument bytes, and returns result bytes or an error message.
    pub fn function<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(TaskContext, Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FunctionResult> + Send + 'static,
    {
        self.register(name.into(), functions::raw(handler));
        self
    }

    /// Registers a typed handler for function tasks named `name`: its argument is decoded from,
    /// and its result encoded to, bytes with [`escher_proto::codec`].
    pub fn typed_function<A, R, F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(TaskContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, String>> + Send + 'static,
    {
        let name = name.into();
        let handler = functions::typed(&name, handler);
        self.register(name, handler);
        self
    }

    /// Registers every handler of `functions` (a set shared by several workers).
    pub fn functions(mut self, functions: &functions::Functions) -> Self {
        for (name, handler) in functions.entries() {
            self.register(name, handler);
        }
        for class in functions.actor_classes() {
            self = self.actor(class.clone());
        }
        self
    }

    fn register(&mut self, name: String, handler: functions::Handler) {
        if let Err(e) = self.functions.insert(name, handler) {
            self.error.get_or_insert(e);
        }
    }

    /// Validates the configuration, discovers the node's resources and prepares the log
    /// directory. Nothing touches the network until [`Worker::run`].
    pub fn build(self) -> Result<Worker, WorkerError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let config = self.config;
        config.validate()?;
        let host = hostname();
        let name = config.name.clone().unwrap_or_else(|| default_name(&host));
        let sims = config.sim_gpu_specs()?;
        let discovered = discovery::discover_kept(
            config.discover_gpus,
            &sims,
            &name,
            config.state_dir.as_deref(),
        );
        let mut resources = config.resolve_resources(&discovered);
        let (told, has) = (resources.get("memory"), discovered.resources.get("memory"));
        if !has.is_zero() && told > has {
            return Err(WorkerError::config(
                "memory",
                format!(
                    "{told} MiB is more than this machine has ({has} MiB): tasks would be \
                     promised memory that is not there; give at most {has} (--memory, or \
                     memory= in --resources)"
                ),
            ));
        }
        let mut labels = config.resolve_labels(&discovered);
        let isolation = Isolation::resolve(
            config.task_users,
            config.state_dir.as_deref(),
            config.task_dir.as_deref(),
        )
        .map_err(|why| WorkerError::config("task-uids", why))?;
        let isolation = Arc::new(isolation);
        let mut functions = self.functions;
        let mut actors = self.actors;
        // The built-in serving replica (actors/serving.rs), trainer (actors/trainer.rs) and
        // profiler (actors/profiler.rs), unless the program registered a class of that name
        // itself.
        actors
            .entry(crate::actors::SERVING_REPLICA_CLASS.to_string())
            .or_insert_with(crate::actors::serving_replica_class);
        actors
            .entry(crate::actors::TRAINER_CLASS.to_string())
            .or_insert_with(crate::actors::trainer_class);
        actors
            .entry(crate::actors::PROFILER_CLASS.to_string())
            .or_insert_with(crate::actors::profiler_class);
        // A scratch of its own for each command task and Python interpreter where the worker
        // may mount one (exec/scratch.rs): opened before Python is offered, so that its
        // interpreters get theirs too.
        let task_dir = config.task_dir.clone().unwrap_or_else(std::env::temp_dir);
        let scratch = match (&*isolation, config.task_scratch) {
            (Isolation::PerUser(_), true) => {
                match crate::exec::Scratch::open(&task_dir, config.task_scratch_bytes) {
                    Ok(scratch) => Some(Arc::new(scratch.with_private_tmp(config.private_tmp))),
                    Err(why) => {
                        tracing::warn!(%why, "command tasks get no scratch of their own: what they write in their home fills the disk of {}", task_dir.display());
                        None
                    }
                }
            }
            (Isolation::Shared { .. }, true) => {
                tracing::warn!(
                    "command tasks get no scratch of their own: they run as the worker's user, which owns what they write"
                );
                None
            }
            (_, false) => None,
        };
        // Python function tasks and actors, where the worker has a usable interpreter
        // (python/mod.rs).
        crate::python::install(
            config.python,
            &mut resources,
            &mut labels,
            &mut functions,
            &mut actors,
            Arc::clone(&isolation),
            scratch.clone(),
        )?;
        if let Isolation::Shared { why } = &*isolation
            && config.require_isolation
        {
            return Err(WorkerError::config(
                "require-isolation",
                format!(
                    "tasks on this node would share the worker's user ({why}); run the worker \
                     as root, or drop --require-isolation"
                ),
            ));
        }
        // Both parts are valid label text.
        let _ = labels.insert(escher_proto::types::ISOLATION_LABEL, isolation.label());
        if let Some(walltime) = &config.walltime {
            walltime.label(&mut labels);
        }
        let log_dir = match &config.log_dir {
            Some(dir) => {
                use std::os::unix::fs::PermissionsExt;
                // Tasks read their output through the head, never from here.
                std::fs::create_dir_all(dir)
                    .and_then(|()| {
                        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    })
                    .map_err(|source| WorkerError::LogDir {
                        path: dir.clone(),
                        source,
                    })?;
                LogDir::Given(dir.clone())
            }
            None => {
                use std::os::unix::fs::PermissionsExt;
                // Private, as a given one is made: tempfile makes it as the umask says.
                let dir = tempfile::Builder::new()
                    .prefix("escher-worker-")
                    .permissions(std::fs::Permissions::from_mode(0o700))
                    .tempdir()
                    .map_err(|source| WorkerError::LogDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                LogDir::Temporary(dir)
            }
        };
        // Bytes on disk: the reserve on the file systems of the logs and the tasks'
        // directories (exec/disk.rs), and the scratch made above.
        let disk = Arc::new(crate::exec::DiskReserve::new(
            config.disk_reserve,
            [log_dir.path().to_path_buf(), task_dir.clone()],
        ));
        // All are valid label text: words and numbers.
        let held = if scratch.is_some() {
            "reserve+scratch"
        } else {
            "reserve"
        };
        let _ = labels.insert(crate::exec::DISK_LABEL, held);
        // Where its command tasks' /tmp, /var/tmp and /dev/shm are: their own scratch, or
        // the host's.
        let tmp = if scratch.as_ref().is_some_and(|s| s.private_tmp()) {
            "private"
        } else {
            "host"
        };
        let _ = labels.insert(crate::exec::TMP_LABEL, tmp);
        let _ = labels.insert(
            crate::exec::DISK_RESERVE_LABEL,
            &disk.reserve_bytes().to_string(),
        );
        if let Some(scratch) = &scratch {
            let _ = labels.insert(
                crate::exec::DISK_SCRATCH_LABEL,
                &scratch.default_bytes().to_string(),
            );
        }
        let identity = match &config.state_dir {
            Some(dir) => crate::identity::IdentityStore::open(dir)?,
            None => crate::identity::IdentityStore::Memory(None),
        };
        let store = crate::objects::ObjectStore::open(crate::objects::StoreConfig {
            capacity: config
                .object_store_memory
                .unwrap_or_else(crate::objects::default_capacity),
            memory_root: config
                .object_store_dir
                .clone()
                .unwrap_or_else(default_memory_root),
            spill_root: config
                .object_spill_dir
                .clone()
                .or_else(|| config.state_dir.clone())
                .unwrap_or_else(|| crate::objects::DEFAULT_SPILL_ROOT.into()),
        })
        .map_err(|e| WorkerError::config("object-store-dir", e.to_string()))?;
        let (node_tx, _) = watch::channel(None);
        Ok(Worker {
            objects: crate::objects::NodeObjects::new(store),
            actors: Arc::new(crate::actors::ActorHost::new(actors)),
            data_listen: self.data_listen,
            name: Arc::from(name.as_str()),
            address: host,
            resources,
            labels,
            log_dir,
            isolation,
            task_cgroups: config.task_cgroups,
            task_cgroup_hierarchy: config.task_cgroup_hierarchy,
            task_pids_max: config.task_pids_max,
            task_log_bytes: config.task_log_bytes,
            require_limits: config.require_limits,
            disk,
            scratch,
            pass_env: config.pass_env,
            log_retention: config.log_retention,
            token: config.token,
            tls_trust: config.tls_trust,
            head: config.head,
            grace: config.grace,
            drain: config.drain,
            reconnect: (config.reconnect_initial, config.reconnect_max),
            functions,
            node_tx,
            gpus: discovered.gpus,
            sim_mig_latency: config.sim_mig_latency,
            sim_state: config.state_dir.clone(),
            identity,
        })
    }
}

/// `/dev/shm`, or the temporary directory on a machine without it (objects are then in files
/// on whatever that is, still mapped with no copy, but not held in memory by a tmpfs).
fn default_memory_root() -> PathBuf {
    let shm = PathBuf::from(crate::objects::DEFAULT_MEMORY_ROOT);
    if shm.is_dir() {
        return shm;
    }
    let temp = std::env::temp_dir();
    tracing::warn!(
        dir = %temp.display(),
        "no {} on this machine: the object store keeps objects in the temporary directory; \
         give --object-store-dir a tmpfs",
        crate::objects::DEFAULT_MEMORY_ROOT
    );
    temp
}

/// `{hostname}-{pid}`, with `-{n}` from the second default-named worker of the process on.
fn default_name(host: &str) -> String {
    let pid = crate::pidns::host_pid();
    match DEFAULT_NAMES.fetch_add(1, Ordering::Relaxed) {
        0 => format!("{host}-{pid}"),
        n => format!("{host}-{pid}-{}", n + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_reports_bad_settings_and_duplicate_functions() {
        let dup = Worker::builder()
            .function("f", |_, a| async move { Ok(a) })
            .function("f", |_, a| async move { Ok(a) })
            .build();
        assert!(matches!(dup, Err(WorkerError::DuplicateFunction(n)) if n == "f"));
        let bad = Worker::builder().head("localhost:7600").build();
        assert!(matches!(
            bad,
            Err(WorkerError::InvalidConfig { field: "head", .. })
        ));
    }

    #[test]
    fn the_log_directory_is_the_workers_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |w: &Worker| std::fs::metadata(w.log_dir()).unwrap().permissions().mode();
        let temporary = Worker::builder().build().unwrap();
        assert_eq!(mode(&temporary) & 0o777, 0o700);
        let dir = tempfile::tempdir().unwrap();
        let given = Worker::builder()
            .log_dir(dir.path().join("logs"))
            .build()
            .unwrap();
        assert_eq!(mode(&given) & 0o777, 0o700);
    }

    #[test]
    fn build_refuses_more_memory_than_the_machine_has() {
        let err = Worker::builder()
            .memory_mib(1 << 40)
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory: 1099511627776 MiB is more than this machine has"),
            "{err}"
        );
    }

    #[test]
    fn build_merges_resources_and_names_workers() {
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::builder()
            .resources("ssd=2,cpu=3".parse().unwrap())
            .memory_mib(512)
            .labels("zone=a".parse().unwrap())
            .log_dir(dir.path().join("logs"))
            .build()
            .unwrap();
        assert_eq!(worker.resources().get("cpu").to_string(), "3");
        assert_eq!(worker.resources().get("memory").to_string(), "512");
        assert_eq!(worker.resources().get("ssd").to_string(), "2");
        assert_eq!(worker.labels().get("zone"), Some("a"));
        assert!(worker.log_dir().is_dir());
        let a = Worker::builder().build().unwrap();
        let b = Worker::builder().build().unwrap();
        assert_ne!(a.name(), b.name());
        assert!(a.log_dir().is_dir());
        let temp = a.log_dir().to_path_buf();
        drop(a);
        assert!(
            !temp.exists(),
            "a default log directory goes with its worker"
        );
    }
}
