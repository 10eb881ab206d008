//! The client against a fake head: a small in-memory implementation of the `Cluster`
//! service, bound on `127.0.0.1:0`, that answers the way the real head is specified to
//! (long-polling `Wait`, paged `ListTasks`, chunked `TaskLogs`, `invalid_argument` and
//! `not_found` with messages). It checks the client's side of the protocol: conversions,
//! paging and polling loops, error mapping, namespaces and caller tasks, the blocking wrapper
//! and the CLI's `run`. End-to-end tests with the real head live in the workspace `tests/`.
//!
//! The fake runs tasks instantly by their program or function name: `false` fails with exit
//! code 1, `sleep` runs until cancelled, any other command succeeds with exit code 0; the
//! function `double` returns twice its `u32` argument.
//!
//! For the replicated head's protocol it can play a replica that does not lead (every call
//! answered "not leader", naming a leader or none), lose the reply of the next write it
//! applies (answered as by a leader that just stepped down), and it answers a write whose
//! idempotency key it has seen with the recorded reply, as the real head does.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use escher_cli::Cli;
use escher_client::{BlockingClient, Client, ClientError, ResourceUpdateExt, Task};
use escher_proto::types::{
    HeadChange, HeadReplica, HeadsReply, MigRefusal, ReplicaRole, SetResourcesRequest,
};
use escher_proto::wire::cluster_server::{Cluster, ClusterServer};
use escher_proto::{
    ClusterStatus, Labels, LogStream, Namespace, NodeId, NodeSpec, NodeStatus, ResourceStatus,
    ResourceUpdate, TaskId, TaskInfo, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus,
    TaskSummary, codec, wire,
};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// The most tasks one `ListTasks` page holds, small so that paging is exercised.
const PAGE: usize = 2;
/// The most bytes one `TaskLogs` reply holds.
const LOG_CHUNK: usize = 3;
const OUTPUT: &[u8] = b"hello from the fake head\n";

#[derive(Default)]
struct State {
    tasks: BTreeMap<u64, (TaskSpec, TaskStatus)>,
    wait_calls: usize,
    /// `Run` calls.
    run_calls: usize,
    set_requests: Vec<SetResourcesRequest>,
    submit_namespaces: Vec<Option<Namespace>>,
    /// The one GPU's layout, and the layout being applied (done on the next `Gpus` call).
    mig_layout: String,
    mig_target: Option<String>,
    mig_report: Option<escher_proto::types::MigReport>,
    /// The key of every `Submit` that reached the handler, in order.
    submit_keys: Vec<Option<wire::RequestKey>>,
    /// Replies of keyed submits, by (client, seq).
    recorded: BTreeMap<(u64, u64), Vec<u64>>,
    /// Apply the next submit but answer as if leadership was lost before the reply.
    lose_next_reply: bool,
    /// The `authorization` metadata of every token call, in order.
    auth: Vec<Option<String>>,
    /// The tokens created, as the fake keeps them.
    tokens: Vec<escher_proto::types::TokenInfo>,
    /// Nodes drained.
    drained: Vec<u64>,
    /// Submission streams opened, and the requests that came on them.
    streams_opened: usize,
    streamed: usize,
    /// Apply the next streamed request, then break the stream instead of answering it.
    break_stream: bool,
    /// Answer `SubmitStream` and `WaitStream` with UNIMPLEMENTED, as a head without them.
    no_stream: bool,
    /// Result streams opened, and the tasks asked for on them.
    wait_streams_opened: usize,
    wait_streamed: usize,
    /// Break the result stream when its next request comes.
    break_wait_stream: bool,
    /// Answer the result stream's next request as a replica that lost its leadership.
    wait_stream_not_leader: bool,
}

