//! [`Client`]: the async connection to the head, and how it is configured.
//!
//! A `Client` holds one tonic [`Channel`] per head replica (an HTTP/2 connection that
//! multiplexes every call), so it is cheap to clone and safe to share between tasks. A head
//! is a list of replicas (`http://h1:7600,http://h2:7600,http://h3:7600`; one URL for a head
//! that is not replicated): every call goes to the one believed to lead and follows the leader
//! through elections (`heads.rs`), and every write carries an idempotency key, so that a retry
//! is never applied twice. What the client sends on behalf of the application is configured
//! here: the head URLs, the application [`Namespace`] (sent with `Submit` and `SetResources`;
//! the head qualifies unqualified resource names with it; an `app` token's own namespace wins),
//! the token, the calling task (whose credential `NodeSpec::Local` needs), and whether reads
//! may be stale.
//!
//! The RPC methods live next door: task methods in `tasks.rs`, resource and cluster methods in
//! `resources.rs`, the head group's in `heads_api.rs`.
//!
//! Environment: [`Client::from_env`] reads `ESCHER_HEAD` and `ESCHER_NAMESPACE`, and every
//! constructor reads `ESCHER_TASK_ID` and `ESCHER_TASK_TOKEN`, which workers set for the
//! command tasks they run, so that a program started as a task calls with its task's
//! credential and can use `set_resource(.., NodeSpec::Local)`. Every call carries the
//! client's token ([`Credentials`]: found with no flag on the head's machine).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use escher_proto::types::{KeyIssuer, RequestKey, Ticket};
use escher_proto::{Namespace, ResourceSet, TaskId};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::ClientError;
use crate::credentials::Credentials;
use crate::heads::{Answer, ClusterRpc, Heads, answer};
use crate::retry::{Answered, Retry, Step};
use crate::{resource_updates, results, submissions};

/// The head URL used when neither `--head` nor `ESCHER_HEAD` says otherwise.
pub const DEFAULT_HEAD_URL: &str = "http://127.0.0.1:7600";
/// The environment variable that holds the head URL (or the comma-separated URLs of every
/// replica of a replicated head).
pub const ENV_HEAD: &str = "ESCHER_HEAD";
/// The environment variable that holds the application namespace.
pub const ENV_NAMESPACE: &str = "ESCHER_NAMESPACE";
/// The environment variable in which a worker passes a command task its own task id.
pub const ENV_TASK_ID: &str = "ESCHER_TASK_ID";

/// The largest message the client sends or accepts (big batches, big results).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long one `Wait` call may block on the head before the client asks again.
const DEFAULT_WAIT_SLICE: Duration = Duration::from_secs(30);
/// How long a call keeps looking for a leader (through an election, a replica that died).
pub const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a call waits on a replica that went silent (frozen, its machine gone, the network
/// cut) before the call fails and goes to the next replica: the connection's HTTP/2 keep-alive
/// interval and ping timeout (`escher_proto::replicas`). The deterministic simulation's clients
/// wait this long for an answer.
pub const SILENT_REPLICA_TIMEOUT: Duration = escher_proto::replicas::KEEP_ALIVE_INTERVAL
    .saturating_add(escher_proto::replicas::KEEP_ALIVE_TIMEOUT);
/// The request metadata with which a read accepts a possibly stale answer.
const READ_METADATA: &str = "escher-read";

/// The error for `NodeSpec::Local` outside a running task.
pub(crate) const LOCAL_OUTSIDE_TASK: &str =
    "a local target (--local) is only valid inside a running task (ESCHER_TASK_ID is not set)";

/// A connection to an escher head (every replica of a replicated one). Cheap to clone; every
/// clone shares the connections, the choice of leader and the idempotency keys.
#[derive(Debug, Clone)]
pub struct Client {
    heads: Heads,
    /// The head URLs as given.
    url: Arc<str>,
    keys: KeyIssuer,
    namespace: Option<Namespace>,
    caller: Caller,
    wait_slice: Duration,
    failover: Duration,
    stale_reads: bool,
    /// What a task built here that names no resources requests, instead of `cpu=1`.
    default_resources: Option<Arc<ResourceSet>>,
    /// The caller's object session this client puts into and labels its tasks with, when it
    /// speaks for a task ([`Client::within_object_session`]).
    caller_session: Option<crate::objects::CallerSession>,
    /// The background tasks that carry concurrent calls together, each started on first use.
    background: Arc<Background>,
}

/// A client's background tasks: where its calls queue for them.
#[derive(Debug, Default)]
struct Background {
    /// The submission stream, and the coalescing of concurrent `submit` calls.
    submitter: OnceLock<mpsc::UnboundedSender<submissions::Job>>,
    /// The coalescing of concurrent single resource updates.
    updater: OnceLock<mpsc::UnboundedSender<resource_updates::Job>>,
    /// The result stream that `get`s wait on.
    waiter: OnceLock<mpsc::UnboundedSender<results::Job>>,
    /// The object session, the next object index and the release queue (`objects/refs.rs`).
    puts: OnceLock<crate::objects::Puts>,
}

/// Which running task (if any) this client speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// None: a program outside the cluster.
    Unset,
    /// This task.
    Task(TaskId),
    /// `ESCHER_TASK_ID` held text that is not a task id.
    Invalid(String),
}

