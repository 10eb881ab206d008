//! [`LocalCluster`]: a head and workers in one process, on loopback ports, with no
//! configuration. The README's first command runs on it, and so do the end-to-end tests.
//!
//! Everything is real: the head serves gRPC on `127.0.0.1:<free port>`, and each worker
//! registers and streams to it over that socket exactly as a worker on another machine would.
//!
//! Replicated heads: [`LocalClusterBuilder::heads`] runs a raft group of several head
//! replicas in the process (each on its own loopback port, with its log in memory); clients
//! and workers get every replica's URL and follow the leader. [`LocalCluster::leader`] says
//! which replica leads and [`LocalCluster::stop_head`] stops one, so an application can watch
//! a failover. The quickstart keeps one head. Workers keep their node identity in memory.
//!
//! GPUs: workers do not look for the machine's real GPUs by default (every worker of the
//! process would report the same ones); give a worker simulated GPUs with
//! [`LocalClusterBuilder::worker_with_gpus`], or ask for real discovery with
//! [`LocalClusterBuilder::discover_gpus`] (with one worker). Simulated MIG reconfigurations
//! take MIGRator's time scaled by [`LocalClusterBuilder::sim_mig_latency_scale`] (default
//! 0.01: tens of milliseconds).

use std::time::Duration;

use std::collections::BTreeMap;

use escher_client::{BlockingClient, Client, ClientError};
use escher_head::replication::ReplicaConfig;
use escher_head::{HeadConfig, HeadError};
use escher_proto::types::{NodeId, ResourceSet};
use escher_worker::exec::TaskUsers;
use escher_worker::{Functions, PythonDetection, Worker, WorkerError, scaled_latency};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a local cluster could not start.
#[derive(Debug, Error)]
pub enum LocalClusterError {
    /// No loopback port could be bound.
    #[error("cannot bind a loopback port for the head: {0}")]
    Bind(#[from] std::io::Error),
    /// The head's configuration is invalid.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// A worker could not be built.
    #[error("cannot build worker {index}: {source}")]
    Worker {
        /// Which worker.
        index: usize,
        /// Why.
        source: WorkerError,
    },
    /// A worker stopped before it registered.
    #[error("worker {0} stopped before registering with the head")]
    WorkerStopped(usize),
    /// A head group needs at least one replica.
    #[error("a local cluster needs at least one head replica (heads(0) was asked for)")]
    NoHeads,
    /// The client could not connect.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Starting took too long.
    #[error("the local cluster did not come up within {0:?}")]
    Timeout(Duration),
}

/// One worker to start: its resources and simulated GPUs.
#[derive(Debug, Clone)]
struct WorkerSpec {
    resources: ResourceSet,
    sim_gpus: Vec<String>,
}

impl WorkerSpec {
    fn plain(resources: ResourceSet) -> WorkerSpec {
        WorkerSpec {
            resources,
            sim_gpus: Vec::new(),
        }
    }
}

/// How workers of a local cluster treat GPUs.
#[derive(Debug, Clone, Copy)]
struct GpuSettings {
    discover: bool,
    latency_scale: f64,
}

/// Settings for a [`LocalCluster`]. Defaults: two workers with 4 CPUs and 4 GiB each.
#[derive(Debug, Clone)]
pub struct LocalClusterBuilder {
    heads: usize,
    data_dir: Option<std::path::PathBuf>,
    workers: Vec<WorkerSpec>,
    functions: Functions,
    head: HeadConfig,
    grace: Duration,
    gpus: GpuSettings,
    task_users: TaskUsers,
    task_cgroups: bool,
    python: PythonDetection,
}

impl Default for LocalClusterBuilder {
    fn default() -> Self {
        LocalClusterBuilder {
            heads: 1,
            data_dir: None,
            workers: vec![WorkerSpec::plain(default_resources()); 2],
            functions: Functions::new(),
            head: HeadConfig::default(),
            grace: Duration::from_secs(2),
            gpus: GpuSettings {
                discover: false,
                latency_scale: 0.01,
            },
            task_users: TaskUsers::Off,
            task_cgroups: true,
            python: PythonDetection::FromEnv,
        }
    }
}

fn default_resources() -> ResourceSet {
    "cpu=4,memory=4096".parse().unwrap_or_default()
}

/// The default resources, with `resources` added or replacing them.
fn with_defaults(resources: ResourceSet) -> ResourceSet {
    let mut all = default_resources();
    for (name, amount) in resources.iter() {
        all.insert(name.clone(), amount);
    }
    all
}

impl LocalClusterBuilder {
    /// Runs the head as a raft group of `n` replicas in this process (default 1), each on its
    /// own loopback port with its log in memory. Clients and workers are given every
    /// replica's URL and follow whichever leads.
    pub fn heads(mut self, n: usize) -> Self {
        self.heads = n;
        self
    }

