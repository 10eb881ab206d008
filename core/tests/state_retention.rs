//! Retention in the state machine: which finished tasks are evicted and when, what an evicted
//! task answers, that nothing still in use is ever evicted, dead-node and resource-name
//! reclamation, and that the same entries evict the same tasks on every replica.

mod state_support;

use std::time::Duration;

use escher_core::state::{
    ApplyError, ClusterState, Command, Entry, Reply, RetentionPolicy, StateConfig,
};
use escher_proto::types::{
    Evicted, GangStrategy, NodeSpec, TaskId, TaskResult, TaskState, Tombstone,
};
use state_support::{T0, TestState, check_invariants, name, register_command, res, set, task};

/// A state that keeps `finished` finished tasks (for `for_ms`), `tombstones` tombstones, and
/// dead nodes for `nodes_ms`.
fn keeping(finished: usize, for_ms: u64, tombstones: usize, nodes_ms: u64) -> TestState {
    TestState::with_config(StateConfig {
        retention: RetentionPolicy {
            finished,
            finished_for: Duration::from_millis(for_ms),
            tombstones,
            dead_nodes_for: Duration::from_millis(nodes_ms),
            node_tombstones: 2,
        },
        ..StateConfig::default()
    })
}

const HOUR: u64 = 3_600_000;

fn ok(code: i32) -> Result<TaskResult, String> {
    Ok(TaskResult::Exited { code })
}

/// Ids that have no record any more.
fn evicted(t: &TestState) -> Vec<u64> {
    (1..t.state.next_task_id().0)
        .filter(|id| t.state.task(TaskId(*id)).is_none())
        .collect()
}

#[test]
fn the_oldest_finished_go_first() {
    let mut t = keeping(2, HOUR, 100, HOUR);
    t.node("w", "cpu=4");
    let ids: Vec<TaskId> = (0..4).map(|_| t.submit(task("cpu=1")).0).collect();
    // They finish in the order 3, 1, 4, 2: eviction follows finish order, not ids.
    let mut seen = Vec::new();
    for k in [2usize, 0, 3, 1] {
        t.advance(10);
        t.exit(ids[k], 0);
        seen.push(evicted(&t));
    }
    let none: Vec<u64> = Vec::new();
    assert_eq!(seen, [none.clone(), none, vec![3], vec![1, 3]]);
    assert_eq!(t.state.retained_counts(), (2, 2, 0));
}

#[test]
fn a_task_is_evicted_at_the_earliest_by_the_entry_after_the_one_that_finished_it() {
    let mut t = keeping(1, HOUR, 100, HOUR);
    let w = t.node("w", "cpu=3");
    for _ in 0..3 {
        t.submit(task("cpu=1"));
    }
    // Losing the node fails all three in one entry; its Terminal effects still find them.
    let fx = t.remove_node(w);
    assert_eq!(fx, ["terminal 1", "terminal 2", "terminal 3"]);
    assert!(evicted(&t).is_empty());
    assert_eq!(t.task_state(TaskId(3)), TaskState::Failed);
    t.tick_at(t.now);
    assert_eq!(evicted(&t), [1, 2], "the next entry settles the count");
}