/// The `authorization` metadata of a request.
fn auth<T>(request: &Request<T>) -> Option<String> {
    request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[derive(Clone, Default)]
struct FakeHead {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl FakeHead {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// How a task ends under the fake's rules, or `None` if it keeps running.
    fn outcome(id: u64, spec: &TaskSpec) -> TaskStatus {
        let (state, result) = match &spec.kind {
            TaskKind::Command { argv, .. } if argv[0] == "sleep" => (TaskState::Running, None),
            TaskKind::Command { argv, .. } if argv[0] == "false" => {
                (TaskState::Failed, Some(TaskResult::Exited { code: 1 }))
            }
            TaskKind::Command { .. } => {
                (TaskState::Succeeded, Some(TaskResult::Exited { code: 0 }))
            }
            TaskKind::Function { args, .. } => {
                let n: u32 = codec::decode(args).unwrap();
                let bytes = codec::encode(&(n * 2)).unwrap();
                (
                    TaskState::Succeeded,
                    Some(TaskResult::Returned(bytes.into())),
                )
            }
            TaskKind::Ghost { .. } | TaskKind::Actor(_) => (TaskState::Running, None),
        };
        TaskStatus {
            id: TaskId(id),
            state,
            node: Some(NodeId(1)),
            attempt: 1,
            reason: None,
            result,
            evicted: false,
            finished_at_ms: None,
            hook_errors: Vec::new(),
        }
    }

    /// What `Submit` does with `request`, as the stream and the unary call share it.
    fn apply_submit(&self, request: wire::SubmitRequest) -> Result<wire::SubmitReply, Status> {
        let key = request.key;
        let req = escher_proto::types::SubmitRequest::try_from(request)?;
        if let Some(i) = req.tasks.iter().position(|t| t.name == "rejected") {
            return Err(Status::invalid_argument(format!(
                "tasks[{i}].name: the fake head rejects this name"
            )));
        }
        let mut st = self.state();
        st.submit_keys.push(key);
        if let Some(ids) = key.and_then(|k| st.recorded.get(&(k.client, k.seq))) {
            return Ok(wire::SubmitReply {
                task_ids: ids.clone(),
            });
        }
        st.submit_namespaces.push(req.namespace);
        let mut ids = Vec::new();
        for spec in req.tasks {
            let id = st.tasks.len() as u64 + 1;
            let status = FakeHead::outcome(id, &spec);
            st.tasks.insert(id, (spec, status));
            ids.push(id);
        }
        if let Some(k) = key {
            st.recorded.insert((k.client, k.seq), ids.clone());
        }
        self.changed.notify_waiters();
        if std::mem::take(&mut st.lose_next_reply) {
            let mut lost = Status::unavailable("leadership lost before the reply");
            lost.metadata_mut()
                .insert("escher-leader", "".parse().unwrap());
            return Err(lost);
        }
        Ok(wire::SubmitReply { task_ids: ids })
    }

    /// What `Wait` answers `request`.
    async fn wait_for(&self, request: wire::WaitRequest) -> Result<wire::WaitReply, Status> {
        let req = escher_proto::types::WaitRequest::try_from(request)?;
        let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let changed = self.changed.notified();
            let mut ready = Vec::new();
            let mut not_ready = Vec::new();
            for id in &req.task_ids {
                let status = self.status(id.0)?;
                if status.state.is_terminal() {
                    ready.push(wire::TaskStatus::from(status));
                } else {
                    not_ready.push(id.0);
                }
            }
            let expired = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if ready.len() >= req.num_returns as usize || expired {
                return Ok(wire::WaitReply { ready, not_ready });
            }
            match deadline {
                Some(d) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(d) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    fn status(&self, id: u64) -> Result<TaskStatus, Status> {
        self.state()
            .tasks
            .get(&id)
            .map(|(_, s)| s.clone())
            .ok_or_else(|| Status::not_found(format!("task {id} is unknown")))
    }
}

#[tonic::async_trait]
impl Cluster for FakeHead {
    async fn dashboard_ticket(
        &self,
        _: Request<wire::DashboardTicketRequest>,
    ) -> Result<Response<wire::DashboardTicketReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }

    async fn report_policy(
        &self,
        request: Request<wire::ReportPolicyRequest>,
    ) -> Result<Response<wire::ReportPolicyReply>, Status> {
        self.state().auth.push(auth(&request));
        Err(Status::unimplemented(
            "this fake head keeps no policy reports (tests/e2e_metrics.rs runs a real one)",
        ))
    }

    async fn policies(
        &self,
        request: Request<wire::PoliciesRequest>,
    ) -> Result<Response<wire::PoliciesReply>, Status> {
        self.state().auth.push(auth(&request));
        Ok(Response::new(wire::PoliciesReply::default()))
    }

    async fn submit(
        &self,
        request: Request<wire::SubmitRequest>,
    ) -> Result<Response<wire::SubmitReply>, Status> {
        self.apply_submit(request.into_inner()).map(Response::new)
    }

    type SubmitStreamStream =
        tokio_stream::wrappers::ReceiverStream<Result<wire::SubmitStreamReply, Status>>;

    /// Each request is answered as `Submit` would answer it, one at a time.
    async fn submit_stream(
        &self,
        request: Request<tonic::Streaming<wire::SubmitRequest>>,
    ) -> Result<Response<Self::SubmitStreamStream>, Status> {
        {
            let mut st = self.state();
            st.streams_opened += 1;
            if st.no_stream {
                return Err(Status::unimplemented("no SubmitStream at this fake head"));
            }
        }
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let head = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                head.state().streamed += 1;
                let reply = match head.apply_submit(request) {
                    Ok(reply) => wire::SubmitStreamReply {
                        task_ids: reply.task_ids,
                        error: None,
                    },
                    Err(status) => wire::SubmitStreamReply {
                        task_ids: Vec::new(),
                        error: Some(wire::CallError::from(&status)),
                    },
                };
                if std::mem::take(&mut head.state().break_stream) {
                    let _ = tx
                        .send(Err(Status::internal("the fake head broke the stream")))
                        .await;
                    return;
                }
                if tx.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    type WaitStreamStream =
        tokio_stream::wrappers::ReceiverStream<Result<wire::WaitStreamReply, Status>>;

    /// Each task asked for is waited for as `Wait` would, and pushed when it finishes; an
    /// unknown task refuses its request.
    async fn wait_stream(
        &self,
        request: Request<tonic::Streaming<wire::WaitStreamRequest>>,
    ) -> Result<Response<Self::WaitStreamStream>, Status> {
        {
            let mut st = self.state();
            st.wait_streams_opened += 1;
            if st.no_stream {
                return Err(Status::unimplemented("no WaitStream at this fake head"));
            }
        }
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let head = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                head.state().wait_streamed += request.task_ids.len();
                if std::mem::take(&mut head.state().break_wait_stream) {
                    let _ = tx
                        .send(Err(Status::internal("the fake head broke the stream")))
                        .await;
                    return;
                }
                let refused = if std::mem::take(&mut head.state().wait_stream_not_leader) {
                    let mut status = Status::unavailable("this fake replica no longer leads");
                    status
                        .metadata_mut()
                        .insert("escher-leader", "".parse().unwrap());
                    Err(status)
                } else {
                    request
                        .task_ids
                        .iter()
                        .try_for_each(|id| head.status(*id).map(drop))
                };
                if let Err(status) = refused {
                    let reply = wire::WaitStreamReply {
                        finished: Vec::new(),
                        failed: request.task_ids,
                        error: Some(wire::CallError::from(&status)),
                    };
                    if tx.send(Ok(reply)).await.is_err() {
                        return;
                    }
                    continue;
                }
                for id in request.task_ids {
                    let (head, tx) = (head.clone(), tx.clone());
                    tokio::spawn(async move {
                        let wait = wire::WaitRequest {
                            task_ids: vec![id],
                            num_returns: 1,
                            timeout_ms: None,
                        };
                        let reply = match head.wait_for(wait).await {
                            Ok(reply) => wire::WaitStreamReply {
                                finished: reply.ready,
                                failed: Vec::new(),
                                error: None,
                            },
                            Err(status) => wire::WaitStreamReply {
                                finished: Vec::new(),
                                failed: vec![id],
                                error: Some(wire::CallError::from(&status)),
                            },
                        };
                        let _ = tx.send(Ok(reply)).await;
                    });
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn run(
        &self,
        request: Request<wire::RunRequest>,
    ) -> Result<Response<wire::RunReply>, Status> {
        let request = request.into_inner();
        let submit = request
            .submit
            .ok_or_else(|| Status::invalid_argument("Run needs `submit`"))?;
        if submit.tasks.len() != 1 {
            return Err(Status::invalid_argument("Run takes exactly one task"));
        }
        self.state().run_calls += 1;
        let ids = self
            .submit(Request::new(submit))
            .await?
            .into_inner()
            .task_ids;
        let wait = wire::WaitRequest {
            task_ids: ids.clone(),
            num_returns: 1,
            timeout_ms: request.timeout_ms,
        };
        let mut reply = self.wait(Request::new(wait)).await?.into_inner();
        Ok(Response::new(wire::RunReply {
            task_id: ids[0],
            status: reply.ready.pop(),
        }))
    }

    async fn wait(
        &self,
        request: Request<wire::WaitRequest>,
    ) -> Result<Response<wire::WaitReply>, Status> {
        self.state().wait_calls += 1;
        self.wait_for(request.into_inner()).await.map(Response::new)
    }

    async fn requeue(
        &self,
        _: Request<wire::RequeueRequest>,
    ) -> Result<Response<wire::RequeueReply>, Status> {
        Err(Status::unimplemented("the fake head does not requeue"))
    }

    async fn cancel(
        &self,
        request: Request<wire::CancelRequest>,
    ) -> Result<Response<wire::CancelReply>, Status> {
        let mut out = Vec::new();
        {
            let mut st = self.state();
            for id in request.into_inner().task_ids {
                let Some((_, status)) = st.tasks.get_mut(&id) else {
                    return Err(Status::not_found(format!("task {id} is unknown")));
                };
                if !status.state.is_terminal() {
                    status.state = TaskState::Cancelled;
                    status.reason = Some("cancelled by a user".into());
                }
                out.push(wire::TaskStatus::from(status.clone()));
            }
        }
        self.changed.notify_waiters();
        Ok(Response::new(wire::CancelReply { tasks: out }))
    }

    async fn describe_task(
        &self,
        request: Request<wire::DescribeTaskRequest>,
    ) -> Result<Response<wire::TaskInfo>, Status> {
        let id = request.into_inner().task_id;
        let st = self.state();
        let (spec, status) = st
            .tasks
            .get(&id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("task {id} is unknown")))?;
        let info = TaskInfo {
            spec,
            status,
            pending_reason: None,
            submitted_at_ms: 1_700_000_000_000,
            started_at_ms: Some(1_700_000_000_100),
            finished_at_ms: None,
            attempts: Vec::new(),
            parent: None,
        };
        Ok(Response::new(info.into()))
    }

    async fn list_tasks(
        &self,
        request: Request<wire::ListTasksRequest>,
    ) -> Result<Response<wire::ListTasksReply>, Status> {
        let req = escher_proto::types::ListTasksRequest::try_from(request.into_inner())?;
        let limit = if req.limit == 0 {
            PAGE
        } else {
            (req.limit as usize).min(PAGE)
        };
        let after = req.after.map_or(0, |t| t.0);
        let st = self.state();
        let tasks = st
            .tasks
            .range(after + 1..)
            .filter(|(_, (_, s))| req.state.is_none_or(|want| s.state == want))
            .take(limit)
            .map(|(id, (spec, s))| {
                wire::TaskSummary::from(TaskSummary {
                    id: TaskId(*id),
                    name: spec.name.clone(),
                    state: s.state,
                    node: s.node,
                    attempt: s.attempt,
                    reason: s.reason.clone(),
                    resources: spec.resources.clone(),
                    submitted_at_ms: 1_700_000_000_000,
                    started_at_ms: None,
                    finished_at_ms: s.finished_at_ms,
                    namespace: None,
                })
            })
            .collect();
        Ok(Response::new(wire::ListTasksReply { tasks, more: 0 }))
    }

    async fn set_resources(
        &self,
        request: Request<wire::SetResourcesRequest>,
    ) -> Result<Response<wire::SetResourcesReply>, Status> {
        let req = SetResourcesRequest::try_from(request.into_inner())?;
        // All or none, as the head: an update for a node the fake does not have refuses the call.
        if let Some(id) = req.updates.iter().find_map(|u| match u.target {
            NodeSpec::Node(NodeId(id)) if id > 2 => Some(id),
            _ => None,
        }) {
            return Err(Status::not_found(format!(
                "node {id} is not in the cluster"
            )));
        }
        let outcomes = req
            .updates
            .iter()
            .map(|_| wire::SetResourceOutcome { nodes: vec![1, 2] })
            .collect();
        self.state().set_requests.push(req);
        Ok(Response::new(wire::SetResourcesReply { outcomes }))
    }

    async fn cluster_status(
        &self,
        _request: Request<wire::ClusterStatusRequest>,
    ) -> Result<Response<wire::ClusterStatusReply>, Status> {
        let status = ClusterStatus {
            nodes: vec![NodeStatus {
                id: NodeId(1),
                name: "fake".into(),
                address: "127.0.0.1:0".into(),
                alive: true,
                labels: Labels::new(),
                resources: vec![ResourceStatus {
                    name: "cpu".parse().unwrap(),
                    total: "4".parse().unwrap(),
                    used: "5".parse().unwrap(),
                }],
                left_at_ms: None,
                left_because: None,
                fence: None,
                waiting_for_stream: false,
            }],
            pending_tasks: 0,
            running_tasks: 1,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        Ok(Response::new(status.into()))
    }

    /// One node with one simulated A100 in MIG mode; a layout being applied shows as
    /// reconfiguring once, then as done.
    async fn gpus(
        &self,
        _request: Request<wire::GpusRequest>,
    ) -> Result<Response<wire::GpusReply>, Status> {
        use escher_proto::mig::{GpuModel, Layout};
        use escher_proto::types::{
            GpuInfo, GpuStatus, GpusReply, MigDevice, MigProgress, NodeGpus,
        };
        let mut st = self.state();
        if st.mig_layout.is_empty() {
            st.mig_layout = "7g.40gb@0".into();
        }
        let reconfiguring = st.mig_target.take().map(|target| {
            st.mig_layout = target.clone();
            MigProgress {
                target,
                retiring: vec![],
                waiting_for: vec![],
                since_ms: 0,
            }
        });
        let layout = Layout::parse(GpuModel::A100_40GB, &st.mig_layout).unwrap();
        let slices = layout
            .placements()
            .iter()
            .map(|p| MigDevice {
                profile: p.profile.name.into(),
                start: p.start,
                size: p.profile.memory_slices,
                memory_mib: 4864,
                uuid: format!("MIG-{}", p.start),
            })
            .collect();
        let gpu = GpuStatus {
            info: GpuInfo {
                index: 0,
                uuid: "GPU-fake".into(),
                product: "NVIDIA A100-SXM4-40GB".into(),
                model: Some(GpuModel::A100_40GB),
                memory_mib: 40960,
                mig_enabled: true,
                simulated: true,
                slices,
            },
            holders: vec![],
            reconfiguring,
            last_error: None,
            last_reconfiguration: st.mig_report.clone(),
        };
        let reply = GpusReply {
            nodes: vec![NodeGpus {
                node: NodeId(1),
                name: "fake".into(),
                alive: true,
                gpus: vec![gpu],
            }],
        };
        Ok(Response::new(reply.into()))
    }

    /// Refuses a layout containing `busy` as the real head refuses a busy GPU; accepts any
    /// other legal A100 layout for GPU 0 of node 1.
    async fn apply_mig_layout(
        &self,
        request: Request<wire::ApplyMigLayoutRequest>,
    ) -> Result<Response<wire::MigPlan>, Status> {
        use escher_proto::mig::{GpuModel, LatencyModel, Layout, Placement, diff};
        use escher_proto::types::{MigChange, MigReport};
        let req = escher_proto::types::ApplyMigLayoutRequest::try_from(request.into_inner())?;
        if req.node != NodeId(1) || req.gpu != 0 {
            return Err(Status::not_found(format!(
                "node {} has no GPU {}",
                req.node, req.gpu
            )));
        }
        let refused = |status: fn(String) -> Status, message: String, why: &'static str| {
            let mut status = status(message);
            status.metadata_mut().insert(
                escher_proto::types::MIG_REFUSAL_METADATA,
                tonic::metadata::MetadataValue::from_static(why),
            );
            status
        };
        if req.change.text().contains("busy") {
            return Err(refused(
                Status::failed_precondition,
                "GPU 0 of node 1 cannot be reconfigured now: slice 7g.40gb@0 may be in use".into(),
                "busy",
            ));
        }
        let mut st = self.state();
        let now = if st.mig_layout.is_empty() {
            "7g.40gb@0"
        } else {
            st.mig_layout.as_str()
        };
        let from = Layout::parse(GpuModel::A100_40GB, now).unwrap();
        let illegal = |e: escher_proto::mig::MigError| {
            let why = match e {
                escher_proto::mig::MigError::Overlap { .. } => "overlap",
                _ => "illegal",
            };
            refused(Status::invalid_argument, e.to_string(), why)
        };
        let to = match &req.change {
            MigChange::Layout(text) | MigChange::Prepare(text) => {
                Layout::parse(GpuModel::A100_40GB, text).map_err(illegal)?
            }
            MigChange::Create(text) => {
                let mut to = from.clone();
                to.add_entry(text).map_err(illegal)?;
                to
            }
            MigChange::Destroy(text) => {
                let p = Placement::parse(GpuModel::A100_40GB, text).map_err(illegal)?;
                let mut to = from.clone();
                to.remove(p.start).filter(|q| *q == p).ok_or_else(|| {
                    refused(
                        Status::not_found,
                        format!("GPU 0 of node 1 has no MIG instance {text}"),
                        "no-such-instance",
                    )
                })?;
                to
            }
        };
        let cost = LatencyModel::default().cost(&from, &to);
        st.mig_target = Some(to.to_string());
        st.mig_report = Some(MigReport {
            target: to.to_string(),
            asked_ms: 1_000,
            done_ms: 1_000 + cost.total().as_millis() as u64,
            phases: cost,
            error: None,
        });
        let (destroy, create) = diff(&from, &to);
        let names = |v: Vec<Placement>| v.iter().map(|p| p.to_string()).collect();
        let plan = escher_proto::types::MigPlan {
            node: req.node,
            gpu: req.gpu,
            from: from.to_string(),
            to: to.to_string(),
            destroy: names(destroy),
            create: names(create),
            waiting_for: vec![],
            estimated: cost.total(),
        };
        Ok(Response::new(plan.into()))
    }

    async fn task_logs(
        &self,
        request: Request<wire::TaskLogsRequest>,
    ) -> Result<Response<wire::TaskLogsReply>, Status> {
        let req = escher_proto::types::TaskLogsRequest::try_from(request.into_inner())?;
        self.status(req.task_id.0)?;
        let text: &[u8] = match req.stream {
            LogStream::Stdout => OUTPUT,
            LogStream::Stderr => b"",
        };
        let start = (req.offset as usize).min(text.len());
        let end = (start + LOG_CHUNK).min(text.len());
        Ok(Response::new(wire::TaskLogsReply {
            data: text[start..end].to_vec(),
            next_offset: end as u64,
            eof: end == text.len(),
            attempt: 1,
            notice: String::new(),
        }))
    }
    /// Holds each bundle with a running ghost at once (the fake has room for anything).
    async fn reserve(
        &self,
        request: Request<wire::ReserveRequest>,
    ) -> Result<Response<wire::ReserveReply>, Status> {
        let req = escher_proto::types::ReserveRequest::try_from(request.into_inner())?;
        let mut st = self.state();
        st.submit_namespaces.push(req.namespace);
        let mut ids = Vec::new();
        for (i, bundle) in req.bundles.into_iter().enumerate() {
            let id = st.tasks.len() as u64 + 1;
            let spec = TaskSpec {
                name: format!("{} bundle {i}", req.name),
                kind: TaskKind::Ghost {
                    creates: Vec::new(),
                    ttl: None,
                },
                resources: bundle,
                labels: Labels::new(),
                max_retries: 0,
                timeout: None,
                pending_deadline: req.timeout,
                on_start: Vec::new(),
                on_success: Vec::new(),
            };
            let status = FakeHead::outcome(id, &spec);
            st.tasks.insert(id, (spec, status));
            ids.push(id);
        }
        self.changed.notify_waiters();
        Ok(Response::new(wire::ReserveReply {
            task_ids: ids,
            placed: true,
        }))
    }

    async fn heads(
        &self,
        _request: Request<wire::HeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        Ok(Response::new(fake_heads(1).into()))
    }

    async fn change_heads(
        &self,
        request: Request<wire::ChangeHeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        let n = match HeadChange::try_from(request.into_inner())? {
            HeadChange::Add { id, .. } => id,
            HeadChange::Remove { .. } => 1,
        };
        Ok(Response::new(fake_heads(n).into()))
    }

    async fn create_token(
        &self,
        request: Request<wire::CreateTokenRequest>,
    ) -> Result<Response<wire::CreatedToken>, Status> {
        let header = auth(&request);
        let req = escher_proto::types::CreateTokenRequest::try_from(request.into_inner())?;
        let mut st = self.state();
        st.auth.push(header);
        let info = escher_proto::types::TokenInfo {
            id: format!("{:012x}", st.tokens.len() + 1),
            grant: req.grant,
            description: req.description,
            created_at_ms: 1_700_000_000_000,
            revoked_at_ms: None,
            bootstrap: false,
        };
        st.tokens.push(info.clone());
        let created = escher_proto::types::CreatedToken {
            token: format!("escher-{}-fake{}", info.grant.role, st.tokens.len()),
            info,
        };
        Ok(Response::new(created.into()))
    }

    async fn list_tokens(
        &self,
        request: Request<wire::ListTokensRequest>,
    ) -> Result<Response<wire::ListTokensReply>, Status> {
        let mut st = self.state();
        st.auth.push(auth(&request));
        let tokens = st.tokens.iter().cloned().map(Into::into).collect();
        Ok(Response::new(wire::ListTokensReply { tokens }))
    }

    async fn revoke_token(
        &self,
        request: Request<wire::RevokeTokenRequest>,
    ) -> Result<Response<wire::TokenInfo>, Status> {
        let header = auth(&request);
        let id = request.into_inner().id;
        let mut st = self.state();
        st.auth.push(header);
        let token = st
            .tokens
            .iter_mut()
            .find(|t| t.id == id)
            .ok_or_else(|| Status::not_found(format!("unknown token {id}")))?;
        token.revoked_at_ms = Some(1_700_000_001_000);
        Ok(Response::new(token.clone().into()))
    }

    async fn drain(
        &self,
        request: Request<wire::DrainRequest>,
    ) -> Result<Response<wire::DrainReply>, Status> {
        let mut st = self.state();
        st.auth.push(auth(&request));
        st.drained.push(request.get_ref().node);
        Ok(Response::new(wire::DrainReply { draining: true }))
    }

    async fn label_node(
        &self,
        request: Request<wire::LabelNodeRequest>,
    ) -> Result<Response<wire::LabelNodeReply>, Status> {
        self.state().auth.push(auth(&request));
        Err(Status::unimplemented(
            "this fake head does not label nodes (tests/e2e_node_labels.rs runs a real one)",
        ))
    }

    async fn record_decision(
        &self,
        request: Request<wire::RecordDecisionRequest>,
    ) -> Result<Response<wire::RecordDecisionReply>, Status> {
        self.state().auth.push(auth(&request));
        Err(Status::unimplemented(
            "this fake head records no decisions (tests/e2e_autoscaler.rs runs a real one)",
        ))
    }

    type WatchStream = tokio_stream::Empty<Result<wire::WatchResponse, Status>>;

    type BackupStream = tokio_stream::Empty<Result<wire::BackupChunk, Status>>;

    async fn resolve_actor(
        &self,
        _request: Request<wire::ResolveActorRequest>,
    ) -> Result<Response<wire::ResolveActorReply>, Status> {
        Err(Status::unimplemented("the fake head hosts no actors"))
    }
    async fn place_object(
        &self,
        _: Request<wire::PlaceObjectRequest>,
    ) -> Result<Response<wire::PlaceObjectReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn objects_sealed(
        &self,
        _: Request<wire::ObjectsSealedRequest>,
    ) -> Result<Response<wire::ObjectsSealedReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn release_objects(
        &self,
        _: Request<wire::ReleaseObjectsRequest>,
    ) -> Result<Response<wire::ReleaseObjectsReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn locate_object(
        &self,
        _: Request<wire::LocateObjectRequest>,
    ) -> Result<Response<wire::ObjectInfo>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn list_objects(
        &self,
        _: Request<wire::ListObjectsRequest>,
    ) -> Result<Response<wire::ListObjectsReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn open_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::OpenObjectSessionReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn renew_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::RenewObjectSessionReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }
    async fn close_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::CloseObjectSessionReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no objects"))
    }

    async fn backup(
        &self,
        _request: Request<wire::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Err(Status::unimplemented(
            "the fake head keeps no state to back up",
        ))
    }

    async fn watch(
        &self,
        _request: Request<wire::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented(
            "the fake head does not stream events",
        ))
    }

    async fn report_telemetry(
        &self,
        _request: Request<wire::ReportTelemetryRequest>,
    ) -> Result<Response<wire::ReportTelemetryReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no telemetry"))
    }

    async fn telemetry(
        &self,
        _request: Request<wire::TelemetryRequest>,
    ) -> Result<Response<wire::TelemetryReply>, Status> {
        Err(Status::unimplemented("the fake head keeps no telemetry"))
    }
}

/// A group of replicas 1 to `n`, replica 1 leading.
fn fake_heads(n: u64) -> HeadsReply {
    HeadsReply {
        group: "fake-group".into(),
        replicas: (1..=n)
            .map(|id| HeadReplica {
                id,
                address: format!("127.0.0.1:{}", 7600 + id),
                role: Some(if id == 1 {
                    ReplicaRole::Leader
                } else {
                    ReplicaRole::Follower
                }),
                term: 2,
                commit_index: 9,
                applied_index: 9,
                reachable: true,
                error: None,
                leader: Some(1),
                in_memory: true,
                data_format: Some(1),
                writes_data_format: Some(1),
                stalled: None,
            })
            .collect(),
    }
}

/// A replica that does not lead: every call is answered UNAVAILABLE with `escher-leader`
/// naming `leader` (empty: none known). Returns its URL.
async fn follower(leader: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let leader = leader.to_string();
    let service = ClusterServer::with_interceptor(FakeHead::default(), move |_req| {
        let mut status = Status::unavailable("this fake replica is not the leader");
        status
            .metadata_mut()
            .insert("escher-leader", leader.parse().unwrap());
        Err(status)
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    url
}

/// Starts the fake head on `127.0.0.1:0`; returns it and its URL.
async fn start() -> (FakeHead, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let head = FakeHead::default();
    let service = ClusterServer::new(head.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (head, url)
}

async fn client(url: &str) -> Client {
    Client::connect(url).await.unwrap().without_caller_task()
}

#[tokio::test]
async fn a_follower_sends_the_client_to_the_leader() {
    let (head, leader) = start().await;
    let follower = follower(&leader).await;
    let client = client(&follower).await;
    let task = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(client.leader_url(), leader);
    let status = client
        .get(&task, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
    let key = head.state().submit_keys[0].expect("a write carries its key");
    assert_eq!((key.seq, key.first_incomplete), (1, 1));
    assert_ne!(key.client, 0);
}

#[tokio::test]
async fn a_replica_with_no_leader_is_retried_until_the_failover_timeout() {
    let nowhere = follower("").await;
    let client = client(&nowhere)
        .await
        .with_failover_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = client.submit(Task::command(["true"])).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(matches!(err, ClientError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("no head replica answered as the leader"),
        "{text}"
    );
    assert!(err.is_retryable());
}

/// Two fake replicas that each name the other as the leader (as two replicas do, at different
/// moments, while an election has not settled); returns their URLs.
async fn followers_naming_each_other() -> (String, String) {
    followers_naming_each_other_after(false).await
}

/// [`followers_naming_each_other`]; with `cut_first`, the first replica's first call is cut
/// after it went out (UNKNOWN, as tonic reports a connection reset mid-call).
async fn followers_naming_each_other_after(cut_first: bool) -> (String, String) {
    let (a, b) = (
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let urls = (
        format!("http://{}", a.local_addr().unwrap()),
        format!("http://{}", b.local_addr().unwrap()),
    );
    for (listener, names, cut) in [(a, urls.1.clone(), cut_first), (b, urls.0.clone(), false)] {
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(cut));
        let service = ClusterServer::with_interceptor(FakeHead::default(), move |_req| {
            if cut.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(Status::unknown("transport error: connection reset"));
            }
            let mut status = Status::unavailable("this fake replica is not the leader");
            status
                .metadata_mut()
                .insert("escher-leader", names.parse().unwrap());
            Err(status)
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
    }
    urls
}

#[tokio::test]
async fn replicas_that_name_each_other_are_explained_without_contradiction() {
    let (a, b) = followers_naming_each_other().await;
    let client = client(&format!("{a},{b}"))
        .await
        .with_failover_timeout(Duration::from_millis(300));
    let err = client.submit(Task::command(["true"])).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::Unavailable { .. }), "{text}");
    // Each answer says when it was given, and the message says why two can name each other.
    assert!(
        text.contains(&format!("{a} ")) && text.contains(&format!("{b} ")),
        "{text}"
    );
    assert!(text.contains("s in: up, not the leader"), "{text}");
    assert!(text.contains("an election had not settled"), "{text}");
}

/// An unknown outcome was once explained only as two replicas that name each other as the
/// leader, which says nothing of why the write may have been applied. Its cause now names the
/// attempt that left it open first, then what the call ended with.
#[tokio::test]
async fn an_unknown_outcome_names_the_cut_attempt_before_the_replicas_answers() {
    let (a, b) = followers_naming_each_other_after(true).await;
    let client = client(&format!("{a},{b}"))
        .await
        .with_failover_timeout(Duration::from_millis(300));
    // The first run is one unary Run call, a write under its key.
    let err = client.run(Task::command(["true"]), None).await.unwrap_err();
    let text = err.to_string();
    let ClientError::UnknownOutcome { cause, .. } = &err else {
        panic!("not an unknown outcome: {text}")
    };
    assert!(
        cause.starts_with(&format!(
            "the request went out to {a} 0.0s in and the call broke before its answer (Unknown: \
             transport error: connection reset); after that: "
        )),
        "{cause}"
    );
    assert!(
        cause.contains("no head replica answered as the leader")
            && cause.contains("an election had not settled"),
        "{cause}"
    );
    assert!(
        text.contains("retry it under the same idempotency key"),
        "{text}"
    );
}

#[tokio::test]
async fn a_write_whose_reply_was_lost_is_retried_with_the_same_key_and_applied_once() {
    let (head, url) = start().await;
    let client = client(&url).await;
    head.state().lose_next_reply = true;
    let refs = client
        .submit_batch([Task::command(["true"]), Task::command(["true"])])
        .await
        .unwrap();
    let ids: Vec<u64> = refs.iter().map(|r| r.id().0).collect();
    assert_eq!(ids, [1, 2]);
    let st = head.state();
    assert_eq!(st.tasks.len(), 2, "applied once");
    assert_eq!(st.submit_keys.len(), 2, "sent twice");
    assert_eq!(st.submit_keys[0], st.submit_keys[1], "with one key");
}

#[tokio::test]
async fn run_submits_and_waits_in_one_call_and_a_lost_reply_runs_nothing_twice() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let done = client.run(Task::command(["true"]), None).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, Some(TaskResult::Exited { code: 0 }));
    {
        let st = head.state();
        assert_eq!(
            (st.run_calls, st.wait_calls, st.streamed, st.wait_streamed),
            (1, 1, 0, 0),
            "the first run is one Run call, nothing else"
        );
    }
    // A failed task is a status, not an error, as with `get`; later runs travel on the
    // client's streams.
    let failed = client.run(Task::command(["false"]), None).await.unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    {
        let st = head.state();
        assert_eq!(
            (st.run_calls, st.streamed, st.wait_streamed),
            (1, 1, 1),
            "one message on each stream, no call"
        );
    }
    // Still running when the timeout passes: the client's timeout error, with the id.
    let err = client
        .run(
            Task::command(["sleep", "60"]),
            Some(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Timeout { id: TaskId(3), .. }),
        "{err}"
    );
    // The reply lost once: retried with the same key, applied once, on the streams and in
    // the first run of a new client (its Run call).
    head.state().lose_next_reply = true;
    let again = client.run(Task::command(["true"]), None).await.unwrap();
    assert_eq!((again.id, again.state), (TaskId(4), TaskState::Succeeded));
    assert_eq!(head.state().tasks.len(), 4, "no task submitted twice");
    let fresh = self::client(&url).await;
    head.state().lose_next_reply = true;
    let again = fresh.run(Task::command(["true"]), None).await.unwrap();
    assert_eq!((again.id, again.state), (TaskId(5), TaskState::Succeeded));
    assert_eq!(head.state().run_calls, 3, "the Run call, and its retry");
    assert_eq!(head.state().tasks.len(), 5, "no task submitted twice");
}

#[tokio::test]
async fn a_coalesced_batch_with_an_unknown_outcome_is_never_split() {
    let (head, url) = start().await;
    let client = client(&url).await;
    head.state().lose_next_reply = true;
    // Concurrent submits travel in batches; the first batch's reply is lost once, and the
    // retry of the same batch (same key) is answered with the recorded ids.
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.submit(Task::command(["true"])).await })
        })
        .collect();
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.await.unwrap().unwrap().id().0);
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=20).collect::<Vec<_>>());
    assert_eq!(head.state().tasks.len(), 20, "no task submitted twice");
}

