//! Requeue in the head's state machine: a pending task takes its new resources at once; a
//! running one is stopped, and runs again under its id as its next attempt with the new
//! resources once its worker confirms; a report of the stopped attempt that comes first is
//! its end all the same; a lost node ends the stopped attempt; a failed task is reopened;
//! succeeded and unknown tasks are refused with nothing changed; an out-of-memory report is a
//! typed failure.

mod state_support;

use escher_core::state::{ApplyError, Command, Reply};
use escher_proto::types::{ResourceSet, TaskId, TaskResult, TaskState};
use state_support::{Outcome, TestState, check_invariants, report, res, task};

fn requeue(t: &mut TestState, task: TaskId, resources: &str) -> Result<Outcome, ApplyError> {
    t.try_apply(Command::Requeue {
        task,
        resources: res(resources),
    })
}

fn resources(t: &TestState, task: TaskId) -> ResourceSet {
    t.state.task(task).unwrap().spec.resources.clone()
}

#[test]
fn a_pending_task_takes_its_new_resources_at_once() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=2,big=1");
    let (id, fx) = t.submit(task("huge=1"));
    assert!(fx.is_empty(), "{fx:?}");
    let out = requeue(&mut t, id, "big=1").unwrap();
    // Placed by the same command, as its first attempt: nothing ran before.
    assert_eq!(out.fx(), [format!("assign {id}->{n} #1")]);
    let Reply::Requeued(status) = out.reply else {
        panic!("{:?}", out.reply)
    };
    assert_eq!(status.id, id);
    let status = t.status(id);
    assert_eq!((status.state, status.attempt), (TaskState::Running, 1));
    assert_eq!(resources(&t, id), res("big=1"));
    check_invariants(&t.state);
}

#[test]
fn a_running_task_is_stopped_then_runs_again_under_its_id() {
    let mut t = TestState::new();
    let n = t.node("w1", "small=1,big=1");
    let (id, fx) = t.submit(task("small=1"));
    assert_eq!(fx, [format!("assign {id}->{n} #1")]);
    let out = requeue(&mut t, id, "big=1").unwrap();
    assert_eq!(out.fx(), [format!("cancel {id}@{n} #1")]);
    // Until the worker confirms, the old attempt keeps what it holds.
    assert_eq!(t.task_state(id), TaskState::Running);
    assert_eq!(t.slot(n, "small"), Some(("1".into(), "1".into())));
    assert_eq!(t.slot(n, "big"), Some(("1".into(), "0".into())));
    // A second requeue before that replaces the first.
    let again = requeue(&mut t, id, "big=1").unwrap();
    assert_eq!(again.fx(), [format!("cancel {id}@{n} #1")]);

    // The worker reports the stopped attempt (killed: 143): the task runs again, attempt 2.
    let fx = t.exit(id, 143);
    assert_eq!(fx, [format!("assign {id}->{n} #2")]);
    assert_eq!(resources(&t, id), res("big=1"));
    assert_eq!(t.slot(n, "small"), Some(("1".into(), "0".into())));
    assert_eq!(t.slot(n, "big"), Some(("1".into(), "1".into())));
    let info = t.state.task_info(id).unwrap();
    assert_eq!(info.attempts.len(), 2);
    assert_eq!(
        info.attempts[0].ended.as_deref(),
        Some("stopped: requeued with big=1")
    );
    // A late report of attempt 1 changes nothing; attempt 2's end is the task's.
    assert!(
        t.finish(report(id, 1, Ok(TaskResult::Exited { code: 0 })))
            .is_empty()
    );
    assert_eq!(t.exit(id, 0), [format!("terminal {id}")]);
    let status = t.status(id);
    assert_eq!((status.state, status.attempt), (TaskState::Succeeded, 2));
    check_invariants(&t.state);
}

#[test]
fn an_attempt_that_ends_before_the_stop_lands_is_requeued_all_the_same() {
    let mut t = TestState::new();
    let n = t.node("w1", "small=1,big=1");
    let (id, _) = t.submit(task("small=1"));
    requeue(&mut t, id, "big=1").unwrap();
    // It ran out of memory on its own before the worker got the stop: no failure, no retry
    // count spent; it runs again with the new resources.
    let oom = Ok(TaskResult::OutOfMemory {
        used_mib: 6144,
        limit_mib: 4864,
    });
    assert_eq!(t.finish_current(id, oom), [format!("assign {id}->{n} #2")]);
    assert_eq!(t.task_state(id), TaskState::Running);
    check_invariants(&t.state);
}

