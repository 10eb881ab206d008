//! The head's runtime: one owner task holding the replica (and through it the state), gRPC
//! services in front of it.
//!
//! ```text
//!  clients ──Cluster──▶ ClusterService ─┐
//!                                       ├─ Msg ─▶ Owner ─▶ Replica (raft + ClusterState)
//!  workers ──WorkerLink─▶ LinkService ──┘          │  ▲          │
//!                                                  │  └─ Inbound ─┤◀── RaftService ◀── peers
//!              (Assign, Cancel, ReportsAcked) ◀────┘              └──▶ Transport ──▶ peers
//! ```
//!
//! [`run`] takes a bound listener and a shutdown future (tests bind port 0). Shutdown is one
//! `CancellationToken`: it stops the owner, and every spawned task is tracked and awaited.
//! Stopping a head does not stop its workers: their streams end, and they wait for a head (of
//! their group) to come back.
//!
//! # Layout
//!
//! - `owner/`: the owner task and its loop (split by concern: messages, outputs, effects,
//!   leadership, workers, logs); `proposals.rs`, `reads.rs`, `waiters.rs`,
//!   `workers.rs`: its soft state (waiting proposals, batched reads, `wait` calls, worker
//!   links and the worker-report protocol); `liveness.rs`: the leader's rules about its
//!   workers' liveness (heartbeat clocks, leases, declaring a node lost), with the time passed
//!   in, which the deterministic simulation runs too; `object_sessions.rs`: when each client last
//!   renewed its object session, for releasing the objects of one that lapsed;
//! - `logs.rs`: serving a task's output from its worker, or from the tail the head kept;
//! - `watch.rs`: the watch API's history of recent events and its watchers (bounded, never
//!   waited for);
//! - `metrics.rs`: Prometheus metrics on `--metrics` (gauges read from the state per scrape);
//!   `fences.rs`: what each worker last said about its fence supervisor, shown with its node;
//!   `actor_calls.rs`: how many calls wait at each actor, as its worker last said;
//!   `policies.rs`: the latest report of each policy (an ESL's standing of its tenants);
//! - `dashboard/`: the web dashboard on `--dashboard` (a page, and a JSON gateway to the
//!   `Cluster` service with the same authentication);
//! - `cluster_svc.rs`, `link_svc.rs`: the `Cluster` and `WorkerLink` services;
//!   `wait_stream.rs`: the `Cluster` service's result stream; `handle.rs`: how they reach the owner and how its answers become statuses;
//! - `config.rs`: [`HeadConfig`].

mod actor_calls;
mod cluster_svc;
mod config;
mod dashboard;
mod fences;
mod handle;
mod idle;
mod link_svc;
pub mod liveness;
mod logs;
mod metrics;
mod object_sessions;
mod objects_svc;
mod owner;
mod policies;
mod proposals;
mod reads;
mod statuses;
pub mod streams;
mod telemetry;
mod tls;
mod wait_stream;
mod waiters;
mod watch;
mod workers;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use escher_proto::access::Bearer;
use escher_proto::wire::{
    cluster_server::ClusterServer, raft_server::RaftServer, worker_link_server::WorkerLinkServer,
};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;

use crate::auth::{AuthLayer, Keys, RunningAttempts};
use crate::replication::{
    DiskLog, LogError, LogIdentity, MAX_RAFT_MESSAGE, MemLog, PeerAccess, Persistence, RaftService,
    Replica, ReplicationError, Transport,
};
pub use config::{AddressFile, ConfigError, HeadConfig};
pub use handle::{LEADER_METADATA, READ_METADATA, STALE};
use metrics::Metrics;
pub use tls::{TlsError, TlsIdentity};

