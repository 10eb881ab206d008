//! Unit tests of the [`Journal`] against the in-memory cluster: nodes are removed and added
//! as the head would see workers die and come back.

use escher_proto::types::{
    Amount, Capacity, Delta, NodeId, NodeSpec, ResourceName, ResourceSet, TaskState,
};

use super::*;
use crate::policy::testing::task;
use crate::{InMemoryCluster, Mode, ResourceSpec};

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn needs(resource: &str) -> ResourceSpec {
    ResourceSpec::new()
        .require(name(resource), Amount::ONE)
        .unwrap()
}

/// The live nodes holding `resource` (non-zero capacity).
async fn holders(cluster: &InMemoryCluster, resource: &str) -> Vec<NodeId> {
    let status = cluster.cluster_status().await.unwrap();
    status
        .nodes
        .iter()
        .filter(|n| n.alive)
        .filter(|n| n.resource(resource).is_some_and(|r| !r.total.is_zero()))
        .map(|n| n.id)
        .collect()
}

/// Home n1 (cpu=4) holds `data-7`; n0 has 2 cpus, n2 4 cpus of which 2 are busy.
async fn setup() -> (InMemoryCluster, Journal<InMemoryCluster>, [NodeId; 3]) {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let n0 = cluster.add_node("cpu=2");
    let n1 = cluster.add_node("cpu=4");
    let n2 = cluster.add_node("cpu=4");
    cluster
        .set_resource(name("pin"), Capacity::Unbounded, NodeSpec::Node(n2))
        .await
        .unwrap();
    cluster
        .submit(vec![task("cpu=2", &needs("pin"))])
        .await
        .unwrap();
    let journal = Journal::new(cluster.clone());
    journal
        .set_resource(name("data-7"), Capacity::Unbounded, NodeSpec::Node(n1))
        .await
        .unwrap();
    (cluster, journal, [n0, n1, n2])
}

#[tokio::test]
async fn a_lost_nodes_resources_are_replayed_where_their_users_fit_and_waiting_tasks_run() {
    let (cluster, journal, [n0, n1, n2]) = setup().await;
    // A big user (4 cpus) holds the home; small users wait behind it.
    let big = journal
        .submit(vec![task("cpu=4", &needs("data-7"))])
        .await
        .unwrap()[0];
    assert_eq!(cluster.node_of(big), Some(n1));
    let small = journal
        .submit(vec![task("cpu=1", &needs("data-7")); 2])
        .await
        .unwrap();
    assert!(small.iter().all(|t| cluster.node_of(*t).is_none()));
    assert!(
        journal.reconcile().await.unwrap().is_empty(),
        "nothing lost yet"
    );

    cluster.remove_node(n1);
    let why = cluster
        .status(small[0])
        .await
        .unwrap()
        .reason
        .unwrap_or_default();
    assert!(
        why.contains("data-7"),
        "the resource died with its node: {why}"
    );
    let events = journal.reconcile().await.unwrap();
    assert_eq!(
        events,
        vec![
            Recovery::Lost {
                name: name("data-7"),
                node: n1
            },
            Recovery::Replayed {
                name: name("data-7"),
                from: n1,
                to: n2
            },
        ],
        "n0 has as much free cpu but could never hold the 4-cpu user: n2 stands in"
    );
    assert_eq!(holders(&cluster, "data-7").await, vec![n2]);
    for t in &small {
        assert_eq!(
            cluster.node_of(*t),
            Some(n2),
            "waiting tasks run on the stand-in"
        );
    }
    assert!(
        journal.reconcile().await.unwrap().is_empty(),
        "replayed once"
    );
    let _ = n0;
}

#[tokio::test]
async fn a_returning_node_gets_its_resources_back_and_the_stand_in_is_removed() {
    let (cluster, journal, [_, n1, _]) = setup().await;
    cluster.remove_node(n1);
    journal.reconcile().await.unwrap();
    let stand_in = holders(&cluster, "data-7").await;
    assert_eq!(stand_in.len(), 1);
    let n2 = stand_in[0];
    let user = journal
        .submit(vec![task("cpu=1", &needs("data-7"))])
        .await
        .unwrap()[0];
    assert_eq!(cluster.node_of(user), Some(n2));

    let back = cluster.add_node("cpu=4");
    let events = journal.reconcile().await.unwrap();
    assert_eq!(
        events,
        vec![Recovery::Restored {
            name: name("data-7"),
            node: back,
            previous: n1,
            stand_in: Some(n2)
        }]
    );
    assert_eq!(holders(&cluster, "data-7").await, vec![back]);
    assert_eq!(
        cluster.status(user).await.unwrap().state,
        TaskState::Running,
        "a holder on the stand-in keeps it"
    );
    let later = journal
        .submit(vec![task("cpu=1", &needs("data-7"))])
        .await
        .unwrap()[0];
    assert_eq!(cluster.node_of(later), Some(back));
    let entry = &journal.entries()[0];
    assert_eq!(
        (entry.home, entry.place, entry.spec.clone()),
        (back, Place::Home, NodeSpec::Node(back))
    );
    // A node the journal has seen is never taken for a returning one.
    let other = cluster.add_node("cpu=1");
    journal.reconcile().await.unwrap();
    cluster.remove_node(back);
    let events = journal.reconcile().await.unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Recovery::Restored { node, .. } if *node == other)),
        "{events:?}"
    );
}

