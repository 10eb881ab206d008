//! The object table (`core/src/state/objects.rs`): sealed copies publish their location as the
//! ephemeral resource `NS/object.O` on their node, a release deletes the copies and their
//! locations, a lost node takes its copies (an object left with none is lost, naming the node
//! and why), another namespace's object is unknown, and the table survives a snapshot.

mod state_support;

use escher_core::state::{
    ApplyError, ClusterState, Command, Entry, FIRST_SESSION, Reply, StateConfig,
};
use escher_proto::types::{
    Capacity, NodeId, NodeSpec, OBJECTS_LABEL, ObjectAccess, ObjectId, ObjectOwner, ObjectTicket,
    RESULT_ARGS_LABEL, SealedCopy, TaskId, TaskResult, TaskState, format_object_args,
    format_result_args, ticket_key,
};
use state_support::{TestState, data_node, ns, restored, seal, secret, task};

const SESSION: u64 = FIRST_SESSION;

fn copy(id: ObjectId, node: NodeId, namespace: Option<&str>) -> SealedCopy {
    SealedCopy {
        id,
        size: 1024,
        checksum: 0xdead_beef,
        owner: ObjectOwner::Session(id.owner()),
        namespace: namespace.map(ns),
        node,
    }
}

fn release(
    t: &mut TestState,
    ids: Vec<ObjectId>,
    namespace: Option<&str>,
) -> (Vec<ObjectId>, Vec<String>) {
    let out = t.apply(Command::ObjectsReleased {
        ids,
        namespace: namespace.map(ns),
        sees_everything: false,
    });
    match &out.reply {
        Reply::ObjectsReleased(unknown) => (unknown.clone(), out.fx()),
        other => panic!("ObjectsReleased replied {other:?}"),
    }
}

fn location(t: &TestState, node: NodeId, name: &str) -> Option<Capacity> {
    t.state.core().capacity(node, name)
}

#[test]
fn a_sealed_copy_publishes_its_location_and_a_release_deletes_it() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let id = ObjectId(SESSION, 0);
    assert!(seal(&mut t, vec![copy(id, a, Some("app"))]).is_empty());
    assert_eq!(
        location(&t, a, "app/object.9223372036854775808.0"),
        Some(Capacity::Unbounded)
    );
    assert_eq!(location(&t, b, "app/object.9223372036854775808.0"), None);

    // A second copy (a fetch sealed it) and the same report again (a retry) change nothing
    // but the holders.
    assert!(
        seal(
            &mut t,
            vec![copy(id, b, Some("app")), copy(id, a, Some("app"))]
        )
        .is_empty()
    );
    let view = t
        .state
        .locate_object(id, Some(&ns("app")), false, None)
        .unwrap();
    assert_eq!((view.size, view.checksum), (1024, 0xdead_beef));
    let holders: Vec<_> = view
        .holders
        .iter()
        .map(|h| (h.node, h.address.clone()))
        .collect();
    assert_eq!(
        holders,
        vec![
            (a, Some("a.example:7700".to_string())),
            (b, Some("b.example:7700".to_string()))
        ]
    );
    assert_eq!(t.state.objects().bytes_on(a), 1024);

    let (unknown, fx) = release(&mut t, vec![id], Some("app"));
    assert!(unknown.is_empty());
    assert_eq!(
        fx,
        vec![format!("delete {a} {id}"), format!("delete {b} {id}")]
    );
    for node in [a, b] {
        assert_eq!(location(&t, node, "app/object.9223372036854775808.0"), None);
    }
    let err = t
        .state
        .locate_object(id, Some(&ns("app")), false, None)
        .unwrap_err();
    assert_eq!(err, ApplyError::ObjectFreed(id));
    assert!(err.to_string().contains(&id.to_string()), "{err}");
    assert_eq!(t.state.objects().bytes_on(a), 0);

    // Released again: nothing; a copy of it reported late is not recorded, and says why.
    let (unknown, fx) = release(&mut t, vec![id], Some("app"));
    assert!(unknown.is_empty() && fx.is_empty());
    let dropped = seal(&mut t, vec![copy(id, a, Some("app"))]);
    assert_eq!(dropped.len(), 1);
    assert!(dropped[0].1.contains("freed"), "{dropped:?}");
    assert_eq!(location(&t, a, "app/object.9223372036854775808.0"), None);
}