/// Why the head could not run.
#[derive(Debug, Error)]
pub enum HeadError {
    /// The settings are inconsistent.
    #[error("invalid head configuration: {0}")]
    Config(#[from] ConfigError),
    /// The listener has no address.
    #[error("cannot read the listening address: {0}")]
    Listener(#[from] std::io::Error),
    /// The replica could not start or failed.
    #[error("the head's replica failed: {0}")]
    Replication(#[from] ReplicationError),
    /// The raft log in the data directory cannot be used.
    #[error("cannot use the head's data directory {dir}: {source}")]
    DataDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why (the log store's message says what to do).
        source: LogError,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The backup to restore from cannot be used.
    #[error("cannot restore from {path}: {why}")]
    Restore {
        /// The backup file.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
    /// The address file could not be written.
    #[error("cannot write the address file {path}: {source}")]
    AddressFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The state a backup file holds, checked (format, length, checksum, data format).
fn read_restore(
    path: &std::path::Path,
    config: &HeadConfig,
) -> Result<crate::state::ClusterState, HeadError> {
    let failed = |why: String| HeadError::Restore {
        path: path.to_path_buf(),
        why,
    };
    let (header, image) =
        escher_proto::backup::read_backup(path).map_err(|e| failed(e.to_string()))?;
    // A later release's backup: refused by what its header and its image say, before anything
    // is decoded or written.
    let newest = crate::replication::newest_readable();
    let format = u32::from(crate::replication::image_format(&image)).max(header.data_format);
    if format > u32::from(newest) {
        return Err(failed(format!(
            "it is in data format {format}, newer than this escher-head reads (formats 1 to \
             {newest}): it was taken by a later release; restore it with that release or a \
             later one (nothing was written)"
        )));
    }
    // Another cluster's backup, given with this cluster's access file (its tokens, its
    // workers' trust): refused, since its workers would all be turned away as strangers.
    if let Some(ours) = config
        .access
        .cluster
        .as_deref()
        .filter(|ours| !header.cluster_id.is_empty() && *ours != header.cluster_id)
    {
        let file = config
            .access_path
            .as_ref()
            .map_or("this head's access file".to_string(), |p| {
                format!("the access file {}", p.display())
            });
        return Err(failed(format!(
            "it is a backup of cluster {}, and {file} is cluster {ours}'s (its workers and \
             clients hold its tokens): restore it with its own cluster's access file \
             (--access-file), or move this one away to make this head cluster {}'s with new \
             tokens (nothing was written)",
            header.cluster_id, header.cluster_id
        )));
    }
    let state = crate::replication::decode_backup(&image, config.state.clone())
        .map_err(|e| failed(e.to_string()))?;
    tracing::info!(
        path = %path.display(),
        cluster = %header.cluster_id,
        revision = header.revision,
        bytes = header.total_bytes,
        "restoring the head group's state from a backup"
    );
    // A new incarnation of the cluster begins with the first entry applied: the ids given out
    // after the backup are skipped, and returning workers are reconciled strictly. Every
    // replica given this file starts alike, so the group agrees on it.
    Ok(state.restored_from_backup(header.taken_at_ms))
}

/// Records in the access file at `path` which cluster this head is, once its state has a
/// cluster id (its group's first leader names it; a restored state has its backup's): a later
/// `--restore` of another cluster's backup with this file is refused. A file that names
/// another cluster is left as it is, with a warning.
async fn record_cluster(
    owner: handle::OwnerHandle,
    path: std::path::PathBuf,
    stop: CancellationToken,
) {
    let cluster = loop {
        let named = owner
            .read(true, |s| s.cluster_id().map(str::to_string))
            .await;
        if let Ok(Some(cluster)) = named {
            break cluster;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    };
    let file = path.clone();
    let recorded = tokio::task::spawn_blocking(move || {
        escher_proto::access::AccessFile::record_cluster(&file, &cluster)
            .map(|other| (other, cluster))
    })
    .await;
    match recorded {
        Ok(Ok((None, cluster))) => {
            tracing::debug!(path = %path.display(), %cluster, "the access file names this cluster")
        }
        Ok(Ok((Some(other), cluster))) => tracing::warn!(
            path = %path.display(),
            %cluster,
            file_names = %other,
            "the access file names another cluster than this head's state; left as it is"
        ),
        Ok(Err(err)) => tracing::warn!(%err, "cannot record this cluster in the access file"),
        Err(err) => tracing::warn!(%err, "cannot record this cluster in the access file"),
    }
}

/// Writes `url` to `path` through a temporary file and a rename.
fn write_address_file(path: &std::path::Path, url: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, url)?;
    std::fs::rename(&tmp, path)
}

/// Raises this process's soft limit of open files to its hard limit, and returns the limit now
/// in force. Every worker link, client connection and raft peer holds a descriptor, and the
/// usual soft limit (1,024) would refuse connections long before a head of a thousand nodes
/// runs out of anything else. For the `escher-head` binary only: a process that starts
/// programs (a worker, an embedded cluster) would hand them the raised limit too.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// How long in-flight calls get to finish after shutdown before connections are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Serves a head on `listener` until `shutdown` completes. With `config.data_dir` the raft log
/// lives there (created, or recovered and verified); without, in memory: what the head knows
/// is lost when it stops, unless other replicas of its group keep it.
///
/// Clients and workers of this process find the head's tokens by its URL from the moment this
/// is called (`escher_proto::access::register`), before the returned future first runs.
pub fn run(
    listener: TcpListener,
    config: HeadConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = Result<(), HeadError>> + Send {
    let mut config = config;
    // Clients of this process trust the head's certificate through its registered access.
    if let Some(tls) = &config.tls
        && config.access.ca_cert.is_none()
    {
        config.access.ca_cert = Some(tls.ca_pem.clone());
        config.access.tls_name = tls.server_name.clone();
    }
    if let Ok(addr) = listener.local_addr() {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        escher_proto::access::register(&format!("{scheme}://{addr}"), &config.access);
    }
    run_registered(listener, config, shutdown)
}

async fn run_registered(
    listener: TcpListener,
    config: HeadConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HeadError> {
    let mut config = config;
    config.replica.tls = config.tls.is_some();
    let addr = listener.local_addr()?;
    if config.replica.address.is_empty() {
        config.replica.address = addr.to_string();
    }
    config.validate()?;
    // The backup to restore from is checked before the data directory is opened: a refused
    // one leaves nothing behind (not even the log's identity file).
    let restore = match &config.restore {
        Some(path) => Some(read_restore(path, &config)?),
        None => None,
    };
    let Some(dir) = config.data_dir.clone() else {
        tracing::warn!(
            replica = config.replica.id,
            group = %config.replica.group,
            "this head keeps its state in memory only: tasks, results and resources are lost \
             when it stops (unless other replicas of its group keep them); give it --data-dir \
             to keep them on disk"
        );
        return serve(
            listener,
            config,
            MemLog::new(),
            Persistence::Inline,
            true,
            restore,
            shutdown,
        )
        .await;
    };
    let identity = LogIdentity {
        group: config.replica.group.clone(),
        replica: config.replica.id,
    };
    let opened = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || DiskLog::open(&dir, &identity)).await
    };
    let store = match opened {
        Ok(Ok(store)) => store,
        Ok(Err(source)) => return Err(HeadError::DataDir { dir, source }),
        Err(join) => {
            let why = ReplicationError::Interrupted(join.to_string());
            return Err(HeadError::Replication(why));
        }
    };
    tracing::info!(dir = %dir.display(), replica = config.replica.id, group = %config.replica.group, "the head keeps its raft log on disk");
    serve(
        listener,
        config,
        store,
        Persistence::Blocking,
        false,
        restore,
        shutdown,
    )
    .await
}

/// Serves a head over `store` on `listener` until `shutdown` completes; `restore` is the state
/// of a backup (already checked) that starts a new group.
async fn serve<S: crate::replication::LogStore>(
    listener: TcpListener,
    config: HeadConfig,
    store: S,
    persistence: Persistence,
    in_memory: bool,
    restore: Option<crate::state::ClusterState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HeadError> {
    let addr = listener.local_addr()?;
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (tx, requests) = tokio::sync::mpsc::channel(8192);
    let (raft_tx, raft) = tokio::sync::mpsc::channel(4096);
    let (transport_tx, transport) = tokio::sync::mpsc::unbounded_channel();
    let replica_config = config.replica.clone();
    let keys = Keys::new(&config.access);
    let peers = PeerAccess {
        bearer: Bearer::new(keys.peer_token()),
        tls: config.tls.as_ref().map(TlsIdentity::client_config),
    };
    let transport_out = Transport::new(
        replica_config.id,
        &replica_config.group,
        &replica_config.address,
        transport_tx,
        token.child_token(),
        tracker.clone(),
        peers.clone(),
    );
    let replica = Replica::open(
        replica_config.clone(),
        store,
        config.state.clone(),
        transport_out,
        persistence,
        in_memory,
        restore,
    )
    .map_err(|e| match (&config.restore, e) {
        (Some(path), ReplicationError::Restore(why)) => HeadError::Restore {
            path: path.clone(),
            why,
        },
        (_, e) => e.into(),
    })?;
    if let Some(file) = &config.address_file {
        // Only now, with the log open and its identity checked; write then rename, so a
        // reader never sees a half-written file.
        write_address_file(&file.path, &file.url).map_err(|source| HeadError::AddressFile {
            path: file.path.clone(),
            source,
        })?;
    }
    let owner = handle::OwnerHandle::new(tx);
    if let Some(path) = config.access_path.clone() {
        tracker.spawn(record_cluster(owner.clone(), path, token.clone()));
    }
    let inboxes = owner::Inboxes {
        requests,
        raft,
        transport,
    };
    let metrics = Arc::new(Metrics::default());
    let handover = owner::Handover::default();
    let owner_run = owner::Owner::new(
        replica,
        config.clone(),
        Arc::clone(&keys),
        Arc::clone(&metrics),
    )
    .run(inboxes, token.clone(), handover.clone());
    // A replica that cannot go on (its log failed, or its loop panicked) stops the whole head,
    // which then exits non-zero with the reason: a process left answering "shutting down" to
    // every call would keep its supervisor from restarting it.
    let stop_all = token.clone();
    let owner_task = tracker.spawn(async move {
        use futures_util::FutureExt as _;
        let result = match std::panic::AssertUnwindSafe(owner_run).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "no message".to_string());
                tracing::error!(%why, "the replica's loop panicked; the head stops");
                Err(ReplicationError::Panicked(why))
            }
        };
        if result.is_err() {
            stop_all.cancel();
        }
        result
    });
    if let Some(addr) = config.metrics {
        let listener = TcpListener::bind(addr).await?;
        tracker.spawn(metrics::serve(
            listener,
            owner.clone(),
            Arc::clone(&keys),
            Arc::clone(&metrics),
            config.authenticate,
            token.clone(),
        ));
    }

    let max = config.max_message_bytes;
    // Bound first: the address it is served on is what `DashboardTicket` answers.
    let dashboard = match config.dashboard {
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let logins = Arc::new(dashboard::Logins::new(listener.local_addr()?));
            Some((listener, logins))
        }
        None => None,
    };
    let cluster_svc = cluster_svc::ClusterService {
        owner: owner.clone(),
        log_fetch_timeout: config.log_fetch_timeout,
        keys: Arc::clone(&keys),
        peers,
        telemetry: Arc::default(),
        fences: Arc::clone(&metrics.fences),
        actor_calls: Arc::clone(&metrics.actor_calls),
        dashboard: dashboard.as_ref().map(|(_, logins)| Arc::clone(logins)),
        policies: Arc::clone(&metrics.policies),
    };
    if let Some((listener, logins)) = dashboard {
        tracker.spawn(dashboard::serve(
            listener,
            cluster_svc.clone(),
            Arc::clone(&keys),
            config.authenticate,
            logins,
            token.clone(),
        ));
    }
    let cluster = ClusterServer::new(cluster_svc)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let attempts: Arc<dyn RunningAttempts> = Arc::new(owner.clone());
    let link = WorkerLinkServer::new(link_svc::LinkService {
        owner,
        tracker: tracker.clone(),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let raft_service = RaftServer::new(RaftService::new(
        replica_config.id,
        &replica_config.group,
        &replica_config.address,
        raft_tx,
    ))
    .max_decoding_message_size(MAX_RAFT_MESSAGE)
    .max_encoding_message_size(MAX_RAFT_MESSAGE);

    tracing::info!(
        %addr,
        replica = replica_config.id,
        group = %replica_config.group,
        peers = ?replica_config.peers,
        "escher head listening"
    );
    let stop = token.clone();
    // Accepted connections need TCP_NODELAY, or small replies wait ~40 ms for delayed ACKs.
    // Each connection is cut once its peer has said nothing for the idle timeout; the
    // keepalive pings, three per timeout, keep every live client talking (`idle.rs`).
    let idle_timeout = config.idle_timeout;
    let incoming = tokio_stream::StreamExt::map(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        move |conn| conn.map(|io| idle::Idle::new(io, idle_timeout)),
    );
    // Every call passes the auth layer: its token becomes a `Caller`, and a method the
    // caller's role may not call, or a call by a task credential whose attempt ended, is
    // refused before any handler runs (docs/DESIGN.md §10).
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &config.tls {
        builder = builder.tls_config(tls.server_config())?;
    }
    let server = builder
        .http2_keepalive_interval(Some(idle_timeout / 3))
        .layer(
            if config.authenticate {
                AuthLayer::new(Arc::clone(&keys), attempts)
            } else {
                tracing::warn!("this head does not authenticate its callers (a benchmark setting)");
                AuthLayer::open(Arc::clone(&keys))
            }
            .observed(metrics.clone()),
        )
        .add_service(cluster)
        .add_service(link)
        .add_service(raft_service)
        .serve_with_incoming_shutdown(incoming, async move {
            tokio::select! {
                // A planned stop: a leader hands leadership over first, serving meanwhile so
                // that clients are told where the new leader is.
                () = shutdown => {
                    handover.asked.cancel();
                    tokio::select! {
                        () = handover.done.cancelled() => {}
                        () = stop.cancelled() => {}
                    }
                }
                () = stop.cancelled() => {}
            }
            stop.cancel();
        });
    let result = tokio::select! {
        result = server => result.map_err(HeadError::from),
        // Long-lived worker streams may keep the server open: give them a grace, then go.
        () = async { token.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => Ok(()),
    };
    token.cancel();
    tracker.close();
    let owner_result = owner_task.await;
    tracker.wait().await;
    tracing::info!("escher head stopped");
    match owner_result {
        Ok(Err(err)) => Err(err.into()),
        _ => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        use rlimit::Resource;
        let (soft, hard) = Resource::NOFILE.get().unwrap();
        // Lowered first (to a limit the other tests of this process stay far below), so that
        // there is something to raise wherever the hard limit allows it.
        let lowered = soft.min(hard).min(4_096);
        Resource::NOFILE.set(lowered, hard).unwrap();
        let limit = raise_open_files_limit().unwrap();
        assert_eq!(limit, hard);
        assert_eq!(Resource::NOFILE.get().unwrap(), (hard, hard));
    }
}
