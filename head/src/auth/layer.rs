//! [`AuthLayer`]: the one place where every call is authenticated and its method allowed, and
//! where a task credential is refused once its attempt no longer runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;

use super::revoke::{self, GuardedBody, RecheckedRequest, Revalidation};
use super::{Caller, Keys, RunningAttempts, check_attempt};

/// What the layer tells of every call, as it passes (the runtime's metrics count them): the
/// layer sits below the runtime and knows it only through this.
pub trait CallObserver: Send + Sync + std::fmt::Debug {
    /// A call to `path` (`/escher.v1.Cluster/Submit`) arrived.
    fn request(&self, path: &str);
    /// A call to `path` was answered with `code` (not OK) at once: refused here, or by its
    /// handler before any reply.
    fn error(&self, path: &str, code: tonic::Code);
}

/// Which callers a method admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Admins only (tokens, MIG, heads, draining).
    Admin,
    /// The group's replicas, talking to each other (the peer token): no one else, not even an
    /// admin, may send raft messages.
    Peer,
    /// Those that own tasks and resources: admin, app, task.
    Write,
    /// Status readers: admin, app, task, reader.
    Status,
    /// Workers joining: admin or the join token.
    Join,
}

impl Need {
    fn admits(self, caller: &Caller) -> bool {
        matches!(
            (self, caller),
            (
                Need::Admin | Need::Write | Need::Status | Need::Join,
                Caller::Admin
            ) | (Need::Peer, Caller::Peer)
                | (Need::Write, Caller::App(_) | Caller::Task { .. })
                | (
                    Need::Status,
                    Caller::App(_) | Caller::Task { .. } | Caller::Reader
                )
                | (Need::Join, Caller::Worker)
        )
    }

    fn who(self) -> &'static str {
        match self {
            Need::Admin => "an admin token",
            Need::Write => "an admin or app token (or a running task's credential)",
            Need::Status => "an admin, app or reader token",
            Need::Join => "the worker join token (or an admin token)",
            Need::Peer => "the replicas' peer token (only a replica of this group has it)",
        }
    }
}

/// The largest request a status read (`ClusterStatus`, `Gpus`, `Heads`), or any call of a
/// reader token, may send: these requests are a few bytes, so nothing larger is honest.
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;
/// The largest worker registration: a node's resources, labels and GPUs.
pub const REGISTER_REQUEST_BYTES: usize = 1024 * 1024;

/// The request size a call may send, by what it is and who sends it; `None` where only the
/// head's `--max-message-bytes` applies (writes, worker streams, replicas).
fn request_limit(path: &str, need: Need, caller: &Caller) -> Option<usize> {
    if need == Need::Status || matches!(caller, Caller::Reader) {
        return Some(SMALL_REQUEST_BYTES);
    }
    path.ends_with("/Register")
        .then_some(REGISTER_REQUEST_BYTES)
}

/// What the method at `path` (`/escher.v1.Cluster/Submit`) needs; `None` for a method this
/// table does not know, which is refused.
pub fn need(path: &str) -> Option<Need> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(match (service, method) {
        (
            "escher.v1.Cluster",
            "Submit" | "SubmitStream" | "Run" | "Wait" | "WaitStream" | "Cancel" | "Requeue"
            | "DescribeTask" | "ListTasks" | "SetResources" | "TaskLogs" | "Reserve"
            | "ReportTelemetry" | "Telemetry" | "ResolveActor" | "PlaceObject" | "ObjectsSealed"
            | "ReleaseObjects" | "LocateObject" | "ListObjects" | "ReportPolicy"
            | "OpenObjectSession" | "RenewObjectSession" | "CloseObjectSession",
        ) => Need::Write,
        (
            "escher.v1.Cluster",
            "ClusterStatus" | "Gpus" | "Heads" | "Watch" | "DashboardTicket" | "Policies",
        ) => Need::Status,
        (
            "escher.v1.Cluster",
            "ApplyMigLayout" | "ChangeHeads" | "CreateToken" | "ListTokens" | "RevokeToken"
            | "Drain" | "LabelNode" | "Backup" | "RecordDecision",
        ) => Need::Admin,
        ("escher.v1.WorkerLink", "Register" | "Attach") => Need::Join,
        ("escher.v1.Raft", "Send" | "Status") => Need::Peer,
        // Served by workers, not by the head: a call stream carries the data ticket the head
        // signed for it (`ResolveActor`, itself `Write`), which the worker checks.
        ("escher.v1.Actors", "Calls") => Need::Write,
        // Served by workers too: each request carries the object ticket the head signed for it
        // (`PlaceObject` for a push or a handover, `LocateObject` for a fetch or a map,
        // themselves `Write`), which the worker checks.
        ("escher.v1.Objects", "Fetch" | "Push" | "Handover" | "Map") => Need::Write,
        _ => return None,
    })
}

