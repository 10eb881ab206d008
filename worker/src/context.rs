//! [`TaskContext`]: what a running function task knows about itself, and its way back to the
//! cluster (docs/DESIGN.md §4: "a running task has a context").
//!
//! Through it a handler changes ephemeral resources on its own node (`NodeSpec::Local`, which
//! the head resolves through `caller_task`), or on any node, and reaches the rest of the
//! `Cluster` API with a raw client. Every context of a worker shares the worker's connections
//! to the head group. A call follows the group's leader and is retried through an election
//! (for up to [`FOLLOW_LEADER`]) by the client's own retry rules (`escher_client::retry`, which
//! the deterministic simulation runs as well), a resource change with an idempotency key so that
//! a retry never applies it twice; a write left in doubt ends as
//! [`WorkerError::UnknownOutcome`].

use std::fmt;
use std::sync::Arc;

use std::time::Duration;

use crate::head_conn::Authed;
use escher_client::retry::{self, Retry, Step};
use escher_proto::types::{SetResourceOutcome, SetResourcesReply, SetResourcesRequest};
use escher_proto::wire;
use escher_proto::wire::cluster_client::ClusterClient;
use escher_proto::{CapacityOp, Namespace, NodeId, NodeSpec, ResourceName, ResourceUpdate, TaskId};

use crate::error::WorkerError;
use crate::head_conn::HeadConn;

/// How long a resource change keeps trying to reach a leader (through an election).
pub const FOLLOW_LEADER: std::time::Duration = std::time::Duration::from_secs(15);

/// The context of one attempt of a function task.
#[derive(Clone)]
pub struct TaskContext {
    node_id: NodeId,
    task_id: TaskId,
    attempt: u32,
    namespace: Option<Namespace>,
    worker_name: Arc<str>,
    head: HeadConn,
    devices: Arc<[String]>,
    /// The task's credential (signed by the head for this attempt).
    token: escher_proto::access::Bearer,
    /// The same credential as text, for the Python interpreters' task environment.
    token_text: Arc<str>,
    /// The worker's task cgroups, where the Python interpreters it starts go too.
    cgroups: Option<Arc<crate::exec::TaskCgroups>>,
    /// What the task's request lets it use (`LimitPolicy::task`): the cgroup of the Python
    /// interpreter that runs it is held to them. `None`: no limit (a context made outside a
    /// worker).
    limits: Option<crate::exec::TaskLimits>,
    /// Where what a Python interpreter prints for this attempt goes.
    logs: Option<Arc<TaskLogs>>,
    /// The task's object arguments, brought into this node's store before it started, in
    /// the order the head keeps them (largest first).
    object_args: Arc<[crate::objects::ObjectView]>,
    /// This node's objects, where the results of earlier tasks a Python task takes as
    /// arguments are brought (`None`: a context made outside a worker).
    node_objects: Option<crate::objects::NodeObjects>,
    /// The object session of the client that submitted the task (its `escher.object-session`
    /// label): a Python task's `put`s go into it, so that a reference it returns outlives it.
    object_session: Option<u64>,
    /// The reports of copies this attempt fetched, still on their way to the head: the task
    /// reads a copy once it is sealed and checked, and its end waits for them
    /// ([`TaskContext::copy_reports`]).
    copy_reports: tokio_util::task::TaskTracker,
}

/// The copy reports of one attempt ([`TaskContext::copy_reports`]).
#[derive(Debug, Clone)]
pub(crate) struct CopyReports(tokio_util::task::TaskTracker);

impl CopyReports {
    /// Waits until every copy report made so far has its answer (and a copy the head left out
    /// was deleted); the runner calls it before it reports the attempt's end.
    pub(crate) async fn settle(&self) {
        self.0.close();
        self.0.wait().await;
        self.0.reopen();
    }
}

/// One output stream of an attempt that runs inside the worker ([`TaskContext::stdout`],
/// [`TaskContext::stderr`]): writes go to the attempt's log file, made at the first write.
/// Past the worker's cap (`--task-log-bytes`) writes are dropped (and the log ends with a line
/// that says so once the attempt ends); without log files (a context made outside a worker)
/// they go nowhere.
#[derive(Debug, Clone)]
pub struct TaskOutput {
    logs: Option<Arc<TaskLogs>>,
    task: TaskId,
    attempt: u32,
    stream: crate::exec::Stream,
}

