//! A returning worker's copies against the object table (`core/src/state/reconcile.rs`,
//! `ClusterState::held_copy`): a node declared lost comes back with files the table no longer
//! counts; what is still wanted is adopted (a lost `put` readable again, a rebuilt result given
//! a second copy of the same bytes), what is not (released, contradicting, a result lineage is
//! making again) is dropped, and a result whose task still runs on the node is left to its
//! completion. Each adoption is an `ObjectsSealed` of its own, as the head proposes it.

mod state_support;

use escher_core::state::{ApplyError, Command, FIRST_SESSION, HeldVerdict, Reply};
use escher_proto::types::{
    HeldCopy, NodeId, ObjectId, ObjectOwner, SealedCopy, TaskId, TaskResult, TaskState,
};
use state_support::{TestState, data_node, ns, report, seal, task};

const SESSION: u64 = FIRST_SESSION;
const SIZE: u64 = 1 << 20;
const CRC: u32 = 0x1234_5678;

/// A copy of `id` the worker holds, of [`SIZE`] bytes and CRC-32C `crc`, in namespace `ns`.
fn held(id: ObjectId, crc: u32, namespace: Option<&str>) -> HeldCopy {
    HeldCopy {
        id,
        size: SIZE,
        checksum: crc,
        namespace: namespace.map(ns),
        copy: 1,
    }
}

fn sealed(id: ObjectId, node: NodeId, namespace: Option<&str>) -> SealedCopy {
    SealedCopy {
        id,
        size: SIZE,
        checksum: CRC,
        owner: ObjectOwner::Session(id.owner()),
        namespace: namespace.map(ns),
        node,
    }
}

/// Adopts `verdict`'s copy as the head does (an `ObjectsSealed` of its own).
fn adopt(t: &mut TestState, verdict: HeldVerdict) -> Result<Vec<(ObjectId, String)>, ApplyError> {
    let HeldVerdict::Adopt(copy) = verdict else {
        panic!("expected an adoption, got {verdict:?}");
    };
    match t
        .try_apply(Command::ObjectsSealed { copies: vec![copy] })?
        .reply
    {
        Reply::ObjectsSealed(dropped) => Ok(dropped),
        other => panic!("ObjectsSealed replied {other:?}"),
    }
}

fn dropped(verdict: HeldVerdict, why: &str) {
    match verdict {
        HeldVerdict::Drop(reason) => assert!(reason.contains(why), "{reason}"),
        other => panic!("expected a drop ({why}), got {other:?}"),
    }
}

fn holders(t: &TestState, id: ObjectId) -> Vec<NodeId> {
    let view = t.state.object_view(id, None, true).unwrap();
    view.holders.iter().map(|h| h.node).collect()
}

/// Submits a function task with `retries` that runs on node `node` (the only one that fits
/// when it is submitted) and reports its result as an object of [`SIZE`] bytes and `crc`.
fn result_on(t: &mut TestState, retries: u32, crc: u32) -> TaskId {
    let (id, _) = t.submit(task("cpu=1").function("make").retries(retries));
    let result = TaskResult::Object {
        size: SIZE,
        checksum: crc,
    };
    t.finish(report(id, 1, Ok(result)));
    assert_eq!(t.task_state(id), TaskState::Succeeded);
    id
}

#[test]
fn a_returning_node_gets_back_what_is_still_wanted_and_drops_the_rest() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let opened = t.apply(Command::OpenObjectSession).reply;
    assert!(
        matches!(opened, Reply::ObjectSession(SESSION)),
        "{opened:?}"
    );
    let made = result_on(&mut t, 0, CRC);
    let b = data_node(&mut t, "b");
    let (kept, freed, both) = (
        ObjectId(SESSION, 0),
        ObjectId(SESSION, 1),
        ObjectId(SESSION, 2),
    );
    seal(
        &mut t,
        vec![
            sealed(kept, a, Some("app")),
            sealed(freed, a, Some("app")),
            sealed(both, a, None),
            sealed(both, b, None),
        ],
    );
    // Counted on a live node: nothing to do, whatever the copy.
    assert_eq!(
        t.state.held_copy(a, &held(kept, CRC, Some("app"))),
        HeldVerdict::Counted
    );

    t.remove_node(a);
    // While the node is not live its copies are left for its next attach.
    assert!(matches!(
        t.state.held_copy(a, &held(kept, CRC, Some("app"))),
        HeldVerdict::Leave(_)
    ));
    let freed_out = t.apply(Command::ObjectsReleased {
        ids: vec![freed],
        namespace: Some(ns("app")),
        sees_everything: false,
    });
    assert!(matches!(freed_out.reply, Reply::ObjectsReleased(ref u) if u.is_empty()));
    t.rejoin(a, "a", 2, &[], Vec::new()).unwrap();

    // What the table wants back: the lost put, the lost result, a second copy of `both`, and
    // a put of a session it gave out that it never heard of (its client's report may be on
    // its way).
    let unknown = ObjectId(SESSION, 9);
    for (copy, namespace) in [
        (kept, Some("app")),
        (ObjectId::task_result(made), None),
        (both, None),
        (unknown, Some("app")),
    ] {
        let verdict = t.state.held_copy(a, &held(copy, CRC, namespace));
        assert!(adopt(&mut t, verdict).unwrap().is_empty(), "{copy}");
        assert!(holders(&t, copy).contains(&a), "{copy}");
        assert_eq!(
            t.state.held_copy(a, &held(copy, CRC, namespace)),
            HeldVerdict::Counted
        );
    }
    let view = t
        .state
        .locate_object(kept, Some(&ns("app")), false, None)
        .expect("the lost put is readable again");
    assert!(view.lost.is_none());
    assert_eq!(holders(&t, both), vec![a, b]);
    assert_eq!(
        t.state.object_view(unknown, None, true).unwrap().namespace,
        Some(ns("app"))
    );

    // What it does not: released, another checksum, size or namespace, a result of a task
    // that never made it.
    dropped(
        t.state.held_copy(a, &held(freed, CRC, Some("app"))),
        "was freed",
    );
    let mut other = held(ObjectId(SESSION, 3), CRC, None);
    seal(&mut t, vec![sealed(other.id, b, None)]);
    other.checksum = 0xbad;
    dropped(t.state.held_copy(a, &other), "CRC-32C");
    other.checksum = CRC;
    other.size = 7;
    dropped(t.state.held_copy(a, &other), "bytes");
    other.size = SIZE;
    other.namespace = Some(ns("elsewhere"));
    dropped(t.state.held_copy(a, &other), "namespace");
    dropped(
        t.state.held_copy(a, &held(ObjectId(999, 0), CRC, None)),
        "does not run on node",
    );
    // A put of a session this head never gave out (a state restored from an older backup).
    dropped(
        t.state
            .held_copy(a, &held(ObjectId(SESSION + 1, 0), CRC, None)),
        "never gave out",
    );
    dropped(
        t.state.held_copy(a, &held(ObjectId(made.0, 3), CRC, None)),
        "no result of task",
    );
    state_support::check_invariants(&t.state);
}

