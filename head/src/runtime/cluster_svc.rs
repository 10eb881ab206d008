//! The `Cluster` gRPC service: unpack, convert, delegate to the owner, map errors.
//!
//! Writes carry their idempotency key (`key`) through to the log entry. Reads are
//! linearizable unless the request metadata says `escher-read: stale`. `Heads` is answered by
//! any replica (it is how an operator looks at a group that has no leader); `ChangeHeads`
//! only by the leader.

use std::time::Duration;

use escher_proto::types::{HeadChange, HeadsReply, Labels, RequestKey, is_reserved_label};

use escher_proto::types::{
    ApplyMigLayoutRequest, CancelReply, CancelRequest, ListTasksRequest, ReserveReply,
    ReserveRequest, SetResourceOutcome, SetResourcesReply, SetResourcesRequest, SubmitReply,
    SubmitRequest, TaskId, TaskLogsRequest, WaitRequest, WatchRequest,
};
use escher_proto::wire::{self, cluster_server::Cluster};
use futures_util::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use std::sync::Arc;

use escher_proto::types::{
    CreateTokenRequest, CreatedToken, NAMESPACE_LABEL, Namespace, NodeId, ResourceName,
    SHARED_NAMESPACE, TokenInfo,
};

use super::handle::{OwnerHandle, to_status, wants_stale};
use super::owner::{HeadsView, Msg};
use super::waiters::snapshot;
use super::watch::Filter;
use crate::auth::{Caller, KeyScope, Keys, check_attempt};
use crate::replication::{PeerAccess, group_status};
use crate::state::{ActorSelector, ApplyError, ClusterState, TokenHash};
use crate::state::{Command, Reply};

/// The longest a single `Wait` call blocks; clients wanting longer call again.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// How many requests of one submission stream the head works on at once.
const STREAM_IN_FLIGHT: usize = 8;
/// The most tasks one `ListTasks` call returns.
const MAX_LIST: u32 = 10_000;

/// The idempotency key of a write request, checked.
/// A request's idempotency key, its client scoped to the caller's credential (see
/// [`KeyScope`]).
fn key(scope: KeyScope, raw: Option<wire::RequestKey>) -> Result<Option<RequestKey>, Status> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let mut key = RequestKey::try_from(raw)?;
    key.client = scope.client(key.client);
    Ok(Some(key))
}

/// Serves applications, the CLI, ESLs and running tasks.
#[derive(Debug, Clone)]
pub(crate) struct ClusterService {
    pub(crate) owner: OwnerHandle,
    pub(crate) log_fetch_timeout: Duration,
    pub(crate) keys: Arc<Keys>,
    /// How this replica reaches the others (`Heads` asks them how they are).
    pub(crate) peers: PeerAccess,
    /// The telemetry running tasks reported to this replica.
    pub(crate) telemetry: Arc<super::telemetry::TelemetryStore>,
    /// What workers said about their fences, shown with their nodes.
    pub(crate) fences: Arc<super::fences::FenceReports>,
    /// How many calls wait at each actor, as its worker last said.
    pub(crate) actor_calls: Arc<super::actor_calls::ActorCalls>,
    /// The dashboard's login tickets, where this replica serves one.
    pub(crate) dashboard: Option<Arc<super::dashboard::Logins>>,
    /// The policies' latest reports.
    pub(crate) policies: Arc<super::policies::PolicyReports>,
}

/// Whether `caller` may see task `id`: a task of another namespace is "unknown" to it (no
/// existence oracle); so is an evicted one, whose tombstone keeps no namespace, except to an
/// admin, who learns it was evicted.
fn visible(s: &ClusterState, caller: &Caller, id: TaskId) -> Result<(), ApplyError> {
    match s.task(id) {
        Some(rec) if caller.sees(rec.spec.labels.get(NAMESPACE_LABEL)) => Ok(()),
        Some(_) => Err(ApplyError::UnknownTask(id)),
        None if caller.sees_everything() => s.check_known(id),
        None => Err(ApplyError::UnknownTask(id)),
    }
}

/// Refuses `ids` the caller may not see (one stale read: namespaces never change).
pub(crate) async fn check_visible(
    owner: &OwnerHandle,
    caller: &Caller,
    ids: &[TaskId],
) -> Result<(), Status> {
    if caller.sees_everything() {
        return Ok(());
    }
    check_known_and_visible(owner, caller, ids).await
}