#[test]
fn another_namespaces_object_is_unknown_and_not_its_to_release() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let id = ObjectId(SESSION, 3);
    seal(&mut t, vec![copy(id, a, Some("app"))]);
    for other in [Some(ns("other")), None] {
        let err = t
            .state
            .locate_object(id, other.as_ref(), false, None)
            .unwrap_err();
        assert_eq!(err, ApplyError::UnknownObject(id));
    }
    assert!(t.state.list_objects(Some(&ns("other")), false).is_empty());
    assert_eq!(t.state.list_objects(Some(&ns("app")), false).len(), 1);
    // An admin who sees everything sees it.
    assert!(t.state.locate_object(id, None, true, None).is_ok());

    let (unknown, fx) = release(&mut t, vec![id, ObjectId(SESSION, 99)], Some("other"));
    assert_eq!(unknown, vec![id, ObjectId(SESSION, 99)]);
    assert!(fx.is_empty());
    assert!(
        t.state
            .locate_object(id, Some(&ns("app")), false, None)
            .is_ok()
    );
    // A never-known id reads as unknown, not freed.
    assert_eq!(
        t.state
            .locate_object(ObjectId(SESSION, 99), Some(&ns("app")), false, None),
        Err(ApplyError::UnknownObject(ObjectId(SESSION, 99)))
    );
}

#[test]
fn a_lost_node_takes_its_copies_and_an_object_left_without_one_is_lost_naming_the_node() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let (both, only_a) = (ObjectId(SESSION, 0), ObjectId(SESSION, 1));
    seal(
        &mut t,
        vec![
            copy(both, a, None),
            copy(both, b, None),
            copy(only_a, a, None),
        ],
    );
    t.remove_node(a);
    let view = t.state.locate_object(both, None, false, None).unwrap();
    assert_eq!(view.holders.len(), 1);
    assert_eq!(view.holders[0].node, b);
    let err = t
        .state
        .locate_object(only_a, None, false, None)
        .unwrap_err();
    match &err {
        ApplyError::ObjectLost { id, node, reason } => {
            assert_eq!((*id, *node), (only_a, a));
            assert!(!reason.is_empty());
        }
        other => panic!("expected ObjectLost, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("1") && text.contains(&format!("node {a}")),
        "{text}"
    );
    // Listed, with why.
    let listed = t.state.list_objects(None, false);
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().any(|v| v.id == only_a && v.lost.is_some()));

    // A copy on a node that is gone is not recorded; releasing a lost object frees it.
    let dropped = seal(&mut t, vec![copy(ObjectId(SESSION, 2), a, None)]);
    assert!(dropped[0].1.contains("not live"), "{dropped:?}");
    let (unknown, fx) = release(&mut t, vec![only_a], None);
    assert!(unknown.is_empty() && fx.is_empty(), "{unknown:?} {fx:?}");
    assert_eq!(
        t.state.locate_object(only_a, None, false, None),
        Err(ApplyError::ObjectFreed(only_a))
    );
}

