//! Composition of policies: AND, OR, conflict resolution, and validation before launch
//! (thesis §4.4.2 "Policy Composition", §4.3.3 "ESLs can protect applications from invalid
//! specification of ephemeral resources by validating resource requests before launching
//! tasks"; §4.6.1 composes the HFS ESLs with data locality by concatenation).
//!
//! **Policy.** A task may carry the specs of several policies at once, each named
//! ([`Composition::with`]): fairness, anti-affinity, load balancing, locality... All must hold
//! (AND). When together they can never be met, the composition is *relaxed* by dropping
//! parts in a stated order, keeping the rest: by default anti-affinity first, then load
//! balancing, and never anything else (fairness is kept), configurable with
//! [`Composition::relax_order`].
//!
//! **Construction.** AND is the concatenation of requirement vectors
//! ([`ResourceSpec::and`]: amounts of one resource add up, hooks are kept). OR is a soft
//! constraint: [`Composition::alternatives`] is the ordered list "everything, then without
//! the first relaxable part, then without the first two, ...", the thesis' example
//! `[{fair_a: 1, anti_aff: 1}, {fair_a: 1}]`, to hand to the soft-constraints ESL
//! ([`SoftConstraints`](crate::SoftConstraints)) which tries them at run time. Before launch,
//! [`validate`] rejects a spec that can never be satisfied on any live node, judged on
//! *totals* (not on what is free now), with a reason that names the resource: one that exists
//! on no live node, an amount above every node's total, or a combination that no single node
//! holds. [`relax`] returns the first alternative that [`validate`] accepts.
//!
//! **Needs from the cluster.** `get_cluster_status` only (the caller passes it in, so that one
//! snapshot serves many checks).
//!
//! **Limits.** "Never" means "not with the nodes and resources alive now": ephemeral resources
//! are created at run time, so a follower's affinity marker or a DAG signal that does not
//! exist yet would be rejected; name such resources in [`validate_expecting`] (they are then
//! not checked). Validation is per task: it does not know that two tasks of an anti-affine
//! group need two nodes, nor does it look at what is free now (that is what soft constraints
//! do at run time). Capacities can shrink after the check.

use std::collections::BTreeSet;

use escher_proto::types::{Amount, ClusterStatus, NodeId, NodeStatus, ResourceName};
use thiserror::Error;

use crate::policy::Policy;
use crate::{EslError, ResourceSpec};

/// The conventional part names, relaxed in this order by default.
pub const DEFAULT_RELAX_ORDER: [&str; 2] = ["anti-affinity", "load-balance"];

/// Why a spec can never be satisfied with the live nodes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{reason}")]
pub struct Unsatisfiable {
    /// The resource at fault (the first one a closest node lacks, for combinations).
    pub resource: ResourceName,
    /// A sentence naming the resource, the amounts and the nodes.
    pub reason: String,
}

impl From<Unsatisfiable> for EslError {
    fn from(u: Unsatisfiable) -> EslError {
        EslError::Unsatisfiable(u.reason)
    }
}

/// Whether `node` could ever hold `amount` of `name` (by its total).
fn could_hold(node: &NodeStatus, name: &ResourceName, amount: Amount) -> bool {
    node.resource(name.as_str())
        .is_some_and(|r| !r.total.is_zero() && r.total.could_hold(amount))
}

/// Checks that some live node could hold all of `spec`'s requirements at once (by totals).
pub fn validate(spec: &ResourceSpec, status: &ClusterStatus) -> Result<(), Unsatisfiable> {
    validate_expecting(spec, status, &[])
}

