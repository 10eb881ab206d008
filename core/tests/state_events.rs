//! The events `apply` records for watchers: one per change, in order, numbered by a revision
//! that is part of the replicated state (the same on every replica, kept by a snapshot).

mod state_support;

use escher_core::state::{ClusterState, Command, Recorded, StateConfig};
use escher_proto::types::{ClusterEvent, GangStrategy, NodeChange, TaskId, TaskResult, TaskState};
use state_support::{TestState, name, ns, on, res, set, task};

/// The events as short lines, for comparing whole scenarios.
fn lines(events: &[Recorded]) -> Vec<String> {
    events
        .iter()
        .map(|r| match &r.event.event {
            ClusterEvent::Submitted { task, .. } => format!("submitted {task}"),
            ClusterEvent::Started {
                task,
                node,
                attempt,
                ..
            } => format!("started {task} on {node} #{attempt}"),
            ClusterEvent::Finished { task, state, .. } => format!("finished {task} {state}"),
            ClusterEvent::Pending { task, reason, .. } => {
                format!(
                    "pending {task} {}",
                    if reason.is_some() { "blocked" } else { "clear" }
                )
            }
            ClusterEvent::Resource {
                node,
                name,
                capacity,
            } => match capacity {
                Some(c) => format!("resource {name}@{node}={c}"),
                None => format!("resource {name}@{node} deleted"),
            },
            ClusterEvent::Node { node, change, .. } => format!("node {node} {change}"),
            ClusterEvent::Reservation { name, placed } => match placed {
                Some((t, n)) => format!("reservation {name} {t}@{n}"),
                None => format!("reservation {name} released"),
            },
            ClusterEvent::Actor {
                actor,
                change,
                incarnation,
                node,
                ..
            } => match node {
                Some(node) => format!("actor {actor} {change} #{incarnation} on {node}"),
                None => format!("actor {actor} {change} #{incarnation}"),
            },
            ClusterEvent::Decision { source, action, .. } => format!("decision {source} {action}"),
        })
        .collect()
}

/// Applies `command` and returns the lines of what it recorded, checking that revisions
/// continue from `t`'s last one without a gap.
fn step(t: &mut TestState, command: Command) -> Vec<String> {
    let before = t.state.revision();
    let out = t.apply(command);
    let revisions: Vec<u64> = out.events.iter().map(|r| r.event.revision).collect();
    let expected: Vec<u64> = (before + 1..=t.state.revision()).collect();
    assert_eq!(revisions, expected, "revisions must count up by one");
    for r in &out.events {
        assert_eq!(r.event.at_ms, t.now, "events carry the entry's time");
    }
    lines(&out.events)
}

fn submit(spec: state_support::TaskBuilder) -> Command {
    Command::Submit {
        tasks: vec![spec.build()],
        namespace: None,
    }
}

#[test]
fn a_task_life_is_recorded_in_order() {
    let mut t = TestState::new();
    let joined = step(&mut t, state_support::register_command("a", "cpu=2"));
    assert_eq!(joined, vec!["node 1 joined"]);
    let node = escher_proto::types::NodeId(1);

    // Placed at once: submitted, then started, in one command.
    let first = step(&mut t, submit(task("cpu=1")));
    assert_eq!(first, vec!["submitted 1", "started 1 on 1 #1"]);

    // A task no node can run says why, and says so again when that changes.
    let blocked = step(&mut t, submit(task("cpu=1,data=1")));
    assert_eq!(blocked, vec!["submitted 2", "pending 2 blocked"]);
    let gpu = Command::SetResources {
        updates: vec![set("data", "1", on(node))],
        namespace: None,
        caller_task: None,
    };
    assert_eq!(
        step(&mut t, gpu),
        vec!["resource data@1=1", "pending 2 clear", "started 2 on 1 #1"]
    );

    // Waiting for busy capacity is not being blocked: no pending event.
    let queued = step(&mut t, submit(task("cpu=1").retries(1)));
    assert_eq!(queued, vec!["submitted 3"]);
    let attempt = t.state.task(TaskId(1)).unwrap().attempt;
    let done = Command::TaskFinished(state_support::report(
        TaskId(1),
        attempt,
        Ok(TaskResult::Exited { code: 0 }),
    ));
    assert_eq!(
        step(&mut t, done),
        vec!["finished 1 succeeded", "started 3 on 1 #1"]
    );
    // A failed attempt with retries left goes back to pending (saying why), then runs again.
    let crash = Command::TaskFinished(state_support::report(TaskId(3), 1, Err("segfault".into())));
    assert_eq!(
        step(&mut t, crash),
        vec!["pending 3 blocked", "started 3 on 1 #2"]
    );

    // A lost node: the node first, then what happened to its tasks.
    let lost = step(
        &mut t,
        Command::RemoveNode {
            node,
            reason: "no heartbeat for 10s".into(),
        },
    );
    assert_eq!(lost[0], "node 1 lost");
    assert!(lost.contains(&"finished 2 failed".to_string()), "{lost:?}");
    assert!(lost.contains(&"finished 3 failed".to_string()), "{lost:?}");
}

