//! Registration numbers: which registration of a node a removal was judged on.
//!
//! The leader declares a node lost on its own clock (`escher_head::runtime::liveness`) and
//! proposes its removal; that removal applies later, in log order. Meanwhile the node's worker
//! may register again (a registration proposed before the removal, or a worker that came back
//! to a new leader), and the removal would then apply to a registration it never judged: the
//! live worker's tasks become failed attempts and run again elsewhere while it still runs
//! them, or the live node is dropped.
//!
//! So every registration applied from an entry that numbers them (data format 9 on in the
//! head's codec) gets a number, the event revision of its `Joined`/`Rejoined` event (unique and
//! increasing), and [`Command::RemoveJudgedNode`](super::Command::RemoveJudgedNode) names the
//! number of the registration its leader judged. Applied to another registration it changes
//! nothing, and says so in the head's log.
//!
//! Why only entries of that format number registrations: a replica that loaded a snapshot of
//! an earlier format (or of an earlier release) has no numbers for the registrations it
//! covers, while one that replayed the same entries would: numbering every registration would
//! make them disagree. A registration applied from an older entry therefore clears its node's
//! number (none on every replica alike), a snapshot with numbers is written in the format that
//! carries them, and a removal judged on "no number" stands while the node has none.

use std::collections::BTreeMap;

use escher_proto::types::NodeId;
use serde::{Deserialize, Serialize};

/// The number of each node's current registration, for the nodes whose registration was
/// numbered. Part of a snapshot from data format 9 on (written after the object table by the
/// head's codec).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registrations {
    numbers: BTreeMap<NodeId, u64>,
}

impl Registrations {
    /// The number of `node`'s current registration, if it has one.
    pub fn get(&self, node: NodeId) -> Option<u64> {
        self.numbers.get(&node).copied()
    }

    /// Whether no node has a number (a snapshot then needs no newer format for them).
    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }

    /// `node` registered: number `number`, or none when its entry numbers no registration.
    pub(crate) fn registered(&mut self, node: NodeId, number: Option<u64>) {
        match number {
            Some(number) => self.numbers.insert(node, number),
            None => self.numbers.remove(&node),
        };
    }

    /// `node`'s record is gone (retention reclaimed it).
    pub(crate) fn forget(&mut self, node: NodeId) {
        self.numbers.remove(&node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_without_a_number_clears_the_old_one() {
        let mut r = Registrations::default();
        r.registered(NodeId(1), Some(4));
        assert_eq!(r.get(NodeId(1)), Some(4));
        r.registered(NodeId(1), None);
        assert_eq!(r.get(NodeId(1)), None);
        assert!(r.is_empty());
        r.registered(NodeId(2), Some(9));
        r.forget(NodeId(2));
        assert!(r.is_empty());
    }
}
