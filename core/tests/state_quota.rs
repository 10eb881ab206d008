//! Per-namespace quotas (docs/DESIGN.md §10): an application namespace may have at most
//! `StateConfig::namespace_unfinished` unfinished tasks, reservation holders included; a batch
//! that would pass it is refused whole, admin tasks are not counted, and finishing or cancelling
//! tasks makes room again. Reservation holders carry their namespace like any task. And at most
//! `StateConfig::namespace_result_bytes` of function results stored: a result past it fails
//! its task, saying why, until retention releases earlier results.

mod state_support;

use std::time::Duration;

use escher_core::state::{ApplyError, Command, Reply, RetentionPolicy, StateConfig};
use escher_proto::types::{
    GangStrategy, NAMESPACE_LABEL, NodeSpec, ResourceUpdate, TaskId, TaskResult, TaskState,
};
use proptest::prelude::*;
use state_support::{TestState, adjust, name, ns, on, res, set, task};

fn quota(n: u64) -> TestState {
    TestState::with_config(StateConfig {
        namespace_unfinished: n,
        ..StateConfig::default()
    })
}

fn submit(t: &mut TestState, namespace: Option<&str>, n: usize) -> Result<Vec<TaskId>, ApplyError> {
    let specs = (0..n).map(|_| task("cpu=1").build()).collect();
    submit_specs(t, namespace, specs)
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

/// The capacity of every resource outside namespace `a` on every node: what an application of
/// namespace `a` must never change, through any path.
fn outside_a(t: &TestState) -> Vec<(u64, String, String)> {
    let status = t.state.cluster_status();
    let mut out = Vec::new();
    for n in &status.nodes {
        for r in &n.resources {
            if r.name.namespace() != Some("a") {
                out.push((n.id.0, r.name.to_string(), r.total.to_string()));
            }
        }
    }
    out.sort();
    out
}

/// A cluster with `b/pool` of 2 and `shared/lic` of 1 on one node, set by the admin.
fn with_others_resources(config: StateConfig) -> (TestState, escher_proto::types::NodeId) {
    let mut t = TestState::with_config(config);
    let node = t.node("n", "cpu=8");
    t.set_resources(
        None,
        vec![
            set("b/pool", "2", on(node)),
            set("shared/lic", "1", on(node)),
        ],
    )
    .unwrap();
    (t, node)
}

#[test]
fn every_write_path_refuses_another_namespaces_names_with_one_rule() {
    let (mut t, node) = with_others_resources(StateConfig::default());
    let before = outside_a(&t);
    let refused = |result: Result<_, ApplyError>, what: &str| match result {
        Err(e @ ApplyError::OtherNamespace { .. }) => {
            assert!(e.to_string().contains("namespace a cannot change"), "{e}");
        }
        other => panic!("{what}: {other:?}"),
    };
    for target in ["b/pool", "shared/lic"] {
        refused(
            t.set_resources(Some("a"), vec![set(target, "100000", on(node))])
                .map(|_| ()),
            "SetResources",
        );
        let hook = task("cpu=1").on_start(adjust(target, "+50", on(node)));
        refused(
            submit_specs(&mut t, Some("a"), vec![hook.build()]).map(|_| ()),
            "an on_start hook",
        );
        let hook = task("cpu=1").on_success(adjust(target, "-1", on(node)));
        refused(
            submit_specs(&mut t, Some("a"), vec![hook.build()]).map(|_| ()),
            "an on_success hook",
        );
        let ghost = task("cpu=1").ghost(&format!("{target}=7"));
        refused(
            submit_specs(&mut t, Some("a"), vec![ghost.build()]).map(|_| ()),
            "a ghost's creates",
        );
        let reserve = t.try_apply(Command::Reserve {
            name: name(target),
            bundles: vec![res("cpu=1")],
            strategy: GangStrategy::Pack,
            timeout: None,
            namespace: Some(ns("a")),
        });
        refused(reserve.map(|_| ()), "a reservation's name");
    }
    assert_eq!(outside_a(&t), before);
    // Requiring them is reading, which is allowed; and the admin writes any.
    submit_specs(&mut t, Some("a"), vec![task("shared/lic=1").build()]).unwrap();
    t.set_resources(None, vec![set("b/pool", "3", on(node))])
        .unwrap();
}

fn submit_specs(
    t: &mut TestState,
    namespace: Option<&str>,
    specs: Vec<escher_proto::types::TaskSpec>,
) -> Result<Vec<TaskId>, ApplyError> {
    let out = t.try_apply(Command::Submit {
        tasks: specs,
        namespace: namespace.map(ns),
    })?;
    match out.reply {
        Reply::Submitted(ids) => Ok(ids),
        other => panic!("Submit replied {other:?}"),
    }
}

#[test]
fn hooks_and_ghosts_count_against_the_namespaces_resource_names() {
    let (mut t, node) = with_others_resources(StateConfig {
        namespace_resources: 1,
        ..StateConfig::default()
    });
    // One hook creates a name (the quota's one), a second task's hook a second: refused and
    // recorded on the task, not applied.
    let first = task("cpu=1").on_start(set("x", "1", on(node)));
    let second = task("cpu=1").on_start(set("y", "1", on(node)));
    let ghost = task("cpu=1").ghost("z=1");
    let ids = submit_specs(
        &mut t,
        Some("a"),
        vec![first.build(), second.build(), ghost.build()],
    )
    .unwrap();
    let held: Vec<String> = t.state.cluster_status().nodes[0]
        .resources
        .iter()
        .filter(|r| r.name.namespace() == Some("a"))
        .map(|r| r.name.to_string())
        .collect();
    assert_eq!(held, ["a/x"]);
    for id in &ids[1..] {
        let errors = &t.state.status(*id).unwrap().hook_errors;
        assert!(
            errors.iter().any(|e| e.contains("--namespace-resources")),
            "{id}: {errors:?}"
        );
    }
}

#[test]
fn requeueing_a_failed_task_counts_against_the_unfinished_quota() {
    let mut t = quota(1);
    t.node("n", "cpu=1");
    let id = submit(&mut t, Some("a"), 1).unwrap()[0];
    t.finish_current(id, Ok(TaskResult::Exited { code: 1 }));
    assert_eq!(t.task_state(id), TaskState::Failed);
    // The one unfinished task the quota allows is taken by another; a requeue would be a
    // second.
    submit(&mut t, Some("a"), 1).unwrap();
    let err = t
        .try_apply(Command::Requeue {
            task: id,
            resources: res("cpu=1"),
        })
        .unwrap_err();
    assert!(matches!(err, ApplyError::QuotaExceeded { .. }), "{err}");
}

/// One step of an application of namespace `a` trying every write path, or of the cluster
/// moving on (tasks ending, a node joining or leaving).
#[derive(Debug, Clone)]
enum Step {
    Set(usize, i64),
    Hook(usize, bool, i64),
    Ghost(usize, u64),
    Reserve(usize),
    Requeue(usize),
    Finish(usize, bool),
    NodeJoins,
    NodeLeaves(usize),
}

/// The names an attacker in `a` writes: its own, another application's, the shared namespace's.
const TARGETS: [&str; 4] = ["pool", "a/pool", "b/pool", "shared/lic"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..TARGETS.len(), -3i64..5).prop_map(|(n, d)| Step::Set(n, d)),
        (0..TARGETS.len(), any::<bool>(), -3i64..5).prop_map(|(n, s, d)| Step::Hook(n, s, d)),
        (0..TARGETS.len(), 1u64..4).prop_map(|(n, a)| Step::Ghost(n, a)),
        (0..TARGETS.len()).prop_map(Step::Reserve),
        (0..8usize).prop_map(Step::Requeue),
        (0..8usize, any::<bool>()).prop_map(|(i, ok)| Step::Finish(i, ok)),
        Just(Step::NodeJoins),
        (0..3usize).prop_map(Step::NodeLeaves),
    ]
}

