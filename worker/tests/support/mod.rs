//! Test support: a FAKE head and helpers to run a real worker against it on loopback.
//!
//! [`FakeHead`] serves the `WorkerLink` service (and the `SetResources` call of `Cluster`) on
//! `127.0.0.1:0`. It records every registration and every message a worker sends, lets the
//! test push `HeadMessage`s down the current stream, drop that stream, refuse registrations,
//! and forget the identities it issued (a head group that started over). It answers
//! `LocateObject` from the objects the test tells it of, counting the calls, and records the
//! copies workers report with `ObjectsSealed`. It implements no scheduling and no
//! replication: the test plays the head's part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use escher_proto::convert::LinkEncoder;
use escher_proto::types::{
    HeadMessage, ObjectId, ObjectView, RegisterRequest, SetResourceOutcome, SetResourcesReply,
    SetResourcesRequest, WorkerMessage,
};
use escher_proto::wire::cluster_server::{Cluster, ClusterServer};
use escher_proto::wire::worker_link_server::{WorkerLink, WorkerLinkServer};
use escher_proto::{Labels, NodeId, ResourceSet, TaskKind, TaskSpec, wire};
use escher_worker::{Worker, WorkerBuilder, WorkerError, WorkerHandle};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

/// No test waits longer than this for anything.
pub const BOUND: Duration = Duration::from_secs(15);