#[test]
fn an_actor_life_is_recorded_as_actor_events_beside_its_task_events() {
    let mut t = TestState::new();
    step(&mut t, state_support::register_command("a", "cpu=2"));
    step(&mut t, state_support::register_command("b", "cpu=2"));
    let node_a = escher_proto::types::NodeId(1);

    // Placed: the task starts (incarnation 1 dispatched) but is not ready yet.
    let placed = step(&mut t, submit(task("cpu=2").actor(Some("ps")).retries(1)));
    assert_eq!(placed, vec!["submitted 1", "started 1 on 1 #1"]);
    // Its worker reports the start once the constructor returned: ready.
    let ready = step(
        &mut t,
        Command::TaskStarted {
            task: TaskId(1),
            attempt: 1,
        },
    );
    assert_eq!(ready, vec!["actor 1 ready #1 on 1"]);
    // Its node is lost: incarnation 1 ends and the actor restarts on the other node.
    let lost = step(
        &mut t,
        Command::RemoveNode {
            node: node_a,
            reason: "no heartbeat for 10s".into(),
        },
    );
    assert_eq!(
        lost,
        vec![
            "node 1 lost",
            "actor 1 restarting #1 on 1",
            "pending 1 blocked",
            "started 1 on 2 #2"
        ]
    );
    step(
        &mut t,
        Command::TaskStarted {
            task: TaskId(1),
            attempt: 2,
        },
    );

    // Out of restarts: it dies, saying why.
    let died = t.apply(Command::TaskFinished(state_support::report(
        TaskId(1),
        2,
        Err("the actor's process was killed by signal 9".into()),
    )));
    let actor_events: Vec<&ClusterEvent> = died
        .events
        .iter()
        .map(|r| &r.event.event)
        .filter(|e| matches!(e, ClusterEvent::Actor { .. }))
        .collect();
    assert_eq!(actor_events.len(), 1, "{actor_events:?}");
    let ClusterEvent::Actor {
        name,
        change,
        incarnation,
        reason,
        ..
    } = actor_events[0]
    else {
        unreachable!()
    };
    assert_eq!(name.as_deref(), Some("ps"));
    assert_eq!(*change, escher_proto::types::ActorChange::Died);
    assert_eq!(*incarnation, 2);
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("signal 9")),
        "{reason:?}"
    );
    assert!(
        actor_events[0]
            .to_string()
            .starts_with("actor 1 (ps) died in incarnation 2 on node 2: "),
        "{}",
        actor_events[0]
    );

    // A plain task records no actor event, and a cancelled actor that never ran dies unplaced.
    let plain = step(&mut t, submit(task("cpu=1")));
    assert_eq!(plain, vec!["submitted 2", "started 2 on 2 #1"]);
    step(
        &mut t,
        Command::TaskStarted {
            task: TaskId(2),
            attempt: 1,
        },
    );
    let blocked = step(&mut t, submit(task("cpu=64").actor(None)));
    assert_eq!(blocked, vec!["submitted 3", "pending 3 blocked"]);
    let cancelled = step(
        &mut t,
        Command::Cancel {
            tasks: vec![TaskId(3)],
        },
    );
    assert_eq!(cancelled, vec!["finished 3 cancelled", "actor 3 died #0"]);
}

#[test]
fn a_refused_command_records_nothing_and_keeps_the_revision() {
    let mut t = TestState::new();
    t.node("a", "cpu=1");
    assert_eq!(
        step(&mut t, submit(task("cpu=1"))),
        vec!["submitted 1", "started 1 on 1 #1"]
    );
    let revision = t.state.revision();
    // Cancels are all known or none: task 1 is not cancelled, and nothing is recorded.
    let refused = t.try_apply(Command::Cancel {
        tasks: vec![TaskId(1), TaskId(99)],
    });
    assert!(refused.is_err());
    assert_eq!(t.state.revision(), revision);
    // The next accepted command continues from there.
    let cancelled = step(
        &mut t,
        Command::Cancel {
            tasks: vec![TaskId(1)],
        },
    );
    assert!(
        cancelled.is_empty(),
        "a running task ends when its worker confirms: {cancelled:?}"
    );
}