    /// Keeps every head replica's raft log on disk under `dir` (`dir/head-1`, `dir/head-2`,
    /// ...), as `escher-head --data-dir` does, instead of in memory.
    pub fn data_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// `n` workers with the default resources (replacing any configured so far).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = vec![WorkerSpec::plain(default_resources()); n];
        self
    }

    /// Adds one worker with these resources (`cpu` and `memory` replace the defaults; other
    /// names are custom static resources).
    pub fn worker(mut self, resources: ResourceSet) -> Self {
        self.workers
            .push(WorkerSpec::plain(with_defaults(resources)));
        self
    }

    /// Adds one worker with these resources and simulated GPUs, one per spec (`h100-80gb`,
    /// `a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb`; see
    /// [`SimGpuSpec`](escher_worker::SimGpuSpec)). An illegal spec makes `start` fail.
    pub fn worker_with_gpus<I, S>(mut self, resources: ResourceSet, gpus: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.workers.push(WorkerSpec {
            resources: with_defaults(resources),
            sim_gpus: gpus.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// Whether workers look for this machine's real GPUs through NVML (default no: every
    /// worker of the process would report the same GPUs). Without a driver they find none.
    pub fn discover_gpus(mut self, discover: bool) -> Self {
        self.gpus.discover = discover;
        self
    }

    /// How long simulated MIG reconfigurations take, as a multiple of MIGRator's figures
    /// (6 s to replace one slice); default 0.01, 0 for instant.
    pub fn sim_mig_latency_scale(mut self, scale: f64) -> Self {
        self.gpus.latency_scale = scale;
        self
    }

    /// Removes every worker configured so far (then add them with [`worker`](Self::worker)).
    pub fn no_workers(mut self) -> Self {
        self.workers.clear();
        self
    }

    /// The function handlers every worker registers.
    pub fn functions(mut self, functions: Functions) -> Self {
        self.functions = functions;
        self
    }

    /// The head's settings (e.g. a short heartbeat timeout in tests).
    pub fn head_config(mut self, config: HeadConfig) -> Self {
        self.head = config;
        self
    }

    /// How long a cancelled command task gets between SIGTERM and SIGKILL.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whom the workers run command tasks as. Off by default: everything of a local cluster
    /// runs in this process, as its user, and there are no tenants to keep apart; a process
    /// with the privilege may turn it on to try (or measure) per-namespace users
    /// ([`TaskUsers::Auto`] or a range).
    pub fn task_users(mut self, users: TaskUsers) -> Self {
        self.task_users = users;
        self
    }

    /// Whether the workers give each command task a cgroup of its own where they may create
    /// one (default: yes; see `escher-worker --no-task-cgroups`).
    pub fn task_cgroups(mut self, on: bool) -> Self {
        self.task_cgroups = on;
        self
    }

    /// Whether the workers run Python tasks: by default only where `ESCHER_PYTHON` asks
    /// ([`PythonDetection::FromEnv`]); [`PythonDetection::Detect`] also takes `python3` on
    /// `PATH` when it is usable, as `escher-worker` does.
    pub fn python(mut self, detection: PythonDetection) -> Self {
        self.python = detection;
        self
    }

    /// Starts the head (or its replicas) and the workers and waits until every worker has
    /// registered.
    pub async fn start(self) -> Result<LocalCluster, LocalClusterError> {
        if self.heads == 0 {
            return Err(LocalClusterError::NoHeads);
        }
        let mut listeners = Vec::with_capacity(self.heads);
        for _ in 0..self.heads {
            listeners.push(TcpListener::bind("127.0.0.1:0").await?);
        }
        let addresses: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.to_string()))
            .collect::<Result<_, _>>()?;
        let peers: BTreeMap<u64, String> = addresses
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        // Clients and workers of this process find the cluster's tokens by its URLs (the heads
        // register them too once they serve; this is so before the first of them does).
        let scheme = if self.head.tls.is_some() {
            "https"
        } else {
            "http"
        };
        for address in &addresses {
            escher_proto::access::register(&format!("{scheme}://{address}"), &self.head.access);
        }
        let mut heads = Vec::with_capacity(self.heads);
        for (i, listener) in listeners.into_iter().enumerate() {
            let mut config = self.head.clone();
            if self.heads > 1 {
                let tick = config.replica.tick;
                config.replica = ReplicaConfig::member(i as u64 + 1, peers.clone(), None)
                    .map_err(|e| HeadError::from(escher_head::runtime::ConfigError::from(e)))?;
                config.replica.tick = tick;
            }
            if let Some(dir) = &self.data_dir {
                config.data_dir = Some(dir.join(format!("head-{}", i + 1)));
            }
            config.validate().map_err(HeadError::from)?;
            let stop = CancellationToken::new();
            let token = stop.clone();
            let task = tokio::spawn(escher_head::run(listener, config, async move {
                token.cancelled().await
            }));
            heads.push(LocalHead {
                url: format!("{scheme}://{}", addresses[i]),
                stop,
                task: Some(task),
            });
        }
        let head_url = heads
            .iter()
            .map(|h| h.url.clone())
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalCluster {
            access: self.head.access.clone(),
            head_url,
            heads,
            workers: Vec::new(),
            functions: self.functions.clone(),
            grace: self.grace,
            task_users: self.task_users,
            task_cgroups: self.task_cgroups,
            python: self.python,
            gpus: self.gpus,
        };
        for spec in self.workers {
            cluster.start_worker(spec).await?;
        }
        Ok(cluster)
    }
}

/// A running head replica of a [`LocalCluster`].
#[derive(Debug)]
struct LocalHead {
    url: String,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), HeadError>>>,
}

