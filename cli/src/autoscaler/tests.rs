//! Tests of the autoscaler's plan: how many workers it launches for pending shapes, the
//! minimum, the maximum and the budget, when it drains and stops idle workers, and the
//! sentence of each decision.

use std::time::Duration;

use escher_proto::{ResourceSet, TaskId, TaskState, TaskSummary};

use super::*;

fn policy() -> Policy {
    Policy {
        min_workers: 0,
        max_workers: 4,
        worker_shape: "cpu=4,memory=1024".parse().unwrap(),
        pending_for: Duration::from_secs(1),
        idle_for: Duration::from_secs(10),
        start_timeout: Duration::from_secs(60),
        budget_worker_seconds: None,
    }
}

fn pending(id: u64, shape: &str, submitted_at_ms: u64) -> TaskSummary {
    TaskSummary {
        id: TaskId(id),
        name: format!("t{id}"),
        state: TaskState::Pending,
        node: None,
        attempt: 0,
        reason: None,
        resources: shape.parse::<ResourceSet>().unwrap(),
        submitted_at_ms,
        started_at_ms: None,
        finished_at_ms: None,
        namespace: None,
    }
}

fn worker(name: &str, node: Option<u64>, idle_since_ms: Option<u64>) -> Launched {
    Launched {
        name: name.into(),
        handle: name.into(),
        launched_at_ms: 0,
        node,
        joined_at_ms: node.map(|_| 0),
        idle_since_ms,
        draining: false,
    }
}

fn view(now_ms: u64, pending: Vec<TaskSummary>, nodes: &[(&str, u64, bool)]) -> View {
    View {
        now_ms,
        pending,
        nodes: nodes
            .iter()
            .map(|(n, id, busy)| (n.to_string(), (NodeId(*id), *busy)))
            .collect(),
    }
}

#[test]
fn pending_shapes_are_packed_into_workers() {
    // Three tasks of 2 CPUs and one of 4: 3 workers of 4 CPUs (4 | 2+2 | 2).
    let tasks = vec![
        pending(1, "cpu=2", 0),
        pending(2, "cpu=2", 0),
        pending(3, "cpu=2", 0),
        pending(4, "cpu=4", 0),
    ];
    let d = plan(&policy(), &view(5_000, tasks, &[]), &mut [], 0.0);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].action, Action::Launch(3));
    assert!(d[0].reason.contains("4 task(s) pending"), "{}", d[0].reason);
}

#[test]
fn young_tasks_are_not_demand_yet_and_starting_workers_count() {
    let d = plan(
        &policy(),
        &view(500, vec![pending(1, "cpu=1", 0)], &[]),
        &mut [],
        0.0,
    );
    assert!(d.is_empty(), "{d:?}");
    // One worker is starting: the one task's demand is met.
    let mut launched = vec![worker("w1", None, None)];
    let d = plan(
        &policy(),
        &view(5_000, vec![pending(1, "cpu=1", 0)], &[]),
        &mut launched,
        0.0,
    );
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn the_maximum_caps_and_then_holds_with_a_reason() {
    let tasks: Vec<_> = (1..=10).map(|i| pending(i, "cpu=4", 0)).collect();
    let d = plan(&policy(), &view(5_000, tasks.clone(), &[]), &mut [], 0.0);
    assert_eq!(d[0].action, Action::Launch(4));
    assert!(
        d[0].reason.contains("capped at the maximum of 4"),
        "{}",
        d[0].reason
    );
    let mut launched: Vec<_> = (1..=4)
        .map(|i| worker(&format!("w{i}"), Some(i), None))
        .collect();
    let nodes: Vec<_> = (1..=4)
        .map(|i| (["w1", "w2", "w3", "w4"][i - 1], i as u64, true))
        .collect();
    let d = plan(&policy(), &view(5_000, tasks, &nodes), &mut launched, 0.0);
    assert_eq!(d[0].action, Action::Hold);
    assert!(
        d[0].reason.contains("at its maximum of 4"),
        "{}",
        d[0].reason
    );
}

#[test]
fn a_task_larger_than_a_worker_is_explained_not_launched_for() {
    let d = plan(
        &policy(),
        &view(5_000, vec![pending(7, "cpu=16", 0)], &[]),
        &mut [],
        0.0,
    );
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].action, Action::Hold);
    assert!(
        d[0].reason.contains("cannot fit in one worker"),
        "{}",
        d[0].reason
    );
    assert!(d[0].reason.contains("cpu=16"), "{}", d[0].reason);
}