/// Awaits `f`, failing the test if it takes longer than [`BOUND`].
pub async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(BOUND, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// What the fake head does, shared by its services and the test.
#[derive(Debug)]
struct State {
    heartbeat_ms: u64,
    /// The heartbeat timeout it tells registering workers (0: none, so no lease).
    heartbeat_timeout_ms: u64,
    next_node_id: u64,
    /// Whether a worker that presents an identity this head issued keeps it; otherwise it is
    /// answered NOT_FOUND, as by a head group that lost its state.
    keep_ids: bool,
    /// The cluster id this head issues identities for.
    cluster: String,
    /// The incarnation of its state it tells registering workers (`RegisterReply.incarnation`).
    incarnation: u64,
    /// Answer `Register` with UNAVAILABLE (a head that is restarting).
    unavailable: bool,
    /// Answer `Register` with INVALID_ARGUMENT (a head that refuses the worker).
    reject: bool,
    /// Numbers the attached streams, from 1.
    streams: u64,
    /// The current stream's sending half.
    to_worker: Option<mpsc::UnboundedSender<Result<wire::HeadBatch, Status>>>,
    /// The most messages one batch from a worker has carried.
    largest_batch: usize,
    /// The current stream's resource-name table, as a real head keeps it (the worker under
    /// test always asks for numbered names: [`attached`] checks).
    names: LinkEncoder,
    /// What `LocateObject` answers, by object; any other object is unknown.
    located: BTreeMap<ObjectId, ObjectView>,
    /// The objects `LocateObject` was asked about, in order.
    locate_calls: Vec<ObjectId>,
    /// The copies reported with `ObjectsSealed`: each object with its node.
    sealed: Vec<(ObjectId, NodeId)>,
    /// What the next `SetResources` calls answer, in order, before the calls are served.
    set_resources_failures: std::collections::VecDeque<Status>,
    /// Objects whose reported copies `ObjectsSealed` leaves out, with why (as a real head does
    /// for an object freed since it was located).
    left_out: BTreeMap<ObjectId, String>,
    /// While set, `ObjectsSealed` answers only once this is notified, or after
    /// [`COPY_REPORT_HOLD`] (so that a test stops by itself when it never is).
    copy_gate: Option<Arc<tokio::sync::Notify>>,
    /// The copy reports answered after [`COPY_REPORT_HOLD`] rather than by the gate.
    copy_reports_held_out: Vec<ObjectId>,
}

/// The longest [`FakeHead::hold_copy_reports`] holds a report (less than [`BOUND`]).
pub const COPY_REPORT_HOLD: Duration = Duration::from_secs(8);

#[derive(Clone)]
struct Services {
    state: Arc<Mutex<State>>,
    registrations: mpsc::UnboundedSender<RegisterRequest>,
    messages: mpsc::UnboundedSender<(u64, WorkerMessage)>,
    /// Each call, with its `authorization` metadata.
    set_resources: mpsc::UnboundedSender<(SetResourcesRequest, Option<String>)>,
}

/// A fake head; see the module documentation.
pub struct FakeHead {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    messages: mpsc::UnboundedReceiver<(u64, WorkerMessage)>,
    set_resources: mpsc::UnboundedReceiver<(SetResourcesRequest, Option<String>)>,
    server: JoinHandle<()>,
}

impl Drop for FakeHead {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeHead {
    /// A fake head on a fresh loopback port, asking for heartbeats every `heartbeat`.
    pub async fn start(heartbeat: Duration) -> FakeHead {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        FakeHead::serve(listener, heartbeat)
    }

    /// A fake head on `listener`.
    pub fn serve(listener: TcpListener, heartbeat: Duration) -> FakeHead {
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            heartbeat_ms: heartbeat.as_millis() as u64,
            heartbeat_timeout_ms: 0,
            next_node_id: 1,
            keep_ids: true,
            cluster: "fake-cluster".into(),
            incarnation: 0,
            unavailable: false,
            reject: false,
            streams: 0,
            to_worker: None,
            largest_batch: 0,
            names: LinkEncoder::new(true),
            located: BTreeMap::new(),
            locate_calls: Vec::new(),
            sealed: Vec::new(),
            left_out: BTreeMap::new(),
            copy_gate: None,
            copy_reports_held_out: Vec::new(),
            set_resources_failures: std::collections::VecDeque::new(),
        }));
        let (reg_tx, registrations) = mpsc::unbounded_channel();
        let (msg_tx, messages) = mpsc::unbounded_channel();
        let (set_tx, set_resources) = mpsc::unbounded_channel();
        let services = Services {
            state: Arc::clone(&state),
            registrations: reg_tx,
            messages: msg_tx,
            set_resources: set_tx,
        };
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(WorkerLinkServer::new(services.clone()))
                .add_service(ClusterServer::new(services))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
            if let Err(e) = result {
                eprintln!("fake head stopped: {e}");
            }
        });
        FakeHead {
            addr,
            state,
            registrations,
            messages,
            set_resources,
            server,
        }
    }

    /// The URL a worker should use.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake head state")
    }

    /// Whether a re-registering worker keeps its node id (the default) or is told its identity
    /// is unknown (and then registers as a new node).
    pub fn keep_ids(&self, keep: bool) {
        self.state().keep_ids = keep;
    }

    /// From the next registration on, tells workers the head declares a node lost after
    /// `timeout` without a heartbeat: they hold a lease of half that, which this fake head
    /// never renews.
    pub fn grant_lease(&self, timeout: Duration) {
        self.state().heartbeat_timeout_ms = timeout.as_millis() as u64;
    }

    /// Acts as a head whose state was restored from a backup: registrations from now on are
    /// answered with `incarnation`.
    pub fn restored(&self, incarnation: u64) {
        self.state().incarnation = incarnation;
    }

    /// Makes `Register` answer UNAVAILABLE (`true`) or work again (`false`).
    pub fn unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    /// Makes `Register` answer INVALID_ARGUMENT.
    pub fn reject(&self) {
        self.state().reject = true;
    }

    /// Ends the current stream from the head's side, as a head that lost the worker would.
    pub fn drop_stream(&self) {
        self.state().to_worker = None;
    }

    /// The most messages one batch from a worker has carried so far.
    pub fn largest_batch(&self) -> usize {
        self.state().largest_batch
    }

    /// Numbers the nodes that register from now on from `first` (so that the nodes of two
    /// fake heads differ).
    pub fn number_nodes_from(&self, first: u64) {
        self.state().next_node_id = first;
    }

    /// From now on `LocateObject` of `view.id` answers `view`.
    pub fn locates(&self, view: ObjectView) {
        self.state().located.insert(view.id, view);
    }

    /// The objects `LocateObject` has been asked about so far, in order.
    pub fn locate_calls(&self) -> Vec<ObjectId> {
        self.state().locate_calls.clone()
    }

    /// The copies reported with `ObjectsSealed` so far, each object with its node.
    pub fn sealed(&self) -> Vec<(ObjectId, NodeId)> {
        self.state().sealed.clone()
    }

    /// The next `SetResources` calls fail with `answers`, in order (each call is still
    /// recorded); the ones after are served.
    pub fn fail_set_resources(&self, answers: impl IntoIterator<Item = Status>) {
        self.state().set_resources_failures.extend(answers);
    }

    /// From now on `ObjectsSealed` answers only once `gate` is notified (one answer per
    /// notification), or after [`COPY_REPORT_HOLD`]: see [`FakeHead::copy_reports_held_out`].
    pub fn hold_copy_reports(&self, gate: Arc<tokio::sync::Notify>) {
        self.state().copy_gate = Some(gate);
    }

    /// The objects whose copy reports [`FakeHead::hold_copy_reports`] answered after its
    /// longest hold, the gate not notified by then.
    pub fn copy_reports_held_out(&self) -> Vec<ObjectId> {
        self.state().copy_reports_held_out.clone()
    }

    /// From now on `ObjectsSealed` leaves out the copies of object `id`, saying `why`.
    pub fn leave_out_copies(&self, id: ObjectId, why: &str) {
        self.state().left_out.insert(id, why.to_string());
    }

    /// Sends `msg` on the current stream, in a batch of its own.
    pub fn send(&self, msg: HeadMessage) {
        self.send_batch(vec![msg]);
    }

    /// Sends `msgs` on the current stream as one batch.
    pub fn send_batch(&self, msgs: Vec<HeadMessage>) {
        let messages = {
            let mut state = self.state();
            msgs.into_iter().map(|m| state.names.encode(m)).collect()
        };
        self.send_wire_batch(messages);
    }

    /// How many resource names the current stream has numbered.
    pub fn names_sent(&self) -> usize {
        self.state().names.len()
    }

    /// Sends a raw wire message on the current stream (to send what a domain value cannot hold).
    pub fn send_wire(&self, msg: wire::HeadMessage) {
        self.send_wire_batch(vec![msg]);
    }

    /// Sends raw wire messages on the current stream as one batch.
    pub fn send_wire_batch(&self, messages: Vec<wire::HeadMessage>) {
        let state = self.state();
        let tx = state.to_worker.as_ref().expect("no stream attached");
        tx.send(Ok(wire::HeadBatch { messages }))
            .expect("stream gone");
    }

    /// The next registration.
    pub async fn registration(&mut self) -> RegisterRequest {
        bounded("a registration", self.registrations.recv())
            .await
            .expect("fake head gone")
    }

    /// The next message from a worker, with the number of the stream it came on.
    pub async fn message(&mut self) -> (u64, WorkerMessage) {
        bounded("a worker message", self.messages.recv())
            .await
            .expect("fake head gone")
    }

    /// How many heartbeats arrive within `window` (other messages are dropped).
    pub async fn heartbeats_within(&mut self, window: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + window;
        let mut count = 0;
        while let Ok(Some((_, message))) =
            tokio::time::timeout_at(deadline, self.messages.recv()).await
        {
            if matches!(message, WorkerMessage::Heartbeat { .. }) {
                count += 1;
            }
        }
        count
    }

    /// The next message that is not a heartbeat.
    pub async fn report(&mut self) -> WorkerMessage {
        loop {
            match self.message().await {
                (_, WorkerMessage::Heartbeat { .. }) => continue,
                (_, msg) => return msg,
            }
        }
    }

    /// Whether a non-heartbeat message arrives within `within`.
    pub async fn quiet_for(&mut self, within: Duration) -> Option<WorkerMessage> {
        let wait = async {
            loop {
                match self.messages.recv().await {
                    Some((_, WorkerMessage::Heartbeat { .. })) => continue,
                    other => return other.map(|(_, m)| m),
                }
            }
        };
        tokio::time::timeout(within, wait).await.ok().flatten()
    }

    /// The next `SetResources` call.
    /// The next `SetResources` call and the token it carried.
    pub async fn set_resources_call(&mut self) -> (SetResourcesRequest, Option<String>) {
        bounded("a set_resources call", self.set_resources.recv())
            .await
            .expect("fake head gone")
    }
}

