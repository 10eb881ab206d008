//! Unit tests of [`Hfs`] against the in-memory cluster: the thesis' Fig. 4.5c timeline,
//! lending and reclaiming, hierarchy, node churn, and minimal movement.

use std::collections::BTreeMap;

use escher_proto::types::{NodeId, TaskId, TaskState};

use super::*;
use crate::policy::testing::task;
use crate::{InMemoryCluster, Mode};

fn work(n: usize) -> Vec<escher_proto::types::TaskSpec> {
    (0..n)
        .map(|_| task("cpu=1", &ResourceSpec::new()))
        .collect()
}

/// The nodes on which `resource` exists (non-zero capacity), from the cluster itself.
async fn holders(cluster: &InMemoryCluster, resource: &ResourceName) -> Vec<NodeId> {
    let status = cluster.cluster_status().await.unwrap();
    status
        .nodes
        .iter()
        .filter(|n| n.alive)
        .filter(|n| {
            n.resource(resource.as_str())
                .is_some_and(|r| !r.total.is_zero())
        })
        .map(|n| n.id)
        .collect()
}

/// The nodes where these tasks run now.
fn running_on(cluster: &InMemoryCluster, tasks: &[TaskId]) -> Vec<NodeId> {
    cluster
        .running()
        .into_iter()
        .filter(|(t, _)| tasks.contains(t))
        .map(|(_, n)| n)
        .collect()
}

/// Finishes every running task of `tasks` that runs on a node not in `keep` (the borrower's
/// work ending on a reclaimed node).
fn finish_outside(cluster: &InMemoryCluster, tasks: &[TaskId], keep: &[NodeId]) {
    for (t, n) in cluster.running() {
        if tasks.contains(&t) && !keep.contains(&n) {
            cluster.finish(t, true);
        }
    }
}

#[tokio::test]
async fn the_thesis_timeline_a_alone_then_2_to_3_then_c_takes_half() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    for _ in 0..10 {
        cluster.add_node("cpu=1");
    }
    let top = Hfs::new(cluster.clone(), "top", Domain::All).unwrap();
    top.create_user("org1", 1).await.unwrap();
    top.create_user("org2", 1).await.unwrap();
    let org1 = top.child_for("org1").unwrap();
    let org2 = top.child_for("org2").unwrap();
    let a = org1.create_user("A", 2).await.unwrap();
    let b = org1.create_user("B", 3).await.unwrap();
    let c = org2.create_user("C", 1).await.unwrap();
    assert_eq!(a.resource().as_str(), "fs-top.org1-A");
    assert_eq!(
        a.spec()
            .resources
            .names()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        vec!["fs-top-org1", "fs-top.org1-A"],
        "a task carries its whole chain"
    );

    // A alone takes every node.
    let a_tasks = org1.submit("A", work(14)).await.unwrap();
    let r = top.rebalance().await.unwrap();
    assert_eq!(r.shares["org1"], 10);
    assert_eq!(r.children["org1"].shares["A"], 10);
    assert_eq!(holders(&cluster, a.resource()).await.len(), 10);
    assert_eq!(running_on(&cluster, &a_tasks).len(), 10);

    // B arrives: A keeps its running tasks (no preemption) but gives up 6 nodes.
    let b_tasks = org1.submit("B", work(14)).await.unwrap();
    let r = top.rebalance().await.unwrap();
    assert_eq!(
        (
            r.children["org1"].shares["A"],
            r.children["org1"].shares["B"]
        ),
        (4, 6)
    );
    assert_eq!(
        running_on(&cluster, &a_tasks).len(),
        10,
        "running tasks keep their nodes"
    );
    assert!(running_on(&cluster, &b_tasks).is_empty());
    // A's tasks on B's nodes end; B's start there, and A's pending tasks never do.
    let a_nodes = holders(&cluster, a.resource()).await;
    let b_nodes = holders(&cluster, b.resource()).await;
    assert_eq!((a_nodes.len(), b_nodes.len()), (4, 6));
    finish_outside(&cluster, &a_tasks, &a_nodes);
    let on_a = running_on(&cluster, &a_tasks);
    let on_b = running_on(&cluster, &b_tasks);
    assert_eq!((on_a.len(), on_b.len()), (4, 6));
    assert!(on_a.iter().all(|n| a_nodes.contains(n)));
    assert!(on_b.iter().all(|n| b_nodes.contains(n)));

    // C arrives: the parent gives Sub-Org2 half, and C equals A + B.
    let c_tasks = org2.submit("C", work(14)).await.unwrap();
    let r = top.rebalance().await.unwrap();
    assert_eq!((r.shares["org1"], r.shares["org2"]), (5, 5));
    let sub1 = &r.children["org1"].shares;
    assert_eq!(
        (sub1["A"], sub1["B"], r.children["org2"].shares["C"]),
        (2, 3, 5)
    );
    let (a_nodes, b_nodes, c_nodes) = (
        holders(&cluster, a.resource()).await,
        holders(&cluster, b.resource()).await,
        holders(&cluster, c.resource()).await,
    );
    finish_outside(&cluster, &a_tasks, &a_nodes);
    finish_outside(&cluster, &b_tasks, &b_nodes);
    let counts = (
        running_on(&cluster, &a_tasks).len(),
        running_on(&cluster, &b_tasks).len(),
        running_on(&cluster, &c_tasks).len(),
    );
    assert_eq!(counts, (2, 3, 5));
    assert!(
        running_on(&cluster, &c_tasks)
            .iter()
            .all(|n| c_nodes.contains(n))
    );
    // Sub-Org1's child never holds a node outside what the parent grants it.
    let org1_nodes = holders(&cluster, &ResourceName::new("fs-top-org1").unwrap()).await;
    for n in a_nodes.iter().chain(&b_nodes) {
        assert!(org1_nodes.contains(n));
    }
}