#[test]
fn an_evicted_task_answers_from_its_tombstone_then_by_its_id() {
    let mut t = keeping(1, HOUR, 2, HOUR);
    t.node("w", "cpu=1");
    let (a, _) = t.submit(task("cpu=1"));
    t.exit(a, 3);
    let finished_at = t.now;
    for _ in 0..3 {
        t.advance(1000);
        let (x, _) = t.submit(task("cpu=1"));
        t.exit(x, 0);
    }
    t.tick_at(t.now + 1);
    // a, then 2 and 3 were evicted; the tombstone bound (2) drops the lowest id: a's.
    assert_eq!(evicted(&t), [1, 2, 3]);
    let b = TaskId(2);
    let status = t.status(b);
    assert!(status.evicted && status.result.is_none(), "{status:?}");
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(status.finished_at_ms, Some(finished_at + 1000));
    assert_eq!(
        t.state.missing_task(b),
        ApplyError::Evicted(Evicted {
            id: b,
            tombstone: Some(Tombstone {
                state: TaskState::Succeeded,
                finished_at_ms: finished_at + 1000,
            }),
        })
    );
    assert!(t.state.task_info(b).is_none());
    assert!(t.state.is_finished(b));
    t.state.check_known(b).unwrap();

    // a's tombstone is gone, but its id was handed out: still "evicted", never "unknown".
    assert!(t.state.status(a).is_none());
    let gone = t.state.missing_task(a);
    assert_eq!(
        gone,
        ApplyError::Evicted(Evicted {
            id: a,
            tombstone: None
        })
    );
    assert!(gone.to_string().contains("its record is no longer kept"));
    assert!(gone.is_not_found());
    assert_eq!(t.state.check_known(a), Err(gone));
    for never in [TaskId(0), t.state.next_task_id(), TaskId(99)] {
        assert_eq!(t.state.missing_task(never), ApplyError::UnknownTask(never));
    }
}

