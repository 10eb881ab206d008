//! Fault tolerance for ephemeral resources (thesis §4.3.4 "Fault tolerance").
//!
//! **Policy.** Ephemeral resources live on nodes and die with them; the tasks that need them
//! are retried (or wait) with unchanged requirements, which no live node can meet. The
//! [`Journal`] keeps every resource the application created and, when a node is gone,
//! creates its resources again on another eligible node, so that the waiting tasks run; when
//! the node comes back, its resources are restored there.
//!
//! **Construction.** The thesis: "At the bare minimum, an ESL must ensure that ephemeral
//! resources are restored at some other eligible node ... ESCHER relies on the cluster
//! framework to report failed nodes through the `get_cluster_status` API. Once failed nodes
//! are detected, an ESL can recreate the ephemeral resources on suitable nodes by replaying
//! the `set_resource` calls for the failed resources. If a candidate node is found, the
//! resource is recreated, else the tasks must wait for the failed node to recover ... When a
//! node is restored, its resources are also reinitialized." Here:
//! - [`Journal`] is a decorator: it implements [`ClusterApi`] over another `ClusterApi`, so
//!   any ESL (or the application) built on it is journaled without knowing it. Every
//!   `set_resource` that succeeds is recorded as `(name, capacity, node_spec)` per node it
//!   changed, net of deletions and adjustments; every submitted task tells the journal what
//!   the tasks requiring an ephemeral resource also need (their *users'* needs).
//! - [`Journal::reconcile`] reads `get_cluster_status` and plans, in one all-or-none batch:
//!   for a node that is gone (dead or absent), a stand-in for its resources. A `Node(id)` (or
//!   `Local`) spec is re-resolved to one live node for all of the lost node's resources (what
//!   was together stays together): a node whose totals hold what their users need (else
//!   their physical needs), preferring one that holds none of them yet, then the most free
//!   cpu, then the lowest id. A `Match` spec is evaluated again: with `num_nodes`, one
//!   replacement (the first node that matches now), keeping the count; without, every node
//!   that matches now. With no candidate, the resource waits and is retried at the next
//!   round. A node that *returns* (the head gives it a new id; the journal recognises a node
//!   it has never seen whose name is the lost node's) gets its resources back, and the
//!   stand-in copies the journal created are removed (unless [`Journal::keep_stand_ins`]).
//! - [`Journal::spawn_watch`] runs `reconcile` periodically in the background.
//!
//! **Needs from the cluster.** `get_cluster_status` (liveness, names, totals, what is free),
//! batched `set_resource`.
//!
//! **Limits.** Only resources created *through the journal* are replayed; a resource a task
//! creates on its own node (a hook, `set_resource(.., Local)` inside a task) is journaled
//! only after [`Journal::adopt`]. Capacities are restored as journaled, not as used: holders
//! on the lost node are gone anyway, but a stand-in node that already had the resource keeps
//! its own capacity. Replay is as good as the stand-in: a data-locality marker replayed
//! elsewhere says "the data is here" where it is not (the thesis accepts this: the task can
//! fetch it). A returned node is recognised by name, so names must be unique and stable (the
//! in-memory cluster names every node `sim`: there, any node that joins after a loss counts
//! as the lost one's return). Names are compared as given: under a client namespace the
//! status shows qualified names and stand-in choice cannot see which nodes already hold a
//! resource. Detection takes the head's heartbeat timeout plus one watch interval.

mod ledger;

pub use ledger::{Entry, Place, Recovery};

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use escher_proto::types::{NodeId, ResourceName, ResourceUpdate, TaskId, TaskSpec};

use crate::periodic::Periodic;
use crate::{ClusterApi, EslError};
use ledger::Ledger;

/// A [`ClusterApi`] that journals the ephemeral resources created through it and puts them
/// back when their node is lost. Cheap to clone (shared).
#[derive(Debug)]
pub struct Journal<C> {
    inner: C,
    ledger: Arc<Mutex<Ledger>>,
    history: Arc<Mutex<Vec<Recovery>>>,
    /// Serialises recording with reconciling (held across the inner calls).
    serial: Arc<tokio::sync::Mutex<()>>,
}

