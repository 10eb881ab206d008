//! Object sessions ending (`CloseObjectSession`, `core/src/state/objects.rs`): a closed
//! session's objects leave the table at once, except those a pending or running task takes as
//! an argument, which a later close releases once that task ended; another namespace's
//! objects stay; an unknown session is refused and a closed one closes again changing
//! nothing.
//!
//! A session owns the result objects of the tasks submitted under it too (the label
//! `escher.object-session`): they go with its `put`s, a pinned one once its task ended, one
//! made after the close at the next close (the leader's next lapse check), and the tasks of no
//! session keep theirs. What a session owns survives a snapshot; a task evicted by retention
//! takes its result's session with it, on every replica alike.

mod state_support;

use escher_core::state::{ApplyError, Command, FIRST_SESSION, Reply, RetentionPolicy, StateConfig};
use escher_proto::types::{
    NodeId, OBJECT_SESSION_LABEL, OBJECTS_LABEL, ObjectId, ObjectOwner, SealedCopy, TaskId,
    TaskResult, TaskSpec, format_object_args,
};
use state_support::{TaskBuilder, TestState, data_node, ns, report, task};

fn open(t: &mut TestState) -> u64 {
    match t.apply(Command::OpenObjectSession).reply {
        Reply::ObjectSession(s) => s,
        other => panic!("OpenObjectSession replied {other:?}"),
    }
}

fn seal(t: &mut TestState, id: ObjectId, node: NodeId, namespace: Option<&str>) {
    let copy = SealedCopy {
        id,
        size: 100,
        checksum: 7,
        owner: ObjectOwner::Session(id.owner()),
        namespace: namespace.map(ns),
        node,
    };
    match t.apply(Command::ObjectsSealed { copies: vec![copy] }).reply {
        Reply::ObjectsSealed(dropped) => assert!(dropped.is_empty(), "{dropped:?}"),
        other => panic!("ObjectsSealed replied {other:?}"),
    }
}

fn close_command(session: u64, namespace: Option<&str>, admin: bool) -> Command {
    Command::CloseObjectSession {
        session,
        namespace: namespace.map(ns),
        sees_everything: admin,
    }
}

/// Closes `session` as a caller of `namespace`: (released, pinned, effects).
fn close(
    t: &mut TestState,
    session: u64,
    namespace: Option<&str>,
    admin: bool,
) -> (Vec<ObjectId>, Vec<ObjectId>, Vec<String>) {
    let out = t.apply(close_command(session, namespace, admin));
    match out.reply.clone() {
        Reply::ObjectSessionClosed { released, pinned } => (released, pinned, out.fx()),
        other => panic!("CloseObjectSession replied {other:?}"),
    }
}

fn ids_in_table(t: &TestState) -> Vec<ObjectId> {
    t.state.objects().iter().map(|(id, _)| *id).collect()
}

#[test]
fn a_closed_sessions_objects_leave_the_table_at_once_and_another_sessions_stay() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let (s1, s2) = (open(&mut t), open(&mut t));
    assert_eq!((s1, s2), (FIRST_SESSION, FIRST_SESSION + 1));
    seal(&mut t, ObjectId(s1, 0), a, None);
    seal(&mut t, ObjectId(s1, 1), b, None);
    seal(&mut t, ObjectId(s1, 1), a, None);
    seal(&mut t, ObjectId(s2, 0), a, None);
    assert_eq!(t.state.objects().sessions_with_objects(), vec![s1, s2]);

    let (released, pinned, fx) = close(&mut t, s1, None, false);
    assert_eq!(released, vec![ObjectId(s1, 0), ObjectId(s1, 1)]);
    assert!(pinned.is_empty());
    assert_eq!(
        fx,
        vec![
            format!("delete {a} {},{}", ObjectId(s1, 0), ObjectId(s1, 1)),
            format!("delete {b} {}", ObjectId(s1, 1)),
        ]
    );
    assert_eq!(ids_in_table(&t), vec![ObjectId(s2, 0)]);
    assert_eq!(t.state.objects().sessions_with_objects(), vec![s2]);
    assert_eq!(t.state.objects().bytes_on(b), 0);
    // A reader is told the object was freed.
    assert_eq!(
        t.state.locate_object(ObjectId(s1, 0), None, false, None),
        Err(ApplyError::ObjectFreed(ObjectId(s1, 0)))
    );
}

