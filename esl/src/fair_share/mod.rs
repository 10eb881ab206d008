//! Hierarchical max-min fair sharing (HFS), a cluster-level policy (thesis §4.4.2 "Cluster
//! Policy: Hierarchical Fair Sharing", §4.6.1 "Hierarchical max-min fair sharing", Fig. 4.5c).
//!
//! **Policy.** An [`Hfs`] instance shares a domain of nodes among users in proportion to their
//! weights, with max-min fairness: a user that has no work lends its share to those that do,
//! and gets it back when it has work again. Instances nest: a child instance shares, among
//! its own users, exactly the nodes its parent grants to one parent user (a sub-organisation),
//! so with Sub-Org1 = {A: 2, B: 3} and Sub-Org2 = {C} under equal weights, A alone gets every
//! node, A and B get 2:3, and with C too, A/B/C get 2/3/5.
//!
//! **Construction.** As the thesis: "the ESL executes a `set_resource` call to create a unique
//! resource (e.g., `res_user1`) with infinite capacity for the user on each allocated node.
//! When a user submits a task, they must request a capacity of 1 \[of\] their unique resource
//! ... the ESL dynamically resizes user allocations by adding and removing their ephemeral
//! resources. Hierarchies ... by launching multiple instances of the ESL and restricting their
//! operating domain to the nodes granted by the parent ESL." Here the resource is
//! `fs-<instance>-<user>` ([`Hfs::create_user`]), [`Capacity::Unbounded`] on each node the
//! user holds; a child of instance `top` for its user `org1` is instance `top.org1`. A user's
//! spec ([`User::spec`]) requires one unit of its own resource *and* of each ancestor's (the
//! thesis composes the two HFS levels by concatenation), so a task runs only on a node its
//! whole chain holds, also while a rebalance is half applied. [`Hfs::rebalance`] computes
//! the node → user assignment with the pure [`allocate`] (weighted max-min over node counts,
//! deterministic, moving as few nodes as possible), applies the difference with one
//! all-or-none `set_resources` batch (delete on the nodes a user loses, create on the nodes
//! it gains), then hands each child its new domain and rebalances it. Running tasks keep
//! their nodes (a deleted resource stays held until its holders end), so a user's share is
//! reclaimed as the borrower's tasks finish, without preemption.
//!
//! **Demand.** A user's demand is the number of nodes it could use: an explicit
//! [`Hfs::set_demand`], else the number of its tracked tasks that have not ended
//! ([`Hfs::submit`] and [`Hfs::track`] register them; their ends come from the cluster's
//! events, so a rebalance reads no task status; an end counts once its event has arrived,
//! milliseconds after the head committed it), plus, for a parent user, its child instance's
//! total demand.
//!
//! **Needs from the cluster.** `set_resource` (batched), `get_cluster_status` (the live nodes
//! of the domain, and how busy each user is on each node, from the `used` amount of its
//! unbounded resource), and the watch API's task ends for tracked demand (a status read per
//! tracked task only when the feed starts, or restarts after breaking).
//!
//! **Limits.** Shares are node-granular (thesis: "shares are therefore node-granular"): with
//! 10 nodes, 2:3:5 is exact but 1:1:1 is 4/3/3, and a node's whole capacity goes to one user
//! at a time. A demand counted in tasks assumes one task fills a node; with bigger nodes the
//! surplus is simply lent on. Nothing is preempted: reclaiming waits for the borrower's tasks
//! to end, so long tasks slow convergence (Fig. 4.5c's dip). Rebalancing happens when the
//! application calls [`Hfs::rebalance`] or runs [`Hfs::spawn_rebalancer`]; between rounds a
//! new user's tasks wait (pending, "no node has fs-..."). Weights and user ids are fixed at
//! creation; ids may not contain `-` or `.` (they separate the parts of resource names).

mod alloc;

pub use alloc::{Claim, allocate, shares};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use escher_proto::types::{
    Amount, Capacity, CapacityOp, ClusterStatus, NodeId, NodeSpec, ResourceName, ResourceUpdate,
    TaskId, TaskSpec, TypeError,
};