#[tonic::async_trait]
impl WorkerLink for Services {
    async fn register(
        &self,
        request: Request<wire::RegisterRequest>,
    ) -> Result<Response<wire::RegisterReply>, Status> {
        let req = RegisterRequest::try_from(request.into_inner())?;
        let reply = {
            let mut state = self.state.lock().expect("state");
            if state.reject {
                return Err(Status::invalid_argument("this fake head refuses workers"));
            }
            if state.unavailable {
                return Err(Status::unavailable("this fake head is restarting"));
            }
            let (node_id, secret) = match &req.identity {
                Some(id) if state.keep_ids && id.group == state.cluster => (id.node_id.0, None),
                Some(id) => {
                    let _ = self.registrations.send(req.clone());
                    return Err(Status::not_found(format!(
                        "node {} is not known to this fake head",
                        id.node_id
                    )));
                }
                None => {
                    state.next_node_id += 1;
                    let id = state.next_node_id - 1;
                    (id, Some(format!("secret-{id}")))
                }
            };
            wire::RegisterReply {
                node_id,
                heartbeat_interval_ms: state.heartbeat_ms,
                secret,
                group: state.cluster.clone(),
                heartbeat_timeout_ms: state.heartbeat_timeout_ms,
                incarnation: state.incarnation,
            }
        };
        let _ = self.registrations.send(req);
        Ok(Response::new(reply))
    }

