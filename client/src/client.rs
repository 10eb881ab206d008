//! [`Client`]: the async connection to the head, and how it is configured.
//!
//! A `Client` wraps one tonic [`Channel`] (an HTTP/2 connection that multiplexes every call),
//! so it is cheap to clone and safe to share between tasks. What it sends on behalf of the
//! application is configured here: the head URL, the application [`Namespace`] (sent with
//! `Submit` and `SetResources`; the head qualifies unqualified resource names with it), and
//! the calling task (sent as `caller_task`, which `NodeSpec::Local` needs).
//!
//! The RPC methods live next door: task methods in `tasks.rs`, resource and cluster methods in
//! `resources.rs`.
//!
//! Environment: [`Client::from_env`] reads `ESCHER_HEAD` and `ESCHER_NAMESPACE`, and every
//! constructor reads `ESCHER_TASK_ID`, which workers set for the command tasks they run, so
//! that a program started as a task can call `set_resource(.., NodeSpec::Local)`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use escher_proto::wire::cluster_client::ClusterClient;
use escher_proto::{Namespace, TaskId};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::ClientError;
use crate::coalesce;

/// The head URL used when neither `--head` nor `ESCHER_HEAD` says otherwise.
pub const DEFAULT_HEAD_URL: &str = "http://127.0.0.1:7600";
/// The environment variable that holds the head URL.
pub const ENV_HEAD: &str = "ESCHER_HEAD";
/// The environment variable that holds the application namespace.
pub const ENV_NAMESPACE: &str = "ESCHER_NAMESPACE";
/// The environment variable in which a worker passes a command task its own task id.
pub const ENV_TASK_ID: &str = "ESCHER_TASK_ID";

/// The largest message the client sends or accepts (big batches, big results).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long one `Wait` call may block on the head before the client asks again.
const DEFAULT_WAIT_SLICE: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE: Duration = Duration::from_secs(20);

/// The error for `NodeSpec::Local` outside a running task.
pub(crate) const LOCAL_OUTSIDE_TASK: &str =
    "NodeSpec::Local is only valid inside a running task (ESCHER_TASK_ID is not set)";

/// A connection to an escher head. Cheap to clone; every clone shares the connection.
#[derive(Debug, Clone)]
pub struct Client {
    rpc: ClusterClient<Channel>,
    url: Arc<str>,
    namespace: Option<Namespace>,
    caller: Caller,
    wait_slice: Duration,
    /// The background sender that coalesces concurrent `submit` calls (started lazily).
    coalescer: Arc<OnceLock<mpsc::UnboundedSender<coalesce::Pending>>>,
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
                "NodeSpec::Local is only valid inside a running task ({ENV_TASK_ID}={text:?} is \
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
    /// failing with [`ClientError::Connect`] if it cannot be reached within 5 seconds.
    pub async fn connect(url: impl AsRef<str>) -> Result<Client, ClientError> {
        let (url, endpoint) = endpoint(url.as_ref())?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::connect(&url, &e))?;
        Ok(Client::with_channel(channel, url))
    }

    /// A client for the head at `url` that connects on its first call (and reconnects after
    /// a failure) instead of now. Must be called inside a tokio runtime.
    pub fn connect_lazy(url: impl AsRef<str>) -> Result<Client, ClientError> {
        let (url, endpoint) = endpoint(url.as_ref())?;
        Ok(Client::with_channel(endpoint.connect_lazy(), url))
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
        Client::with_channel(channel, url.into())
    }

    fn with_channel(channel: Channel, url: String) -> Client {
        let rpc = ClusterClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Client {
            rpc,
            url: Arc::from(url),
            namespace: None,
            caller: Caller::from_env(),
            wait_slice: DEFAULT_WAIT_SLICE,
            coalescer: Arc::default(),
        }
    }

    /// The same connection, submitting tasks and setting resources in namespace `ns`: the head
    /// qualifies unqualified application resource names as `ns/name`.
    pub fn with_namespace(mut self, ns: Namespace) -> Client {
        self.namespace = Some(ns);
        self.detached()
    }

    /// The same client with a coalescer of its own (submits of different namespaces or callers
    /// must not travel together).
    pub(crate) fn detached(mut self) -> Client {
        self.coalescer = Arc::default();
        self
    }

    /// The sender that coalesces this client's `submit` calls, started on first use.
    pub(crate) fn coalescer(&self) -> &mpsc::UnboundedSender<coalesce::Pending> {
        self.coalescer
            .get_or_init(|| coalesce::start(self.clone().detached()))
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

    /// The head URL.
    pub fn head_url(&self) -> &str {
        &self.url
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

    /// The generated gRPC client (a cheap clone sharing the connection).
    pub(crate) fn rpc(&self) -> ClusterClient<Channel> {
        self.rpc.clone()
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

    /// Maps an error status from the head.
    pub(crate) fn error(&self, status: tonic::Status) -> ClientError {
        ClientError::from_status(status, &self.url)
    }
}

/// The task id in `ESCHER_TASK_ID`, or the error a `NodeSpec::Local` update would get: lets
/// a tool refuse such an update before it connects.
pub fn caller_task_from_env() -> Result<TaskId, ClientError> {
    Caller::from_env().require()
}

/// The normalised URL and the endpoint for it.
fn endpoint(url: &str) -> Result<(String, Endpoint), ClientError> {
    let url = normalise(url);
    let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| {
        ClientError::Usage(format!(
            "invalid head URL {url:?}: {e}; expected http://HOST:PORT"
        ))
    })?;
    let endpoint = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true);
    Ok((url, endpoint))
}

/// Adds `http://` to a bare `HOST:PORT`.
fn normalise(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_and_checked() {
        assert_eq!(normalise("127.0.0.1:7600"), "http://127.0.0.1:7600");
        assert_eq!(normalise(" http://h:1 "), "http://h:1");
        assert!(endpoint("http://127.0.0.1:7600").is_ok());
        let err = endpoint("http://bad host:1").unwrap_err().to_string();
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
