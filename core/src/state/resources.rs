//! `set_resource` at the head: namespaces, `Local`, all-or-none batches, hooks and ghosts.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    Capacity, CapacityOp, Delta, MAX_HOOK_ERRORS, Namespace, NodeId, NodeSpec, ResourceName,
    ResourceSet, ResourceUpdate, TaskId, TaskKind, TaskState,
};

use super::apply::ClusterState;
use super::error::ApplyError;
use crate::scheduler::{Event, Millis, new_total};

/// One planned change: set `name` on `node` to `total`.
type Plan = Vec<(NodeId, ResourceName, Capacity)>;

impl ClusterState {
    /// The name as the application in `ns` means it.
    pub(crate) fn qualify(
        &self,
        name: &ResourceName,
        ns: Option<&Namespace>,
    ) -> Result<ResourceName, ApplyError> {
        Ok(ns.map_or_else(|| name.clone(), |ns| name.in_namespace(ns)))
    }

    /// `name` qualified as for [`Self::qualify`], refused unless `ns` may write it
    /// ([`ResourceName::writable_in`]): the check of every path that creates, resizes or
    /// deletes a resource.
    pub(crate) fn qualify_writable(
        &self,
        name: &ResourceName,
        ns: Option<&Namespace>,
    ) -> Result<ResourceName, ApplyError> {
        let name = self.qualify(name, ns)?;
        check_not_physical(&name)?;
        match ns {
            Some(ns) if !name.writable_in(Some(ns)) => Err(ApplyError::OtherNamespace {
                name,
                namespace: ns.clone(),
            }),
            _ => Ok(name),
        }
    }

    /// The target as the application in `ns` means it: the resource names a `Match` selects by
    /// are qualified like every other name.
    pub(crate) fn qualify_target(
        &self,
        target: NodeSpec,
        ns: Option<&Namespace>,
    ) -> Result<NodeSpec, ApplyError> {
        match target {
            NodeSpec::Match {
                resources,
                num_nodes,
            } if ns.is_some() => {
                let mut qualified = ResourceSet::new();
                for (name, amount) in resources.iter() {
                    qualified.insert(self.qualify(name, ns)?, amount);
                }
                Ok(NodeSpec::Match {
                    resources: qualified,
                    num_nodes,
                })
            }
            other => Ok(other),
        }
    }

    /// Qualifies names, refuses physical ones, and turns `Local` into the caller's node.
    pub(crate) fn resolve_updates(
        &self,
        updates: Vec<ResourceUpdate>,
        ns: Option<&Namespace>,
        caller: Option<(TaskId, u32)>,
    ) -> Result<Vec<ResourceUpdate>, ApplyError> {
        updates
            .into_iter()
            .map(|mut u| {
                u.name = self.qualify_writable(&u.name, ns)?;
                u.target = self.qualify_target(u.target, ns)?;
                if u.target == NodeSpec::Local {
                    u.target = NodeSpec::Node(self.caller_node(caller)?);
                }
                Ok(u)
            })
            .collect()
    }

    /// Refuses updates that would give namespace `ns` more resource names on live nodes than
    /// its quota. Only calls that create a name no live node has are counted, so the pass over
    /// the names happens only then.
    pub(crate) fn check_resource_quota(
        &self,
        ns: Option<&Namespace>,
        updates: &[ResourceUpdate],
    ) -> Result<(), ApplyError> {
        let Some(ns) = ns else {
            return Ok(());
        };
        let new: BTreeSet<&ResourceName> = updates
            .iter()
            .filter(|u| u.op != CapacityOp::Delete && u.name.namespace() == Some(ns.as_str()))
            .filter(|u| !self.core.is_held(u.name.as_str()))
            .map(|u| &u.name)
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let held = self.core.held_in_namespace(ns.as_str()) as u64;
        let limit = self.config.namespace_resources;
        if held.saturating_add(new.len() as u64) > limit {
            return Err(ApplyError::ResourceQuotaExceeded {
                namespace: ns.clone(),
                held,
                asked: new.len(),
                limit,
            });
        }
        Ok(())
    }

    fn caller_node(&self, caller: Option<(TaskId, u32)>) -> Result<NodeId, ApplyError> {
        let (task, attempt) = caller.ok_or(ApplyError::LocalOutsideTask)?;
        self.running_attempt(task, attempt)
    }

    /// The node of `task` while its attempt `attempt` runs: what a task credential is good
    /// for. Once the attempt ended (the task finished, or was put back to pending and perhaps
    /// started again elsewhere) the credential acts for nothing.
    pub fn running_attempt(&self, task: TaskId, attempt: u32) -> Result<NodeId, ApplyError> {
        let rec = self
            .tasks
            .get(&task)
            .ok_or_else(|| self.missing_task(task))?;
        match (rec.state, rec.node) {
            (TaskState::Running, Some(node)) if rec.attempt == attempt => Ok(node),
            (TaskState::Running, Some(_)) => Err(ApplyError::AttemptEnded {
                task,
                attempt,
                current: rec.attempt,
            }),
            (state, _) => Err(ApplyError::CallerNotRunning { task, state }),
        }
    }

    /// Applies resolved updates all or none. Every change is planned against the current
    /// capacities (and the batch's own earlier changes) first; only then is anything applied,
    /// each as an absolute capacity at this single serialization point.
    pub(crate) fn set_resources(
        &mut self,
        updates: &[ResourceUpdate],
        now: Millis,
    ) -> Result<Vec<Vec<NodeId>>, ApplyError> {
        let (plan, changed) = self.plan(updates)?;
        // One change, one scheduling round: a task is never placed on half of it.
        let events = plan
            .into_iter()
            .map(|(node, name, total)| Event::ResourceChanged {
                target: NodeSpec::Node(node),
                name,
                op: CapacityOp::Set(total),
            });
        self.core_events(events, now);
        Ok(changed)
    }

