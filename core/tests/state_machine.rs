//! Scenario tests of the head's state machine: [`ClusterState::apply`] driven with entries, with
//! exact assertions on replies, effects and task statuses, plus a property test over random
//! command sequences. Every step runs the invariant checks of `state_support`.

mod state_support;

use std::time::Duration;

use escher_core::scheduler::CoreError;
use escher_core::state::{
    ApplyError, ClusterState, Command, Effect, Entry, MAX_TAILS_KEPT, Reply, RetentionPolicy,
    Returning, StateConfig,
};
use escher_proto::types::{
    Amount, Capacity, CapacityOp, Delta, ListTasksRequest, MAX_ATTEMPTS_KEPT, NodeId, NodeSpec,
    OutputTail, RequestKey, ResourceUpdate, RunningTask, TaskFinished, TaskId, TaskResult,
    TaskState,
};
use proptest::prelude::*;
use state_support::ops::{Op, command_for, op};
use state_support::{
    CLUSTER, T0, TestState, adjust, check_invariants, joining, matching, name, ns, on, render,
    report, res, secret, set, task,
};

fn ok(code: i32) -> Result<TaskResult, String> {
    Ok(TaskResult::Exited { code })
}

// ---- 1. the happy path -------------------------------------------------------------------

#[test]
fn a_command_task_is_assigned_started_and_succeeds() {
    let mut t = TestState::new();
    let node = t.node("w1", "cpu=4,memory=1024");
    assert_eq!(node, NodeId(1));
    t.advance(5);
    let (id, out) = t.submit_in(None, vec![task("cpu=1").name("hello").build()]);
    let id = id[0];
    assert_eq!(out.reply, Reply::Submitted(vec![TaskId(1)]));
    let [
        Effect::Assign {
            node: to,
            assignment,
        },
    ] = out.effects.as_slice()
    else {
        panic!("expected one assignment, got {:?}", out.effects);
    };
    assert_eq!(*to, node);
    assert_eq!(assignment.task_id, id);
    assert_eq!(assignment.attempt, 1);
    assert_eq!(assignment.allocation, res("cpu=1"));
    assert_eq!(assignment.spec, task("cpu=1").name("hello").build());
    assert_eq!(t.task_state(id), TaskState::Running);
    assert_eq!(t.slot(node, "cpu"), Some(("4".into(), "1".into())));
    assert_eq!(t.state.running_on(node), [(id, 1)]);

    t.advance(10);
    assert_eq!(
        t.apply(Command::TaskStarted {
            task: id,
            attempt: 1
        })
        .fx(),
        Vec::<String>::new()
    );
    assert_eq!(t.state.task_info(id).unwrap().started_at_ms, Some(T0 + 15));

    t.advance(100);
    assert_eq!(t.exit(id, 0), ["terminal 1"]);
    let status = t.status(id);
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(status.node, Some(node));
    assert_eq!(status.attempt, 1);
    assert_eq!(status.reason, None);
    assert_eq!(status.result, Some(TaskResult::Exited { code: 0 }));
    let info = t.state.task_info(id).unwrap();
    assert_eq!(info.submitted_at_ms, T0 + 5);
    assert_eq!(info.started_at_ms, Some(T0 + 15));
    assert_eq!(info.finished_at_ms, Some(T0 + 115));
    assert_eq!(t.slot(node, "cpu"), Some(("4".into(), "0".into())));
    assert!(t.state.running_on(node).is_empty());
    let cluster = t.cluster();
    assert_eq!((cluster.pending_tasks, cluster.running_tasks), (0, 0));
}

// ---- 2. failures and retries -------------------------------------------------------------

#[test]
fn a_failed_attempt_is_retried_while_retries_remain_then_fails() {
    let mut t = TestState::new();
    let node = t.node("w1", "cpu=1");
    let (a, fx) = t.submit(task("cpu=1").retries(1));
    assert_eq!(fx, ["assign 1->1 #1"]);
    // B waits for the cpu, ahead of A's retry in the queue.
    let (b, fx) = t.submit(task("cpu=1"));
    assert!(fx.is_empty());

    assert_eq!(
        t.exit(a, 3),
        ["assign 2->1 #1"],
        "B gets the cpu, A waits to retry"
    );
    let status = t.status(a);
    assert_eq!(status.state, TaskState::Pending);
    assert_eq!(status.attempt, 1);
    let reason = status.reason.unwrap();
    assert!(
        reason.contains("retrying") && reason.contains("exited with code 3"),
        "{reason}"
    );

    assert_eq!(t.exit(b, 0), ["terminal 2", "assign 1->1 #2"]);
    assert_eq!(t.task_state(a), TaskState::Running);
    assert_eq!(t.status(a).attempt, 2);

    assert_eq!(t.exit(a, 7), ["terminal 1"]);
    let status = t.status(a);
    assert_eq!(status.state, TaskState::Failed);
    assert_eq!(status.attempt, 2);
    assert_eq!(status.reason.as_deref(), Some("exited with code 7"));
    assert_eq!(
        status.result,
        Some(TaskResult::Exited { code: 7 }),
        "the exit code is kept"
    );
    assert_eq!(t.slot(node, "cpu"), Some(("1".into(), "0".into())));
}

#[test]
fn a_timed_out_attempt_says_so() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").timeout(Duration::from_secs(2)));
    let fx = t.finish(TaskFinished {
        timed_out: true,
        output: None,
        ..report(a, 1, ok(137))
    });
    assert_eq!(fx, ["terminal 1"]);
    assert_eq!(t.task_state(a), TaskState::Failed);
    let reason = t.reason(a);
    assert!(
        reason.contains("timed out") && reason.contains("2s"),
        "{reason}"
    );

    // A function that errs after its timeout: the error is kept.
    let (b, _) = t.submit(task("cpu=1").function("slow"));
    let fx = t.finish(TaskFinished {
        timed_out: true,
        output: None,
        ..report(b, 1, Err("killed".into()))
    });
    assert_eq!(fx, ["terminal 2"]);
    assert_eq!(t.reason(b), "timed out: killed");

    // A spawn error is reported as is.
    let (c, _) = t.submit(task("cpu=1"));
    t.finish(report(c, 1, Err("no such program: nope".into())));
    assert_eq!(t.reason(c), "no such program: nope");
}

#[test]
fn each_attempt_is_remembered_with_its_node_its_end_and_its_output_tail() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(2));
    let tail = |text: &str, len: u64| OutputTail {
        stdout: text.as_bytes().to_vec(),
        stdout_len: len,
        ..OutputTail::default()
    };
    // Attempt 1 exits 3 and reports the end of its output.
    t.finish(TaskFinished {
        output: Some(tail("bad input\n", 10)),
        ..report(a, 1, ok(3))
    });
    // Attempt 2 is lost with its node; attempt 3 succeeds elsewhere.
    let n2 = t.node("w2", "cpu=1");
    assert_eq!(t.status(a).node, Some(n1));
    t.remove_node(n1);
    assert_eq!(t.status(a).node, Some(n2));
    t.finish(TaskFinished {
        output: Some(tail("done\n", 9000)),
        ..report(a, 3, ok(0))
    });
    let rec = t.state.task(a).unwrap();
    let ends: Vec<(u32, NodeId, Option<String>, bool)> = rec
        .attempts
        .iter()
        .map(|x| (x.attempt, x.node, rec.ended(x), x.output.is_some()))
        .collect();
    assert_eq!(
        ends,
        [
            (1, n1, Some("exited with code 3".into()), true),
            (2, n1, Some("node 1 lost: heartbeat timeout".into()), false),
            (3, n2, Some("exited with code 0".into()), true),
        ]
    );
    assert_eq!(
        rec.attempt_record(1).unwrap().output.as_deref(),
        Some(&tail("bad input\n", 10))
    );
    // Only a failed attempt's end is stored; the last one's is the task's result.
    assert!(rec.attempts[2].ended.is_none());
    // The API reports them.
    let info = t.state.task_info(a).unwrap();
    assert_eq!(info.attempts.len(), 3);
    assert!(info.attempts[0].output_kept && !info.attempts[1].output_kept);
    assert_eq!(
        info.attempts[2].ended.as_deref(),
        Some("exited with code 0")
    );
    // A report with a tail travels through the log like any other command.
    check_invariants(&t.state);
}