/// Like [`check_visible`], and for an admin too: a task that never existed is unknown to
/// everyone (for the calls that would otherwise answer it with nothing, as telemetry does).
pub(crate) async fn check_known_and_visible(
    owner: &OwnerHandle,
    caller: &Caller,
    ids: &[TaskId],
) -> Result<(), Status> {
    let caller = caller.clone();
    let ids = ids.to_vec();
    owner
        .read(true, move |s| {
            ids.iter().try_for_each(|id| visible(s, &caller, *id))
        })
        .await?
        .map_err(to_status)
}

/// Refuses resource names the caller may not create, resize or delete.
fn check_names<'a>(
    caller: &Caller,
    names: impl IntoIterator<Item = &'a ResourceName>,
) -> Result<(), Status> {
    for name in names {
        if !caller.may_change(name) {
            return Err(Status::permission_denied(format!(
                "{} cannot change {name}: it belongs to another namespace",
                caller.describe()
            )));
        }
    }
    Ok(())
}

fn unexpected(reply: Reply) -> Status {
    Status::internal(format!(
        "unexpected reply from the state machine: {reply:?}"
    ))
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    #[tracing::instrument(skip_all, fields(tasks))]
    async fn submit(
        &self,
        request: Request<wire::SubmitRequest>,
    ) -> Result<Response<wire::SubmitReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let task_ids = self
            .submit_as(&caller, scope, request.into_inner(), false)
            .await?;
        Ok(Response::new(SubmitReply { task_ids }.into()))
    }

    type SubmitStreamStream = tonic::codegen::BoxStream<wire::SubmitStreamReply>;

    /// Each request is submitted as `Submit` would submit it, up to [`STREAM_IN_FLIGHT`] at
    /// once (their commands reach the owner in arrival order, so one turn can apply several),
    /// and answered in order. The answers are produced by the response stream itself, in the
    /// task that sends them: no task of its own, no channel between. A broken request stream
    /// ends the answers; what it had already submitted is applied and its answers are lost
    /// with the stream, which the client's idempotency keys make safe to send again.
    async fn submit_stream(
        &self,
        request: Request<Streaming<wire::SubmitRequest>>,
    ) -> Result<Response<Self::SubmitStreamStream>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let service = self.clone();
        let replies = request
            .into_inner()
            .take_while(|next| std::future::ready(next.is_ok()))
            .filter_map(|next| std::future::ready(next.ok()))
            .map(move |request| {
                let (service, caller) = (service.clone(), caller.clone());
                async move { Ok(service.submit_streamed(&caller, scope, request).await) }
            })
            .buffered(STREAM_IN_FLIGHT);
        Ok(Response::new(Box::pin(replies)))
    }

    type WaitStreamStream = tonic::codegen::BoxStream<wire::WaitStreamReply>;

    /// Waits for every task the stream's requests name, each as `Wait` would, and pushes each
    /// final status when it comes (see `wait_stream.rs`).
    async fn wait_stream(
        &self,
        request: Request<Streaming<wire::WaitStreamRequest>>,
    ) -> Result<Response<Self::WaitStreamStream>, Status> {
        let caller = crate::auth::caller(&request)?;
        let replies = self.wait_stream_for(caller, request.into_inner());
        Ok(Response::new(Box::pin(ReceiverStream::new(replies))))
    }

    async fn run(
        &self,
        request: Request<wire::RunRequest>,
    ) -> Result<Response<wire::RunReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let submit = request
            .submit
            .ok_or_else(|| Status::invalid_argument("Run needs `submit`, with one task"))?;
        let task = match self.submit_as(&caller, scope, submit, true).await?[..] {
            [task] => task,
            _ => return Err(Status::internal("one task submitted, not one id back")),
        };
        let limit = request
            .timeout_ms
            .map_or(MAX_WAIT, Duration::from_millis)
            .min(MAX_WAIT);
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.owner
            .tell(Msg::Wait {
                ids: vec![task],
                num_returns: 1,
                reply,
            })
            .await?;
        let status = match tokio::time::timeout(limit, rx).await {
            Ok(Ok(answer)) => answer?.ready.pop(),
            Ok(Err(_)) => return Err(Status::unavailable("the head is shutting down")),
            // Not finished yet: the caller waits for the id.
            Err(_) => None,
        };
        Ok(Response::new(wire::RunReply {
            task_id: task.0,
            status: status.map(Into::into),
        }))
    }

    async fn wait(
        &self,
        request: Request<wire::WaitRequest>,
    ) -> Result<Response<wire::WaitReply>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let WaitRequest {
            task_ids,
            num_returns,
            timeout,
        } = request.into_inner().try_into()?;
        check_visible(&self.owner, &caller, &task_ids).await?;
        let limit = timeout.unwrap_or(MAX_WAIT).min(MAX_WAIT);
        let num_returns = num_returns as usize;
        let ids = task_ids.clone();
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.owner
            .tell(Msg::Wait {
                ids,
                num_returns,
                reply,
            })
            .await?;
        let answer = match tokio::time::timeout(limit, rx).await {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => return Err(Status::unavailable("the head is shutting down")),
            // Timed out: answer with what is ready now.
            Err(_) => {
                self.owner
                    .read(stale, move |s| snapshot(s, &task_ids, num_returns))
                    .await?
            }
        };
        Ok(Response::new(answer.into()))
    }

    async fn cancel(
        &self,
        request: Request<wire::CancelRequest>,
    ) -> Result<Response<wire::CancelReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let CancelRequest {
            task_ids,
            recursive,
            force,
        } = request.into();
        check_visible(&self.owner, &caller, &task_ids).await?;
        // A plain cancel is the command every data format holds; a recursive or forced one
        // needs format 11 (the owner turns a recursive one into this where the group writes an
        // older format: no parent is recorded there).
        let command = if recursive || force {
            Command::CancelTasks {
                tasks: task_ids,
                recursive,
                force,
            }
        } else {
            Command::Cancel { tasks: task_ids }
        };
        match self.owner.apply(command, key).await? {
            Reply::Cancelled(tasks) => Ok(Response::new(CancelReply { tasks }.into())),
            other => Err(unexpected(other)),
        }
    }

    async fn requeue(
        &self,
        request: Request<wire::RequeueRequest>,
    ) -> Result<Response<wire::RequeueReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let task = TaskId(request.task_id);
        let resources = escher_proto::ResourceSet::try_from(request.resources)
            .map_err(|e| Status::invalid_argument(format!("resources: {e}")))?;
        check_visible(&self.owner, &caller, &[task]).await?;
        match self
            .owner
            .apply(Command::Requeue { task, resources }, key)
            .await?
        {
            Reply::Requeued(status) => Ok(Response::new(wire::RequeueReply {
                task: Some(status.into()),
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn describe_task(
        &self,
        request: Request<wire::DescribeTaskRequest>,
    ) -> Result<Response<wire::TaskInfo>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let id: TaskId = request.into_inner().into();
        let info = self
            .owner
            .read(stale, move |s| {
                visible(s, &caller, id)?;
                s.task_info(id).ok_or_else(|| s.missing_task(id))
            })
            .await?;
        Ok(Response::new(info.map_err(to_status)?.into()))
    }

    async fn list_tasks(
        &self,
        request: Request<wire::ListTasksRequest>,
    ) -> Result<Response<wire::ListTasksReply>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let query: ListTasksRequest = request.into_inner().try_into()?;
        if let Some(ns) = &query.namespace
            && !caller.sees(Some(ns.as_str()))
        {
            return Err(Status::permission_denied(format!(
                "{} cannot see the tasks of namespace {ns}",
                caller.describe()
            )));
        }
        let limit = match query.limit {
            0 => 1_000,
            n => n.min(MAX_LIST),
        } as usize;
        let reply = self
            .owner
            .read(stale, move |s| {
                s.list_tasks_counted(&query, limit, |ns| caller.sees(ns))
            })
            .await?;
        Ok(Response::new(reply.into()))
    }

    #[tracing::instrument(skip_all)]
    async fn set_resources(
        &self,
        request: Request<wire::SetResourcesRequest>,
    ) -> Result<Response<wire::SetResourcesReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let SetResourcesRequest {
            updates,
            namespace,
            caller_task: _,
        } = request.try_into()?;
        let namespace = caller.namespace(namespace)?;
        check_names(&caller, updates.iter().map(|u| &u.name))?;
        let command = Command::SetResources {
            updates,
            namespace,
            caller_task: caller.task(),
        };
        match self.owner.apply(command, key).await? {
            Reply::ResourcesSet(changed) => {
                let outcomes = changed
                    .into_iter()
                    .map(|nodes| SetResourceOutcome { nodes })
                    .collect();
                Ok(Response::new(SetResourcesReply { outcomes }.into()))
            }
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(bundles))]
    async fn reserve(
        &self,
        request: Request<wire::ReserveRequest>,
    ) -> Result<Response<wire::ReserveReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let ReserveRequest {
            name,
            bundles,
            strategy,
            timeout,
            namespace,
        } = request.try_into()?;
        let namespace = caller.namespace(namespace)?;
        check_names(&caller, [&name])?;
        tracing::Span::current().record("bundles", bundles.len());
        let command = Command::Reserve {
            name,
            bundles,
            strategy,
            timeout,
            namespace,
        };
        match self.owner.apply(command, key).await? {
            Reply::Reserved { tasks, placed } => Ok(Response::new(
                ReserveReply {
                    task_ids: tasks,
                    placed,
                }
                .into(),
            )),
            other => Err(unexpected(other)),
        }
    }

    async fn gpus(
        &self,
        request: Request<wire::GpusRequest>,
    ) -> Result<Response<wire::GpusReply>, Status> {
        let stale = wants_stale(&request);
        let reply = self.owner.read(stale, |s| s.gpu_status()).await?;
        Ok(Response::new(reply.into()))
    }

    #[tracing::instrument(skip_all, fields(node, gpu))]
    async fn apply_mig_layout(
        &self,
        request: Request<wire::ApplyMigLayoutRequest>,
    ) -> Result<Response<wire::MigPlan>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let ApplyMigLayoutRequest {
            node,
            gpu,
            change,
            drain,
        } = request.try_into()?;
        tracing::Span::current().record("node", node.0);
        tracing::Span::current().record("gpu", gpu);
        let command = Command::ApplyMigLayout {
            node,
            gpu,
            change,
            drain,
        };
        match self.owner.apply(command, key).await? {
            Reply::MigPlan(plan) => Ok(Response::new(plan.into())),
            other => Err(unexpected(other)),
        }
    }

    async fn cluster_status(
        &self,
        request: Request<wire::ClusterStatusRequest>,
    ) -> Result<Response<wire::ClusterStatusReply>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let counted = request.get_ref().task_counts;
        // Calls waiting at actors, as workers' heartbeats said: only the leader hears those.
        let loads = (!stale).then(|| self.actor_calls.fresh());
        let who = caller.clone();
        let mut status = self
            .owner
            .read(stale, move |s| {
                let mut status = s.cluster_status();
                if counted {
                    status.namespaces = s.task_counts();
                }
                status.pending_actor_calls = loads.map(|loads| {
                    super::actor_calls::live(s, &loads)
                        .filter(|(ns, _)| who.sees(*ns))
                        .map(|(_, pending)| pending)
                        .sum()
                });
                status
            })
            .await?;
        if let Some(ns) = caller.status_scope() {
            status
                .namespaces
                .retain(|c| c.namespace.as_ref() == Some(ns));
            // An app sees physical, shared and its own namespace's resources only.
            let visible = |q: &str| q == ns.as_str() || q == SHARED_NAMESPACE;
            for node in &mut status.nodes {
                node.resources
                    .retain(|r| r.name.namespace().is_none_or(visible));
            }
        }
        self.fences.show(&mut status);
        Ok(Response::new(status.into()))
    }

    async fn task_logs(
        &self,
        request: Request<wire::TaskLogsRequest>,
    ) -> Result<Response<wire::TaskLogsReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request: TaskLogsRequest = request.into_inner().try_into()?;
        let task = request.task_id;
        // Only the leader reaches workers' logs: a replica that does not lead answers "not
        // leader" with the leader's address, which clients follow, as for every other call.
        self.owner.read(false, |_| ()).await?;
        check_visible(&self.owner, &caller, &[task]).await?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.owner.tell(Msg::Logs { request, reply }).await?;
        match tokio::time::timeout(self.log_fetch_timeout, rx).await {
            Ok(Ok(Ok(chunk))) => Ok(Response::new(chunk.into())),
            Ok(Ok(Err(why))) if why.starts_with("unknown task") => {
                // No record: retention may have evicted it, which says more than "unknown".
                let missing = self.owner.read(true, move |s| s.missing_task(task)).await?;
                Err(to_status(missing))
            }
            Ok(Ok(Err(why))) => Err(Status::failed_precondition(why)),
            Ok(Err(_)) => Err(Status::unavailable("the head is shutting down")),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the worker holding task {task}'s logs did not answer within {:?}",
                self.log_fetch_timeout
            ))),
        }
    }

    async fn report_telemetry(
        &self,
        request: Request<wire::ReportTelemetryRequest>,
    ) -> Result<Response<wire::ReportTelemetryReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let Some((task, attempt)) = caller.task() else {
            return Err(Status::permission_denied(format!(
                "ReportTelemetry is for running tasks, with the credential their worker gave \
                 them (ESCHER_TASK_TOKEN); the call carried {}",
                caller.describe()
            )));
        };
        let samples = escher_proto::convert::report_samples(request.into_inner())?;
        let kept = self
            .telemetry
            .report(task, attempt, samples, super::owner::now_ms());
        Ok(Response::new(wire::ReportTelemetryReply {
            kept: u32::try_from(kept).unwrap_or(u32::MAX),
        }))
    }

    async fn telemetry(
        &self,
        request: Request<wire::TelemetryRequest>,
    ) -> Result<Response<wire::TelemetryReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let tasks = escher_proto::convert::telemetry_tasks(request.get_ref())?;
        check_known_and_visible(&self.owner, &caller, &tasks).await?;
        let after = request.get_ref().after_ms;
        let tasks = self
            .telemetry
            .read(&tasks, after)
            .into_iter()
            .map(Into::into)
            .collect();
        Ok(Response::new(wire::TelemetryReply { tasks }))
    }

    async fn report_policy(
        &self,
        request: Request<wire::ReportPolicyRequest>,
    ) -> Result<Response<wire::ReportPolicyReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let namespace = caller.namespace(None)?.map(|ns| ns.as_str().to_string());
        let (policy, rows) = escher_proto::convert::policy_report(request.into_inner())
            .map_err(Status::invalid_argument)?;
        self.policies
            .report(namespace, policy, rows, super::owner::now_ms());
        Ok(Response::new(wire::ReportPolicyReply {}))
    }

    async fn policies(
        &self,
        request: Request<wire::PoliciesRequest>,
    ) -> Result<Response<wire::PoliciesReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let scope = caller.status_scope().map(|ns| ns.as_str().to_string());
        let reports = self
            .policies
            .read(|ns| scope.is_none() || ns == scope.as_deref())
            .into_iter()
            .map(Into::into)
            .collect();
        Ok(Response::new(wire::PoliciesReply { reports }))
    }

    async fn heads(
        &self,
        _request: Request<wire::HeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        let reply = self.heads_reply().await?;
        Ok(Response::new(reply.into()))
    }

    async fn dashboard_ticket(
        &self,
        request: Request<wire::DashboardTicketRequest>,
    ) -> Result<Response<wire::DashboardTicketReply>, Status> {
        let Some(logins) = &self.dashboard else {
            return Err(Status::failed_precondition(
                "this head serves no dashboard: start it with `escher-head --dashboard \
                 127.0.0.1:8265` (or another loopback HOST:PORT)",
            ));
        };
        let caller = crate::auth::caller(&request)?;
        if matches!(caller, Caller::Task { .. }) {
            return Err(Status::permission_denied(
                "a task's credential cannot sign in to the dashboard: use an admin, app or \
                 reader token",
            ));
        }
        // The session acts as this token (checked again at every call), which stays here.
        let headers = request.metadata().clone().into_headers();
        let token = crate::auth::bearer(&headers)
            .map(str::to_string)
            .unwrap_or_default();
        let (ticket, ttl) = logins.issue(&token, std::time::Instant::now());
        Ok(Response::new(wire::DashboardTicketReply {
            address: logins.address().to_string(),
            ticket,
            expires_in_ms: ttl.as_millis() as u64,
        }))
    }

    async fn change_heads(
        &self,
        request: Request<wire::ChangeHeadsRequest>,
    ) -> Result<Response<wire::HeadsReply>, Status> {
        let change = HeadChange::try_from(request.into_inner())?;
        tracing::info!(?change, "membership change requested");
        self.owner
            .ask(|reply| Msg::ChangeHeads { change, reply })
            .await??;
        let reply = self.heads_reply().await?;
        Ok(Response::new(reply.into()))
    }

    async fn create_token(
        &self,
        request: Request<wire::CreateTokenRequest>,
    ) -> Result<Response<wire::CreatedToken>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let CreateTokenRequest { grant, description } = request.try_into()?;
        let token = escher_proto::access::new_token(grant.role.as_str());
        let command = Command::CreateToken {
            hash: TokenHash::of(&token),
            grant,
            description,
        };
        match self.owner.apply(command, key).await? {
            Reply::Token(info) => {
                tracing::info!(id = %info.id, grant = %info.grant, "token created");
                Ok(Response::new(CreatedToken { token, info }.into()))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn list_tokens(
        &self,
        request: Request<wire::ListTokensRequest>,
    ) -> Result<Response<wire::ListTokensReply>, Status> {
        let stale = wants_stale(&request);
        let mut tokens = self.keys.bootstrap_infos();
        let created = self
            .owner
            .read(stale, |s| {
                s.tokens()
                    .iter()
                    .map(|r| r.info())
                    .collect::<Vec<TokenInfo>>()
            })
            .await?;
        tokens.extend(created);
        let tokens = tokens.into_iter().map(Into::into).collect();
        Ok(Response::new(wire::ListTokensReply { tokens }))
    }

    async fn revoke_token(
        &self,
        request: Request<wire::RevokeTokenRequest>,
    ) -> Result<Response<wire::TokenInfo>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let id = request.id.trim().to_string();
        if self.keys.bootstrap_infos().iter().any(|t| t.id == id) {
            return Err(Status::failed_precondition(format!(
                "token {id} is one of the access file's bootstrap tokens; to replace them, stop                  the head group, remove its access file and start it again (a new one is                  written), then give the new file to workers and users"
            )));
        }
        match self.owner.apply(Command::RevokeToken { id }, key).await? {
            Reply::Token(info) => {
                tracing::info!(id = %info.id, "token revoked");
                Ok(Response::new(info.into()))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn drain(
        &self,
        request: Request<wire::DrainRequest>,
    ) -> Result<Response<wire::DrainReply>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let node = NodeId(request.node);
        match self.owner.apply(Command::DrainNode { node }, key).await? {
            Reply::Done => {
                tracing::info!(%node, "node drained by an admin");
                Ok(Response::new(wire::DrainReply { draining: true }))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn label_node(
        &self,
        request: Request<wire::LabelNodeRequest>,
    ) -> Result<Response<wire::LabelNodeReply>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        let node = NodeId(request.node);
        let (set, remove) = label_change(request.set, request.remove)?;
        let command = Command::LabelNode {
            node,
            set,
            remove,
            drain: false,
        };
        match self.owner.apply(command, key).await? {
            Reply::Labels(labels) => {
                tracing::info!(%node, %labels, "node labelled by an admin");
                Ok(Response::new(wire::LabelNodeReply {
                    labels: labels.iter().map(|(k, v)| (k.into(), v.into())).collect(),
                }))
            }
            other => Err(unexpected(other)),
        }
    }

    /// A decision of a client that acts on the cluster (an autoscaler), through the log to
    /// the watchers: checked here, so that a bad one is refused with nothing written.
    async fn record_decision(
        &self,
        request: Request<wire::RecordDecisionRequest>,
    ) -> Result<Response<wire::RecordDecisionReply>, Status> {
        let scope = crate::auth::key_scope(&request);
        let request = request.into_inner();
        let key = key(scope, request.key)?;
        escher_proto::types::check_decision(&request.source, &request.action, &request.reason)
            .map_err(Status::invalid_argument)?;
        let command = Command::RecordDecision {
            source: request.source,
            action: request.action,
            reason: request.reason,
        };
        match self.owner.apply(command, key).await? {
            Reply::Done => Ok(Response::new(wire::RecordDecisionReply {})),
            other => Err(unexpected(other)),
        }
    }

    type WatchStream = ReceiverStream<Result<wire::WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<wire::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = crate::auth::caller(&request)?;
        let query: WatchRequest = request.into_inner().try_into()?;
        if let Some(ns) = &query.namespace
            && !caller.sees(Some(ns.as_str()))
            && caller.status_scope().is_some()
        {
            return Err(Status::permission_denied(format!(
                "{} cannot watch namespace {ns}",
                caller.describe()
            )));
        }
        let after = query.after;
        let filter = Filter::new(query, caller);
        let subscription = self
            .owner
            .ask(|reply| Msg::Watch {
                filter,
                after,
                reply,
            })
            .await??;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(super::watch::forward(subscription, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type BackupStream = ReceiverStream<Result<wire::BackupChunk, Status>>;

    /// Where an actor is and a data ticket for its serving incarnation: a read of the state
    /// (linearizable unless the caller asks for a stale one), signed with the hosting node's
    /// ticket key (docs/ARCHITECTURE.md "Actors and objects").
    async fn resolve_actor(
        &self,
        request: Request<wire::ResolveActorRequest>,
    ) -> Result<Response<wire::ResolveActorReply>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let requested = match request.namespace.as_str() {
            "" => None,
            ns => Some(
                Namespace::new(ns)
                    .map_err(|e| Status::invalid_argument(format!("namespace {ns:?}: {e}")))?,
            ),
        };
        let selector = match request.actor {
            Some(wire::resolve_actor_request::Actor::Id(id)) => ActorSelector::Id(TaskId(id)),
            Some(wire::resolve_actor_request::Actor::Name(name)) => ActorSelector::Name(name),
            None => {
                return Err(Status::invalid_argument(
                    "name an actor: its id or its name",
                ));
            }
        };
        let namespace = caller.namespace(requested)?;
        let everything = caller.sees_everything();
        let expiry = super::owner::now_ms().saturating_add(escher_proto::types::TICKET_MILLIS);
        let view = self
            .owner
            .read(stale, move |s| {
                s.resolve_actor(&selector, namespace.as_ref(), everything, expiry)
            })
            .await?;
        let mut view = view.map_err(to_status)?;
        if view.state == escher_proto::TaskState::Running
            && let Some(node) = view.node
        {
            view.pending_calls = self.actor_calls.pending(node, view.id, view.incarnation);
        }
        Ok(Response::new(view.into()))
    }

    /// Where a `put` goes (`objects_svc.rs`).
    async fn place_object(
        &self,
        request: Request<wire::PlaceObjectRequest>,
    ) -> Result<Response<wire::PlaceObjectReply>, Status> {
        self.do_place_object(request).await
    }

    /// Records sealed copies (`objects_svc.rs`).
    async fn objects_sealed(
        &self,
        request: Request<wire::ObjectsSealedRequest>,
    ) -> Result<Response<wire::ObjectsSealedReply>, Status> {
        self.do_objects_sealed(request).await
    }

    /// Releases objects (`objects_svc.rs`).
    async fn release_objects(
        &self,
        request: Request<wire::ReleaseObjectsRequest>,
    ) -> Result<Response<wire::ReleaseObjectsReply>, Status> {
        self.do_release_objects(request).await
    }

    /// Where an object is (`objects_svc.rs`).
    async fn locate_object(
        &self,
        request: Request<wire::LocateObjectRequest>,
    ) -> Result<Response<wire::ObjectInfo>, Status> {
        self.do_locate_object(request).await
    }

    /// A namespace's objects (`objects_svc.rs`).
    async fn list_objects(
        &self,
        request: Request<wire::ListObjectsRequest>,
    ) -> Result<Response<wire::ListObjectsReply>, Status> {
        self.do_list_objects(request).await
    }

    /// A client opens its object session before any put (`objects_svc.rs`).
    async fn open_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::OpenObjectSessionReply>, Status> {
        self.do_open_object_session(request).await
    }

    /// A client keeps its object session (`objects_svc.rs`).
    async fn renew_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::RenewObjectSessionReply>, Status> {
        self.do_renew_object_session(request).await
    }

    /// A client ends its object session (`objects_svc.rs`).
    async fn close_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::CloseObjectSessionReply>, Status> {
        self.do_close_object_session(request).await
    }

    /// The state as of a linearizable read (every write acknowledged before the call is in
    /// it), encoded as a snapshot image without the group's addresses (a restore names its own
    /// replicas), sent in pieces.
    async fn backup(
        &self,
        _request: Request<wire::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let (image, cluster_id, revision) = self
            .owner
            .read(false, |s| {
                let image = crate::replication::encode_backup(s);
                (
                    image,
                    s.cluster_id().unwrap_or_default().to_string(),
                    s.revision(),
                )
            })
            .await?;
        let image = image.map_err(|e| Status::internal(e.to_string()))?;
        let total = image.len() as u64;
        // The format the image is in (format 1, which every release reads, unless the state
        // holds what only a later format encodes), not the newest this build writes.
        let format = crate::replication::image_format(&image);
        tracing::info!(bytes = total, revision, "backup taken");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            const CHUNK: usize = 1 << 20;
            let mut pieces = image.chunks(CHUNK).peekable();
            let mut first = true;
            if pieces.peek().is_none() {
                return;
            }
            for piece in pieces {
                let mut chunk = wire::BackupChunk {
                    data: piece.to_vec(),
                    ..Default::default()
                };
                if std::mem::take(&mut first) {
                    chunk.data_format = u32::from(format);
                    chunk.cluster_id = cluster_id.clone();
                    chunk.revision = revision;
                    chunk.total_bytes = total;
                }
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl ClusterService {
    /// One request of a submission stream, answered with its ids or its error.
    async fn submit_streamed(
        &self,
        caller: &Caller,
        scope: KeyScope,
        request: wire::SubmitRequest,
    ) -> wire::SubmitStreamReply {
        // The auth layer checked the stream's call; each request on it is checked again.
        let submitted = match check_attempt(&self.owner, caller).await {
            Ok(()) => self.submit_as(caller, scope, request, false).await,
            Err(status) => Err(status),
        };
        match submitted {
            Ok(ids) => wire::SubmitStreamReply {
                task_ids: ids.into_iter().map(|id| id.0).collect(),
                error: None,
            },
            Err(status) => wire::SubmitStreamReply {
                task_ids: Vec::new(),
                error: Some(wire::CallError::from(&status)),
            },
        }
    }

    /// Submits the tasks of `request` as `caller` (in its namespace, with the request's
    /// idempotency key); with `only_one` (for `Run`), any other number of tasks is refused.
    async fn submit_as(
        &self,
        caller: &Caller,
        scope: KeyScope,
        request: wire::SubmitRequest,
        only_one: bool,
    ) -> Result<Vec<TaskId>, Status> {
        let key = key(scope, request.key)?;
        let SubmitRequest { tasks, namespace } = request.try_into()?;
        if only_one && tasks.len() != 1 {
            return Err(Status::invalid_argument(format!(
                "Run takes exactly one task ({} given); submit several with Submit, then Wait",
                tasks.len()
            )));
        }
        let namespace = caller.namespace(namespace)?;
        tracing::Span::current().record("tasks", tasks.len());
        // A running task's credential (checked by the auth layer, its attempt checked running)
        // makes it the parent of what it submits: never a field of the request, which a client
        // could fill with another namespace's task.
        let command = match caller.task() {
            Some((parent, _attempt)) => Command::SubmitChildren {
                tasks,
                namespace,
                parent,
            },
            None => Command::Submit { tasks, namespace },
        };
        match self.owner.apply(command, key).await? {
            Reply::Submitted(task_ids) => Ok(task_ids),
            other => Err(unexpected(other)),
        }
    }

    /// This replica's view of the group, with every other member asked for its own status.
    async fn heads_reply(&self) -> Result<HeadsReply, Status> {
        let HeadsView { group, me, members } = self.owner.ask(|reply| Msg::Heads { reply }).await?;
        let replicas = group_status(me, &members, &group, &self.peers).await;
        Ok(HeadsReply { group, replicas })
    }
}

/// The labels to set and the keys to remove of a `LabelNode` request, checked: valid keys and
/// values, none of escher's own (`escher.`), no key both set and removed.
fn label_change(
    set: std::collections::BTreeMap<String, String>,
    remove: Vec<String>,
) -> Result<(Labels, Vec<String>), Status> {
    let invalid = |e: escher_proto::types::TypeError| Status::invalid_argument(e.to_string());
    let reserved = |key: &str| {
        Status::invalid_argument(ApplyError::ReservedLabel(key.to_string()).to_string())
    };
    if set.is_empty() && remove.is_empty() {
        return Err(Status::invalid_argument(
            "nothing to change: name labels to set (KEY=VALUE) or to remove (KEY-)",
        ));
    }
    let mut labels = Labels::new();
    for (key, value) in &set {
        if is_reserved_label(key) {
            return Err(reserved(key));
        }
        labels.insert(key, value).map_err(invalid)?;
    }
    for key in &remove {
        Labels::check_key(key).map_err(invalid)?;
        if is_reserved_label(key) {
            return Err(reserved(key));
        }
        if labels.get(key).is_some() {
            return Err(Status::invalid_argument(format!(
                "label {key:?} is both set and removed; name it once"
            )));
        }
    }
    if labels.len() > escher_proto::types::MAX_LABELS {
        return Err(Status::invalid_argument(format!(
            "{} labels to set; a node carries at most {}",
            labels.len(),
            escher_proto::types::MAX_LABELS
        )));
    }
    Ok((labels, remove))
}