impl Caller {
    /// The task, or the error that explains why `NodeSpec::Local` cannot be used.
    fn require(&self) -> Result<TaskId, ClientError> {
        match self {
            Caller::Task(id) => Ok(*id),
            Caller::Unset => Err(ClientError::Usage(LOCAL_OUTSIDE_TASK.to_string())),
            Caller::Invalid(text) => Err(ClientError::Usage(format!(
                "a local target (--local) is only valid inside a running task ({ENV_TASK_ID}={text:?} is \
                 not a task id)"
            ))),
        }
    }

    fn from_env() -> Caller {
        match std::env::var(ENV_TASK_ID) {
            Err(_) => Caller::Unset,
            Ok(text) if text.trim().is_empty() => Caller::Unset,
            Ok(text) => match text.parse() {
                Ok(id) => Caller::Task(id),
                Err(_) => Caller::Invalid(text),
            },
        }
    }
}

impl Client {
    /// Connects to the head at `url` (`http://HOST:PORT`; a bare `HOST:PORT` means `http://`),
    /// failing with [`ClientError::Connect`] if it cannot be reached within 5 seconds. For a
    /// replicated head, `url` lists every replica, comma-separated; connecting needs one of
    /// them to answer.
    pub async fn connect(url: impl AsRef<str>) -> Result<Client, ClientError> {
        let heads = Heads::connect(url.as_ref(), None).await?;
        Ok(Client::with_heads(heads))
    }

    /// [`Client::connect`] with these credentials instead of those it would find.
    pub async fn connect_with(
        url: impl AsRef<str>,
        credentials: Credentials,
    ) -> Result<Client, ClientError> {
        let heads = Heads::connect(url.as_ref(), Some(credentials)).await?;
        Ok(Client::with_heads(heads))
    }

    /// A client for the head at `url` (or the replicas listed in it) that connects on its
    /// first call (and reconnects after a failure) instead of now. Must be called inside a
    /// tokio runtime.
    pub fn connect_lazy(url: impl AsRef<str>) -> Result<Client, ClientError> {
        let heads = Heads::lazy(url.as_ref(), None)?;
        Ok(Client::with_heads(heads))
    }

