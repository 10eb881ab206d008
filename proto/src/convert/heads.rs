//! Conversions of the head-group calls: `Heads`, `ChangeHeads`, and a replica's status.

use super::{ConvertError, MAX_ADDRESS_BYTES, Problem, check_len, required};
use crate::types::{HeadChange, HeadReplica, HeadsReply, ReplicaRole};
use crate::wire;

impl From<ReplicaRole> for wire::ReplicaRole {
    fn from(r: ReplicaRole) -> Self {
        match r {
            ReplicaRole::Leader => wire::ReplicaRole::Leader,
            ReplicaRole::Follower => wire::ReplicaRole::Follower,
            ReplicaRole::Candidate => wire::ReplicaRole::Candidate,
            ReplicaRole::PreCandidate => wire::ReplicaRole::PreCandidate,
        }
    }
}

fn role(raw: i32) -> Option<ReplicaRole> {
    match wire::ReplicaRole::try_from(raw).ok()? {
        wire::ReplicaRole::Leader => Some(ReplicaRole::Leader),
        wire::ReplicaRole::Follower => Some(ReplicaRole::Follower),
        wire::ReplicaRole::Candidate => Some(ReplicaRole::Candidate),
        wire::ReplicaRole::PreCandidate => Some(ReplicaRole::PreCandidate),
        wire::ReplicaRole::Unspecified => None,
    }
}

/// A data format as the wire carries it: 0 (a release that did not tell) or out of range is
/// unknown.
fn format(raw: u32) -> Option<u16> {
    u16::try_from(raw).ok().filter(|f| *f > 0)
}

impl From<HeadReplica> for wire::HeadReplica {
    fn from(r: HeadReplica) -> Self {
        wire::HeadReplica {
            id: r.id,
            address: r.address,
            role: r.role.map_or(0, |r| wire::ReplicaRole::from(r).into()),
            term: r.term,
            commit_index: r.commit_index,
            applied_index: r.applied_index,
            reachable: r.reachable,
            error: r.error,
            leader: r.leader,
            in_memory: r.in_memory,
            data_format: r.data_format.map_or(0, u32::from),
            writes_data_format: r.writes_data_format.map_or(0, u32::from),
            stalled: r.stalled,
        }
    }
}

impl TryFrom<wire::HeadReplica> for HeadReplica {
    type Error = ConvertError;
    fn try_from(w: wire::HeadReplica) -> Result<Self, ConvertError> {
        check_len("address", &w.address, MAX_ADDRESS_BYTES)?;
        // An unreachable replica has no role; an unknown value from a newer head reads as none.
        Ok(HeadReplica {
            id: w.id,
            address: w.address,
            role: role(w.role),
            term: w.term,
            commit_index: w.commit_index,
            applied_index: w.applied_index,
            reachable: w.reachable,
            error: w.error,
            leader: w.leader,
            in_memory: w.in_memory,
            data_format: format(w.data_format),
            writes_data_format: format(w.writes_data_format),
            stalled: w.stalled,
        })
    }
}

