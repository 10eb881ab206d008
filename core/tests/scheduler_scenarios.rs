//! Scenario tests of the scheduler core: exact decisions for small clusters, including one test
//! per ESCHER primitive (P1 to P4).

mod support;

use escher_core::scheduler::{CoreError, Event};
use escher_proto::types::{CapacityOp, NodeId, NodeSpec, ResourceName, TaskId};
use support::{TestEnv, dispatches};

#[test]
fn identical_tasks_round_robin_and_wait_in_fifo_order() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=2");
    env.node(2, "cpu=2");
    let mut got = Vec::new();
    for t in 1..=6 {
        got.extend(env.submit(t, "cpu=1"));
    }
    assert_eq!(got, dispatches(&[(1, 1), (2, 2), (3, 1), (4, 2)]));
    assert_eq!(
        env.finish(3),
        dispatches(&[(5, 1)]),
        "oldest waiting task first"
    );
    assert_eq!(env.finish(2), dispatches(&[(6, 2)]));
    assert_eq!(env.finish(1), Vec::<String>::new());
}

#[test]
fn no_head_of_line_blocking_across_shapes() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=2,gpu=1");
    assert_eq!(env.submit(1, "cpu=2"), dispatches(&[(1, 1)]));
    assert!(env.submit(2, "cpu=1,gpu=1").is_empty(), "waits for cpu");
    let big = env.submit(3, "cpu=64");
    assert_eq!(big.len(), 1);
    assert!(big[0].starts_with("infeasible 3"), "{big:?}");
    assert_eq!(
        env.submit(4, "gpu=1"),
        dispatches(&[(4, 1)]),
        "a younger task of another shape runs"
    );
    assert!(
        env.finish(1).is_empty(),
        "task 2 still needs the gpu held by task 4"
    );
    assert_eq!(env.finish(4), dispatches(&[(2, 1)]));
}

#[test]
fn oldest_shape_first_when_one_release_wakes_several() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    env.submit(1, "cpu=1");
    env.submit(2, "cpu=1,x=0"); // x=0 asks for nothing more: same shape as cpu=1
    env.node(2, "mem-a=1");
    env.submit(3, "cpu=0.5");
    env.submit(4, "cpu=1");
    assert_eq!(
        env.finish(1),
        dispatches(&[(2, 1)]),
        "task 2 waited longest"
    );
    assert!(env.finish(2).contains(&"dispatch 3->1".to_string()));
}

#[test]
fn infeasible_tasks_are_reported_with_a_reason_and_run_when_it_is_fixed() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=8");
    env.node(2, "cpu=4,a=1");
    env.node(3, "b=1");
    let d = env.submit(1, "ghost-res=1");
    assert_eq!(
        d,
        ["infeasible 1: resource ghost-res (requested 1) exists on no live node"]
    );
    // A name that differs from a live one only by case gets a hint.
    let d = env.submit(9, "CPU=1");
    assert_eq!(
        d,
        [
            "infeasible 9: resource CPU (requested 1) exists on no live node; did you mean \
             cpu? Resource names are case-sensitive"
        ]
    );
    let d = env.submit(2, "cpu=16");
    assert_eq!(
        d,
        [
            "infeasible 2: requests 16 cpu, but no live node has more than 8 in total \
          (closest nodes: 1, 2)"
        ]
    );
    let d = env.submit(3, "a=1,b=1");
    assert_eq!(
        d,
        [
            "infeasible 3: no live node has all requested resources together; b (1) is missing on \
          the closest nodes (closest nodes: 2, 3)"
        ]
    );
    let reason = env.core.infeasible_reason(TaskId(2)).unwrap();
    assert_eq!(reason.resource.as_str(), "cpu");
    assert_eq!(reason.closest_nodes, vec![NodeId(1), NodeId(2)]);
    // The same shape again: reported at once.
    assert!(env.submit(4, "cpu=16")[0].starts_with("infeasible 4"));
    // Fix each cause.
    assert_eq!(
        env.set(2, "ghost-res", "1"),
        ["feasible 1", "dispatch 1->2"]
    );
    assert_eq!(
        env.node(4, "cpu=16"),
        ["feasible 2", "feasible 4", "dispatch 2->4"]
    );
    assert_eq!(env.set(3, "a", "1"), ["feasible 3", "dispatch 3->3"]);
    assert_eq!(env.finish(2), dispatches(&[(4, 4)]));
}