#[test]
fn the_head_keeps_a_bounded_history_of_attempts_and_tails() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(u32::MAX));
    let runs = MAX_ATTEMPTS_KEPT as u32 + 4;
    for attempt in 1..=runs {
        t.finish(TaskFinished {
            output: Some(OutputTail {
                stderr: vec![b'x'; 10],
                stderr_len: 10,
                ..OutputTail::default()
            }),
            ..report(a, attempt, ok(1))
        });
    }
    let rec = t.state.task(a).unwrap();
    assert_eq!(rec.attempts.len(), MAX_ATTEMPTS_KEPT);
    assert_eq!(
        rec.attempts[0].attempt,
        runs + 1 - MAX_ATTEMPTS_KEPT as u32 + 1
    );
    let tails = rec.attempts.iter().filter(|x| x.output.is_some()).count();
    // The running attempt has no tail yet; the last ended ones keep theirs.
    assert_eq!(tails, MAX_TAILS_KEPT - 1);
    assert!(rec.attempt_record(1).is_none());
}

#[test]
fn tasks_are_listed_newest_first_and_filtered() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=4");
    t.node("w2", "cpu=4");
    let (ids, _) = t.submit_in(
        Some("team-a"),
        vec![
            task("cpu=1").name("train-1").label("kind", "gpu").build(),
            task("cpu=1").name("eval-1").build(),
        ],
    );
    let (other, _) = t.submit(task("cpu=1").name("train-2").label("kind", "cpu"));
    let list = |q: ListTasksRequest| -> Vec<TaskId> {
        let page = t.state.list_tasks_counted(&q, 100, |_| true);
        page.tasks.iter().map(|s| s.id).collect()
    };
    let newest = ListTasksRequest {
        newest_first: true,
        ..ListTasksRequest::default()
    };
    assert_eq!(list(newest.clone()), [other, ids[1], ids[0]]);
    let named = ListTasksRequest {
        name: Some("train".into()),
        ..newest.clone()
    };
    assert_eq!(list(named), [other, ids[0]]);
    let labelled = ListTasksRequest {
        labels: vec![("kind".into(), Some("gpu".into()))],
        ..newest.clone()
    };
    assert_eq!(list(labelled), [ids[0]]);
    let any_kind = ListTasksRequest {
        labels: vec![("kind".into(), None)],
        ..ListTasksRequest::default()
    };
    assert_eq!(list(any_kind), [ids[0], other]);
    let in_team = ListTasksRequest {
        namespace: Some(ns("team-a")),
        ..ListTasksRequest::default()
    };
    assert_eq!(list(in_team), [ids[0], ids[1]]);
    let on_node = ListTasksRequest {
        node: Some(n1),
        ..ListTasksRequest::default()
    };
    let placed = list(on_node);
    assert!(!placed.is_empty());
    assert!(placed.iter().all(|id| t.status(*id).node == Some(n1)));
    // Paging backwards from an id, and counting what is left.
    let page = t.state.list_tasks_counted(
        &ListTasksRequest {
            after: Some(other),
            ..newest.clone()
        },
        1,
        |_| true,
    );
    assert_eq!(
        page.tasks.iter().map(|s| s.id).collect::<Vec<_>>(),
        [ids[1]]
    );
    assert_eq!(page.more, 1);
    let summary = &page.tasks[0];
    assert_eq!(summary.namespace, Some(ns("team-a")));
    assert!(summary.started_at_ms.is_some() && summary.finished_at_ms.is_none());
    // Only what the caller may see.
    let visible = t.state.list_tasks(&newest, 100, |ns| ns.is_none());
    assert_eq!(visible.iter().map(|s| s.id).collect::<Vec<_>>(), [other]);
}

// ---- 3. lost nodes -----------------------------------------------------------------------

#[test]
fn a_lost_nodes_tasks_are_retried_elsewhere_or_failed_and_its_resources_vanish() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let (a, fx) = t.submit(task("cpu=1").retries(1));
    assert_eq!(fx, ["assign 1->1 #1"]);

    // A goes back to pending and runs again on the node that is left.
    assert_eq!(t.remove_node(n1), ["assign 1->2 #2"]);
    assert_eq!(t.status(a).node, Some(n2));
    assert!(t.reason(a).contains("node 1 lost"), "{}", t.reason(a));
    let cluster = t.cluster();
    let lost = cluster.node(n1).unwrap();
    assert!(!lost.alive);
    assert!(lost.resources.is_empty());
    assert_eq!(cluster.nodes.len(), 2);
    assert!(!t.state.node_alive(n1));
    assert_eq!(t.state.live_nodes(), [n2]);

    // B, without retries, on a node with an ephemeral resource.
    let n3 = t.node("w3", "cpu=1");
    t.set_resources(None, vec![set("data-7", "unbounded", on(n3))])
        .unwrap();
    let (b, fx) = t.submit(task("cpu=1"));
    assert_eq!(fx, ["assign 2->3 #1"]);
    let (c, fx) = t.submit(task("data-7=1"));
    assert_eq!(fx, ["assign 3->3 #1"]);
    assert_eq!(t.slot(n3, "data-7"), Some(("unbounded".into(), "1".into())));

    let fx = t.remove_node(n3);
    assert_eq!(fx, ["terminal 2", "terminal 3"]);
    assert_eq!(t.task_state(b), TaskState::Failed);
    assert_eq!(t.reason(b), "node 3 lost: heartbeat timeout");
    assert_eq!(t.task_state(c), TaskState::Failed);
    let cluster = t.cluster();
    assert!(!cluster.node(n3).unwrap().alive);
    assert!(cluster.node(n3).unwrap().resources.is_empty());
    assert!(cluster.nodes.iter().all(|n| n.resource("data-7").is_none()));

    // The ephemeral resource is gone: nothing matches it, a task needing it is infeasible,
    // and the lost node cannot be targeted.
    let out = t
        .set_resources(None, vec![set("m", "1", matching("data-7=1", None))])
        .unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![]]));
    let (d, fx) = t.submit(task("data-7=1"));
    assert!(fx.is_empty());
    assert!(
        t.reason(d).starts_with("infeasible: resource data-7"),
        "{}",
        t.reason(d)
    );
    let err = t
        .set_resources(None, vec![set("x", "1", on(n3))])
        .unwrap_err();
    assert_eq!(err, ApplyError::UnknownNode(n3));
    // Removing it again changes nothing; an unknown node is refused.
    assert!(t.remove_node(n3).is_empty());
    let err = t.try_apply(Command::RemoveNode {
        node: NodeId(99),
        reason: "x".into(),
    });
    assert_eq!(err.unwrap_err(), ApplyError::UnknownNode(NodeId(99)));
}

// ---- 4. stale reports --------------------------------------------------------------------

#[test]
fn reports_about_an_old_attempt_are_ignored() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(2));
    assert_eq!(t.remove_node(n1), ["assign 1->2 #2"]);

    let before = format!("{:?}", t.state);
    for command in [
        Command::TaskFinished(report(a, 1, ok(0))),
        Command::TaskFinished(report(a, 1, ok(1))),
        Command::TaskFinished(report(a, 3, ok(0))),
        Command::TaskStarted {
            task: a,
            attempt: 1,
        },
        Command::TaskFinished(report(TaskId(42), 1, ok(0))),
        Command::TaskStarted {
            task: TaskId(42),
            attempt: 1,
        },
    ] {
        let out = t.apply(command);
        assert_eq!(out.reply, Reply::Done);
        assert!(out.effects.is_empty());
    }
    assert_eq!(
        before,
        format!("{:?}", t.state),
        "stale reports changed the state"
    );
    assert_eq!(t.task_state(a), TaskState::Running);

    // The current attempt's report counts; a late duplicate of it does not.
    assert_eq!(t.finish(report(a, 2, ok(0))), ["terminal 1"]);
    assert!(t.finish(report(a, 2, ok(1))).is_empty());
    assert_eq!(t.task_state(a), TaskState::Succeeded);
    assert_eq!(t.slot(n2, "cpu"), Some(("1".into(), "0".into())));
}

