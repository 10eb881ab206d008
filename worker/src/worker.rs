//! [`Worker`]: a configured node agent, ready to [`run`](Worker::run).
//!
//! `run` connects to the head, registers, attaches and serves assignments until its shutdown
//! future completes or the head sends `Shutdown`; then it drains (see `runtime.rs`) and
//! returns. A head that is down (stopped, restarting, failing over) is waited for, not an
//! error: `run` keeps trying to reach it, or the new leader of its group, with back-off. It
//! fails only when the head refuses the worker outright.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use escher_proto::mig::LatencyModel;
use escher_proto::types::GpuInfo;
use escher_proto::{Labels, NodeId, ResourceSet};
use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::builder::WorkerBuilder;
use crate::error::WorkerError;
use crate::exec::{Isolation, LogRetention};
use crate::functions::FunctionRegistry;
use crate::gpu::Gpus;
use crate::handle::WorkerHandle;
use crate::head_conn::HeadConn;
use crate::identity::IdentityStore;
use crate::runner::RunEnv;
use crate::runtime::{Identity, Runtime};

/// Where command logs go: a directory given by the configuration, or a temporary one that is
/// removed with the worker.
#[derive(Debug)]
pub(crate) enum LogDir {
    /// Kept after the worker ends.
    Given(PathBuf),
    /// Removed when the worker is dropped.
    Temporary(tempfile::TempDir),
}

impl LogDir {
    pub(crate) fn path(&self) -> &Path {
        match self {
            LogDir::Given(p) => p,
            LogDir::Temporary(t) => t.path(),
        }
    }
}

