//! `escher-head`: runs the head of an escher cluster, alone or as one replica of a raft group.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use escher_core::state::{RetentionPolicy, StateConfig};
use escher_head::HeadConfig;
use escher_head::replication::{DEFAULT_SNAPSHOT_BYTES, ReplicaConfig, SINGLE_GROUP};
use escher_head::runtime::{AddressFile, TlsIdentity};

/// The head allocates and frees small objects from many threads at once (decoded requests,
/// messages, task records). jemalloc's per-thread caches serve that better than glibc's locked
/// arenas (BENCHMARKS.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The version `--version` prints: the package's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ESCHER_COMMIT"),
    ")"
);

/// Runs the head of an escher cluster: the resource table, the scheduler, and the API that
/// clients and workers connect to.
///
/// Alone, a head is a raft group of one. With `--id N --peers 1=HOST:PORT,2=...,3=...` it is
/// replica N of a group: start every replica with the same `--peers` list; they elect a
/// leader, which serves clients and workers, and any replica tells a caller where the leader
/// is. Clients and workers take the list of every replica's URL (`--head URL1,URL2,URL3`).
#[derive(Debug, Parser)]
#[command(name = "escher-head", version = VERSION)]
struct HeadArgs {
    /// Address to listen on for clients and workers.
    #[arg(long, env = "ESCHER_HEAD_LISTEN", default_value = "127.0.0.1:7600")]
    listen: SocketAddr,
    /// Once it serves (its data directory open and checked), write the head's URL
    /// (`http://HOST:PORT`) to this file; with `--listen 127.0.0.1:0` this is how scripts and
    /// tests learn the port that was chosen, and that the head is ready.
    #[arg(long, env = "ESCHER_HEAD_ADDRESS_FILE")]
    address_file: Option<std::path::PathBuf>,
    /// The access file: the admin and worker join tokens every call is checked against,
    /// written (mode 0600) at the first start and read at every later one. The CLI, clients and
    /// workers on this machine find it with no flag. The replicas of one group share one file
    /// (copy it to the other machines before starting them there).
    /// [default: $ESCHER_HOME/access.json, ESCHER_HOME defaulting to ~/.escher]
    #[arg(long, env = "ESCHER_ACCESS_FILE", value_name = "PATH")]
    access_file: Option<std::path::PathBuf>,
    /// Speak TLS (rustls). Always on when --listen is not a loopback address. Without
    /// --tls-cert the head generates a self-signed certificate at its first start, keeps it
    /// beside the access file (tls-cert.pem, tls-key.pem) and puts it in the access file, which
    /// is how clients trust it. Clients then use https:// URLs.
    #[arg(long, env = "ESCHER_TLS")]
    tls: bool,
    /// The head's certificate (PEM) instead of a generated one; implies --tls.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// The CA (PEM) clients are told to trust for --tls-cert [default: the certificate itself].
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_ca: Option<std::path::PathBuf>,
    /// How often workers send heartbeats, in milliseconds.
    #[arg(long, env = "ESCHER_HEARTBEAT_INTERVAL_MS", default_value_t = 1_000)]
    heartbeat_interval_ms: u64,
    /// A worker silent this long (milliseconds) is declared lost and its tasks are retried.
    #[arg(long, env = "ESCHER_HEARTBEAT_TIMEOUT_MS", default_value_t = 10_000)]
    heartbeat_timeout_ms: u64,
    /// The largest function result the head stores, in bytes.
    #[arg(long, env = "ESCHER_MAX_RESULT_BYTES", default_value_t = StateConfig::default().max_result_bytes)]
    max_result_bytes: usize,
    /// The most unfinished (pending or running) tasks one application namespace may have; a
    /// submission past it is refused whole with RESOURCE_EXHAUSTED. Admin tasks are not counted.
    #[arg(long, env = "ESCHER_NAMESPACE_UNFINISHED_TASKS", default_value_t = StateConfig::default().namespace_unfinished)]
    namespace_unfinished_tasks: u64,
    /// The most bytes of function results one application namespace may have stored in the
    /// head at once; a result past it fails its task, saying so. Results are released as
    /// retention evicts their tasks.
    #[arg(long, env = "ESCHER_NAMESPACE_RESULT_BYTES", default_value_t = StateConfig::default().namespace_result_bytes)]
    namespace_result_bytes: u64,
    /// The most bytes of objects one application namespace may have (each object once,
    /// whatever its copies); a `put` past it is refused with RESOURCE_EXHAUSTED naming the
    /// quota. Admin objects are not counted.
    #[arg(long, env = "ESCHER_NAMESPACE_OBJECT_BYTES", default_value_t = StateConfig::default().namespace_object_bytes)]
    namespace_object_bytes: u64,
    /// The most resource names one application namespace may have on live nodes; a call that
    /// would create more is refused whole with RESOURCE_EXHAUSTED.
    #[arg(long, env = "ESCHER_NAMESPACE_RESOURCES", default_value_t = StateConfig::default().namespace_resources)]
    namespace_resources: u64,
    /// The largest task the head takes, in bytes (its command, arguments, environment, labels
    /// and hooks), from any caller; a submission holding a larger one is refused whole with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "ESCHER_MAX_TASK_BYTES", default_value_t = StateConfig::default().max_task_bytes)]
    max_task_bytes: u64,
    /// The most bytes of task specs one application namespace may have the head keep (its
    /// unfinished tasks and the finished ones retention keeps); a submission past it is
    /// refused whole with RESOURCE_EXHAUSTED.
    #[arg(long, env = "ESCHER_NAMESPACE_SPEC_BYTES", default_value_t = StateConfig::default().namespace_spec_bytes)]
    namespace_spec_bytes: u64,
    /// Close a connection whose peer has sent nothing for this long (`30s`, `5m`); the head
    /// pings each connection three times per period, so live clients are never cut.
    #[arg(long, env = "ESCHER_IDLE_TIMEOUT", value_name = "DURATION", default_value_t = HeadConfig::default().idle_timeout.into())]
    idle_timeout: humantime::Duration,
    /// Release the objects of a client's object session once the client has not renewed it
    /// for this long (`30s`, `2m`): a client that died without closing leaks nothing. Live
    /// clients renew three times per period; a new leader gives every session a full period.
    #[arg(long, env = "ESCHER_OBJECT_SESSION_LAPSE", value_name = "DURATION", default_value_t = HeadConfig::default().object_session_lapse.into())]
    object_session_lapse: humantime::Duration,
    /// Serve Prometheus metrics on this loopback address (`127.0.0.1:9090`), at `/metrics`; a
    /// scrape carries a token like any call (`Authorization: Bearer TOKEN`, a reader token is
    /// enough).
    #[arg(long, env = "ESCHER_METRICS", value_name = "HOST:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// Serve the web dashboard on this loopback address (`127.0.0.1:8265`): open
    /// http://127.0.0.1:8265/ and sign in with a token (`escher dashboard` prints the address
    /// with one; a reader token shows the cluster, an app token its namespace's tasks too).
    #[arg(long, env = "ESCHER_DASHBOARD", value_name = "HOST:PORT")]
    dashboard: Option<std::net::SocketAddr>,
    /// How many recent events the head keeps for watchers that reconnect and resume from the
    /// last revision they saw (`escher tasks --watch`, `Client::watch`); one further behind
    /// is told to list the state again.
    #[arg(long, env = "ESCHER_WATCH_HISTORY", value_name = "EVENTS", default_value_t = HeadConfig::default().watch_history)]
    watch_history: usize,
    /// How many events one watcher may have waiting before the head cuts it off; the head
    /// never waits for a watcher.
    #[arg(long, env = "ESCHER_WATCH_BUFFER", value_name = "EVENTS", default_value_t = HeadConfig::default().watch_buffer)]
    watch_buffer: usize,
    /// The largest request or reply the head accepts or sends, in bytes.
    #[arg(long, env = "ESCHER_MAX_MESSAGE_BYTES", default_value_t = HeadConfig::default().max_message_bytes)]
    max_message_bytes: usize,
    /// Keep the head's state (its raft log and snapshots) in this directory, so that it
    /// survives a restart [default: in memory only]. Created if missing; a directory of
    /// another group or replica is refused.
    #[arg(long, env = "ESCHER_HEAD_DATA_DIR", value_name = "DIR")]
    data_dir: Option<std::path::PathBuf>,
    /// Start a new head group from this backup (`escher admin snapshot save FILE`): tasks,
    /// results, nodes, resources and tokens as they were when it was taken. Only into an empty
    /// --data-dir; give every replica of the new group the same file. It is a new incarnation
    /// of the cluster: ids given out after the backup are never given out again (new ids start
    /// far above them), and returning workers are reconciled with the backup (attempts that
    /// may have ended after it run again; what it does not know is stopped).
    #[arg(long, value_name = "FILE")]
    restore: Option<std::path::PathBuf>,
    /// This head's replica id in its group (with --peers, or --join).
    #[arg(long, env = "ESCHER_HEAD_ID", default_value_t = 1, value_name = "N")]
    id: u64,
    /// Every replica of the group, this one included, as ID=HOST:PORT (the address the
    /// others reach it at; it serves clients and workers there too), e.g.
    /// `1=10.0.0.1:7600,2=10.0.0.2:7600,3=10.0.0.3:7600`. Every replica gets the same list.
    #[arg(long, env = "ESCHER_HEAD_PEERS", value_name = "ID=HOST:PORT,...", value_parser = parse_peers)]
    peers: Option<BTreeMap<u64, String>>,
    /// The group's id [default: derived from --peers; `escher` for a group of one]. Replicas
    /// only talk to replicas of their own group; `escher heads` shows it.
    #[arg(long, env = "ESCHER_HEAD_GROUP", value_name = "GROUP")]
    group: Option<String>,
    /// Join an existing group instead of creating one: start with an empty log and wait for
    /// the group's leader, after `escher heads add ID=HOST:PORT`. Give the group's --group
    /// (`escher heads` shows it).
    #[arg(long, requires = "group")]
    join: bool,
    /// Milliseconds between raft ticks. A follower stands for election after 10 to 20 ticks
    /// without hearing from a leader; the leader sends a heartbeat every 2.
    #[arg(
        long,
        env = "ESCHER_RAFT_TICK_MS",
        default_value_t = 50,
        value_name = "MS"
    )]
    raft_tick_ms: u64,
    /// Bytes of log written since the last snapshot that trigger a new snapshot (and a
    /// compaction of the log), when the last snapshot was smaller than that; otherwise the
    /// log may grow to the size of the last snapshot first.
    #[arg(long, default_value_t = DEFAULT_SNAPSHOT_BYTES, value_name = "BYTES")]
    snapshot_log_bytes: u64,
    /// Keep the whole record (status, result, reason, times) of at most this many finished
    /// tasks, the most recently finished. An older one shrinks to a tombstone, and `escher get`
    /// on it says "evicted by retention (succeeded at ...)".
    #[arg(long, env = "ESCHER_RETAIN_FINISHED", value_name = "COUNT", default_value_t = RetentionPolicy::default().finished)]
    retain_finished: usize,
    /// Keep a finished task's whole record at most this long after it finished (`90s`, `30m`,
    /// `24h`, `7days`); whichever of this and --retain-finished is reached first evicts.
    #[arg(long, env = "ESCHER_RETAIN_FOR", value_name = "DURATION", default_value_t = RetentionPolicy::default().finished_for.into())]
    retain_for: humantime::Duration,
    /// Keep the tombstones (final state and finish time) of this many evicted tasks, the
    /// highest ids; older ids answer "evicted by retention (its record is no longer kept)".
    /// Default: ten times --retain-finished.
    #[arg(long, env = "ESCHER_RETAIN_TOMBSTONES", value_name = "COUNT")]
    retain_tombstones: Option<usize>,
    /// Keep a dead node's whole record this long after it left; then only its name, and when
    /// and why it left, are kept (for the 1,000 most recent such nodes).
    #[arg(long, env = "ESCHER_RETAIN_DEAD_NODES_FOR", value_name = "DURATION", default_value_t = RetentionPolicy::default().dead_nodes_for.into())]
    retain_dead_nodes_for: humantime::Duration,
    /// A node with a walltime (`escher.ends-at`, a worker's --walltime or Slurm allocation)
    /// takes a task without a time limit, or a reservation, only while it has at least this
    /// long left (`30m`, `2h`); with no node that does, they wait with reason
    /// escher.walltime. 0s (the default): until the node drains. Every head of a group must
    /// be given the same.
    #[arg(
        long,
        env = "ESCHER_MIN_TIME_LEFT",
        value_name = "DURATION",
        default_value = "0s"
    )]
    min_time_left: humantime::Duration,
}

