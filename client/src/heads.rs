//! [`Heads`]: the head replicas a client knows (`--head URL1,URL2,URL3`, `ESCHER_HEAD`), one
//! channel to each, and which one is believed to lead; and [`Client::call`](crate::Client),
//! the one loop every call goes through to follow the leader.
//!
//! A replica that does not lead answers UNAVAILABLE with the `escher-leader` metadata entry:
//! the leader's URL, or empty while no leader is known (an election). The loop follows a named
//! leader at once (adding a URL it did not know), and otherwise tries the next replica after a
//! pause that doubles from 20 ms to 500 ms, for at most the client's failover timeout (15 s by
//! default). An UNAVAILABLE without that entry (a replica that is down, a broken connection;
//! tonic reports a connection cut mid-call as UNKNOWN, which is treated alike) is retried the
//! same way when more than one replica is known; with one, it is the caller's error at once,
//! as it always was. Nothing else is retried here. A transient "not leader" is
//! never surfaced: the caller sees a success, its own error, or, after the failover timeout,
//! [`ClientError::Unavailable`].
//!
//! Writes are safe to retry because each carries one idempotency key for all its attempts
//! (`escher_proto::types::KeyIssuer`): if the first attempt was applied and only its reply was
//! lost, the head answers the retry with the recorded reply.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use escher_proto::wire::cluster_client::ClusterClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::ClientError;
use crate::credentials::Credentials;

/// A client of the `Cluster` service that sends the client's token with every call.
pub type ClusterRpc = ClusterClient<InterceptedService<Channel, escher_proto::access::Bearer>>;

/// The response metadata key of a "not leader" answer (its value: the leader's URL, or empty).
pub const LEADER_METADATA: &str = "escher-leader";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE: Duration = Duration::from_secs(20);
/// The first pause between attempts when no leader is known.
pub(crate) const PAUSE_MIN: Duration = Duration::from_millis(20);
/// The longest pause between attempts.
pub(crate) const PAUSE_MAX: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Known {
    replicas: Vec<(Arc<str>, Channel)>,
    current: usize,
}

/// What a failed call tells about the head group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A replica that does not lead named the leader.
    Leader(String),
    /// A replica that does not lead knows no leader yet.
    NoLeader,
    /// Anything else.
    Other,
}

/// Reads a failed call's status.
pub(crate) fn answer(status: &tonic::Status) -> Answer {
    if status.code() != tonic::Code::Unavailable {
        return Answer::Other;
    }
    match status.metadata().get(LEADER_METADATA) {
        Some(v) => match v.to_str() {
            Ok(url) if !url.is_empty() => Answer::Leader(url.to_string()),
            _ => Answer::NoLeader,
        },
        None => Answer::Other,
    }
}

/// How long a replica that would not open a stream (submissions, results) is sent calls
/// instead before it is asked again.
pub(crate) const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// The replica that last refused to open a stream, and until when it is left alone: for
/// [`REOPEN_AFTER`], or for good if it does not serve the call (UNIMPLEMENTED). Asked again
/// at once when another replica is the one to call.
#[derive(Debug, Default)]
pub(crate) struct StreamRefusal(Option<(Arc<str>, Option<std::time::Instant>)>);

impl StreamRefusal {
    /// Whether to ask the replica at `url` to open a stream now.
    pub(crate) fn may_ask(&self, url: &str) -> bool {
        match &self.0 {
            Some((at, until)) if **at == *url => {
                until.is_some_and(|t| t <= std::time::Instant::now())
            }
            _ => true,
        }
    }

    /// The replica at `url` opened one.
    pub(crate) fn opened(&mut self) {
        self.0 = None;
    }

    /// The replica at `url` refused with `status`.
    pub(crate) fn refused(&mut self, url: Arc<str>, status: &tonic::Status) {
        let until = (status.code() != tonic::Code::Unimplemented)
            .then(|| std::time::Instant::now() + REOPEN_AFTER);
        self.0 = Some((url, until));
    }
}

/// The head replicas and the channels to them. Cheap to clone; clones share the choice of
/// leader.
#[derive(Debug, Clone)]
pub(crate) struct Heads {
    known: Arc<Mutex<Known>>,
    credentials: Credentials,
}

/// The normalised URLs of a `URL[,URL...]` list.
pub(crate) fn split(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(normalise)
        .collect()
}

/// Adds `http://` to a bare `HOST:PORT`.
pub(crate) fn normalise(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// The endpoint of one URL; an `https://` URL speaks TLS, trusting what `credentials` trust.
pub(crate) fn endpoint(url: &str, credentials: &Credentials) -> Result<Endpoint, ClientError> {
    let mut endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| {
        ClientError::Usage(format!(
            "invalid head URL {url:?}: {e}; expected http://HOST:PORT"
        ))
    })?;
    if url.starts_with("https://") {
        let tls = credentials.tls().unwrap_or_default();
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ClientError::Usage(format!("cannot set up TLS for {url}: {e}")))?;
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true))
}

