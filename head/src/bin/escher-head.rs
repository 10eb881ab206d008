//! `escher-head`: runs the head of an escher cluster.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use escher_head::HeadConfig;
use escher_head::state::{RetentionPolicy, StateConfig};

/// Runs the head of an escher cluster: the resource table, the scheduler, and the API that
/// clients and workers connect to.
#[derive(Debug, Parser)]
#[command(name = "escher-head", version)]
struct HeadArgs {
    /// Address to listen on for clients and workers.
    #[arg(long, env = "ESCHER_HEAD_LISTEN", default_value = "127.0.0.1:7600")]
    listen: SocketAddr,
    /// Once listening, write the head's URL (`http://HOST:PORT`) to this file; with
    /// `--listen 127.0.0.1:0` this is how scripts and tests learn the port that was chosen.
    #[arg(long, env = "ESCHER_HEAD_ADDRESS_FILE")]
    address_file: Option<std::path::PathBuf>,
    /// How often workers send heartbeats, in milliseconds.
    #[arg(long, env = "ESCHER_HEARTBEAT_INTERVAL_MS", default_value_t = 1_000)]
    heartbeat_interval_ms: u64,
    /// A worker silent this long (milliseconds) is declared lost and its tasks are retried.
    #[arg(long, env = "ESCHER_HEARTBEAT_TIMEOUT_MS", default_value_t = 10_000)]
    heartbeat_timeout_ms: u64,
    /// The largest function result the head stores, in bytes.
    #[arg(long, env = "ESCHER_MAX_RESULT_BYTES", default_value_t = StateConfig::default().max_result_bytes)]
    max_result_bytes: usize,
    /// The largest request or reply the head accepts or sends, in bytes.
    #[arg(long, env = "ESCHER_MAX_MESSAGE_BYTES", default_value_t = HeadConfig::default().max_message_bytes)]
    max_message_bytes: usize,
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
}

impl TryFrom<HeadArgs> for HeadConfig {
    type Error = escher_head::runtime::ConfigError;

    fn try_from(args: HeadArgs) -> Result<Self, Self::Error> {
        let config = HeadConfig {
            heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
            heartbeat_timeout: Duration::from_millis(args.heartbeat_timeout_ms),
            max_message_bytes: args.max_message_bytes,
            state: StateConfig {
                max_result_bytes: args.max_result_bytes,
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
    let listen = args.listen;
    let address_file = args.address_file.clone();
    let config = HeadConfig::try_from(args)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    if let Some(path) = address_file {
        let url = format!("http://{}", listener.local_addr()?);
        // Write then rename, so a reader never sees a half-written file.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &url).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    }
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