#[test]
fn cancel_and_local_calls_about_evicted_tasks() {
    let mut t = keeping(1, HOUR, 1, HOUR);
    t.node("w", "cpu=1");
    let ids: Vec<TaskId> = (0..3)
        .map(|_| {
            let (id, _) = t.submit(task("cpu=1"));
            t.exit(id, 0);
            id
        })
        .collect();
    t.tick_at(t.now + 1);
    // 1 lost its tombstone to 2's, 2 has one, 3 keeps its record.
    let out = t.cancel(&[ids[1], ids[2]]).unwrap();
    match out.reply {
        Reply::Cancelled(statuses) => {
            assert!(statuses[0].evicted && statuses[0].state == TaskState::Succeeded);
            assert!(!statuses[1].evicted && statuses[1].state == TaskState::Succeeded);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        out.effects.is_empty(),
        "cancelling finished tasks does nothing"
    );
    let err = t.cancel(&[ids[2], ids[0]]).unwrap_err();
    assert!(
        matches!(err, ApplyError::Evicted(e) if e.id == ids[0]),
        "{err}"
    );
    let err = t
        .try_apply(Command::SetResources {
            updates: vec![set("x", "1", NodeSpec::Local)],
            namespace: None,
            caller_task: Some((ids[1], 1)),
        })
        .unwrap_err();
    assert!(matches!(err, ApplyError::Evicted(_)), "{err}");
}

#[test]
fn pending_running_and_reserved_tasks_are_never_evicted() {
    let mut t = keeping(1, 1, 0, HOUR);
    let w = t.node("w", "cpu=2");
    let (long, _) = t.submit(task("cpu=1"));
    let (waiting, _) = t.submit(task("cpu=1,gpu=1"));
    let bundle = match t
        .apply(Command::Reserve {
            name: name("hold"),
            bundles: vec![res("cpu=1")],
            strategy: GangStrategy::Pack,
            timeout: None,
            namespace: None,
        })
        .reply
    {
        Reply::Reserved { tasks, placed } => {
            assert!(placed);
            tasks[0]
        }
        other => panic!("{other:?}"),
    };
    // The rest of the cluster is busy with a stream of short tasks on another node.
    let other = t.node("v", "cpu=1");
    for _ in 0..50 {
        t.advance(HOUR);
        let (x, fx) = t.submit(task("cpu=1"));
        assert_eq!(fx, [format!("assign {x}->{other} #1")]);
        t.exit(x, 0);
    }
    t.tick_at(t.now + HOUR);
    assert_eq!(t.task_state(long), TaskState::Running);
    assert_eq!(t.task_state(waiting), TaskState::Pending);
    assert_eq!(t.task_state(bundle), TaskState::Running);
    assert_eq!(evicted(&t).len(), 50);
    // Once they end, they go like any other.
    t.exit(long, 1);
    t.cancel(&[waiting, bundle]).unwrap();
    t.advance(HOUR);
    t.tick_at(t.now);
    for id in [long, waiting, bundle] {
        assert!(t.state.task(id).is_none(), "{id} was kept");
    }
    assert!(t.state.node_alive(w));
}

#[test]
fn finished_tasks_older_than_the_age_limit_go_even_below_the_count() {
    let mut t = keeping(1_000, 60_000, 100, HOUR);
    t.node("w", "cpu=1");
    let (a, _) = t.submit(task("cpu=1"));
    t.exit(a, 0);
    let due = t.now + 60_000;
    assert_eq!(t.state.next_timer(), Some(due), "the runtime ticks then");
    t.tick_at(due - 1);
    assert!(t.state.task(a).is_some());
    t.tick_at(due);
    assert!(t.state.task(a).is_none());
    assert_eq!(t.state.next_timer(), None);
}

#[test]
fn dead_nodes_shrink_to_a_tombstone_after_the_grace_period() {
    let mut t = keeping(10, HOUR, 10, 5_000);
    let nodes: Vec<_> = (0..4).map(|i| t.node(&format!("w{i}"), "cpu=1")).collect();
    t.remove_node(nodes[0]);
    let left = t.now;
    let status = t.cluster();
    let dead = status.node(nodes[0]).unwrap();
    assert!(!dead.alive && dead.left_at_ms == Some(left));
    assert_eq!(
        dead.address, "w0.example:7601",
        "whole record within the grace"
    );
    assert_eq!(t.state.next_timer(), Some(left + 5_000));

    t.tick_at(left + 5_000);
    let status = t.cluster();
    let tomb = status.node(nodes[0]).unwrap();
    assert_eq!(
        (tomb.name.as_str(), tomb.alive, tomb.left_at_ms),
        ("w0", false, Some(left))
    );
    assert_eq!(tomb.left_because.as_deref(), Some("heartbeat timeout"));
    assert!(tomb.address.is_empty() && tomb.resources.is_empty());
    assert!(
        t.state
            .gpu_status()
            .nodes
            .iter()
            .all(|n| n.node != nodes[0])
    );

    // Two node tombstones are kept (the highest ids); the nodes stay in id order.
    for &n in &nodes[1..] {
        t.remove_node(n);
    }
    t.tick_at(t.now + 5_000);
    let ids: Vec<_> = t.cluster().nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, [nodes[2], nodes[3]]);
    assert_eq!(t.state.retained_counts().2, 2);

    // A worker that comes back with a reclaimed id is refused (its record is gone), and
    // joins again as a new node, never under an id used before.
    let refused = t.rejoin(nodes[0], "w0", 2, &[], Vec::new());
    assert!(
        matches!(refused, Err(ApplyError::UnknownNode(n)) if n == nodes[0]),
        "{refused:?}"
    );
    let (again, _) = t.register("w0", "cpu=1");
    assert!(again > nodes[3]);
    assert!(t.state.core().has_node(again) && !t.state.core().has_node(nodes[0]));
}

#[test]
fn a_node_that_comes_back_within_its_grace_period_is_never_reclaimed() {
    let mut t = keeping(10, HOUR, 10, 1_000);
    let n = t.node("w0", "cpu=1");
    t.remove_node(n);
    // Its worker restarted and rejoins with its id and secret before the grace period ends.
    t.rejoin(n, "w0", 2, &[], Vec::new()).unwrap();
    t.tick_at(t.now + 5_000);
    assert!(t.state.core().has_node(n));
    assert!(t.cluster().nodes.iter().any(|node| node.id == n));
    assert_eq!(t.state.retained_counts().2, 0);
    check_invariants(&t.state);
    // Lost again later, it is reclaimed a grace period after that.
    t.remove_node(n);
    t.tick_at(t.now + 5_000);
    assert!(!t.state.core().has_node(n));
    assert_eq!(t.state.retained_counts().2, 1);
}