#[test]
fn feasible_tasks_become_infeasible_when_capacity_goes_away() {
    let mut env = TestEnv::new();
    env.node(1, "x=2");
    env.node(2, "x=1");
    env.submit(1, "x=2");
    assert!(env.submit(2, "x=2").is_empty(), "waits behind task 1");
    assert!(env.remove_node(2).is_empty(), "node 1 could still hold it");
    let d = env.set(1, "x", "1");
    assert_eq!(d.len(), 1);
    assert!(d[0].starts_with("infeasible 2: requests 2 x"), "{d:?}");
    assert_eq!(
        env.slot(1, "x"),
        Some(("1".into(), "2".into())),
        "task 1 keeps what it holds"
    );
    assert!(env.finish(1).is_empty());
    assert_eq!(env.adjust(1, "x", "+1"), ["feasible 2", "dispatch 2->1"]);
}

#[test]
fn shrinking_below_use_admits_nothing_until_use_falls_under_the_new_capacity() {
    let mut env = TestEnv::new();
    env.node(1, "slots=4");
    for t in 1..=4 {
        env.submit(t, "slots=1");
    }
    env.submit(5, "slots=1");
    assert!(env.set(1, "slots", "2").is_empty());
    assert_eq!(env.slot(1, "slots"), Some(("2".into(), "4".into())));
    assert!(env.finish(1).is_empty());
    assert!(env.finish(2).is_empty(), "use 2 of 2");
    assert_eq!(env.finish(3), dispatches(&[(5, 1)]));
}

#[test]
fn deleting_a_resource_in_use_keeps_holders_until_they_release() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=4");
    env.set(1, "lock", "1");
    env.submit(1, "lock=1");
    env.submit(2, "lock=1");
    let d = env.delete(1, "lock");
    assert_eq!(
        d,
        [
            "infeasible 2: requests 1 lock, but no live node has more than 0 in total (closest nodes: 1)"
        ]
    );
    assert_eq!(
        env.slot(1, "lock"),
        Some(("0".into(), "1".into())),
        "shown with its shortfall"
    );
    env.finish(1);
    assert_eq!(env.slot(1, "lock"), None, "gone with its last holder");
    assert_eq!(env.set(1, "lock", "1"), ["feasible 2", "dispatch 2->1"]);
}

#[test]
fn deltas_compose_and_bad_deltas_change_nothing() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    for _ in 0..8 {
        env.adjust(1, "tokens", "+1");
    }
    assert_eq!(env.slot(1, "tokens").unwrap().0, "8");
    env.adjust(1, "tokens", "-0.5");
    assert_eq!(env.slot(1, "tokens").unwrap().0, "7.5");
    let err = env
        .apply(Event::ResourceChanged {
            target: NodeSpec::Node(NodeId(1)),
            name: ResourceName::new("tokens").unwrap(),
            op: CapacityOp::Adjust("-8".parse().unwrap()),
        })
        .unwrap_err();
    assert!(err.to_string().contains("negative"), "{err}");
    assert_eq!(env.slot(1, "tokens").unwrap().0, "7.5");
    env.adjust(1, "tokens", "-7.5");
    assert_eq!(env.slot(1, "tokens"), None, "reaching zero deletes");
    env.set(1, "inf", "unbounded");
    env.adjust(1, "inf", "-3");
    assert_eq!(
        env.slot(1, "inf").unwrap().0,
        "unbounded",
        "deltas leave unbounded alone"
    );
}

#[test]
fn match_resolves_against_available_resources_deterministically() {
    let mut env = TestEnv::new();
    env.node(1, "gpu=1");
    env.node(2, "gpu=1");
    env.node(3, "gpu=1");
    env.node(4, "cpu=1");
    env.submit(1, "gpu=1"); // lands on node 1
    assert_eq!(
        env.core
            .resolve_match(&"gpu=1".parse().unwrap(), None)
            .unwrap(),
        [NodeId(2), NodeId(3)]
    );
    let target = |n| NodeSpec::Match {
        resources: "gpu=1".parse().unwrap(),
        num_nodes: n,
    };
    let mut out = Vec::new();
    let changed = env
        .core
        .handle(
            Event::ResourceChanged {
                target: target(Some(1)),
                name: ResourceName::new("m").unwrap(),
                op: CapacityOp::Set("1".parse().unwrap()),
            },
            0,
            &mut out,
        )
        .unwrap();
    assert_eq!(changed, [NodeId(2)]);
    assert_eq!(
        env.core
            .resolve_match(&"".parse().unwrap(), Some(3))
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        env.core
            .resolve_match(&"nothing=1".parse().unwrap(), None)
            .unwrap(),
        []
    );
    assert_eq!(
        env.core.resolve_match(&"gpu=1".parse().unwrap(), Some(0)),
        Err(CoreError::ZeroNumNodes)
    );
}

