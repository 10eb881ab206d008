//! The web dashboard on `--dashboard HOST:PORT` (docs/DESIGN.md §11): one page, its script and its
//! style embedded in the binary, and a JSON API over the head's own `Cluster` service.
//!
//! The API is a gateway, not a second implementation: each route authenticates the bearer
//! token exactly as the gRPC routes do ([`authorize`], with the method the route stands for),
//! then calls the [`ClusterService`] method in-process, so the dashboard sees what the CLI
//! with the same token sees: a `reader` token the cluster, GPUs and replicas but no task, an
//! `app` token its own namespace, an `admin` token everything. Errors keep the service's
//! message and map its code to an HTTP status.
//!
//! Live updates: `GET /api/events` is the watch API as server-sent events (one `batch` event
//! per batch the head sends, JSON), which the page reads with `fetch` so that the token
//! travels in a header, never in a URL. The page itself and its assets carry no data and are
//! served to anyone who can reach the (loopback) port; everything else needs a token.
//!
//! One feed per browser: a browser opens at most six HTTP/1.1 connections to one host, and a
//! feed holds one for as long as its tab is open, so the page does not open its own. A
//! `SharedWorker` (`/events-worker.js`) holds one feed per token for all the tabs of the
//! browser and passes each batch to every tab over its `MessagePort`; a browser without
//! `SharedWorker` opens a feed per tab, as before. Each event carries `at_ms`, when the leader
//! committed it (the watch API's own timestamp, not one stamped here), which the page shows.
//!
//! Actors (`GET /api/actors`): the tasks labelled `escher.actor`, each described once for its
//! class and name; its incarnation is its task's attempt. Method calls go from callers to the
//! hosting worker and never through the head, so the page shows no call counts.
//!
//! Policies (`GET /api/policies`): each policy's latest report (an ESL's tenants and their
//! measures, such as fair-time's decayed usage, factor and holdings), as `escher status` prints
//! them; kept in memory by the head, so the page says when each was reported.
//!
//! Utilisation over time: the head samples its own cluster status every few seconds into a
//! bounded ring ([`history`]), served by `GET /api/history` with the same check as
//! `/api/status`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

use escher_proto::mig::GpuModel;
use escher_proto::types::{
    ACTOR_LABEL, ClusterStatus, GpusReply, HeadsReply, ListTasksReply, ListTasksRequest, LogChunk,
    LogStream, NodeId, PolicyReport, RESERVATION_LABEL, TaskId, TaskInfo, TaskLogsRequest,
    TaskState, TaskSummary, TaskTelemetry, WatchBatch, WatchRequest,
};
use escher_proto::wire::{self, cluster_server::Cluster};

mod history;
mod login;

pub(crate) use self::login::Logins;

use self::history::{History, HistoryReply};
use super::cluster_svc::ClusterService;
use super::handle::{READ_METADATA, STALE};
use crate::auth::{Caller, GuardedStream, Keys, Revalidation, authorize, check_attempt};

/// The page.
const INDEX_HTML: &str = include_str!("assets/index.html");
/// Its script.
const APP_JS: &str = include_str!("assets/app.js");
/// Its style.
const STYLE_CSS: &str = include_str!("assets/style.css");
/// The shared worker that holds one live feed for all the browser's tabs.
const EVENTS_WORKER_JS: &str = include_str!("assets/events-worker.js");

/// The most bytes of a task's output the log tail shows.
const LOG_TAIL_BYTES: usize = 64 * 1024;
/// The most chunks (of up to 4 MiB each) read for one log tail.
const MAX_LOG_READS: usize = 16;
/// The most tasks one page of the task table lists.
const MAX_TASK_ROWS: u32 = 500;

/// What every route needs.
#[derive(Clone)]
struct Dashboard {
    svc: ClusterService,
    keys: Arc<Keys>,
    enforce: bool,
    history: Arc<Mutex<History>>,
    logins: Arc<Logins>,
}

