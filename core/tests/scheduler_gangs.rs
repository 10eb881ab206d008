//! Scenario tests of gangs in the scheduler core: all-or-nothing placement per strategy.

mod support;

use escher_core::scheduler::{Event, GANG_PATIENCE};
use escher_proto::types::{NodeId, TaskId};
use support::{TestEnv, dispatches};

fn cluster(nodes: u64, resources: &str) -> TestEnv {
    let mut env = TestEnv::new();
    for n in 1..=nodes {
        env.node(n, resources);
    }
    env
}

#[test]
fn a_gang_that_fits_is_dispatched_whole_and_packs() {
    let mut env = cluster(3, "cpu=4");
    let d = env.gang(1, &["cpu=2", "cpu=2", "cpu=2"], "pack");
    assert_eq!(d, dispatches(&[(1, 1), (2, 1), (3, 2)]));
}

#[test]
fn spread_and_strict_spread_use_distinct_nodes() {
    let mut env = cluster(3, "cpu=4");
    assert_eq!(
        env.gang(1, &["cpu=1", "cpu=1", "cpu=1"], "spread"),
        dispatches(&[(1, 1), (2, 2), (3, 3)])
    );
    // Spread shares nodes when it must; strict spread over more bundles than nodes can never
    // be placed, and says so.
    assert_eq!(
        env.gang(4, &["cpu=1", "cpu=1", "cpu=1", "cpu=1"], "spread"),
        dispatches(&[(4, 1), (5, 2), (6, 3), (7, 1)])
    );
    let d = env.gang(8, &["cpu=1"; 4], "strict-spread");
    assert_eq!(d.len(), 4, "{d:?}");
    assert!(
        d[0].starts_with(
            "infeasible 8: a strict-spread reservation of 4 bundles needs 4 \
             distinct live nodes that can each hold one; at most 3 can be found"
        ),
        "{d:?}"
    );
    assert!(env.core.is_pending(TaskId(8)));
    // A fourth node makes it feasible; it is placed once the others free their CPUs.
    let d = env.node(4, "cpu=4");
    assert!(d.contains(&"feasible 8".to_string()), "{d:?}");
}

#[test]
fn the_exact_search_finds_a_placement_first_fit_misses() {
    // First fit puts the 2 on node 1 (4 CPUs), and the 4 then fits nowhere.
    let mut env = TestEnv::new();
    env.node(1, "cpu=4");
    env.node(2, "cpu=2");
    let d = env.gang(1, &["cpu=2", "cpu=4"], "pack");
    assert_eq!(d, dispatches(&[(1, 2), (2, 1)]));
    // Strict spread too, over nodes of different shapes.
    let mut env = TestEnv::new();
    env.node(1, "cpu=4,gpu=1");
    env.node(2, "cpu=4");
    let d = env.gang(1, &["cpu=1", "gpu=1"], "strict-spread");
    assert_eq!(d, dispatches(&[(1, 2), (2, 1)]));
}

#[test]
fn strict_spread_is_infeasible_when_no_distinct_nodes_can_hold_the_bundles() {
    // Two nodes, but only one has a GPU: two GPU bundles cannot be spread.
    let mut env = TestEnv::new();
    env.node(1, "cpu=4,gpu=1");
    env.node(2, "cpu=4");
    let d = env.gang(1, &["gpu=1", "gpu=1"], "strict-spread");
    assert!(
        d.iter().all(|l| l.contains("at most 1 can be found")),
        "{d:?}"
    );
}

#[test]
fn strict_pack_needs_one_node_for_the_sum() {
    let mut env = cluster(2, "cpu=4");
    assert!(env.gang(1, &["cpu=3", "cpu=3"], "strict-pack")[0].starts_with("infeasible 1"));
    assert_eq!(
        env.gang(3, &["cpu=2", "cpu=2"], "strict-pack"),
        dispatches(&[(3, 1), (4, 1)])
    );
}

#[test]
fn nothing_is_taken_until_every_bundle_fits() {
    let mut env = cluster(2, "cpu=2");
    env.submit(100, "cpu=2"); // fills node 1
    assert!(
        env.gang(1, &["cpu=2", "cpu=2"], "spread").is_empty(),
        "only one node has room"
    );
    assert_eq!(
        env.slot(2, "cpu"),
        Some(("2".into(), "0".into())),
        "no partial reservation"
    );
    // An ordinary task may still use the free node meanwhile (no head-of-line blocking).
    assert_eq!(env.submit(101, "cpu=1"), dispatches(&[(101, 2)]));
    env.finish(101);
    assert_eq!(
        env.finish(100),
        dispatches(&[(1, 1), (2, 2)]),
        "both at once when room appears"
    );
}

#[test]
fn competing_gangs_never_hold_partial_reservations() {
    // Two gangs of 2 x cpu=2 on two nodes of cpu=2: exactly one runs, the other waits whole.
    let mut env = cluster(2, "cpu=2");
    let a = env.gang(1, &["cpu=2", "cpu=2"], "spread");
    let b = env.gang(3, &["cpu=2", "cpu=2"], "spread");
    assert_eq!(a, dispatches(&[(1, 1), (2, 2)]));
    assert!(b.is_empty());
    let freed = env.finish(1);
    assert!(
        !freed.iter().any(|line| line.starts_with("dispatch")),
        "one free node is not enough for gang 3, and no member of it starts alone: {freed:?}"
    );
    assert!(env.core.is_pending(TaskId(3)) && env.core.is_pending(TaskId(4)));
    assert_eq!(env.finish(2), dispatches(&[(3, 1), (4, 2)]));
}

