//! A task's time limit against a node's walltime at placement: a node that ends
//! (`escher.ends-at`) receives no task whose limit would outlast it; such a task goes to a node
//! that lasts, or waits and says why. Tasks without a limit and reservations go to the nodes
//! that last longest first, and not to a node with less than the least time left. The sanity
//! check runs after every step.

mod support;

use escher_proto::types::{ENDS_AT_LABEL, Labels, NodeId, TaskId};
use support::TestEnv;

/// The clock of every test: the ends below are counted from here.
const NOW: u64 = 1_000_000;

fn env() -> TestEnv {
    let mut env = TestEnv::new();
    env.now = NOW;
    env
}

#[test]
fn a_task_that_would_outlast_a_node_goes_to_one_that_lasts() {
    let mut env = env();
    // Node 1 ends in a minute; node 2 has no walltime. Node 1 comes first in round-robin order.
    env.node_ending(1, "cpu=4", NOW + 60_000);
    env.node(2, "cpu=4");
    assert_eq!(env.submit_limited(1, "cpu=1", 120_000), ["dispatch 1->2"]);
    // A limit within the minute may go to node 1; so may a task without a limit.
    assert_eq!(env.submit_limited(2, "cpu=1", 60_000), ["dispatch 2->1"]);
    assert_eq!(env.submit(3, "cpu=1"), ["dispatch 3->2"]);
}

#[test]
fn with_no_node_that_lasts_it_waits_and_says_why_then_runs_where_one_joins() {
    let mut env = env();
    env.node_ending(1, "cpu=2", NOW + 60_000);
    let out = env.submit_limited(1, "cpu=1", 120_000);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with("infeasible 1: its time limit (120 s) outlasts every live node")
            && out[0].contains("node 1, ends at 1060000 ms"),
        "{out:?}"
    );
    // The core knows it as pending, not placed.
    assert!(env.core.is_pending(TaskId(1)));
    // A shorter task of the same shape passes it on node 1.
    assert_eq!(env.submit_limited(2, "cpu=1", 30_000), ["dispatch 2->1"]);
    // Time passing never lets the long one in there.
    env.now = NOW + 10_000;
    assert_eq!(env.tick(NOW + 10_000), Vec::<String>::new());
    // A node that lasts joins: the long one runs there.
    assert_eq!(env.node(2, "cpu=1"), ["dispatch 1->2"]);
}

#[test]
fn a_node_whose_end_moves_later_takes_the_task_it_can_now_outlast() {
    let mut env = env();
    env.node_ending(1, "cpu=2", NOW + 60_000);
    let out = env.submit_limited(1, "cpu=1", 120_000);
    assert!(out[0].starts_with("infeasible 1:"), "{out:?}");
    let mut labels = Labels::new();
    labels
        .insert(ENDS_AT_LABEL, &(NOW + 3_600_000).to_string())
        .unwrap();
    env.core.set_node_labels(NodeId(1), labels).unwrap();
    assert_eq!(env.tick(NOW), ["dispatch 1->1"]);
}

#[test]
fn a_waiting_task_is_feasible_again_when_a_lasting_node_joins_without_room() {
    let mut env = env();
    env.node_ending(1, "cpu=1", NOW + 60_000);
    env.node(2, "cpu=1");
    // Tasks without a limit: the first to the node that lasts, the next where there is room.
    assert_eq!(env.submit(1, "cpu=1"), ["dispatch 1->2"]);
    assert_eq!(env.submit(2, "cpu=1"), ["dispatch 2->1"]);
    // A task no node can hold, so that the node below has no room left.
    let out = env.submit(3, "cpu=2");
    assert!(
        out[0].starts_with("infeasible 3: requests 2 cpu"),
        "{out:?}"
    );
    // Only busy nodes: the long task waits like any other, with no reason (node 2 lasts).
    assert_eq!(
        env.submit_limited(4, "cpu=1", 120_000),
        Vec::<String>::new()
    );
    // Node 2 goes away: the only node left that could hold it ends too soon.
    let out = env.remove_node(2);
    assert_eq!(out[0], "lost 1@2");
    assert!(
        out[1].starts_with("infeasible 4: its time limit"),
        "{out:?}"
    );
    // A node without an end joins and task 3 takes it whole: task 4 could run there some day,
    // and says so.
    assert_eq!(
        env.node(3, "cpu=2"),
        ["feasible 3", "dispatch 3->3", "feasible 4"]
    );
    // Once it has room, the long task runs there.
    assert_eq!(env.finish(3), ["dispatch 4->3"]);
}

#[test]
fn the_index_is_rebuilt_from_what_a_snapshot_holds() {
    let mut env = env();
    env.node_ending(1, "cpu=1", NOW + 60_000);
    let out = env.submit_limited(1, "cpu=1", 120_000);
    assert!(out[0].starts_with("infeasible 1:"), "{out:?}");
    // A core read back from its serialized form knows neither limits nor ends until they are
    // restored from the nodes' labels and the tasks' specs.
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&env.core, config).unwrap();
    let (mut restored, _): (escher_core::scheduler::Scheduler, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    let reason = env.core.infeasible_reason(TaskId(1)).unwrap().clone();
    restored.restore_walltimes([(TaskId(1), 120_000)], [(TaskId(1), reason)]);
    env.core = restored;
    // A short task of the same shape passes the long one on node 1.
    assert_eq!(env.submit_limited(2, "cpu=1", 1_000), ["dispatch 2->1"]);
    // And a node that lasts takes the long one.
    assert_eq!(env.node(2, "cpu=1"), ["dispatch 1->2"]);
}