use crate::ends::TaskEnds;
use crate::periodic::Periodic;
use crate::policy::{Domain, Policy, er_name};
use crate::{ClusterApi, EslError, ResourceSpec};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A user of an [`Hfs`] instance: its resource and the spec its tasks carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    id: String,
    resource: ResourceName,
    spec: ResourceSpec,
}

impl User {
    /// The user's id within its instance.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The user's unique resource, `fs-<instance>-<user>`.
    pub fn resource(&self) -> &ResourceName {
        &self.resource
    }

    /// What each of the user's tasks requires: one unit of its resource and of each
    /// ancestor's.
    pub fn spec(&self) -> ResourceSpec {
        self.spec.clone()
    }
}

/// What one rebalance decided and applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebalanced {
    /// Node → user, over the live nodes of the domain.
    pub assignment: BTreeMap<NodeId, String>,
    /// Nodes per user.
    pub shares: BTreeMap<String, u64>,
    /// The demand each user was given.
    pub demands: BTreeMap<String, u64>,
    /// Nodes taken from one user and given to another.
    pub moved: usize,
    /// The children's rebalances, by parent user.
    pub children: BTreeMap<String, Rebalanced>,
}

/// Where an instance's nodes come from.
#[derive(Debug, Clone)]
enum Scope {
    /// A root instance: the live nodes of a domain.
    Root(Domain),
    /// A child: the nodes its parent granted to one user.
    Granted(Vec<NodeId>),
}

#[derive(Debug)]
struct UserState<C> {
    user: User,
    weight: u64,
    explicit: Option<u64>,
    tracked: BTreeSet<TaskId>,
    child: Option<Hfs<C>>,
}

#[derive(Debug)]
struct State<C> {
    instance: String,
    scope: Scope,
    /// The ancestors' user resources, outermost first.
    ancestors: Vec<ResourceName>,
    users: BTreeMap<String, UserState<C>>,
    /// The assignment last applied.
    assignment: BTreeMap<NodeId, String>,
}

#[derive(Debug)]
struct Shared<C> {
    state: Mutex<State<C>>,
    /// One rebalance at a time per instance (held across awaits, hence tokio's).
    rebalancing: tokio::sync::Mutex<()>,
    /// The ends of tracked tasks, from the cluster's events; started at the first count.
    ends: Mutex<Option<Arc<TaskEnds>>>,
}

/// A hierarchical max-min fair-sharing instance over a domain of nodes. Cheap to clone
/// (shared).
#[derive(Debug)]
pub struct Hfs<C> {
    cluster: C,
    shared: Arc<Shared<C>>,
}

