//! The replicas of a replicated head (docs/DESIGN.md §7), as `escher heads` reports them, and the
//! membership changes an operator asks for.

use serde::{Deserialize, Serialize};

/// What a replica does in its raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaRole {
    /// It leads: it serves writes, linearizable reads and workers.
    Leader,
    /// It follows the leader.
    Follower,
    /// It stands for election.
    Candidate,
    /// It asks whether it could win before standing (raft's pre-vote).
    PreCandidate,
}

impl std::fmt::Display for ReplicaRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReplicaRole::Leader => "leader",
            ReplicaRole::Follower => "follower",
            ReplicaRole::Candidate => "candidate",
            ReplicaRole::PreCandidate => "pre-candidate",
        })
    }
}

/// One replica of the head group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadReplica {
    /// Its replica id.
    pub id: u64,
    /// The address it serves on, `HOST:PORT`.
    pub address: String,
    /// Its role; `None` when it could not be reached.
    pub role: Option<ReplicaRole>,
    /// Its raft term.
    pub term: u64,
    /// The highest log index it knows committed.
    pub commit_index: u64,
    /// The highest log index it has applied.
    pub applied_index: u64,
    /// Whether it answered.
    pub reachable: bool,
    /// Why it could not be reached.
    pub error: Option<String>,
    /// The replica it believes leads.
    pub leader: Option<u64>,
    /// Whether its log lives in memory only.
    pub in_memory: bool,
    /// The newest data format it reads (DESIGN §14); `None` when unreachable, or from a
    /// release before replicas told their formats.
    pub data_format: Option<u16>,
    /// The data format it writes: the newest one every replica of its group reads.
    pub writes_data_format: Option<u16>,
    /// Why it cannot make progress now (its raft log's disk is full); `None` when it can. A
    /// stalled leader keeps its role until the others elect another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
}

impl HeadReplica {
    /// The replica's URL, `http://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

/// Every replica of the head group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadsReply {
    /// The group's id.
    pub group: String,
    /// The replicas, by id.
    pub replicas: Vec<HeadReplica>,
}

impl HeadsReply {
    /// The replica that leads, if one does by its own account: of several that say so (a
    /// stalled or cut-off leader that has not yet heard of its successor), one that is not
    /// stalled, in the highest term.
    pub fn leader(&self) -> Option<&HeadReplica> {
        self.replicas
            .iter()
            .filter(|r| r.role == Some(ReplicaRole::Leader))
            .max_by_key(|r| (r.stalled.is_none(), r.term))
    }
}

/// A change of the head group's membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HeadChange {
    /// Add the replica with this id, reached at `address` (`HOST:PORT`).
    Add {
        /// Its replica id.
        id: u64,
        /// Its address.
        address: String,
    },
    /// Remove the replica with this id.
    Remove {
        /// Its replica id.
        id: u64,
    },
}