#[tokio::test]
async fn submit_get_and_typed_results() {
    let (head, url) = start().await;
    let client = client(&url)
        .await
        .with_namespace(Namespace::new("app").unwrap());

    let ok = client.submit(Task::command(["echo", "hi"])).await.unwrap();
    assert_eq!((ok.id(), ok.name()), (TaskId(1), "echo"));
    let status = client.get(&ok, None).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(
        client.get_result(&ok, None).await.unwrap(),
        TaskResult::Exited { code: 0 }
    );

    let doubled = client
        .submit_typed::<u32>(Task::function_typed("double", &21u32))
        .await
        .unwrap();
    assert_eq!(doubled.get(&client, None).await.unwrap(), 42);
    assert_eq!(
        client.get_typed::<u32>(doubled.id(), None).await.unwrap(),
        42
    );
    let err = client
        .get_typed::<String>(doubled.id(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Decode { .. }), "{err:?}");
    let err = client.get_typed::<u32>(&ok, None).await.unwrap_err();
    assert!(
        matches!(err, ClientError::WrongResultKind { .. }),
        "{err:?}"
    );

    let failed = client.submit(Task::command(["false"])).await.unwrap();
    match client.get_result(&failed, None).await {
        Err(ClientError::TaskFailed { id, state, reason }) => {
            assert_eq!((id, state), (failed.id(), TaskState::Failed));
            assert_eq!(reason, "exit code 1");
        }
        other => panic!("{other:?}"),
    }
    let ns = head.state().submit_namespaces.clone();
    assert!(
        ns.iter()
            .all(|n| n.as_ref().map(Namespace::as_str) == Some("app"))
    );
}

