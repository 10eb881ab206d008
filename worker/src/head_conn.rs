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
//! was not in the list). Without a hint, [`HeadConn::rotate`] tries the next replica. The
//! replicas, their channels and the choice of leader are an
//! [`escher_proto::replicas::Replicas`], the same the client follows the leader with.
//!
//! [`TaskContext`]: crate::TaskContext

use std::fmt;
use std::sync::Arc;

use escher_proto::access::Bearer;
use escher_proto::replicas::{Answer, Replicas, answer};
use escher_proto::wire::cluster_client::ClusterClient;
use escher_proto::wire::worker_link_client::WorkerLinkClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A client of a head service that sends a token with every call.
pub type Authed = InterceptedService<Channel, Bearer>;

use crate::error::WorkerError;

/// The head replicas and the channels to them. Cheap to clone; clones share the choice of
/// leader.
#[derive(Clone)]
pub(crate) struct HeadConn {
    /// The list as configured (`URL[,URL...]`), passed on to command tasks.
    list: Arc<str>,
    replicas: Replicas,
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

/// The URLs of a `URL[,URL...]` list, as given.
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
        let tls = trust
            .as_ref()
            .map(|(ca, name)| escher_proto::access::client_tls(ca, name.as_deref()));
        let replicas =
            Replicas::lazy(list, tls).map_err(|e| WorkerError::config("head", e.to_string()))?;
        Ok(HeadConn {
            list: Arc::from(list),
            replicas,
            keys: escher_proto::types::KeyIssuer::new(rand::random()),
            join: Bearer::new(join_token),
            trust,
        })
    }

    /// The key of a new write.
    pub(crate) fn ticket(&self) -> escher_proto::types::Ticket {
        self.keys.issue()
    }

    /// The URL of the replica believed to lead.
    pub(crate) fn url(&self) -> String {
        self.replicas.current().1.to_string()
    }

    /// Every configured URL, as given (`URL[,URL...]`).
    pub(crate) fn list(&self) -> &str {
        &self.list
    }

    /// The certificate trusted for `https://` heads (PEM) and the name checked against it.
    pub(crate) fn trust(&self) -> Option<&(String, Option<String>)> {
        self.trust.as_ref()
    }

    /// A client of the `WorkerLink` service of the replica believed to lead.
    pub(crate) fn link_client(&self) -> WorkerLinkClient<Authed> {
        WorkerLinkClient::with_interceptor(self.replicas.current().0, self.join.clone())
    }

    /// A client of the `Cluster` service of the replica believed to lead, calling with
    /// `token` (a task's credential).
    pub(crate) fn cluster_client(&self, token: &Bearer) -> ClusterClient<Authed> {
        ClusterClient::with_interceptor(self.replicas.current().0, token.clone())
    }

    /// Believes `url` leads from now on; a URL not in the list is added.
    pub(crate) fn follow(&self, url: &str) {
        self.replicas.follow(url);
    }

    /// Tries the next replica (the current one did not answer, or knows no leader).
    pub(crate) fn rotate(&self) {
        self.replicas.rotate();
    }

    /// How many replicas are known.
    pub(crate) fn len(&self) -> usize {
        self.replicas.len()
    }
}

/// The leader's URL named by a "not leader" answer.
pub(crate) fn leader_hint(status: &tonic::Status) -> Option<String> {
    match answer(status) {
        Answer::Leader(url) => Some(url),
        Answer::NoLeader | Answer::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher_proto::replicas::LEADER_METADATA;

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
