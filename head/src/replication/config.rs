//! [`ReplicaConfig`]: which replica of which group a head is, who its peers are, and how fast
//! raft ticks. Defaults are defined here, once.

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

/// How often raft ticks unless told otherwise (`--raft-tick-ms`).
pub const DEFAULT_TICK: Duration = Duration::from_millis(50);
/// Ticks without a leader's message before a follower stands for election (randomised by raft
/// between this and twice this).
pub const DEFAULT_ELECTION_TICKS: usize = 10;
/// Ticks between a leader's heartbeats.
pub const DEFAULT_HEARTBEAT_TICKS: usize = 2;
/// Log bytes since the last snapshot that trigger a new one (and compaction), unless the last
/// snapshot was larger: then its size (see [`ReplicaConfig::snapshot_bytes`]).
pub const DEFAULT_SNAPSHOT_BYTES: u64 = 4 * 1024 * 1024;
/// The group id of a head that is a group of one and was given no `--group`.
pub const SINGLE_GROUP: &str = "escher";

/// One replica's place in its raft group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// This replica's id (`--id`), at least 1.
    pub id: u64,
    /// Every replica of the group at its creation, this one included, by id: `HOST:PORT`
    /// (`--peers`). Empty for a group of one.
    pub peers: BTreeMap<u64, String>,
    /// The group's id: replicas of one group talk only to one another, and a data directory
    /// belongs to one group.
    pub group: String,
    /// This replica's own address as its peers reach it (its entry in `peers`, or the listen
    /// address for a group of one).
    pub address: String,
    /// Join an existing group (added with `escher heads add`) instead of creating one.
    pub join: bool,
    /// How often raft ticks.
    pub tick: Duration,
    /// Election timeout, in ticks.
    pub election_ticks: usize,
    /// Heartbeat interval, in ticks.
    pub heartbeat_ticks: usize,
    /// Log bytes since the last snapshot that trigger a new one, at least: a snapshot is taken
    /// once the log since the last one is both this large and larger than that snapshot. So
    /// the log (kept in memory, and on disk with `--data-dir`) stays within about the size of
    /// the state, and snapshotting costs at most about as much as writing the log did.
    pub snapshot_bytes: u64,
    /// The group speaks TLS: replicas' URLs (the leader named to a caller) are `https://`.
    pub tls: bool,
}

impl ReplicaConfig {
    /// A group of one serving at `address`.
    pub fn single(address: impl Into<String>) -> ReplicaConfig {
        ReplicaConfig {
            id: 1,
            peers: BTreeMap::new(),
            group: SINGLE_GROUP.to_string(),
            address: address.into(),
            join: false,
            tick: DEFAULT_TICK,
            election_ticks: DEFAULT_ELECTION_TICKS,
            heartbeat_ticks: DEFAULT_HEARTBEAT_TICKS,
            snapshot_bytes: DEFAULT_SNAPSHOT_BYTES,
            tls: false,
        }
    }