/// Serves the dashboard on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    svc: ClusterService,
    keys: Arc<Keys>,
    enforce: bool,
    logins: Arc<Logins>,
    stop: CancellationToken,
) {
    let addr = listener.local_addr().ok();
    let history = Arc::new(Mutex::new(History::new(history::SAMPLES_KEPT)));
    let app = axum::Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
        .route(
            "/events-worker.js",
            get(|| asset("text/javascript; charset=utf-8", EVENTS_WORKER_JS)),
        )
        .route("/api/whoami", get(whoami))
        .route("/api/status", get(status))
        .route("/api/tasks", get(tasks))
        .route("/api/tasks/{id}", get(task))
        .route("/api/tasks/{id}/logs", get(logs))
        .route("/api/tasks/{id}/telemetry", get(telemetry))
        .route("/api/gpus", get(gpus))
        .route("/api/heads", get(heads))
        .route("/api/policies", get(policies))
        .route("/api/history", get(utilisation))
        .route("/api/reservations", get(reservations))
        .route("/api/actors", get(actors))
        .route("/api/events", get(events))
        .route("/api/prove", get(prove))
        .route("/api/login", post(login))
        .fallback(|| async { ApiError::from(Status::not_found("no such page")) })
        .with_state(Dashboard {
            svc: svc.clone(),
            keys,
            enforce,
            history: Arc::clone(&history),
            logins,
        });
    tracing::info!(?addr, "serving the web dashboard");
    let serving = async {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "the dashboard failed");
        }
    };
    // The sampler lives exactly as long as the dashboard: both end on `stop`.
    tokio::join!(serving, history::sample(svc, history, stop.clone()));
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// A refusal or failure, as JSON: `{"code": "PermissionDenied", "message": "..."}`.
#[derive(Debug)]
struct ApiError(Status);

impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        ApiError(status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let http = match self.0.code() {
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = serde_json::json!({
            "code": format!("{:?}", self.0.code()),
            "message": self.0.message(),
        });
        (http, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

impl Dashboard {
    /// `headers` with a session's bearer (`escher-dash-...`, from `POST /api/login`) replaced
    /// by the token the session acts as, which is then checked as any token is (so a revoked
    /// token ends its sessions); other headers as they are.
    fn resolve(&self, headers: &HeaderMap) -> Result<HeaderMap, Status> {
        let Ok(bearer) = crate::auth::bearer(headers) else {
            return Ok(headers.clone());
        };
        if !bearer.starts_with(login::SESSION_PREFIX) {
            return Ok(headers.clone());
        }
        let token = self
            .logins
            .token_of(bearer, std::time::Instant::now())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "this dashboard session ended (it expired, or the head restarted): run \
                     `escher dashboard` again to sign in",
                )
            })?;
        let mut headers = headers.clone();
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| Status::unauthenticated("the session's token is not a header value"))?;
        headers.insert(header::AUTHORIZATION, value);
        Ok(headers)
    }

    /// `message` as a call of `method` by the holder of the token in `headers`, if that
    /// method admits them (and, for a task's credential, while its attempt runs), as the
    /// auth layer would admit the gRPC call.
    async fn call<T>(
        &self,
        method: &str,
        headers: &HeaderMap,
        message: T,
    ) -> Result<Request<T>, Status> {
        let path = format!("/escher.v1.Cluster/{method}");
        let headers = self.resolve(headers)?;
        let (caller, _) = authorize(&self.keys, self.enforce, &path, &headers)?;
        check_attempt(&self.svc.owner, &caller).await?;
        let mut request = Request::new(message);
        request.extensions_mut().insert(caller);
        // A page of views needs no linearizable read: this replica's state as applied, with no
        // ReadIndex round per view (and on a follower, its view rather than "not leader"; the
        // live feed and logs still need the leader).
        request.metadata_mut().insert(
            READ_METADATA,
            tonic::metadata::MetadataValue::from_static(STALE),
        );
        Ok(request)
    }
}

/// Converts a reply of the service to its domain type.
fn domain<W, D>(reply: tonic::Response<W>) -> Result<D, Status>
where
    D: TryFrom<W>,
    D::Error: std::fmt::Display,
{
    D::try_from(reply.into_inner()).map_err(|err| Status::internal(err.to_string()))
}

/// Who the token is: what the page shows and which views it offers.
#[derive(Debug, Serialize)]
struct WhoAmI {
    /// "an admin token", "an app token of namespace ml" ...
    caller: String,
    /// `admin`, `app`, `reader` or `task`.
    role: &'static str,
    /// The namespace an app token acts in.
    namespace: Option<String>,
    /// Whether it may list tasks (a reader may not).
    sees_tasks: bool,
}