fn delta(target: &str, d: i64, node: escher_proto::types::NodeId) -> ResourceUpdate {
    if d >= 0 {
        adjust(target, &format!("+{d}"), on(node))
    } else {
        adjust(target, &format!("{d}"), on(node))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever an application does, through whichever path, nothing outside its namespace
    /// changes and every quota holds after every step.
    #[test]
    fn an_application_changes_nothing_outside_its_namespace(steps in prop::collection::vec(step(), 1..40)) {
        let config = StateConfig {
            namespace_unfinished: 4,
            namespace_resources: 2,
            ..StateConfig::default()
        };
        let (mut t, first) = with_others_resources(config);
        let mut nodes = vec![first];
        let mut tasks: Vec<TaskId> = Vec::new();
        let mut joined = 0;
        for step in steps {
            t.advance(1);
            let before = outside_a(&t);
            let node = nodes[0];
            match step {
                Step::Set(n, d) => {
                    let _ = t.set_resources(Some("a"), vec![delta(TARGETS[n], d, node)]);
                }
                Step::Hook(n, start, d) => {
                    let update = delta(TARGETS[n], d, escher_proto::types::NodeId(0));
                    let update = ResourceUpdate { target: NodeSpec::Local, ..update };
                    let spec = if start { task("cpu=1").on_start(update) } else { task("cpu=1").on_success(update) };
                    if let Ok(ids) = submit_specs(&mut t, Some("a"), vec![spec.build()]) {
                        tasks.extend(ids);
                    }
                }
                Step::Ghost(n, amount) => {
                    let spec = task("cpu=1").ghost(&format!("{}={amount}", TARGETS[n]));
                    if let Ok(ids) = submit_specs(&mut t, Some("a"), vec![spec.build()]) {
                        tasks.extend(ids);
                    }
                }
                Step::Reserve(n) => {
                    let _ = t.try_apply(Command::Reserve {
                        name: name(TARGETS[n]),
                        bundles: vec![res("cpu=1")],
                        strategy: GangStrategy::Pack,
                        timeout: None,
                        namespace: Some(ns("a")),
                    });
                }
                Step::Requeue(i) => {
                    if let Some(&id) = tasks.get(i) {
                        let _ = t.try_apply(Command::Requeue { task: id, resources: res("cpu=1") });
                    }
                }
                Step::Finish(i, ok) => {
                    if let Some(&id) = tasks.get(i)
                        && t.task_state(id) == TaskState::Running
                    {
                        let code = if ok { 0 } else { 1 };
                        t.finish_current(id, Ok(TaskResult::Exited { code }));
                    }
                }
                Step::NodeJoins => {
                    joined += 1;
                    let id = t.node(&format!("m{joined}"), "cpu=2");
                    nodes.push(id);
                    // The admin gives the new node the others' resources too.
                    t.set_resources(None, vec![set("b/pool", "2", on(id)), set("shared/lic", "1", on(id))]).unwrap();
                    continue;
                }
                Step::NodeLeaves(i) => {
                    if nodes.len() > 1 {
                        let id = nodes.remove(1 + i % (nodes.len() - 1));
                        t.remove_node(id);
                    }
                    // What the node held left with it, for everyone alike.
                    continue;
                }
            }
            prop_assert_eq!(outside_a(&t), before);
            let unfinished = t.state.unfinished_by_namespace().get(&ns("a")).copied().unwrap_or(0);
            prop_assert!(unfinished <= 4, "{} unfinished", unfinished);
            let names: std::collections::BTreeSet<String> = t.state.cluster_status().nodes.iter()
                .flat_map(|n| n.resources.iter())
                .filter(|r| r.name.namespace() == Some("a"))
                .map(|r| r.name.to_string())
                .collect();
            prop_assert!(names.len() <= 2, "{:?}", names);
        }
    }
}

#[test]
fn task_specs_are_bounded_in_bytes_per_task_and_per_namespace() {
    let mut t = TestState::with_config(StateConfig {
        max_task_bytes: 64 * 1024,
        namespace_spec_bytes: 200 * 1024,
        ..StateConfig::default()
    });
    t.node("n", "cpu=1");
    let sized = |kib: usize| {
        let mut spec = task("cpu=1").build();
        if let escher_proto::types::TaskKind::Command { argv, .. } = &mut spec.kind {
            argv.push("x".repeat(kib * 1024));
        }
        spec
    };
    // One task past the limit refuses its whole batch, from the admin too.
    let err = submit_specs(&mut t, None, vec![sized(1), sized(65)]).unwrap_err();
    assert!(
        matches!(err, ApplyError::TaskTooLarge { index: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("--max-task-bytes"), "{err}");
    // Three of 60 KiB fit the namespace's 200 KiB; a fourth does not, and says so.
    submit_specs(&mut t, Some("a"), vec![sized(60), sized(60), sized(60)]).unwrap();
    let err = submit_specs(&mut t, Some("a"), vec![sized(60)]).unwrap_err();
    assert!(matches!(err, ApplyError::SpecBytesExceeded { .. }), "{err}");
    assert!(err.to_string().contains("--namespace-spec-bytes"), "{err}");
    // Another namespace has its own.
    submit_specs(&mut t, Some("b"), vec![sized(60)]).unwrap();
}