#[test]
fn a_spent_budget_holds() {
    let mut p = policy();
    p.budget_worker_seconds = Some(100.0);
    let d = plan(
        &p,
        &view(5_000, vec![pending(1, "cpu=1", 0)], &[]),
        &mut [],
        100.0,
    );
    assert_eq!(d[0].action, Action::Hold);
    assert!(
        d[0].reason
            .contains("budget of 100 worker-seconds is spent"),
        "{}",
        d[0].reason
    );
    let d = plan(
        &p,
        &view(5_000, vec![pending(1, "cpu=1", 0)], &[]),
        &mut [],
        99.0,
    );
    assert_eq!(d[0].action, Action::Launch(1));
}

#[test]
fn the_minimum_is_kept_with_no_demand() {
    let mut p = policy();
    p.min_workers = 2;
    let d = plan(&p, &view(5_000, vec![], &[]), &mut [], 0.0);
    assert_eq!(d[0].action, Action::Launch(2));
    assert!(
        d[0].reason.contains("below its minimum of 2"),
        "{}",
        d[0].reason
    );
    // Two idle workers at the minimum are never drained.
    let mut launched = vec![worker("a", Some(1), Some(0)), worker("b", Some(2), Some(0))];
    let d = plan(
        &p,
        &view(60_000, vec![], &[("a", 1, false), ("b", 2, false)]),
        &mut launched,
        0.0,
    );
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn idle_workers_are_drained_then_stopped_and_busy_ones_never() {
    let mut launched = vec![worker("a", Some(1), None), worker("b", Some(2), None)];
    // Both seen idle (a) and busy (b) at t=1s.
    let v = |now| view(now, vec![], &[("a", 1, false), ("b", 2, true)]);
    assert!(plan(&policy(), &v(1_000), &mut launched, 0.0).is_empty());
    assert_eq!(launched[0].idle_since_ms, Some(1_000));
    assert_eq!(launched[1].idle_since_ms, None);
    // Not idle long enough yet.
    assert!(plan(&policy(), &v(10_000), &mut launched, 0.0).is_empty());
    let d = plan(&policy(), &v(11_000), &mut launched, 0.0);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].action, Action::Drain("a".into()));
    assert!(
        d[0].reason.contains("held no task or reservation for 10s"),
        "{}",
        d[0].reason
    );
    // Drained (as the loop marks it), busy again (a task placed before the drain): kept.
    launched[0].draining = true;
    launched[0].idle_since_ms = None;
    let busy = view(12_000, vec![], &[("a", 1, true), ("b", 2, true)]);
    assert!(plan(&policy(), &busy, &mut launched, 0.0).is_empty());
    // Idle again: stopped.
    let d = plan(&policy(), &v(13_000), &mut launched, 0.0);
    assert_eq!(d[0].action, Action::Stop("a".into()));
}