#[test]
fn events_carry_the_namespace_and_labels_of_their_task() {
    let mut t = TestState::new();
    t.node("a", "cpu=1");
    let spec = task("cpu=1").label("stage", "map").name("m").build();
    let out = t.apply(Command::Submit {
        tasks: vec![spec],
        namespace: Some(ns("team-a")),
    });
    let submitted = &out.events[0];
    match &submitted.event.event {
        ClusterEvent::Submitted {
            name, namespace, ..
        } => {
            assert_eq!(name, "m");
            assert_eq!(namespace.as_ref().map(|n| n.as_str()), Some("team-a"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(submitted.labels.get("stage"), Some("map"));
    assert!(
        out.events
            .iter()
            .all(|r| r.labels.get("stage") == Some("map"))
    );
}

#[test]
fn reservations_draining_and_cancels_are_recorded() {
    let mut t = TestState::new();
    let a = t.node("a", "cpu=2");
    let out = step(
        &mut t,
        Command::Reserve {
            name: name("train"),
            bundles: vec![res("cpu=1")],
            strategy: GangStrategy::Pack,
            timeout: None,
            namespace: None,
        },
    );
    assert_eq!(out[0], "submitted 1");
    assert!(out.contains(&"started 1 on 1 #1".to_string()), "{out:?}");
    assert!(
        out.contains(&"reservation train 1@1".to_string()),
        "{out:?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("resource train.cpu@1")),
        "{out:?}"
    );

    let released = step(
        &mut t,
        Command::Cancel {
            tasks: vec![TaskId(1)],
        },
    );
    assert!(
        released.contains(&"finished 1 cancelled".to_string()),
        "{released:?}"
    );
    assert!(
        released.contains(&"reservation train released".to_string()),
        "{released:?}"
    );

    let pending = step(&mut t, submit(task("cpu=9")));
    assert_eq!(pending, vec!["submitted 2", "pending 2 blocked"]);
    assert_eq!(
        step(
            &mut t,
            Command::Cancel {
                tasks: vec![TaskId(2)]
            }
        ),
        vec!["finished 2 cancelled"]
    );

    let drained = step(&mut t, Command::DrainNode { node: a });
    assert_eq!(drained[0], "node 1 draining");
    assert!(
        drained.contains(&"resource cpu@1 deleted".to_string()),
        "{drained:?}"
    );
    let kinds: Vec<_> = t
        .state
        .task(TaskId(2))
        .map(|r| r.state)
        .into_iter()
        .collect();
    assert_eq!(kinds, vec![TaskState::Cancelled]);
    let _ = NodeChange::Draining;
}

#[test]
fn replicas_number_events_alike_and_a_snapshot_keeps_the_revision() {
    let mut a = TestState::new();
    a.node("a", "cpu=1");
    a.submit(task("cpu=1"));
    a.submit(task("cpu=1"));
    let revision = a.state.revision();
    assert!(revision >= 4, "{revision}");
    let bytes = bincode::serde::encode_to_vec(&a.state, bincode::config::standard()).unwrap();
    let (restored, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    let mut b = TestState {
        state: restored.restore(StateConfig::default()),
        now: a.now,
    };
    assert_eq!(b.state.revision(), revision);
    // The same command on both gives the same events with the same revisions.
    let attempt = a.state.task(TaskId(1)).unwrap().attempt;
    let done = || {
        Command::TaskFinished(state_support::report(
            TaskId(1),
            attempt,
            Ok(TaskResult::Exited { code: 0 }),
        ))
    };
    let on_a = a.apply(done()).events;
    let on_b = b.apply(done()).events;
    assert_eq!(on_a, on_b);
    assert_eq!(on_a[0].event.revision, revision + 1);
}

#[test]
fn a_decision_is_recorded_for_watchers_and_a_bad_one_is_refused_with_nothing_recorded() {
    let mut t = TestState::new();
    let command = |source: &str, reason: String| Command::RecordDecision {
        source: source.to_string(),
        action: "launch".to_string(),
        reason,
    };
    let why = "3 task(s) pending for 2s or more fit in 1 worker(s) of cpu=4".to_string();
    assert_eq!(
        step(&mut t, command("autoscaler/gpu", why.clone())),
        ["decision autoscaler/gpu launch"]
    );
    let before = t.state.revision();
    let err = t
        .try_apply(command("autoscaler gpu", why))
        .expect_err("a source with a space");
    assert!(err.to_string().contains("decision source"), "{err}");
    let err = t
        .try_apply(command("autoscaler/gpu", "x".repeat(2000)))
        .expect_err("a reason too long");
    assert!(err.to_string().contains("at most 1024 bytes"), "{err}");
    assert_eq!(t.state.revision(), before, "nothing recorded");
}