#[test]
fn pending_deadlines_expire_and_running_tasks_are_exempt() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    assert_eq!(env.submit_until(1, "cpu=1", 100), dispatches(&[(1, 1)]));
    assert!(env.submit_until(2, "cpu=1", 100).is_empty());
    assert!(env.submit_until(3, "cpu=1", 200).is_empty());
    assert_eq!(env.core.next_deadline(), Some(100));
    assert!(env.tick(99).is_empty());
    assert_eq!(env.tick(100), ["deadline 2"]);
    assert_eq!(env.finish(1), dispatches(&[(3, 1)]));
    assert!(env.tick(1_000).is_empty());
}

#[test]
fn removing_a_node_loses_its_running_tasks_and_their_resources() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=2");
    env.node(2, "cpu=2");
    env.set(2, "data-7", "unbounded");
    env.submit(1, "cpu=1,data-7=1");
    env.submit(2, "cpu=1,data-7=1");
    env.submit(3, "cpu=1");
    let d = env.submit(4, "cpu=1,data-7=1");
    assert!(d.is_empty());
    let d = env.remove_node(2);
    assert_eq!(d[..2], ["lost 1@2", "lost 2@2"]);
    assert!(d[2].starts_with("infeasible 4: resource data-7"), "{d:?}");
    assert!(env.core.running_on(TaskId(1)).is_none());
    assert_eq!(env.core.running_on(TaskId(3)), Some(NodeId(1)));
}

#[test]
fn refused_events_change_nothing() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    env.submit(1, "cpu=1");
    env.submit(2, "cpu=1");
    let name = ResourceName::new("x").unwrap();
    let cases = [
        (Event::NodeRemoved { node: NodeId(9) }, "unknown node 9"),
        (
            Event::NodeAdded {
                node: NodeId(1),
                resources: vec![],
                labels: Default::default(),
            },
            "already",
        ),
        (
            Event::TaskFinished { task: TaskId(2) },
            "pending, not running",
        ),
        (Event::TaskFinished { task: TaskId(9) }, "unknown task 9"),
        (Event::TaskCancelled { task: TaskId(9) }, "unknown task 9"),
        (
            Event::TaskSubmitted {
                task: TaskId(1),
                resources: Default::default(),
                deadline: None,
                time_limit: None,
            },
            "already pending or running",
        ),
        (
            Event::ResourceChanged {
                target: NodeSpec::Local,
                name: name.clone(),
                op: CapacityOp::Delete,
            },
            "Local",
        ),
        (
            Event::ResourceChanged {
                target: NodeSpec::Node(NodeId(5)),
                name: name.clone(),
                op: CapacityOp::Delete,
            },
            "unknown node 5",
        ),
        (
            Event::ResourceChanged {
                target: NodeSpec::Node(NodeId(1)),
                name: name.clone(),
                op: CapacityOp::Adjust("-1".parse().unwrap()),
            },
            "negative",
        ),
        (
            Event::ResourceChanged {
                target: NodeSpec::Match {
                    resources: Default::default(),
                    num_nodes: Some(0),
                },
                name,
                op: CapacityOp::Delete,
            },
            "num_nodes",
        ),
    ];
    for (event, why) in cases {
        let err = env.apply(event.clone()).unwrap_err().to_string();
        assert!(err.contains(why), "{event:?}: {err}");
    }
    assert!(env.core.is_pending(TaskId(2)));
}

#[test]
fn a_match_change_is_all_or_nothing() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1,x=2");
    env.node(2, "cpu=1");
    let err = env
        .apply(Event::ResourceChanged {
            target: NodeSpec::Match {
                resources: "cpu=1".parse().unwrap(),
                num_nodes: None,
            },
            name: ResourceName::new("x").unwrap(),
            op: CapacityOp::Adjust("-1".parse().unwrap()),
        })
        .unwrap_err();
    assert!(err.to_string().contains("node 2"), "{err}");
    assert_eq!(
        env.slot(1, "x").unwrap().0,
        "2",
        "node 1 was not changed either"
    );
}

// ---- the ESCHER primitives at core level ----------------------------------------------------

