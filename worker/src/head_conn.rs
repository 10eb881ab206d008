//! [`HeadConn`]: how a worker reaches its head, one lazily connected channel for everything.
//!
//! The `WorkerLink` calls (register, the attached stream) and every [`TaskContext`]'s
//! `Cluster` calls share one tonic [`Channel`]: one HTTP/2 connection, opened on first use and
//! reopened by tonic after it breaks. HTTP/2 keep-alive pings notice a head that vanished
//! without closing the connection (a crashed machine, a cut network), so that the stream
//! fails and the worker re-registers instead of waiting forever.
//!
//! [`TaskContext`]: crate::TaskContext

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use escher_proto::wire::cluster_client::ClusterClient;
use escher_proto::wire::worker_link_client::WorkerLinkClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::WorkerError;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often to ping the head over an idle connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection counts as broken.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The head's URL and the channel to it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct HeadConn {
    url: Arc<str>,
    channel: Channel,
}

impl fmt::Debug for HeadConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeadConn").field("url", &self.url).finish()
    }
}

impl HeadConn {
    /// A channel to `url`, not connected yet. Must be called inside a tokio runtime.
    pub(crate) fn new(url: &str) -> Result<HeadConn, WorkerError> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| WorkerError::config("head", format!("{url:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        Ok(HeadConn {
            url: Arc::from(url),
            channel: endpoint.connect_lazy(),
        })
    }

    /// The head's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// A client of the head's `WorkerLink` service.
    pub(crate) fn link_client(&self) -> WorkerLinkClient<Channel> {
        WorkerLinkClient::new(self.channel.clone())
    }

    /// A client of the head's `Cluster` service.
    pub(crate) fn cluster_client(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.channel.clone())
    }
}
