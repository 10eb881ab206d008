//! [`Heads`]: the head replicas a client knows (`--head URL1,URL2,URL3`, `ESCHER_HEAD`), one
//! channel to each, and which one is believed to lead (an [`escher_proto::replicas::Replicas`],
//! which the worker follows the leader with too) with the credentials every call carries; and
//! [`Client::call`](crate::Client), the one loop every call goes through to follow the leader.
//!
//! A replica that does not lead answers UNAVAILABLE with the `escher-leader` metadata entry:
//! the leader's URL, or empty while no leader is known (an election). The loop follows a named
//! leader at once (adding a URL it did not know), and otherwise tries the next replica after a
//! pause that doubles from 20 ms to 500 ms, for at most the client's failover timeout (15 s by
//! default). An UNAVAILABLE without that entry (a replica that is down, a broken connection;
//! tonic reports a connection cut mid-call as UNKNOWN, and a call refused by a replica stopping
//! gracefully, an HTTP/2 GOAWAY, as INTERNAL, which are treated alike) is retried the same way
//! when more than one replica is known; with one, it is the caller's error at once,
//! as it always was. Nothing else is retried here. A transient "not leader" is
//! never surfaced: the caller sees a success, its own error, or, after the failover timeout,
//! [`ClientError::Unavailable`]. These decisions are [`crate::retry`]'s, clock-free, so that
//! the deterministic simulation (`escher-sim`) runs the same rules; the loop here does the
//! I/O and the sleeping.
//!
//! Writes are safe to retry because each carries one idempotency key for all its attempts
//! (`escher_proto::types::KeyIssuer`): if the first attempt was applied and only its reply was
//! lost, the head answers the retry with the recorded reply.
//! A "not leader" that also carries the `escher-outcome: may-still-commit` entry comes from a
//! replica that had proposed the write and lost the lead before it committed: it is followed
//! the same way, and leaves the write's outcome open (`retry.rs`), so that a call that gives up
//! after it says the outcome is unknown instead of "not applied".

use std::sync::Arc;
use std::time::Duration;

use escher_proto::replicas::{ReplicaError, Replicas};
use escher_proto::wire::cluster_client::ClusterClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::ClientError;
use crate::credentials::Credentials;

pub(crate) use escher_proto::replicas::{Answer, answer};

/// A client of the `Cluster` service that sends the client's token with every call.
pub type ClusterRpc = ClusterClient<InterceptedService<Channel, escher_proto::access::Bearer>>;

/// How long a replica may take to open a stream (submissions, results) before the call goes
/// to the next replica as a unary call: a live replica opens one at once, a frozen one never
/// (its connection stays open and silent until the keep-alive gives up).
pub(crate) const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(2);

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

/// The head replicas, the channels to them, and the credentials every call carries. Cheap to
/// clone; clones share the choice of leader.
#[derive(Debug, Clone)]
pub(crate) struct Heads {
    replicas: Replicas,
    credentials: Credentials,
}

impl From<ReplicaError> for ClientError {
    fn from(err: ReplicaError) -> ClientError {
        ClientError::Usage(err.to_string())
    }
}

impl Heads {
    /// Channels to every URL of `list`, connected on first use.
    pub(crate) fn lazy(list: &str, credentials: Option<Credentials>) -> Result<Heads, ClientError> {
        let urls = escher_proto::replicas::split(list);
        if urls.is_empty() {
            return Err(ReplicaError::NoUrl(list.to_string()).into());
        }
        let credentials = credentials.unwrap_or_else(|| Credentials::discover(&urls));
        let replicas = Replicas::lazy(list, credentials.tls())?;
        Ok(Heads {
            replicas,
            credentials,
        })
    }

    /// Channels to every URL of `list`, having connected to at least one (the first that
    /// answers, which is tried first by every call).
    pub(crate) async fn connect(
        list: &str,
        credentials: Option<Credentials>,
    ) -> Result<Heads, ClientError> {
        let heads = Heads::lazy(list, credentials)?;
        heads
            .replicas
            .connect_first()
            .await
            .map_err(|e| ClientError::connect(&heads.urls().join(","), &e))?;
        Ok(heads)
    }

    /// One channel, for a URL used in messages only.
    pub(crate) fn single(channel: Channel, url: &str) -> Heads {
        let credentials = Credentials::discover(&[url.to_string()]);
        let replicas = Replicas::from_channels(vec![(Arc::from(url), channel)], credentials.tls());
        Heads {
            replicas,
            credentials,
        }
    }

    /// The same replicas, calling with other credentials (over new connections if they trust
    /// another certificate).
    pub(crate) fn with_credentials(&self, credentials: Credentials) -> Heads {
        if credentials.trust() == self.credentials.trust() {
            return Heads {
                replicas: self.replicas.clone(),
                credentials,
            };
        }
        match Replicas::lazy(&self.urls().join(","), credentials.tls()) {
            Ok(replicas) => Heads {
                replicas,
                credentials,
            },
            // Unreachable (the URLs were valid before); keep the connections rather than none.
            Err(_) => Heads {
                replicas: self.replicas.clone(),
                credentials,
            },
        }
    }

    /// The credentials every call carries.
    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// A client of the replica believed to lead, and its URL.
    pub(crate) fn current(&self) -> (ClusterRpc, Arc<str>) {
        let (channel, url) = self.replicas.current();
        let rpc = ClusterClient::with_interceptor(channel, self.credentials.bearer());
        (rpc, url)
    }

    /// Every known URL, in order.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.replicas.urls()
    }

    /// How many replicas are known.
    pub(crate) fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Believes `url` leads from now on; a URL not known yet is added.
    pub(crate) fn follow(&self, url: &str) {
        self.replicas.follow(url);
    }

    /// Tries the next replica.
    pub(crate) fn rotate(&self) {
        self.replicas.rotate();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = Heads::lazy(" ", None).unwrap_err().to_string();
        assert!(err.contains("no head URL"), "{err}");
    }
}
