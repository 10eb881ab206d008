//! The head's runtime: one owner task holding the state, gRPC services in front of it.
//!
//! ```text
//!  clients ──Cluster──▶ ClusterService ─┐
//!                                       ├─ Msg ─▶ Owner (ClusterState + soft state) ─▶ workers
//!  workers ──WorkerLink─▶ LinkService ──┘                                  (Assign, Cancel, ...)
//! ```
//!
//! [`run`] takes a bound listener and a shutdown future (tests bind port 0). Shutdown is one
//! `CancellationToken`: it stops the owner, which tells every worker, and every spawned task is
//! tracked and awaited.

mod cluster_svc;
mod config;
mod handle;
mod link_svc;
mod owner;
mod waiters;

use std::future::Future;
use std::time::Duration;

use escher_proto::wire::{cluster_server::ClusterServer, worker_link_server::WorkerLinkServer};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;

pub use config::{ConfigError, HeadConfig};

/// Why the head could not run.
#[derive(Debug, Error)]
pub enum HeadError {
    /// The settings are inconsistent.
    #[error("invalid head configuration: {0}")]
    Config(#[from] ConfigError),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How long in-flight calls get to finish after shutdown before connections are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Serves a head on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: HeadConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HeadError> {
    config.validate()?;
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (tx, rx) = tokio::sync::mpsc::channel(8192);
    let owner = handle::OwnerHandle::new(tx);
    tracker.spawn(owner::Owner::new(config.clone()).run(rx, token.clone()));

    let max = config.max_message_bytes;
    let cluster = ClusterServer::new(cluster_svc::ClusterService {
        owner: owner.clone(),
        log_fetch_timeout: config.log_fetch_timeout,
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let link = WorkerLinkServer::new(link_svc::LinkService {
        owner,
        tracker: tracker.clone(),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);

    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "escher head listening");
    }
    let stop = token.clone();
    // Accepted connections need TCP_NODELAY, or small replies wait ~40 ms for delayed ACKs.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .add_service(cluster)
        .add_service(link)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            stop.cancel();
        });
    let result = tokio::select! {
        result = server => result.map_err(HeadError::from),
        // Long-lived worker streams may keep the server open: give them a grace, then go.
        () = async { token.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => Ok(()),
    };
    token.cancel();
    tracker.close();
    tracker.wait().await;
    tracing::info!("escher head stopped");
    result
}