// ---- 5. set_resource ---------------------------------------------------------------------

#[test]
fn physical_resources_cannot_be_set_by_applications() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=4,mig.1g.5gb=2");
    for physical in ["cpu", "mig.1g.5gb", "memory", "gpu"] {
        let err = t
            .set_resources(None, vec![set(physical, "8", on(n))])
            .unwrap_err();
        assert_eq!(err, ApplyError::Physical(name(physical)));
        assert!(err.to_string().contains("physical"), "{err}");
        // Also inside a namespace, and in the middle of a batch.
        let batch = vec![set("mine", "1", on(n)), set(physical, "8", on(n))];
        let err = t.set_resources(Some("app"), batch).unwrap_err();
        assert_eq!(err, ApplyError::Physical(name(physical)));
    }
    assert_eq!(t.slot(n, "cpu"), Some(("4".into(), "0".into())));
    assert_eq!(t.slot(n, "mig.1g.5gb"), Some(("2".into(), "0".into())));
    assert_eq!(t.slot(n, "mine"), None);
    assert_eq!(t.slot(n, "app/mine"), None);

    // Hooks and ghosts cannot touch them either.
    for spec in [
        task("").on_success(set("cpu", "1", NodeSpec::Local)),
        task("").on_start(adjust("gpu", "+1", NodeSpec::Local)),
        task("").ghost("mig.1g.5gb=1"),
    ] {
        let err = t.try_apply(Command::Submit {
            tasks: vec![spec.build()],
            namespace: None,
        });
        assert!(matches!(err, Err(ApplyError::Physical(_))), "{err:?}");
    }
}

#[test]
fn local_means_the_calling_tasks_node() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1,gpu=1");
    let local = |caller: Option<TaskId>| Command::SetResources {
        updates: vec![set("here", "1", NodeSpec::Local)],
        namespace: None,
        caller_task: caller.map(|task| (task, 1)),
    };
    assert_eq!(
        t.try_apply(local(None)).unwrap_err(),
        ApplyError::LocalOutsideTask
    );
    assert_eq!(
        t.try_apply(local(Some(TaskId(9)))).unwrap_err(),
        ApplyError::UnknownTask(TaskId(9))
    );

    let (running, fx) = t.submit(task("gpu=1"));
    assert_eq!(fx, ["assign 1->2 #1"]);
    let (pending, fx) = t.submit(task("gpu=1"));
    assert!(fx.is_empty());
    assert_eq!(
        t.try_apply(local(Some(pending))).unwrap_err(),
        ApplyError::CallerNotRunning {
            task: pending,
            state: TaskState::Pending
        }
    );

    let out = t.apply(local(Some(running)));
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n2]]));
    assert!(out.effects.is_empty());
    assert_eq!(t.slot(n2, "here"), Some(("1".into(), "0".into())));
    assert_eq!(t.slot(n1, "here"), None);

    // Once it finished, it has no node any more.
    t.exit(running, 0);
    assert_eq!(
        t.try_apply(local(Some(running))).unwrap_err(),
        ApplyError::CallerNotRunning {
            task: running,
            state: TaskState::Succeeded
        }
    );
    assert_eq!(t.task_state(pending), TaskState::Running);
}

#[test]
fn an_ended_attempts_credential_has_no_node() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let local = |task: TaskId, attempt: u32| Command::SetResources {
        updates: vec![set("here", "1", NodeSpec::Local)],
        namespace: None,
        caller_task: Some((task, attempt)),
    };
    let (task, _) = t.submit(task("cpu=1").retries(1));
    let first = t.state.task(task).unwrap().node.unwrap();
    t.remove_node(first);
    let rec = t.state.task(task).unwrap();
    assert_eq!((rec.state, rec.attempt), (TaskState::Running, 2));
    let second = rec.node.unwrap();
    assert_eq!(
        [first, second]
            .iter()
            .filter(|n| [n1, n2].contains(n))
            .count(),
        2
    );
    // The first attempt's credential (its process may still run on the lost node) acts for
    // nothing, and never for the node of the attempt that replaced it.
    assert_eq!(
        t.try_apply(local(task, 1)).unwrap_err(),
        ApplyError::AttemptEnded {
            task,
            attempt: 1,
            current: 2
        }
    );
    let out = t.apply(local(task, 2));
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![second]]));
}

#[test]
fn unknown_nodes_are_not_found() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let err = t
        .set_resources(None, vec![set("x", "1", on(NodeId(7)))])
        .unwrap_err();
    assert_eq!(err, ApplyError::UnknownNode(NodeId(7)));
    assert!(err.is_not_found());
    assert_eq!(err.to_string(), "unknown node 7");
}

#[test]
fn a_batch_applies_all_or_nothing() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=1");
    t.set_resources(None, vec![set("tokens", "2", on(n))])
        .unwrap();
    let batch = vec![adjust("x", "+1", on(n)), adjust("tokens", "-3", on(n))];
    let err = t.set_resources(None, batch).unwrap_err();
    assert!(
        matches!(&err, ApplyError::Core(CoreError::NegativeCapacity { node, .. }) if *node == n),
        "{err:?}"
    );
    assert!(err.to_string().contains("negative"), "{err}");
    assert_eq!(
        t.slot(n, "x"),
        None,
        "the first update did not happen either"
    );
    assert_eq!(t.slot(n, "tokens"), Some(("2".into(), "0".into())));

    // Later updates of a batch see the earlier ones.
    let batch = vec![adjust("tokens", "-1", on(n)), adjust("tokens", "-1", on(n))];
    let out = t.set_resources(None, batch).unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n], vec![n]]));
    assert_eq!(t.slot(n, "tokens"), None, "reaching zero deletes");
    let batch = vec![set("y", "1", on(n)), adjust("y", "-2", on(n))];
    assert!(t.set_resources(None, batch).is_err());
    assert_eq!(t.slot(n, "y"), None);
    // A Match with num_nodes of zero is refused.
    let err = t
        .set_resources(None, vec![set("z", "1", matching("", Some(0)))])
        .unwrap_err();
    assert_eq!(err, ApplyError::Core(CoreError::ZeroNumNodes));
}

#[test]
fn adjustments_compose() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=1");
    for _ in 0..8 {
        let out = t
            .set_resources(None, vec![adjust("tokens", "+1", on(n))])
            .unwrap();
        assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n]]));
    }
    assert_eq!(t.slot(n, "tokens"), Some(("8".into(), "0".into())));
    t.set_resources(None, vec![adjust("tokens", "-0.5", on(n))])
        .unwrap();
    assert_eq!(t.slot(n, "tokens"), Some(("7.5".into(), "0".into())));
    // Deltas leave an unbounded capacity alone; capacity 0 deletes.
    t.set_resources(
        None,
        vec![set("inf", "unbounded", on(n)), adjust("inf", "-3", on(n))],
    )
    .unwrap();
    assert_eq!(t.slot(n, "inf"), Some(("unbounded".into(), "0".into())));
    t.set_resources(None, vec![set("inf", "0", on(n))]).unwrap();
    assert_eq!(t.slot(n, "inf"), None);
    let delete = ResourceUpdate {
        name: name("tokens"),
        op: CapacityOp::Delete,
        target: on(n),
    };
    t.set_resources(None, vec![delete]).unwrap();
    assert_eq!(t.slot(n, "tokens"), None);
}

