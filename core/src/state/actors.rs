//! Actors as the state sees them (docs/ARCHITECTURE.md "Actors and objects"): an actor is a
//! task of kind [`TaskKind::Actor`]; its incarnations are the task's attempts. What is theirs
//! alone here: the live actors' names (unique per namespace, checked at submit in `tasks.rs`
//! and freed when the actor's task ends) and [`ClusterState::resolve_actor`], which says where
//! an actor is and signs a data ticket for calling the incarnation that serves.

use escher_proto::types::{
    ActorView, DATA_ADDRESS_LABEL, DataTicket, Namespace, TaskId, TaskKind, TaskState, ticket_key,
};

use super::apply::ClusterState;
use super::error::ApplyError;
use super::record::namespace_of;

/// Which actor a caller asks about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActorSelector {
    /// By id (its task's id).
    Id(TaskId),
    /// By name, in the caller's namespace.
    Name(String),
}

impl ClusterState {
    /// Where the actor `selector` names is, for a caller of namespace `namespace` (`None`: an
    /// admin, who sees every namespace's actors by id and the admin's own by name). A ticket
    /// valid until `expiry_ms` (the head's wall clock) is signed for the incarnation that runs.
    /// Another namespace's actor is unknown, as its task would be.
    pub fn resolve_actor(
        &self,
        selector: &ActorSelector,
        namespace: Option<&Namespace>,
        sees_everything: bool,
        expiry_ms: u64,
    ) -> Result<ActorView, ApplyError> {
        let id = match selector {
            ActorSelector::Id(id) => *id,
            ActorSelector::Name(name) => self
                .actor_named(namespace, name)
                .ok_or_else(|| ApplyError::UnknownActorName(name.clone()))?,
        };
        let rec = self.task(id).ok_or_else(|| self.missing_task(id))?;
        let ns = namespace_of(&rec.spec);
        if !sees_everything && ns.as_ref() != namespace {
            return Err(ApplyError::UnknownTask(id));
        }
        let TaskKind::Actor(actor) = &rec.spec.kind else {
            return Err(ApplyError::NotAnActor(id));
        };
        let node = rec.node.and_then(|n| Some((n, self.node(n)?)));
        let address = node
            .as_ref()
            .and_then(|(_, r)| r.labels.get(DATA_ADDRESS_LABEL))
            .map(str::to_owned);
        let ticket = match (&node, rec.state) {
            (Some((n, r)), TaskState::Running) if r.alive => Some(
                DataTicket {
                    node: *n,
                    actor: id,
                    incarnation: rec.attempt,
                    expiry_ms,
                    namespace: ns.as_ref().map(|ns| ns.as_str().to_owned()),
                }
                .sign(&ticket_key(&r.secret.0)),
            ),
            _ => None,
        };
        let reason = match rec.state {
            TaskState::Pending => rec
                .pending_reason
                .as_ref()
                .map(|r| r.to_string())
                .or_else(|| rec.reason.clone()),
            _ => rec.reason.clone(),
        };
        Ok(ActorView {
            id,
            state: rec.state,
            incarnation: rec.attempt,
            node: node.map(|(n, _)| n),
            address,
            ticket,
            reason,
            max_task_retries: actor.max_task_retries,
            max_concurrency: actor.max_concurrency,
            // Not in the state: the leader's runtime adds it from the workers' heartbeats.
            pending_calls: None,
        })
    }
}