#[test]
fn pending_work_a_worker_fits_keeps_idle_workers() {
    let mut launched = vec![worker("a", Some(1), Some(0))];
    let d = plan(
        &policy(),
        &view(60_000, vec![pending(1, "cpu=1", 0)], &[("a", 1, false)]),
        &mut launched,
        0.0,
    );
    // The idle worker is counted as meeting the demand (the task waits for something else).
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn a_worker_that_never_joins_is_stopped() {
    let mut launched = vec![worker("slow", None, None)];
    let d = plan(&policy(), &view(61_000, vec![], &[]), &mut launched, 0.0);
    assert_eq!(d[0].action, Action::Stop("slow".into()));
    assert!(
        d[0].reason.contains("did not join the head within 1m"),
        "{}",
        d[0].reason
    );
}

#[test]
fn spent_counts_every_workers_time() {
    let mut a = worker("a", Some(1), None);
    a.launched_at_ms = 1_000;
    assert_eq!(spent(&[a], 5.0, 11_000), 15.0);
}

fn hold(reason: &str) -> Decision {
    Decision {
        action: Action::Hold,
        reason: reason.into(),
    }
}

/// Sends through `announce` to a head that answers with `answers` in turn (`None`: taken),
/// and returns what it was sent.
fn announce_to(
    queue: &mut VecDeque<(u64, Decision)>,
    now: u64,
    answers: Vec<Option<escher_client::ClientError>>,
) -> Vec<(String, String)> {
    let sent = std::sync::Mutex::new(Vec::new());
    let answers = std::sync::Mutex::new(VecDeque::from(answers));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(announce(queue, now, |action, reason| {
        sent.lock().unwrap().push((action.to_string(), reason));
        let answer = answers.lock().unwrap().pop_front().flatten();
        async move { answer.map_or(Ok(()), Err) }
    }));
    sent.into_inner().unwrap()
}

#[test]
fn decisions_made_while_the_head_is_unreachable_are_sent_when_it_answers() {
    let unreachable = || {
        Some(escher_client::ClientError::Unavailable {
            url: "http://127.0.0.1:1".into(),
            message: "connection refused".into(),
        })
    };
    let mut report = Report::default();
    report.record(1_000, hold("the head is unreachable (...)"));
    report.record(
        2_000,
        hold("the docker provider cannot start workers: gone"),
    );
    assert!(
        report
            .render()
            .contains("decisions not yet recorded in the head (sent when it answers): 2"),
        "{}",
        report.render()
    );
    // The head cannot be reached: the first is tried, and both are kept, in order.
    let sent = announce_to(&mut report.unsent, 2_000, vec![unreachable()]);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(report.unsent.len(), 2);
    // It answers at a later tick: both are recorded, oldest first, each saying when it was
    // made.
    let sent = announce_to(&mut report.unsent, 3_000, vec![None, None]);
    assert!(report.unsent.is_empty());
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].0, "hold");
    assert!(
        sent[0]
            .1
            .starts_with("(decided at 1970-01-01T00:00:01Z, while the head was unreachable) the head is unreachable"),
        "{sent:?}"
    );
    assert!(
        sent[1].1.starts_with("(decided at 1970-01-01T00:00:02Z")
            && sent[1].1.ends_with("cannot start workers: gone"),
        "{sent:?}"
    );
    // A decision of this tick goes as it is.
    report.record(4_000, hold("fresh"));
    assert_eq!(
        announce_to(&mut report.unsent, 4_000, vec![None]),
        [("hold".to_string(), "fresh".to_string())]
    );
}

#[test]
fn a_decision_the_head_refuses_is_dropped_and_the_rest_still_go() {
    let mut queue: VecDeque<(u64, Decision)> = [(5, hold("refused")), (5, hold("taken"))]
        .into_iter()
        .collect();
    let refused = Some(escher_client::ClientError::InvalidArgument(
        "the group's data format is 5".into(),
    ));
    let sent = announce_to(&mut queue, 5, vec![refused, None]);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(queue.is_empty(), "{queue:?}");
}

#[test]
fn the_queue_survives_the_status_file_and_old_files_still_read() {
    let mut report = Report::default();
    report.record(1_000, hold("kept"));
    let text = serde_json::to_string(&report).unwrap();
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(back.unsent, report.unsent);
    // A status file written before the queue existed.
    let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
    old.as_object_mut().unwrap().remove("unsent");
    let back: Report = serde_json::from_value(old).unwrap();
    assert!(back.unsent.is_empty());
    // At most DECISIONS_KEPT wait.
    for i in 0..(DECISIONS_KEPT as u64 + 5) {
        report.record(2_000 + i, hold(&format!("hold {i}")));
    }
    assert_eq!(report.unsent.len(), DECISIONS_KEPT);
}
