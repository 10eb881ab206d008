//! How a head runs: timeouts, limits, its place in a replicated group. Defaults are defined
//! here, once.

use std::path::PathBuf;
use std::time::Duration;

use escher_proto::access::AccessFile;
use thiserror::Error;

use crate::replication::{ReplicaConfig, ReplicaConfigError};
use crate::state::StateConfig;

/// How long an object session lives without a renewal, unless `--object-session-lapse` says.
pub const DEFAULT_OBJECT_SESSION_LAPSE: Duration = Duration::from_secs(30);

/// The shortest lapse: a client renews three times per lapse, and the leader checks lapses
/// once a second.
pub const MIN_OBJECT_SESSION_LAPSE: Duration = Duration::from_secs(1);

/// The head's runtime settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadConfig {
    /// How often workers send heartbeats.
    pub heartbeat_interval: Duration,
    /// A worker silent for this long is declared lost; its tasks are retried elsewhere.
    pub heartbeat_timeout: Duration,
    /// How often the head checks heartbeats and pending deadlines.
    pub tick_interval: Duration,
    /// The largest gRPC message the head accepts or sends.
    pub max_message_bytes: usize,
    /// A connection whose peer has sent nothing for this long is closed (the head pings every
    /// connection three times per timeout, so live clients always answer).
    pub idle_timeout: Duration,
    /// How long a log request waits for the worker that holds the log.
    pub log_fetch_timeout: Duration,
    /// An object session its client has not renewed for this long lapses: the leader releases
    /// its objects (`runtime/object_sessions.rs`).
    pub object_session_lapse: Duration,
    /// Settings of the replicated state.
    pub state: StateConfig,
    /// Which replica of which raft group this head is (a group of one by default). An empty
    /// `address` is filled in with the address the head listens on.
    pub replica: ReplicaConfig,
    /// Where the raft log lives (`--data-dir`); `None` keeps it in memory.
    pub data_dir: Option<PathBuf>,
    /// A backup to start a new group from (`--restore FILE`, `escher admin snapshot save`):
    /// only into an empty log.
    pub restore: Option<PathBuf>,
    /// The group's access file: the bootstrap admin and worker join tokens every call is
    /// checked against (docs/DESIGN.md §10). The default has fresh random tokens, so a head built
    /// from defaults admits nobody who was not given them (`escher_proto::access::registered`
    /// finds them in the same process).
    pub access: AccessFile,
    /// Where `access` was read from: the head records there which cluster it is, once its
    /// group has named it (`AccessFile::record_cluster`), so that a backup of another cluster
    /// is refused later. `None` (an embedded head) records nothing.
    pub access_path: Option<PathBuf>,
    /// The head's TLS identity: `None` serves plain HTTP/2 (loopback only; see the binary).
    pub tls: Option<super::TlsIdentity>,
    /// Where to serve Prometheus metrics (`GET /metrics`, a token needed like any call);
    /// `None` serves none.
    pub metrics: Option<std::net::SocketAddr>,
    /// Where to serve the web dashboard (its API needs a token like any call); loopback only.
    pub dashboard: Option<std::net::SocketAddr>,
    /// Write the head's URL to a file once it serves (its replica and data directory are
    /// open): a script that waits for the file knows the head is ready.
    pub address_file: Option<AddressFile>,
    /// How many recent events the head keeps for watchers that resume (`Watch` after a
    /// revision); a watcher further behind is told to list the state again.
    pub watch_history: usize,
    /// How many events one watcher may have waiting before the head cuts it off (it then
    /// resumes from the last revision it saw, while the history still holds it).
    pub watch_buffer: usize,
    /// Check every call's token (the default, and the only setting `escher-head` has). Off,
    /// every caller is an admin: the benchmark harness turns it off to measure what
    /// authentication costs, nothing else should.
    pub authenticate: bool,
}

impl Default for HeadConfig {
    fn default() -> Self {
        HeadConfig {
            heartbeat_interval: Duration::from_millis(1_000),
            heartbeat_timeout: Duration::from_millis(10_000),
            tick_interval: Duration::from_millis(100),
            max_message_bytes: 64 * 1024 * 1024,
            idle_timeout: Duration::from_secs(30),
            log_fetch_timeout: Duration::from_secs(10),
            object_session_lapse: DEFAULT_OBJECT_SESSION_LAPSE,
            state: StateConfig::default(),
            replica: ReplicaConfig::single(""),
            data_dir: None,
            restore: None,
            access: AccessFile::generate(Vec::new()),
            access_path: None,
            tls: None,
            metrics: None,
            dashboard: None,
            address_file: None,
            watch_history: 100_000,
            watch_buffer: 16_384,
            authenticate: true,
        }
    }
}

/// Where a head writes its URL once it serves (`escher-head --address-file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressFile {
    /// The file.
    pub path: PathBuf,
    /// The URL written, as this machine reaches the head.
    pub url: String,
}