/// A node agent: registers this machine's resources with the head and runs the tasks the head
/// assigns to it.
pub struct Worker {
    pub(crate) actors: Arc<crate::actors::ActorHost>,
    pub(crate) objects: crate::objects::NodeObjects,
    pub(crate) data_listen: Option<std::net::SocketAddr>,
    pub(crate) name: Arc<str>,
    pub(crate) address: String,
    pub(crate) resources: ResourceSet,
    pub(crate) labels: Labels,
    pub(crate) log_dir: LogDir,
    pub(crate) isolation: Arc<Isolation>,
    pub(crate) pass_env: Vec<String>,
    pub(crate) log_retention: LogRetention,
    pub(crate) head: String,
    pub(crate) token: Option<String>,
    pub(crate) tls_trust: Option<(String, Option<String>)>,
    pub(crate) grace: Duration,
    pub(crate) drain: Duration,
    pub(crate) reconnect: (Duration, Duration),
    pub(crate) functions: FunctionRegistry,
    pub(crate) node_tx: watch::Sender<Option<NodeId>>,
    pub(crate) gpus: Vec<GpuInfo>,
    pub(crate) sim_mig_latency: LatencyModel,
    /// Where simulated GPUs keep their layouts across restarts (the state directory).
    pub(crate) sim_state: Option<std::path::PathBuf>,
    pub(crate) identity: IdentityStore,
    pub(crate) task_cgroups: bool,
    pub(crate) task_cgroup_hierarchy: crate::exec::Hierarchy,
    pub(crate) task_pids_max: u64,
    pub(crate) task_log_bytes: u64,
    pub(crate) require_limits: bool,
    /// The free space kept on the worker's file systems.
    pub(crate) disk: Arc<crate::exec::DiskReserve>,
    /// Where command tasks get scratch directories of their own, if they do.
    pub(crate) scratch: Option<Arc<crate::exec::Scratch>>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.name)
            .field("head", &self.head)
            .field("resources", &self.resources)
            .field("labels", &self.labels)
            .field("gpus", &self.gpus.len())
            .field("log_dir", &self.log_dir.path())
            .field("functions", &self.functions)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A builder with every setting at its default.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::new()
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The head's URL (or the comma-separated URLs of a replicated head's replicas).
    pub fn head_url(&self) -> &str {
        &self.head
    }

    /// The resources it registers: discovered, then overridden by the configuration.
    pub fn resources(&self) -> &ResourceSet {
        &self.resources
    }

    /// The labels it registers.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The GPUs it found (real, then simulated), as it reports them to the head.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// Where command logs go.
    pub fn log_dir(&self) -> &Path {
        self.log_dir.path()
    }

    /// This node's objects: its store, served on the data plane (`Objects`).
    pub fn objects(&self) -> &crate::objects::NodeObjects {
        &self.objects
    }

    /// A handle that follows the worker's registration (its node id).
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            node_id: self.node_tx.subscribe(),
        }
    }

    /// Runs the worker until `shutdown` completes or the head sends `Shutdown`, then drains
    /// running tasks and returns. Fails only if the head refuses this worker for good.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
        let token = self
            .token
            .clone()
            .or_else(|| crate::join_token(&self.head))
            .unwrap_or_default();
        if token.is_empty() {
            tracing::warn!(
                head = %self.head,
                "no join token: the head will refuse this worker; give --token-file or \
                 ESCHER_TOKEN (the worker_token of the head's access file), or run the worker \
                 where the head's access file is ($ESCHER_HOME/access.json)"
            );
        }
        let trust = self.tls_trust.clone().or_else(|| {
            let file = crate::head_access(&self.head)?;
            Some((file.ca_cert?, file.tls_name))
        });
        let head = HeadConn::new(&self.head, &token, trust)?;
        match &*self.isolation {
            Isolation::Shared { why } => tracing::warn!(
                "tasks on this node share one user ({why}): tenants here are not isolated; run \
                 the worker as root for a user per namespace (--task-uids)"
            ),
            Isolation::PerUser(pool) => tracing::info!(
                uids = %pool.range(),
                "each namespace's tasks run as a user of their own"
            ),
        }
        let discovered = if self.task_cgroups {
            crate::exec::TaskCgroups::discover(self.task_cgroup_hierarchy)
        } else {
            Err("turned off (--no-task-cgroups)".into())
        };
        let (cgroups, enforcement) = match discovered {
            Ok(cgroups) => {
                let hierarchy = if cgroups.is_freezer() {
                    "cgroup v1 freezer"
                } else {
                    "cgroup v2"
                };
                tracing::info!(root = %cgroups.root().display(), hierarchy, "each command task runs in a cgroup of its own");
                crate::fence::hold_task_cgroups(cgroups.root());
                let cpus = self.resources.get("cpu").raw();
                if cpus > 0
                    && let Err(error) = cgroups.weigh_as_cpus(cpus)
                {
                    // Not a limit: the tasks are held to their quotas still, and only get less
                    // of a loaded host's CPU time than as plain processes.
                    tracing::warn!(%error, "cannot give the task cgroups the CPU weight of the node's CPUs: on a loaded host its tasks together get the CPU time of one process");
                }
                let enforcement = cgroups.enforcement().clone();
                (Some(Arc::new(cgroups)), enforcement)
            }
            Err(why) => {
                tracing::warn!(%why, "no cgroup for tasks: a task that leaves its process group (setsid) escapes the fence; run the worker as root, or delegate it a cgroup subtree");
                let enforcement =
                    crate::exec::Enforcement::nothing(&format!("no cgroup for tasks ({why})"));
                (None, enforcement)
            }
        };
        if !enforcement.complete() {
            if self.require_limits {
                // What to change, for the causes a worker can tell apart.
                let why = enforcement.why_missing();
                let uid = nix::unistd::geteuid();
                let change = if !uid.is_root() {
                    format!(
                        "the worker runs as uid {uid}, which may not create cgroups: run it as \
                         root (or as a service manager's unit with a delegated cgroup subtree)"
                    )
                } else if why.contains("Read-only file system") {
                    "the cgroup hierarchy is mounted read-only: mount it read-write for the \
                     worker (a container needs --cgroupns=private and a writable \
                     /sys/fs/cgroup, or cgroup: rw)"
                        .to_string()
                } else {
                    "mount the missing controllers' hierarchies (cgroup v1), or enable them in \
                     the unified hierarchy (cgroup.subtree_control of the worker's parent \
                     cgroup)"
                        .to_string()
                };
                return Err(WorkerError::config(
                    "require-limits",
                    format!(
                        "this node cannot hold its tasks to every limit ({why}); {change}; or \
                         drop --require-limits to run with what it can hold (named in the \
                         node's {} label)",
                        crate::exec::LIMITS_MISSING_LABEL
                    ),
                ));
            }
            tracing::warn!(
                enforced = %enforcement.label(),
                missing = %enforcement.why_missing(),
                "tasks on this node are not held to every limit they ask for: a task can use more \
                 than it asked of what is missing (the node's {} label names it)",
                crate::exec::LIMITS_MISSING_LABEL
            );
        } else {
            tracing::info!(limits = %enforcement.label(), "each task (a command, a Python task or actor) is held to its CPU, memory and process limits");
        }
        let mut labels = self.labels;
        // Both are valid label text.
        let _ = labels.insert(crate::exec::LIMITS_LABEL, &enforcement.label());
        if let Some(missing) = enforcement.missing_label() {
            let _ = labels.insert(crate::exec::LIMITS_MISSING_LABEL, &missing);
        }
        if enforcement.label().split('+').any(|held| held == "pids") {
            let _ = labels.insert(
                escher_proto::types::LIMITS_PIDS_LABEL,
                &self.task_pids_max.to_string(),
            );
        }
        let node_memory = self.resources.get("memory").raw() / escher_proto::Amount::ONE.raw();
        let limits = crate::exec::LimitPolicy {
            pids_max: self.task_pids_max,
            memory: crate::exec::MemoryLedger::new(node_memory.saturating_mul(1 << 20)),
        };
        if !crate::fence::running() {
            tracing::warn!(
                "no fence supervisor: this worker runs inside another program, so if that \
                 program stalls or loses the head its tasks run on while the head retries them \
                 elsewhere; run escher-worker for a fenced node (escher nodes says so too)"
            );
        }
        let data_plane = crate::actors::DataPlane::bind(self.data_listen, &self.head)
            .await
            .map_err(|e| {
                WorkerError::config(
                    "data-listen",
                    format!("cannot listen for actor calls: {e}; give another --data-listen"),
                )
            })?;
        // Both are valid label text: an address and a word.
        let _ = labels.insert(
            escher_proto::types::DATA_ADDRESS_LABEL,
            data_plane.advertised(),
        );
        let _ = labels.insert(crate::actors::DATA_PLANE_LABEL, data_plane.transport());
        let stop_data_plane = tokio_util::sync::CancellationToken::new();
        data_plane.serve(
            Arc::clone(&self.actors),
            self.objects.clone(),
            stop_data_plane.clone(),
        );
        let _stop_data_plane = stop_data_plane.drop_guard();
        let env = Arc::new(RunEnv {
            objects: self.objects.clone(),
            actors: Arc::clone(&self.actors),
            cgroups,
            limits,
            log_bytes: self.task_log_bytes,
            disk: self.disk,
            scratch: self.scratch,
            log_dir: self.log_dir.path().to_path_buf(),
            base_env: crate::exec::task_base_env(std::env::vars(), &self.pass_env),
            isolation: self.isolation,
            log_retention: self.log_retention,
            grace: self.grace,
            head,
            functions: self.functions,
            worker_name: Arc::clone(&self.name),
            spawn_latency: Arc::default(),
        });
        let identity = Identity {
            name: self.name.to_string(),
            address: self.address,
            resources: self.resources,
            labels,
        };
        let (initial, max) = self.reconnect;
        let backoff = Backoff::new(initial, max, fastrand::u64(..));
        tracing::info!(name = %identity.name, head = %self.head, resources = %identity.resources, gpus = self.gpus.len(), log_dir = %env.log_dir.display(), "worker starting");
        let gpus = Gpus::new(&self.name, self.gpus, self.sim_mig_latency, self.sim_state);
        let result = Runtime::new(
            env,
            identity,
            self.identity,
            self.drain,
            backoff,
            self.node_tx,
            gpus,
        )
        .run(shutdown)
        .await;
        // The temporary log directory, if any, goes only now that every task has ended.
        drop(self.log_dir);
        result
    }
}