#[test]
fn an_attempt_that_succeeds_before_the_stop_lands_is_the_result() {
    let mut t = TestState::new();
    t.node("w1", "small=1,big=1");
    let (id, _) = t.submit(task("small=1"));
    requeue(&mut t, id, "big=1").unwrap();
    assert_eq!(t.exit(id, 0), [format!("terminal {id}")]);
    let status = t.status(id);
    assert_eq!((status.state, status.attempt), (TaskState::Succeeded, 1));
    assert!(t.state.task(id).unwrap().requeue.is_none());
    check_invariants(&t.state);
}

#[test]
fn a_lost_node_ends_the_stopped_attempt() {
    let mut t = TestState::new();
    let lost = t.node("w1", "small=1");
    let (id, _) = t.submit(task("small=1"));
    requeue(&mut t, id, "big=1").unwrap();
    t.remove_node(lost);
    assert_eq!(t.task_state(id), TaskState::Pending);
    assert_eq!(resources(&t, id), res("big=1"));
    let other = t.node("w2", "big=1");
    assert_eq!(t.task_state(id), TaskState::Running);
    assert_eq!(t.status(id).node, Some(other));
    assert_eq!(t.status(id).attempt, 2);
    check_invariants(&t.state);
}

#[test]
fn out_of_memory_is_a_failure_that_retries_and_says_so() {
    let mut t = TestState::new();
    let n = t.node("w1", "mig.1g.5gb=1");
    let (id, _) = t.submit(task("mig.1g.5gb=1").retries(1));
    let oom = |used| {
        Ok(TaskResult::OutOfMemory {
            used_mib: used,
            limit_mib: 4864,
        })
    };
    // Retries apply, as to any failure.
    assert_eq!(
        t.finish_current(id, oom(6144)),
        [format!("assign {id}->{n} #2")]
    );
    assert!(
        t.reason(id).contains("out of GPU memory (6144 MiB needed"),
        "{}",
        t.reason(id)
    );
    assert_eq!(t.finish_current(id, oom(6200)), [format!("terminal {id}")]);
    let status = t.status(id);
    assert_eq!(status.state, TaskState::Failed);
    assert_eq!(status.result, oom(6200).ok());
    assert_eq!(
        status.reason.as_deref(),
        Some("out of GPU memory (6200 MiB needed, 4864 MiB on its device)")
    );
}

#[test]
fn a_failed_task_is_reopened_on_a_larger_slice_under_its_id() {
    let mut t = TestState::new();
    let n = t.node("w1", "mig.1g.5gb=1,mig.2g.10gb=1,team/lane=1");
    // No retries: the policy alone decides where it runs again. In a namespace: the new
    // request's application names are qualified with it, physical ones stay as they are.
    let (ids, _) = t.submit_in(Some("team"), vec![task("mig.1g.5gb=1").build()]);
    let id = ids[0];
    let oom = Ok(TaskResult::OutOfMemory {
        used_mib: 6144,
        limit_mib: 4864,
    });
    assert_eq!(t.finish_current(id, oom), [format!("terminal {id}")]);
    assert_eq!(t.task_state(id), TaskState::Failed);
    let out = requeue(&mut t, id, "mig.2g.10gb=1,lane=1").unwrap();
    assert_eq!(out.fx(), [format!("assign {id}->{n} #2")]);
    let status = t.status(id);
    assert_eq!((status.state, status.attempt), (TaskState::Running, 2));
    assert_eq!((status.result, status.finished_at_ms), (None, None));
    assert_eq!(resources(&t, id), res("mig.2g.10gb=1,team/lane=1"));
    assert_eq!(t.exit(id, 0), [format!("terminal {id}")]);
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    check_invariants(&t.state);
}

#[test]
fn what_cannot_be_requeued_is_refused_and_nothing_changes() {
    let mut t = TestState::new();
    t.node("w1", "cpu=1");
    let (done, _) = t.submit(task("cpu=1"));
    t.exit(done, 0);
    let before = t.state.status(done).unwrap();
    let err = requeue(&mut t, done, "cpu=1").unwrap_err();
    assert!(
        matches!(err, ApplyError::CannotRequeue { .. }) && err.is_precondition(),
        "{err:?}"
    );
    assert!(err.to_string().contains("has ended (succeeded)"), "{err}");
    assert_eq!(t.state.status(done).unwrap(), before);
    assert_eq!(resources(&t, done), res("cpu=1"));

    let err = requeue(&mut t, TaskId(99), "cpu=1").unwrap_err();
    assert!(err.is_not_found(), "{err:?}");

    let (running, _) = t.submit(task("cpu=1"));
    t.cancel(&[running]).unwrap();
    let err = requeue(&mut t, running, "cpu=1").unwrap_err();
    assert!(err.to_string().contains("being cancelled"), "{err}");
}