#[test]
fn match_with_num_nodes_picks_the_lowest_ids_with_the_resources_available() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let n3 = t.node("w3", "cpu=1");
    let n4 = t.node("w4", "cpu=1");
    let n5 = t.node("w5", "cpu=1");
    for n in [n2, n3, n4, n5] {
        t.set_resources(None, vec![set("slot", "1", on(n))])
            .unwrap();
    }
    // Occupy the slot on node 2 (the scarcest-resource round robin starts at the first holder).
    let (_, fx) = t.submit(task("slot=1"));
    assert_eq!(fx, ["assign 1->2 #1"]);
    let out = t
        .set_resources(None, vec![set("picked", "1", matching("slot=1", Some(2)))])
        .unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n3, n4]]));
    for (n, has) in [
        (n1, false),
        (n2, false),
        (n3, true),
        (n4, true),
        (n5, false),
    ] {
        assert_eq!(t.slot(n, "picked").is_some(), has, "node {n}");
    }
    // Without a limit: every node with it available; an empty match: every live node.
    let out = t
        .set_resources(None, vec![set("all", "1", matching("slot=1", None))])
        .unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n3, n4, n5]]));
    let out = t
        .set_resources(None, vec![set("every", "1", matching("", Some(4)))])
        .unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n1, n2, n3, n4]]));
}

// ---- 6. namespaces -----------------------------------------------------------------------

#[test]
fn namespaces_keep_applications_apart() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let (ids, out) = t.submit_in(Some("a"), vec![task("x=1").build()]);
    let a = ids[0];
    assert!(out.effects.is_empty());
    let reason = t.reason(a);
    assert!(reason.starts_with("infeasible"), "{reason}");
    assert!(reason.contains("a/x"), "{reason}");
    assert_eq!(t.state.task(a).unwrap().spec.resources, res("a/x=1"));
    let pending = t.state.task_info(a).unwrap().pending_reason.unwrap();
    assert_eq!(pending.resource, name("a/x"));

    // Another application's x is not a's x.
    let out = t
        .set_resources(Some("b"), vec![set("x", "1", on(n1))])
        .unwrap();
    assert!(out.effects.is_empty());
    assert_eq!(t.slot(n1, "b/x"), Some(("1".into(), "0".into())));
    assert_eq!(t.task_state(a), TaskState::Pending);
    // Nor is the unqualified x.
    t.set_resources(None, vec![set("x", "1", on(n1))]).unwrap();
    assert_eq!(t.task_state(a), TaskState::Pending);

    let out = t
        .set_resources(Some("a"), vec![set("x", "1", on(n2))])
        .unwrap();
    assert_eq!(out.fx(), ["assign 1->2 #1"]);
    assert_eq!(t.task_state(a), TaskState::Running);
    assert_eq!(t.status(a).reason, None);
    assert_eq!(t.state.task_info(a).unwrap().pending_reason, None);

    // Qualified names reach across for reading: b waits for a's x. Writing is a's (or the
    // admin's) alone: b cannot release it.
    let (ids, _) = t.submit_in(Some("b"), vec![task("a/x=1").build()]);
    assert_eq!(t.task_state(ids[0]), TaskState::Pending);
    let err = t
        .set_resources(Some("b"), vec![adjust("a/x", "+1", on(n2))])
        .unwrap_err();
    assert!(matches!(err, ApplyError::OtherNamespace { .. }), "{err}");
    let out = t
        .set_resources(Some("a"), vec![adjust("a/x", "+1", on(n2))])
        .unwrap();
    assert_eq!(out.fx(), ["assign 2->2 #1"]);
    // Physical names are the same in every namespace.
    let (ids, out) = t.submit_in(Some("b"), vec![task("cpu=1").build()]);
    assert_eq!(out.fx(), ["assign 3->1 #1"]);
    assert_eq!(t.state.task(ids[0]).unwrap().spec.resources, res("cpu=1"));
}

#[test]
fn match_resources_are_qualified_with_the_namespace() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    t.set_resources(Some("a"), vec![set("gpu-pool", "1", on(n2))])
        .unwrap();
    t.set_resources(None, vec![set("gpu-pool", "1", on(n1))])
        .unwrap();
    // In namespace a, `gpu-pool` means a/gpu-pool: node 2, not node 1.
    let out = t
        .set_resources(
            Some("a"),
            vec![set("tag", "1", matching("gpu-pool=1,cpu=1", None))],
        )
        .unwrap();
    assert_eq!(out.reply, Reply::ResourcesSet(vec![vec![n2]]));
    assert_eq!(t.slot(n2, "a/tag"), Some(("1".into(), "0".into())));
    // The same for a hook of a task submitted in namespace a.
    let spec = task("cpu=1").on_success(set("done", "1", matching("gpu-pool=1", None)));
    let (ids, out) = t.submit_in(Some("a"), vec![spec.build()]);
    assert_eq!(out.fx(), ["assign 1->1 #1"]);
    t.exit(ids[0], 0);
    assert_eq!(t.slot(n2, "a/done"), Some(("1".into(), "0".into())));
    assert_eq!(t.slot(n1, "a/done"), None);
}

// ---- 7. ghost tasks ----------------------------------------------------------------------

#[test]
fn a_ghost_creates_a_bundle_for_as_long_as_it_lives() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=4");
    let n2 = t.node("w2", "cpu=8");
    // Fill node 1's cpu so the ghost lands on node 2.
    t.submit(task("cpu=4"));
    let (ghost, fx) = t.submit(task("cpu=4").ghost("bundle=4"));
    assert_eq!(fx, ["assign 2->2 #1"]);
    assert_eq!(t.slot(n2, "bundle"), Some(("4".into(), "0".into())));
    assert_eq!(t.slot(n1, "bundle"), None);

    let mut members = Vec::new();
    for i in 0..5 {
        let (id, fx) = t.submit(task("bundle=1"));
        if i < 4 {
            assert_eq!(fx, [format!("assign {id}->2 #1")]);
        } else {
            assert!(fx.is_empty(), "the bundle is full");
        }
        members.push(id);
    }
    assert_eq!(t.slot(n2, "bundle"), Some(("4".into(), "4".into())));

    // The ghost is released: its bundle goes, the holders keep what they hold.
    assert_eq!(
        t.finish_current(ghost, Ok(TaskResult::Released)),
        ["terminal 2"]
    );
    assert_eq!(t.task_state(ghost), TaskState::Succeeded);
    assert_eq!(t.status(ghost).result, Some(TaskResult::Released));
    assert_eq!(t.slot(n2, "bundle"), Some(("0".into(), "4".into())));
    assert_eq!(t.slot(n2, "cpu"), Some(("8".into(), "0".into())));
    let last = members[4];
    assert!(
        t.reason(last).starts_with("infeasible"),
        "{}",
        t.reason(last)
    );
    for (i, m) in members[..4].iter().enumerate() {
        t.exit(*m, 0);
        let left = if i < 3 {
            Some(("0".into(), (3 - i).to_string()))
        } else {
            None
        };
        assert_eq!(t.slot(n2, "bundle"), left);
    }
    assert_eq!(t.task_state(last), TaskState::Pending);
}

#[test]
fn nothing_is_admitted_to_a_ghosts_bundle_once_the_ghost_ended() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=5");
    let (ghost, fx) = t.submit(task("cpu=4").ghost("bundle=4"));
    assert_eq!(fx, ["assign 1->1 #1"]);
    // Waits for cpu, not for the bundle.
    let (late, fx) = t.submit(task("bundle=1,cpu=2"));
    assert!(fx.is_empty());
    // The ghost's end releases cpu and removes the bundle in one step: the waiting task must
    // not be admitted to a bundle that no longer exists.
    assert_eq!(
        t.finish_current(ghost, Ok(TaskResult::Released)),
        ["terminal 1"]
    );
    assert_eq!(t.task_state(late), TaskState::Pending);
    assert!(
        t.reason(late).starts_with("infeasible"),
        "{}",
        t.reason(late)
    );
    assert_eq!(t.slot(n, "bundle"), None);
}