impl<C: Clone> Clone for Journal<C> {
    fn clone(&self) -> Self {
        Journal {
            inner: self.inner.clone(),
            ledger: self.ledger.clone(),
            history: self.history.clone(),
            serial: self.serial.clone(),
        }
    }
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: ClusterApi> Journal<C> {
    /// A journal over `inner`, empty.
    pub fn new(inner: C) -> Journal<C> {
        Journal {
            inner,
            ledger: Arc::default(),
            history: Arc::default(),
            serial: Arc::default(),
        }
    }

    /// Whether stand-in copies stay when the lost node returns (default: removed).
    pub fn keep_stand_ins(self, keep: bool) -> Journal<C> {
        guard(&self.ledger).keep_stand_ins = keep;
        self
    }

    /// The cluster underneath.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// Every journaled resource, by name then home node.
    pub fn entries(&self) -> Vec<Entry> {
        guard(&self.ledger).entries()
    }

    /// Everything the journal did so far, in order.
    pub fn history(&self) -> Vec<Recovery> {
        guard(&self.history).clone()
    }

    /// Learns the nodes on first use, so that a node that joins later can be told from one
    /// that was there (the "returned node" rule).
    async fn ensure_seen(&self) -> Result<(), EslError> {
        if !guard(&self.ledger).has_seen() {
            let status = self.inner.cluster_status().await?;
            guard(&self.ledger).observe(&status);
        }
        Ok(())
    }

    /// Journals `name` wherever a live node has it now (a resource a task created on its
    /// node), and forgets it where none has it.
    pub async fn adopt(&self, name: &ResourceName) -> Result<(), EslError> {
        let _serial = self.serial.lock().await;
        self.ensure_seen().await?;
        let status = self.inner.cluster_status().await?;
        let mut ledger = guard(&self.ledger);
        for node in status.nodes.iter().filter(|n| n.alive) {
            ledger.adopt(name, node.id, node.resource(name.as_str()).map(|r| r.total));
        }
        Ok(())
    }

    /// Compares the journal with the cluster and puts back what lost nodes held (see the
    /// module doc); what it did this round.
    pub async fn reconcile(&self) -> Result<Vec<Recovery>, EslError> {
        let _serial = self.serial.lock().await;
        let status = self.inner.cluster_status().await?;
        let mut next = guard(&self.ledger).clone();
        let (updates, events) = next.plan(&status);
        if !updates.is_empty() {
            self.inner.set_resources(updates).await?;
        }
        *guard(&self.ledger) = next;
        for e in &events {
            tracing::info!(?e, "journal recovery");
        }
        guard(&self.history).extend(events.iter().cloned());
        Ok(events)
    }

    /// Reconciles every `interval` in the background until the handle is stopped; errors are
    /// logged and the next round tries again.
    pub fn spawn_watch(&self, interval: Duration) -> Periodic {
        let journal = self.clone();
        Periodic::spawn(interval, move || {
            let journal = journal.clone();
            async move {
                if let Err(err) = journal.reconcile().await {
                    tracing::warn!(%err, "journal reconcile failed");
                }
            }
        })
    }
}

/// Only what the journal records is intercepted: `set_resources` (and the conveniences built
/// on it) and `submit`; every other call goes to the cluster underneath.
impl<C: ClusterApi> ClusterApi for Journal<C> {
    fn inner(&self) -> &impl ClusterApi {
        &self.inner
    }

    async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<Vec<NodeId>>, EslError> {
        let _serial = self.serial.lock().await;
        self.ensure_seen().await?;
        let changed = self.inner.set_resources(updates.clone()).await?;
        let unknown: Vec<(ResourceName, NodeId)> = {
            let mut ledger = guard(&self.ledger);
            updates
                .iter()
                .zip(&changed)
                .flat_map(|(u, nodes)| ledger.record(u, nodes))
                .collect()
        };
        if !unknown.is_empty() {
            let status = self.inner.cluster_status().await?;
            let mut ledger = guard(&self.ledger);
            for (name, node) in unknown {
                let total = status
                    .node(node)
                    .and_then(|n| n.resource(name.as_str()))
                    .map(|r| r.total);
                ledger.adopt(&name, node, total);
            }
        }
        Ok(changed)
    }

    async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        {
            let mut ledger = guard(&self.ledger);
            for t in &tasks {
                ledger.note_task(t);
            }
        }
        self.inner.submit(tasks).await
    }
}

#[cfg(test)]
mod tests;