/// A running worker of a [`LocalCluster`].
#[derive(Debug)]
struct LocalWorker {
    node: NodeId,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), WorkerError>>>,
}

/// A head and workers in this process. Dropping it stops them; [`shutdown`](Self::shutdown)
/// stops them and waits.
#[derive(Debug)]
pub struct LocalCluster {
    /// The cluster's tokens (what a head's access file would hold).
    access: escher_proto::access::AccessFile,
    /// Every replica's URL, comma-separated.
    head_url: String,
    heads: Vec<LocalHead>,
    workers: Vec<LocalWorker>,
    functions: Functions,
    grace: Duration,
    gpus: GpuSettings,
    task_users: TaskUsers,
    task_cgroups: bool,
    python: PythonDetection,
}

/// How long a worker may take to register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

impl LocalCluster {
    /// Settings, starting from the defaults.
    pub fn builder() -> LocalClusterBuilder {
        LocalClusterBuilder::default()
    }

    /// A default cluster: two workers with 4 CPUs and 4 GiB each.
    pub async fn start() -> Result<LocalCluster, LocalClusterError> {
        LocalCluster::builder().start().await
    }

    /// The head's URL (`http://127.0.0.1:PORT`); with several replicas, every replica's URL,
    /// comma-separated (what `Client::connect` and `ESCHER_HEAD` take).
    pub fn head_url(&self) -> &str {
        &self.head_url
    }

    /// The URL of each head replica, in replica order (replica `i + 1` at index `i`).
    pub fn head_urls(&self) -> Vec<String> {
        self.heads.iter().map(|h| h.url.clone()).collect()
    }

    /// The index (in [`head_urls`](Self::head_urls)) of the replica that leads now, by its
    /// own account, if one does and is running.
    pub async fn leader(&self) -> Option<usize> {
        let client = self.client().await.ok()?;
        let heads = client.heads().await.ok()?;
        let leader = heads.leader()?;
        let url = leader.url();
        self.heads
            .iter()
            .position(|h| h.url == url && h.task.is_some())
    }

    /// Stops head replica `index` (its in-memory log goes with it). With a majority of the
    /// replicas still running, the others elect a leader (if it led) and go on; clients and
    /// workers follow.
    pub async fn stop_head(&mut self, index: usize) {
        if let Some(h) = self.heads.get_mut(index) {
            h.stop.cancel();
            if let Some(task) = h.task.take() {
                let _ = task.await;
            }
        }
    }