#[tokio::test]
async fn idle_share_is_lent_and_reclaimed() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    for _ in 0..10 {
        cluster.add_node("cpu=1");
    }
    let hfs = Hfs::new(cluster.clone(), "t", Domain::All).unwrap();
    let a = hfs.create_user("a", 2).await.unwrap();
    let b = hfs.create_user("b", 3).await.unwrap();
    // Nobody has work: split by weight, so whoever comes first finds nodes.
    assert_eq!(holders(&cluster, a.resource()).await.len(), 4);
    assert_eq!(holders(&cluster, b.resource()).await.len(), 6);
    hfs.set_demand("a", 50).unwrap();
    let r = hfs.rebalance().await.unwrap();
    assert_eq!(
        (r.shares["a"], r.shares["b"]),
        (10, 0),
        "b's idle share is lent to a"
    );
    assert!(holders(&cluster, b.resource()).await.is_empty());
    hfs.set_demand("b", 50).unwrap();
    let r = hfs.rebalance().await.unwrap();
    assert_eq!((r.shares["a"], r.shares["b"]), (4, 6), "and reclaimed");
    assert_eq!(r.moved, 6, "exactly the nodes b reclaims move");
    // b needs only 2 now: a borrows the rest.
    hfs.set_demand("b", 2).unwrap();
    let r = hfs.rebalance().await.unwrap();
    assert_eq!((r.shares["a"], r.shares["b"]), (8, 2));
    // Nothing changed: nothing moves, nothing is sent.
    let again = hfs.rebalance().await.unwrap();
    assert_eq!(again.moved, 0);
    assert_eq!(again.assignment, r.assignment);
}

#[tokio::test]
async fn tracked_demand_counts_unfinished_tasks() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    for _ in 0..4 {
        cluster.add_node("cpu=1");
    }
    let hfs = Hfs::new(cluster.clone(), "t", Domain::All).unwrap();
    hfs.create_user("a", 1).await.unwrap();
    hfs.create_user("b", 1).await.unwrap();
    let ids = hfs.submit("b", work(3)).await.unwrap();
    assert_eq!(hfs.demand("b").await.unwrap(), 3);
    assert_eq!(hfs.demand("a").await.unwrap(), 0);
    let r = hfs.rebalance().await.unwrap();
    assert_eq!(r.shares["b"], 4, "a is idle: b borrows everything");
    for id in &ids {
        cluster.finish(*id, true);
    }
    // Ends come as events: counted once the feed has them.
    let mut demand = hfs.demand("b").await.unwrap();
    for _ in 0..100 {
        if demand == 0 {
            break;
        }
        tokio::task::yield_now().await;
        demand = hfs.demand("b").await.unwrap();
    }
    assert_eq!(demand, 0, "ended tasks are no demand");
    for id in &ids {
        assert_eq!(
            cluster.status(*id).await.unwrap().state,
            TaskState::Succeeded
        );
    }
}