#[test]
fn a_lost_or_failed_ghost_takes_its_bundle_with_it_and_unbounded_ghosts_work() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (ghost, fx) = t.submit(task("cpu=1").ghost_unbounded("near-data"));
    assert_eq!(fx, ["assign 1->1 #1"]);
    assert_eq!(
        t.slot(n1, "near-data"),
        Some(("unbounded".into(), "0".into()))
    );
    let (user, fx) = t.submit(task("near-data=3"));
    assert_eq!(fx, ["assign 2->1 #1"]);
    // The ghost fails: its resource is deleted, the user keeps its share.
    assert_eq!(
        t.finish_current(ghost, Err("worker said no".into())),
        ["terminal 1"]
    );
    assert_eq!(t.task_state(ghost), TaskState::Failed);
    assert_eq!(t.slot(n1, "near-data"), Some(("0".into(), "3".into())));
    t.exit(user, 0);
    assert_eq!(t.slot(n1, "near-data"), None);

    // A ghost retried after its node was lost recreates its bundle on the new node.
    let (ghost, fx) = t.submit(task("cpu=1").ghost("bundle=2").retries(1));
    assert_eq!(fx, ["assign 3->1 #1"]);
    let n2 = t.node("w2", "cpu=1");
    assert_eq!(t.remove_node(n1), ["assign 3->2 #2"]);
    assert_eq!(t.slot(n2, "bundle"), Some(("2".into(), "0".into())));
    assert_eq!(
        t.finish_current(ghost, Ok(TaskResult::Released)),
        ["terminal 3"]
    );
    assert_eq!(t.slot(n2, "bundle"), None);
}

// ---- 8. hooks ----------------------------------------------------------------------------

#[test]
fn on_success_hooks_signal_waiting_tasks() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    t.submit(task("cpu=1")); // node 1
    let (a, fx) = t.submit(task("cpu=1").on_success(set("done-a", "1", NodeSpec::Local)));
    assert_eq!(fx, ["assign 2->2 #1"]);
    let (b, fx) = t.submit(task("done-a=1"));
    assert!(fx.is_empty());
    assert_eq!(t.task_state(b), TaskState::Pending);
    // It waits for what task a's hook creates, and says so (not "infeasible").
    assert_eq!(
        t.reason(b),
        format!("waiting for resource done-a, which no live node has yet: task {a} creates it")
    );
    let info = t.state.task_info(b).unwrap();
    assert!(info.pending_reason.is_none(), "{info:?}");

    assert_eq!(t.exit(a, 0), ["terminal 2", "assign 3->2 #1"]);
    assert_eq!(t.status(b).node, Some(n2));
    assert_eq!(t.status(b).reason, None);
    assert_eq!(t.slot(n2, "done-a"), Some(("1".into(), "1".into())));
}

#[test]
fn a_task_waiting_for_a_hook_whose_task_failed_is_infeasible_again() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let hook = || set("done-a", "1", NodeSpec::Local);
    let (a, _) = t.submit(task("cpu=1").on_success(hook()));
    let (c, _) = t.submit(task("cpu=1").on_success(hook()));
    let (b, _) = t.submit(task("done-a=1"));
    let reason = t.reason(b);
    assert!(
        reason.contains(&format!("task {a} (and 1 other task) creates it")),
        "{reason}"
    );
    // The first creator fails: the second is the one to wait for.
    t.exit(a, 1);
    assert_eq!(t.task_state(c), TaskState::Running);
    let reason = t.reason(b);
    assert!(
        reason.ends_with(&format!("task {c} creates it")),
        "{reason}"
    );
    check_invariants(&t.state);
    // No creator is left: nothing will make it feasible, and it says so.
    t.exit(c, 1);
    assert!(
        t.reason(b).starts_with("infeasible: resource done-a"),
        "{}",
        t.reason(b)
    );
    check_invariants(&t.state);
}

#[test]
fn on_start_hooks_apply_at_dispatch() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (waiter, fx) = t.submit(task("started-c=1"));
    assert!(fx.is_empty());
    let (c, fx) = t.submit(task("cpu=1").on_start(adjust("started-c", "+1", NodeSpec::Local)));
    assert_eq!(fx, ["assign 2->1 #1", "assign 1->1 #1"]);
    assert_eq!(t.task_state(c), TaskState::Running);
    assert_eq!(t.task_state(waiter), TaskState::Running);
    assert_eq!(t.slot(n1, "started-c"), Some(("1".into(), "1".into())));
    assert!(t.status(c).hook_errors.is_empty());
    // A hook that cannot apply is skipped; the task still runs, and its status says why.
    t.exit(c, 0);
    let spec = task("").on_start(adjust("never", "-1", NodeSpec::Local));
    let (d, fx) = t.submit(spec);
    assert_eq!(fx, ["assign 3->1 #1"]);
    assert_eq!(t.task_state(d), TaskState::Running);
    assert_eq!(t.slot(n1, "never"), None);
    let errors = t.status(d).hook_errors;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("attempt 1: ") && errors[0].contains("never"),
        "{errors:?}"
    );
}

#[test]
fn a_failed_or_cancelled_task_does_not_run_its_on_success_hooks() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    let (e, _) = t.submit(task("cpu=1").on_success(set("done-e", "1", NodeSpec::Local)));
    let (f, _) = t.submit(task("cpu=1").on_success(set("done-f", "1", NodeSpec::Local)));
    assert_eq!(t.exit(e, 1), ["terminal 1"]);
    assert_eq!(t.task_state(e), TaskState::Failed);
    t.cancel(&[f]).unwrap();
    assert_eq!(t.exit(f, 0), ["terminal 2"]);
    assert_eq!(t.task_state(f), TaskState::Cancelled);
    assert_eq!(t.slot(n1, "done-e"), None);
    assert_eq!(t.slot(n1, "done-f"), None);
}

// ---- 9. cancel ---------------------------------------------------------------------------

#[test]
fn cancel_ends_pending_tasks_at_once_and_running_ones_when_the_worker_confirms() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=1");
    let (running, _) = t.submit(task("cpu=1"));
    let (pending, _) = t.submit(task("cpu=1"));
    let (other, _) = t.submit(task("cpu=1"));

    let out = t.cancel(&[pending]).unwrap();
    assert_eq!(out.fx(), ["terminal 2"]);
    let Reply::Cancelled(statuses) = out.reply else {
        panic!("{:?}", out.reply)
    };
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].state, TaskState::Cancelled);
    assert_eq!(
        statuses[0].reason.as_deref(),
        Some("cancelled by request while pending")
    );
    assert_eq!(t.state.task_info(pending).unwrap().finished_at_ms, Some(T0));

    let out = t.cancel(&[running]).unwrap();
    assert_eq!(
        out.effects,
        [Effect::Cancel {
            node: n,
            task: running,
            attempt: 1,
            reason: "cancelled by request".to_string(),
            force: false,
        }]
    );
    assert_eq!(t.task_state(running), TaskState::Running);
    // Asking again sends it again (the first may have been lost with a broken stream), and
    // changes nothing else.
    assert_eq!(t.cancel(&[running]).unwrap().effects, out.effects);

    assert_eq!(t.exit(running, 143), ["terminal 1", "assign 3->1 #1"]);
    let status = t.status(running);
    assert_eq!(status.state, TaskState::Cancelled);
    assert_eq!(status.reason.as_deref(), Some("cancelled by request"));
    assert_eq!(status.result, Some(TaskResult::Exited { code: 143 }));

    // Unknown or duplicate ids refuse the whole call.
    let err = t.cancel(&[other, TaskId(99)]).unwrap_err();
    assert_eq!(err, ApplyError::UnknownTask(TaskId(99)));
    assert!(err.is_not_found());
    let err = t.cancel(&[other, other]).unwrap_err();
    assert_eq!(err, ApplyError::DuplicateTask(other));
    assert_eq!(t.task_state(other), TaskState::Running);

    // Cancelling a finished task changes nothing and reports its status.
    let out = t.cancel(&[pending, running]).unwrap();
    assert!(out.effects.is_empty());
    let Reply::Cancelled(statuses) = out.reply else {
        panic!()
    };
    assert_eq!(
        statuses.iter().map(|s| s.id).collect::<Vec<_>>(),
        [pending, running]
    );
}