#[test]
fn a_copy_that_contradicts_its_object_is_refused_whole_and_changes_nothing() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let id = ObjectId(SESSION, 0);
    seal(&mut t, vec![copy(id, a, None)]);
    let mut bad = copy(id, b, None);
    bad.checksum = 1;
    let good = copy(ObjectId(SESSION, 1), b, None);
    // (`try_apply` checks that a refusal changed nothing and produced no effect.)
    let err = t
        .try_apply(Command::ObjectsSealed {
            copies: vec![good.clone(), bad],
        })
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::ObjectMismatch { id: i, .. } if i == id),
        "{err}"
    );
    assert!(err.to_string().contains("CRC-32C"), "{err}");
    // Two copies of one new object that disagree in one batch.
    let mut other = good.clone();
    other.size = 5;
    other.node = a;
    assert!(
        t.try_apply(Command::ObjectsSealed {
            copies: vec![good, other],
        })
        .is_err()
    );
}

#[test]
fn a_task_that_requests_an_objects_location_runs_where_the_copy_is() {
    let mut t = TestState::new();
    let _a = data_node(&mut t, "a");
    let b = data_node(&mut t, "b");
    let id = ObjectId(SESSION, 0);
    seal(&mut t, vec![copy(id, b, None)]);
    let name = format!("object.{id}");
    let (task_id, fx) = t.submit(task(&format!("cpu=1,{name}=1")));
    assert_eq!(fx, vec![format!("assign {task_id}->{b} #1")]);
    assert_eq!(t.state.task(task_id).unwrap().state, TaskState::Running);
}

#[test]
fn sessions_are_numbered_in_order_apart_from_the_task_ids() {
    let mut t = TestState::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        match t.apply(Command::OpenObjectSession).reply {
            Reply::ObjectSession(s) => seen.push(s),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![FIRST_SESSION, FIRST_SESSION + 1, FIRST_SESSION + 2]
    );
    assert_eq!(t.state.next_task_id().0, 1, "no task id was taken");
    let (task_id, _) = t.submit(task("cpu=1"));
    assert_eq!(
        task_id.0, 1,
        "a task after the sessions takes the first task id"
    );
    assert!(
        seen.iter().all(|&s| s >= FIRST_SESSION && s != task_id.0),
        "{seen:?} and {task_id}"
    );
}

#[test]
fn the_table_survives_a_snapshot_and_a_restored_state_decides_alike() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    seal(
        &mut t,
        vec![
            copy(ObjectId(SESSION, 0), a, None),
            copy(ObjectId(SESSION, 1), b, None),
        ],
    );
    release(&mut t, vec![ObjectId(SESSION, 1)], None);
    t.apply(Command::OpenObjectSession);

    let mut back = restored(&t);
    assert_eq!(back.objects(), t.state.objects());
    for node in [a, b] {
        assert_eq!(
            back.objects().held_by(node).collect::<Vec<_>>(),
            t.state.objects().held_by(node).collect::<Vec<_>>()
        );
    }
    assert_eq!(
        back.locate_object(ObjectId(SESSION, 1), None, false, None),
        Err(ApplyError::ObjectFreed(ObjectId(SESSION, 1)))
    );
    // The same next step on both gives the same reply.
    let next = |s: &mut ClusterState| s.apply(Entry::new(t.now, Command::OpenObjectSession));
    let mine = next(&mut t.state);
    assert_eq!(next(&mut back), mine);
}

#[test]
fn a_put_goes_to_the_emptiest_data_node_with_a_write_ticket_and_a_reader_gets_read_tickets() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    // A node without a data plane is never chosen.
    t.node("plain", "cpu=64");
    let app = Some(ns("app"));
    let id = ObjectId(SESSION, 0);
    let (node, address, ticket) = t.state.place_object(id, &app, 5_000).unwrap();
    assert_eq!((node, address.as_str()), (a, "a.example:7700"));
    let key = ticket_key(&secret("a").0);
    let parsed = ObjectTicket::verify(&ticket, &key).expect("signed with node a's key");
    assert_eq!(parsed.objects, vec![id]);
    assert_eq!(parsed.namespace.as_deref(), Some("app"));
    assert!(parsed.allows(a, id, ObjectAccess::Write, 4_000).is_ok());
    assert!(parsed.allows(a, id, ObjectAccess::Read, 4_000).is_err());

    seal(&mut t, vec![copy(id, a, Some("app"))]);
    // Node a holds bytes now: the next put goes to b.
    let next = ObjectId(SESSION, 1);
    assert_eq!(t.state.place_object(next, &app, 5_000).unwrap().0, b);

    let view = t
        .state
        .locate_object(id, app.as_ref(), false, Some(5_000))
        .unwrap();
    let read = ObjectTicket::verify(view.holders[0].ticket.as_ref().unwrap(), &key).unwrap();
    assert!(read.allows(a, id, ObjectAccess::Read, 4_000).is_ok());
    assert!(read.allows(a, next, ObjectAccess::Read, 4_000).is_err());
}

