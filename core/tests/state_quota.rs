//! Per-namespace quotas (docs/DESIGN.md §10): an application namespace may have at most
//! `StateConfig::namespace_unfinished` unfinished tasks, reservation holders included; a batch
//! that would pass it is refused whole, admin tasks are not counted, and finishing or cancelling
//! tasks makes room again. Reservation holders carry their namespace like any task. And at most
//! `StateConfig::namespace_result_bytes` of function results stored: a result past it fails
//! its task, saying why, until retention releases earlier results.

mod state_support;

use std::time::Duration;

use escher_core::state::{ApplyError, Command, Reply, RetentionPolicy, StateConfig};
use escher_proto::types::{GangStrategy, NAMESPACE_LABEL, TaskId, TaskResult, TaskState};
use state_support::{TestState, name, ns, res, task};

fn quota(n: u64) -> TestState {
    TestState::with_config(StateConfig {
        namespace_unfinished: n,
        ..StateConfig::default()
    })
}

fn submit(t: &mut TestState, namespace: Option<&str>, n: usize) -> Result<Vec<TaskId>, ApplyError> {
    let specs = (0..n).map(|_| task("cpu=1").build()).collect();
    let out = t.try_apply(Command::Submit {
        tasks: specs,
        namespace: namespace.map(ns),
    })?;
    match out.reply {
        Reply::Submitted(ids) => Ok(ids),
        other => panic!("Submit replied {other:?}"),
    }
}

fn reserve(t: &mut TestState, namespace: &str, bundles: usize) -> Result<Vec<TaskId>, ApplyError> {
    let out = t.try_apply(Command::Reserve {
        name: name("gang"),
        bundles: (0..bundles).map(|_| res("cpu=1")).collect(),
        strategy: GangStrategy::Pack,
        timeout: None,
        namespace: Some(ns(namespace)),
    })?;
    match out.reply {
        Reply::Reserved { tasks, .. } => Ok(tasks),
        other => panic!("Reserve replied {other:?}"),
    }
}

#[test]
fn a_batch_past_the_quota_is_refused_whole_and_names_the_numbers() {
    let mut t = quota(3);
    t.node("n", "cpu=1");
    submit(&mut t, Some("a"), 2).unwrap();
    // Two more would make four: refused whole (try_apply checks that nothing changed).
    let err = submit(&mut t, Some("a"), 2).unwrap_err();
    assert!(matches!(
        err,
        ApplyError::QuotaExceeded {
            unfinished: 2,
            asked: 2,
            limit: 3,
            ..
        }
    ));
    let message = err.to_string();
    assert!(message.contains("namespace a") && message.contains("quota of 3"));
    assert!(
        message.contains("--namespace-unfinished-tasks"),
        "{message}"
    );
    // One more fits exactly.
    submit(&mut t, Some("a"), 1).unwrap();
    assert!(submit(&mut t, Some("a"), 1).is_err());
}

#[test]
fn namespaces_are_counted_apart_and_admin_tasks_not_at_all() {
    let mut t = quota(2);
    submit(&mut t, Some("a"), 2).unwrap();
    submit(&mut t, Some("b"), 2).unwrap();
    submit(&mut t, None, 10).unwrap();
    assert!(submit(&mut t, Some("b"), 1).is_err());
    let counts = t.state.unfinished_by_namespace();
    assert_eq!(counts.get(&ns("a")), Some(&2));
    assert_eq!(counts.get(&ns("b")), Some(&2));
    assert_eq!(counts.len(), 2);
}

#[test]
fn finished_and_cancelled_tasks_make_room() {
    let mut t = quota(2);
    t.node("n", "cpu=1");
    let ids = submit(&mut t, Some("a"), 2).unwrap();
    assert!(submit(&mut t, Some("a"), 1).is_err());
    // The first runs (one cpu) and exits, and the second starts in its place.
    t.exit(ids[0], 0);
    let third = submit(&mut t, Some("a"), 1).unwrap();
    assert!(submit(&mut t, Some("a"), 1).is_err());
    // The third is pending: cancelling it ends it at once.
    t.cancel(&third).unwrap();
    submit(&mut t, Some("a"), 1).unwrap();
    assert_eq!(t.state.unfinished_by_namespace().get(&ns("a")), Some(&2));
}

