//! Prometheus metrics on `--metrics HOST:PORT` (`GET /metrics`, the text exposition format),
//! named like Ray's where the concept is the same (docs/DESIGN.md §11).
//!
//! Gauges of the cluster are read from the replica's state at each scrape (one read job on the
//! owner, like `escher status`): tasks by state and namespace, every resource on every live
//! node (total, used, available), nodes by liveness, and this replica's raft term, commit and
//! applied indexes and role, and the messages waiting for each worker. What accumulates
//! between scrapes lives in [`Metrics`], shared with the owner and the auth layer: the
//! submit-to-start latency of every dispatched task, gRPC requests by method and the errors
//! they were answered with, this replica's raft role changes, and the figures each worker sent
//! with its last heartbeat (its running tasks, how long its tasks take to start, and its GPUs'
//! and MIG slices' use), exported for its node while it is live.
//!
//! A scrape must carry a token like any other call (`Authorization: Bearer TOKEN`; any role but
//! `worker`, so a `reader` token is enough): nothing the head serves is open (docs/DESIGN.md §10).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use escher_proto::types::{Amount, Capacity, Metric, NodeId, ReplicaRole, TaskState};
use rustc_hash::FxHashMap;

use super::handle::OwnerHandle;
use super::owner::{HeadsView, Msg};
use crate::auth::{CallObserver, Caller, Keys, check_attempt};
use crate::state::ClusterState;

/// Labels of one series, in order.
type Labels = Vec<(String, String)>;
/// The one label of a per-command series: `command="submit"` (no allocation per command).
type CommandLabel = [(&'static str, &'static str); 1];

/// The auth layer tells the metrics of every call: counted by method, and its errors by
/// method and code.
impl CallObserver for Metrics {
    fn request(&self, path: &str) {
        let method = path.rsplit('/').next().unwrap_or(path).to_string();
        self.requests
            .get_or_create(&vec![("method".to_string(), method)])
            .inc();
    }

    fn error(&self, path: &str, code: tonic::Code) {
        let method = path.rsplit('/').next().unwrap_or(path).to_string();
        let code = format!("{code:?}");
        self.errors
            .get_or_create(&vec![
                ("method".to_string(), method),
                ("code".to_string(), code),
            ])
            .inc();
    }
}

/// What accumulates between scrapes.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Seconds from a task's submission to its dispatch (its latest attempt's).
    submit_to_start: Histogram,
    /// gRPC requests, by method.
    requests: Family<Labels, Counter>,
    /// gRPC requests answered with an error at once, by method and code.
    errors: Family<Labels, Counter>,
    /// Times this replica's raft role changed.
    role_changes: Counter,
    /// Seconds to apply one committed command to the state, by command: the scheduler's
    /// decisions are made there.
    apply: Family<CommandLabel, Histogram, fn() -> Histogram>,
    /// Each worker's figures, as its last heartbeat sent them.
    workers: Mutex<FxHashMap<NodeId, Vec<Metric>>>,
    /// What each worker's last heartbeat said about its fence (shown in status replies, not
    /// scraped).
    pub(crate) fences: Arc<super::fences::FenceReports>,
    /// How many calls wait at each actor, as its worker's last heartbeat said (shown with the
    /// actor in `ResolveActor` replies, not scraped).
    pub(crate) actor_calls: Arc<super::actor_calls::ActorCalls>,
    /// The policies' latest reports, exported as `escher_policy_measure`.
    pub(crate) policies: Arc<super::policies::PolicyReports>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            // 0.5 ms to about 16 s.
            submit_to_start: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            requests: Family::default(),
            errors: Family::default(),
            role_changes: Counter::default(),
            // 1 µs to about 4 s.
            apply: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_001, 4.0, 12))
            }),
            workers: Mutex::default(),
            fences: Arc::default(),
            actor_calls: Arc::default(),
            policies: Arc::default(),
        }
    }
}

impl Metrics {
    /// A task was dispatched `waited_ms` after it was submitted.
    pub(crate) fn started(&self, waited_ms: u64) {
        self.submit_to_start.observe(waited_ms as f64 / 1000.0);
    }