    fn plan(&self, updates: &[ResourceUpdate]) -> Result<(Plan, Vec<Vec<NodeId>>), ApplyError> {
        let mut totals: BTreeMap<(NodeId, ResourceName), Capacity> = BTreeMap::new();
        let mut order = Vec::new();
        let mut changed = Vec::with_capacity(updates.len());
        for u in updates {
            // The one check every application-side change passes (requests, batches, hooks,
            // ghosts and the resources reservations create): physical resources change only
            // through their workers' reports.
            check_not_physical(&u.name)?;
            let nodes = match &u.target {
                NodeSpec::Local => return Err(ApplyError::LocalOutsideTask),
                NodeSpec::Node(id) if self.core.has_node(*id) => vec![*id],
                NodeSpec::Node(id) => return Err(ApplyError::UnknownNode(*id)),
                NodeSpec::Match {
                    resources,
                    num_nodes,
                } => self.core.resolve_match(resources, *num_nodes)?,
            };
            let mut touched = Vec::with_capacity(nodes.len());
            for node in nodes {
                let key = (node, u.name.clone());
                let current = match totals.get(&key) {
                    Some(c) => Some(*c),
                    None => self.core.capacity(node, u.name.as_str()),
                };
                // Deleting a resource a node does not have changes nothing there: the reply
                // does not count the node, so the caller learns the name was not found.
                if u.op == CapacityOp::Delete && current.is_none() {
                    continue;
                }
                let total = new_total(node, &u.name, current, u.op)?;
                if totals.insert(key.clone(), total).is_none() {
                    order.push(key);
                }
                touched.push(node);
            }
            changed.push(touched);
        }
        let plan = order
            .into_iter()
            .map(|key| {
                let total = totals[&key];
                (key.0, key.1, total)
            })
            .collect();
        Ok((plan, changed))
    }

    /// Runs a task's hook updates, with `Local` meaning `node`. A hook that cannot apply (its
    /// node is gone, a capacity would go negative) is skipped, logged and recorded on the task
    /// (its status lists it): hooks are signals, and a failed signal must not undo the task.
    pub(crate) fn run_hooks(
        &mut self,
        task: TaskId,
        node: NodeId,
        hooks: &[ResourceUpdate],
        now: Millis,
    ) {
        if hooks.is_empty() {
            return;
        }
        let resolved: Vec<ResourceUpdate> = hooks
            .iter()
            .map(|h| {
                let mut h = h.clone();
                if h.target == NodeSpec::Local {
                    h.target = NodeSpec::Node(node);
                }
                h
            })
            .collect();
        // Hooks count against the namespace's resource names as a SetResources call does.
        let ns = self.tasks.get(&task).and_then(|r| r.namespace());
        let applied = self
            .check_resource_quota(ns.as_ref(), &resolved)
            .and_then(|()| self.set_resources(&resolved, now).map(|_| ()));
        if let Err(err) = applied {
            tracing::warn!(%task, %err, "a task hook could not be applied");
            self.record_hook_error(task, &err);
        }
    }

    /// Records on the task (its status lists them) why one of its hooks or ghost resources
    /// could not be applied.
    fn record_hook_error(&mut self, task: TaskId, err: &ApplyError) {
        if let Some(rec) = self.tasks.get_mut(&task) {
            if rec.hook_errors.len() == MAX_HOOK_ERRORS {
                rec.hook_errors.remove(0);
            }
            rec.hook_errors
                .push(format!("attempt {}: {err}", rec.attempt));
        }
    }

    /// Creates (`start`) or removes a ghost task's declared resources on its node.
    pub(crate) fn ghost_resources(&mut self, task: TaskId, node: NodeId, start: bool, now: Millis) {
        let Some(TaskKind::Ghost { creates, .. }) = self.tasks.get(&task).map(|r| &r.spec.kind)
        else {
            return;
        };
        if !self.core.has_node(node) {
            return;
        }
        let ns = self.tasks.get(&task).and_then(|r| r.namespace());
        let updates: Vec<ResourceUpdate> = creates
            .iter()
            .map(|(name, cap)| {
                let op = match (cap, start) {
                    (Capacity::Finite(a), true) => CapacityOp::Adjust(Delta::increase(*a)),
                    (Capacity::Finite(a), false) => CapacityOp::Adjust(Delta::decrease(*a)),
                    (Capacity::Unbounded, true) => CapacityOp::Set(Capacity::Unbounded),
                    (Capacity::Unbounded, false) => CapacityOp::Delete,
                };
                ResourceUpdate {
                    name: name.clone(),
                    op,
                    target: NodeSpec::Node(node),
                }
            })
            .collect();
        for update in updates {
            // One at a time: if another party already removed one, the others still go.
            let single = std::slice::from_ref(&update);
            // A ghost's names count against its namespace's quota as a SetResources call's do.
            if start && let Err(err) = self.check_resource_quota(ns.as_ref(), single) {
                self.record_hook_error(task, &err);
                continue;
            }
            if self.set_resources(single, now).is_err() && !start {
                let delete = ResourceUpdate {
                    op: CapacityOp::Delete,
                    ..update
                };
                let _ = self.set_resources(std::slice::from_ref(&delete), now);
            }
        }
    }
}

/// Refuses a physical resource name (docs/DESIGN.md §10): the single validation function behind
/// every path by which an application changes resources.
pub(crate) fn check_not_physical(name: &ResourceName) -> Result<(), ApplyError> {
    if name.is_physical() {
        return Err(ApplyError::Physical(name.clone()));
    }
    Ok(())
}
