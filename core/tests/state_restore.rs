//! A state restored from a backup begins a new incarnation (`core/src/state/incarnation.rs`):
//! no id given out before the restore is given out again, those the cluster gave out after the
//! backup included, and a worker that returns still running what it ran is reconciled with what
//! the backup believed it ran.

mod state_support;

use escher_core::state::{ClusterState, StateConfig, TASK_IDS_PER_SECOND, ids_to_skip};
use escher_proto::types::{TaskId, TaskResult, TaskState};
use state_support::{TestState, report, task};

/// A backup of `t`'s state as `escher admin snapshot save` takes it, restored as
/// `escher-head --restore` reads it, `later_ms` after it was taken.
fn restore(t: &TestState, later_ms: u64) -> TestState {
    let bytes = bincode::serde::encode_to_vec(&t.state, bincode::config::standard()).unwrap();
    let (state, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    TestState {
        state: state
            .restore(StateConfig::default())
            .restored_from_backup(t.now),
        now: t.now + later_ms,
    }
}

#[test]
fn a_restored_state_skips_every_id_given_out_after_its_backup_and_reconciles_its_worker() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=4");
    let running: Vec<TaskId> = (0..4)
        .map(|_| t.submit(task("cpu=1").retries(2)).0)
        .collect();
    let (waiting, _) = t.submit(task("cpu=1").retries(2));
    assert_eq!(t.task_state(waiting), TaskState::Pending);
    let mut r = restore(&t, 0);

    // The cluster goes on after the backup: three of the four end, the waiting task runs
    // (attempt 1, still running), five more tasks run and end.
    for &id in &running[..3] {
        t.finish(report(id, 1, Ok(TaskResult::Exited { code: 0 })));
    }
    assert_eq!(t.task_state(waiting), TaskState::Running);
    let mut after: Vec<TaskId> = Vec::new();
    for _ in 0..5 {
        after.push(t.submit(task("cpu=1")).0);
    }
    let newest = *after.iter().max().unwrap();

    // Restored a minute later; the worker comes back by itself, the same process, running
    // the fourth task and the waiting task's attempt 1, having reported everything else.
    r.now = t.now + 60_000;
    let still = running[3];
    let (_, fx) = r
        .rejoin(n1, "w1", 1, &[(still, 1), (waiting, 1)], Vec::new())
        .unwrap();

    // What ended after the backup is a failed attempt, with the reason, and runs again as a
    // later attempt (never attempt 1 again: the worker ran it); what runs on both sides goes
    // on; what the backup did not run there is stopped, and that task's next attempt goes past
    // the one the worker ran.
    assert!(
        !fx.iter()
            .any(|f| f.starts_with("assign ") && f.ends_with(" #1")),
        "{fx:?}"
    );
    for &id in &running[..3] {
        let info = r.state.task(id).unwrap();
        let ended = info.attempts[0].ended.as_deref().unwrap_or_default();
        assert!(ended.contains("restored from a backup"), "{ended}");
        assert!(
            fx.contains(&format!("assign {id}->{n1} #2")) || r.task_state(id) == TaskState::Pending,
            "{fx:?}"
        );
    }
    assert_eq!(r.status(still).attempt, 1);
    assert_eq!(r.task_state(still), TaskState::Running);
    assert!(fx.contains(&format!("cancel {waiting}@{n1} #1")), "{fx:?}");
    assert!(fx.contains(&format!("assign {waiting}->{n1} #2")), "{fx:?}");

    // Everything ends, each task run to its end once more at most, and the node is free.
    for _ in 0..10 {
        let runs: Vec<TaskId> = running
            .iter()
            .chain([&waiting])
            .copied()
            .filter(|id| r.task_state(*id) == TaskState::Running)
            .collect();
        for id in runs {
            r.exit(id, 0);
        }
    }
    for &id in running.iter().chain([&waiting]) {
        let status = r.status(id);
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        let again = if id == still { 1 } else { 2 };
        assert_eq!(status.attempt, again, "{status:?}");
    }
    assert_eq!(r.slot(n1, "cpu"), Some(("4".into(), "0".into())));

    // New tasks get ids past every id the cluster gave out after the backup, as far as a
    // cluster could have given out in that minute.
    let (next, _) = r.submit(task("cpu=1"));
    assert!(next.0 > newest.0, "{next} after {newest}");
    let (skipped, _) = ids_to_skip(t.now, t.now + 60_000);
    assert!(skipped >= 60 * TASK_IDS_PER_SECOND, "{skipped}");
    assert!(next.0 > skipped, "{next}");
    // An id given out after the backup is unknown to the restored state (not "evicted").
    for &lost in &after {
        assert!(r.state.task(lost).is_none());
        let err = r.state.missing_task(lost).to_string();
        assert_eq!(err, format!("unknown task {lost}"));
    }
    let incarnation = r.state.incarnation();
    assert_eq!(incarnation.number, 1);
    assert_eq!(incarnation.id(), next.0);
    assert!(incarnation.unreconciled.is_empty());
}

#[test]
fn two_restores_of_one_backup_give_out_ids_apart() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    t.submit(task("cpu=1"));
    let mut first = restore(&t, 10_000);
    let mut second = restore(&t, 20_000);
    let (a, _) = first.submit(task("cpu=1"));
    let (b, _) = second.submit(task("cpu=1"));
    // Ten seconds apart: the second starts past all the first could give out in them.
    assert!(b.0 >= a.0 + 10 * TASK_IDS_PER_SECOND, "{a} then {b}");
}

#[test]
fn a_node_that_does_not_return_is_lost_as_before_and_a_later_restart_is_not_strict() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (id, _) = t.submit(task("cpu=1").retries(1));
    let mut r = restore(&t, 1_000);
    // Lost before it returns: its attempt failed with the node, as for any lost node.
    r.remove_node(n1);
    assert!(r.state.incarnation().unreconciled.is_empty());
    assert_eq!(r.task_state(id), TaskState::Pending);
}
