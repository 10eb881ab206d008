//! [`Replicas`]: the replicas of a head group that a client or a worker knows (`--head
//! URL1,URL2,URL3`, `ESCHER_HEAD`), one lazily connected channel to each, and which one is
//! believed to lead. The client (`escher-client`) and the worker (`escher-worker`) both follow
//! the leader through this one type; what each does between attempts (its retry loop, its
//! pauses) stays its own.
//!
//! A replica that does not lead answers UNAVAILABLE with the [`LEADER_METADATA`] entry: the
//! leader's URL, or empty while no leader is known (an election). [`answer`] reads that;
//! [`Replicas::follow`] switches to a named leader (adding a URL it did not know) and
//! [`Replicas::rotate`] tries the next replica.
//!
//! A write the replica had already proposed to the group when it stopped leading (or stalled
//! on a full disk, or began to stop) is answered the same way, with the [`OUTCOME_METADATA`]
//! entry as well: the entry may still commit under the next leader, or never, and that replica
//! cannot tell which. [`may_still_commit`] reads that; a caller that gives up on such a write
//! must say its outcome is unknown.
//!
//! Every channel has the same connection settings: a connect timeout, and HTTP/2 keep-alive
//! pings while idle, so that a replica that vanished without closing its connections (a crashed
//! machine, a cut network) fails the calls and streams on them instead of leaving them waiting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use thiserror::Error;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// The response metadata key of a "not leader" answer (its value: the leader's URL, or empty).
pub const LEADER_METADATA: &str = "escher-leader";

/// The response metadata key of an answer to a write the replica had proposed to the group and
/// can no longer answer for (it stopped leading before the entry committed): the write may still
/// commit. Its value is [`MAY_STILL_COMMIT`].
pub const OUTCOME_METADATA: &str = "escher-outcome";
/// The value of [`OUTCOME_METADATA`].
pub const MAY_STILL_COMMIT: &str = "may-still-commit";

/// Whether a failed write's status says the write may still commit ([`OUTCOME_METADATA`]).
pub fn may_still_commit(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get(OUTCOME_METADATA)
        .is_some_and(|v| v.as_bytes() == MAY_STILL_COMMIT.as_bytes())
}

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a connection is pinged: a replica that froze (SIGSTOP, a stalled machine, a
/// network that drops everything) fails the calls and streams on it within
/// `KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT`, and they go to another replica, instead of
/// waiting for the operating system's TCP timeouts.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before the connection counts as broken.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a failed call tells about the head group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A replica that does not lead named the leader.
    Leader(String),
    /// A replica that does not lead knows no leader yet.
    NoLeader,
    /// Anything else.
    Other,
}

/// Reads a failed call's status.
pub fn answer(status: &tonic::Status) -> Answer {
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

/// A head list or URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplicaError {
    /// The list names no URL.
    #[error("no head URL in {0:?}; expected http://HOST:PORT[,http://HOST:PORT...]")]
    NoUrl(String),
    /// A URL is not one.
    #[error("invalid head URL {url:?}: {why}; expected http://HOST:PORT")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What was wrong.
        why: String,
    },
    /// TLS could not be set up for an `https://` URL.
    #[error("cannot set up TLS for {url}: {why}")]
    Tls {
        /// The URL.
        url: String,
        /// What was wrong.
        why: String,
    },
}

/// The normalised URLs of a `URL[,URL...]` list (empty entries dropped).
pub fn split(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(normalise)
        .collect()
}