/// Like [`validate`], but resources in `later` (created at run time: an affinity marker, a
/// DAG signal) are not checked.
pub fn validate_expecting(
    spec: &ResourceSpec,
    status: &ClusterStatus,
    later: &[ResourceName],
) -> Result<(), Unsatisfiable> {
    let live: Vec<&NodeStatus> = status.nodes.iter().filter(|n| n.takes_tasks()).collect();
    let wanted: Vec<(&ResourceName, Amount)> = spec
        .resources
        .iter()
        .filter(|(name, amount)| !amount.is_zero() && !later.contains(name))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    // Each requirement alone.
    for (name, amount) in &wanted {
        if live.iter().any(|n| could_hold(n, name, *amount)) {
            continue;
        }
        let best = live
            .iter()
            .filter_map(|n| n.resource(name.as_str()).map(|r| (r.total, n.id)))
            .filter(|(total, _)| !total.is_zero())
            .max_by(|a, b| match (a.0, b.0) {
                (
                    escher_proto::types::Capacity::Finite(x),
                    escher_proto::types::Capacity::Finite(y),
                ) => x.cmp(&y).then(b.1.cmp(&a.1)),
                _ => std::cmp::Ordering::Equal,
            });
        let reason = match best {
            None => format!(
                "{name} exists on no live node ({} live), so a task requiring {name}: {amount} \
                 can never run; create it first or drop the policy that asks for it",
                live.len()
            ),
            Some((total, node)) => format!(
                "the task requests {name}: {amount}, but the largest total of {name} on a live \
                 node is {total} (node {node})"
            ),
        };
        return Err(Unsatisfiable {
            resource: (*name).clone(),
            reason,
        });
    }
    // All of them on one node.
    let lacks = |n: &NodeStatus| -> Vec<&ResourceName> {
        wanted
            .iter()
            .filter(|(name, amount)| !could_hold(n, name, *amount))
            .map(|(name, _)| *name)
            .collect()
    };
    let closest = live
        .iter()
        .map(|n| (lacks(n), n.id))
        .min_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.1.cmp(&b.1)));
    match closest {
        Some((missing, _)) if missing.is_empty() => Ok(()),
        Some((missing, node)) => {
            let all: Vec<String> = wanted.iter().map(|(n, a)| format!("{n}: {a}")).collect();
            let missing_names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
            let holders = |name: &ResourceName| -> Vec<NodeId> {
                live.iter()
                    .filter(|n| {
                        wanted
                            .iter()
                            .any(|(w, a)| *w == name && could_hold(n, w, *a))
                    })
                    .map(|n| n.id)
                    .collect()
            };
            Err(Unsatisfiable {
                resource: missing[0].clone(),
                reason: format!(
                    "no live node holds all of {{{}}} at once; the closest, node {node}, lacks \
                     {} (which only nodes {:?} have)",
                    all.join(", "),
                    missing_names.join(", "),
                    holders(missing[0]),
                ),
            })
        }
        None => unreachable!("a requirement with no live node was rejected above"),
    }
}

/// One way of running a composed task: its spec, and the parts dropped to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relaxation {
    /// The AND of the parts kept.
    pub spec: ResourceSpec,
    /// The parts dropped, in the order they were.
    pub dropped: Vec<String>,
}

/// Named policy specs that a task carries together, and the order in which to relax them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Composition {
    parts: Vec<(String, ResourceSpec)>,
    order: Option<Vec<String>>,
}

impl Composition {
    /// Nothing yet.
    pub fn new() -> Composition {
        Composition::default()
    }

    /// AND one more named part (a policy's spec, or the task's own needs).
    pub fn with(mut self, name: &str, spec: ResourceSpec) -> Composition {
        self.parts.push((name.to_string(), spec));
        self
    }

    /// Parts that may be dropped, first to last; every other part is always kept. Default:
    /// [`DEFAULT_RELAX_ORDER`].
    pub fn relax_order(mut self, names: &[&str]) -> Composition {
        self.order = Some(names.iter().map(|n| n.to_string()).collect());
        self
    }

    /// The relaxable parts present, in the order they are dropped.
    fn droppable(&self) -> Vec<String> {
        let order: Vec<String> = match &self.order {
            Some(o) => o.clone(),
            None => DEFAULT_RELAX_ORDER.iter().map(|s| s.to_string()).collect(),
        };
        order
            .into_iter()
            .filter(|name| self.parts.iter().any(|(p, _)| p == name))
            .collect()
    }

    /// The AND of every part.
    pub fn spec(&self) -> Result<ResourceSpec, EslError> {
        self.without(&BTreeSet::new())
    }

    fn without(&self, dropped: &BTreeSet<&str>) -> Result<ResourceSpec, EslError> {
        self.parts
            .iter()
            .filter(|(name, _)| !dropped.contains(name.as_str()))
            .try_fold(ResourceSpec::new(), |acc, (_, spec)| acc.and(spec))
    }

    /// The OR list: every part, then without the first relaxable part, then without the
    /// first two, and so on.
    pub fn alternatives(&self) -> Result<Vec<Relaxation>, EslError> {
        let droppable = self.droppable();
        (0..=droppable.len())
            .map(|k| {
                let dropped: BTreeSet<&str> = droppable[..k].iter().map(|s| s.as_str()).collect();
                Ok(Relaxation {
                    spec: self.without(&dropped)?,
                    dropped: droppable[..k].to_vec(),
                })
            })
            .collect()
    }

    /// The specs of [`alternatives`](Self::alternatives), for the soft-constraints ESL.
    pub fn preferences(&self) -> Result<Vec<ResourceSpec>, EslError> {
        Ok(self.alternatives()?.into_iter().map(|r| r.spec).collect())
    }

