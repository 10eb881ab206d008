//! The effects of applied commands, performed by the leader: assignments (with the task's
//! credential signed here, and its object arguments located as `LocateObject` would answer
//! that credential) and cancellations sent to workers, MIG reconfigurations asked for, a
//! rejoined worker's stale task messages forgotten.

use escher_proto::types::{HeadMessage, NAMESPACE_LABEL};

use super::Owner;
use crate::replication::LogStore;
use crate::runtime::objects_svc::task_objects;
use crate::state::Effect;

impl<S: LogStore> Owner<S> {
    pub(super) fn perform(&mut self, effects: Vec<Effect>) {
        let state = self.replica.state();
        for effect in effects {
            match effect {
                Effect::Assign {
                    node,
                    mut assignment,
                } => {
                    if let Some(rec) = state.task(assignment.task_id)
                        && let Some(started) = rec.started_at
                    {
                        self.metrics
                            .started(started.saturating_sub(rec.submitted_at));
                    }
                    let ns = assignment.spec.labels.get(NAMESPACE_LABEL);
                    assignment.task_token = self
                        .keys
                        .sign_task(assignment.task_id, assignment.attempt, ns)
                        .unwrap_or_default();
                    // Soft state, as the credential: where each argument is now, and tickets
                    // to read it there, so that the worker need not ask before it fetches.
                    assignment.objects = task_objects(state, &assignment.spec.labels);
                    self.workers
                        .send(state, node, HeadMessage::Assign(*assignment));
                }
                Effect::Cancel {
                    node,
                    task,
                    attempt,
                    reason,
                    force,
                } => {
                    let msg = HeadMessage::CancelTask {
                        task_id: task,
                        attempt,
                        reason,
                        force,
                    };
                    self.workers.send(state, node, msg);
                }
                // Waiters learn from `Applied::finished`, taken when the command applied.
                Effect::Terminal { .. } => {}
                Effect::ReconfigureMig { node, gpu, layout } => {
                    tracing::info!(%node, gpu, %layout, "asking the worker to reconfigure MIG");
                    self.workers
                        .send(state, node, HeadMessage::ReconfigureMig { gpu, layout });
                }
                Effect::Rejoined { node } => self.workers.rejoined(node),
                // A node that is gone is skipped by `send`: its copies went with it.
                Effect::DeleteObjects { node, ids } => {
                    self.workers
                        .send(state, node, HeadMessage::DeleteObjects(ids));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;
    use escher_proto::types::{NodeId, TaskId};

    #[test]
    fn an_effect_for_a_node_the_state_does_not_hold_is_dropped() {
        let mut owner = test_owner();
        let cancel = Effect::Cancel {
            node: NodeId(9),
            task: TaskId(1),
            attempt: 1,
            reason: "test".into(),
            force: false,
        };
        owner.perform(vec![cancel, Effect::Rejoined { node: NodeId(9) }]);
        assert!(owner.workers.depths().is_empty());
    }
}