    /// Connects to the head named by `ESCHER_HEAD` (else [`DEFAULT_HEAD_URL`]), in the
    /// namespace named by `ESCHER_NAMESPACE` if set.
    pub async fn from_env() -> Result<Client, ClientError> {
        let url = std::env::var(ENV_HEAD)
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_HEAD_URL.to_string());
        let namespace = match std::env::var(ENV_NAMESPACE) {
            Ok(ns) if !ns.trim().is_empty() => Some(Namespace::new(ns.trim())?),
            _ => None,
        };
        let client = Client::connect(url).await?;
        Ok(match namespace {
            Some(ns) => client.with_namespace(ns),
            None => client,
        })
    }

    /// A client over an existing channel (for example one built with custom TLS or
    /// interceptors); `url` is only used in error messages.
    pub fn from_channel(channel: Channel, url: impl Into<String>) -> Client {
        let url = url.into();
        Client::with_heads(Heads::single(channel, &url))
    }

    fn with_heads(heads: Heads) -> Client {
        Client {
            url: Arc::from(heads.urls().join(",").as_str()),
            heads,
            keys: KeyIssuer::new(
                getrandom::u64().expect("the operating system's random number generator failed"),
            ),
            namespace: None,
            caller: Caller::from_env(),
            wait_slice: DEFAULT_WAIT_SLICE,
            failover: DEFAULT_FAILOVER_TIMEOUT,
            stale_reads: false,
            default_resources: None,
            caller_session: None,
            background: Arc::default(),
        }
    }

    /// The same client, whose command and function tasks that name no resources request
    /// `set` instead of [`DEFAULT_RESOURCES`](crate::DEFAULT_RESOURCES) (`cpu=1`); an empty
    /// set makes them request nothing. Finished specs are sent as they are.
    pub fn with_default_resources(mut self, set: ResourceSet) -> Client {
        self.default_resources = Some(Arc::new(set));
        self
    }

    /// What this client's tasks that name no resources request, if not `cpu=1`.
    pub(crate) fn default_resources(&self) -> Option<&ResourceSet> {
        self.default_resources.as_deref()
    }

    /// The same connection, submitting tasks and setting resources in namespace `ns`: the head
    /// qualifies unqualified application resource names as `ns/name`.
    pub fn with_namespace(mut self, ns: Namespace) -> Client {
        self.namespace = Some(ns);
        self.detached()
    }

    /// The same client with background tasks of its own (submits, updates and waits of
    /// different namespaces, callers or credentials must not travel together).
    pub(crate) fn detached(mut self) -> Client {
        self.background = Arc::default();
        self
    }

    /// This client's submitter (see `submissions.rs`), started on first use.
    pub(crate) fn submitter(&self) -> &mpsc::UnboundedSender<submissions::Job> {
        self.background
            .submitter
            .get_or_init(|| submissions::start(self.clone().detached()))
    }

    /// This client's updater (see `resource_updates.rs`), started on first use.
    pub(crate) fn updater(&self) -> &mpsc::UnboundedSender<resource_updates::Job> {
        self.background
            .updater
            .get_or_init(|| resource_updates::start(self.clone().detached()))
    }

    /// Whether this client's submitter and waiter run (it submitted and waited before).
    pub(crate) fn streams_started(&self) -> bool {
        self.background.submitter.get().is_some() && self.background.waiter.get().is_some()
    }

    /// Starts this client's submitter and waiter (each opens its stream with its first job).
    pub(crate) fn start_streams(&self) {
        self.submitter();
        self.waiter();
    }

    /// This client's objects (see `objects/refs.rs`), their release task started on first use.
    pub(crate) fn puts(&self) -> &crate::objects::Puts {
        self.background
            .puts
            .get_or_init(|| crate::objects::Puts::start(self.clone().detached()))
    }

    /// This client's objects, if it ever put one.
    pub(crate) fn puts_started(&self) -> Option<&crate::objects::Puts> {
        self.background.puts.get()
    }

    /// The caller's object session this client puts into, if it speaks for a task
    /// ([`Client::within_object_session`]).
    pub(crate) fn caller_session(&self) -> Option<crate::objects::CallerSession> {
        self.caller_session
    }

    /// The same connection, speaking for attempt `attempt` of task `task`, which its caller
    /// submitted under object session `session` (the task's `escher.object-session` label):
    /// the objects it puts belong to that session, with indexes of their own (a range
    /// [`CallerSession`](crate::objects::CallerSession) derives from the task and the
    /// attempt), and the tasks it submits carry the same label. So a reference the task
    /// returns (a `put` of its own that it hands over with [`ObjectRef::disown`]) outlives the
    /// task and this client: it goes when the caller that reads it releases it, or when the
    /// caller's session ends. This client neither renews nor closes that session (the caller
    /// does). Past its range (about a million puts, or a task id or attempt too large for
    /// one), it puts into a session of its own, as a client without this does.
    ///
    /// [`ObjectRef::disown`]: crate::ObjectRef::disown
    pub fn within_object_session(mut self, session: u64, task: TaskId, attempt: u32) -> Client {
        self.caller_session = crate::objects::CallerSession::of_task(session, task, attempt);
        self.detached()
    }

    /// This client's waiter (see `results.rs`), started on first use.
    pub(crate) fn waiter(&self) -> &mpsc::UnboundedSender<results::Job> {
        self.background
            .waiter
            .get_or_init(|| results::start(self.clone().detached()))
    }

    /// The same connection, calling with `token` instead of the one it found (see
    /// [`Credentials`]).
    pub fn with_token(self, token: impl Into<String>) -> Client {
        self.with_token_from(token, "the token given to the client")
    }

    /// [`Client::with_token`], saying where the token came from (for messages); the
    /// certificate trusted for `https://` heads stays the same.
    pub fn with_token_from(self, token: impl Into<String>, source: &str) -> Client {
        let credentials = self.credentials().with_token(token, source);
        self.with_credentials(credentials)
    }

    /// The same connection, calling with `credentials`.
    pub fn with_credentials(mut self, credentials: Credentials) -> Client {
        self.heads = self.heads.with_credentials(credentials);
        self.detached()
    }

    /// The credentials this client calls with, and where they came from.
    pub fn credentials(&self) -> &Credentials {
        self.heads.credentials()
    }

    /// The same connection, speaking for running task `id`, so that `NodeSpec::Local` means
    /// that task's node. (Inside a command task this is read from `ESCHER_TASK_ID`.)
    pub fn with_caller_task(mut self, id: TaskId) -> Client {
        self.caller = Caller::Task(id);
        self.detached()
    }

    /// The same connection, speaking for no task (`NodeSpec::Local` is then refused).
    pub fn without_caller_task(mut self) -> Client {
        self.caller = Caller::Unset;
        self.detached()
    }

    /// The same connection, with each `Wait` call to the head blocking at most `slice`
    /// (30 s by default); longer waits are made of several calls, so that no single call
    /// hangs on a head that went away.
    pub fn with_wait_slice(mut self, slice: Duration) -> Client {
        self.wait_slice = slice.max(Duration::from_millis(1));
        self
    }

    /// The same client, looking for a leader for at most `timeout` per call (through an
    /// election, or a replica that went away) before it gives up with
    /// [`ClientError::Unavailable`] (15 s by default).
    pub fn with_failover_timeout(mut self, timeout: Duration) -> Client {
        self.failover = timeout;
        self
    }

    /// The same client, whose next write is sent under the idempotency key `key` (`CLIENT-SEQ`,
    /// as [`ClientError::UnknownOutcome`] prints it) and later ones under the keys that follow
    /// it: a write whose outcome was unknown, retried so, is applied at most once. The result
    /// shares the connections but not the keys or the background streams of `self`.
    pub fn with_idempotency_key(mut self, key: &str) -> Result<Client, ClientError> {
        self.keys = KeyIssuer::resuming(key).map_err(ClientError::Usage)?;
        self.background = Arc::default();
        Ok(self)
    }

    /// The same client, whose reads (`get`, `wait`, `describe`, `list_tasks`, `cluster_status`,
    /// `gpus`) accept a possibly stale answer from any replica instead of a linearizable one
    /// from the leader. Writes always go to the leader.
    pub fn with_stale_reads(mut self, stale: bool) -> Client {
        self.stale_reads = stale;
        self
    }

    /// Whether this client accepts stale reads.
    pub(crate) fn stale_reads(&self) -> bool {
        self.stale_reads
    }

    /// The head URLs, comma-separated (one for a head that is not replicated).
    pub fn head_url(&self) -> &str {
        &self.url
    }

    /// The URL of the head replica this client believes leads.
    pub fn leader_url(&self) -> String {
        self.heads.current().1.to_string()
    }

    /// The application namespace, if any.
    pub fn namespace(&self) -> Option<&Namespace> {
        self.namespace.as_ref()
    }

    /// The running task this client speaks for, if any.
    pub fn caller_task(&self) -> Option<TaskId> {
        match self.caller {
            Caller::Task(id) => Some(id),
            _ => None,
        }
    }

    /// The caller task, or the error that explains why `NodeSpec::Local` cannot be used.
    pub(crate) fn require_caller(&self) -> Result<TaskId, ClientError> {
        self.caller.require()
    }

    /// The key of a new write, held for all its attempts.
    pub(crate) fn ticket(&self) -> Ticket {
        self.keys.issue()
    }

    /// A read request, marked stale if this client accepts stale reads.
    pub(crate) fn read<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if self.stale_reads {
            request.metadata_mut().insert(
                READ_METADATA,
                tonic::metadata::MetadataValue::from_static("stale"),
            );
        }
        request
    }

    /// Runs one call against the leader, following it through elections and leader changes
    /// (see `heads.rs`): `call` is made again, with the same request, until it gets an answer
    /// that is not "not leader" (or the failover timeout passes).
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnMut(ClusterRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with(call, &mut self.retry()).await
    }

    /// [`call`](Self::call) for a write under idempotency key `key`: a failure after any
    /// attempt that may have reached a replica (`sent` says whether one already did, on a
    /// stream, before this call) is [`ClientError::UnknownOutcome`], never a plain failure, so
    /// that no caller takes an applied write for a failed one and submits it again under a
    /// new key (`retry.rs`: [`Retry::outcome`]).
    pub(crate) async fn call_write<T, F, Fut>(
        &self,
        call_name: &'static str,
        key: Option<RequestKey>,
        sent: bool,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(ClusterRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut retry = self.retry();
        if sent {
            retry = retry.already_sent();
        }
        self.call_with(call, &mut retry)
            .await
            .map_err(|error| retry.outcome(call_name, key, error))
    }

    /// The retry rules of a new call (its time counted from when its loop starts).
    fn retry(&self) -> Retry<String> {
        Retry::new(self.url.to_string(), self.failover, Duration::ZERO)
    }

    /// The loop of [`call`](Self::call): each failed attempt's status, read as an [`Answered`],
    /// goes to `retry` (`retry.rs`), which says whether to follow a named leader, pause and try
    /// the next replica, or give up with which error.
    async fn call_with<T, F, Fut>(
        &self,
        mut call: F,
        retry: &mut Retry<String>,
    ) -> Result<T, ClientError>
    where
        F: FnMut(ClusterRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let origin = tokio::time::Instant::now();
        loop {
            let (rpc, url) = self.rpc();
            let status = match call(rpc).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) => status,
            };
            let replica = url.trim_end_matches('/').to_string();
            let answered = answered(&status);
            match retry.step(replica, answered, origin.elapsed(), self.heads.len()) {
                Step::Follow(leader) => {
                    tracing::debug!(from = %url, to = %leader, "following the head group's leader");
                    self.heads.follow(&leader);
                }
                Step::Next(pause) => {
                    self.heads.rotate();
                    tokio::time::sleep(pause).await;
                }
                Step::Unavailable { message } => return Err(retry.unavailable(message)),
                Step::Fail => {
                    let error = ClientError::from_status(status, &url);
                    return Err(error.with_credentials(self.heads.credentials()));
                }
            }
        }
    }

    /// Believes the next replica leads (the one believed to lead does not answer).
    pub(crate) fn rotate(&self) {
        self.heads.rotate();
    }

    /// A client of the replica believed to lead, and its URL.
    pub(crate) fn rpc(&self) -> (ClusterRpc, Arc<str>) {
        let (rpc, url) = self.heads.current();
        let rpc = rpc
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        (rpc, url)
    }

    /// The client error for a status the replica believed to lead answered.
    pub(crate) fn error_from(&self, status: tonic::Status) -> ClientError {
        let (_, url) = self.heads.current();
        ClientError::from_status(status, &url).with_credentials(self.heads.credentials())
    }

    /// How long a call keeps trying to reach a leader.
    pub(crate) fn failover_timeout(&self) -> Duration {
        self.failover
    }

    /// The longest single `Wait` call.
    pub(crate) fn wait_slice(&self) -> Duration {
        self.wait_slice
    }

    /// Refuses a request larger than [`MAX_MESSAGE_BYTES`] before it is sent: tonic would fail
    /// it while streaming the body, and the caller would see only an HTTP/2 reset.
    pub(crate) fn check_size(
        &self,
        call: &'static str,
        request: &impl prost::Message,
    ) -> Result<(), ClientError> {
        let size = request.encoded_len();
        if size > MAX_MESSAGE_BYTES {
            return Err(ClientError::MessageTooLarge {
                call,
                size,
                limit: MAX_MESSAGE_BYTES,
            });
        }
        Ok(())
    }
}