/// Seals one copy of `id` of `size` bytes on `node`, in the admin's namespace.
fn seal_sized(t: &mut TestState, id: ObjectId, size: u64, node: NodeId) {
    let mut c = copy(id, node, None);
    c.size = size;
    assert!(seal(t, vec![c]).is_empty());
}

fn with_args(resources: &str, ids: &[ObjectId]) -> state_support::TaskBuilder {
    task(resources).label(OBJECTS_LABEL, &format_object_args(ids))
}

#[test]
fn a_task_whose_argument_is_an_object_runs_where_a_copy_is_when_there_is_room() {
    let mut t = TestState::new();
    let (a, b, c) = (
        data_node(&mut t, "a"),
        data_node(&mut t, "b"),
        data_node(&mut t, "c"),
    );
    let small = ObjectId(SESSION, 0);
    let large = ObjectId(SESSION, 1);
    seal_sized(&mut t, small, 10, b);
    seal_sized(&mut t, large, 1000, c);
    // The largest argument's holder first, whatever order the caller gave.
    for _ in 0..3 {
        let (id, fx) = t.submit(with_args("cpu=1", &[small, large]));
        assert_eq!(fx, vec![format!("assign {id}->{c} #1")]);
        let label = t.state.task(id).unwrap().spec.labels.get(OBJECTS_LABEL);
        assert_eq!(label, Some(format_object_args(&[large, small]).as_str()));
    }
    // Node c has one cpu left: the next goes there, then the smaller object's holder has room.
    let (id, fx) = t.submit(with_args("cpu=1", &[large, small]));
    assert_eq!(fx, vec![format!("assign {id}->{c} #1")]);
    let (id, fx) = t.submit(with_args("cpu=4", &[large, small]));
    assert_eq!(fx, vec![format!("assign {id}->{b} #1")]);
    // No holder has room: it runs elsewhere at once, never waiting for them.
    let (id, fx) = t.submit(with_args("cpu=1", &[large, small]));
    assert_eq!(fx, vec![format!("assign {id}->{a} #1")]);
}

#[test]
fn a_task_whose_argument_object_is_unknown_freed_or_lost_is_refused_naming_it() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let b = data_node(&mut t, "b");
    let unknown = ObjectId(SESSION, 7);
    let refuse = |t: &mut TestState, ids: &[ObjectId]| {
        t.try_apply(Command::Submit {
            tasks: vec![with_args("cpu=1", ids).build()],
            namespace: None,
        })
        .unwrap_err()
    };
    assert_eq!(
        refuse(&mut t, &[unknown]),
        ApplyError::UnknownObject(unknown)
    );

    let freed = ObjectId(SESSION, 1);
    seal_sized(&mut t, freed, 10, a);
    release(&mut t, vec![freed], None);
    assert_eq!(refuse(&mut t, &[freed]), ApplyError::ObjectFreed(freed));

    let lost = ObjectId(SESSION, 2);
    seal_sized(&mut t, lost, 10, b);
    t.remove_node(b);
    let err = refuse(&mut t, &[lost]);
    assert!(
        matches!(&err, ApplyError::ObjectLost { id, node, .. } if *id == lost && *node == b),
        "{err:?}"
    );
    // Another namespace's object is unknown to this one's task.
    let theirs = ObjectId(SESSION, 3);
    assert!(seal(&mut t, vec![copy(theirs, a, Some("other"))]).is_empty());
    let err = t
        .try_apply(Command::Submit {
            tasks: vec![with_args("cpu=1", &[theirs]).build()],
            namespace: Some(ns("app")),
        })
        .unwrap_err();
    assert_eq!(err, ApplyError::UnknownObject(theirs));
    // A label that names no object is refused as such.
    let err = t
        .try_apply(Command::Submit {
            tasks: vec![task("cpu=1").label(OBJECTS_LABEL, "seven").build()],
            namespace: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains(OBJECTS_LABEL), "{err}");
}