#[test]
fn a_result_lineage_makes_again_is_dropped_until_rebuilt_then_a_second_copy_if_the_same() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let same = result_on(&mut t, 1, CRC);
    let other = result_on(&mut t, 1, CRC);
    let b = data_node(&mut t, "b");
    // Lost with a: both run again on b (in the same command), before a comes back.
    t.remove_node(a);
    t.rejoin(a, "a", 2, &[], Vec::new()).unwrap();
    for task in [same, other] {
        let status = t.status(task);
        assert_eq!(
            (status.state, status.attempt, status.node),
            (TaskState::Running, 2, Some(b))
        );
        // A copy from before is not the rebuild's.
        dropped(
            t.state
                .held_copy(a, &held(ObjectId::task_result(task), CRC, None)),
            "makes object",
        );
    }
    // Rebuilt: the same bytes gain the old copy, other bytes drop it.
    for (task, crc) in [(same, CRC), (other, 0x0bad_cafe)] {
        let result = TaskResult::Object {
            size: SIZE,
            checksum: crc,
        };
        t.finish(report(task, 2, Ok(result)));
        assert_eq!(holders(&t, ObjectId::task_result(task)), vec![b]);
    }
    let verdict = t
        .state
        .held_copy(a, &held(ObjectId::task_result(same), CRC, None));
    assert!(adopt(&mut t, verdict).unwrap().is_empty());
    assert_eq!(holders(&t, ObjectId::task_result(same)), vec![a, b]);
    dropped(
        t.state
            .held_copy(a, &held(ObjectId::task_result(other), CRC, None)),
        "CRC-32C",
    );
    state_support::check_invariants(&t.state);
}

#[test]
fn a_result_whose_task_runs_on_the_node_is_left_to_its_completion() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    let (running, _) = t.submit(task("cpu=1").function("make"));
    let copy = held(ObjectId::task_result(running), CRC, None);
    // Sealed, its completion not committed yet: neither adopted nor dropped.
    assert!(matches!(
        t.state.held_copy(a, &copy),
        HeldVerdict::Leave(ref why) if why.contains("runs on node")
    ));
    let result = TaskResult::Object {
        size: SIZE,
        checksum: CRC,
    };
    t.finish(report(running, 1, Ok(result)));
    assert_eq!(t.state.held_copy(a, &copy), HeldVerdict::Counted);
}

#[test]
fn an_adoption_refused_at_commit_refuses_only_its_own_copy() {
    let mut t = TestState::new();
    let a = data_node(&mut t, "a");
    t.apply(Command::OpenObjectSession);
    let (first, second) = (ObjectId(SESSION, 0), ObjectId(SESSION, 1));
    let verdicts = [
        t.state.held_copy(a, &held(first, CRC, None)),
        t.state.held_copy(a, &held(second, CRC, None)),
    ];
    // Meanwhile another copy of `first` with other bytes was recorded: its adoption is refused
    // (the head then has the worker drop it), the other's goes through.
    let b = data_node(&mut t, "b");
    let mut contrary = sealed(first, b, None);
    contrary.checksum = 0xbad;
    seal(&mut t, vec![contrary]);
    let [first_verdict, second_verdict] = verdicts;
    let err = adopt(&mut t, first_verdict).unwrap_err();
    assert!(
        matches!(err, ApplyError::ObjectMismatch { id, .. } if id == first),
        "{err:?}"
    );
    assert!(adopt(&mut t, second_verdict).unwrap().is_empty());
    assert_eq!(holders(&t, first), vec![b]);
    assert_eq!(holders(&t, second), vec![a]);
}