    type AttachStream = UnboundedReceiverStream<Result<wire::HeadBatch, Status>>;

    async fn attach(
        &self,
        request: Request<Streaming<wire::WorkerBatch>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = {
            let mut state = self.state.lock().expect("state");
            state.streams += 1;
            state.to_worker = Some(tx);
            state.names = LinkEncoder::new(true);
            state.streams
        };
        let messages = self.messages.clone();
        let state = Arc::clone(&self.state);
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                {
                    let mut state = state.lock().expect("state");
                    state.largest_batch = state.largest_batch.max(batch.messages.len());
                }
                for msg in batch.messages {
                    match WorkerMessage::try_from(msg) {
                        Ok(msg) => {
                            let _ = messages.send((stream, msg));
                        }
                        Err(e) => eprintln!("fake head: invalid worker message: {e}"),
                    }
                }
            }
            // The worker ended its half: end ours too, as a real head does.
            let mut state = state.lock().expect("state");
            if state.streams == stream {
                state.to_worker = None;
            }
        });
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl Cluster for Services {
    async fn report_policy(
        &self,
        _: Request<wire::ReportPolicyRequest>,
    ) -> Result<Response<wire::ReportPolicyReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }

    async fn policies(
        &self,
        _: Request<wire::PoliciesRequest>,
    ) -> Result<Response<wire::PoliciesReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }

    type WatchStream = tokio_stream::Empty<Result<wire::WatchResponse, Status>>;
    type BackupStream = tokio_stream::Empty<Result<wire::BackupChunk, Status>>;
    async fn dashboard_ticket(
        &self,
        _: Request<wire::DashboardTicketRequest>,
    ) -> Result<Response<wire::DashboardTicketReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn backup(
        &self,
        _: Request<wire::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn resolve_actor(
        &self,
        _: Request<wire::ResolveActorRequest>,
    ) -> Result<Response<wire::ResolveActorReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn place_object(
        &self,
        _: Request<wire::PlaceObjectRequest>,
    ) -> Result<Response<wire::PlaceObjectReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn objects_sealed(
        &self,
        request: Request<wire::ObjectsSealedRequest>,
    ) -> Result<Response<wire::ObjectsSealedReply>, Status> {
        let copies = request.into_inner().copies;
        let gate = self.state.lock().expect("state").copy_gate.clone();
        let held_out = match gate {
            Some(gate) => tokio::time::timeout(COPY_REPORT_HOLD, gate.notified())
                .await
                .is_err(),
            None => false,
        };
        let mut state = self.state.lock().expect("state");
        if held_out {
            let ids = copies.iter().filter_map(|c| c.id.map(ObjectId::from));
            state.copy_reports_held_out.extend(ids);
        }
        let mut reply = wire::ObjectsSealedReply::default();
        for copy in copies {
            let Some(key) = copy.id else { continue };
            let id: ObjectId = key.into();
            match state.left_out.get(&id) {
                Some(why) => reply.dropped.push(wire::DroppedCopy {
                    id: Some(id.into()),
                    reason: why.clone(),
                }),
                None => state.sealed.push((id, NodeId(copy.node))),
            }
        }
        Ok(Response::new(reply))
    }
    async fn release_objects(
        &self,
        _: Request<wire::ReleaseObjectsRequest>,
    ) -> Result<Response<wire::ReleaseObjectsReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn locate_object(
        &self,
        request: Request<wire::LocateObjectRequest>,
    ) -> Result<Response<wire::ObjectInfo>, Status> {
        let id = request
            .into_inner()
            .id
            .map(ObjectId::from)
            .ok_or_else(|| Status::invalid_argument("no object id"))?;
        let mut state = self.state.lock().expect("state");
        state.locate_calls.push(id);
        match state.located.get(&id) {
            Some(view) => Ok(Response::new(view.clone().into())),
            None => Err(Status::not_found(format!(
                "object {id} is unknown to this fake head"
            ))),
        }
    }
    async fn list_objects(
        &self,
        _: Request<wire::ListObjectsRequest>,
    ) -> Result<Response<wire::ListObjectsReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn open_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::OpenObjectSessionReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn renew_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::RenewObjectSessionReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn close_object_session(
        &self,
        _: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::CloseObjectSessionReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    type SubmitStreamStream = tokio_stream::Empty<Result<wire::SubmitStreamReply, Status>>;
    async fn submit_stream(
        &self,
        _: Request<tonic::Streaming<wire::SubmitRequest>>,
    ) -> Result<Response<Self::SubmitStreamStream>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    type WaitStreamStream = tokio_stream::Empty<Result<wire::WaitStreamReply, Status>>;
    async fn wait_stream(
        &self,
        _: Request<tonic::Streaming<wire::WaitStreamRequest>>,
    ) -> Result<Response<Self::WaitStreamStream>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn watch(
        &self,
        _: Request<wire::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn report_telemetry(
        &self,
        _: Request<wire::ReportTelemetryRequest>,
    ) -> Result<Response<wire::ReportTelemetryReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn telemetry(
        &self,
        _: Request<wire::TelemetryRequest>,
    ) -> Result<Response<wire::TelemetryReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn submit(
        &self,
        _: Request<wire::SubmitRequest>,
    ) -> Result<Response<wire::SubmitReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn run(&self, _: Request<wire::RunRequest>) -> Result<Response<wire::RunReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn wait(
        &self,
        _: Request<wire::WaitRequest>,
    ) -> Result<Response<wire::WaitReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn cancel(
        &self,
        _: Request<wire::CancelRequest>,
    ) -> Result<Response<wire::CancelReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn requeue(
        &self,
        _: Request<wire::RequeueRequest>,
    ) -> Result<Response<wire::RequeueReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn describe_task(
        &self,
        _: Request<wire::DescribeTaskRequest>,
    ) -> Result<Response<wire::TaskInfo>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn list_tasks(
        &self,
        _: Request<wire::ListTasksRequest>,
    ) -> Result<Response<wire::ListTasksReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn set_resources(
        &self,
        request: Request<wire::SetResourcesRequest>,
    ) -> Result<Response<wire::SetResourcesReply>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let req = SetResourcesRequest::try_from(request.into_inner())?;
        let failure = self
            .state
            .lock()
            .expect("state")
            .set_resources_failures
            .pop_front();
        if let Some(status) = failure {
            let _ = self.set_resources.send((req, token));
            return Err(status);
        }
        let reply = SetResourcesReply {
            outcomes: req
                .updates
                .iter()
                .map(|_| SetResourceOutcome {
                    nodes: vec![NodeId(1)],
                })
                .collect(),
        };
        let _ = self.set_resources.send((req, token));
        Ok(Response::new(reply.into()))
    }
    async fn cluster_status(
        &self,
        _: Request<wire::ClusterStatusRequest>,
    ) -> Result<Response<wire::ClusterStatusReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn gpus(
        &self,
        _: Request<wire::GpusRequest>,
    ) -> Result<Response<wire::GpusReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn apply_mig_layout(
        &self,
        _: Request<wire::ApplyMigLayoutRequest>,
    ) -> Result<Response<wire::MigPlan>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn task_logs(
        &self,
        _: Request<wire::TaskLogsRequest>,
    ) -> Result<Response<wire::TaskLogsReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn reserve(
        &self,
        _: Request<wire::ReserveRequest>,
    ) -> Result<Response<wire::ReserveReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn heads(
        &self,
        _: Request<wire::HeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn change_heads(
        &self,
        _: Request<wire::ChangeHeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn create_token(
        &self,
        _: Request<wire::CreateTokenRequest>,
    ) -> Result<Response<wire::CreatedToken>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn list_tokens(
        &self,
        _: Request<wire::ListTokensRequest>,
    ) -> Result<Response<wire::ListTokensReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn revoke_token(
        &self,
        _: Request<wire::RevokeTokenRequest>,
    ) -> Result<Response<wire::TokenInfo>, Status> {
        Err(Status::unimplemented("fake head"))
    }
    async fn drain(
        &self,
        _: Request<wire::DrainRequest>,
    ) -> Result<Response<wire::DrainReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }

    async fn label_node(
        &self,
        _: Request<wire::LabelNodeRequest>,
    ) -> Result<Response<wire::LabelNodeReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }

    async fn record_decision(
        &self,
        _: Request<wire::RecordDecisionRequest>,
    ) -> Result<Response<wire::RecordDecisionReply>, Status> {
        Err(Status::unimplemented("fake head"))
    }
}

/// A worker running in the background until [`RunningWorker::stop`].
pub struct RunningWorker {
    pub handle: WorkerHandle,
    pub log_dir: std::path::PathBuf,
    stop: CancellationToken,
    task: JoinHandle<Result<(), WorkerError>>,
}

impl RunningWorker {
    /// Builds and starts `builder`'s worker.
    pub fn start(builder: WorkerBuilder) -> RunningWorker {
        let worker: Worker = builder.build().expect("worker builds");
        let handle = worker.handle();
        let log_dir = worker.log_dir().to_path_buf();
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone().cancelled_owned()));
        RunningWorker {
            handle,
            log_dir,
            stop,
            task,
        }
    }

    /// Asks the worker to shut down and waits for `run` to return.
    pub async fn stop(self) -> Result<(), WorkerError> {
        self.stop.cancel();
        self.join().await
    }

    /// Waits for `run` to return by itself.
    pub async fn join(self) -> Result<(), WorkerError> {
        bounded("the worker to stop", self.task)
            .await
            .expect("worker task panicked")
    }
}