/// Adds `http://` to a bare `HOST:PORT`.
pub fn normalise(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// The endpoint of one URL with escher's connection settings; an `https://` URL speaks TLS
/// with `tls` (the system's roots when `None`).
pub fn endpoint(url: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, ReplicaError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
        return Err(ReplicaError::InvalidUrl {
            url: url.to_string(),
            why: format!("a head speaks http:// or https://, not {scheme}://"),
        });
    }
    let mut endpoint =
        Endpoint::from_shared(url.to_string()).map_err(|e| ReplicaError::InvalidUrl {
            url: url.to_string(),
            why: e.to_string(),
        })?;
    if url.starts_with("https://") {
        endpoint = endpoint
            .tls_config(tls.cloned().unwrap_or_default())
            .map_err(|e| ReplicaError::Tls {
                url: url.to_string(),
                why: e.to_string(),
            })?;
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

#[derive(Debug)]
struct Known {
    replicas: Vec<(Arc<str>, Channel)>,
    current: usize,
    /// The replica that named the leader followed last ([`Replicas::follow`]): a named leader
    /// that does not answer is left for the replica after that one, never for the one before
    /// it again (see [`Replicas::rotate`]).
    named_by: Option<usize>,
}

/// The replicas of a head group and the channels to them. Cheap to clone; clones share the
/// choice of leader.
#[derive(Debug, Clone)]
pub struct Replicas {
    known: Arc<Mutex<Known>>,
    tls: Option<ClientTlsConfig>,
}

impl Replicas {
    /// Channels to every URL of `list` (`URL[,URL...]`, bare `HOST:PORT` taken as `http://`),
    /// connected on first use. Must be called inside a tokio runtime.
    pub fn lazy(list: &str, tls: Option<ClientTlsConfig>) -> Result<Replicas, ReplicaError> {
        let urls = split(list);
        if urls.is_empty() {
            return Err(ReplicaError::NoUrl(list.to_string()));
        }
        let replicas = urls
            .iter()
            .map(|u| {
                let channel = endpoint(u, tls.as_ref())?.connect_lazy();
                Ok((Arc::from(u.as_str()), channel))
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        Ok(Replicas::from_channels(replicas, tls))
    }

    /// Replicas over channels made elsewhere (at least one).
    pub fn from_channels(
        replicas: Vec<(Arc<str>, Channel)>,
        tls: Option<ClientTlsConfig>,
    ) -> Replicas {
        assert!(
            !replicas.is_empty(),
            "a head group has at least one replica"
        );
        Replicas {
            known: Arc::new(Mutex::new(Known {
                replicas,
                current: 0,
                named_by: None,
            })),
            tls,
        }
    }

    /// Connects to the replicas in order until one answers, and believes it leads (every call
    /// tries it first). The error of the last replica tried when none answers.
    pub async fn connect_first(&self) -> Result<(), tonic::transport::Error> {
        let urls = self.urls();
        let mut last = None;
        for (i, url) in urls.iter().enumerate() {
            let Ok(endpoint) = endpoint(url, self.tls.as_ref()) else {
                continue; // Unreachable: the URL made a channel before.
            };
            match endpoint.connect().await {
                Ok(channel) => {
                    let mut known = self.lock();
                    known.replicas[i].1 = channel;
                    known.current = i;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The channel to the replica believed to lead, and its URL.
    pub fn current(&self) -> (Channel, Arc<str>) {
        let known = self.lock();
        let (url, channel) = &known.replicas[known.current];
        (channel.clone(), Arc::clone(url))
    }

    /// Every known URL, in order.
    pub fn urls(&self) -> Vec<String> {
        self.lock()
            .replicas
            .iter()
            .map(|(u, _)| u.to_string())
            .collect()
    }

    /// How many replicas are known.
    pub fn len(&self) -> usize {
        self.lock().replicas.len()
    }

    /// Never: a head group has at least one replica.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Believes `url` leads from now on; a URL not known yet is added.
    pub fn follow(&self, url: &str) {
        let url = normalise(url);
        let mut known = self.lock();
        known.named_by = Some(known.current);
        if let Some(i) = known.replicas.iter().position(|(u, _)| **u == *url) {
            known.current = i;
            return;
        }
        match endpoint(&url, self.tls.as_ref()) {
            Ok(endpoint) => {
                known
                    .replicas
                    .push((Arc::from(url.as_str()), endpoint.connect_lazy()));
                known.current = known.replicas.len() - 1;
            }
            Err(err) => tracing::warn!(%url, %err, "cannot follow the leader a replica named"),
        }
    }

    /// Tries the next replica (the current one did not answer, or knows no leader). After a
    /// leader that a replica named ([`Replicas::follow`]), the next is the replica after the
    /// one that named it: a leader named by a URL this client cannot reach (a replica's name
    /// on a network of its own, such as a compose project's, seen from the Docker host), which
    /// [`Replicas::follow`] appended last, would otherwise send the client back to the first
    /// replica, which names it again, and never to the leader's address in the client's list.
    pub fn rotate(&self) {
        let mut known = self.lock();
        let len = known.replicas.len();
        let mut next = (known.named_by.take().unwrap_or(known.current) + 1) % len;
        if next == known.current && len > 1 {
            next = (next + 1) % len;
        }
        known.current = next;
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
        let heads = Replicas::lazy("127.0.0.1:1,127.0.0.1:2", None).unwrap();
        assert_eq!(&*heads.current().1, "http://127.0.0.1:1");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://127.0.0.1:2");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://127.0.0.1:1");
        heads.follow("http://127.0.0.1:2");
        assert_eq!(&*heads.current().1, "http://127.0.0.1:2");
        heads.follow("127.0.0.1:3");
        assert_eq!(&*heads.current().1, "http://127.0.0.1:3");
        assert_eq!(heads.len(), 3);
        let clone = heads.clone();
        clone.rotate();
        assert_eq!(
            &*heads.current().1,
            "http://127.0.0.1:1",
            "clones share the leader"
        );
        assert_eq!(
            Replicas::lazy(" ", None).unwrap_err(),
            ReplicaError::NoUrl(" ".into())
        );
        assert!(matches!(
            Replicas::lazy("http://bad host:1", None),
            Err(ReplicaError::InvalidUrl { .. })
        ));
        for typo in [
            "htp://127.0.0.1:1",
            "ftp://127.0.0.1:1",
            "HTTP://127.0.0.1:1",
        ] {
            let err = Replicas::lazy(typo, None).unwrap_err().to_string();
            assert!(err.contains("http:// or https://"), "{err}");
            assert!(err.contains(typo), "{err}");
        }
    }

    #[tokio::test]
    async fn a_named_leader_that_does_not_answer_leads_on_to_the_next_replica() {
        // The client knows the replicas by addresses; they name the leader by a host name it
        // cannot reach. Replica 1 names it: after it fails, replica 2 is tried, not 1 again.
        let heads = Replicas::lazy("10.0.0.1:7600,10.0.0.2:7600,10.0.0.3:7600", None).unwrap();
        heads.follow("http://head-3:7600");
        assert_eq!(&*heads.current().1, "http://head-3:7600");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://10.0.0.2:7600");
        // Replica 2 names it too: then replica 3.
        heads.follow("http://head-3:7600");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://10.0.0.3:7600");
        // Replica 3 names it: past the appended name, back to replica 1.
        heads.follow("http://head-3:7600");
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://10.0.0.1:7600");
        // Without a named leader, plain rotation.
        heads.rotate();
        assert_eq!(&*heads.current().1, "http://10.0.0.2:7600");
        assert_eq!(heads.len(), 4);
    }

    #[tokio::test]
    async fn connect_first_settles_on_the_first_replica_that_answers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap();
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        let heads = Replicas::lazy(&format!("{dead},{live}"), None).unwrap();
        heads.connect_first().await.unwrap();
        assert_eq!(&*heads.current().1, format!("http://{live}"));
        accept.await.unwrap().unwrap();
        let none = Replicas::lazy(&dead.to_string(), None).unwrap();
        assert!(none.connect_first().await.is_err());
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
        assert!(!may_still_commit(&named));
        named
            .metadata_mut()
            .insert(OUTCOME_METADATA, MAY_STILL_COMMIT.parse().unwrap());
        assert!(may_still_commit(&named));
        // Still a "not leader" answer for a caller that knows nothing of outcomes (a worker).
        assert_eq!(answer(&named), Answer::Leader("http://h:9".into()));
    }
}
