//! A node whose disk is under its reserve (`escher.disk.under-reserve`, which the head sets
//! from the worker's heartbeats) takes nothing new: tasks and gangs go to other nodes, a task
//! that fits only there waits (pending, not infeasible), and it is placed there as soon as the
//! label goes. The sanity check runs after every step.

mod support;

use escher_proto::types::{DISK_UNDER_RESERVE_LABEL, Labels, NodeId, TaskId};
use support::TestEnv;

fn under_reserve(env: &mut TestEnv, node: u64, under: bool) {
    let mut labels = Labels::new();
    if under {
        labels.insert(DISK_UNDER_RESERVE_LABEL, "true").unwrap();
    }
    env.core.set_node_labels(NodeId(node), labels).unwrap();
}

#[test]
fn a_node_under_its_disk_reserve_takes_nothing_until_space_returns() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=4");
    env.node(2, "cpu=2");
    under_reserve(&mut env, 1, true);
    // Round-robin would use node 1 too; only node 2 takes them.
    assert_eq!(env.submit(1, "cpu=1"), ["dispatch 1->2"]);
    assert_eq!(env.submit(2, "cpu=1"), ["dispatch 2->2"]);
    // Node 2 is full: the next waits, feasible, for either node.
    assert_eq!(env.submit(3, "cpu=1"), Vec::<String>::new());
    assert!(env.core.is_pending(TaskId(3)));
    // A task only node 1 could hold waits too, and is not reported infeasible.
    assert_eq!(env.submit(4, "cpu=3"), Vec::<String>::new());
    assert!(env.core.is_pending(TaskId(4)));
    // A gang waits likewise.
    assert_eq!(env.gang(5, &["cpu=1"], "pack"), Vec::<String>::new());
    // Space returns: what waited runs on node 1.
    under_reserve(&mut env, 1, false);
    let mut out = env.tick(0);
    out.sort();
    assert_eq!(out, ["dispatch 3->1", "dispatch 4->1"]);
    assert_eq!(env.tick(0), Vec::<String>::new());
    // The gang's member fits nowhere now (node 1 has 0 left, node 2 none): a task finishing
    // lets it in.
    assert_eq!(env.finish(1), ["dispatch 5->2"]);
}
