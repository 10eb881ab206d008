//! The events `apply` records for watchers (docs/DESIGN.md §11).
//!
//! Every change a watcher may care about is recorded where the state makes it, with the next
//! revision: the counter is part of the replicated state, so every replica numbers the same
//! events the same way, and a watcher can resume on whichever replica leads next. The events
//! themselves are not kept here; the runtime takes them after each command (like effects) and
//! keeps a bounded history of its own.

use escher_proto::types::{
    ActorChange, Capacity, ClusterEvent, Labels, NodeId, ResourceName, TaskId, TaskKind, WatchEvent,
};

use super::apply::ClusterState;
use super::record::TaskRecord;
use crate::scheduler::Millis;

/// An event as the runtime keeps it: the event, and for a task event the task's labels, which
/// label filters match against after the task itself may be gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The event.
    pub event: WatchEvent,
    /// The task's labels (empty for other events).
    pub labels: Labels,
}

impl ClusterState {
    /// The revision of the last event recorded.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Takes the events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<Recorded> {
        std::mem::take(&mut self.events)
    }

    /// Records `event` with the next revision.
    pub(crate) fn record(&mut self, event: ClusterEvent, labels: Labels, now: Millis) {
        self.revision += 1;
        self.events.push(Recorded {
            event: WatchEvent {
                revision: self.revision,
                at_ms: now,
                event,
            },
            labels,
        });
    }

    /// Records an event about task `id`, made from its record.
    pub(crate) fn record_task(
        &mut self,
        id: TaskId,
        now: Millis,
        make: impl FnOnce(&TaskRecord) -> ClusterEvent,
    ) {
        let Some(rec) = self.tasks.get(&id) else {
            return;
        };
        let event = make(rec);
        let labels = rec.spec.labels.clone();
        self.record(event, labels, now);
    }

    /// Records a pending task's new reason (`None`: nothing keeps it from being placed now).
    pub(crate) fn record_pending(&mut self, id: TaskId, reason: Option<String>, now: Millis) {
        self.record_task(id, now, |rec| ClusterEvent::Pending {
            task: id,
            reason,
            namespace: rec.namespace(),
        });
    }

    /// Records `change` of task `id` if it is an actor, about its latest incarnation (`reason`:
    /// why that incarnation ended). Other tasks record nothing.
    pub(crate) fn record_actor(
        &mut self,
        id: TaskId,
        change: ActorChange,
        reason: Option<String>,
        now: Millis,
    ) {
        if !self
            .tasks
            .get(&id)
            .is_some_and(|rec| matches!(rec.spec.kind, TaskKind::Actor(_)))
        {
            return;
        }
        self.record_task(id, now, |rec| {
            let TaskKind::Actor(actor) = &rec.spec.kind else {
                unreachable!("checked an actor above");
            };
            ClusterEvent::Actor {
                actor: id,
                name: actor.name.clone(),
                change,
                incarnation: rec.attempt,
                // A record keeps the node of its latest attempt.
                node: rec.node.filter(|_| rec.attempt > 0),
                reason,
                namespace: rec.namespace(),
            }
        });
    }

    /// Records a resource's capacity on `node` as the core has it now.
    pub(crate) fn record_resource(&mut self, node: NodeId, name: ResourceName, now: Millis) {
        // A deleted resource some task still holds keeps a slot of capacity zero.
        let capacity = self
            .core
            .capacity(node, name.as_str())
            .filter(|c| !matches!(c, Capacity::Finite(a) if a.is_zero()));
        let event = ClusterEvent::Resource {
            node,
            name,
            capacity,
        };
        self.record(event, Labels::new(), now);
    }

    /// Undoes what a refused command recorded: on error, nothing changed.
    pub(crate) fn unrecord(&mut self, revision: u64) {
        let keep = self.events.len() - (self.revision - revision) as usize;
        self.events.truncate(keep);
        self.revision = revision;
    }
}