#[test]
fn a_restored_state_keeps_a_pending_tasks_preference() {
    let mut t = TestState::new();
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let id = ObjectId(SESSION, 0);
    seal_sized(&mut t, id, 10, b);
    // Fill both nodes, then queue a task that prefers b.
    let (first, _) = t.submit(task("cpu=4"));
    let (second, _) = t.submit(task("cpu=4"));
    let (waiting, fx) = t.submit(with_args("cpu=1", &[id]));
    assert!(fx.is_empty(), "{fx:?}");

    let config = bincode::config::standard();
    let image = bincode::serde::encode_to_vec(&t.state, config).unwrap();
    let (state, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(&image, config).unwrap();
    let mut back = state.restore(StateConfig::default());
    back.set_objects(t.state.objects().clone());
    assert_eq!(
        back.core().preference(waiting),
        t.state.core().preference(waiting)
    );
    assert!(back.core().preference(waiting).is_some());
    // The same next step on both decides alike: node b's task ends, the waiting one runs there.
    let on_b = if t.state.task(first).unwrap().node == Some(b) {
        first
    } else {
        second
    };
    assert_ne!(t.state.task(on_b).unwrap().node, Some(a));
    let report = state_support::report(on_b, 1, Ok(TaskResult::Exited { code: 0 }));
    let done =
        |s: &mut ClusterState| s.apply(Entry::new(t.now, Command::TaskFinished(report.clone())));
    let mine = done(&mut t.state);
    assert_eq!(done(&mut back), mine);
    assert_eq!(back.task(waiting).unwrap().node, Some(b));
}

#[test]
fn a_namespaces_objects_past_its_byte_quota_are_refused_whole_naming_the_quota() {
    let mut t = TestState::with_config(StateConfig {
        namespace_object_bytes: 2048,
        ..StateConfig::default()
    });
    let (a, b) = (data_node(&mut t, "a"), data_node(&mut t, "b"));
    let app = Some("app");
    let first = ObjectId(SESSION, 0);
    assert!(seal(&mut t, vec![copy(first, a, app)]).is_empty());
    // A second copy of the same object counts nothing more.
    assert!(seal(&mut t, vec![copy(first, b, app)]).is_empty());
    assert_eq!(t.state.objects().namespace_bytes(&ns("app")), 1024);

    // Two more objects of 1024 bytes: past 2048, the batch is refused whole.
    let (second, third) = (ObjectId(SESSION, 1), ObjectId(SESSION, 2));
    let err = t
        .try_apply(Command::ObjectsSealed {
            copies: vec![copy(second, a, app), copy(third, a, app)],
        })
        .unwrap_err();
    assert_eq!(
        err,
        ApplyError::ObjectBytesExceeded {
            namespace: ns("app"),
            stored: 1024,
            asked: 2048,
            limit: 2048
        }
    );
    assert!(
        err.to_string().contains("--namespace-object-bytes"),
        "{err}"
    );
    assert!(t.state.objects().get(second).is_none());
    assert!(t.state.check_object_bytes(Some(&ns("app")), 1025).is_err());
    // Another namespace and the admin have their own count (the admin none).
    assert!(seal(&mut t, vec![copy(second, a, Some("other"))]).is_empty());
    assert!(seal(&mut t, vec![copy(third, a, None)]).is_empty());
    // Released, the bytes come back.
    release(&mut t, vec![first], app);
    assert_eq!(t.state.objects().namespace_bytes(&ns("app")), 0);
    let fourth = ObjectId(SESSION, 3);
    let mut big = copy(fourth, a, app);
    big.size = 2048;
    assert!(seal(&mut t, vec![big]).is_empty());
}

/// Submits a function task with `retries`, runs it on the only node that fits (`only=1`), and
/// reports its 1 MiB result kept as an object there; the task and its node.
fn result_made(t: &mut TestState, retries: u32) -> (escher_proto::types::TaskId, NodeId) {
    let (id, fx) = t.submit(task("cpu=1").function("make").retries(retries));
    assert_eq!(fx.len(), 1, "{fx:?}");
    let node = t.status(id).node.expect("placed");
    let result = TaskResult::Object {
        size: 1 << 20,
        checksum: 0x1234_5678,
    };
    t.finish(state_support::report(id, 1, Ok(result)));
    (id, node)
}

#[test]
fn a_result_object_is_recorded_with_its_tasks_completion() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let (id, node) = result_made(&mut t, 0);
    assert_eq!(node, a);
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    let view = t
        .state
        .locate_object(ObjectId::task_result(id), None, false, None)
        .unwrap();
    assert_eq!(
        (view.size, view.checksum, view.owner),
        (1 << 20, 0x1234_5678, ObjectOwner::Task(id))
    );
    assert_eq!(view.holders.len(), 1);
    assert_eq!(view.holders[0].node, a);
    let name = format!("object.{}", ObjectId::task_result(id));
    assert_eq!(location(&t, a, &name), Some(Capacity::Unbounded));
    state_support::check_invariants(&t.state);
}