#[test]
fn a_cancelled_task_is_not_retried_when_its_attempt_fails_or_its_node_is_lost() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    t.node("w2", "cpu=2");
    let (a, _) = t.submit(task("cpu=2").retries(3));
    let (b, _) = t.submit(task("cpu=2").retries(3));
    assert_eq!(t.status(a).node, Some(n1));
    t.cancel(&[a, b]).unwrap();
    assert_eq!(t.remove_node(n1), ["terminal 1"]);
    assert_eq!(t.task_state(a), TaskState::Cancelled);
    assert!(t.reason(a).contains("node 1 lost"), "{}", t.reason(a));
    assert_eq!(t.exit(b, 1), ["terminal 2"]);
    assert_eq!(t.task_state(b), TaskState::Cancelled);
}

// ---- 10. result size ---------------------------------------------------------------------

#[test]
fn a_result_over_the_limit_fails_the_task_without_retry() {
    let mut t = TestState::with_config(StateConfig {
        max_result_bytes: 8,
        ..StateConfig::default()
    });
    t.node("w1", "cpu=1");
    let (big, _) = t.submit(task("cpu=1").function("f").retries(3));
    let fx = t.finish_current(big, Ok(TaskResult::Returned(vec![0; 9].into())));
    assert_eq!(fx, ["terminal 1"]);
    let status = t.status(big);
    assert_eq!(status.state, TaskState::Failed);
    assert_eq!(status.attempt, 1);
    assert_eq!(status.result, None);
    let reason = status.reason.unwrap();
    assert!(
        reason.contains("9 bytes") && reason.contains("limit of 8 bytes"),
        "{reason}"
    );

    let (fits, _) = t.submit(task("cpu=1").function("f"));
    assert_eq!(
        t.finish_current(fits, Ok(TaskResult::Returned(vec![7; 8].into()))),
        ["terminal 2"]
    );
    assert_eq!(t.status(fits).state, TaskState::Succeeded);
    assert_eq!(
        t.status(fits).result,
        Some(TaskResult::Returned(vec![7; 8].into()))
    );
}

#[test]
fn a_cancelled_tasks_result_is_kept_only_within_the_limit() {
    let mut t = TestState::with_config(StateConfig {
        max_result_bytes: 8,
        ..StateConfig::default()
    });
    t.node("w1", "cpu=2");
    let (big, _) = t.submit(task("cpu=1").function("f"));
    let (small, _) = t.submit(task("cpu=1").function("f"));
    t.cancel(&[big, small]).unwrap();
    let fx = t.finish_current(big, Ok(TaskResult::Returned(vec![0; 9].into())));
    assert_eq!(fx, ["terminal 1"]);
    assert_eq!(t.task_state(big), TaskState::Cancelled);
    assert_eq!(
        t.status(big).result,
        None,
        "the limit holds for cancelled tasks too"
    );
    t.finish_current(small, Ok(TaskResult::Returned(vec![1; 8].into())));
    assert_eq!(
        t.status(small).result,
        Some(TaskResult::Returned(vec![1; 8].into()))
    );
}

// ---- 11. pending deadlines ---------------------------------------------------------------

#[test]
fn a_task_pending_past_its_deadline_is_cancelled() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let (a, fx) = t.submit(task("cpu=2").pending_deadline(Duration::from_secs(1)));
    assert!(fx.is_empty());
    assert_eq!(t.state.core().next_deadline(), Some(T0 + 1000));
    assert!(t.tick_at(T0 + 999).is_empty());
    assert_eq!(t.task_state(a), TaskState::Pending);
    assert_eq!(t.tick_at(T0 + 1000), ["terminal 1"]);
    let status = t.status(a);
    assert_eq!(status.state, TaskState::Cancelled);
    assert!(
        status.reason.as_deref().unwrap().contains("deadline"),
        "{status:?}"
    );
    assert_eq!(
        t.state.task_info(a).unwrap().finished_at_ms,
        Some(T0 + 1000)
    );
    assert_eq!(t.state.core().next_deadline(), None);
    assert!(t.tick_at(T0 + 5000).is_empty());

    // A task that gets a node in time is not affected.
    let (b, fx) = t.submit(task("cpu=1").pending_deadline(Duration::from_millis(10)));
    assert_eq!(fx, ["assign 2->1 #1"]);
    assert!(t.tick_at(T0 + 6000).is_empty());
    assert_eq!(t.task_state(b), TaskState::Running);
}

// ---- 12. determinism and serializability ------------------------------------------------

/// A seeded generator, so the list of entries is fixed: `next(n)` is in `0..n`.
struct Seeded(fastrand::Rng);

impl Seeded {
    fn next(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }
}

/// ~50 entries touching every command, some of them refused or stale.
fn fixed_entries() -> Vec<Entry> {
    let mut rng = Seeded(fastrand::Rng::with_seed(7));
    let mut now = T0;
    let mut entries = Vec::new();
    let mut push = |command: Command, now: u64| entries.push(Entry::new(now, command));
    push(
        Command::Init {
            cluster_id: CLUSTER.into(),
            task_key: "key".into(),
        },
        now,
    );
    for i in 0..3 {
        let mut worker = joining(&format!("w{i}"), &format!("cpu={},memory=1024", i + 1), 1);
        worker.labels = format!("rack=r{i}").parse().unwrap();
        let command = Command::RegisterNode {
            worker,
            secret: secret(&format!("w{i}")),
        };
        push(command, now);
    }
    for _ in 0..47 {
        now += rng.next(400);
        let task_id = TaskId(1 + rng.next(12));
        let node = NodeId(1 + rng.next(4));
        let command = match rng.next(10) {
            0..=2 => {
                let spec = match rng.next(4) {
                    0 => task("cpu=1").retries(1),
                    1 => task("cpu=1,q=1").pending_deadline(Duration::from_millis(500)),
                    2 => task("cpu=2").ghost("bundle=2"),
                    _ => task("bundle=1").on_success(adjust("done", "+1", NodeSpec::Local)),
                };
                let namespace = (rng.next(3) == 0).then(|| "app".parse().unwrap());
                Command::Submit {
                    tasks: vec![spec.build()],
                    namespace,
                }
            }
            3 | 4 => {
                let outcome = match rng.next(4) {
                    0 => ok(0),
                    1 => ok(1),
                    2 => Ok(TaskResult::Released),
                    _ => Err("boom".to_string()),
                };
                let attempt = 1 + rng.next(2) as u32;
                Command::TaskFinished(TaskFinished {
                    task_id,
                    attempt,
                    outcome,
                    timed_out: rng.next(5) == 0,
                    output: None,
                })
            }
            5 => Command::TaskStarted {
                task: task_id,
                attempt: 1,
            },
            6 => {
                let update = match rng.next(3) {
                    0 => set("q", "1", on(node)),
                    1 => adjust("q", "-1", on(node)),
                    _ => set("lane", "2", matching("cpu=1", Some(2))),
                };
                Command::SetResources {
                    updates: vec![update],
                    namespace: None,
                    caller_task: None,
                }
            }
            7 => Command::Cancel {
                tasks: vec![task_id],
            },
            8 => match rng.next(3) {
                0 => Command::RemoveNode {
                    node,
                    reason: "heartbeat timeout".into(),
                },
                _ => Command::RejoinNode {
                    worker: joining("late", "cpu=2", 1 + rng.next(2)),
                    back: Returning {
                        cluster: CLUSTER.into(),
                        node,
                        // Right for node 1 only: the others are refused.
                        secret: secret("w0"),
                        running: Vec::new(),
                        finished: Vec::new(),
                    },
                },
            },
            _ => Command::Tick,
        };
        push(command, now);
    }
    entries
}

