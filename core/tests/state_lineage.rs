//! Lineage (`core/src/state/lineage.rs`): tasks submitted from inside a running task are
//! recorded as its children (`SubmitChildren`), and a recursive cancel (`CancelTasks`) ends a
//! task's descendants that have not ended with it, in one entry; a forced one asks the worker
//! for a kill without grace.

mod state_support;

use std::time::Duration;

use escher_core::state::{Command, Effect, Reply, RetentionPolicy, StateConfig};
use escher_proto::types::{TaskId, TaskResult, TaskState};
use state_support::{TestState, task};

/// Submits `n` one-CPU tasks from inside `parent`; their ids.
fn children(t: &mut TestState, parent: TaskId, n: usize) -> Vec<TaskId> {
    let out = t.apply(Command::SubmitChildren {
        tasks: (0..n).map(|_| task("cpu=1").build()).collect(),
        namespace: None,
        parent,
    });
    match out.reply {
        Reply::Submitted(ids) => ids,
        other => panic!("SubmitChildren replied {other:?}"),
    }
}

fn cancel_tasks(t: &mut TestState, tasks: &[TaskId], recursive: bool, force: bool) -> Vec<Effect> {
    let out = t.apply(Command::CancelTasks {
        tasks: tasks.to_vec(),
        recursive,
        force,
    });
    match out.reply {
        Reply::Cancelled(statuses) => {
            let ids: Vec<TaskId> = statuses.iter().map(|s| s.id).collect();
            assert_eq!(ids, tasks, "the reply is of the tasks named only, in order");
        }
        other => panic!("CancelTasks replied {other:?}"),
    }
    out.effects
}

/// The tasks a cancel asked workers to stop, with whether it forced them.
fn stops(effects: &[Effect]) -> Vec<(TaskId, bool)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Cancel { task, force, .. } => Some((*task, *force)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_recursive_cancel_ends_every_unfinished_descendant_in_one_entry() {
    let mut t = TestState::new();
    t.node("w", "cpu=6");
    let (root, _) = t.submit(task("cpu=1"));
    let kids = children(&mut t, root, 2);
    // A grandchild, a child that already finished, and one that waits for room.
    let grandkids = children(&mut t, kids[0], 1);
    let done = children(&mut t, root, 1)[0];
    t.exit(done, 0);
    let out = t.apply(Command::SubmitChildren {
        tasks: vec![task("cpu=3").build()],
        namespace: None,
        parent: kids[1],
    });
    let Reply::Submitted(ids) = out.reply else {
        panic!("{:?}", out.reply)
    };
    let waiting = ids[0];
    assert_eq!(t.task_state(waiting), TaskState::Pending);
    let unrelated = t.submit(task("cpu=1")).0;

    assert_eq!(t.state.parent_of(kids[0]), Some(root));
    assert_eq!(t.state.parent_of(grandkids[0]), Some(kids[0]));
    assert_eq!(t.state.parent_of(root), None);
    let info = t.state.task_info(grandkids[0]).unwrap();
    assert_eq!(info.parent, Some(kids[0]));

    let effects = cancel_tasks(&mut t, &[root], true, false);
    let mut stopped = stops(&effects);
    stopped.sort();
    let mut want = vec![
        (root, false),
        (kids[0], false),
        (kids[1], false),
        (grandkids[0], false),
    ];
    want.sort();
    assert_eq!(stopped, want, "{effects:?}");
    // The pending grandchild ended at once; the finished child and the unrelated task are
    // left alone.
    assert_eq!(t.task_state(waiting), TaskState::Cancelled);
    assert_eq!(t.task_state(done), TaskState::Succeeded);
    assert_eq!(t.task_state(unrelated), TaskState::Running);
    // The running ones end as their workers confirm.
    for id in [root, kids[0], kids[1], grandkids[0]] {
        assert_eq!(t.task_state(id), TaskState::Running);
        t.finish_current(id, Ok(TaskResult::Exited { code: 143 }));
        assert_eq!(t.task_state(id), TaskState::Cancelled, "task {id}");
    }
}

#[test]
fn a_cancel_that_is_not_recursive_leaves_the_children_running() {
    let mut t = TestState::new();
    t.node("w", "cpu=4");
    let (root, _) = t.submit(task("cpu=1"));
    let kids = children(&mut t, root, 2);
    let effects = cancel_tasks(&mut t, &[root], false, false);
    assert_eq!(stops(&effects), [(root, false)]);
    // `Cancel`, which every data format holds, does the same.
    let out = t.cancel(&[root]).unwrap();
    assert_eq!(stops(&out.effects), [(root, false)]);
    t.finish_current(root, Ok(TaskResult::Exited { code: 143 }));
    for kid in kids {
        assert_eq!(t.task_state(kid), TaskState::Running);
    }
}

#[test]
fn a_forced_cancel_asks_the_worker_to_kill_without_grace() {
    let mut t = TestState::new();
    t.node("w", "cpu=4");
    let (root, _) = t.submit(task("cpu=1"));
    let kid = children(&mut t, root, 1)[0];
    let effects = cancel_tasks(&mut t, &[root], true, true);
    let mut stopped = stops(&effects);
    stopped.sort();
    assert_eq!(stopped, [(root, true), (kid, true)]);
    // A task named twice, or unknown, refuses the whole cancel (nothing changes).
    let err = t
        .try_apply(Command::CancelTasks {
            tasks: vec![kid, kid],
            recursive: true,
            force: false,
        })
        .unwrap_err();
    assert!(err.to_string().contains(&kid.to_string()), "{err}");
    assert!(
        t.try_apply(Command::CancelTasks {
            tasks: vec![TaskId(999)],
            recursive: true,
            force: true,
        })
        .is_err()
    );
}

#[test]
fn a_parent_without_a_record_is_not_recorded_and_links_go_with_the_child() {
    let config = StateConfig {
        retention: RetentionPolicy {
            finished_for: Duration::from_millis(100),
            ..RetentionPolicy::default()
        },
        ..StateConfig::default()
    };
    let mut t = TestState::with_config(config);
    t.node("w", "cpu=4");
    let orphan = children(&mut t, TaskId(777), 1)[0];
    assert_eq!(t.state.parent_of(orphan), None);
    assert!(t.state.lineage().is_empty());

    let (root, _) = t.submit(task("cpu=1"));
    let kid = children(&mut t, root, 1)[0];
    assert_eq!(t.state.lineage().len(), 1);
    // The parent ends and is evicted: its child keeps naming it.
    t.exit(root, 0);
    let later = t.now + 1_000;
    t.tick_at(later);
    assert!(t.state.task(root).is_none(), "the parent was evicted");
    assert_eq!(t.state.parent_of(kid), Some(root));
    // The child ends and is evicted: the link goes.
    t.exit(kid, 0);
    let later = t.now + 1_000;
    t.tick_at(later);
    assert!(t.state.task(kid).is_none(), "the child was evicted");
    assert!(t.state.lineage().is_empty());
}