#[test]
fn a_lost_result_whose_task_has_a_retry_left_is_rebuilt_under_its_id() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let (id, _) = result_made(&mut t, 1);
    let b = data_node(&mut t, "b");
    let object = ObjectId::task_result(id);
    // The holder is lost: the task runs again (attempt 2, on the other node) in the same
    // command, and the object waits with no copy and no loss.
    let fx = t.remove_node(a);
    assert!(fx.contains(&format!("assign {id}->{b} #2")), "{fx:?}");
    let status = t.status(id);
    assert_eq!((status.state, status.attempt), (TaskState::Running, 2));
    let view = t.state.locate_object(object, None, false, None).unwrap();
    assert!(view.holders.is_empty() && view.lost.is_none(), "{view:?}");
    // Its completion records the new copy (a rebuild may give other bytes: they replace).
    let result = TaskResult::Object {
        size: 1 << 20,
        checksum: 0x0bad_cafe,
    };
    t.finish(state_support::report(id, 2, Ok(result)));
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    let view = t.state.locate_object(object, None, false, None).unwrap();
    assert_eq!(view.checksum, 0x0bad_cafe);
    assert_eq!(view.holders.len(), 1);
    assert_eq!(view.holders[0].node, b);
    state_support::check_invariants(&t.state);
}

#[test]
fn a_lost_result_whose_task_has_no_retry_left_is_lost_saying_why() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let (id, _) = result_made(&mut t, 0);
    data_node(&mut t, "b");
    let fx = t.remove_node(a);
    assert!(!fx.iter().any(|f| f.starts_with("assign")), "{fx:?}");
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    let object = ObjectId::task_result(id);
    match t.state.locate_object(object, None, false, None) {
        Err(ApplyError::ObjectLost {
            id: got,
            node,
            reason,
        }) => {
            assert_eq!((got, node), (object, a));
            assert!(reason.contains("no retry left"), "{reason}");
        }
        other => panic!("expected ObjectLost, got {other:?}"),
    }
}