/// `GET /api/prove?token=ID&nonce=N`: this head's proof that it knows the token with that id
/// (see [`escher_proto::access::dashboard_proof`]); asked by `escher dashboard` before it
/// prints an address carrying the token. Needs no token: it reveals nothing of one.
#[derive(Debug, Deserialize)]
struct ProveQuery {
    token: String,
    nonce: String,
}

async fn prove(State(d): State<Dashboard>, Query(q): Query<ProveQuery>) -> Response {
    let nonce_ok =
        (16..=128).contains(&q.nonce.len()) && q.nonce.bytes().all(|b| b.is_ascii_alphanumeric());
    if !nonce_ok {
        let why = "nonce: 16 to 128 letters and digits";
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    match d.keys.dashboard_proof(&q.token, &q.nonce) {
        Some(proof) => Json(serde_json::json!({ "proof": proof })).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "this head knows no live token with that id",
        )
            .into_response(),
    }
}

/// What the page sends to sign in with a ticket.
#[derive(Debug, Deserialize)]
struct LoginBody {
    ticket: String,
}

/// Trades a login ticket (from `escher dashboard`) for a session the page sends as its bearer.
/// A ticket works once, for a minute, and only at this dashboard's own address (its `Host`).
async fn login(State(d): State<Dashboard>, headers: HeaderMap, body: String) -> Response {
    let Ok(LoginBody { ticket }) = serde_json::from_str::<LoginBody>(&body) else {
        let why = r#"the body is {"ticket": "..."}, as `escher dashboard` gives it"#;
        return ApiError::from(Status::invalid_argument(why)).into_response();
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match d.logins.redeem(&ticket, host, std::time::Instant::now()) {
        Ok((session, ttl)) => Json(serde_json::json!({
            "session": session,
            "expires_in_ms": ttl.as_millis() as u64,
        }))
        .into_response(),
        Err(why) => ApiError::from(Status::unauthenticated(why)).into_response(),
    }
}

async fn whoami(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<WhoAmI> {
    let request = d.call("ClusterStatus", &headers, ()).await?;
    let caller = crate::auth::caller(&request)?;
    let (role, namespace) = match &caller {
        Caller::Admin => ("admin", None),
        Caller::App(ns) => ("app", Some(ns.to_string())),
        Caller::Reader => ("reader", None),
        Caller::Task { namespace, .. } => ("task", namespace.as_ref().map(|n| n.to_string())),
        Caller::Worker => ("worker", None),
        Caller::Peer => ("peer", None),
    };
    Ok(Json(WhoAmI {
        caller: caller.describe(),
        role,
        namespace,
        sees_tasks: role != "reader",
    }))
}

/// Serializes `value`, then lets `annotate` add what the page should not work out itself.
fn json_with<T: Serialize>(
    value: &T,
    annotate: impl FnOnce(&mut serde_json::Value),
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut json = serde_json::to_value(value).map_err(|err| Status::internal(err.to_string()))?;
    annotate(&mut json);
    Ok(Json(json))
}

/// The cluster status with task counts; each resource says whether it is physical (reported
/// by workers) or ephemeral (created by applications), as the head's naming rules decide.
async fn status(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<serde_json::Value> {
    let message = wire::ClusterStatusRequest { task_counts: true };
    let request = d.call("ClusterStatus", &headers, message).await?;
    let status: ClusterStatus = domain(d.svc.cluster_status(request).await?)?;
    json_with(&status, |json| {
        let nodes = json["nodes"].as_array_mut().into_iter().flatten();
        for (node, status) in nodes.zip(&status.nodes) {
            let resources = node["resources"].as_array_mut().into_iter().flatten();
            for (r, status) in resources.zip(&status.resources) {
                r["physical"] = status.name.is_physical().into();
            }
        }
    })
}

/// Every node's GPUs; each says how many memory slices its MIG layout is drawn on.
async fn gpus(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<serde_json::Value> {
    let request = d.call("Gpus", &headers, wire::GpusRequest {}).await?;
    let reply: GpusReply = domain(d.svc.gpus(request).await?)?;
    json_with(&reply, |json| {
        let nodes = json["nodes"].as_array_mut().into_iter().flatten();
        for (node, status) in nodes.zip(&reply.nodes) {
            let gpus = node["gpus"].as_array_mut().into_iter().flatten();
            for (gpu, status) in gpus.zip(&status.gpus) {
                let slices = status.info.model.map(GpuModel::memory_slices);
                gpu["info"]["memory_slices"] = slices.into();
            }
        }
    })
}

async fn heads(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<HeadsReply> {
    let request = d.call("Heads", &headers, wire::HeadsRequest {}).await?;
    Ok(Json(domain(d.svc.heads(request).await?)?))
}

/// The policies' latest reports that the caller may see (`escher status`'s policy tables):
/// each ESL's tenants and their measures, an app token's own namespace's only.
async fn policies(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<Vec<PolicyReport>> {
    let request = d
        .call("Policies", &headers, wire::PoliciesRequest {})
        .await?;
    let reply = d.svc.policies(request).await?.into_inner();
    Ok(Json(reply.reports.into_iter().map(Into::into).collect()))
}

/// The utilisation history, oldest first: what a caller who may read the cluster status may
/// read (the same figures, over time).
async fn utilisation(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<HistoryReply> {
    d.call("ClusterStatus", &headers, ()).await?;
    let samples = d.history.lock().expect("history lock").samples();
    Ok(Json(HistoryReply {
        interval_ms: history::SAMPLE_EVERY.as_millis() as u64,
        capacity: history::SAMPLES_KEPT,
        samples,
    }))
}

/// The task table's filters, as query parameters.
#[derive(Debug, Default, Deserialize)]
struct TasksQuery {
    /// `pending`, `running`, `succeeded`, `failed` or `cancelled`.
    state: Option<String>,
    /// Part of the name.
    name: Option<String>,
    /// `KEY=VALUE` or `KEY`, several separated by commas.
    labels: Option<String>,
    /// A node id.
    node: Option<String>,
    /// A namespace (an app token sees its own only).
    namespace: Option<String>,
    /// Tasks older than this id (the next page).
    before: Option<String>,
    /// At most this many (500 at most).
    limit: Option<u32>,
}

impl TasksQuery {
    fn request(self) -> Result<ListTasksRequest, Status> {
        let bad = |what: &str, text: &str, why: String| {
            Status::invalid_argument(format!("{what} {text:?}: {why}"))
        };
        let some = |v: Option<String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let state = some(self.state)
            .map(|s| {
                s.parse::<TaskState>()
                    .map_err(|e| bad("state", &s, e.to_string()))
            })
            .transpose()?;
        let node = some(self.node)
            .map(|s| {
                s.parse::<NodeId>()
                    .map_err(|e| bad("node", &s, e.to_string()))
            })
            .transpose()?;
        let namespace = some(self.namespace)
            .map(|s| {
                s.parse().map_err(|e: escher_proto::types::TypeError| {
                    bad("namespace", &s, e.to_string())
                })
            })
            .transpose()?;
        let before = some(self.before)
            .map(|s| {
                s.parse::<TaskId>()
                    .map_err(|e| bad("before", &s, e.to_string()))
            })
            .transpose()?;
        let mut labels = Vec::new();
        for selector in some(self.labels).iter().flat_map(|l| l.split(',')) {
            let selector = selector.trim();
            let (key, value) = match selector.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim().to_string())),
                None => (selector, None),
            };
            if key.is_empty() {
                return Err(bad(
                    "label",
                    selector,
                    "give KEY=VALUE, or KEY for any value".into(),
                ));
            }
            labels.push((key.to_string(), value));
        }
        Ok(ListTasksRequest {
            state,
            limit: self.limit.unwrap_or(MAX_TASK_ROWS).clamp(1, MAX_TASK_ROWS),
            after: before,
            name: some(self.name),
            labels,
            node,
            namespace,
            newest_first: true,
        })
    }
}

async fn tasks(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Query(query): Query<TasksQuery>,
) -> ApiResult<ListTasksReply> {
    let message = wire::ListTasksRequest::from(query.request()?);
    let request = d.call("ListTasks", &headers, message).await?;
    Ok(Json(domain(d.svc.list_tasks(request).await?)?))
}

fn task_id(text: &str) -> Result<TaskId, Status> {
    text.parse()
        .map_err(|e| Status::invalid_argument(format!("task {text:?}: {e}")))
}

async fn task(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<TaskInfo> {
    let id = task_id(&id)?;
    let request = d
        .call(
            "DescribeTask",
            &headers,
            wire::DescribeTaskRequest::from(id),
        )
        .await?;
    Ok(Json(domain(d.svc.describe_task(request).await?)?))
}

/// What a task reported as telemetry (empty when nothing), oldest first.
async fn telemetry(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Vec<TaskTelemetry>> {
    let id = task_id(&id)?;
    let message = wire::TelemetryRequest {
        tasks: vec![id.0],
        after_ms: 0,
    };
    let request = d.call("Telemetry", &headers, message).await?;
    let reply = d.svc.telemetry(request).await?.into_inner();
    let tasks = reply
        .tasks
        .into_iter()
        .map(TaskTelemetry::try_from)
        .collect::<Result<_, _>>()
        .map_err(|err| Status::internal(err.to_string()))?;
    Ok(Json(tasks))
}

/// The tail of a task's output: stdout and stderr of its latest attempt.
#[derive(Debug, Serialize)]
struct LogTail {
    stdout: Tail,
    stderr: Tail,
}

/// One stream's tail.
#[derive(Debug, Serialize)]
struct Tail {
    /// The text (lossy UTF-8), at most the last 64 KiB.
    text: String,
    /// Whether older output was left out.
    truncated: bool,
    /// What the head says about where the bytes came from, when it kept them itself.
    notice: Option<String>,
    /// Why the output could not be read (the worker is gone ...), instead of text.
    error: Option<String>,
}

async fn logs(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<LogTail> {
    let id = task_id(&id)?;
    let stdout = tail(&d, &headers, id, LogStream::Stdout).await?;
    let stderr = tail(&d, &headers, id, LogStream::Stderr).await?;
    Ok(Json(LogTail { stdout, stderr }))
}

/// The last [`LOG_TAIL_BYTES`] of one stream, read forward in chunks (at most
/// [`MAX_LOG_READS`]; output past that is left out and said so). A read the worker cannot
/// answer is reported in the tail, not as the call's error; a refusal, or a task the caller
/// cannot see, is the call's error.
async fn tail(
    d: &Dashboard,
    headers: &HeaderMap,
    id: TaskId,
    stream: LogStream,
) -> Result<Tail, Status> {
    let mut kept: Vec<u8> = Vec::new();
    let mut tail = Tail {
        text: String::new(),
        truncated: false,
        notice: None,
        error: None,
    };
    let mut offset = 0;
    for read in 0.. {
        if read == MAX_LOG_READS {
            tail.notice = Some(format!(
                "only the first {} of the output are shown here; `escher logs {}` reads it all",
                offset, id
            ));
            break;
        }
        let message = wire::TaskLogsRequest::from(TaskLogsRequest {
            task_id: id,
            stream,
            offset,
            max_bytes: 0,
            attempt: None,
        });
        let request = d.call("TaskLogs", headers, message).await?;
        let chunk: LogChunk = match d.svc.task_logs(request).await.and_then(domain) {
            Ok(chunk) => chunk,
            Err(status)
                if matches!(
                    status.code(),
                    Code::PermissionDenied
                        | Code::Unauthenticated
                        | Code::NotFound
                        | Code::InvalidArgument
                ) =>
            {
                return Err(status);
            }
            Err(status) => {
                tail.error = Some(status.message().to_string());
                break;
            }
        };
        kept.extend_from_slice(&chunk.data);
        if kept.len() > LOG_TAIL_BYTES {
            kept.drain(..kept.len() - LOG_TAIL_BYTES);
            tail.truncated = true;
        }
        tail.notice = chunk.notice.or(tail.notice);
        let advanced = chunk.next_offset > offset;
        offset = chunk.next_offset.max(offset);
        if chunk.eof || !advanced {
            break;
        }
    }
    tail.text = String::from_utf8_lossy(&kept).into_owned();
    Ok(tail)
}

/// Where to resume a live feed.
#[derive(Debug, Default, Deserialize)]
struct EventsQuery {
    /// The last revision the page saw.
    after: Option<u64>,
    /// Without `after`: start this many events back (as many as the history keeps).
    recent: Option<u64>,
}

async fn events(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let headers = d.resolve(&headers)?;
    let watch = async |after: Option<u64>| {
        let message = wire::WatchRequest::from(WatchRequest {
            after,
            ..WatchRequest::all()
        });
        d.call("Watch", &headers, message).await
    };
    let mut after = query.after;
    if let (None, Some(recent)) = (after, query.recent.filter(|n| *n > 0)) {
        // The first message of a feed from now says where now is.
        let mut now = d.svc.watch(watch(None).await?).await?.into_inner();
        if let Some(first) = now.next().await {
            after = Some(first?.revision.saturating_sub(recent));
        }
    }
    let batches = match d.svc.watch(watch(after).await?).await {
        // Further back than the history: from as far back as it goes is not known here, so
        // from now.
        Err(status) if status.code() == Code::OutOfRange && query.after.is_none() => {
            d.svc.watch(watch(None).await?).await?
        }
        other => other?,
    }
    .into_inner();
    let events = batches.map(|batch| {
        let event = match batch.map(WatchBatch::try_from) {
            Ok(Ok(batch)) => match batch_json(&batch) {
                Ok(json) => Event::default().event("batch").data(json),
                Err(err) => Event::default().event("end").data(err.to_string()),
            },
            Ok(Err(err)) => Event::default().event("end").data(err.to_string()),
            // The head ended the feed (cut off, not leader, history expired): the page says
            // why and lists again.
            Err(status) => Event::default().event("end").data(format!(
                "{:?}: {}",
                status.code(),
                status.message()
            )),
        };
        Ok(event)
    });
    // The feed ends when the token that opened it is revoked (or, for a task's credential,
    // when its attempt ends), as a gRPC Watch does.
    let guard = match crate::auth::bearer(&headers) {
        Ok(token) if d.enforce => Some(Revalidation::new(
            Arc::clone(&d.keys),
            token,
            Some(Arc::new(d.svc.owner.clone())),
        )),
        _ => None,
    };
    let events: Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> = match guard {
        Some(guard) => Box::pin(GuardedStream::new(events, guard, |status: Status| {
            Ok(Event::default().event("end").data(format!(
                "{:?}: {}",
                status.code(),
                status.message()
            )))
        })),
        None => Box::pin(events),
    };
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// A batch as the page reads it: each event with its kind and its one-line description.
fn batch_json(batch: &WatchBatch) -> Result<String, serde_json::Error> {
    let events: Vec<serde_json::Value> = batch
        .events
        .iter()
        .map(|e| {
            serde_json::json!({
                "revision": e.revision,
                "at_ms": e.at_ms,
                "kind": e.event.kind().as_str(),
                "text": e.event.to_string(),
                "event": e.event,
            })
        })
        .collect();
    serde_json::to_string(&serde_json::json!({ "revision": batch.revision, "events": events }))
}

/// One reservation: its name and the tasks holding its bundles.
#[derive(Debug, Serialize)]
struct ReservationView {
    name: String,
    holders: Vec<TaskSummary>,
}

/// The newest tasks (a page of 500) that the caller sees and that carry task label `label`,
/// each with its description (its spec's labels and kind); a task evicted between the list and
/// its description is left out.
async fn labelled_tasks(
    d: &Dashboard,
    headers: &HeaderMap,
    label: &str,
) -> Result<Vec<(TaskSummary, TaskInfo)>, ApiError> {
    let query = ListTasksRequest {
        labels: vec![(label.to_string(), None)],
        limit: MAX_TASK_ROWS,
        newest_first: true,
        ..ListTasksRequest::default()
    };
    let request = d
        .call("ListTasks", headers, wire::ListTasksRequest::from(query))
        .await?;
    let listed: ListTasksReply = domain(d.svc.list_tasks(request).await?)?;
    let mut described = Vec::with_capacity(listed.tasks.len());
    for task in listed.tasks {
        let message = wire::DescribeTaskRequest::from(task.id);
        let request = d.call("DescribeTask", headers, message).await?;
        match d.svc.describe_task(request).await {
            Ok(reply) => described.push((task, domain(reply)?)),
            // Evicted between the two reads.
            Err(status) if status.code() == Code::NotFound => continue,
            Err(status) => return Err(status.into()),
        }
    }
    Ok(described)
}

/// The reservations whose holders the caller sees: the tasks labelled with a reservation,
/// grouped by it (each holder described once to read its label; a page of 500 holders).
async fn reservations(
    State(d): State<Dashboard>,
    headers: HeaderMap,
) -> ApiResult<Vec<ReservationView>> {
    let mut by_name: BTreeMap<String, Vec<TaskSummary>> = BTreeMap::new();
    for (holder, info) in labelled_tasks(&d, &headers, RESERVATION_LABEL).await? {
        if let Some(name) = info.spec.labels.get(RESERVATION_LABEL) {
            by_name.entry(name.to_string()).or_default().push(holder);
        }
    }
    let mut views: Vec<ReservationView> = by_name
        .into_iter()
        .map(|(name, mut holders)| {
            holders.sort_by_key(|t| t.id);
            ReservationView { name, holders }
        })
        .collect();
    // Newest first, like the task table.
    views.sort_by_key(|v| std::cmp::Reverse(v.holders.first().map(|t| t.id)));
    Ok(Json(views))
}

/// One actor: its task's summary (state, node, resources, why), and what is an actor's own.
#[derive(Debug, Serialize)]
struct ActorRow {
    /// Its task, as the task table shows it.
    task: TaskSummary,
    /// Its class, as a worker registered it.
    class: String,
    /// Its name, if it has one.
    actor_name: Option<String>,
    /// The incarnation that runs or ran last (its task's attempt; 0 before it was placed).
    incarnation: u32,
    /// How many times it was restarted.
    restarts: u32,
    /// How many calls wait at its running incarnation, as its worker's last heartbeat to this
    /// replica said (none on a replica that does not lead, or for an actor not running).
    pending_calls: Option<u64>,
}

/// The actors the caller sees, newest first (a page of 500; each described once to read its
/// class and name).
async fn actors(State(d): State<Dashboard>, headers: HeaderMap) -> ApiResult<Vec<ActorRow>> {
    let listed = labelled_tasks(&d, &headers, ACTOR_LABEL).await?;
    let mut rows = Vec::with_capacity(listed.len());
    for (task, info) in listed {
        let actor_name = match &info.spec.kind {
            escher_proto::types::TaskKind::Actor(actor) => actor.name.clone(),
            _ => None,
        };
        let pending_calls = match (task.state, task.node) {
            (TaskState::Running, Some(node)) => {
                d.svc.actor_calls.pending(node, task.id, task.attempt)
            }
            _ => None,
        };
        rows.push(ActorRow {
            class: info.spec.labels.get(ACTOR_LABEL).unwrap_or("").to_string(),
            actor_name,
            incarnation: task.attempt,
            restarts: task.attempt.saturating_sub(1),
            pending_calls,
            task,
        });
    }
    Ok(Json(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_filters_parse_and_bad_ones_say_which() {
        let query = TasksQuery {
            state: Some("running".into()),
            labels: Some("team=ml, gpu".into()),
            node: Some("node-3".into()),
            limit: Some(10_000),
            ..TasksQuery::default()
        };
        let request = query.request().unwrap();
        assert_eq!(request.state, Some(TaskState::Running));
        assert_eq!(
            request.labels,
            [
                ("team".to_string(), Some("ml".to_string())),
                ("gpu".to_string(), None)
            ]
        );
        assert_eq!(request.node, Some(NodeId(3)));
        assert_eq!(request.limit, MAX_TASK_ROWS);
        assert!(request.newest_first);

        let bad = TasksQuery {
            state: Some("sleeping".into()),
            ..TasksQuery::default()
        };
        let err = bad.request().unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains("state \"sleeping\""),
            "{}",
            err.message()
        );
        let bad = TasksQuery {
            labels: Some("=x".into()),
            ..TasksQuery::default()
        };
        assert!(bad.request().unwrap_err().message().contains("KEY=VALUE"));
    }

    #[test]
    fn service_errors_keep_their_message_and_map_to_http() {
        let response = ApiError(Status::permission_denied("needs an app token")).into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let response = ApiError(Status::unauthenticated("no token")).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
}