/// A setting that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// Metrics are served over plain HTTP: only on a loopback address.
    #[error(
        "--metrics {0}: metrics are served over plain HTTP, so only on a loopback address \
         (127.0.0.1:9090); scrape them with a Prometheus agent on this machine, or through an \
         SSH tunnel"
    )]
    MetricsNotLoopback(std::net::SocketAddr),
    /// The dashboard is served over plain HTTP: only on a loopback address.
    #[error(
        "--dashboard {0}: the dashboard is served over plain HTTP, so only on a loopback \
         address (127.0.0.1:8265); from another machine, reach it through an SSH tunnel \
         (ssh -L 8265:127.0.0.1:8265 HEAD-MACHINE)"
    )]
    DashboardNotLoopback(std::net::SocketAddr),
    /// An object session lapse so short that live clients could not renew in time.
    #[error(
        "the object session lapse (--object-session-lapse {0:?}) must be at least 1s: clients \
         renew three times per lapse"
    )]
    ObjectSessionLapse(Duration),
    /// An idle timeout so short that live clients could not answer the pings in time.
    #[error("the idle timeout ({0:?}) must be at least 1s")]
    IdleTimeout(Duration),
    /// The heartbeat timeout must leave room for a few heartbeats.
    #[error(
        "heartbeat timeout ({timeout:?}) must be at least three times the heartbeat interval \
         ({interval:?}): a worker's lease, half the timeout, must outlast more than one \
         heartbeat"
    )]
    HeartbeatTimeout {
        /// The timeout.
        timeout: Duration,
        /// The interval.
        interval: Duration,
    },
    /// A duration or size is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The replica settings are inconsistent.
    #[error(transparent)]
    Replica(#[from] ReplicaConfigError),
    /// Results cannot be larger than the messages that carry them.
    #[error(
        "max result size ({result} bytes) must be smaller than the max message size \
         ({message} bytes)"
    )]
    ResultTooLarge {
        /// The result limit.
        result: usize,
        /// The message limit.
        message: usize,
    },
}

impl HeadConfig {
    /// Checks that the settings make sense together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (value, name) in [
            (self.heartbeat_interval, "heartbeat interval"),
            (self.tick_interval, "tick interval"),
            (self.log_fetch_timeout, "log fetch timeout"),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.max_message_bytes == 0 {
            return Err(ConfigError::Zero("max message size"));
        }
        if self.idle_timeout < Duration::from_secs(1) {
            return Err(ConfigError::IdleTimeout(self.idle_timeout));
        }
        if self.object_session_lapse < MIN_OBJECT_SESSION_LAPSE {
            return Err(ConfigError::ObjectSessionLapse(self.object_session_lapse));
        }
        if let Some(addr) = self.metrics
            && !addr.ip().is_loopback()
        {
            return Err(ConfigError::MetricsNotLoopback(addr));
        }
        if let Some(addr) = self.dashboard
            && !addr.ip().is_loopback()
        {
            return Err(ConfigError::DashboardNotLoopback(addr));
        }
        let retention = &self.state.retention;
        if retention.finished == 0 {
            return Err(ConfigError::Zero(
                "the number of finished tasks kept (--retain-finished)",
            ));
        }
        if retention.finished_for.is_zero() {
            return Err(ConfigError::Zero(
                "how long finished tasks are kept (--retain-for)",
            ));
        }
        if self.heartbeat_timeout < self.heartbeat_interval * 3 {
            return Err(ConfigError::HeartbeatTimeout {
                timeout: self.heartbeat_timeout,
                interval: self.heartbeat_interval,
            });
        }
        self.replica.validate()?;
        if self.state.max_result_bytes >= self.max_message_bytes {
            return Err(ConfigError::ResultTooLarge {
                result: self.state.max_result_bytes,
                message: self.max_message_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RetentionPolicy;

    #[test]
    fn retention_must_keep_something() {
        let mut config = HeadConfig::default();
        config.validate().unwrap();
        config.state.retention = RetentionPolicy {
            finished: 0,
            ..RetentionPolicy::default()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the number of finished tasks kept (--retain-finished) must be greater than zero"
        );
        config.state.retention = RetentionPolicy {
            finished_for: Duration::ZERO,
            ..RetentionPolicy::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--retain-for")
        );
        config.state.retention = RetentionPolicy {
            tombstones: 0,
            dead_nodes_for: Duration::ZERO,
            ..RetentionPolicy::unbounded()
        };
        config.validate().unwrap();
    }

    #[test]
    fn an_object_session_lapse_under_a_second_is_refused_naming_the_flag() {
        let mut config = HeadConfig {
            object_session_lapse: Duration::from_millis(999),
            ..HeadConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("--object-session-lapse"), "{err}");
        config.object_session_lapse = Duration::from_secs(1);
        config.validate().unwrap();
    }
}