/// `1=HOST:PORT,2=HOST:PORT`: every entry an id and an address.
fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, address) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("{part:?}: {id:?} is not a replica id (a number from 1)"))?;
        if peers.insert(id, address.trim().to_string()).is_some() {
            return Err(format!("replica {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("the list is empty; give ID=HOST:PORT for every replica".into());
    }
    Ok(peers)
}

impl TryFrom<HeadArgs> for HeadConfig {
    type Error = escher_head::runtime::ConfigError;

    fn try_from(args: HeadArgs) -> Result<Self, Self::Error> {
        let mut replica = match args.peers {
            Some(peers) => ReplicaConfig::member(args.id, peers, args.group)?,
            None => ReplicaConfig {
                id: args.id,
                group: args.group.unwrap_or_else(|| SINGLE_GROUP.to_string()),
                ..ReplicaConfig::single("")
            },
        };
        replica.join = args.join;
        replica.tick = Duration::from_millis(args.raft_tick_ms);
        replica.snapshot_bytes = args.snapshot_log_bytes;
        let config = HeadConfig {
            heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
            heartbeat_timeout: Duration::from_millis(args.heartbeat_timeout_ms),
            max_message_bytes: args.max_message_bytes,
            idle_timeout: args.idle_timeout.into(),
            object_session_lapse: args.object_session_lapse.into(),
            metrics: args.metrics,
            dashboard: args.dashboard,
            watch_history: args.watch_history,
            watch_buffer: args.watch_buffer,
            state: StateConfig {
                max_result_bytes: args.max_result_bytes,
                namespace_unfinished: args.namespace_unfinished_tasks,
                namespace_result_bytes: args.namespace_result_bytes,
                namespace_resources: args.namespace_resources,
                namespace_object_bytes: args.namespace_object_bytes,
                max_task_bytes: args.max_task_bytes,
                namespace_spec_bytes: args.namespace_spec_bytes,
                min_time_left: args.min_time_left.into(),
                retention: RetentionPolicy {
                    finished: args.retain_finished,
                    finished_for: args.retain_for.into(),
                    tombstones: args
                        .retain_tombstones
                        .unwrap_or_else(|| RetentionPolicy::tombstones_for(args.retain_finished)),
                    dead_nodes_for: args.retain_dead_nodes_for.into(),
                    ..RetentionPolicy::default()
                },
            },
            replica,
            data_dir: args.data_dir,
            restore: args.restore,
            ..HeadConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = HeadArgs::parse();
    match escher_head::runtime::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(limit, "open files allowed"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
    let listen = args.listen;
    let address_file = args.address_file.clone();
    let access_path = escher_proto::access::location(args.access_file.as_deref())?;
    // Tokens must not cross a network in clear text: TLS whenever the head is reachable from
    // beyond this machine.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(TlsIdentity::from_files(cert, key, args.tls_ca.as_deref())?)
        }
        _ if args.tls || !listen.ip().is_loopback() => {
            let dir = access_path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            Some(TlsIdentity::generated(dir, listen.ip())?)
        }
        _ => None,
    };
    let mut config = HeadConfig::try_from(args)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let local = listener.local_addr()?;
    // A head on every interface is reached on this machine through loopback.
    let host = if local.ip().is_unspecified() {
        std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), local.port())
    } else {
        local
    };
    let url = format!("{scheme}://{host}");
    let trust = tls
        .as_ref()
        .map(|t| (t.ca_pem.as_str(), t.server_name.as_deref()));
    let (access, created) =
        escher_proto::access::AccessFile::open_or_create(&access_path, &url, trust)?;
    config.access = access;
    config.access_path = Some(access_path.clone());
    config.tls = tls;
    if created {
        tracing::info!(path = %access_path.display(), "wrote the access file (admin and worker join tokens); the CLI, clients and workers of this machine use it with no flag");
    } else {
        tracing::info!(path = %access_path.display(), "using the access file");
    }
    // Written by the head once it serves (its data directory open and checked).
    config.address_file = address_file.map(|path| AddressFile { path, url });
    escher_head::run(listener, config, shutdown_signal()).await?;
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::warn!(%err, "cannot watch SIGTERM; only Ctrl-C stops the head");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<HeadConfig, String> {
        let args =
            HeadArgs::try_parse_from(std::iter::once("escher-head").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        HeadConfig::try_from(args).map_err(|e| e.to_string())
    }

    #[test]
    fn a_lone_head_is_a_group_of_one() {
        let c = config(&[]).unwrap();
        assert_eq!(c.replica.id, 1);
        assert!(c.replica.peers.is_empty());
        assert_eq!(c.replica.group, SINGLE_GROUP);
        assert!(!c.replica.join);
    }

    #[test]
    fn a_replica_takes_its_address_from_the_peer_list() {
        let c = config(&[
            "--id",
            "2",
            "--peers",
            "1=127.0.0.1:7600, 2=127.0.0.1:7601,3=127.0.0.1:7602",
            "--raft-tick-ms",
            "10",
        ])
        .unwrap();
        assert_eq!(c.replica.address, "127.0.0.1:7601");
        assert_eq!(c.replica.peers.len(), 3);
        assert_eq!(c.replica.tick, Duration::from_millis(10));
        assert!(c.replica.group.starts_with("escher-"));
    }

    #[test]
    fn bad_replica_flags_say_what_is_wrong() {
        let err = config(&["--id", "4", "--peers", "1=h:1,2=h:2"]).unwrap_err();
        assert!(
            err.contains("does not include this replica's own --id 4"),
            "{err}"
        );
        let err = config(&["--peers", "1=h:1,1=h:2"]).unwrap_err();
        assert!(err.contains("listed twice"), "{err}");
        let err = config(&["--peers", "one=h:1"]).unwrap_err();
        assert!(err.contains("not a replica id"), "{err}");
        let err = config(&["--join"]).unwrap_err();
        assert!(err.contains("--group"), "{err}");
        let err = config(&["--raft-tick-ms", "0"]).unwrap_err();
        assert!(err.contains("--raft-tick-ms"), "{err}");
    }
}