/// P1 locality: an unbounded resource created on one node attracts every task requesting it.
#[test]
fn p1_locality_unbounded_resource_attracts_tasks_to_its_node() {
    let mut env = TestEnv::new();
    for n in 1..=3 {
        env.node(n, "cpu=4");
    }
    env.set(2, "near-t1", "unbounded");
    let mut got = Vec::new();
    for t in 1..=4 {
        got.extend(env.submit(t, "cpu=1,near-t1=1"));
    }
    assert_eq!(got, dispatches(&[(1, 2), (2, 2), (3, 2), (4, 2)]));
    assert_eq!(
        env.slot(2, "near-t1"),
        Some(("unbounded".into(), "4".into()))
    );
}

/// P2 signalling: a task waiting for a resource is dispatched the moment it is created.
#[test]
fn p2_signal_dispatches_the_waiting_task_at_once() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=2");
    env.node(2, "cpu=2");
    let d = env.submit(1, "cpu=1,after-t0=1");
    assert!(d[0].starts_with("infeasible 1"), "{d:?}");
    assert_eq!(env.set(2, "after-t0", "1"), ["feasible 1", "dispatch 1->2"]);
}

/// P3 queues: raising a zero-capacity queue resource by k releases exactly k waiting tasks.
#[test]
fn p3_queue_releases_exactly_k_tasks_per_increase() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=100");
    for t in 1..=10 {
        env.submit(t, "q=1");
    }
    let d = env.adjust(1, "q", "+3");
    let feasible: Vec<String> = (1..=10).map(|t| format!("feasible {t}")).collect();
    assert_eq!(d[..10], feasible[..]);
    assert_eq!(d[10..], dispatches(&[(1, 1), (2, 1), (3, 1)]));
    assert_eq!(env.adjust(1, "q", "+2"), dispatches(&[(4, 1), (5, 1)]));
    assert!(
        env.tick(5).is_empty(),
        "nothing more until the queue grows or drains"
    );
    assert_eq!(env.finish(1), dispatches(&[(6, 1)]));
}

/// P4 resource locking: a ghost holds a bundle and creates a resource for it; tasks request
/// only that resource and land inside the bundle, while others cannot use the locked cpus.
#[test]
fn p4_ghost_bundle_locks_resources_for_its_tasks() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=4");
    env.node(2, "cpu=4");
    assert_eq!(
        env.submit(100, "cpu=4"),
        dispatches(&[(100, 1)]),
        "the ghost takes node 1"
    );
    env.set(1, "bundle-100", "4"); // the ghost's start hook, resolved to its node
    let mut got = Vec::new();
    for t in 1..=5 {
        got.extend(env.submit(t, "bundle-100=1"));
    }
    assert_eq!(got, dispatches(&[(1, 1), (2, 1), (3, 1), (4, 1)]));
    assert_eq!(
        env.submit(6, "cpu=1"),
        dispatches(&[(6, 2)]),
        "node 1's cpus are locked"
    );
    assert_eq!(env.finish(1), dispatches(&[(5, 1)]));
    assert_eq!(env.slot(1, "cpu"), Some(("4".into(), "4".into())));
}

/// E2's situation: a user's fair-share resource leaves node 1 while a task of its waits there
/// for node 1's chunk. Tasks that end beside it free capacity, which can neither make it
/// feasible nor change why it is not (the scheduler no longer looks at it again for that):
/// nothing is reported. Its resource back on node 1 runs it.
#[test]
fn a_release_leaves_an_infeasible_task_alone_and_a_new_capacity_runs_it() {
    let mut env = TestEnv::new();
    env.node(1, "org=inf,fs-a=inf,chunk-1=1");
    env.node(2, "org=inf,fs-a=inf,chunk-2=1");
    assert_eq!(
        env.submit(1, "org=1,fs-a=1,chunk-1=1"),
        dispatches(&[(1, 1)])
    );
    assert_eq!(
        env.submit(2, "org=1,fs-a=1,chunk-2=1"),
        dispatches(&[(2, 2)])
    );
    assert!(env.submit(3, "org=1,fs-a=1,chunk-1=1").is_empty());
    let deleted = env.delete(1, "fs-a");
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert!(deleted[0].starts_with("infeasible 3"), "{deleted:?}");
    assert!(env.finish(2).is_empty(), "org freed on node 2");
    assert!(
        env.finish(1).is_empty(),
        "node 1's chunk freed, fs-a gone with its holder"
    );
    assert_eq!(env.set(1, "fs-a", "inf"), ["feasible 3", "dispatch 3->1"]);
}
