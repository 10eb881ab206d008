//! Conversions of actors' messages: where an actor is (`ResolveActor`'s reply).

use super::{ConvertError, task::task_state, task::task_state_to_wire};
use crate::types::{ActorView, NodeId, TaskId};
use crate::wire;

impl From<ActorView> for wire::ResolveActorReply {
    fn from(v: ActorView) -> Self {
        wire::ResolveActorReply {
            id: v.id.0,
            state: task_state_to_wire(v.state),
            incarnation: v.incarnation,
            node: v.node.map(|n| n.0),
            address: v.address,
            ticket: v.ticket,
            reason: v.reason,
            max_task_retries: v.max_task_retries,
            max_concurrency: v.max_concurrency,
            pending_calls: v.pending_calls,
        }
    }
}

impl TryFrom<wire::ResolveActorReply> for ActorView {
    type Error = ConvertError;
    fn try_from(w: wire::ResolveActorReply) -> Result<Self, ConvertError> {
        Ok(ActorView {
            id: TaskId(w.id),
            state: task_state(w.state, "state")?,
            incarnation: w.incarnation,
            node: w.node.map(NodeId),
            address: w.address,
            ticket: w.ticket,
            reason: w.reason,
            max_task_retries: w.max_task_retries,
            max_concurrency: w.max_concurrency,
            pending_calls: w.pending_calls,
        })
    }
}