#[test]
fn a_reported_copy_of_a_task_result_not_yet_produced_is_refused_and_changes_nothing() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let b = data_node(&mut t, "b");
    // A task still running: no node may claim its result yet.
    let (running, _) = t.submit(task("cpu=1").function("make"));
    let object = ObjectId::task_result(running);
    let fake = SealedCopy {
        id: object,
        size: 1 << 20,
        checksum: 0x1234_5678,
        owner: ObjectOwner::Task(running),
        namespace: None,
        node: b,
    };
    // (`try_apply` checks that a refusal changed nothing and produced no effect.)
    let err = t
        .try_apply(Command::ObjectsSealed {
            copies: vec![fake.clone()],
        })
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::ObjectMismatch { id, .. } if id == object),
        "{err}"
    );
    assert!(err.to_string().contains("has not produced it"), "{err}");
    assert!(t.state.locate_object(object, None, false, None).is_err());
    // An id that is not its owner's result is refused too.
    let mut misnamed = fake.clone();
    misnamed.id = ObjectId(object.owner(), 1);
    assert!(
        t.try_apply(Command::ObjectsSealed {
            copies: vec![misnamed],
        })
        .is_err()
    );
    // Once the task succeeded with its result, another node's copy counts.
    let result = TaskResult::Object {
        size: 1 << 20,
        checksum: 0x1234_5678,
    };
    t.finish(state_support::report(running, 1, Ok(result)));
    assert_eq!(t.task_state(running), TaskState::Succeeded);
    let holder = t.status(running).node.expect("placed");
    let mut replica = fake;
    replica.node = if holder == a { b } else { a };
    assert!(seal(&mut t, vec![replica]).is_empty());
    let view = t.state.locate_object(object, None, false, None).unwrap();
    assert_eq!(view.holders.len(), 2);
    state_support::check_invariants(&t.state);
}

/// A result object's copy that the table will never count is deleted where it was made: a
/// completion refused (here: past its namespace's byte quota) tells its node to delete the
/// copy, and so does the late report of an attempt given up (its node was counted lost, the
/// task ran again elsewhere), while the attempt that is recorded keeps its copy.
#[test]
fn a_result_copy_the_table_does_not_count_is_deleted_where_it_was_made() {
    let mut t = TestState::with_config(StateConfig {
        namespace_object_bytes: 1 << 20,
        ..StateConfig::default()
    });
    let a = data_node(&mut t, "a");
    let b = data_node(&mut t, "b");

    // Refused: 2 MiB in a namespace of at most 1 MiB. The attempt fails saying why, and its
    // node deletes the copy it sealed.
    let (ids, _) = t.submit_in(Some("app"), vec![task("cpu=1").function("make").build()]);
    let big = ids[0];
    let node = t.status(big).node.expect("placed");
    let result = TaskResult::Object {
        size: 2 << 20,
        checksum: 7,
    };
    let fx = t.finish(state_support::report(big, 1, Ok(result)));
    let object = ObjectId::task_result(big);
    assert!(fx.contains(&format!("delete {node} {object}")), "{fx:?}");
    let status = t.status(big);
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert!(
        status
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("not recorded"),
        "{status:?}"
    );
    assert!(t.state.locate_object(object, None, true, None).is_err());

    // Given up: attempt 1 runs on `a`, `a` is counted lost, attempt 2 runs on `b`; `a`'s late
    // report of attempt 1 with a result object tells `a` to delete it, and changes nothing else.
    let (id, fx) = t.submit(task("cpu=1").function("make").retries(1));
    let first = t.status(id).node.expect("placed");
    assert!(fx.contains(&format!("assign {id}->{first} #1")), "{fx:?}");
    let other = if first == a { b } else { a };
    let fx = t.remove_node(first);
    assert!(fx.contains(&format!("assign {id}->{other} #2")), "{fx:?}");
    let result = TaskResult::Object {
        size: 1 << 10,
        checksum: 9,
    };
    let object = ObjectId::task_result(id);
    let fx = t.finish(state_support::report(id, 1, Ok(result.clone())));
    assert_eq!(fx, vec![format!("delete {first} {object}")]);
    assert_eq!(t.status(id).state, TaskState::Running);
    // Attempt 2's completion is recorded, and deletes nothing.
    let fx = t.finish(state_support::report(id, 2, Ok(result)));
    assert!(!fx.iter().any(|f| f.starts_with("delete")), "{fx:?}");
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    let view = t.state.locate_object(object, None, false, None).unwrap();
    assert_eq!(view.holders.len(), 1);
    assert_eq!(view.holders[0].node, other);
    // A second late report of attempt 1 (the worker sent it again) deletes again on `first`
    // only: never on the holder.
    let fx = t.finish(state_support::report(
        id,
        1,
        Ok(TaskResult::Object {
            size: 1 << 10,
            checksum: 9,
        }),
    ));
    assert_eq!(fx, vec![format!("delete {first} {object}")]);
    state_support::check_invariants(&t.state);
}

