//! The owner's side of a worker's `ObjectsHeld` (docs/ARCHITECTURE.md "Objects", "Loss"): the
//! copies its store holds, reported after each attach, judged against the table
//! ([`ClusterState::held_copy`](crate::state::ClusterState::held_copy)).
//!
//! Copies the table counts on the node cost nothing: a worker that merely reconnected makes no
//! write. Each copy to adopt is proposed as an `ObjectsSealed` of its own (all in this turn's
//! one entry), so that a copy refused at commit (its object freed meanwhile, another size, the
//! namespace's quota) is dropped alone; the worker is told to drop a copy (`DropCopies`) only
//! once its refusal is committed, or at once when the applied table already does not count it.

use escher_proto::types::{DroppedHeld, HeadMessage, HeldCopy, NodeId, ObjectId};

use super::Owner;
use crate::replication::LogStore;
use crate::runtime::proposals::Pending;
use crate::state::{ApplyError, Command, HeldVerdict, Reply};

impl<S: LogStore> Owner<S> {
    /// Node `node`'s worker reported `copies` held in its store.
    pub(super) fn objects_held(&mut self, node: NodeId, copies: Vec<HeldCopy>) {
        if self.replica.writes_format() < crate::replication::OBJECTS_FORMAT {
            return; // no replica records objects yet: nothing to reconcile against
        }
        let state = self.replica.state();
        let mut drops = Vec::new();
        let mut adopt = Vec::new();
        let mut left = 0;
        let reported = copies.len();
        for c in copies {
            match state.held_copy(node, &c) {
                HeldVerdict::Counted => {}
                HeldVerdict::Leave(_) => left += 1,
                HeldVerdict::Adopt(sealed) => adopt.push((sealed, c.copy)),
                HeldVerdict::Drop(reason) => drops.push(DroppedHeld {
                    id: c.id,
                    copy: c.copy,
                    reason,
                }),
            }
        }
        if drops.is_empty() && adopt.is_empty() {
            tracing::debug!(%node, reported, left, "the copies a worker holds are all counted");
            return;
        }
        tracing::info!(
            %node,
            reported,
            adopting = adopt.len(),
            dropping = drops.len(),
            left,
            "reconciling the copies a worker holds with the object table"
        );
        if !drops.is_empty() {
            self.workers.send_now(node, HeadMessage::DropCopies(drops));
        }
        for (sealed, copy) in adopt {
            let id = sealed.id;
            let pending = Pending::Adopted { node, id, copy };
            self.propose(
                Command::ObjectsSealed {
                    copies: vec![sealed],
                },
                None,
                pending,
            );
        }
    }

    /// The adoption of copy `copy` of object `id` on node `node` was applied: `result` is what
    /// its `ObjectsSealed` said. A copy left out or refused is dropped by its worker, unless
    /// its node was lost meanwhile (its next attach reports it again) or the table counts it
    /// there after all.
    pub(super) fn adopted(
        &mut self,
        node: NodeId,
        (id, copy): (ObjectId, u64),
        result: Result<Reply, ApplyError>,
    ) {
        let reason = match result {
            Ok(Reply::ObjectsSealed(left_out)) => match left_out.into_iter().next() {
                None => {
                    tracing::debug!(%node, object = %id, "adopted a returning copy");
                    return;
                }
                Some((_, why)) => why,
            },
            Ok(other) => {
                tracing::warn!(%node, object = %id, ?other, "unexpected reply to an adoption");
                return;
            }
            Err(err) => err.to_string(),
        };
        let state = self.replica.state();
        let counted = state
            .objects()
            .get(id)
            .is_some_and(|r| r.holders.contains(&node));
        if counted || !state.node_alive(node) {
            return;
        }
        tracing::info!(%node, object = %id, %reason, "a returning copy is not adopted");
        let drop = DroppedHeld { id, copy, reason };
        self.workers
            .send_now(node, HeadMessage::DropCopies(vec![drop]));
    }
}