#[tokio::test]
async fn long_waits_are_split_and_time_out() {
    let (head, url) = start().await;
    let client = client(&url)
        .await
        .with_wait_slice(Duration::from_millis(40));
    let sleeper = client
        .submit(Task::command(["sleep", "100"]))
        .await
        .unwrap();
    let done = client.submit(Task::command(["true"])).await.unwrap();

    let err = client
        .get(&sleeper, Some(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Timeout { id, .. } if id == sleeper.id()),
        "{err}"
    );
    assert!(err.is_retryable());
    assert_eq!(
        head.state().wait_streamed,
        1,
        "the get waited on the result stream"
    );

    // `wait` calls the head in slices.
    let calls = head.state().wait_calls;
    let (ready, not_ready) = client
        .wait([&sleeper], 1, Some(Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(ready.is_empty());
    assert_eq!(not_ready, [sleeper.id()]);
    assert!(
        head.state().wait_calls >= calls + 3,
        "a 200 ms wait in 40 ms slices"
    );

    let (ready, not_ready) = client
        .wait([&sleeper, &done], 1, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].id, done.id());
    assert_eq!(not_ready, [sleeper.id()]);

    // A wait without a timeout keeps asking until the task ends.
    let waiter = {
        let client = client.clone();
        let id = sleeper.id();
        tokio::spawn(async move { client.get(id, None).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = client.cancel([sleeper.id()]).await.unwrap();
    assert_eq!(after[0].state, TaskState::Cancelled);
    let status = waiter.await.unwrap().unwrap();
    assert_eq!(status.state, TaskState::Cancelled);
    let err = client.get_result(&sleeper, None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("task {} cancelled: cancelled by a user", sleeper.id())
    );

    let err = client
        .wait([done.id(), done.id()], 1, None)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err}");
}

#[tokio::test]
async fn listing_describing_and_logs() {
    let (_head, url) = start().await;
    let client = client(&url).await;
    let refs = client
        .submit_batch((0..5).map(|i| Task::command(["echo"]).name(format!("t{i}"))))
        .await
        .unwrap();
    assert_eq!(refs.len(), 5);
    client.submit(Task::command(["sleep"])).await.unwrap();

    let all = client.list_tasks(None, None).await.unwrap();
    assert_eq!(all.len(), 6, "pages of {PAGE} are followed to the end");
    assert_eq!(all[4].name, "t4");
    assert_eq!(client.list_tasks(None, Some(3)).await.unwrap().len(), 3);
    let running = client
        .list_tasks(Some(TaskState::Running), None)
        .await
        .unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, TaskId(6));

    let info = client.task_info(refs[2].id()).await.unwrap();
    assert_eq!(info.spec.name, "t2");
    assert_eq!(info.started_at_ms, Some(1_700_000_000_100));

    let out = client.logs(refs[0].id(), LogStream::Stdout).await.unwrap();
    assert_eq!(out, OUTPUT, "chunks of {LOG_CHUNK} bytes are joined");
    assert!(
        client
            .logs(&refs[0], LogStream::Stderr)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn head_errors_are_typed_and_verbatim() {
    let (_head, url) = start().await;
    let client = client(&url).await;
    let err = client
        .submit_batch([
            Task::command(["true"]),
            Task::command(["true"]).name("rejected"),
        ])
        .await
        .unwrap_err();
    match &err {
        ClientError::InvalidArgument(m) => {
            assert_eq!(m, "tasks[1].name: the fake head rejects this name");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_retryable());
    let err = client.task_info(TaskId(99)).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::NotFound(m) if m == "task 99 is unknown"),
        "{err:?}"
    );
    let err = client.get(TaskId(99), None).await.unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    // A builder mistake is caught before anything is sent.
    let err = client
        .submit(Task::command(["true"]).ttl(Duration::from_secs(1)))
        .await;
    assert!(matches!(err, Err(ClientError::Usage(_))), "{err:?}");
}

#[tokio::test]
async fn resources_carry_namespace_and_caller() {
    let (head, url) = start().await;
    let client = client(&url)
        .await
        .with_namespace(Namespace::new("app").unwrap());
    let nodes = client
        .set_resource("queue", 4, NodeSpec::Node(NodeId(1)))
        .await
        .unwrap();
    assert_eq!(nodes, [NodeId(1), NodeId(2)]);
    let err = client
        .delete_resource("queue", NodeSpec::Local)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("ESCHER_TASK_ID is not set"),
        "{err}"
    );

    let in_task = client.clone().with_caller_task(TaskId(7));
    in_task
        .adjust_resource("queue", -1, NodeSpec::Local)
        .await
        .unwrap();
    let outcomes = in_task
        .set_resources(vec![
            ResourceUpdate::set("a", "unbounded", NodeSpec::Local).unwrap(),
            ResourceUpdate::delete("b", NodeSpec::Node(NodeId(2))).unwrap(),
        ])
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 2);

    let requests = head.state().set_requests.clone();
    assert_eq!(requests.len(), 3, "the refused Local update was never sent");
    // The calling task travels as the task's credential (ESCHER_TASK_TOKEN), never as a field
    // the client could fill in.
    assert!(requests.iter().all(|r| r.caller_task.is_none()));
    assert!(
        requests
            .iter()
            .all(|r| r.namespace.as_ref().map(Namespace::as_str) == Some("app"))
    );

    let status = client.cluster_status().await.unwrap();
    let cpu = status.nodes[0].resource("cpu").unwrap();
    assert_eq!(cpu.shortfall().to_string(), "1");
}

#[tokio::test]
async fn concurrent_resource_updates_share_calls() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let client = client.clone();
        set.spawn(async move {
            let name = format!("r{i}");
            match i % 3 {
                0 => {
                    client
                        .set_resource(name.as_str(), 1, NodeSpec::Node(NodeId(1)))
                        .await
                }
                1 => {
                    client
                        .adjust_resource(name.as_str(), 2, NodeSpec::Node(NodeId(2)))
                        .await
                }
                _ => {
                    client
                        .delete_resource(name.as_str(), NodeSpec::Node(NodeId(1)))
                        .await
                }
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        assert_eq!(joined.unwrap().unwrap(), [NodeId(1), NodeId(2)]);
    }
    let requests = head.state().set_requests.clone();
    let updates: Vec<String> = requests
        .iter()
        .flat_map(|r| r.updates.iter().map(|u| u.name.to_string()))
        .collect();
    assert_eq!(updates.len(), 200, "each update applied once");
    let distinct: std::collections::BTreeSet<&String> = updates.iter().collect();
    assert_eq!(distinct.len(), 200);
    assert!(
        requests.len() < 20,
        "{} calls for 200 updates",
        requests.len()
    );

    // One at a time, each update is a call of its own, answered before the next is queued.
    for i in 0..3 {
        let name = format!("seq{i}");
        client
            .set_resource(name.as_str(), 1, NodeSpec::Node(NodeId(1)))
            .await
            .unwrap();
    }
    let requests = head.state().set_requests.clone();
    let last: Vec<usize> = requests
        .iter()
        .rev()
        .take(3)
        .map(|r| r.updates.len())
        .collect();
    assert_eq!(last, [1, 1, 1]);
}

#[tokio::test]
async fn a_refused_update_fails_only_its_own_caller() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50u64 {
        let client = client.clone();
        // Update 17 names a node the head does not have; the head refuses any call carrying it.
        let node = if i == 17 { 99 } else { 1 + i % 2 };
        set.spawn(async move {
            let name = format!("r{i}");
            let outcome = client
                .set_resource(name.as_str(), 1, NodeSpec::Node(NodeId(node)))
                .await;
            (i, outcome)
        });
    }
    while let Some(joined) = set.join_next().await {
        let (i, outcome) = joined.unwrap();
        if i == 17 {
            let err = outcome.unwrap_err();
            assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
            assert!(err.to_string().contains("node 99"), "{err}");
        } else {
            assert_eq!(outcome.unwrap(), [NodeId(1), NodeId(2)], "update {i}");
        }
    }
    let applied: Vec<String> = head
        .state()
        .set_requests
        .iter()
        .flat_map(|r| r.updates.iter().map(|u| u.name.to_string()))
        .collect();
    assert_eq!(
        applied.len(),
        49,
        "every other update applied once: {applied:?}"
    );
    assert!(!applied.contains(&"r17".to_string()));
}

/// Runs `escher --head URL ARGS...`; returns the exit status and what it printed.
async fn cli(url: &str, args: &[&str]) -> anyhow::Result<(ExitCode, String)> {
    let argv = ["escher", "--head", url]
        .into_iter()
        .chain(args.iter().copied());
    let mut out = Vec::new();
    let code = escher_cli::run_with(Cli::try_parse_from(argv)?, &mut out).await?;
    Ok((code, String::from_utf8(out)?))
}

#[tokio::test]
async fn tokens_are_created_listed_and_revoked_with_the_given_token() {
    let (head, url) = start().await;
    let (code, out) = cli(
        &url,
        &[
            "--token",
            "escher-admin-given",
            "token",
            "create",
            "--role",
            "app",
            "--namespace",
            "team-a",
            "--description",
            "ci",
        ],
    )
    .await
    .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.starts_with("escher-app-fake1\n"), "{out}");
    assert!(out.contains("app (namespace team-a)"), "{out}");
    let (_, out) = cli(&url, &["--token", "escher-admin-given", "token", "list"])
        .await
        .unwrap();
    assert!(out.contains("000000000001  app   team-a"), "{out}");
    let (_, out) = cli(
        &url,
        &[
            "--token",
            "escher-admin-given",
            "token",
            "revoke",
            "000000000001",
        ],
    )
    .await
    .unwrap();
    assert_eq!(out, "revoked token 000000000001\n");
    let (_, out) = cli(&url, &["--token", "escher-admin-given", "drain", "4"])
        .await
        .unwrap();
    assert!(out.starts_with("node 4 is draining"), "{out}");
    // An app token needs a namespace; other roles take none from the flag.
    let err = cli(&url, &["--token", "t", "token", "create", "--role", "app"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bound to a namespace"), "{err}");
    let (code, _) = cli(
        &url,
        &[
            "--token",
            "t",
            "--namespace",
            "x",
            "token",
            "create",
            "--role",
            "reader",
        ],
    )
    .await
    .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    let st = head.state();
    assert!(
        st.auth[..4]
            .iter()
            .all(|a| a.as_deref() == Some("Bearer escher-admin-given")),
        "{:?}",
        st.auth
    );
    assert_eq!(st.drained, [4]);
    assert_eq!(st.tokens[1].grant.namespace, None);
}

#[tokio::test]
async fn heads_are_shown_and_changed() {
    let (_head, url) = start().await;
    let (code, out) = cli(&url, &["heads"]).await.unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        out.contains("head group fake-group: 1 replica(s), replica 1 leads"),
        "{out}"
    );
    let (_, out) = cli(&url, &["heads", "add", "3=127.0.0.1:7603"])
        .await
        .unwrap();
    assert!(out.contains("3 replica(s)"), "{out}");
    let (_, out) = cli(&url, &["status"]).await.unwrap();
    assert!(out.contains("head group fake-group"), "{out}");
    assert!(cli(&url, &["heads", "add", "3=http://x:1"]).await.is_err());
}

#[tokio::test]
async fn the_cli_runs_against_a_head() {
    let (head, url) = start().await;
    let run = |args: &'static [&'static str]| {
        let url = url.clone();
        async move { cli(&url, args).await.unwrap() }
    };

    let (code, out) = run(&["status"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        out.starts_with("1 nodes (1 alive), 1 running, 0 pending"),
        "{out}"
    );
    assert!(out.contains("SHORTFALL: 1 over total"), "{out}");
    let (_, out) = run(&["--json", "status"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cluster"]["nodes"][0]["name"], "fake");

    let (code, out) = run(&["submit", "--count", "3", "--wait", "--", "echo", "hi"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.starts_with("1\n2\n3\n"), "{out}");
    assert_eq!(out.matches("succeeded").count(), 3, "{out}");
    let (code, out) = run(&["--json", "submit", "--wait", "false"]).await;
    assert_eq!(
        code,
        ExitCode::from(1),
        "a failed command passes on its exit code"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["task_ids"], serde_json::json!([4]));
    assert_eq!(v["statuses"][0]["state"], "Failed");

    let (code, out) = run(&["get", "1"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("exit code 0"), "{out}");
    assert_eq!(run(&["get", "4"]).await.0, ExitCode::from(1));
    let (_, out) = run(&["tasks", "--state", "failed"]).await;
    assert_eq!(out.lines().count(), 2, "{out}");
    let (_, out) = run(&["info", "2"]).await;
    assert!(
        out.contains("echo hi") && out.contains("2023-11-14T22:13:20.000Z"),
        "{out}"
    );
    let (_, out) = run(&["logs", "1"]).await;
    assert_eq!(out.as_bytes(), OUTPUT);
    let (_, out) = run(&["logs", "1", "--follow"]).await;
    assert_eq!(out.as_bytes(), OUTPUT);

    let (code, out) = run(&["wait", "1", "2", "--num", "1"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("succeeded"), "{out}");
    let (_, out) = run(&["submit", "sleep"]).await;
    assert_eq!(out, "5\n");
    let (code, out) = run(&["wait", "1", "5", "--timeout", "100ms"]).await;
    assert_eq!(
        code,
        ExitCode::FAILURE,
        "the sleeper did not finish in time"
    );
    assert!(out.contains("not finished: 5"), "{out}");
    let (_, out) = run(&["cancel", "5"]).await;
    assert!(out.contains("cancelled"), "{out}");

    let (code, out) = run(&[
        "resource",
        "set",
        "q",
        "2",
        "--match",
        "cpu=1",
        "--num-nodes",
        "1",
    ])
    .await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out, "changed nodes 1, 2\n");
    let (_, out) = run(&["--json", "resource", "delete", "q", "--node", "1"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!({"nodes": [1, 2]})
    );
    assert_eq!(head.state().set_requests.len(), 2);

    let err = cli(&url, &["get", "77"]).await.unwrap_err();
    assert_eq!(format!("{err:#}"), "task 77 is unknown");
}

#[tokio::test]
async fn the_cli_explains_an_absent_head() {
    let argv = ["escher", "--head", "http://127.0.0.1:1", "status"];
    let err = escher_cli::run(Cli::try_parse_from(argv).unwrap())
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("cannot connect to the escher head at http://127.0.0.1:1"),
        "{text}"
    );
    assert!(
        text.contains("is escher-head running? set --head or ESCHER_HEAD"),
        "{text}"
    );
}

#[test]
fn the_blocking_client_works_from_plain_threads() {
    let server = tokio::runtime::Runtime::new().unwrap();
    let (_head, url) = server.block_on(start());
    let client = BlockingClient::connect(&url).unwrap().without_caller_task();
    let t = client
        .submit(Task::function_typed("double", &5u32))
        .unwrap();
    let worker = {
        let client = client.clone();
        let id = t.id();
        std::thread::spawn(move || client.get_typed::<u32>(id, None))
    };
    assert_eq!(worker.join().unwrap().unwrap(), 10);
    assert_eq!(client.list_tasks(None, None).unwrap().len(), 1);
    assert_eq!(client.cluster_status().unwrap().nodes.len(), 1);
}

#[tokio::test]
async fn reservations_are_sent_waited_for_and_released() {
    let (head, url) = start().await;
    let client = client(&url)
        .await
        .with_namespace(Namespace::new("app").unwrap());
    let bundles = vec!["cpu=2".parse().unwrap(), "cpu=1".parse().unwrap()];
    let gang = client
        .reserve(
            "train",
            bundles,
            escher_proto::types::GangStrategy::StrictSpread,
            Some(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert_eq!(gang.tasks(), [TaskId(1), TaskId(2)]);
    assert!(gang.placed());
    assert_eq!(
        head.state().submit_namespaces,
        [Some(Namespace::new("app").unwrap())]
    );
    {
        let st = head.state();
        let (spec, _) = &st.tasks[&2];
        assert_eq!(spec.resources.to_string(), "cpu=1");
        assert_eq!(spec.pending_deadline, Some(Duration::from_secs(3)));
    }
    gang.ready(&client, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    let after = gang.release(&client).await.unwrap();
    assert!(after.iter().all(|s| s.state == TaskState::Cancelled));
    // A released reservation is never ready again: the error says which holder ended.
    let err = gang.ready(&client, None).await.unwrap_err();
    assert!(
        matches!(err, ClientError::TaskFailed { id: TaskId(1), .. }),
        "{err:?}"
    );

    let (code, out) = cli(
        &url,
        &["reserve", "g", "-b", "cpu=1", "-b", "cpu=1", "--wait"],
    )
    .await
    .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("placed:") && out.contains("yes"), "{out}");
    assert!(out.contains("g.cpu g-0.cpu g-1.cpu"), "{out}");
    assert!(out.contains("escher cancel 3 4"), "{out}");
    let (_, out) = cli(&url, &["--json", "reserve", "h", "-b", "x=1"])
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["task_ids"], serde_json::json!([5]));
    assert_eq!(v["resources"], serde_json::json!(["h.x", "h-0.x"]));
    let err = cli(&url, &["reserve", "g", "-b", "cpu=1", "--strategy", "pack"])
        .await
        .map(|_| ())
        .err();
    assert!(err.is_none(), "{err:?}");
}

#[test]
fn the_blocking_client_reserves() {
    let server = tokio::runtime::Runtime::new().unwrap();
    let (_head, url) = server.block_on(start());
    let client = BlockingClient::connect(&url).unwrap();
    let gang = client
        .reserve(
            "g",
            vec!["cpu=1".parse().unwrap()],
            escher_proto::types::GangStrategy::Pack,
            None,
        )
        .unwrap();
    client.reservation_ready(&gang, None).unwrap();
    let after = client.release_reservation(&gang).unwrap();
    assert_eq!(after[0].state, TaskState::Cancelled);
}

#[tokio::test]
async fn gpus_and_mig_layouts_through_the_cli() {
    let (_head, url) = start().await;
    let (code, out) = cli(&url, &["gpus"]).await.unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.starts_with("node 1 (fake)\n"), "{out}");
    assert!(
        out.contains("a100-40gb (simulated)") && out.contains("7g.40gb"),
        "{out}"
    );
    let (code, out) = cli(
        &url,
        &[
            "mig",
            "apply",
            "1",
            "0",
            "4g.20gb,3g.20gb",
            "--wait",
            "--timeout",
            "5",
        ],
    )
    .await
    .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("create:     4g.20gb@0 3g.20gb@4"), "{out}");
    assert!(
        out.contains("done: GPU 0 is now 4g.20gb@0,3g.20gb@4"),
        "{out}"
    );
    // What the last one took, phase by phase, in `escher gpus`.
    let (_, out) = cli(&url, &["gpus"]).await.unwrap();
    assert!(
        out.contains(
            "GPU 0: last reconfiguration (to 4g.20gb@0,3g.20gb@4): 11.5 s from the request (0.0 \
             s waiting for slices); destroy 1 in 0.5 s, create 2 in 3.0 s, library load 3.0 s, \
             model load 5.0 s"
        ),
        "{out}"
    );
    // One instance at a time.
    let (code, out) = cli(&url, &["mig", "destroy", "1", "0", "3g.20gb@4", "--wait"])
        .await
        .unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(out.contains("destroy:    3g.20gb@4"), "{out}");
    assert!(out.contains("done: GPU 0 is now 4g.20gb@0"), "{out}");
    assert!(out.contains("took: 0.5 s from the request"), "{out}");
    let (_, out) = cli(&url, &["mig", "create", "1", "0", "2g.10gb"])
        .await
        .unwrap();
    assert!(out.contains("create:     2g.10gb@4"), "{out}");
    let err = cli(&url, &["mig", "create", "1", "0", "1g.5gb@0"])
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<ClientError>()
            .and_then(ClientError::mig_refusal),
        Some(MigRefusal::Overlap),
        "{err}"
    );
    assert!(err.to_string().contains("overlaps 4g.20gb@0"), "{err}");
    let err = cli(&url, &["mig", "destroy", "1", "0", "1g.5gb@6"])
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<ClientError>()
            .and_then(ClientError::mig_refusal),
        Some(MigRefusal::NoSuchInstance),
        "{err}"
    );
    let (_, out) = cli(&url, &["mig", "prepare", "1", "0", "7g.40gb"])
        .await
        .unwrap();
    assert!(out.contains("to:         7g.40gb@0"), "{out}");
    let err = cli(&url, &["mig", "apply", "1", "0", "busy"])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot be reconfigured now"),
        "{err}"
    );
    assert_eq!(
        err.downcast_ref::<ClientError>()
            .and_then(ClientError::mig_refusal),
        Some(MigRefusal::Busy),
        "{err}"
    );
    let err = cli(&url, &["mig", "apply", "1", "0", "2g.20gb"])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no MIG profile \"2g.20gb\""),
        "{err}"
    );
    let err = cli(&url, &["mig", "apply", "2", "0", "7g.40gb"])
        .await
        .unwrap_err();
    assert!(matches!(
        err.downcast_ref::<ClientError>(),
        Some(ClientError::NotFound(_))
    ));
    let (_, out) = cli(&url, &["--json", "gpus"]).await.unwrap();
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json[0]["gpus"][0]["info"]["uuid"], "GPU-fake");
    // The blocking client sees the same.
    let url2 = url.clone();
    let nodes = tokio::task::spawn_blocking(move || {
        BlockingClient::connect(&url2).unwrap().gpus().unwrap()
    })
    .await
    .unwrap();
    // The prepared 7g.40gb, with what it took.
    assert_eq!(nodes[0].gpus[0].info.slices.len(), 1);
    let report = nodes[0].gpus[0].last_reconfiguration.as_ref().unwrap();
    assert_eq!((report.phases.destroyed, report.phases.created), (1, 1));
}