#[tokio::test]
async fn stand_ins_can_be_kept() {
    let (cluster, journal, [_, n1, _]) = setup().await;
    let journal = journal.keep_stand_ins(true);
    cluster.remove_node(n1);
    journal.reconcile().await.unwrap();
    let n2 = holders(&cluster, "data-7").await[0];
    let back = cluster.add_node("cpu=4");
    let events = journal.reconcile().await.unwrap();
    assert!(
        matches!(events[..], [Recovery::Restored { stand_in: None, .. }]),
        "{events:?}"
    );
    assert_eq!(holders(&cluster, "data-7").await, vec![n2, back]);
}

#[tokio::test]
async fn with_no_candidate_a_resource_waits_for_its_node_to_return() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let only = cluster.add_node("cpu=1");
    let journal = Journal::new(cluster.clone());
    journal
        .set_resource(
            name("m"),
            Capacity::Finite(Amount::units(2).unwrap()),
            NodeSpec::Node(only),
        )
        .await
        .unwrap();
    cluster.remove_node(only);
    let events = journal.reconcile().await.unwrap();
    assert_eq!(
        events,
        vec![Recovery::Lost {
            name: name("m"),
            node: only
        }],
        "nowhere to go"
    );
    assert_eq!(journal.entries()[0].place, Place::Waiting);
    let t = journal
        .submit(vec![task("cpu=1", &needs("m"))])
        .await
        .unwrap()[0];
    // A node joins: as the in-memory nodes share one name, it counts as the return.
    let back = cluster.add_node("cpu=1");
    journal.reconcile().await.unwrap();
    assert_eq!(cluster.node_of(t), Some(back));
    let status = cluster.cluster_status().await.unwrap();
    let m = status.node(back).unwrap().resource("m").unwrap();
    assert_eq!(
        m.total,
        Capacity::Finite(Amount::units(2).unwrap()),
        "the journaled capacity"
    );
}

#[tokio::test]
async fn what_was_together_stays_together() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let nodes: Vec<NodeId> = (0..4).map(|_| cluster.add_node("cpu=2")).collect();
    let journal = Journal::new(cluster.clone());
    for r in ["a", "b", "c"] {
        journal
            .set_resource(name(r), Capacity::Unbounded, NodeSpec::Node(nodes[1]))
            .await
            .unwrap();
    }
    // Another node already has `a` of its own: the stand-in should not be it.
    journal
        .set_resource(name("a"), Capacity::Unbounded, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    let both = needs("a")
        .and(&needs("b"))
        .unwrap()
        .and(&needs("c"))
        .unwrap();
    let t = journal.submit(vec![task("cpu=1", &both)]).await.unwrap()[0];
    cluster.finish(t, true);
    cluster.remove_node(nodes[1]);
    journal.reconcile().await.unwrap();
    let (a, b, c) = (
        holders(&cluster, "a").await,
        holders(&cluster, "b").await,
        holders(&cluster, "c").await,
    );
    assert_eq!(b, c, "b and c moved together");
    assert_eq!(b.len(), 1);
    assert_ne!(b[0], nodes[0], "a node that holds none yet is preferred");
    assert_eq!(
        a,
        vec![nodes[0], b[0]],
        "a keeps its two homes' worth: n0 and the stand-in"
    );
    let t = journal.submit(vec![task("cpu=1", &both)]).await.unwrap()[0];
    assert_eq!(cluster.node_of(t), Some(b[0]));
}