#[test]
fn closing_again_changes_nothing_and_an_unknown_session_is_refused_naming_it() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let s = open(&mut t);
    seal(&mut t, ObjectId(s, 0), a, None);
    close(&mut t, s, None, false);
    let table = t.state.objects().clone();
    let (released, pinned, fx) = close(&mut t, s, None, false);
    assert!(released.is_empty() && pinned.is_empty() && fx.is_empty());
    assert_eq!(t.state.objects(), &table);

    // A session that never put closes with nothing to release.
    let idle = open(&mut t);
    let table = t.state.objects().clone();
    assert_eq!(close(&mut t, idle, None, false).0, Vec::<ObjectId>::new());
    assert_eq!(t.state.objects(), &table);

    // Numbers never given out: refused, nothing changes (`try_apply` checks that a refusal
    // leaves the state as it was).
    for bad in [0, 5, FIRST_SESSION - 1, idle + 1, u64::MAX] {
        let err = t.try_apply(close_command(bad, None, true)).unwrap_err();
        assert_eq!(err, ApplyError::UnknownObjectSession(bad));
        assert!(err.is_not_found());
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
    assert_eq!(t.state.objects(), &table);
}

#[test]
fn a_session_is_renewed_only_by_a_caller_who_sees_its_objects() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let (app, other) = (Some(ns("app")), Some(ns("other")));
    let s = open(&mut t);
    // Given out, owning nothing yet: its client's first put may be on its way.
    assert!(t.state.may_renew_session(s, other.as_ref(), false));
    seal(&mut t, ObjectId(s, 0), a, Some("app"));
    assert!(t.state.may_renew_session(s, app.as_ref(), false));
    assert!(t.state.may_renew_session(s, None, true));
    assert!(!t.state.may_renew_session(s, other.as_ref(), false));
    assert!(
        !t.state.may_renew_session(s + 1, None, true),
        "never given out"
    );
}

#[test]
fn a_caller_closes_only_its_namespaces_objects_and_the_admin_every_one() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let s = open(&mut t);
    seal(&mut t, ObjectId(s, 0), a, Some("app"));
    seal(&mut t, ObjectId(s, 1), a, Some("other"));
    let (released, _, _) = close(&mut t, s, Some("app"), false);
    assert_eq!(released, vec![ObjectId(s, 0)]);
    assert_eq!(ids_in_table(&t), vec![ObjectId(s, 1)]);
    assert_eq!(t.state.objects().namespace_bytes(&ns("app")), 0);
    assert_eq!(t.state.objects().namespace_bytes(&ns("other")), 100);
    let (released, _, _) = close(&mut t, s, None, true);
    assert_eq!(released, vec![ObjectId(s, 1)]);
    assert!(ids_in_table(&t).is_empty());
}

#[test]
fn an_object_a_pending_or_running_task_takes_stays_until_that_task_ends() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let s = open(&mut t);
    let (arg, free) = (ObjectId(s, 0), ObjectId(s, 1));
    seal(&mut t, arg, a, None);
    seal(&mut t, free, a, None);
    // One task runs with it, one waits for room with it.
    let (running, _) = t.submit(task("cpu=4").label(OBJECTS_LABEL, &format_object_args(&[arg])));
    let (pending, fx) = t.submit(task("cpu=4").label(OBJECTS_LABEL, &format_object_args(&[arg])));
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(
        t.state.object_pins().into_iter().collect::<Vec<_>>(),
        vec![arg]
    );

    let (released, pinned, _) = close(&mut t, s, None, false);
    assert_eq!((released, pinned), (vec![free], vec![arg]));
    assert_eq!(ids_in_table(&t), vec![arg]);

    // The running task ends: the pending one starts, and still pins it.
    t.finish(report(running, 1, Ok(TaskResult::Exited { code: 0 })));
    let (released, pinned, _) = close(&mut t, s, None, false);
    assert_eq!((released, pinned), (vec![], vec![arg]));

    t.finish(report(pending, 1, Ok(TaskResult::Exited { code: 0 })));
    assert!(t.state.object_pins().is_empty());
    let (released, pinned, fx) = close(&mut t, s, None, false);
    assert_eq!((released, pinned), (vec![arg], vec![]));
    assert_eq!(fx, vec![format!("delete {a} {arg}")]);
    assert!(ids_in_table(&t).is_empty());
}