/// The task id in `ESCHER_TASK_ID`, or the error a `NodeSpec::Local` update would get: lets
/// a tool refuse such an update before it connects.
pub fn caller_task_from_env() -> Result<TaskId, ClientError> {
    Caller::from_env().require()
}

/// What a failed call's status tells the retry rules (`retry.rs`; public there as
/// [`crate::retry::answered`]).
pub(crate) fn answered(status: &tonic::Status) -> Answered<String> {
    if escher_proto::replicas::may_still_commit(status) {
        let leader = match answer(status) {
            Answer::Leader(leader) => Some(leader.trim_end_matches('/').to_string()),
            _ => None,
        };
        return Answered::MayStillCommit { leader };
    }
    match answer(status) {
        Answer::Leader(leader) => Answered::Leader(leader.trim_end_matches('/').to_string()),
        Answer::NoLeader => Answered::NoLeader,
        // A replica stopping gracefully refuses what it will not process (an HTTP/2 GOAWAY,
        // which tonic reports as INTERNAL); another may lead, or will once it has handed over.
        Answer::Other if crate::error::going_away(status) => Answered::GoingAway,
        Answer::Other => {
            let sent = !crate::error::never_sent(status);
            match status.code() {
                // A replica down, or a connection cut mid-call (tonic reports some of those as
                // UNKNOWN, and a connection a killed replica closed as CANCELLED): another
                // replica may lead. Writes carry their key, so a retry of one that was applied
                // gets its recorded reply.
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                    Answered::Unreachable {
                        sent,
                        what: format!("{:?}: {}", status.code(), status.message()),
                    }
                }
                // Not retried, but the request may have been processed.
                tonic::Code::DeadlineExceeded | tonic::Code::Internal => Answered::Failed { sent },
                _ => Answered::Failed { sent: false },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_the_replica_proposed_and_could_not_answer_for_may_still_commit() {
        let mut status = tonic::Status::unavailable("not the leader");
        status.metadata_mut().insert(
            escher_proto::replicas::LEADER_METADATA,
            "http://b:1/".parse().unwrap(),
        );
        assert_eq!(answered(&status), Answered::Leader("http://b:1".into()));
        status.metadata_mut().insert(
            escher_proto::replicas::OUTCOME_METADATA,
            escher_proto::replicas::MAY_STILL_COMMIT.parse().unwrap(),
        );
        assert_eq!(
            answered(&status),
            Answered::MayStillCommit {
                leader: Some("http://b:1".into())
            }
        );
    }

    #[tokio::test]
    async fn urls_are_normalised_and_checked() {
        let c = Client::connect_lazy("127.0.0.1:7600").unwrap();
        assert_eq!(c.heads.urls(), vec!["http://127.0.0.1:7600"]);
        let err = Client::connect_lazy("http://bad host:1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid head URL"), "{err}");
    }

    #[tokio::test]
    async fn configuration_is_kept_on_the_handle() {
        let c = Client::connect_lazy("127.0.0.1:1")
            .unwrap()
            .with_namespace(Namespace::new("app").unwrap())
            .with_caller_task(TaskId(5))
            .with_wait_slice(Duration::ZERO);
        assert_eq!(c.head_url(), "http://127.0.0.1:1");
        assert_eq!(c.namespace().map(Namespace::as_str), Some("app"));
        assert_eq!(c.caller_task(), Some(TaskId(5)));
        assert_eq!(c.require_caller().unwrap(), TaskId(5));
        assert_eq!(c.wait_slice(), Duration::from_millis(1));
        let c = c.without_caller_task();
        assert_eq!(c.caller_task(), None);
        assert_eq!(
            c.require_caller().unwrap_err().to_string(),
            LOCAL_OUTSIDE_TASK
        );
    }

    #[tokio::test]
    async fn unreachable_heads_say_how_to_fix_it() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let err = Client::connect("http://127.0.0.1:1").await.unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("http://127.0.0.1:1"), "{text}");
        assert!(text.contains("set --head or ESCHER_HEAD"), "{text}");
        assert!(err.is_retryable());
    }
}