#[cfg(test)]
mod tests {
    use super::super::leading_test_owner;
    use super::*;
    use crate::state::{Entry, FIRST_SESSION, SecretHash};
    use escher_proto::types::{ObjectOwner, SealedCopy};
    use futures_util::FutureExt as _;
    use tokio_stream::StreamExt as _;

    fn held(id: ObjectId, copy: u64) -> HeldCopy {
        HeldCopy {
            id,
            size: 10,
            checksum: 7,
            namespace: None,
            copy,
        }
    }

    #[test]
    fn counted_copies_cost_no_write_and_the_rest_are_adopted_or_dropped() {
        let (mut owner, worker) = leading_test_owner();
        let register = Command::RegisterNode {
            worker,
            secret: SecretHash::of("s"),
        };
        let node = match owner.replica.apply_for_test(Entry::new(1, register)) {
            Ok(Reply::Registered(node)) => node,
            other => panic!("{other:?}"),
        };
        let (counted, freed, unknown) = (
            ObjectId(FIRST_SESSION, 0),
            ObjectId(FIRST_SESSION, 1),
            ObjectId(FIRST_SESSION, 2),
        );
        let copies = [counted, freed]
            .map(|id| SealedCopy {
                id,
                size: 10,
                checksum: 7,
                owner: ObjectOwner::Session(FIRST_SESSION),
                namespace: None,
                node,
            })
            .to_vec();
        owner
            .replica
            .apply_for_test(Entry::new(2, Command::ObjectsSealed { copies }))
            .unwrap();
        let release = Command::ObjectsReleased {
            ids: vec![freed],
            namespace: None,
            sees_everything: true,
        };
        owner
            .replica
            .apply_for_test(Entry::new(3, release))
            .unwrap();
        let open = Entry::new(4, Command::OpenObjectSession);
        owner.replica.apply_for_test(open).unwrap();
        owner.workers.registered(node);
        let (tx, rx) = crate::runtime::workers::link_channel(1 << 20);
        owner.link_stream(node, "s", 1, tx).unwrap();
        let mut rx = Box::pin(rx.into_stream());

        // A worker that merely reconnected: nothing proposed, nothing sent.
        owner.objects_held(node, vec![held(counted, 1)]);
        assert!(owner.batch.is_empty());
        assert!(rx.next().now_or_never().is_none());

        owner.objects_held(
            node,
            vec![held(counted, 1), held(freed, 2), held(unknown, 3)],
        );
        let proposed = owner.batch.take();
        match &proposed.commands[..] {
            [(Command::ObjectsSealed { copies }, None)] => {
                assert_eq!(copies.len(), 1);
                assert_eq!((copies[0].id, copies[0].node), (unknown, node));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            proposed.pending[..],
            [Pending::Adopted { id, copy: 3, .. }] if id == unknown
        ));
        match rx.next().now_or_never() {
            Some(Some(HeadMessage::DropCopies(drops))) => {
                assert_eq!(drops.len(), 1);
                assert_eq!((drops[0].id, drops[0].copy), (freed, 2));
                assert!(drops[0].reason.contains("freed"), "{drops:?}");
            }
            other => panic!("{other:?}"),
        }

        // Refused at commit (a contradicting copy recorded meanwhile): dropped alone.
        owner.adopted(
            node,
            (unknown, 3),
            Err(ApplyError::ObjectMismatch {
                id: unknown,
                why: "its CRC-32C differs".into(),
            }),
        );
        match rx.next().now_or_never() {
            Some(Some(HeadMessage::DropCopies(drops))) => {
                assert_eq!((drops[0].id, drops[0].copy), (unknown, 3));
            }
            other => panic!("{other:?}"),
        }
        // A copy the table counts is never dropped, whatever the reply said.
        owner.adopted(
            node,
            (counted, 1),
            Ok(Reply::ObjectsSealed(vec![(counted, "odd".into())])),
        );
        assert!(rx.next().now_or_never().is_none());
    }
}