#[tokio::test]
async fn submits_and_batches_share_one_stream() {
    let (head, url) = start().await;
    let client = client(&url).await;
    for _ in 0..3 {
        client.submit(Task::command(["true"])).await.unwrap();
    }
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let client = client.clone();
        set.spawn(async move {
            if i % 50 == 0 {
                let batch = [Task::command(["true"]), Task::command(["true"])];
                let refs = client.submit_batch(batch).await.unwrap();
                refs.iter().map(|r| r.id()).collect()
            } else {
                vec![client.submit(Task::command(["true"])).await.unwrap().id()]
            }
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(joined) = set.join_next().await {
        for id in joined.unwrap() {
            assert!(ids.insert(id), "ids are unique");
        }
    }
    assert_eq!(ids.len(), 204);
    let st = head.state();
    assert_eq!(st.tasks.len(), 3 + 204, "nothing applied twice");
    assert_eq!(st.streams_opened, 1, "one stream for the client");
    assert_eq!(st.streamed, st.submit_keys.len(), "no unary call");
}

#[tokio::test]
async fn a_broken_stream_submits_nothing_twice() {
    let (head, url) = start().await;
    let client = client(&url).await;
    client.submit(Task::command(["true"])).await.unwrap();
    // The head applies the next request and the stream breaks before its answer: the client
    // sends it again as a unary call under the same key and gets the recorded ids.
    head.state().break_stream = true;
    let task = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(task.id(), TaskId(2));
    let again = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(again.id(), TaskId(3));
    let st = head.state();
    assert_eq!(st.tasks.len(), 3, "nothing applied twice");
    assert_eq!(
        st.submit_keys[1], st.submit_keys[2],
        "the retry carried the key"
    );
    assert_eq!(st.streams_opened, 2, "a new stream after the broken one");
    assert_eq!(st.streamed, 3);
}

#[tokio::test]
async fn a_streamed_submit_survives_a_lost_leadership() {
    let (head, url) = start().await;
    let client = client(&url).await;
    client.submit(Task::command(["true"])).await.unwrap();
    head.state().lose_next_reply = true;
    let batch = client
        .submit_batch([Task::command(["true"]), Task::command(["true"])])
        .await
        .unwrap();
    assert_eq!(batch[1].id(), TaskId(3));
    client.submit(Task::command(["true"])).await.unwrap();
    let st = head.state();
    assert_eq!(st.tasks.len(), 4, "nothing applied twice");
    assert_eq!(
        st.submit_keys[1], st.submit_keys[2],
        "the retry carried the key"
    );
    assert_eq!(
        st.streams_opened, 2,
        "the stream to a replica that lost the lead is dropped"
    );
}

#[tokio::test]
async fn refusals_on_the_stream_are_the_calls_refusals() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let rejected = || Task::command(["x"]).name("rejected");
    let err = client.submit(rejected()).await.unwrap_err();
    assert!(
        matches!(err, ClientError::InvalidArgument(ref m) if m.contains("tasks[0].name")),
        "{err}"
    );
    let err = client
        .submit_batch([Task::command(["true"]), rejected()])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(ref m) if m.contains("tasks[1].name")));
    let st = head.state();
    assert_eq!((st.streams_opened, st.streamed), (1, 2));
    assert!(st.tasks.is_empty());
}

