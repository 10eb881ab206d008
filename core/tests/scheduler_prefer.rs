//! Soft locality (`Scheduler::prefer`): a task goes to a node that holds what it prefers when
//! that node has room, and anywhere it fits otherwise, never waiting for the preferred node.
//! Hard locality stays a resource request.

mod support;

use escher_proto::types::{ResourceName, TaskId};
use support::{TestEnv, dispatches};

const COPY: &str = "ns/object.9.0";
const OTHER_COPY: &str = "ns/object.9.1";

fn prefer(env: &mut TestEnv, task: u64, names: &[&str]) {
    let names = names
        .iter()
        .map(|n| ResourceName::new(n).unwrap())
        .collect();
    env.core.prefer(TaskId(task), names);
}

/// Three nodes with two cpus each; node 3 holds a copy of the object.
fn three_nodes() -> TestEnv {
    let mut env = TestEnv::new();
    env.node(1, "cpu=2");
    env.node(2, "cpu=2");
    env.node(3, "cpu=2");
    env.set(3, COPY, "unbounded");
    env
}

#[test]
fn a_task_goes_to_the_node_holding_what_it_prefers_when_it_has_room() {
    let mut env = three_nodes();
    prefer(&mut env, 1, &[COPY]);
    assert_eq!(env.submit(1, "cpu=1"), dispatches(&[(1, 3)]));
    prefer(&mut env, 2, &[COPY]);
    assert_eq!(env.submit(2, "cpu=1"), dispatches(&[(2, 3)]));
    // Without a preference the round robin is as it was: it starts at the first node.
    assert_eq!(env.submit(3, "cpu=1"), dispatches(&[(3, 1)]));
    assert_eq!(
        env.core.preference(TaskId(1)),
        None,
        "kept only while pending"
    );
}

#[test]
fn a_preferred_node_without_room_is_never_waited_for() {
    let mut env = three_nodes();
    assert_eq!(env.submit(1, "cpu=2"), dispatches(&[(1, 1)]));
    assert_eq!(env.submit(2, "cpu=2"), dispatches(&[(2, 2)]));
    assert_eq!(env.submit(3, "cpu=2"), dispatches(&[(3, 3)]));
    // Everything is full: the preferring task waits like any other ...
    prefer(&mut env, 4, &[COPY]);
    assert!(env.submit(4, "cpu=1").is_empty());
    // ... and takes the first node with room, not the one it prefers.
    assert_eq!(env.finish(1), dispatches(&[(4, 1)]));
    // The holder is full: a new preferring task goes elsewhere at once.
    prefer(&mut env, 5, &[COPY]);
    assert_eq!(env.submit(5, "cpu=1"), dispatches(&[(5, 1)]));
}

#[test]
fn preferred_names_are_tried_in_the_order_given() {
    let mut env = three_nodes();
    env.set(2, OTHER_COPY, "unbounded");
    prefer(&mut env, 1, &[OTHER_COPY, COPY]);
    assert_eq!(env.submit(1, "cpu=2"), dispatches(&[(1, 2)]));
    // Node 2 is full now: the second name's holder is next.
    prefer(&mut env, 2, &[OTHER_COPY, COPY]);
    assert_eq!(env.submit(2, "cpu=1"), dispatches(&[(2, 3)]));
    // A name nobody holds is passed over.
    prefer(&mut env, 3, &["ns/object.404.0", COPY]);
    assert_eq!(env.submit(3, "cpu=1"), dispatches(&[(3, 3)]));
}

#[test]
fn a_waiting_task_woken_on_one_node_still_prefers_its_holder() {
    let mut env = three_nodes();
    env.submit(1, "cpu=2");
    env.submit(2, "cpu=2");
    env.submit(3, "cpu=2");
    prefer(&mut env, 4, &[COPY]);
    assert!(env.submit(4, "cpu=2").is_empty());
    // Node 3 (the holder) frees its cpus: the task waiting runs there.
    assert_eq!(env.finish(3), dispatches(&[(4, 3)]));
}

#[test]
fn hard_locality_is_a_request_for_the_location_resource_and_waits() {
    let mut env = three_nodes();
    assert_eq!(env.submit(1, "cpu=2"), dispatches(&[(1, 1)]));
    env.submit(2, "cpu=2"); // node 2
    env.submit(3, "cpu=2"); // node 3, the holder
    let hard = format!("cpu=1,{COPY}=1");
    assert!(env.submit(4, &hard).is_empty(), "waits for the holder");
    assert!(env.finish(1).is_empty(), "node 1 has room but no copy");
    assert_eq!(env.finish(3), dispatches(&[(4, 3)]));
}

#[test]
fn a_cancelled_or_expired_task_drops_its_preference() {
    let mut env = three_nodes();
    env.submit(1, "cpu=2");
    env.submit(2, "cpu=2");
    env.submit(3, "cpu=2");
    prefer(&mut env, 4, &[COPY]);
    env.submit(4, "cpu=1");
    assert!(env.core.preference(TaskId(4)).is_some());
    env.cancel(4);
    assert_eq!(env.core.preference(TaskId(4)), None);
    prefer(&mut env, 5, &[COPY]);
    env.submit_until(5, "cpu=1", 10);
    assert_eq!(env.tick(10), vec!["deadline 5".to_string()]);
    assert_eq!(env.core.preference(TaskId(5)), None);
}