#[test]
fn a_task_reading_another_tasks_result_runs_where_that_result_is_kept_when_there_is_room() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    // Node a is full while the result is made, so it is made on b; then a is empty again.
    let (blocker, fx) = t.submit(task("cpu=4"));
    assert_eq!(fx, vec![format!("assign {blocker}->{a} #1")]);
    let b = data_node(&mut t, "b");
    let (producer, made_on) = result_made(&mut t, 0);
    assert_eq!(made_on, b);
    t.finish(state_support::report(
        blocker,
        1,
        Ok(TaskResult::Exited { code: 0 }),
    ));
    let reads = |resources: &str, tasks: &[TaskId]| {
        task(resources).label(RESULT_ARGS_LABEL, &format_result_args(tasks))
    };
    // A reader that waits for a signal (Python's dataflow: raised on every node once the
    // result is made) goes to the holder when the signal comes.
    let (waiting, fx) = t.submit(reads("cpu=1,signal-7=1", &[producer]));
    assert!(fx.is_empty(), "{fx:?}");
    let every = NodeSpec::Match {
        resources: Default::default(),
        num_nodes: None,
    };
    let out = t
        .set_resources(
            None,
            vec![state_support::set("signal-7", "unbounded", every)],
        )
        .unwrap();
    assert!(
        out.fx().contains(&format!("assign {waiting}->{b} #1")),
        "{:?}",
        out.fx()
    );
    t.finish(state_support::report(
        waiting,
        1,
        Ok(TaskResult::Exited { code: 0 }),
    ));
    // Without the label a task goes to a (the first node with room); a reader of the result
    // goes to b, which holds it, while b has room.
    let (plain, fx) = t.submit(task("cpu=1"));
    assert_eq!(fx, vec![format!("assign {plain}->{a} #1")]);
    for _ in 0..4 {
        let (id, fx) = t.submit(reads("cpu=1", &[producer]));
        assert_eq!(fx, vec![format!("assign {id}->{b} #1")]);
    }
    // b is full: the next runs on a at once, never waiting for the holder.
    let (id, fx) = t.submit(reads("cpu=1", &[producer]));
    assert_eq!(fx, vec![format!("assign {id}->{a} #1")]);
    // A result that is no object (its task still runs) gives no preference and no wait.
    let (id, fx) = t.submit(reads("cpu=1", &[plain]));
    assert_eq!(fx, vec![format!("assign {id}->{a} #1")]);
    // A label that names no task is refused as such, and nothing is added.
    let before = t.state.task_ids().count();
    let err = t
        .try_apply(Command::Submit {
            tasks: vec![task("cpu=1").label(RESULT_ARGS_LABEL, "7+seven").build()],
            namespace: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains(RESULT_ARGS_LABEL), "{err}");
    assert_eq!(t.state.task_ids().count(), before);
}