/// A 1 MiB result kept as an object.
fn object_result() -> TaskResult {
    TaskResult::Object {
        size: 1 << 20,
        checksum: 0x1234_5678,
    }
}

/// A function task submitted under object session `session` (`None`: by a client that never
/// put).
fn under(session: Option<u64>) -> TaskBuilder {
    let t = task("cpu=1").function("make");
    match session {
        Some(s) => t.label(OBJECT_SESSION_LABEL, &s.to_string()),
        None => t,
    }
}

/// Submits `spec`, runs it, and reports its result kept as an object: the task and its result.
fn made(t: &mut TestState, spec: TaskBuilder) -> (TaskId, ObjectId) {
    let (id, fx) = t.submit(spec);
    assert_eq!(fx.len(), 1, "{fx:?}");
    t.finish(report(id, 1, Ok(object_result())));
    (id, ObjectId::task_result(id))
}

/// A replica restored from a snapshot of `t` (the image, then the table, as the head's codec
/// writes them) holds the same table: the indexes rebuilt from the table and the task records
/// alone are the ones kept as the commands applied.
fn check_rebuilds(t: &TestState) {
    let back = state_support::restored(t);
    assert_eq!(back.objects(), t.state.objects());
}

#[test]
fn a_closed_sessions_task_results_go_with_its_puts_and_a_pinned_one_once_its_task_ended() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let s = open(&mut t);
    let put = ObjectId(s, 0);
    seal(&mut t, put, a, None);
    let (first, r1) = made(&mut t, under(Some(s)));
    let (_, r2) = made(&mut t, under(Some(s)));
    // A task of a client that never put keeps today's lifetime.
    let (_, kept) = made(&mut t, under(None));
    // A result is still its task's object, as before.
    assert_eq!(
        t.state.objects().get(r1).map(|r| r.owner),
        Some(ObjectOwner::Task(first))
    );
    assert_eq!(t.state.objects().session_owned(s), vec![r1, r2, put]);
    assert_eq!(t.state.objects().sessions_with_objects(), vec![s]);
    check_rebuilds(&t);
    // A running task takes r2 as its argument.
    let (reader, _) = t.submit(task("cpu=4").label(OBJECTS_LABEL, &format_object_args(&[r2])));

    let (released, pinned, fx) = close(&mut t, s, None, false);
    assert_eq!((released, pinned), (vec![r1, put], vec![r2]));
    assert_eq!(fx, vec![format!("delete {a} {r1},{put}")]);
    assert_eq!(ids_in_table(&t), vec![r2, kept]);
    check_rebuilds(&t);
    // A reader of the released result is told it was freed.
    assert_eq!(
        t.state.locate_object(r1, None, false, None),
        Err(ApplyError::ObjectFreed(r1))
    );

    t.finish(report(reader, 1, Ok(TaskResult::Exited { code: 0 })));
    let (released, pinned, _) = close(&mut t, s, None, false);
    assert_eq!((released, pinned), (vec![r2], vec![]));
    assert_eq!(ids_in_table(&t), vec![kept]);
    assert!(t.state.objects().sessions_with_objects().is_empty());
    check_rebuilds(&t);
}

#[test]
fn a_result_made_after_its_session_closed_goes_at_the_next_close() {
    let mut t = TestState::new();
    data_node(&mut t, "a");
    let s = open(&mut t);
    // Submitted under the session, still running when the session closes.
    let (running, fx) = t.submit(under(Some(s)));
    assert_eq!(fx.len(), 1, "{fx:?}");
    let (released, pinned, _) = close(&mut t, s, None, false);
    assert!(released.is_empty() && pinned.is_empty());

    t.finish(report(running, 1, Ok(object_result())));
    let result = ObjectId::task_result(running);
    // Recorded with its completion ("succeeded" is never told before the reference), and the
    // session owns it: the leader's next look at the sessions that own objects closes it.
    assert_eq!(ids_in_table(&t), vec![result]);
    assert_eq!(t.state.objects().sessions_with_objects(), vec![s]);
    let (released, _, _) = close(&mut t, s, None, false);
    assert_eq!(released, vec![result]);
    assert!(ids_in_table(&t).is_empty());
}