#[test]
fn names_no_task_or_node_uses_are_reclaimed_through_the_state() {
    let mut t = keeping(10, HOUR, 10, 0);
    t.node("w", "cpu=4");
    let base = t.state.core().name_count();
    // Ghosts that each create a resource of their own, and tasks that request it.
    for i in 0..300 {
        let (ghost, _) = t.submit(task("cpu=1").ghost(&format!("lane-{i}=1")));
        let (user, fx) = t.submit(task(&format!("lane-{i}=1")));
        assert_eq!(fx.len(), 1, "{fx:?}");
        t.exit(user, 0);
        t.finish_current(ghost, Ok(TaskResult::Released));
        assert!(t.state.core().name_count() <= base + 1, "at {i}");
    }
    assert_eq!(t.state.core().name_count(), base);
    // A node that leaves takes its names along.
    let v = t.node("v", "special=1");
    assert_eq!(t.state.core().name_count(), base + 1);
    t.remove_node(v);
    assert_eq!(t.state.core().name_count(), base);
}

/// A long mixed run: tasks that succeed, fail, retry, are cancelled or expire, with workers
/// leaving and joining, under a small retention.
fn churn() -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut now = T0;
    let mut push = |command: Command, now: u64| {
        entries.push(Entry {
            now,
            command,
            key: None,
        })
    };
    for i in 0..3 {
        push(register_command(&format!("w{i}"), "cpu=2"), now);
    }
    for round in 0..200u64 {
        now += 37;
        let spec = match round % 4 {
            0 => task("cpu=1").retries(1),
            1 => task("cpu=1").pending_deadline(Duration::from_millis(50)),
            2 => task(&format!("cpu=1,r{}=1", round % 7)),
            _ => task("cpu=1"),
        };
        push(
            Command::Submit {
                tasks: vec![spec.build()],
                namespace: None,
            },
            now,
        );
        // One task per round, so the round's task has id round + 1.
        let id = TaskId(round + 1);
        let command = match round % 5 {
            0 => Command::Cancel { tasks: vec![id] },
            1 => Command::TaskFinished(state_support::report(id, 1, ok(1))),
            2 => Command::Tick,
            _ => Command::TaskFinished(state_support::report(id, 1, ok(0))),
        };
        push(command, now + 5);
        if round % 40 == 39 {
            let node = escher_proto::types::NodeId(1 + round / 40);
            let command = Command::RemoveNode {
                node,
                reason: "gone".into(),
            };
            push(command, now + 6);
        }
    }
    entries
}

fn replay(entries: &[Entry]) -> (Vec<String>, ClusterState) {
    let config = StateConfig {
        retention: RetentionPolicy {
            finished: 5,
            finished_for: Duration::from_millis(500),
            tombstones: 20,
            dead_nodes_for: Duration::from_millis(300),
            node_tombstones: 1,
        },
        ..StateConfig::default()
    };
    let mut state = ClusterState::new(config);
    let mut trace = Vec::new();
    for e in entries {
        let reply = state.apply(e.clone());
        check_invariants(&state);
        let effects = state.take_effects();
        let kept: Vec<u64> = (1..state.next_task_id().0)
            .filter(|id| state.task(TaskId(*id)).is_some())
            .collect();
        trace.push(format!("{reply:?} {effects:?} kept {kept:?}"));
    }
    (trace, state)
}

#[test]
fn the_same_entries_evict_the_same_tasks() {
    let entries = churn();
    let (a, state_a) = replay(&entries);
    let (b, state_b) = replay(&entries);
    assert_eq!(a, b);
    assert_eq!(format!("{state_a:?}"), format!("{state_b:?}"));
    // The run did evict, and stayed within the bounds.
    let (kept, tombstones, nodes) = state_a.retained_counts();
    assert!(kept <= 6, "{kept} finished tasks kept");
    assert!((1..=20).contains(&tombstones), "{tombstones}");
    assert!(nodes <= 1);
    assert!(state_a.next_task_id().0 > 150);
}