    /// The first alternative that could ever be satisfied on the live nodes.
    pub fn relax(&self, status: &ClusterStatus) -> Result<Relaxation, EslError> {
        let mut last = None;
        for alt in self.alternatives()? {
            match validate(&alt.spec, status) {
                Ok(()) => return Ok(alt),
                Err(e) => last = Some((alt.dropped, e)),
            }
        }
        let (dropped, e) = last.expect("there is always the unrelaxed alternative");
        Err(EslError::Unsatisfiable(if dropped.is_empty() {
            e.reason
        } else {
            format!("even without {}: {}", dropped.join(", "), e.reason)
        }))
    }
}

impl Policy for Composition {
    type Key = ();

    /// The AND of every part (relax first with [`Composition::relax`] if it may conflict).
    async fn spec_for(&mut self, _key: &()) -> Result<ResourceSpec, EslError> {
        self.spec()
    }
}

/// [`Composition::relax`] over named parts, with the default relax order.
pub fn relax(
    specs: &[(&str, ResourceSpec)],
    status: &ClusterStatus,
) -> Result<Relaxation, EslError> {
    specs
        .iter()
        .fold(Composition::new(), |c, (name, spec)| {
            c.with(name, spec.clone())
        })
        .relax(status)
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{Capacity, NodeSpec, TaskState};

    use super::*;
    use crate::policy::testing::task;
    use crate::{ClusterApi, InMemoryCluster, Mode};

    fn req(name: &str, units: u64) -> ResourceSpec {
        ResourceSpec::new()
            .require(
                ResourceName::new(name).unwrap(),
                Amount::units(units).unwrap(),
            )
            .unwrap()
    }

    async fn set(cluster: &InMemoryCluster, name: &str, cap: Capacity, node: NodeId) {
        cluster
            .set_resource(ResourceName::new(name).unwrap(), cap, NodeSpec::Node(node))
            .await
            .unwrap();
    }

    fn units(n: u64) -> Capacity {
        Capacity::Finite(Amount::units(n).unwrap())
    }

    /// Three nodes: user a's fair share is node 0; anti-affinity slots on nodes 1 and 2;
    /// load-balancing slots everywhere.
    async fn cluster() -> (InMemoryCluster, Vec<NodeId>) {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let nodes: Vec<NodeId> = (0..3).map(|_| cluster.add_node("cpu=4")).collect();
        set(&cluster, "fs-t-a", Capacity::Unbounded, nodes[0]).await;
        set(&cluster, "aa-g", units(1), nodes[1]).await;
        set(&cluster, "aa-g", units(1), nodes[2]).await;
        for n in &nodes {
            set(&cluster, "lb-x", units(2), *n).await;
        }
        (cluster, nodes)
    }

    /// Whether the verdict agrees with the head: a rejected spec stays pending with a reason
    /// naming the same resource; an accepted one runs once the node is free.
    async fn head_agrees(
        cluster: &InMemoryCluster,
        spec: &ResourceSpec,
        verdict: &Result<(), Unsatisfiable>,
    ) {
        let id = cluster.submit(vec![task("cpu=1", spec)]).await.unwrap()[0];
        let status = cluster.status(id).await.unwrap();
        match verdict {
            Ok(()) => assert_eq!(status.state, TaskState::Running, "{spec:?}"),
            Err(u) => {
                assert_eq!(status.state, TaskState::Pending);
                let why = status.reason.unwrap_or_default();
                assert!(
                    why.contains(u.resource.as_str()) || u.reason.contains("at once"),
                    "{why} vs {u}"
                );
            }
        }
        cluster.cancel(vec![id]).await.unwrap();
    }

    #[tokio::test]
    async fn validation_names_the_resource_that_can_never_be_met() {
        let (cluster, nodes) = cluster().await;
        let status = cluster.cluster_status().await.unwrap();
        let fair = req("fs-t-a", 1);

        assert_eq!(validate(&fair, &status), Ok(()));
        let missing = req("nowhere", 1);
        let e = validate(&missing, &status).unwrap_err();
        assert_eq!(e.resource.as_str(), "nowhere");
        assert!(e.reason.contains("exists on no live node"), "{e}");
        head_agrees(&cluster, &missing, &Err(e)).await;

        let too_much = req("lb-x", 3);
        let e = validate(&too_much, &status).unwrap_err();
        assert_eq!(e.resource.as_str(), "lb-x");
        assert!(
            e.reason.contains("largest total") && e.reason.contains('2'),
            "{e}"
        );
        head_agrees(&cluster, &too_much, &Err(e)).await;

        let both = fair.clone().and(&req("aa-g", 1)).unwrap();
        let e = validate(&both, &status).unwrap_err();
        assert_eq!(e.resource.as_str(), "aa-g");
        assert!(
            e.reason.contains("at once") && e.reason.contains(&format!("node {}", nodes[0])),
            "{e}"
        );
        head_agrees(&cluster, &both, &Err(e)).await;

        let ok = fair.clone().and(&req("lb-x", 1)).unwrap();
        assert_eq!(validate(&ok, &status), Ok(()));
        head_agrees(&cluster, &ok, &Ok(())).await;

        // Validation is about totals, not what is free now: a full node is still valid.
        let hog = cluster.submit(vec![task("cpu=4", &fair)]).await.unwrap();
        let status = cluster.cluster_status().await.unwrap();
        assert_eq!(
            validate(&fair.clone().and(&req("cpu", 4)).unwrap(), &status),
            Ok(())
        );
        cluster.cancel(hog).await.unwrap();

        // A marker created later (affinity, signals) can be exempted.
        let later = [ResourceName::new("nowhere").unwrap()];
        assert_eq!(validate_expecting(&missing, &status, &later), Ok(()));
        // Dead nodes do not count.
        cluster.remove_node(nodes[0]);
        let status = cluster.cluster_status().await.unwrap();
        assert!(validate(&fair, &status).is_err());
    }

    #[tokio::test]
    async fn relaxation_drops_anti_affinity_then_load_balancing_and_keeps_fairness() {
        let (cluster, nodes) = cluster().await;
        let composed = Composition::new()
            .with("fair", req("fs-t-a", 1))
            .with("load-balance", req("lb-x", 1))
            .with("anti-affinity", req("aa-g", 1));
        let alts = composed.alternatives().unwrap();
        assert_eq!(
            alts.iter().map(|a| a.dropped.clone()).collect::<Vec<_>>(),
            vec![
                vec![],
                vec!["anti-affinity".to_string()],
                vec!["anti-affinity".into(), "load-balance".into()]
            ]
        );
        assert!(
            alts.iter().all(|a| a.spec.resources.contains("fs-t-a")),
            "fairness is never dropped"
        );

        let status = cluster.cluster_status().await.unwrap();
        let chosen = composed.relax(&status).unwrap();
        assert_eq!(chosen.dropped, vec!["anti-affinity".to_string()]);
        assert!(
            chosen.spec.resources.contains("lb-x"),
            "only as much as needed is dropped"
        );
        let id = cluster
            .submit(vec![task("cpu=1", &chosen.spec)])
            .await
            .unwrap()[0];
        assert_eq!(
            cluster.node_of(id),
            Some(nodes[0]),
            "it runs, within a's fair share"
        );

        // Without load-balancing slots on a's node, both relaxable parts go.
        cluster
            .delete_resource(ResourceName::new("lb-x").unwrap(), NodeSpec::Node(nodes[0]))
            .await
            .unwrap();
        let status = cluster.cluster_status().await.unwrap();
        let chosen = relax(
            &[
                ("fair", req("fs-t-a", 1)),
                ("anti-affinity", req("aa-g", 1)),
                ("load-balance", req("lb-x", 1)),
            ],
            &status,
        )
        .unwrap();
        assert_eq!(
            chosen.dropped,
            vec!["anti-affinity".to_string(), "load-balance".to_string()]
        );
        assert_eq!(chosen.spec, req("fs-t-a", 1));

        // A custom order, and a composition that no relaxation saves.
        let strict = Composition::new()
            .with("fair", req("fs-t-a", 1))
            .with("gpu", req("gpu", 1))
            .with("anti-affinity", req("aa-g", 1))
            .relax_order(&["anti-affinity"]);
        let err = strict.relax(&status).unwrap_err().to_string();
        assert!(
            err.contains("even without anti-affinity") && err.contains("gpu"),
            "{err}"
        );
        assert_eq!(strict.preferences().unwrap().len(), 2);
        let mut policy = strict.clone();
        assert_eq!(policy.spec_for(&()).await.unwrap(), strict.spec().unwrap());
    }

    #[tokio::test]
    async fn and_adds_up_and_keeps_hooks() {
        let (cluster, _) = cluster().await;
        let hook = escher_proto::types::ResourceUpdate {
            name: ResourceName::new("done").unwrap(),
            op: escher_proto::types::CapacityOp::Set(Capacity::Unbounded),
            target: NodeSpec::Local,
        };
        let composed = Composition::new()
            .with("a", req("lb-x", 1))
            .with("b", req("lb-x", 1).on_success(hook.clone()))
            .spec()
            .unwrap();
        assert_eq!(composed.resources.get("lb-x"), Amount::units(2).unwrap());
        assert_eq!(composed.on_success, vec![hook]);
        let status = cluster.cluster_status().await.unwrap();
        assert_eq!(
            validate(&composed, &status),
            Ok(()),
            "2 of lb-x fit a node's total of 2"
        );
        assert_eq!(validate(&ResourceSpec::new(), &status), Ok(()));
    }
}