impl std::io::Write for TaskOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(logs) = &self.logs else {
            return Ok(buf.len());
        };
        let mut files = logs.files.lock().unwrap_or_else(|p| p.into_inner());
        let files = match &mut *files {
            Some(files) => files,
            slot @ None => {
                let (kept, _, _) =
                    crate::exec::AttemptLogs::create(&logs.dir, self.task.0, self.attempt)
                        .map_err(std::io::Error::other)?;
                slot.insert(kept)
            }
        };
        files.append(self.stream, buf, logs.max_bytes)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log files of an attempt that runs inside the worker, made on demand: a Python task's
/// interpreter writes its output there (as a command task does), and the runner reads their
/// end for the head once the attempt ends.
#[derive(Debug)]
pub(crate) struct TaskLogs {
    /// The worker's log directory.
    pub(crate) dir: std::path::PathBuf,
    /// The most bytes of each stream kept (`--task-log-bytes`).
    pub(crate) max_bytes: u64,
    /// The files, once made.
    pub(crate) files: std::sync::Mutex<Option<crate::exec::AttemptLogs>>,
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("node_id", &self.node_id)
            .field("task_id", &self.task_id)
            .field("attempt", &self.attempt)
            .field("namespace", &self.namespace)
            .field("worker", &self.worker_name)
            .field("head", &self.head.list())
            .field("devices", &self.devices)
            .finish()
    }
}