impl From<HeadsReply> for wire::HeadsReply {
    fn from(r: HeadsReply) -> Self {
        wire::HeadsReply {
            group: r.group,
            replicas: r.replicas.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::HeadsReply> for HeadsReply {
    type Error = ConvertError;
    fn try_from(w: wire::HeadsReply) -> Result<Self, ConvertError> {
        Ok(HeadsReply {
            group: w.group,
            replicas: super::convert_list(w.replicas, "replicas", usize::MAX, TryFrom::try_from)?,
        })
    }
}

impl From<HeadChange> for wire::ChangeHeadsRequest {
    fn from(c: HeadChange) -> Self {
        use wire::change_heads_request::Change;
        let change = match c {
            HeadChange::Add { id, address } => Change::Add(wire::AddHead { id, address }),
            HeadChange::Remove { id } => Change::Remove(id),
        };
        wire::ChangeHeadsRequest {
            change: Some(change),
        }
    }
}

impl TryFrom<wire::ChangeHeadsRequest> for HeadChange {
    type Error = ConvertError;
    fn try_from(w: wire::ChangeHeadsRequest) -> Result<Self, ConvertError> {
        use wire::change_heads_request::Change;
        let rule = |path: &str, why| Err(ConvertError::new(path, Problem::Rule(why)));
        match required(w.change, "change")? {
            Change::Add(a) => {
                if a.id == 0 {
                    return rule("add.id", "must not be 0");
                }
                check_len("add.address", &a.address, MAX_ADDRESS_BYTES)?;
                if !is_host_port(&a.address) {
                    return rule("add.address", "must be HOST:PORT, e.g. 10.0.0.3:7600");
                }
                Ok(HeadChange::Add {
                    id: a.id,
                    address: a.address,
                })
            }
            Change::Remove(0) => rule("remove", "must not be 0"),
            Change::Remove(id) => Ok(HeadChange::Remove { id }),
        }
    }
}

/// Whether `text` reads as `HOST:PORT` (a host name or address, and a port number).
pub fn is_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    !host.is_empty()
        && !host.contains('/')
        && !host.chars().any(char::is_whitespace)
        && port.parse::<u16>().is_ok_and(|p| p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::round_trip;

    #[test]
    fn replicas_round_trip() {
        let reply = HeadsReply {
            group: "g-1".into(),
            replicas: vec![
                HeadReplica {
                    id: 1,
                    address: "127.0.0.1:7600".into(),
                    role: Some(ReplicaRole::Leader),
                    term: 3,
                    commit_index: 40,
                    applied_index: 40,
                    reachable: true,
                    error: None,
                    leader: Some(1),
                    in_memory: false,
                    data_format: Some(2),
                    writes_data_format: Some(1),
                    stalled: None,
                },
                HeadReplica {
                    id: 2,
                    address: "127.0.0.1:7601".into(),
                    role: None,
                    term: 0,
                    commit_index: 0,
                    applied_index: 0,
                    reachable: false,
                    error: Some("connection refused".into()),
                    leader: None,
                    in_memory: true,
                    data_format: None,
                    writes_data_format: None,
                    stalled: None,
                },
            ],
        };
        round_trip::<_, wire::HeadsReply>(reply.clone());
        assert_eq!(reply.leader().map(|r| r.id), Some(1));
        // A stalled leader that has not yet heard of its successor is not the one to follow.
        let mut two = reply.clone();
        two.replicas[0].stalled = Some("the raft log's disk has been full for 3.0s".into());
        two.replicas[1] = HeadReplica {
            role: Some(ReplicaRole::Leader),
            term: 4,
            reachable: true,
            error: None,
            ..two.replicas[0].clone()
        };
        two.replicas[1].id = 2;
        two.replicas[1].stalled = None;
        round_trip::<_, wire::HeadsReply>(two.clone());
        assert_eq!(two.leader().map(|r| r.id), Some(2));
        assert_eq!(reply.replicas[1].url(), "http://127.0.0.1:7601");
    }

    #[test]
    fn membership_changes_are_checked() {
        let add = HeadChange::Add {
            id: 4,
            address: "10.0.0.4:7600".into(),
        };
        round_trip::<_, wire::ChangeHeadsRequest>(add);
        round_trip::<_, wire::ChangeHeadsRequest>(HeadChange::Remove { id: 2 });
        let bad = wire::ChangeHeadsRequest::from(HeadChange::Add {
            id: 4,
            address: "http://10.0.0.4:7600".into(),
        });
        let err = HeadChange::try_from(bad).unwrap_err().to_string();
        assert!(err.contains("HOST:PORT"), "{err}");
        let zero = wire::ChangeHeadsRequest::from(HeadChange::Remove { id: 0 });
        assert_eq!(HeadChange::try_from(zero).unwrap_err().path(), "remove");
        let none = wire::ChangeHeadsRequest { change: None };
        assert!(HeadChange::try_from(none).is_err());
        assert!(is_host_port("localhost:7600") && is_host_port("[::1]:7600"));
        assert!(!is_host_port("host") && !is_host_port("host:0") && !is_host_port(":80"));
    }
}
