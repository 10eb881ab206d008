//! [`ActorCalls`]: how many calls wait at each actor incarnation, as the latest heartbeat of the
//! worker that hosts it said (`Heartbeat.actors`), kept by the leader and added to the actor's
//! `ResolveActor` reply (`pending_calls`; `escher actors` and the dashboard show it).
//!
//! Calls go from callers straight to the hosting worker (docs/ARCHITECTURE.md "The path of a
//! call"), so the head never counts them: this is soft state, like everything the leader hears
//! from workers. A worker repeats its figures in every heartbeat, so a new leader knows them
//! within a heartbeat of the worker attaching; a replica that does not lead has none (a figure
//! it heard while it led is shown only while it is [`FRESH`]). Nothing here is replicated.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use escher_proto::TaskState;
use escher_proto::types::{ActorLoad, NAMESPACE_LABEL, NodeId, TaskId};
use rustc_hash::FxHashMap;

use crate::state::ClusterState;

/// How long a node's figures are shown without being repeated (a worker sends them with every
/// heartbeat, a second apart at most by default).
pub(crate) const FRESH: Duration = Duration::from_secs(10);

/// Each worker's latest figures (sorted by actor), and when they came.
#[derive(Debug, Default)]
pub(crate) struct ActorCalls(Mutex<FxHashMap<NodeId, (Vec<ActorLoad>, Instant)>>);

impl ActorCalls {
    /// Worker `node` sent a heartbeat with these figures.
    pub(crate) fn reported(&self, node: NodeId, mut loads: Vec<ActorLoad>) {
        let mut nodes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if loads.is_empty() {
            nodes.remove(&node);
            return;
        }
        loads.sort_by_key(|l| l.actor);
        nodes.insert(node, (loads, Instant::now()));
    }

    /// How many calls wait at incarnation `incarnation` of `actor` on `node`, if that node's
    /// fresh figures name it.
    pub(crate) fn pending(&self, node: NodeId, actor: TaskId, incarnation: u32) -> Option<u64> {
        let nodes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (loads, at) = nodes.get(&node)?;
        if at.elapsed() > FRESH {
            return None;
        }
        let i = loads.binary_search_by_key(&actor, |l| l.actor).ok()?;
        (loads[i].incarnation == incarnation).then_some(loads[i].pending)
    }

    /// Every fresh figure, with the node that sent it (`escher status` totals those of the
    /// live incarnations the caller sees: `cluster_svc.rs`).
    pub(crate) fn fresh(&self) -> Vec<(NodeId, ActorLoad)> {
        let nodes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .iter()
            .filter(|(_, (_, at))| at.elapsed() <= FRESH)
            .flat_map(|(node, (loads, _))| loads.iter().map(move |l| (*node, *l)))
            .collect()
    }
}

/// Of the figures `loads` ([`ActorCalls::fresh`]), those of the incarnations the state says
/// run on the node that reported them, each as its actor's namespace (`None`: no namespace)
/// and its count: an ended or moved incarnation's last figure is left out. `escher status`
/// totals them for its caller (`cluster_svc.rs`), `/metrics` by namespace (`metrics.rs`).
pub(crate) fn live<'a>(
    state: &'a ClusterState,
    loads: &'a [(NodeId, ActorLoad)],
) -> impl Iterator<Item = (Option<&'a str>, u64)> + 'a {
    loads.iter().filter_map(move |(node, load)| {
        let task = state.task(load.actor)?;
        (task.state == TaskState::Running
            && task.node == Some(*node)
            && task.attempt == load.incarnation)
            .then(|| (task.spec.labels.get(NAMESPACE_LABEL), load.pending))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(actor: u64, incarnation: u32, pending: u64) -> ActorLoad {
        ActorLoad {
            actor: TaskId(actor),
            incarnation,
            pending,
        }
    }

    #[test]
    fn an_actor_shows_the_latest_figure_of_its_own_node_and_incarnation() {
        let calls = ActorCalls::default();
        calls.reported(NodeId(1), vec![load(9, 1, 4), load(3, 2, 0)]);
        assert_eq!(calls.pending(NodeId(1), TaskId(9), 1), Some(4));
        assert_eq!(calls.pending(NodeId(1), TaskId(3), 2), Some(0));
        // Another incarnation, another node, an actor not named: not known.
        assert_eq!(calls.pending(NodeId(1), TaskId(9), 2), None);
        assert_eq!(calls.pending(NodeId(2), TaskId(9), 1), None);
        assert_eq!(calls.pending(NodeId(1), TaskId(5), 1), None);
        // A later heartbeat replaces the figures; an empty one clears them.
        calls.reported(NodeId(1), vec![load(9, 1, 7)]);
        assert_eq!(calls.pending(NodeId(1), TaskId(9), 1), Some(7));
        assert_eq!(calls.pending(NodeId(1), TaskId(3), 2), None);
        calls.reported(NodeId(1), Vec::new());
        assert_eq!(calls.pending(NodeId(1), TaskId(9), 1), None);
    }

    #[test]
    fn fresh_lists_every_nodes_latest_figures() {
        let calls = ActorCalls::default();
        assert!(calls.fresh().is_empty());
        calls.reported(NodeId(1), vec![load(9, 1, 4), load(3, 2, 0)]);
        calls.reported(NodeId(2), vec![load(5, 1, 2)]);
        let mut all = calls.fresh();
        all.sort_by_key(|(node, l)| (*node, l.actor));
        assert_eq!(
            all,
            [
                (NodeId(1), load(3, 2, 0)),
                (NodeId(1), load(9, 1, 4)),
                (NodeId(2), load(5, 1, 2))
            ]
        );
    }
}