/// Authenticates every request by its bearer token and refuses methods the caller's role may
/// not call, and calls by a task credential whose attempt no longer runs; puts the [`Caller`]
/// in the request's extensions for the handler.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    keys: Arc<Keys>,
    enforce: bool,
    attempts: Option<Arc<dyn RunningAttempts>>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl AuthLayer {
    /// A layer checking against `keys`, asking `attempts` whether a task credential's attempt
    /// still runs.
    pub fn new(keys: Arc<Keys>, attempts: Arc<dyn RunningAttempts>) -> AuthLayer {
        AuthLayer {
            keys,
            enforce: true,
            attempts: Some(attempts),
            observer: None,
        }
    }

    /// Tells `observer` of every call.
    pub fn observed(mut self, observer: Arc<dyn CallObserver>) -> AuthLayer {
        self.observer = Some(observer);
        self
    }

    /// A layer that takes every caller for an admin: only to measure what checking costs
    /// (`HeadConfig::authenticate`).
    pub fn open(keys: Arc<Keys>) -> AuthLayer {
        AuthLayer {
            keys,
            enforce: false,
            attempts: None,
            observer: None,
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            keys: Arc::clone(&self.keys),
            enforce: self.enforce,
            attempts: self.attempts.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the head's routes.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    keys: Arc<Keys>,
    enforce: bool,
    attempts: Option<Arc<dyn RunningAttempts>>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl<S> Auth<S> {
    /// The caller, and the request size its call may send (see [`request_limit`]).
    fn check(
        &self,
        path: &str,
        headers: &http::HeaderMap,
    ) -> Result<(Caller, Option<usize>), Status> {
        authorize(&self.keys, self.enforce, path, headers)
    }
}

/// Who calls the method at `path` with `headers`, if the method admits them, and the request
/// size the call may send (see [`request_limit`]); with `enforce` off, an admin. The gRPC
/// routes, the metrics endpoint and the dashboard all decide here.
pub(crate) fn authorize(
    keys: &Keys,
    enforce: bool,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<(Caller, Option<usize>), Status> {
    if !enforce {
        return Ok((Caller::Admin, None));
    }
    let Some(need) = need(path) else {
        return Err(Status::permission_denied(format!(
            "{path} is not a method this head serves"
        )));
    };
    let token = bearer(headers)?;
    let caller = keys.authenticate(token)?;
    if !need.admits(&caller) {
        let method = path.rsplit('/').next().unwrap_or(path);
        return Err(Status::permission_denied(format!(
            "{method} needs {}; the call carried {}",
            need.who(),
            caller.describe()
        )));
    }
    let limit = request_limit(path, need, &caller);
    Ok((caller, limit))
}

/// The token of `authorization: Bearer <token>`.
pub(crate) fn bearer(headers: &http::HeaderMap) -> Result<&str, Status> {
    let missing = || {
        Status::unauthenticated(
            "this call carries no token (metadata `authorization: Bearer <token>`); the escher \
             CLI and client take one from --token or ESCHER_TOKEN, else from the access file the \
             head writes at its first start (ESCHER_ACCESS_FILE, else $ESCHER_HOME/access.json, \
             ESCHER_HOME defaulting to ~/.escher)",
        )
    };
    let value = headers
        .get(http::header::AUTHORIZATION)
        .ok_or_else(missing)?;
    let text = value.to_str().map_err(|_| missing())?;
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .ok_or_else(missing)?;
    Ok(token.trim())
}

/// tonic answers a request body it cannot decode with INTERNAL; the caller sent it, so it is
/// INVALID_ARGUMENT (the message, which says what failed to decode, is kept).
fn undecodable_is_invalid_argument(headers: &mut http::HeaderMap) {
    let internal = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"13");
    let undecodable = headers
        .get("grpc-message")
        .is_some_and(|v| v.as_bytes().starts_with(b"failed%20to%20decode"));
    if internal && undecodable {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
}

/// A request body that ends with RESOURCE_EXHAUSTED once it has carried more than its limit
/// (tonic passes that status to the caller as it is).
struct Capped {
    inner: Body,
    left: usize,
    limit: usize,
    method: String,
}

impl Capped {
    fn new(inner: Body, limit: usize, method: String) -> Capped {
        Capped {
            inner,
            left: limit,
            limit,
            method,
        }
    }
}

impl http_body::Body for Capped {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(status))) => return Poll::Ready(Some(Err(status))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let len = frame.data_ref().map_or(0, bytes::Bytes::len);
        match self.left.checked_sub(len) {
            Some(left) => {
                self.left = left;
                Poll::Ready(Some(Ok(frame)))
            }
            None => Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                "a {} request may carry at most {} bytes for this caller; this one carried more",
                self.method, self.limit
            ))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Auth<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path().to_owned();
        let observer = self.observer.clone();
        if let Some(observer) = &observer {
            observer.request(&path);
        }
        match self.check(request.uri().path(), request.headers()) {
            Ok((caller, limit)) => {
                // A task credential acts only while its attempt runs: asked of the state
                // before the handler runs (other callers pass at once).
                let check = match (&self.attempts, caller.task()) {
                    (Some(attempts), Some(_)) => Some((Arc::clone(attempts), caller.clone())),
                    _ => None,
                };
                request.extensions_mut().insert(caller);
                if self.enforce
                    && let Ok(token) = bearer(request.headers())
                {
                    let scope = super::KeyScope::of(token);
                    request.extensions_mut().insert(scope);
                }
                // A stream outlives the check above: its credential is checked again while it
                // is open (see `revoke.rs`).
                let path_now = request.uri().path();
                let token = (self.enforce && revoke::streams(path_now))
                    .then(|| bearer(request.headers()).ok().map(str::to_owned))
                    .flatten();
                let guard = token.as_deref().map(|token| {
                    Revalidation::new(Arc::clone(&self.keys), token, self.attempts.clone())
                });
                if let Some(token) = &token
                    && revoke::streams_requests(path_now)
                {
                    let keys = Arc::clone(&self.keys);
                    request =
                        request.map(|body| Body::new(RecheckedRequest::new(body, keys, token)));
                }
                if let Some(limit) = limit {
                    let method = request
                        .uri()
                        .path()
                        .rsplit('/')
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    request = request.map(|body| Body::new(Capped::new(body, limit, method)));
                }
                // The clone is ready only if polled; the ready one (self.inner) serves this call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(async move {
                    if let Some((attempts, caller)) = check
                        && let Err(status) = check_attempt(attempts.as_ref(), &caller).await
                    {
                        tracing::debug!(%path, code = ?status.code(), "call refused");
                        if let Some(observer) = &observer {
                            observer.error(&path, status.code());
                        }
                        return Ok(status.into_http());
                    }
                    let mut response = inner.call(request).await?;
                    undecodable_is_invalid_argument(response.headers_mut());
                    if let Some(guard) = guard {
                        response = response.map(|body| Body::new(GuardedBody::new(body, guard)));
                    }
                    // An error answered at once carries its status in the headers (a
                    // trailers-only response); a success, or a stream that fails later,
                    // carries it in the trailers, which are not counted.
                    if let Some(observer) = &observer
                        && let Some(code) = response.headers().get("grpc-status")
                        && code.as_bytes() != b"0"
                    {
                        let code = std::str::from_utf8(code.as_bytes()).unwrap_or("?");
                        let code = code
                            .parse::<i32>()
                            .map_or(tonic::Code::Unknown, tonic::Code::from);
                        observer.error(&path, code);
                    }
                    Ok(response)
                })
            }
            Err(status) => {
                tracing::debug!(path = %request.uri().path(), code = ?status.code(), "call refused");
                if let Some(observer) = &observer {
                    observer.error(&path, status.code());
                }
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_every_service_has_a_need() {
        let proto = include_str!("../../../proto/proto/escher.proto");
        let mut service = "";
        let mut checked = 0;
        for line in proto.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.trim_end_matches(" {").trim();
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let method = rest.split('(').next().unwrap().trim();
                let path = format!("/escher.v1.{service}/{method}");
                assert!(
                    need(&path).is_some(),
                    "{path} has no entry in the auth table"
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} methods found");
        assert_eq!(need("/escher.v1.Cluster/Nope"), None);
        assert_eq!(need("nonsense"), None);
    }

    #[test]
    fn roles_reach_what_they_need_only() {
        let app = Caller::App("a".parse().unwrap());
        assert!(Need::Write.admits(&app) && Need::Status.admits(&app));
        assert!(!Need::Admin.admits(&app) && !Need::Join.admits(&app));
        assert!(Need::Status.admits(&Caller::Reader) && !Need::Write.admits(&Caller::Reader));
        assert!(Need::Join.admits(&Caller::Worker) && !Need::Status.admits(&Caller::Worker));
        assert!(
            [Need::Admin, Need::Write, Need::Status, Need::Join]
                .iter()
                .all(|n| n.admits(&Caller::Admin))
        );
        // Raft messages: the replicas' peer token only, not even an admin's; and the peer
        // token opens nothing else.
        assert!(Need::Peer.admits(&Caller::Peer) && !Need::Peer.admits(&Caller::Admin));
        assert!(
            [Need::Admin, Need::Write, Need::Status, Need::Join]
                .iter()
                .all(|n| !n.admits(&Caller::Peer))
        );
        assert_eq!(need("/escher.v1.Raft/Send"), Some(Need::Peer));
    }
}