#[tokio::test]
async fn a_head_without_the_stream_gets_calls() {
    let (head, url) = start().await;
    head.state().no_stream = true;
    let client = client(&url).await;
    for i in 1..=3 {
        let task = client.submit(Task::command(["true"])).await.unwrap();
        assert_eq!(task.id(), TaskId(i));
    }
    let st = head.state();
    assert_eq!(
        st.streams_opened, 1,
        "asked once: it does not serve the call"
    );
    assert_eq!((st.streamed, st.submit_keys.len()), (0, 3));
}

#[tokio::test]
async fn gets_share_one_result_stream() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let tasks = client
        .submit_batch((0..100).map(|_| Task::command(["true"])))
        .await
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    // Every task twice: the second `get` of a task shares the first one's wait.
    for task in tasks.iter().chain(&tasks) {
        let (client, id) = (client.clone(), task.id());
        set.spawn(async move { (id, client.get(id, Some(Duration::from_secs(20))).await) });
    }
    while let Some(joined) = set.join_next().await {
        let (id, status) = joined.unwrap();
        let status = status.unwrap();
        assert_eq!((status.id, status.state), (id, TaskState::Succeeded));
    }
    let st = head.state();
    assert_eq!(
        st.wait_streams_opened, 1,
        "one result stream for the client"
    );
    assert!(
        st.wait_streamed >= 100 && st.wait_streamed < 200,
        "{}",
        st.wait_streamed
    );
    assert_eq!(st.wait_calls, 0, "no Wait call");
}