    /// The node ids of the workers started so far, in start order.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.workers.iter().map(|w| w.node).collect()
    }

    /// The cluster's admin token: clients of this process find it by themselves; a program
    /// in another process passes it with `--token` or `ESCHER_TOKEN`.
    pub fn admin_token(&self) -> &str {
        &self.access.admin_token
    }

    /// The cluster's tokens and URLs, as a head's access file holds them.
    pub fn access(&self) -> &escher_proto::access::AccessFile {
        &self.access
    }

    /// A connected async client.
    pub async fn client(&self) -> Result<Client, ClientError> {
        Client::connect(&self.head_url).await
    }

    /// A connected blocking client (call it outside the async runtime).
    pub fn blocking_client(&self) -> Result<BlockingClient, ClientError> {
        BlockingClient::connect(&self.head_url)
    }

    /// Starts one more worker with these resources and waits until it has registered.
    pub async fn add_worker(
        &mut self,
        resources: ResourceSet,
    ) -> Result<NodeId, LocalClusterError> {
        self.start_worker(WorkerSpec::plain(resources)).await
    }

    /// Starts one more worker with these resources and simulated GPUs (see
    /// [`LocalClusterBuilder::worker_with_gpus`]) and waits until it has registered.
    pub async fn add_worker_with_gpus<I, S>(
        &mut self,
        resources: ResourceSet,
        gpus: I,
    ) -> Result<NodeId, LocalClusterError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sim_gpus = gpus.into_iter().map(Into::into).collect();
        self.start_worker(WorkerSpec {
            resources,
            sim_gpus,
        })
        .await
    }

    async fn start_worker(&mut self, spec: WorkerSpec) -> Result<NodeId, LocalClusterError> {
        let index = self.workers.len();
        let mut builder = Worker::builder()
            .head(self.head_url.clone())
            .name(format!("local-{index}"))
            .resources(spec.resources)
            .grace(self.grace)
            .drain(Duration::from_millis(200))
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(500))
            .discover_gpus(self.gpus.discover)
            .sim_mig_latency(scaled_latency(self.gpus.latency_scale))
            .task_users(self.task_users)
            .task_cgroups(self.task_cgroups)
            .python(self.python)
            .functions(&self.functions);
        for gpu in spec.sim_gpus {
            builder = builder.sim_gpu(gpu);
        }
        let worker = builder
            .build()
            .map_err(|source| LocalClusterError::Worker { index, source })?;
        let mut handle = worker.handle();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task =
            tokio::spawn(async move { worker.run(async move { token.cancelled().await }).await });
        let node = tokio::time::timeout(REGISTER_TIMEOUT, handle.registered())
            .await
            .map_err(|_| LocalClusterError::Timeout(REGISTER_TIMEOUT))?
            .ok_or(LocalClusterError::WorkerStopped(index))?;
        self.workers.push(LocalWorker {
            node,
            stop,
            task: Some(task),
        });
        Ok(node)
    }

    /// Stops one worker gracefully (it drains, then leaves the cluster).
    pub async fn stop_worker(&mut self, node: NodeId) {
        if let Some(w) = self.workers.iter_mut().find(|w| w.node == node) {
            w.stop.cancel();
            if let Some(task) = w.task.take() {
                let _ = task.await;
            }
        }
    }

    /// Kills one worker abruptly, as if its machine died: its tasks stop being reported and its
    /// heartbeats stop; the head notices after its heartbeat timeout.
    pub fn kill_worker(&mut self, node: NodeId) {
        if let Some(w) = self.workers.iter_mut().find(|w| w.node == node)
            && let Some(task) = w.task.take()
        {
            task.abort();
        }
    }

    /// Stops the workers, then the head replicas, and waits for all of them.
    pub async fn shutdown(mut self) {
        for w in &self.workers {
            w.stop.cancel();
        }
        for w in &mut self.workers {
            if let Some(task) = w.task.take() {
                let _ = task.await;
            }
        }
        for h in &self.heads {
            h.stop.cancel();
        }
        for h in &mut self.heads {
            if let Some(task) = h.task.take() {
                match task.await {
                    Ok(Err(err)) => tracing::warn!(%err, "head stopped with an error"),
                    Err(err) => tracing::warn!(%err, "head task failed"),
                    Ok(Ok(())) => {}
                }
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.stop.cancel();
            if let Some(task) = w.task.take() {
                task.abort();
            }
        }
        for h in &mut self.heads {
            h.stop.cancel();
            if let Some(task) = h.task.take() {
                task.abort();
            }
        }
    }
}