type Step = (Result<Reply, ApplyError>, Vec<Effect>);

fn run(entries: &[Entry]) -> (Vec<Step>, ClusterState) {
    let mut state = ClusterState::new(StateConfig::default());
    let steps = entries
        .iter()
        .map(|e| {
            let reply = state.apply(e.clone());
            check_invariants(&state);
            (reply, state.take_effects())
        })
        .collect();
    (steps, state)
}

#[test]
fn the_same_entries_give_the_same_replies_effects_and_state() {
    let entries = fixed_entries();
    assert_eq!(entries.len(), 51);
    let (a, state_a) = run(&entries);
    let (b, state_b) = run(&entries);
    assert_eq!(a, b);
    assert_eq!(state_a.cluster_status(), state_b.cluster_status());
    assert_eq!(
        state_a.list_tasks(&ListTasksRequest::default(), 1000, |_| true),
        state_b.list_tasks(&ListTasksRequest::default(), 1000, |_| true)
    );
    // The sequence is not trivial: it dispatched, finished and refused things.
    let effects: Vec<String> = a.iter().flat_map(|(_, fx)| render(fx)).collect();
    assert!(
        effects.iter().any(|e| e.starts_with("assign")),
        "{effects:?}"
    );
    assert!(
        effects.iter().any(|e| e.starts_with("terminal")),
        "{effects:?}"
    );
    assert!(a.iter().any(|(r, _)| r.is_err()));
    assert!(
        state_a
            .list_tasks(&ListTasksRequest::default(), 1000, |_| true)
            .len()
            >= 5
    );

    // A replica that receives every entry through the wire format ends up the same.
    let config = bincode::config::standard();
    let decoded: Vec<Entry> = entries
        .iter()
        .map(|e| {
            let bytes = bincode::serde::encode_to_vec(e, config).unwrap();
            let (back, read): (Entry, usize) =
                bincode::serde::decode_from_slice(&bytes, config).unwrap();
            assert_eq!(read, bytes.len());
            assert_eq!(&back, e, "entry changed in a bincode round trip");
            back
        })
        .collect();
    let (c, state_c) = run(&decoded);
    assert_eq!(a, c);
    assert_eq!(format!("{state_a:?}"), format!("{state_c:?}"));
}

#[test]
fn every_kind_of_entry_survives_bincode() {
    let spec = task("cpu=0.5,app/x=1")
        .retries(2)
        .timeout(Duration::from_millis(1500))
        .pending_deadline(Duration::from_secs(3))
        .on_start(set("s", "unbounded", NodeSpec::Local))
        .on_success(adjust("done", "-0.25", matching("gpu=1", Some(3))))
        .build();
    let mut ghost = task("").ghost("bundle=4").build();
    if let escher_proto::types::TaskKind::Ghost { ttl, creates } = &mut ghost.kind {
        *ttl = Some(Duration::from_secs(60));
        creates.push((name("inf"), Capacity::Unbounded));
    }
    let commands = vec![
        Command::Init {
            cluster_id: "c".into(),
            task_key: "key".into(),
        },
        Command::RegisterNode {
            worker: joining("w", "cpu=16,mig.1g.10gb=2", u64::MAX),
            secret: secret("w"),
        },
        Command::RejoinNode {
            worker: joining("w", "cpu=1", 3),
            back: Returning {
                cluster: "c".into(),
                node: NodeId(u64::MAX),
                secret: secret("w"),
                running: vec![RunningTask {
                    task_id: TaskId(4),
                    attempt: 2,
                }],
                finished: vec![report(TaskId(5), 1, Err("e".into()))],
            },
        },
        Command::RemoveNode {
            node: NodeId(3),
            reason: "gone".into(),
        },
        Command::Submit {
            tasks: vec![spec, ghost, task("").function("f").build()],
            namespace: Some("app".parse().unwrap()),
        },
        Command::SetResources {
            updates: vec![
                ResourceUpdate {
                    name: name("x"),
                    op: CapacityOp::Delete,
                    target: on(NodeId(1)),
                },
                ResourceUpdate {
                    name: name("y"),
                    op: CapacityOp::Adjust(Delta::decrease(Amount::MAX)),
                    target: NodeSpec::Local,
                },
            ],
            namespace: None,
            caller_task: Some((TaskId(5), 1)),
        },
        Command::TaskStarted {
            task: TaskId(1),
            attempt: 2,
        },
        Command::TaskFinished(TaskFinished {
            task_id: TaskId(1),
            attempt: 1,
            outcome: Ok(TaskResult::Returned(vec![0, 255, 7].into())),
            timed_out: false,
            output: None,
        }),
        Command::TaskFinished(TaskFinished {
            timed_out: true,
            output: None,
            ..report(TaskId(2), 3, Err("e".into()))
        }),
        Command::Cancel {
            tasks: vec![TaskId(1), TaskId(2)],
        },
        Command::Tick,
    ];
    let config = bincode::config::standard();
    for (i, command) in commands.into_iter().enumerate() {
        let key = (i % 2 == 0).then_some(RequestKey {
            client: 7,
            seq: i as u64 + 1,
            first_incomplete: 1,
        });
        let entry = Entry {
            now: T0 + i as u64,
            command,
            key,
        };
        let bytes = bincode::serde::encode_to_vec(&entry, config).unwrap();
        let (back, _): (Entry, usize) = bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(back, entry);
    }
}

// ---- 13. reconnects ----------------------------------------------------------------------

#[test]
fn the_same_worker_process_coming_back_keeps_its_node_and_its_tasks() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    let (a, _) = t.submit(task("cpu=1"));
    let (id, fx) = t.rejoin(n1, "w1", 1, &[(a, 1)], Vec::new()).unwrap();
    assert_eq!(id, n1);
    assert_eq!(fx, ["rejoined 1"], "nothing to send again");
    assert_eq!(t.task_state(a), TaskState::Running);
    assert_eq!(t.state.running_on(n1), [(a, 1)]);
    assert_eq!(t.cluster().nodes.len(), 1);
    assert_eq!(t.slot(n1, "cpu"), Some(("2".into(), "1".into())));
}

#[test]
fn an_assignment_the_worker_never_got_is_sent_again_with_the_same_attempt() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    let (a, _) = t.submit(task("cpu=1"));
    let (b, _) = t.submit(task("cpu=1"));
    // The worker runs `a`, finished `b` (unacknowledged), and never heard of a third task.
    let (c, _) = {
        t.apply(Command::TaskFinished(report(b, 1, ok(0))));
        t.submit(task("cpu=1"))
    };
    let b2 = t.submit(task("cpu=1")).0;
    let _ = b2;
    let (_, fx) = t
        .rejoin(n1, "w1", 1, &[(a, 1)], vec![report(c, 1, ok(0))])
        .unwrap();
    // `c` ended by the report it carried, which freed room for the fourth task.
    assert_eq!(t.task_state(c), TaskState::Succeeded);
    assert_eq!(fx, ["rejoined 1", "terminal 3", "assign 4->1 #1"]);
    // A worker that never got the fourth task's assignment: it is sent again, same attempt.
    let (_, fx) = t.rejoin(n1, "w1", 1, &[(a, 1)], Vec::new()).unwrap();
    assert_eq!(fx, ["rejoined 1", "assign 4->1 #1"]);
    // The same report again (an acknowledgement lost) changes nothing.
    let (_, fx) = t
        .rejoin(
            n1,
            "w1",
            1,
            &[(a, 1), (TaskId(4), 1)],
            vec![report(c, 1, ok(0))],
        )
        .unwrap();
    assert_eq!(fx, ["rejoined 1"]);
}