#[test]
fn gang_members_can_be_cancelled_and_deadlines_expire_the_whole_gang() {
    let mut env = cluster(1, "cpu=1");
    env.submit(100, "cpu=1");
    env.gang(1, &["cpu=1", "cpu=1"], "pack");
    env.cancel(2);
    assert_eq!(
        env.finish(100),
        dispatches(&[(1, 1)]),
        "the remaining member still runs"
    );
    let tasks = vec![
        (TaskId(10), "cpu=1".parse().unwrap()),
        (TaskId(11), "cpu=1".parse().unwrap()),
    ];
    env.apply(Event::GangSubmitted {
        tasks,
        strategy: Default::default(),
        deadline: Some(50),
    })
    .unwrap();
    assert_eq!(env.tick(50), ["deadline 10", "deadline 11"]);
}

#[test]
fn gang_refusals_change_nothing() {
    let mut env = cluster(1, "cpu=1");
    env.submit(1, "cpu=1");
    let dup = vec![(TaskId(1), "cpu=1".parse().unwrap())];
    assert!(
        env.apply(Event::GangSubmitted {
            tasks: dup,
            strategy: Default::default(),
            deadline: None
        })
        .is_err()
    );
    let twice = vec![
        (TaskId(5), "cpu=1".parse().unwrap()),
        (TaskId(5), "cpu=1".parse().unwrap()),
    ];
    assert!(
        env.apply(Event::GangSubmitted {
            tasks: twice,
            strategy: Default::default(),
            deadline: None
        })
        .is_err()
    );
    assert!(
        env.apply(Event::GangSubmitted {
            tasks: vec![],
            strategy: Default::default(),
            deadline: None
        })
        .is_err()
    );
    assert_eq!(env.core.running_on(TaskId(1)), Some(NodeId(1)));
}

#[test]
fn a_lost_node_makes_a_waiting_gang_infeasible_and_a_new_one_feasible() {
    let mut env = cluster(1, "gpu=1");
    env.node(2, "gpu=1");
    assert!(env.gang(1, &["gpu=2"], "pack")[0].starts_with("infeasible 1"));
    assert_eq!(env.node(3, "gpu=2"), ["feasible 1", "dispatch 1->3"]);
}

/// A stream of small tasks cannot starve a large gang forever: once the gang has waited
/// `GANG_PATIENCE`, it holds the nodes it needs, they drain, and it is placed.
#[test]
fn a_gang_that_waited_too_long_holds_its_nodes_until_they_drain() {
    let mut env = cluster(2, "cpu=4");
    // Eight one-CPU tasks fill both nodes.
    let mut next = 1;
    for _ in 0..8 {
        env.submit(next, "cpu=1");
        next += 1;
    }
    // A gang wanting both nodes whole.
    let gang = 100;
    assert!(
        env.gang(gang, &["cpu=4", "cpu=4"], "strict-spread")
            .is_empty()
    );
    // Each time a small task ends, a new one is submitted: before the patience runs out, the
    // new one takes the freed CPU every time, and the gang waits.
    let mut running: std::collections::VecDeque<u64> = (1..next).collect();
    // The oldest small task ends and a new one is submitted.
    fn step(
        env: &mut TestEnv,
        running: &mut std::collections::VecDeque<u64>,
        next: &mut u64,
    ) -> Vec<String> {
        let done = running.pop_front().unwrap();
        let mut d = env.finish(done);
        d.extend(env.submit(*next, "cpu=1"));
        *next += 1;
        d
    }
    for i in 0..20 {
        env.now = i * 1_000;
        let d = step(&mut env, &mut running, &mut next);
        assert_eq!(d.len(), 1, "at {} ms: {d:?}", env.now);
        assert!(
            d[0].starts_with(&format!("dispatch {}->", next - 1)),
            "{d:?}"
        );
        running.push_back(next - 1);
    }
    assert!(env.core.is_pending(TaskId(gang)));
    // Past the patience: freed CPUs are kept for the gang; the small tasks wait.
    env.now = GANG_PATIENCE + 1;
    let mut placed = None;
    for _ in 0..8 {
        let d = step(&mut env, &mut running, &mut next);
        if d.iter()
            .any(|l| l.starts_with(&format!("dispatch {gang}->")))
        {
            placed = Some(d);
            break;
        }
        assert!(
            d.is_empty(),
            "nothing runs on the held nodes meanwhile: {d:?}"
        );
    }
    let placed = placed.expect("the gang was placed once its nodes drained");
    assert!(
        placed.contains(&format!("dispatch {}->1", gang))
            || placed.contains(&format!("dispatch {}->2", gang)),
        "{placed:?}"
    );
    assert!(!env.core.is_pending(TaskId(gang)) && !env.core.is_pending(TaskId(gang + 1)));
    // The small tasks wait behind the gang, and run once it ends.
    let waiting = next - 1;
    assert!(env.core.is_pending(TaskId(waiting)));
    let d = env.finish(gang);
    assert!(d.iter().any(|l| l.starts_with("dispatch ")), "{d:?}");
}

/// A hold keeps freed resources from small tasks, and ends with its gang.
#[test]
fn a_hold_ends_with_its_gang_and_frees_the_nodes() {
    let mut env = cluster(1, "cpu=4");
    env.submit(1, "cpu=2");
    env.submit(2, "cpu=2");
    assert!(env.gang(10, &["cpu=4"], "pack").is_empty());
    env.now = GANG_PATIENCE;
    // The hold is taken: task 3 cannot take the CPUs task 1 frees.
    let d = env.finish(1);
    assert!(d.is_empty(), "{d:?}");
    assert!(env.submit(3, "cpu=1").is_empty());
    // The gang is cancelled: its hold goes, and task 3 runs at once.
    let d = env.cancel(10);
    assert_eq!(d, dispatches(&[(3, 1)]));
}