/// The least time left of the tests that set one: ten minutes.
const MIN_LEFT: u64 = 600_000;

#[test]
fn a_task_without_a_limit_goes_to_the_node_that_lasts_longest_with_room() {
    let mut env = env();
    // Round-robin would start at node 1, which ends first.
    env.node_ending(1, "cpu=1", NOW + 60_000);
    env.node(2, "cpu=1");
    env.node_ending(3, "cpu=1", NOW + 120_000);
    // A node that never ends first, then the one that ends last, then what is left.
    assert_eq!(env.submit(1, "cpu=1"), ["dispatch 1->2"]);
    assert_eq!(env.submit(2, "cpu=1"), ["dispatch 2->3"]);
    assert_eq!(env.submit(3, "cpu=1"), ["dispatch 3->1"]);
    // Without a least time left it is a preference only: nothing waits for want of time.
    assert_eq!(env.submit(4, "cpu=1"), Vec::<String>::new());
    assert!(env.core.infeasible_reason(TaskId(4)).is_none());
}

#[test]
fn a_task_with_a_limit_keeps_the_round_robin_order_where_it_lasts() {
    let mut env = env();
    env.node_ending(1, "cpu=2", NOW + 60_000);
    env.node(2, "cpu=2");
    // It lasts on node 1, the first in round-robin order, and goes there: the node that never
    // ends stays free for work that could outlast node 1.
    assert_eq!(env.submit_limited(1, "cpu=1", 30_000), ["dispatch 1->1"]);
    assert_eq!(env.submit(2, "cpu=1"), ["dispatch 2->2"]);
}

#[test]
fn with_a_least_time_left_a_task_without_a_limit_waits_for_a_node_that_has_it() {
    let mut env = env();
    env.core.set_min_time_left(MIN_LEFT);
    env.node_ending(1, "cpu=2", NOW + 60_000);
    let out = env.submit(1, "cpu=1");
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with(
            "infeasible 1: it has no time limit, and the head's --min-time-left (600 s) is \
             more than the time left on every live node that could hold it"
        ) && out[0].contains("node 1, ends at 1060000 ms"),
        "{out:?}"
    );
    let reason = env.core.infeasible_reason(TaskId(1)).unwrap();
    assert_eq!(reason.resource.as_str(), "escher.walltime");
    // A task whose limit the node outlasts passes it.
    assert_eq!(env.submit_limited(2, "cpu=1", 30_000), ["dispatch 2->1"]);
    // A node with more than the least time left joins: the waiting one runs there.
    assert_eq!(
        env.node_ending(2, "cpu=1", NOW + 3_600_000),
        ["dispatch 1->2"]
    );
    // With node 2 busy, a third waits for room there, not for time: node 2 has it. Node 1,
    // which has room but not the time, takes none.
    assert_eq!(env.finish(2), Vec::<String>::new());
    assert_eq!(env.submit(3, "cpu=1"), Vec::<String>::new());
    assert!(env.core.infeasible_reason(TaskId(3)).is_none());
    assert_eq!(env.finish(1), ["dispatch 3->2"]);
}

#[test]
fn a_reservation_goes_to_the_nodes_that_last_longest() {
    let mut env = env();
    env.node_ending(1, "cpu=2", NOW + 60_000);
    env.node(2, "cpu=2");
    env.node_ending(3, "cpu=2", NOW + 120_000);
    // Pack: the node that never ends holds both bundles.
    assert_eq!(
        env.gang(10, &["cpu=1", "cpu=1"], "pack"),
        ["dispatch 10->2", "dispatch 11->2"]
    );
    // Spread: the latest to end first, then the other.
    assert_eq!(
        env.gang(20, &["cpu=1", "cpu=1"], "strict-spread"),
        ["dispatch 20->3", "dispatch 21->1"]
    );
}

#[test]
fn a_reservation_is_not_placed_on_a_node_ending_within_the_least_time_left() {
    let mut env = env();
    env.core.set_min_time_left(MIN_LEFT);
    env.node_ending(1, "cpu=2", NOW + 60_000);
    // Node 1 has room but not the time: the reservation waits, and says why.
    let out = env.gang(20, &["cpu=1"], "pack");
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with("infeasible 20: it has no time limit")
            && out[0].contains("node 1, ends at 1060000 ms"),
        "{out:?}"
    );
    // A strict-pack reservation is judged on its sum.
    let out = env.gang(30, &["cpu=1", "cpu=1"], "strict-pack");
    assert!(
        out[0].starts_with("infeasible 30: it has no time limit"),
        "{out:?}"
    );
    // A node with the time joins: the older reservation goes there; the strict-pack one can
    // no longer fit beside it but could some day, and is feasible again.
    assert_eq!(
        env.node_ending(2, "cpu=2", NOW + 3_600_000),
        [
            "feasible 20",
            "dispatch 20->2",
            "feasible 30",
            "feasible 31"
        ]
    );
    // Node 1's end moves past the least time left: the strict-pack one goes there.
    let mut labels = Labels::new();
    labels
        .insert(ENDS_AT_LABEL, &(NOW + 7_200_000).to_string())
        .unwrap();
    env.core.set_node_labels(NodeId(1), labels).unwrap();
    assert_eq!(env.tick(NOW), ["dispatch 30->1", "dispatch 31->1"]);
}
