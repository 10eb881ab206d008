//! Object sessions ending (`CloseObjectSession`, `core/src/state/objects.rs`): a closed
//! session's objects leave the table at once, except those a pending or running task takes as
//! an argument, which a later close releases once that task ended; another namespace's
//! objects stay; an unknown session is refused and a closed one closes again changing
//! nothing.

mod state_support;

use escher_core::state::{ApplyError, Command, FIRST_SESSION, Reply};
use escher_proto::types::{
    NodeId, OBJECTS_LABEL, ObjectId, ObjectOwner, SealedCopy, TaskResult, format_object_args,
};
use state_support::{TestState, data_node, ns, report, task};

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