impl TaskContext {
    // One argument per field: the runner has them loose, and a builder would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node_id: NodeId,
        task_id: TaskId,
        attempt: u32,
        namespace: Option<Namespace>,
        worker_name: Arc<str>,
        head: HeadConn,
        devices: Vec<String>,
        token: &str,
    ) -> TaskContext {
        TaskContext {
            node_id,
            task_id,
            attempt,
            namespace,
            worker_name,
            head,
            devices: devices.into(),
            token: escher_proto::access::Bearer::new(token),
            token_text: Arc::from(token),
            cgroups: None,
            limits: None,
            logs: None,
            object_args: Arc::from(Vec::new()),
            node_objects: None,
            object_session: None,
            copy_reports: tokio_util::task::TaskTracker::new(),
        }
    }

    /// The same context, with the object session the task's labels name
    /// ([`OBJECT_SESSION_LABEL`](escher_proto::types::OBJECT_SESSION_LABEL), if any).
    pub(crate) fn with_object_session_of(mut self, labels: &escher_proto::types::Labels) -> Self {
        self.object_session = labels
            .get(escher_proto::types::OBJECT_SESSION_LABEL)
            .and_then(escher_proto::types::parse_object_session);
        self
    }

    /// The object session of the client that submitted the task (its
    /// `escher.object-session` label), if it names one: a Python task puts into it, so the
    /// references it returns are its caller's.
    pub fn object_session(&self) -> Option<u64> {
        self.object_session
    }

    /// The same context, with this node's objects (for the results it reads as objects).
    pub(crate) fn with_node_objects(mut self, objects: crate::objects::NodeObjects) -> Self {
        self.node_objects = Some(objects);
        self
    }

    /// This node's objects, when the context belongs to a worker.
    pub(crate) fn node_objects(&self) -> Option<&crate::objects::NodeObjects> {
        self.node_objects.as_ref()
    }

    /// The same context, with the task's object arguments (mapped from this node's store).
    pub(crate) fn with_object_args(mut self, args: Vec<crate::objects::ObjectView>) -> Self {
        self.object_args = args.into();
        self
    }

    /// The objects this task takes as arguments (`Task::object_arg` on the client), each
    /// mapped from this node's store, where the worker brought it (worker to worker) before
    /// the task started: largest first. Empty for a task without object arguments.
    pub fn object_args(&self) -> &[crate::objects::ObjectView] {
        &self.object_args
    }

    /// Object argument `id`, if the task takes it.
    pub fn object_arg(
        &self,
        id: escher_proto::types::ObjectId,
    ) -> Option<&crate::objects::ObjectView> {
        self.object_args.iter().find(|v| v.id() == id)
    }

    /// What the head knows of object `id` (in the task's namespace), with a read ticket for
    /// each holder.
    pub(crate) async fn locate_object(
        &self,
        id: escher_proto::types::ObjectId,
    ) -> Result<escher_proto::types::ObjectView, WorkerError> {
        let request = wire::LocateObjectRequest {
            id: Some(id.into()),
            namespace: String::new(),
        };
        let reply = self
            .follow_leader("locate_object", |mut rpc| {
                let request = request.clone();
                async move { rpc.locate_object(request).await }
            })
            .await?;
        escher_proto::types::ObjectView::try_from(reply.into_inner()).map_err(|e| {
            WorkerError::BadReply {
                call: "locate_object",
                why: e.to_string(),
            }
        })
    }

    /// Reports the copy of `id` (`size` bytes, CRC-32C `crc32c`) this node sealed (a fetched
    /// argument), so that the head records it and publishes its location on this node.
    /// `Ok(Some(why))` when the head did not record it (it left the copy out, as for an object
    /// freed since it was located, or refused it): the copy counts nowhere and should go. An
    /// error is a report whose outcome is not known (the head could not be reached in time).
    pub(crate) async fn report_copy(
        &self,
        id: escher_proto::types::ObjectId,
        size: u64,
        crc32c: u32,
    ) -> Result<Option<String>, WorkerError> {
        let request = wire::ObjectsSealedRequest {
            copies: vec![wire::SealedObject {
                id: Some(id.into()),
                size,
                crc32c,
                node: self.node_id.0,
            }],
            namespace: String::new(),
        };
        let reply = self
            .follow_leader("objects_sealed", |mut rpc| {
                let request = request.clone();
                async move { rpc.objects_sealed(request).await }
            })
            .await;
        match reply {
            Ok(reply) => Ok(reply
                .into_inner()
                .dropped
                .into_iter()
                .next()
                .map(|dropped| dropped.reason)),
            // The head's own answer, after the command was applied and refused (another
            // namespace, the namespace's byte quota): nothing was recorded.
            Err(WorkerError::Rpc { status, .. })
                if matches!(
                    status.code(),
                    tonic::Code::FailedPrecondition
                        | tonic::Code::InvalidArgument
                        | tonic::Code::NotFound
                        | tonic::Code::PermissionDenied
                        | tonic::Code::ResourceExhausted
                ) =>
            {
                Ok(Some(status.message().to_string()))
            }
            Err(err) => Err(err),
        }
    }

    /// Reports the copy `view` of this node's `objects` (fetched for this attempt) in the
    /// background, as [`TaskContext::report_copy`] does, so that the task reads it at once: a
    /// copy the head does not record is deleted from the store when the answer comes (at once,
    /// or when the last view of it goes). The attempt's end waits for the report
    /// ([`CopyReports::settle`]): its credential is good only while the attempt runs, and the
    /// head knows the copy by the time it learns the task ended.
    pub(crate) fn report_copy_in_background(
        &self,
        objects: &crate::objects::NodeObjects,
        view: &crate::objects::ObjectView,
    ) {
        let (id, size, crc32c) = (view.id(), view.len(), view.crc32c());
        // What the report needs, without the attempt's views (it pins nothing).
        let mut reporter = self.clone();
        reporter.object_args = Arc::from(Vec::new());
        reporter.node_objects = None;
        let objects = objects.clone();
        self.copy_reports.spawn(async move {
            let started = tokio::time::Instant::now();
            match reporter.report_copy(id, size, crc32c).await {
                Ok(None) => {}
                // Counted nowhere (its object was freed since it was located, or the copy was
                // refused): the task still reads it, and the store lets it go once the task does.
                Ok(Some(why)) => {
                    tracing::info!(object = %id, %why, "the head did not record a fetched copy; \
                                   deleting it once the task lets go of it");
                    if let Err(err) = objects.delete(id) {
                        tracing::warn!(object = %id, %err, "could not delete a fetched copy");
                    }
                }
                // The task has its bytes; only the head's map of copies may miss this one (the
                // worker's next attach reports it again, and the head adopts it or has it
                // deleted).
                Err(err) => tracing::warn!(object = %id, %err, "could not report a fetched copy"),
            }
            tracing::debug!(object = %id, took = ?started.elapsed(), "copy reported");
        });
    }

    /// The reports of copies this attempt fetched that may still be on their way
    /// ([`TaskContext::report_copy_in_background`]), shared by every clone of the context.
    pub(crate) fn copy_reports(&self) -> CopyReports {
        CopyReports(self.copy_reports.clone())
    }

    /// The same context, whose Python output goes to log files in `logs.dir`.
    pub(crate) fn with_logs(mut self, logs: Arc<TaskLogs>) -> Self {
        self.logs = Some(logs);
        self
    }

    /// Where this attempt's Python output goes, if the worker keeps it.
    pub(crate) fn logs(&self) -> Option<&Arc<TaskLogs>> {
        self.logs.as_ref()
    }

    /// The attempt's standard output, for code that runs inside the worker (a Rust actor's
    /// constructor and methods, a function's handler): what is written there is the task's
    /// output, in the attempt's log files, which `escher logs` reads (and the head keeps the
    /// end of once the attempt ends), as a command's or a Python task's prints are. `print!`
    /// would go to the worker's own output, shared by every task. The files are made at the
    /// first write and held to the worker's cap (`--task-log-bytes`). Clone it freely.
    ///
    /// ```
    /// # fn demo(ctx: &escher_worker::TaskContext) -> std::io::Result<()> {
    /// use std::io::Write as _;
    /// writeln!(ctx.stdout(), "loaded {} rows", 42)?;
    /// # Ok(()) }
    /// ```
    pub fn stdout(&self) -> TaskOutput {
        self.output(crate::exec::Stream::Stdout)
    }

    /// The attempt's standard error, as [`TaskContext::stdout`] is its standard output.
    pub fn stderr(&self) -> TaskOutput {
        self.output(crate::exec::Stream::Stderr)
    }

    fn output(&self, stream: crate::exec::Stream) -> TaskOutput {
        TaskOutput {
            logs: self.logs.clone(),
            task: self.task_id,
            attempt: self.attempt,
            stream,
        }
    }

    /// The same context, whose Python interpreters go into cgroups of `cgroups`.
    pub(crate) fn with_cgroups(mut self, cgroups: Option<Arc<crate::exec::TaskCgroups>>) -> Self {
        self.cgroups = cgroups;
        self
    }

    /// The worker's task cgroups, if it has them.
    pub(crate) fn cgroups(&self) -> Option<&Arc<crate::exec::TaskCgroups>> {
        self.cgroups.as_ref()
    }

    /// The same context, whose Python interpreter is held to `limits` while it runs the task.
    pub(crate) fn with_limits(mut self, limits: crate::exec::TaskLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// What the task's request lets it use; no limit where the worker set none.
    pub(crate) fn limits(&self) -> crate::exec::TaskLimits {
        self.limits.unwrap_or_default()
    }

    /// The task's credential, as `ESCHER_TASK_TOKEN` gives it to a command task.
    pub(crate) fn token_text(&self) -> &str {
        &self.token_text
    }

    /// Every head replica's URL, as `ESCHER_HEAD` gives them to a command task.
    pub(crate) fn head_list(&self) -> &str {
        self.head.list()
    }

    /// The certificate (PEM) a task calling an `https://` head trusts, and the name checked
    /// against it: its worker's, as `ESCHER_TLS_CA` and `ESCHER_TLS_NAME` give them to a
    /// command task.
    pub(crate) fn head_trust(&self) -> (Option<&str>, Option<&str>) {
        match self.head.trust() {
            Some((ca, name)) => (Some(ca.as_str()), name.as_deref()),
            None => (None, None),
        }
    }

    /// The node this task runs on.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// This task.
    pub fn task_id(&self) -> TaskId {
        self.task_id
    }

    /// Which attempt of the task this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The application namespace of the task (its `escher.namespace` label), which qualifies
    /// the unqualified resource names it sets.
    pub fn namespace(&self) -> Option<&Namespace> {
        self.namespace.as_ref()
    }

    /// The name of the worker running the task.
    pub fn worker_name(&self) -> &str {
        &self.worker_name
    }

    /// The UUIDs of the GPU devices (whole GPUs `GPU-...`, MIG slices `MIG-...`) this task was
    /// given for the GPU resources it holds, in GPU order: what a command task gets as
    /// `CUDA_VISIBLE_DEVICES`. Empty when it holds none. An in-process function shares the
    /// worker's process, so this is advice to pass on (to a CUDA library or a child process),
    /// not an isolation.
    pub fn visible_devices(&self) -> &[String] {
        &self.devices
    }

    /// The URL of the head replica believed to lead.
    pub fn head_url(&self) -> String {
        self.head.url()
    }

    /// A raw client of the head's `Cluster` service, on the worker's shared connection,
    /// calling with this task's credential (so the head knows which task calls, in which
    /// namespace, and `NodeSpec::Local` means this task's node).
    pub fn cluster_client(&self) -> ClusterClient<Authed> {
        self.head.cluster_client(&self.token)
    }

    /// Creates, resizes or deletes resource `name` on this task's own node.
    pub async fn set_resource(
        &self,
        name: ResourceName,
        op: CapacityOp,
    ) -> Result<SetResourceOutcome, WorkerError> {
        let update = ResourceUpdate {
            name,
            op,
            target: NodeSpec::Local,
        };
        let reply = self.set_resources(vec![update]).await?;
        reply
            .outcomes
            .into_iter()
            .next()
            .ok_or_else(|| WorkerError::BadReply {
                call: "set_resources",
                why: "no outcome for the one update".into(),
            })
    }

    /// Applies a batch of resource changes in order; `NodeSpec::Local` targets mean this
    /// task's node.
    pub async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<SetResourcesReply, WorkerError> {
        let count = updates.len();
        let request = SetResourcesRequest {
            updates,
            namespace: self.namespace.clone(),
            caller_task: Some(self.task_id),
        };
        let ticket = self.head.ticket();
        let mut request = wire::SetResourcesRequest::from(request);
        request.key = Some(ticket.key().into());
        let reply = self
            .follow_leader("set_resources", |mut rpc| {
                let request = request.clone();
                async move { rpc.set_resources(request).await }
            })
            .await?;
        drop(ticket);
        let reply = SetResourcesReply::from(reply.into_inner());
        if reply.outcomes.len() != count {
            return Err(WorkerError::BadReply {
                call: "set_resources",
                why: format!("{} outcomes for {count} updates", reply.outcomes.len()),
            });
        }
        Ok(reply)
    }

    /// Reports samples of this task's progress (`("mem_used_gb", 3.2)`) to the head, as this
    /// attempt; policies read them with `Client::telemetry`. How many samples the head keeps
    /// for the task now.
    pub async fn report(&self, samples: &[(&str, f64)]) -> Result<usize, WorkerError> {
        let samples = samples
            .iter()
            .map(|(k, v)| escher_proto::types::Sample::new(k, *v).map(wire::TelemetrySample::from))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| WorkerError::BadReply {
                call: "report",
                why: e.to_string(),
            })?;
        let request = wire::ReportTelemetryRequest { samples };
        let reply = self
            .follow_leader("report_telemetry", |mut rpc| {
                let request = request.clone();
                async move { rpc.report_telemetry(request).await }
            })
            .await?;
        Ok(reply.into_inner().kept as usize)
    }

    /// Makes `call` on the head with this task's credential, following the leader through an
    /// election for up to [`FOLLOW_LEADER`], by the client's own retry rules
    /// ([`escher_client::retry`], which the simulation runs too): a named leader is followed, a
    /// replica that knows none or cannot be reached is left for the next after a pause, and a
    /// write whose attempt may have been applied without its answer ends as
    /// [`WorkerError::UnknownOutcome`] unless the head refused it.
    async fn follow_leader<T, F, Fut>(
        &self,
        name: &'static str,
        mut call: F,
    ) -> Result<tonic::Response<T>, WorkerError>
    where
        F: FnMut(ClusterClient<Authed>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let mut rules: Retry<String> = Retry::new(self.head.list(), FOLLOW_LEADER, Duration::ZERO);
        loop {
            let replica = self.head.url().trim_end_matches('/').to_string();
            let status = match call(self.cluster_client()).await {
                Ok(reply) => return Ok(reply),
                Err(status) => status,
            };
            let answered = retry::answered(&status);
            match rules.step(replica, answered, started.elapsed(), self.head.len()) {
                Step::Follow(leader) => self.head.follow(&leader),
                Step::Next(pause) => {
                    self.head.rotate();
                    tokio::time::sleep(pause).await;
                }
                Step::Fail => return Err(failed(name, &rules, status)),
                Step::Unavailable { message } => {
                    return Err(failed(name, &rules, tonic::Status::unavailable(message)));
                }
            }
        }
    }
}

/// The error a call to the head ended with: `status`, unless an attempt may have been applied
/// and `status` is not the head's refusal (then the outcome is unknown, as the rules word it).
fn failed(call: &'static str, rules: &Retry<String>, status: tonic::Status) -> WorkerError {
    use tonic::Code;
    let refused = matches!(
        status.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::OutOfRange
            | Code::ResourceExhausted
    );
    if rules.maybe_applied() && !refused {
        let error = escher_client::ClientError::Rpc(status.clone());
        if let escher_client::ClientError::UnknownOutcome { cause, .. } =
            rules.outcome(call, None, error)
        {
            return WorkerError::UnknownOutcome { call, cause };
        }
    }
    WorkerError::Rpc { call, status }
}