    /// Applying one `command` (`submit` ...) to the state took `took`.
    pub(crate) fn applied(&self, command: &'static str, took: std::time::Duration) {
        self.apply
            .get_or_create(&[("command", command)])
            .observe(took.as_secs_f64());
    }

    /// This replica's raft role changed (it became leader, follower or candidate).
    pub(crate) fn leader_changed(&self) {
        self.role_changes.inc();
    }

    /// Worker `node` sent these figures with a heartbeat (at most [`MAX_WORKER_FIGURES`] are
    /// kept: a worker cannot make scrapes grow without bound).
    pub(crate) fn worker_reported(&self, node: NodeId, mut figures: Vec<Metric>) {
        figures.truncate(MAX_WORKER_FIGURES);
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        workers.insert(node, figures);
    }

    /// The figures of the workers of `live` nodes.
    fn workers_of(&self, live: &FxHashMap<NodeId, String>) -> Vec<(String, Vec<Metric>)> {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        // A node that is gone for good is forgotten here too.
        workers.retain(|node, _| live.contains_key(node));
        let mut out: Vec<(String, Vec<Metric>)> = workers
            .iter()
            .map(|(node, figures)| (live[node].clone(), figures.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The most heartbeat figures kept per worker.
const MAX_WORKER_FIGURES: usize = 4096;

/// What the gauges show, read from the state in one owner turn, and encoded straight from it
/// at the scrape (a [`Collector`]: no per-series map for 10^5 resources).
#[derive(Debug)]
struct Snapshot {
    /// Task counts by (state, namespace).
    tasks: BTreeMap<(TaskState, String), u64>,
    /// Actor counts by (state, namespace): the tasks of kind actor among `tasks`.
    actors: BTreeMap<(TaskState, String), u64>,
    /// Objects of the table by (namespace, `live` or `lost`): how many, and their bytes.
    objects: BTreeMap<(String, &'static str), (u64, u64)>,
    /// (resource, node, total, used): `total` is `None` for unbounded.
    resources: Vec<(String, String, Option<Amount>, Amount)>,
    alive: u64,
    dead: u64,
    /// This replica's raft term, commit and applied indexes, and whether it leads.
    raft: (u64, u64, u64, bool),
    /// Messages waiting for each worker (a leader's view; empty on followers).
    outboxes: Vec<(String, u64)>,
    /// The live nodes, with their label.
    live: FxHashMap<NodeId, String>,
    /// Each live worker's last heartbeat figures, by node label.
    workers: Vec<(String, Vec<Metric>)>,
    /// Calls waiting at the live actors, by namespace, as their workers' last heartbeats said
    /// (a leader's view; empty on followers, which hear no heartbeats).
    actor_calls: BTreeMap<String, u64>,
}

impl Snapshot {
    fn of(state: &ClusterState) -> Snapshot {
        let mut tasks = BTreeMap::new();
        for state_name in [
            TaskState::Pending,
            TaskState::Running,
            TaskState::Succeeded,
            TaskState::Failed,
            TaskState::Cancelled,
        ] {
            tasks.insert((state_name, String::new()), 0);
        }
        let mut actors = BTreeMap::new();
        for (ns, rec) in state.task_records() {
            if matches!(rec.spec.kind, escher_proto::TaskKind::Actor(_)) {
                *actors.entry((rec.state, ns.clone())).or_default() += 1;
            }
            *tasks.entry((rec.state, ns)).or_default() += 1;
        }
        let mut objects: BTreeMap<(String, &'static str), (u64, u64)> = BTreeMap::new();
        for (_, rec) in state.objects().iter() {
            let ns = rec.namespace.as_ref().map(|n| n.as_str().to_string());
            let kind = if rec.lost.is_some() { "lost" } else { "live" };
            let entry = objects.entry((ns.unwrap_or_default(), kind)).or_default();
            entry.0 += 1;
            entry.1 += rec.size;
        }
        let status = state.cluster_status();
        let mut resources = Vec::new();
        let mut live = FxHashMap::default();
        let (mut alive, mut dead) = (0, 0);
        for node in &status.nodes {
            if !node.alive {
                dead += 1;
                continue;
            }
            alive += 1;
            let id = node.id.to_string();
            live.insert(node.id, id.clone());
            for r in &node.resources {
                let total = match r.total {
                    Capacity::Finite(a) => Some(a),
                    Capacity::Unbounded => None,
                };
                resources.push((r.name.to_string(), id.clone(), total, r.used));
            }
        }
        Snapshot {
            tasks,
            actors,
            objects,
            resources,
            alive,
            dead,
            raft: (0, 0, 0, false),
            outboxes: Vec::new(),
            live,
            workers: Vec::new(),
            actor_calls: BTreeMap::new(),
        }
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let help = "Tasks the head keeps a record of, by state and namespace (retention drops \
                    old finished ones)";
        let mut tasks = encoder.encode_descriptor("tasks", help, None, MetricType::Gauge)?;
        for ((state, ns), n) in &self.tasks {
            let state = state.to_string();
            let labels = [("state", state.as_str()), ("namespace", ns.as_str())];
            tasks.encode_family(&labels)?.encode_gauge(n)?;
        }
        let help = "Actors the head keeps a record of, by state (pending: being placed or \
                    restarted; running: alive) and namespace";
        let mut actors = encoder.encode_descriptor("actors", help, None, MetricType::Gauge)?;
        for ((state, ns), n) in &self.actors {
            let state = state.to_string();
            let labels = [("state", state.as_str()), ("namespace", ns.as_str())];
            actors.encode_family(&labels)?.encode_gauge(n)?;
        }
        let help = "Actor method calls waiting at the live actors (queued or running at their \
                    workers), by namespace, as the workers' last heartbeats said; reported by \
                    the leading replica only";
        let mut calls =
            encoder.encode_descriptor("actor_pending_calls", help, None, MetricType::Gauge)?;
        for (ns, n) in &self.actor_calls {
            calls
                .encode_family(&[("namespace", ns.as_str())])?
                .encode_gauge(n)?;
        }
        let help = "Objects in the head's table, by namespace and state (live: a copy is held; \
                    lost: its last holder was lost)";
        let mut objects = encoder.encode_descriptor("objects", help, None, MetricType::Gauge)?;
        for ((ns, kind), (n, _)) in &self.objects {
            let labels = [("namespace", ns.as_str()), ("state", *kind)];
            objects.encode_family(&labels)?.encode_gauge(n)?;
        }
        let help = "Bytes of the objects in the head's table (one copy each), by namespace and \
                    state";
        let mut object_bytes =
            encoder.encode_descriptor("object_bytes", help, None, MetricType::Gauge)?;
        for ((ns, kind), (_, bytes)) in &self.objects {
            let labels = [("namespace", ns.as_str()), ("state", *kind)];
            object_bytes.encode_family(&labels)?.encode_gauge(bytes)?;
        }
        let help = "Every resource on every live node: total, used and available (+Inf when \
                    unbounded)";
        let mut resources =
            encoder.encode_descriptor("resources", help, None, MetricType::Gauge)?;
        for (name, node, total, used) in &self.resources {
            let available = total.map_or(f64::INFINITY, |t| {
                float(t.checked_sub(*used).unwrap_or(Amount::ZERO))
            });
            let values = [
                ("total", total.map_or(f64::INFINITY, float)),
                ("used", float(*used)),
                ("available", available),
            ];
            for (kind, value) in values {
                let labels = [
                    ("name", name.as_str()),
                    ("node", node.as_str()),
                    ("state", kind),
                ];
                resources.encode_family(&labels)?.encode_gauge(&value)?;
            }
        }
        let help = "Nodes the head remembers, by liveness";
        let mut nodes = encoder.encode_descriptor("nodes", help, None, MetricType::Gauge)?;
        for (state, n) in [("alive", self.alive), ("dead", self.dead)] {
            nodes.encode_family(&[("state", state)])?.encode_gauge(&n)?;
        }
        let (term, commit, applied, leads) = self.raft;
        for (name, help, value) in [
            ("raft_term", "This replica's raft term", term),
            (
                "raft_commit_index",
                "The highest log index this replica knows committed",
                commit,
            ),
            (
                "raft_applied_index",
                "The highest log index this replica has applied",
                applied,
            ),
            (
                "raft_leader",
                "1 if this replica leads its group",
                u64::from(leads),
            ),
        ] {
            encoder
                .encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&value)?;
        }
        let help = "Messages waiting for each worker: on its stream, or until it attaches (a \
                    worker that lets 65,536 pile up is declared lost)";
        let mut outboxes =
            encoder.encode_descriptor("worker_outbox", help, None, MetricType::Gauge)?;
        for (node, depth) in &self.outboxes {
            outboxes
                .encode_family(&[("node", node.as_str())])?
                .encode_gauge(depth)?;
        }
        encode_workers(&self.workers, &mut encoder)
    }
}

/// One worker's heartbeat figures, sorted into what they export. Names it does not know are
/// left out (a newer worker may send more).
#[derive(Debug, Default)]
struct WorkerFigures {
    running: Option<f64>,
    /// The least free space on the worker's disks (its logs', its tasks'), in bytes.
    disk_free: Option<f64>,
    /// 1 while the worker is under its disk reserve and starts nothing.
    disk_under_reserve: Option<f64>,
    spawn_sum: f64,
    /// (upper bound, count in that bucket alone), in ascending order.
    spawn_buckets: Vec<(f64, u64)>,
    /// (gpu index, slice uuid, utilisation or memory, value).
    gpus: Vec<(String, Option<String>, GpuFigure, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuFigure {
    UtilizationPercent,
    MemoryUsedMib,
}

impl WorkerFigures {
    fn of(figures: &[Metric]) -> WorkerFigures {
        let mut out = WorkerFigures::default();
        for m in figures.iter().filter(|m| m.value.is_finite()) {
            if m.name == "running_tasks" {
                out.running = Some(m.value);
            } else if m.name == "disk_free_bytes" {
                out.disk_free = Some(m.value);
            } else if m.name == "disk_under_reserve" {
                out.disk_under_reserve = Some(m.value);
            } else if m.name == "spawn_seconds.sum" {
                out.spawn_sum = m.value;
            } else if let Some(le) = m.name.strip_prefix("spawn_seconds.bucket.") {
                let le = if le == "+Inf" {
                    Ok(f64::INFINITY)
                } else {
                    le.parse()
                };
                if let Ok(le) = le {
                    out.spawn_buckets.push((le, m.value.max(0.0) as u64));
                }
            } else if let Some(rest) = m.name.strip_prefix("gpu.") {
                let Some((gpu, rest)) = rest.split_once('.') else {
                    continue;
                };
                let (slice, what) = match rest.strip_prefix("slice.") {
                    Some(rest) => match rest.rsplit_once('.') {
                        Some((uuid, what)) => (Some(uuid.to_string()), what),
                        None => continue,
                    },
                    None => (None, rest),
                };
                let what = match what {
                    "utilization" => GpuFigure::UtilizationPercent,
                    "memory_used_mib" => GpuFigure::MemoryUsedMib,
                    _ => continue,
                };
                out.gpus.push((gpu.to_string(), slice, what, m.value));
            }
        }
        out.spawn_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.spawn_buckets.dedup_by(|a, b| a.0 == b.0);
        out
    }
}

/// The workers' figures: running tasks, the spawn-latency histogram, GPUs and MIG slices.
fn encode_workers(
    workers: &[(String, Vec<Metric>)],
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let parsed: Vec<(&str, WorkerFigures)> = workers
        .iter()
        .map(|(node, figures)| (node.as_str(), WorkerFigures::of(figures)))
        .collect();
    let help = "Tasks running on each live worker, as its last heartbeat said";
    let mut running =
        encoder.encode_descriptor("worker_running_tasks", help, None, MetricType::Gauge)?;
    for (node, f) in &parsed {
        if let Some(n) = f.running {
            running
                .encode_family(&[("node", *node)])?
                .encode_gauge(&n)?;
        }
    }
    for (name, help, figure) in [
        (
            "worker_disk_free_bytes",
            "The least free space on a live worker's disks (its log directory's, its task \
             directory's), as its last heartbeat said",
            (|f: &WorkerFigures| f.disk_free) as fn(&WorkerFigures) -> Option<f64>,
        ),
        (
            "worker_disk_under_reserve",
            "1 while a live worker has less free than its --disk-reserve on a disk and starts \
             no task, else 0",
            |f: &WorkerFigures| f.disk_under_reserve,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (node, f) in &parsed {
            if let Some(v) = figure(f) {
                family.encode_family(&[("node", *node)])?.encode_gauge(&v)?;
            }
        }
    }
    let help = "Seconds from an assignment's arrival at a worker to its task's start (a \
                command's process spawned, a function called), per live worker";
    let mut spawn =
        encoder.encode_descriptor("worker_spawn_seconds", help, None, MetricType::Histogram)?;
    for (node, f) in &parsed {
        if f.spawn_buckets.last().is_some_and(|b| b.0 == f64::INFINITY) {
            let count = f.spawn_buckets.iter().map(|b| b.1).sum();
            spawn
                .encode_family(&[("node", *node)])?
                .encode_histogram::<NoExemplar>(f.spawn_sum, count, &f.spawn_buckets, None)?;
        }
    }
    for (name, help, figure, slices, scale) in [
        (
            "gpu_utilization_percent",
            "Percent of time a kernel ran on each GPU (NVML; for a simulated GPU, the share \
             of its compute that tasks hold)",
            GpuFigure::UtilizationPercent,
            false,
            1.0,
        ),
        (
            "gpu_memory_used_bytes",
            "Memory used on each GPU (NVML; for a simulated GPU, what tasks hold)",
            GpuFigure::MemoryUsedMib,
            false,
            MIB,
        ),
        (
            "gpu_slice_utilization_percent",
            "Percent of each MIG slice's compute that tasks hold (simulated GPUs only: NVML \
             gives no utilisation per MIG device)",
            GpuFigure::UtilizationPercent,
            true,
            1.0,
        ),
        (
            "gpu_slice_memory_used_bytes",
            "Memory used in each MIG slice (NVML; for a simulated GPU, what tasks hold)",
            GpuFigure::MemoryUsedMib,
            true,
            MIB,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (node, f) in &parsed {
            for (gpu, slice, what, value) in &f.gpus {
                if *what != figure || slice.is_some() != slices {
                    continue;
                }
                let mut labels = vec![("node", *node), ("gpu", gpu.as_str())];
                if let Some(uuid) = slice {
                    labels.push(("slice", uuid.as_str()));
                }
                family
                    .encode_family(&labels)?
                    .encode_gauge(&(value * scale))?;
            }
        }
    }
    Ok(())
}

/// Exemplars are not used.
type NoExemplar = Vec<(String, String)>;

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// An amount as a float (amounts are fixed-point with 4 decimals).
fn float(a: Amount) -> f64 {
    a.raw() as f64 / 10_000.0
}

/// The policies' latest reports, as `escher_policy_measure{policy, namespace, row, measure}`.
#[derive(Debug)]
struct Policies(Vec<escher_proto::types::PolicyReport>);

impl Collector for Policies {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let help = "What each policy (an ESL) last reported of each of its rows (a tenant, a \
                    queue): its measures by name, e.g. fair-time's usage, factor and holds; kept \
                    by the replica that received the report";
        let mut family =
            encoder.encode_descriptor("policy_measure", help, None, MetricType::Gauge)?;
        for report in &self.0 {
            let namespace = report.namespace.as_deref().unwrap_or("");
            for row in &report.rows {
                for (measure, value) in &row.measures {
                    let labels = [
                        ("policy", report.policy.as_str()),
                        ("namespace", namespace),
                        ("row", row.row.as_str()),
                        ("measure", measure.as_str()),
                    ];
                    family.encode_family(&labels)?.encode_gauge(value)?;
                }
            }
        }
        Ok(())
    }
}

/// The exposition text of `snapshot` and `metrics`.
fn render(snapshot: Snapshot, metrics: &Metrics) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("escher");
    registry.register_collector(Box::new(snapshot));
    registry.register_collector(Box::new(Policies(metrics.policies.read(|_| true))));
    registry.register(
        "raft_role_changes",
        "Times this replica's raft role changed (leader elections it took part in)",
        metrics.role_changes.clone(),
    );
    registry.register(
        "submit_to_start_seconds",
        "Seconds from a task's submission to the dispatch of its latest attempt",
        metrics.submit_to_start.clone(),
    );
    registry.register(
        "apply_seconds",
        "Seconds this replica took to apply one committed command to the cluster state, by \
         command; the scheduler decides there (a submit's placement, a finished task's \
         successors), so this is the scheduling-decision latency",
        metrics.apply.clone(),
    );
    registry.register(
        "grpc_requests",
        "gRPC requests the head received, by method",
        metrics.requests.clone(),
    );
    registry.register(
        "grpc_errors",
        "gRPC requests answered with an error status at once (refused, invalid, not found ...), \
         by method and code; an error later in a stream is not counted",
        metrics.errors.clone(),
    );
    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// What a scrape needs.
#[derive(Clone)]
struct Scrape {
    owner: OwnerHandle,
    keys: Arc<Keys>,
    metrics: Arc<Metrics>,
    authenticate: bool,
}

/// Serves `/metrics` on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    owner: OwnerHandle,
    keys: Arc<Keys>,
    metrics: Arc<Metrics>,
    authenticate: bool,
    stop: CancellationToken,
) {
    let addr = listener.local_addr().ok();
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(Scrape {
            owner,
            keys,
            metrics,
            authenticate,
        });
    tracing::info!(?addr, "serving Prometheus metrics on /metrics");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    if let Err(err) = served {
        tracing::error!(%err, "the metrics endpoint failed");
    }
}

async fn scrape(State(s): State<Scrape>, headers: HeaderMap) -> Response {
    if s.authenticate {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(token) = token else {
            let why = "a scrape needs a token: Authorization: Bearer TOKEN (a reader token is \
                       enough; `escher token create --role reader`)\n";
            return (StatusCode::UNAUTHORIZED, why).into_response();
        };
        match s.keys.authenticate(token) {
            Ok(Caller::Worker | Caller::Peer) => {
                let why = "a worker or peer token cannot read metrics; use a reader token\n";
                return (StatusCode::FORBIDDEN, why).into_response();
            }
            // The metrics are the whole cluster's (every namespace's resources and task
            // counts): an application, or its tasks, reads its own through the API instead.
            Ok(
                caller @ (Caller::App(_)
                | Caller::Task {
                    namespace: Some(_), ..
                }),
            ) => {
                let why = format!(
                    "{} cannot read metrics: they show every namespace; use a reader or admin \
                     token (`escher token create --role reader`)\n",
                    caller.describe()
                );
                return (StatusCode::FORBIDDEN, why).into_response();
            }
            Ok(caller) => {
                // As on every gRPC method: a task's credential reads only while its attempt runs.
                if let Err(status) = check_attempt(&s.owner, &caller).await {
                    let why = format!("{}\n", status.message());
                    return (StatusCode::UNAUTHORIZED, why).into_response();
                }
            }
            Err(status) => {
                let why = format!("{}\n", status.message());
                return (StatusCode::UNAUTHORIZED, why).into_response();
            }
        }
    }
    let loads = s.metrics.actor_calls.fresh();
    let snapshot = s
        .owner
        .read(true, move |state| {
            let mut snapshot = Snapshot::of(state);
            for (ns, pending) in super::actor_calls::live(state, &loads) {
                *snapshot
                    .actor_calls
                    .entry(ns.unwrap_or_default().to_string())
                    .or_default() += pending;
            }
            snapshot
        })
        .await;
    let heads = s.owner.ask(|reply| Msg::Heads { reply }).await;
    let outboxes = s.owner.ask(|reply| Msg::Outboxes { reply }).await;
    let snapshot = match (snapshot, heads, outboxes) {
        (Ok(mut snapshot), Ok(HeadsView { me, .. }), Ok(outboxes)) => {
            let leads = me.role == Some(ReplicaRole::Leader);
            snapshot.raft = (me.term, me.commit_index, me.applied_index, leads);
            snapshot.outboxes = outboxes
                .into_iter()
                .map(|(node, depth)| (node.to_string(), depth as u64))
                .collect();
            snapshot.workers = s.metrics.workers_of(&snapshot.live);
            snapshot
        }
        (Err(status), _, _) | (_, Err(status), _) | (_, _, Err(status)) => {
            let why = format!("{}\n", status.message());
            return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
        }
    };
    match render(snapshot, &s.metrics) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n",
        )
            .into_response(),
    }
}
