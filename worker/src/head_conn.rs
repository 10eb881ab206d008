//! [`HeadConn`]: how a worker reaches its head group: one lazily connected channel per head
//! replica, and which one is believed to lead.
//!
//! The `WorkerLink` calls (register, the attached stream) and every [`TaskContext`]'s
//! `Cluster` calls share these channels: one HTTP/2 connection per replica, opened on first
//! use and reopened by tonic after it breaks. HTTP/2 keep-alive pings notice a head that
//! vanished without closing the connection (a crashed machine, a cut network), so that the
//! stream fails and the worker re-registers instead of waiting forever.
//!
//! Following the leader: a replica that does not lead answers UNAVAILABLE with the leader's
//! URL in the `escher-leader` metadata; [`HeadConn::follow`] switches to it (adding it if it
//! was not in the list). Without a hint, [`HeadConn::rotate`] tries the next replica.
//!
//! [`TaskContext`]: crate::TaskContext

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use escher_proto::access::Bearer;
use escher_proto::wire::cluster_client::ClusterClient;
use escher_proto::wire::worker_link_client::WorkerLinkClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// A client of a head service that sends a token with every call.
pub type Authed = InterceptedService<Channel, Bearer>;

use crate::error::WorkerError;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often to ping the head over an idle connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection counts as broken.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The response metadata key of a "not leader" answer that names the leader.
pub(crate) const LEADER_METADATA: &str = "escher-leader";

#[derive(Debug)]
struct Heads {
    /// Every known replica: its URL and its channel.
    replicas: Vec<(Arc<str>, Channel)>,
    /// The one believed to lead.
    current: usize,
}

/// The head replicas and the channels to them. Cheap to clone; clones share the choice of
/// leader.
#[derive(Clone)]
pub(crate) struct HeadConn {
    /// The list as configured (`URL[,URL...]`), passed on to command tasks.
    list: Arc<str>,
    heads: Arc<Mutex<Heads>>,
    /// The idempotency keys of the writes made through this connection (task contexts'
    /// resource changes).
    keys: escher_proto::types::KeyIssuer,
    /// The join token, sent with every `WorkerLink` call.
    join: Bearer,
    /// The certificate trusted for `https://` heads, and the name checked against it.
    trust: Option<(String, Option<String>)>,
}

impl fmt::Debug for HeadConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeadConn")
            .field("heads", &self.list)
            .finish()
    }
}

fn channel(url: &str, trust: Option<&(String, Option<String>)>) -> Result<Channel, WorkerError> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| WorkerError::config("head", format!("{url:?}: {e}")))?;
    if url.starts_with("https://") {
        let tls = trust
            .map(|(ca, name)| escher_proto::access::client_tls(ca, name.as_deref()))
            .unwrap_or_default();
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| WorkerError::config("head", format!("TLS for {url}: {e}")))?;
    }
    let endpoint = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

/// The URLs of a `URL[,URL...]` list.
pub(crate) fn split_heads(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|u| !u.is_empty())
}

impl HeadConn {
    /// Channels to every URL of `list` (`URL[,URL...]`), not connected yet. Must be called
    /// inside a tokio runtime.
    pub(crate) fn new(
        list: &str,
        join_token: &str,
        trust: Option<(String, Option<String>)>,
    ) -> Result<HeadConn, WorkerError> {
        let replicas = split_heads(list)
            .map(|url| Ok((Arc::from(url), channel(url, trust.as_ref())?)))
            .collect::<Result<Vec<_>, WorkerError>>()?;
        if replicas.is_empty() {
            return Err(WorkerError::config("head", "no head URL given"));
        }
        Ok(HeadConn {
            list: Arc::from(list),
            heads: Arc::new(Mutex::new(Heads {
                replicas,
                current: 0,
            })),
            keys: escher_proto::types::KeyIssuer::new(rand::random()),
            join: Bearer::new(join_token),
            trust,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Heads> {
        self.heads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of a new write.
    pub(crate) fn ticket(&self) -> escher_proto::types::Ticket {
        self.keys.issue()
    }

    /// The URL of the replica believed to lead.
    pub(crate) fn url(&self) -> String {
        let heads = self.lock();
        heads.replicas[heads.current].0.to_string()
    }

    /// Every configured URL, as given (`URL[,URL...]`).
    pub(crate) fn list(&self) -> &str {
        &self.list
    }

    fn current(&self) -> Channel {
        let heads = self.lock();
        heads.replicas[heads.current].1.clone()
    }

    /// The certificate trusted for `https://` heads (PEM) and the name checked against it.
    pub(crate) fn trust(&self) -> Option<&(String, Option<String>)> {
        self.trust.as_ref()
    }

    /// A client of the `WorkerLink` service of the replica believed to lead.
    pub(crate) fn link_client(&self) -> WorkerLinkClient<Authed> {
        WorkerLinkClient::with_interceptor(self.current(), self.join.clone())
    }

    /// A client of the `Cluster` service of the replica believed to lead, calling with
    /// `token` (a task's credential).
    pub(crate) fn cluster_client(&self, token: &Bearer) -> ClusterClient<Authed> {
        ClusterClient::with_interceptor(self.current(), token.clone())
    }

    /// Believes `url` leads from now on; a URL not in the list is added.
    pub(crate) fn follow(&self, url: &str) {
        let mut heads = self.lock();
        if let Some(i) = heads.replicas.iter().position(|(u, _)| &**u == url) {
            heads.current = i;
            return;
        }
        match channel(url, self.trust.as_ref()) {
            Ok(ch) => {
                heads.replicas.push((Arc::from(url), ch));
                heads.current = heads.replicas.len() - 1;
            }
            Err(err) => tracing::warn!(%url, %err, "cannot follow the leader the head named"),
        }
    }

    /// Tries the next replica (the current one did not answer, or knows no leader).
    pub(crate) fn rotate(&self) {
        let mut heads = self.lock();
        heads.current = (heads.current + 1) % heads.replicas.len();
    }

    /// How many replicas are known.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().replicas.len()
    }
}

/// The leader's URL named by a "not leader" answer.
pub(crate) fn leader_hint(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    status
        .metadata()
        .get(LEADER_METADATA)
        .and_then(|v| v.to_str().ok())
        .filter(|url| !url.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn follows_the_named_leader_and_rotates_without_one() {
        let conn = HeadConn::new("http://127.0.0.1:1, http://127.0.0.1:2", "t", None).unwrap();
        assert_eq!(conn.url(), "http://127.0.0.1:1");
        conn.rotate();
        assert_eq!(conn.url(), "http://127.0.0.1:2");
        conn.rotate();
        assert_eq!(conn.url(), "http://127.0.0.1:1");
        conn.follow("http://127.0.0.1:2");
        assert_eq!(conn.url(), "http://127.0.0.1:2");
        conn.follow("http://127.0.0.1:3");
        assert_eq!((conn.url().as_str(), conn.len()), ("http://127.0.0.1:3", 3));
        assert_eq!(conn.list(), "http://127.0.0.1:1, http://127.0.0.1:2");
        let mut status = tonic::Status::unavailable("not leader");
        status
            .metadata_mut()
            .insert(LEADER_METADATA, "http://127.0.0.1:9".parse().unwrap());
        assert_eq!(leader_hint(&status).as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(leader_hint(&tonic::Status::unavailable("down")), None);
    }
}