/// A worker builder aimed at `head` with short timings for tests.
pub fn worker(head: &FakeHead) -> WorkerBuilder {
    Worker::builder()
        .head(head.url())
        .name("test-worker")
        .grace(Duration::from_millis(500))
        .drain(Duration::ZERO)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
}

/// A task spec of `kind` with nothing else set.
pub fn spec(kind: TaskKind) -> TaskSpec {
    TaskSpec {
        name: "test".into(),
        kind,
        resources: ResourceSet::new(),
        labels: Labels::new(),
        max_retries: 0,
        timeout: None,
        pending_deadline: None,
        on_start: Vec::new(),
        on_success: Vec::new(),
    }
}

/// A command task running `sh -c script`.
pub fn sh(script: &str) -> TaskSpec {
    spec(TaskKind::Command {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: Vec::new(),
        cwd: None,
    })
}

/// Waits for the worker's registration and its `Hello`, and returns the node id. Heartbeats
/// still queued from an earlier stream are skipped; anything else before `Hello` fails.
pub async fn attached(head: &mut FakeHead) -> (RegisterRequest, NodeId) {
    let reg = head.registration().await;
    match head.report().await {
        WorkerMessage::Hello {
            node_id,
            interned_names,
            ..
        } => {
            assert!(interned_names, "a worker reads numbered resource names");
            (reg, node_id)
        }
        other => panic!("expected Hello first, got {other:?}"),
    }
}