#[tokio::test]
async fn match_specs_are_evaluated_again() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let nodes: Vec<NodeId> = (0..4).map(|_| cluster.add_node("cpu=2")).collect();
    let journal = Journal::new(cluster.clone());
    let two = NodeSpec::Match {
        resources: "cpu=1".parse::<ResourceSet>().unwrap(),
        num_nodes: Some(2),
    };
    let placed = journal
        .set_resource(name("slot"), Capacity::Unbounded, two)
        .await
        .unwrap();
    assert_eq!(placed, vec![nodes[0], nodes[1]]);
    let all = NodeSpec::Match {
        resources: ResourceSet::new(),
        num_nodes: None,
    };
    journal
        .set_resource(name("everywhere"), Capacity::Unbounded, all)
        .await
        .unwrap();
    cluster.remove_node(nodes[0]);
    journal.reconcile().await.unwrap();
    assert_eq!(
        holders(&cluster, "slot").await,
        vec![nodes[1], nodes[2]],
        "still two, the next match"
    );
    assert_eq!(holders(&cluster, "everywhere").await, nodes[1..].to_vec());
    // A node without the matched resources *available* now is not chosen: fill n3, lose n1.
    cluster
        .set_resource(name("pin3"), Capacity::Unbounded, NodeSpec::Node(nodes[3]))
        .await
        .unwrap();
    let filler = cluster
        .submit(vec![task("cpu=2", &needs("pin3"))])
        .await
        .unwrap()[0];
    cluster.remove_node(nodes[1]);
    journal.reconcile().await.unwrap();
    assert_eq!(
        holders(&cluster, "slot").await,
        vec![nodes[2]],
        "n3 is full: slot waits"
    );
    cluster.finish(filler, true);
    journal.reconcile().await.unwrap();
    assert_eq!(holders(&cluster, "slot").await, vec![nodes[2], nodes[3]]);
}

#[tokio::test]
async fn deletions_and_adjustments_are_journaled() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let nodes: Vec<NodeId> = (0..2).map(|_| cluster.add_node("cpu=1")).collect();
    let journal = Journal::new(cluster.clone());
    let three = Capacity::Finite(Amount::units(3).unwrap());
    journal
        .set_resource(name("sem"), three, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    journal
        .adjust_resource(
            name("sem"),
            Delta::decrease(Amount::ONE),
            NodeSpec::Node(nodes[0]),
        )
        .await
        .unwrap();
    assert_eq!(
        journal.entries()[0].capacity,
        Capacity::Finite(Amount::units(2).unwrap())
    );
    // Created behind the journal's back, then adjusted through it: read back from the head.
    cluster
        .set_resource(name("other"), three, NodeSpec::Node(nodes[1]))
        .await
        .unwrap();
    journal
        .adjust_resource(
            name("other"),
            Delta::increase(Amount::ONE),
            NodeSpec::Node(nodes[1]),
        )
        .await
        .unwrap();
    let other = journal
        .entries()
        .into_iter()
        .find(|e| e.name.as_str() == "other")
        .unwrap();
    assert_eq!(other.capacity, Capacity::Finite(Amount::units(4).unwrap()));
    journal
        .delete_resource(name("sem"), NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    journal
        .set_resource(name("gone"), Capacity::Unbounded, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    journal
        .delete_resource(
            name("gone"),
            NodeSpec::Match {
                resources: ResourceSet::new(),
                num_nodes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        journal.entries().len(),
        1,
        "deleted resources are not journaled"
    );
    cluster.remove_node(nodes[0]);
    let events = journal.reconcile().await.unwrap();
    assert!(
        events.is_empty(),
        "nothing of the lost node is replayed: {events:?}"
    );
}

#[tokio::test]
async fn resources_created_by_tasks_are_adopted_and_a_background_watch_replays_them() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let nodes: Vec<NodeId> = (0..3).map(|_| cluster.add_node("cpu=1")).collect();
    let journal = Journal::new(cluster.clone());
    let producer = crate::DataLocality::<InMemoryCluster>::produce("out").unwrap();
    let p = journal
        .submit(vec![task("cpu=1", &producer)])
        .await
        .unwrap()[0];
    cluster.finish(p, true);
    let home = cluster.node_of(p).unwrap();
    assert!(
        journal.entries().is_empty(),
        "a task's hook bypasses the journal"
    );
    journal.adopt(&name("data-out")).await.unwrap();
    assert_eq!(journal.entries()[0].home, home);

    let watch = journal.spawn_watch(Duration::from_millis(2));
    cluster.remove_node(home);
    let reader = journal
        .submit(vec![task("cpu=1", &needs("data-out"))])
        .await
        .unwrap()[0];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.node_of(reader).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never replayed data-out"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(watch.stop().await >= 1);
    let at = cluster.node_of(reader).unwrap();
    assert!(nodes.contains(&at) && at != home);
    assert!(journal.history().contains(&Recovery::Replayed {
        name: name("data-out"),
        from: home,
        to: at
    }));
}