#[tokio::test]
async fn an_unknown_task_fails_only_its_own_get() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let tasks = client
        .submit_batch((0..20).map(|_| Task::command(["true"])))
        .await
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    let unknown = TaskId(999_999);
    for id in tasks.iter().map(|t| t.id()).chain([unknown]) {
        let client = client.clone();
        set.spawn(async move { (id, client.get(id, Some(Duration::from_secs(20))).await) });
    }
    while let Some(joined) = set.join_next().await {
        match joined.unwrap() {
            (id, Err(err)) if id == unknown => {
                assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
            }
            (id, outcome) => assert_eq!(outcome.unwrap().state, TaskState::Succeeded, "{id}"),
        }
    }
    // Alone, the unknown task is refused on the stream itself.
    let calls = head.state().wait_calls;
    let err = client.get(unknown, None).await.unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    assert_eq!(head.state().wait_calls, calls);
}

#[tokio::test]
async fn a_broken_or_unled_result_stream_leaves_gets_to_wait_calls() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let done = client.submit(Task::command(["true"])).await.unwrap();
    let sleeper = client
        .submit(Task::command(["sleep", "100"]))
        .await
        .unwrap();
    client.get(&done, None).await.unwrap();

    // A `get` in progress when the stream breaks goes on with Wait calls, and the next `get`
    // opens a new stream.
    let waiting = {
        let client = client.clone();
        let id = sleeper.id();
        tokio::spawn(async move { client.get(id, None).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    head.state().break_wait_stream = true;
    assert_eq!(
        client.get(&done, None).await.unwrap().state,
        TaskState::Succeeded
    );
    let calls = head.state().wait_calls;
    assert!(
        calls >= 1,
        "the broken stream's gets were asked with Wait calls"
    );
    client.cancel([sleeper.id()]).await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().state, TaskState::Cancelled);

    client.get(&done, None).await.unwrap();
    assert_eq!(head.state().wait_streams_opened, 2);

    // A replica that stops leading: the same, and the stream is dropped.
    head.state().wait_stream_not_leader = true;
    assert_eq!(
        client.get(&done, None).await.unwrap().state,
        TaskState::Succeeded
    );
    assert!(head.state().wait_calls > calls);
    client.get(&done, None).await.unwrap();
    assert_eq!(head.state().wait_streams_opened, 3);
}

#[tokio::test]
async fn a_head_without_the_result_stream_gets_wait_calls() {
    let (head, url) = start().await;
    head.state().no_stream = true;
    let client = client(&url).await;
    let task = client.submit(Task::command(["true"])).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            client.get(&task, None).await.unwrap().state,
            TaskState::Succeeded
        );
    }
    let st = head.state();
    assert_eq!(
        st.wait_streams_opened, 1,
        "asked once: it does not serve the call"
    );
    assert_eq!(st.wait_calls, 3);
}