#[test]
fn reservation_holders_count_and_carry_their_namespace() {
    let mut t = quota(3);
    t.node("n", "cpu=4");
    let holders = reserve(&mut t, "a", 2).unwrap();
    for holder in &holders {
        let rec = t.state.task(*holder).unwrap();
        assert_eq!(rec.spec.labels.get(NAMESPACE_LABEL), Some("a"));
    }
    // Two holders and two tasks would be four.
    assert!(matches!(
        submit(&mut t, Some("a"), 2),
        Err(ApplyError::QuotaExceeded { unfinished: 2, .. })
    ));
    assert!(reserve(&mut t, "a", 2).is_err());
    // Releasing the reservation (cancelling its holders) gives the room back.
    t.cancel(&holders).unwrap();
    submit(&mut t, Some("a"), 3).unwrap();
}

#[test]
fn stored_results_past_the_quota_fail_their_task_until_retention_releases_some() {
    let mut t = TestState::with_config(StateConfig {
        namespace_result_bytes: 10,
        retention: RetentionPolicy {
            finished: 1,
            finished_for: Duration::from_secs(3600),
            ..RetentionPolicy::default()
        },
        ..StateConfig::default()
    });
    t.node("n", "cpu=2");
    let returned = |n: usize| Ok(TaskResult::Returned(vec![7; n].into()));
    let ids = submit(&mut t, Some("a"), 2).unwrap();
    t.finish_current(ids[0], returned(6));
    assert_eq!(t.task_state(ids[0]), TaskState::Succeeded);
    // 6 + 6 > 10: the second fails, keeps no result, and says why.
    t.finish_current(ids[1], returned(6));
    let status = t.status(ids[1]);
    assert_eq!(status.state, TaskState::Failed);
    assert!(status.result.is_none());
    let reason = status.reason.unwrap();
    assert!(
        reason.contains("quota of 10 stored result bytes"),
        "{reason}"
    );
    assert!(reason.contains("--namespace-result-bytes"), "{reason}");
    // Admin tasks and other namespaces are not counted against `a`.
    let other = submit(&mut t, Some("b"), 1).unwrap();
    t.finish_current(other[0], returned(8));
    assert_eq!(t.task_state(other[0]), TaskState::Succeeded);
    // Retention keeps one finished task: the first two are evicted by now, releasing `a`'s 6.
    let next = submit(&mut t, Some("a"), 1).unwrap();
    t.finish_current(next[0], returned(9));
    assert_eq!(t.task_state(next[0]), TaskState::Succeeded);
    assert_eq!(t.state.result_bytes_by_namespace().get(&ns("a")), Some(&9));
}

#[test]
fn resource_names_past_the_quota_are_refused_whole() {
    let mut t = TestState::with_config(StateConfig {
        namespace_resources: 2,
        ..StateConfig::default()
    });
    let node = t.node("n", "cpu=1");
    let set_in = |ns_name: &str, names: &[&str]| Command::SetResources {
        updates: names
            .iter()
            .map(|n| state_support::set(n, "1", state_support::on(node)))
            .collect(),
        namespace: Some(ns(ns_name)),
        caller_task: None,
    };
    t.apply(set_in("a", &["x"]));
    // Two new names would make three: refused whole (x2 is not created either).
    let err = t.try_apply(set_in("a", &["x2", "y"])).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::ResourceQuotaExceeded {
                held: 1,
                asked: 2,
                limit: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--namespace-resources"), "{err}");
    // Resizing a name it has is not a new name; another namespace counts apart; so do admins.
    t.apply(set_in("a", &["x", "y"]));
    t.apply(set_in("b", &["x", "y"]));
    assert!(t.try_apply(set_in("a", &["z"])).is_err());
    t.apply(Command::SetResources {
        updates: vec![state_support::set("z", "1", state_support::on(node))],
        namespace: None,
        caller_task: None,
    });
    // Deleting one makes room.
    t.apply(Command::SetResources {
        updates: vec![state_support::adjust("y", "-1", state_support::on(node))],
        namespace: Some(ns("a")),
        caller_task: None,
    });
    t.apply(set_in("a", &["z"]));
}