#[test]
fn a_restarted_worker_keeps_its_node_id_and_its_tasks_are_retried() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(1));
    let (b, _) = t.submit(task("cpu=1"));
    assert_eq!(t.task_state(b), TaskState::Pending);
    let (id, fx) = t.rejoin(n1, "w1", 2, &[], Vec::new()).unwrap();
    assert_eq!(id, n1);
    // `a` lost its first attempt; the node comes back (with 2 CPUs now): `b`, which waited,
    // and `a`, submitted again, run.
    assert_eq!(fx, ["rejoined 1", "assign 2->1 #1", "assign 1->1 #2"]);
    let status = t.status(a);
    assert_eq!(status.attempt, 2);
    let reason = t.state.task(a).unwrap().reason.clone().unwrap_or_default();
    assert!(reason.contains("restarted"), "{reason}");
    assert!(t.cluster().node(n1).unwrap().alive);
}

#[test]
fn a_node_declared_lost_comes_back_under_its_id_and_its_old_attempts_are_cancelled() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    let (a, _) = t.submit(task("cpu=1"));
    assert_eq!(t.remove_node(n1), ["terminal 1"]);
    let (id, fx) = t.rejoin(n1, "w1", 1, &[(a, 1)], Vec::new()).unwrap();
    assert_eq!(id, n1);
    assert_eq!(fx, ["rejoined 1", "cancel 1@1 #1"]);
    let cluster = t.cluster();
    assert!(cluster.node(n1).unwrap().alive);
    assert_eq!(cluster.nodes.len(), 1, "no second node");
}

#[test]
fn a_wrong_secret_an_unknown_node_or_another_cluster_is_refused() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=2");
    let err = t.rejoin(n1, "w2", 1, &[], Vec::new()).unwrap_err();
    assert_eq!(err, ApplyError::WrongSecret(n1));
    let text = err.to_string();
    assert!(
        text.contains("node 1") && text.contains("state directory"),
        "{text}"
    );
    let err = t.rejoin(NodeId(9), "w1", 1, &[], Vec::new()).unwrap_err();
    assert_eq!(err, ApplyError::UnknownNode(NodeId(9)));
    let other = Command::RejoinNode {
        worker: joining("w1", "cpu=2", 1),
        back: Returning {
            cluster: "another".into(),
            node: n1,
            secret: secret("w1"),
            running: Vec::new(),
            finished: Vec::new(),
        },
    };
    let err = t.try_apply(other).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    // New registrations never reuse an id.
    assert_eq!(t.register("w2", "cpu=1").0, NodeId(2));
}

#[test]
fn a_keyed_write_is_applied_once_and_its_retry_gets_the_same_reply() {
    let mut t = TestState::new();
    t.node("w1", "cpu=2");
    let key = RequestKey {
        client: 42,
        seq: 1,
        first_incomplete: 1,
    };
    let submit = Command::Submit {
        tasks: vec![task("cpu=1").build()],
        namespace: None,
    };
    let first = t
        .state
        .apply(Entry {
            now: t.now,
            command: submit.clone(),
            key: Some(key),
        })
        .unwrap();
    assert_eq!(first, Reply::Submitted(vec![TaskId(1)]));
    t.state.take_effects();
    let again = t
        .state
        .apply(Entry {
            now: t.now + 5,
            command: submit.clone(),
            key: Some(key),
        })
        .unwrap();
    assert_eq!(again, first);
    assert!(t.state.take_effects().is_empty(), "a replay does nothing");
    assert_eq!(
        t.state
            .list_tasks(&ListTasksRequest::default(), 10, |_| true)
            .len(),
        1
    );
    // Without a key the same command is another write.
    t.apply(submit);
    assert_eq!(
        t.state
            .list_tasks(&ListTasksRequest::default(), 10, |_| true)
            .len(),
        2
    );
    check_invariants(&t.state);
}

// ---- property test -----------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_command_sequences_keep_state_and_core_consistent(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        // A small retention, so that evictions and node reclamation happen along the way.
        let mut t = TestState::with_config(StateConfig {
            max_result_bytes: 32,
            retention: RetentionPolicy {
                finished: 4,
                finished_for: Duration::from_millis(300),
                tombstones: 3,
                dead_nodes_for: Duration::from_millis(200),
                node_tombstones: 2,
            },
            // And a small quota, so that namespaced batches are refused along the way too.
            namespace_unfinished: 4,
            namespace_result_bytes: 48,
            namespace_resources: 6,
            max_task_bytes: 4096,
            namespace_spec_bytes: 2048,
            namespace_object_bytes: 4096,
            min_time_left: Duration::ZERO,
        });
        let mut known = 0u64;
        for op in &ops {
            if let Op::Tick { advance } = op {
                t.advance(u64::from(*advance));
            } else {
                t.advance(1);
            }
            let Some(command) = command_for(&t, op, known) else { continue };
            // `try_apply` checks the invariants and that a refusal changed nothing.
            let before: Vec<_> = (1..=known).map(|i| t.state.status(TaskId(i))).collect();
            let requeued = match &command {
                Command::Requeue { task, .. } => Some(*task),
                _ => None,
            };
            let Ok(out) = t.try_apply(command) else { continue };
            if let Reply::Submitted(ids) = &out.reply {
                known += ids.len() as u64;
            }
            for effect in &out.effects {
                match effect {
                    Effect::Assign { node, assignment } => {
                        let rec = t.state.task(assignment.task_id).unwrap();
                        prop_assert!(t.state.node_alive(*node));
                        prop_assert_eq!(assignment.allocation.clone(), rec.spec.resources.clone());
                        prop_assert!(assignment.attempt <= rec.attempt);
                    }
                    Effect::Cancel { task, .. } => {
                        prop_assert_eq!(t.task_state(*task), TaskState::Running);
                    }
                    Effect::Terminal { task } => {
                        prop_assert!(t.task_state(*task).is_terminal());
                    }
                    Effect::ReconfigureMig { node, .. } | Effect::Rejoined { node } => {
                        prop_assert!(t.state.node_alive(*node));
                    }
                    // (These ops put no objects; a release of copies on a node that went is
                    // still sent, and dropped by the runtime.)
                    Effect::DeleteObjects { .. } => {}
                }
            }
            // Terminal states are final, but for a failed task that a requeue reopened;
            // retention may only shrink them to a tombstone and then forget that, never forget
            // a task that is still going.
            for (i, old) in before.iter().enumerate() {
                let id = TaskId(i as u64 + 1);
                let now = t.state.status(id);
                match (old, &now) {
                    (Some(old), Some(now)) if requeued == Some(id) && old.state == TaskState::Failed => {
                        prop_assert!(!now.state.is_terminal());
                        prop_assert_eq!(now.result.clone(), None);
                    }
                    (Some(old), Some(now)) if old.state.is_terminal() => {
                        prop_assert_eq!(old.state, now.state);
                        prop_assert!(now.evicted || old == now);
                    }
                    (Some(old), None) => {
                        prop_assert!(old.state.is_terminal());
                        prop_assert!(t.state.evicted(id).is_some());
                    }
                    _ => {}
                }
            }
        }
    }
}

/// `SkipIds`: after a log lost a write that may have been acknowledged, the ids it may have
/// given out are never given again, for tasks and for nodes.
#[test]
fn skipped_ids_are_never_given_out() {
    let mut t = TestState::new();
    assert_eq!(t.node("w1", "cpu=4,memory=1024"), NodeId(1));
    let (first, _) = t.submit(task("cpu=1"));
    assert_eq!(first, TaskId(1));
    let out = t.apply(Command::SkipIds {
        count: 500,
        why: "a test".into(),
    });
    assert_eq!(out.reply, Reply::Done);
    let (next, _) = t.submit(task("cpu=1"));
    assert_eq!(next, TaskId(502));
    assert_eq!(t.node("w2", "cpu=4,memory=1024"), NodeId(502));
}