#[tokio::test]
async fn a_get_that_times_out_still_sees_a_task_that_finished() {
    let (head, url) = start().await;
    let client = client(&url).await;
    let done = client.submit(Task::command(["true"])).await.unwrap();
    // No time to hear from the stream: one last Wait call answers.
    let status = client.get(&done, Some(Duration::ZERO)).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
    assert!(head.state().wait_calls >= 1);
}

/// Issue 46: `escher heads add|remove` ended with a plain error when it gave up after an attempt
/// that may have been applied (other writes end with an unknown outcome, `call_write`). Now it
/// ends as they do, and says how to check, since a membership change carries no key.
#[tokio::test]
async fn a_membership_change_that_may_have_been_applied_ends_with_an_unknown_outcome() {
    let (a, b) = followers_naming_each_other_after(true).await;
    let adds = client(&format!("{a},{b}"))
        .await
        .with_failover_timeout(Duration::from_millis(300));
    let err = adds.add_head(4, "127.0.0.1:1").await.unwrap_err();
    let text = err.to_string();
    let ClientError::UnknownOutcome { call, cause, .. } = &err else {
        panic!("not an unknown outcome: {text}")
    };
    assert_eq!(*call, "heads add");
    assert!(
        cause.starts_with(&format!("the request went out to {a} 0.0s in")),
        "{cause}"
    );
    assert!(text.contains("escher heads lists the members"), "{text}");
    // A change that never went out is not in doubt: the plain failure.
    let (a, b) = followers_naming_each_other().await;
    let removes = client(&format!("{a},{b}"))
        .await
        .with_failover_timeout(Duration::from_millis(300));
    let err = removes.remove_head(2).await.unwrap_err();
    assert!(matches!(err, ClientError::Unavailable { .. }), "{err}");
}