    /// Replica `id` of the group made of `peers` (each `id -> HOST:PORT`), whose group id is
    /// derived from the peer list unless `group` names one.
    pub fn member(
        id: u64,
        peers: BTreeMap<u64, String>,
        group: Option<String>,
    ) -> Result<ReplicaConfig, ReplicaConfigError> {
        let address = peers
            .get(&id)
            .cloned()
            .ok_or_else(|| ReplicaConfigError::NotAPeer {
                id,
                peers: peers
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let group = group.unwrap_or_else(|| derived_group(&peers));
        let config = ReplicaConfig {
            id,
            peers,
            group,
            address,
            ..ReplicaConfig::single("")
        };
        config.validate()?;
        Ok(config)
    }

    /// The voters of a new group: every peer, or this replica alone.
    pub fn initial_voters(&self) -> Vec<u64> {
        if self.peers.is_empty() {
            vec![self.id]
        } else {
            self.peers.keys().copied().collect()
        }
    }

    /// The addresses of the replicas at creation, this one included.
    pub fn initial_members(&self) -> BTreeMap<u64, String> {
        if self.peers.is_empty() {
            BTreeMap::from([(self.id, self.address.clone())])
        } else {
            self.peers.clone()
        }
    }

    /// Checks the settings as a whole.
    pub fn validate(&self) -> Result<(), ReplicaConfigError> {
        if self.id == 0 {
            return Err(ReplicaConfigError::ZeroId);
        }
        if !self.peers.is_empty() && !self.peers.contains_key(&self.id) {
            return Err(ReplicaConfigError::NotAPeer {
                id: self.id,
                peers: self
                    .peers
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if self.peers.contains_key(&0) {
            return Err(ReplicaConfigError::ZeroId);
        }
        let mut seen = BTreeMap::new();
        for (id, address) in &self.peers {
            if !escher_proto::convert::is_host_port(address) {
                return Err(ReplicaConfigError::BadAddress {
                    id: *id,
                    address: address.clone(),
                });
            }
            if let Some(other) = seen.insert(address.clone(), *id) {
                return Err(ReplicaConfigError::SharedAddress {
                    address: address.clone(),
                    ids: (other, *id),
                });
            }
        }
        if self.group.is_empty()
            || self.group.len() > 256
            || self.group.contains(char::is_whitespace)
        {
            return Err(ReplicaConfigError::BadGroup(self.group.clone()));
        }
        if self.tick.is_zero() {
            return Err(ReplicaConfigError::ZeroTick);
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return Err(ReplicaConfigError::Ticks {
                election: self.election_ticks,
                heartbeat: self.heartbeat_ticks,
            });
        }
        Ok(())
    }
}

/// The group id of a group created from `peers`: the same on every replica started with the
/// same list, and different for another list.
pub fn derived_group(peers: &BTreeMap<u64, String>) -> String {
    let text: String = peers
        .iter()
        .map(|(id, address)| format!("{id}={address};"))
        .collect();
    // FNV-1a, 64 bits: a stable fingerprint of the list, not a secret.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("escher-{hash:016x}")
}

/// A replica setting that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplicaConfigError {
    /// Ids start at 1.
    #[error("replica ids start at 1; 0 is not a valid --id or --peers id")]
    ZeroId,
    /// The peer list does not name this replica.
    #[error(
        "--peers does not include this replica's own --id {id} (it lists {peers}); list every \
         replica of the group, this one included, as ID=HOST:PORT"
    )]
    NotAPeer {
        /// This replica's id.
        id: u64,
        /// The ids listed.
        peers: String,
    },
    /// A peer address is not `HOST:PORT`.
    #[error("--peers {id}={address}: the address must be HOST:PORT, e.g. 10.0.0.2:7600")]
    BadAddress {
        /// The peer.
        id: u64,
        /// What was given.
        address: String,
    },
    /// Two peers share an address.
    #[error("--peers lists {address} for both replica {} and replica {}; each replica needs an address of its own", ids.0, ids.1)]
    SharedAddress {
        /// The address.
        address: String,
        /// The two ids.
        ids: (u64, u64),
    },
    /// The group id is empty, too long or has spaces.
    #[error("--group {0:?}: a group id is 1 to 256 characters without spaces")]
    BadGroup(String),
    /// Raft must tick.
    #[error("--raft-tick-ms must be greater than zero")]
    ZeroTick,
    /// The election timeout must be longer than the heartbeat interval.
    #[error(
        "the election timeout ({election} ticks) must be longer than the heartbeat interval \
         ({heartbeat} ticks, at least 1)"
    )]
    Ticks {
        /// Election ticks.
        election: usize,
        /// Heartbeat ticks.
        heartbeat: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(list: &[(u64, &str)]) -> BTreeMap<u64, String> {
        list.iter().map(|(i, a)| (*i, a.to_string())).collect()
    }

    #[test]
    fn a_member_must_be_among_its_peers() {
        let p = peers(&[
            (1, "127.0.0.1:7600"),
            (2, "127.0.0.1:7601"),
            (3, "127.0.0.1:7602"),
        ]);
        let c = ReplicaConfig::member(2, p.clone(), None).unwrap();
        assert_eq!(c.address, "127.0.0.1:7601");
        assert_eq!(c.initial_voters(), vec![1, 2, 3]);
        assert_eq!(c.group, derived_group(&p));
        assert_eq!(
            ReplicaConfig::member(1, p.clone(), None).unwrap().group,
            c.group,
            "every replica derives the same group id"
        );
        let err = ReplicaConfig::member(4, p, None).unwrap_err().to_string();
        assert!(
            err.contains("own --id 4") && err.contains("1, 2, 3"),
            "{err}"
        );
    }

    #[test]
    fn bad_peer_lists_say_what_is_wrong() {
        let shared = peers(&[(1, "h:1"), (2, "h:1")]);
        let err = ReplicaConfig::member(1, shared, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("both replica 1 and replica 2"), "{err}");
        let bad = peers(&[(1, "http://h:1")]);
        assert!(matches!(
            ReplicaConfig::member(1, bad, None),
            Err(ReplicaConfigError::BadAddress { .. })
        ));
        let zero = peers(&[(0, "h:1"), (1, "h:2")]);
        assert_eq!(
            ReplicaConfig::member(1, zero, None).unwrap_err(),
            ReplicaConfigError::ZeroId
        );
        let mut c = ReplicaConfig::single("h:1");
        c.election_ticks = 2;
        assert!(c.validate().is_err());
        c.election_ticks = 10;
        c.group = "a b".into();
        assert!(c.validate().is_err());
        assert_ne!(
            derived_group(&peers(&[(1, "h:1")])),
            derived_group(&peers(&[(1, "h:2")]))
        );
    }
}