#[tokio::test]
async fn shares_follow_nodes_that_leave_and_join() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let nodes: Vec<NodeId> = (0..6).map(|_| cluster.add_node("cpu=1")).collect();
    let hfs = Hfs::new(cluster.clone(), "t", Domain::All).unwrap();
    hfs.create_user("a", 1).await.unwrap();
    hfs.create_user("b", 1).await.unwrap();
    hfs.set_demand("a", 100).unwrap();
    hfs.set_demand("b", 100).unwrap();
    let before = hfs.rebalance().await.unwrap();
    assert_eq!((before.shares["a"], before.shares["b"]), (3, 3));
    // Two of a's nodes die: b gives one back.
    let lost: Vec<NodeId> = before
        .assignment
        .iter()
        .filter(|(_, u)| *u == "a")
        .map(|(n, _)| *n)
        .take(2)
        .collect();
    for n in &lost {
        cluster.remove_node(*n);
    }
    let after = hfs.rebalance().await.unwrap();
    assert_eq!((after.shares["a"], after.shares["b"]), (2, 2));
    assert!(lost.iter().all(|n| !after.assignment.contains_key(n)));
    assert_eq!(after.moved, 1);
    // New nodes join: shared out again.
    cluster.add_node("cpu=1");
    cluster.add_node("cpu=1");
    let grown = hfs.rebalance().await.unwrap();
    assert_eq!((grown.shares["a"], grown.shares["b"]), (3, 3));
    assert_eq!(grown.moved, 0, "joining nodes are given, not taken");
    assert_eq!(
        grown.assignment.len(),
        nodes.len(),
        "4 survivors and 2 newcomers"
    );
}

#[tokio::test]
async fn a_child_only_ever_holds_what_its_parent_grants() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    for _ in 0..8 {
        cluster.add_node("cpu=1");
    }
    let top = Hfs::new(cluster.clone(), "top", Domain::All).unwrap();
    top.create_user("x", 1).await.unwrap();
    top.create_user("y", 1).await.unwrap();
    let child = top.child_for("x").unwrap();
    assert_eq!(child.instance(), "top.x");
    assert!(
        std::sync::Arc::ptr_eq(&child.shared, &top.child_for("x").unwrap().shared),
        "one child per user"
    );
    let p = child.create_user("p", 1).await.unwrap();
    let q = child.create_user("q", 1).await.unwrap();
    let x = ResourceName::new("fs-top-x").unwrap();
    let mut shares_seen = BTreeMap::new();
    for (demand_x, demand_y) in [(0, 0), (10, 0), (10, 10), (0, 10), (3, 10)] {
        child.set_demand("p", demand_x).unwrap();
        child.set_demand("q", demand_x).unwrap();
        top.set_demand("y", demand_y).unwrap();
        let r = top.rebalance().await.unwrap();
        let granted = holders(&cluster, &x).await;
        let (ps, qs) = (
            holders(&cluster, p.resource()).await,
            holders(&cluster, q.resource()).await,
        );
        assert!(
            ps.iter().chain(&qs).all(|n| granted.contains(n)),
            "child outside its grant: {granted:?} {ps:?} {qs:?}"
        );
        assert_eq!(
            ps.len() + qs.len(),
            granted.len(),
            "the child shares all it is granted"
        );
        shares_seen.insert((demand_x, demand_y), r.shares["x"]);
    }
    assert_eq!(shares_seen[&(10, 0)], 8);
    assert_eq!(shares_seen[&(10, 10)], 4);
    assert_eq!(shares_seen[&(0, 10)], 0);
    assert_eq!(
        shares_seen[&(3, 10)],
        4,
        "demand 6 (3 + 3) is more than x's half"
    );
}

#[tokio::test]
async fn bad_ids_and_unknown_users_are_refused() {
    let cluster = InMemoryCluster::new(Mode::Instant);
    cluster.add_node("cpu=1");
    assert!(Hfs::new(cluster.clone(), "a-b", Domain::All).is_err());
    let hfs = Hfs::new(cluster.clone(), "t", Domain::All).unwrap();
    assert!(hfs.create_user("x.y", 1).await.is_err());
    assert!(hfs.create_user("", 1).await.is_err());
    let err = hfs.set_demand("nobody", 1).unwrap_err().to_string();
    assert!(
        err.contains("nobody") && err.contains("create_user"),
        "{err}"
    );
    assert!(hfs.child_for("nobody").is_err());
    let mut policy = hfs.clone();
    hfs.create_user("u", 1).await.unwrap();
    let spec = policy.spec_for("u").await.unwrap();
    assert_eq!(spec.resources.get("fs-t-u"), Amount::ONE);
}