impl<C: Clone> Clone for Hfs<C> {
    fn clone(&self) -> Self {
        Hfs {
            cluster: self.cluster.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// Refuses ids that would make resource names ambiguous.
fn check_id(id: &str, what: &'static str) -> Result<(), EslError> {
    if id.is_empty() || id.contains(['-', '.']) {
        return Err(TypeError::InvalidName {
            name: id.to_string(),
            why: what,
        }
        .into());
    }
    Ok(())
}

impl<C: ClusterApi> Hfs<C> {
    /// A root instance named `instance` over the live nodes of `domain`. Creates nothing until
    /// the first user.
    pub fn new(cluster: C, instance: &str, domain: Domain) -> Result<Hfs<C>, EslError> {
        check_id(
            instance,
            "a fair-share instance name may not be empty or contain '-' or '.'",
        )?;
        Ok(Hfs::with_scope(
            cluster,
            instance.to_string(),
            Scope::Root(domain),
            Vec::new(),
        ))
    }

    fn with_scope(
        cluster: C,
        instance: String,
        scope: Scope,
        ancestors: Vec<ResourceName>,
    ) -> Hfs<C> {
        let state = State {
            instance,
            scope,
            ancestors,
            users: BTreeMap::new(),
            assignment: BTreeMap::new(),
        };
        Hfs {
            cluster,
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                rebalancing: tokio::sync::Mutex::new(()),
                ends: Mutex::new(None),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The instance's name (`top`, `top.org1`).
    pub fn instance(&self) -> String {
        self.lock().instance.clone()
    }

    /// Adds user `id` with `weight` and rebalances; the user's unique resource is
    /// `fs-<instance>-<id>`. Creating an existing user returns it unchanged.
    pub async fn create_user(&self, id: &str, weight: u64) -> Result<User, EslError> {
        check_id(
            id,
            "a fair-share user id may not be empty or contain '-' or '.'",
        )?;
        {
            let mut state = self.lock();
            if let Some(existing) = state.users.get(id) {
                return Ok(existing.user.clone());
            }
            let resource = er_name(&["fs", &state.instance, id])?;
            let mut spec = ResourceSpec::new();
            for r in state.ancestors.iter().chain([&resource]) {
                spec = spec.require(r.clone(), Amount::ONE)?;
            }
            let user = User {
                id: id.to_string(),
                resource,
                spec,
            };
            state.users.insert(
                id.to_string(),
                UserState {
                    user,
                    weight,
                    explicit: None,
                    tracked: BTreeSet::new(),
                    child: None,
                },
            );
        }
        self.rebalance().await?;
        self.user(id)
    }

    /// User `id`.
    pub fn user(&self, id: &str) -> Result<User, EslError> {
        let state = self.lock();
        state
            .users
            .get(id)
            .map(|u| u.user.clone())
            .ok_or_else(|| unknown(&state.instance, id))
    }

    /// The child instance that shares among its own users the nodes this instance grants to
    /// `user` (created on first call; later calls return the same one).
    pub fn child_for(&self, user: &str) -> Result<Hfs<C>, EslError> {
        let mut state = self.lock();
        let granted: Vec<NodeId> = state
            .assignment
            .iter()
            .filter(|(_, u)| u.as_str() == user)
            .map(|(n, _)| *n)
            .collect();
        let parent = state.instance.clone();
        let instance = format!("{parent}.{user}");
        let mut ancestors = state.ancestors.clone();
        let Some(u) = state.users.get_mut(user) else {
            return Err(unknown(&parent, user));
        };
        if let Some(child) = &u.child {
            return Ok(child.clone());
        }
        ancestors.push(u.user.resource.clone());
        // The child's names must be valid too: check the longest prefix now.
        er_name(&["fs", &instance])?;
        let child = Hfs::with_scope(
            self.cluster.clone(),
            instance,
            Scope::Granted(granted),
            ancestors,
        );
        u.child = Some(child.clone());
        Ok(child)
    }

    /// Sets `user`'s demand to `nodes` (overriding its tracked tasks).
    pub fn set_demand(&self, user: &str, nodes: u64) -> Result<(), EslError> {
        self.with_user(user, |u| u.explicit = Some(nodes))
    }

    /// Goes back to counting `user`'s tracked tasks as its demand.
    pub fn clear_demand(&self, user: &str) -> Result<(), EslError> {
        self.with_user(user, |u| u.explicit = None)
    }

    /// Counts these tasks in `user`'s demand until they end.
    pub fn track(&self, user: &str, tasks: &[TaskId]) -> Result<(), EslError> {
        self.with_user(user, |u| u.tracked.extend(tasks.iter().copied()))?;
        if let Some(ends) = self.ends() {
            ends.track(tasks.iter().copied());
        }
        Ok(())
    }

    fn ends(&self) -> Option<Arc<TaskEnds>> {
        self.shared
            .ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Forgets the tracked tasks that ended, as the cluster's events tell. Without a feed
    /// (the first time, or after it broke) starts one, then reads the tracked tasks' statuses
    /// once: from then on an end costs no call.
    async fn forget_ended(&self) -> Result<(), EslError> {
        let ended = match self.ends().and_then(|e| e.take_ended()) {
            Some(ended) => ended,
            None => {
                let ends = Arc::new(TaskEnds::start(&self.cluster).await?);
                let tracked: Vec<TaskId> = self
                    .lock()
                    .users
                    .values()
                    .flat_map(|u| u.tracked.iter().copied())
                    .collect();
                ends.track(tracked.iter().copied());
                *self
                    .shared
                    .ends
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ends);
                let mut ended = Vec::new();
                for t in tracked {
                    if self.cluster.status(t).await?.state.is_terminal() {
                        ended.push(t);
                    }
                }
                ended
            }
        };
        if !ended.is_empty() {
            let mut state = self.lock();
            for u in state.users.values_mut() {
                for t in &ended {
                    u.tracked.remove(t);
                }
            }
        }
        Ok(())
    }

    /// Adds `user`'s spec to each task, submits them, and tracks them; their ids.
    pub async fn submit(
        &self,
        user: &str,
        mut tasks: Vec<TaskSpec>,
    ) -> Result<Vec<TaskId>, EslError> {
        let spec = self.user(user)?.spec();
        for t in &mut tasks {
            spec.apply_to(t)?;
        }
        let ids = self.cluster.submit(tasks).await?;
        self.track(user, &ids)?;
        Ok(ids)
    }

    fn with_user(&self, user: &str, f: impl FnOnce(&mut UserState<C>)) -> Result<(), EslError> {
        let mut state = self.lock();
        let instance = state.instance.clone();
        let u = state
            .users
            .get_mut(user)
            .ok_or_else(|| unknown(&instance, user))?;
        f(u);
        Ok(())
    }

    /// The assignment last applied: node → user.
    pub fn assignment(&self) -> BTreeMap<NodeId, String> {
        self.lock().assignment.clone()
    }

    /// `user`'s demand now (explicit, or its tracked tasks that have not ended, plus its
    /// child's total demand). Forgets tracked tasks that ended.
    pub async fn demand(&self, user: &str) -> Result<u64, EslError> {
        self.forget_ended().await?;
        let (explicit, tracked, child) = {
            let state = self.lock();
            let u = state
                .users
                .get(user)
                .ok_or_else(|| unknown(&state.instance, user))?;
            (u.explicit, u.tracked.len() as u64, u.child.clone())
        };
        let own = explicit.unwrap_or(tracked);
        let below = match child {
            Some(child) => child.total_demand().await?,
            None => 0,
        };
        Ok(own + below)
    }

    /// The sum of every user's demand.
    fn total_demand(&self) -> BoxFuture<'_, Result<u64, EslError>> {
        Box::pin(async move {
            let users: Vec<String> = self.lock().users.keys().cloned().collect();
            let mut total = 0;
            for u in users {
                total += self.demand(&u).await?;
            }
            Ok(total)
        })
    }

    /// Recomputes the assignment from the users' demands and the live nodes, applies it, and
    /// rebalances the children over their new domains.
    pub async fn rebalance(&self) -> Result<Rebalanced, EslError> {
        let status = self.cluster.cluster_status().await?;
        self.rebalance_with(&status).await
    }

    fn rebalance_with<'a>(
        &'a self,
        status: &'a ClusterStatus,
    ) -> BoxFuture<'a, Result<Rebalanced, EslError>> {
        Box::pin(async move {
            let _one_at_a_time = self.shared.rebalancing.lock().await;
            let users: Vec<String> = self.lock().users.keys().cloned().collect();
            let mut demands = BTreeMap::new();
            for u in &users {
                demands.insert(u.clone(), self.demand(u).await?);
            }
            let (plan, updates) = self.plan(status, &demands);
            if !updates.is_empty() {
                self.cluster.set_resources(updates).await?;
            }
            let children = {
                let mut state = self.lock();
                state.assignment = plan.assignment.clone();
                state
                    .users
                    .iter()
                    .filter_map(|(id, u)| u.child.clone().map(|c| (id.clone(), c)))
                    .collect::<Vec<_>>()
            };
            let mut report = plan;
            for (id, child) in children {
                let granted = report
                    .assignment
                    .iter()
                    .filter(|(_, u)| **u == id)
                    .map(|(n, _)| *n)
                    .collect();
                child.lock().scope = Scope::Granted(granted);
                report
                    .children
                    .insert(id, child.rebalance_with(status).await?);
            }
            Ok(report)
        })
    }

    /// The new assignment and the resource changes that apply it.
    fn plan(
        &self,
        status: &ClusterStatus,
        demands: &BTreeMap<String, u64>,
    ) -> (Rebalanced, Vec<ResourceUpdate>) {
        let state = self.lock();
        let live: BTreeSet<NodeId> = status
            .nodes
            .iter()
            .filter(|n| n.takes_tasks())
            .map(|n| n.id)
            .collect();
        let domain: Vec<NodeId> = match &state.scope {
            Scope::Root(domain) => domain.resolve(status),
            Scope::Granted(nodes) => nodes.iter().copied().filter(|n| live.contains(n)).collect(),
        };
        let claims: BTreeMap<String, Claim> = state
            .users
            .iter()
            .map(|(id, u)| {
                let demand = demands.get(id).copied().unwrap_or(0);
                (
                    id.clone(),
                    Claim {
                        weight: u.weight,
                        demand,
                    },
                )
            })
            .collect();
        // How many of its tasks the current holder runs on each node.
        let busy: BTreeMap<NodeId, u64> = state
            .assignment
            .iter()
            .filter_map(|(n, u)| {
                let r = state.users.get(u)?.user.resource.clone();
                let used = status.node(*n)?.resource(r.as_str())?.used;
                Some((*n, used.raw().div_ceil(Amount::ONE.raw())))
            })
            .collect();
        let assignment = allocate(&claims, &domain, &state.assignment, &busy);
        let moved = state
            .assignment
            .iter()
            .filter(|(n, u)| assignment.get(*n).is_some_and(|v| v != *u))
            .count();

        // Compare with what the cluster has, so that a lost or foreign change is repaired.
        let mut updates = Vec::new();
        for node in status.nodes.iter().filter(|n| n.takes_tasks()) {
            for (id, u) in &state.users {
                let r = &u.user.resource;
                let has = node
                    .resource(r.as_str())
                    .is_some_and(|s| !s.total.is_zero());
                let want = assignment.get(&node.id) == Some(id);
                let op = match (has, want) {
                    (false, true) => CapacityOp::Set(Capacity::Unbounded),
                    (true, false) => CapacityOp::Delete,
                    _ => continue,
                };
                updates.push(ResourceUpdate {
                    name: r.clone(),
                    op,
                    target: NodeSpec::Node(node.id),
                });
            }
        }
        let mut shares: BTreeMap<String, u64> =
            state.users.keys().map(|k| (k.clone(), 0)).collect();
        for u in assignment.values() {
            *shares.entry(u.clone()).or_insert(0) += 1;
        }
        let report = Rebalanced {
            assignment,
            shares,
            demands: demands.clone(),
            moved,
            children: BTreeMap::new(),
        };
        (report, updates)
    }

    /// Rebalances every `interval` in the background until the handle is stopped; errors are
    /// logged and the next round tries again.
    pub fn spawn_rebalancer(&self, interval: Duration) -> Periodic {
        let hfs = self.clone();
        Periodic::spawn(interval, move || {
            let hfs = hfs.clone();
            async move {
                if let Err(err) = hfs.rebalance().await {
                    tracing::warn!(%err, instance = %hfs.instance(), "fair-share rebalance failed");
                }
            }
        })
    }
}

fn unknown(instance: &str, user: &str) -> EslError {
    EslError::Unsatisfiable(format!(
        "fair-share instance {instance} has no user {user:?}; create it with create_user first"
    ))
}

impl<C: ClusterApi> Policy for Hfs<C> {
    type Key = str;

    async fn spec_for(&mut self, user: &str) -> Result<ResourceSpec, EslError> {
        Ok(self.user(user)?.spec())
    }
}

#[cfg(test)]
mod tests;