impl Heads {
    /// Channels to every URL of `list`, connected on first use.
    pub(crate) fn lazy(list: &str, credentials: Option<Credentials>) -> Result<Heads, ClientError> {
        let urls = split(list);
        if urls.is_empty() {
            return Err(ClientError::Usage(format!(
                "no head URL in {list:?}; expected http://HOST:PORT[,http://HOST:PORT...]"
            )));
        }
        let credentials = credentials.unwrap_or_else(|| Credentials::discover(&urls));
        let replicas = urls
            .iter()
            .map(|u| {
                Ok((
                    Arc::from(u.as_str()),
                    endpoint(u, &credentials)?.connect_lazy(),
                ))
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(Heads::from_replicas(replicas, credentials))
    }

    /// Channels to every URL of `list`, having connected to at least one (the first that
    /// answers, which is tried first by every call).
    pub(crate) async fn connect(
        list: &str,
        credentials: Option<Credentials>,
    ) -> Result<Heads, ClientError> {
        let heads = Heads::lazy(list, credentials)?;
        let urls: Vec<String> = heads.urls();
        let mut last = None;
        for (i, url) in urls.iter().enumerate() {
            match endpoint(url, &heads.credentials)?.connect().await {
                Ok(channel) => {
                    let mut known = heads.lock();
                    known.replicas[i].1 = channel;
                    known.current = i;
                    drop(known);
                    return Ok(heads);
                }
                Err(e) => last = Some(ClientError::connect(&urls.join(","), &e)),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Usage("no head URL".into())))
    }

    /// One channel, for a URL used in messages only.
    pub(crate) fn single(channel: Channel, url: &str) -> Heads {
        let credentials = Credentials::discover(&[url.to_string()]);
        Heads::from_replicas(vec![(Arc::from(url), channel)], credentials)
    }

    fn from_replicas(replicas: Vec<(Arc<str>, Channel)>, credentials: Credentials) -> Heads {
        Heads {
            known: Arc::new(Mutex::new(Known {
                replicas,
                current: 0,
            })),
            credentials,
        }
    }

    /// The same replicas, calling with other credentials (over new connections if they trust
    /// another certificate).
    pub(crate) fn with_credentials(&self, credentials: Credentials) -> Heads {
        if credentials.trust() == self.credentials.trust() {
            return Heads {
                known: Arc::clone(&self.known),
                credentials,
            };
        }
        let replicas = self
            .urls()
            .iter()
            .filter_map(|u| {
                let channel = endpoint(u, &credentials).ok()?.connect_lazy();
                Some((Arc::from(u.as_str()), channel))
            })
            .collect::<Vec<_>>();
        if replicas.is_empty() {
            // Unreachable (the URLs were valid before); keep the connections rather than none.
            return Heads {
                known: Arc::clone(&self.known),
                credentials,
            };
        }
        Heads::from_replicas(replicas, credentials)
    }

    /// The credentials every call carries.
    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    fn lock(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client of the replica believed to lead, and its URL.
    pub(crate) fn current(&self) -> (ClusterRpc, Arc<str>) {
        let known = self.lock();
        let (url, channel) = &known.replicas[known.current];
        let rpc = ClusterClient::with_interceptor(channel.clone(), self.credentials.bearer());
        (rpc, Arc::clone(url))
    }

    /// Every known URL, in order.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.lock()
            .replicas
            .iter()
            .map(|(u, _)| u.to_string())
            .collect()
    }

    /// How many replicas are known.
    pub(crate) fn len(&self) -> usize {
        self.lock().replicas.len()
    }

    /// Believes `url` leads from now on; a URL not known yet is added.
    pub(crate) fn follow(&self, url: &str) {
        let url = normalise(url);
        let mut known = self.lock();
        if let Some(i) = known.replicas.iter().position(|(u, _)| **u == *url) {
            known.current = i;
            return;
        }
        if let Ok(endpoint) = endpoint(&url, &self.credentials) {
            known
                .replicas
                .push((Arc::from(url.as_str()), endpoint.connect_lazy()));
            known.current = known.replicas.len() - 1;
        }
    }

    /// Tries the next replica.
    pub(crate) fn rotate(&self) {
        let mut known = self.lock();
        known.current = (known.current + 1) % known.replicas.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_split_and_normalised() {
        assert_eq!(
            split(" 127.0.0.1:1, http://h:2 ,,"),
            vec!["http://127.0.0.1:1", "http://h:2"]
        );
        assert!(split(" , ").is_empty());
    }

    #[tokio::test]
    async fn follows_a_named_leader_and_rotates_otherwise() {
        let heads = Heads::lazy("127.0.0.1:1,127.0.0.1:2", None).unwrap();
        assert_eq!(&*heads.current().1, "http://127.0.0.1:1");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://127.0.0.1:2");
        heads.follow("http://127.0.0.1:1");
        assert_eq!(&*heads.current().1, "http://127.0.0.1:1");
        heads.follow("127.0.0.1:3");
        assert_eq!(&*heads.current().1, "http://127.0.0.1:3");
        assert_eq!(heads.len(), 3);
        assert!(Heads::lazy(" ", None).is_err());
    }

    #[test]
    fn not_leader_answers_are_read() {
        let mut named = tonic::Status::unavailable("not the leader");
        named
            .metadata_mut()
            .insert(LEADER_METADATA, "http://h:9".parse().unwrap());
        assert_eq!(answer(&named), Answer::Leader("http://h:9".into()));
        let mut none = tonic::Status::unavailable("election");
        none.metadata_mut()
            .insert(LEADER_METADATA, "".parse().unwrap());
        assert_eq!(answer(&none), Answer::NoLeader);
        assert_eq!(answer(&tonic::Status::unavailable("down")), Answer::Other);
        assert_eq!(answer(&tonic::Status::not_found("x")), Answer::Other);
    }
}