#[test]
fn a_result_released_by_its_owner_leaves_its_session_and_namespaces_are_kept_apart() {
    let mut t = TestState::new();
    data_node(&mut t, "a");
    let s = open(&mut t);
    let (ids, out) = t.submit_in(Some("app"), vec![under(Some(s)).build()]);
    assert_eq!(out.fx().len(), 1, "{:?}", out.fx());
    let id = ids[0];
    t.finish(report(id, 1, Ok(object_result())));
    let result = ObjectId::task_result(id);
    assert_eq!(t.state.objects().session_owned(s), vec![result]);
    // The session may be renewed by a caller who sees its result, not by another namespace's.
    assert!(t.state.may_renew_session(s, Some(&ns("app")), false));
    assert!(!t.state.may_renew_session(s, Some(&ns("other")), false));
    // Another namespace's close leaves it.
    let (released, _, _) = close(&mut t, s, Some("other"), false);
    assert!(released.is_empty());
    assert_eq!(ids_in_table(&t), vec![result]);

    // Its reference's owner releases it: the session owns nothing more.
    let out = t.apply(Command::ObjectsReleased {
        ids: vec![result],
        namespace: Some(ns("app")),
        sees_everything: false,
    });
    assert!(matches!(out.reply, Reply::ObjectsReleased(ref unknown) if unknown.is_empty()));
    assert!(t.state.objects().session_owned(s).is_empty());
    assert!(t.state.objects().sessions_with_objects().is_empty());
    check_rebuilds(&t);
}

#[test]
fn a_submission_naming_a_session_never_given_out_or_another_namespaces_is_refused() {
    let mut t = TestState::new();
    data_node(&mut t, "a");
    let s = open(&mut t);
    for bad in [
        "seven".to_string(),
        (s + 1).to_string(),
        "5".to_string(),
        String::new(),
    ] {
        let spec: TaskSpec = under(None).label(OBJECT_SESSION_LABEL, &bad).build();
        let err = t
            .try_apply(Command::Submit {
                tasks: vec![spec],
                namespace: None,
            })
            .unwrap_err();
        assert!(
            matches!(err, ApplyError::InvalidTask { index: 0, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(OBJECT_SESSION_LABEL), "{err}");
    }
    // A session given out is taken, whoever of its namespace names it.
    t.submit(under(Some(s)));

    // Another namespace's session (its first put is of namespace app) is refused.
    let b = data_node(&mut t, "b");
    let theirs = open(&mut t);
    seal(&mut t, ObjectId(theirs, 0), b, Some("app"));
    let spec = under(Some(theirs)).build();
    let err = t
        .try_apply(Command::Submit {
            tasks: vec![spec.clone()],
            namespace: Some(ns("other")),
        })
        .unwrap_err();
    assert!(err.to_string().contains("another namespace"), "{err}");
    let (ids, _) = t.submit_in(Some("app"), vec![spec]);
    assert_eq!(ids.len(), 1);
}

#[test]
fn a_task_evicted_by_retention_takes_its_results_session_with_it_on_every_replica() {
    let config = StateConfig {
        retention: RetentionPolicy {
            finished: 1,
            ..RetentionPolicy::default()
        },
        ..StateConfig::default()
    };
    let mut t = TestState::with_config(config);
    data_node(&mut t, "a");
    let s = open(&mut t);
    let (first, r1) = made(&mut t, under(Some(s)));
    let (second, r2) = made(&mut t, under(Some(s)));
    // The second's completion evicts the first (one finished task kept).
    assert!(t.state.task(first).is_none(), "evicted");
    assert!(t.state.task(second).is_some());
    // Its result stays, as a reference still names it, but no session owns it any more; a
    // restored replica finds the same.
    assert_eq!(ids_in_table(&t), vec![r1, r2]);
    assert_eq!(t.state.objects().session_owned(s), vec![r2]);
    check_rebuilds(&t);
    let (released, _, _) = close(&mut t, s, None, false);
    assert_eq!(released, vec![r2]);
    assert!(t.state.objects().get(r1).is_some());
}
