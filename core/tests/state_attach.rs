//! A node takes tasks only once its worker's stream is attached (`state/nodes.rs`): a node
//! registered with `RegisterNodeUnattached` or `RejoinNodeUnattached` is live but given
//! nothing until `NodeAttached` of its current boot, across a snapshot, a return of the same
//! process, a restart, a drain and its loss.

mod state_support;

use escher_core::state::{ClusterState, Command, Effect, Entry, Reply, Returning, StateConfig};
use escher_proto::types::{NodeId, TaskId, TaskState};
use state_support::{CLUSTER, TestState, joining, secret, task};

/// Registers `name` as a node that waits for its stream; its id.
fn register_unattached(t: &mut TestState, name: &str, resources: &str, boot: u64) -> NodeId {
    let out = t.apply(Command::RegisterNodeUnattached {
        worker: joining(name, resources, boot),
        secret: secret(name),
    });
    assert!(out.effects.is_empty(), "{:?}", out.effects);
    match out.reply {
        Reply::Registered(id) => id,
        other => panic!("RegisterNodeUnattached replied {other:?}"),
    }
}

/// The nodes that `effects` assign tasks to, one per assignment.
fn assigned_to(effects: &[Effect]) -> Vec<NodeId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Assign { node, .. } => Some(*node),
            _ => None,
        })
        .collect()
}

fn attached(t: &mut TestState, node: NodeId, boot: u64) -> Vec<Effect> {
    t.apply(Command::NodeAttached { node, boot }).effects
}

/// Submits `n` tasks of `cpu=1` (each retried once); their ids and the nodes they were assigned to.
fn submit(t: &mut TestState, n: usize) -> (Vec<TaskId>, Vec<NodeId>) {
    let out = t.apply(Command::Submit {
        tasks: (0..n).map(|_| task("cpu=1").retries(1).build()).collect(),
        namespace: None,
    });
    let Reply::Submitted(ids) = out.reply else {
        panic!("Submit replied {:?}", out.reply);
    };
    (ids, assigned_to(&out.effects))
}

#[test]
fn a_node_that_never_attaches_is_given_no_task_and_its_loss_fails_none() {
    let mut t = TestState::new();
    // The bigger node, which placement would prefer, registers first and never attaches.
    let silent = register_unattached(&mut t, "silent", "cpu=64", 1);
    let real = register_unattached(&mut t, "real", "cpu=4", 1);
    assert!(t.state.node_alive(silent) && t.state.waits_for_stream(silent));
    let (_, before) = submit(&mut t, 2);
    assert_eq!(before, [], "no node is attached yet");
    let placed = assigned_to(&attached(&mut t, real, 1));
    assert_eq!(
        placed,
        [real, real],
        "the waiting tasks go to the attached node"
    );
    assert!(!t.state.waits_for_stream(real));

    let (ids, placed) = submit(&mut t, 18);
    assert!(placed.iter().all(|n| *n == real), "{placed:?}");
    assert!(
        t.state.core().node(silent).is_none(),
        "nothing of it is in the core"
    );

    // It is declared lost: nothing ran there, so nothing fails.
    let lost = t.remove_node(silent);
    assert!(lost.is_empty(), "{lost:?}");
    for id in ids {
        let status = t.state.status(id).unwrap();
        assert_ne!(status.node, Some(silent), "{status:?}");
        assert_ne!(status.state, TaskState::Failed, "{status:?}");
    }
}

/// The cluster status says which live nodes take tasks, so that a policy reading capacity or
/// choosing nodes from it (`NodeStatus::takes_tasks`) does not count a node that waits for its
/// stream: live, no resources shown, nothing placed there.
#[test]
fn the_status_shows_a_node_waiting_for_its_stream_as_taking_no_task() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 1);
    let shown = |t: &TestState| {
        let status = t.state.cluster_status();
        status.node(node).expect("the node is listed").clone()
    };
    let waiting = shown(&t);
    assert!(waiting.alive && waiting.waiting_for_stream, "{waiting:?}");
    assert!(!waiting.takes_tasks());
    assert!(waiting.resources.is_empty(), "{waiting:?}");

    attached(&mut t, node, 1);
    let serving = shown(&t);
    assert!(serving.alive && !serving.waiting_for_stream, "{serving:?}");
    assert!(serving.takes_tasks());
    assert!(serving.resource("cpu").is_some(), "{serving:?}");

    // A node that left neither waits nor takes tasks.
    t.remove_node(node);
    let gone = shown(&t);
    assert!(
        !gone.alive && !gone.waiting_for_stream && !gone.takes_tasks(),
        "{gone:?}"
    );
}

#[test]
fn only_the_stream_of_the_current_boot_admits_a_node() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 7);
    let (id, placed) = submit(&mut t, 1);
    assert_eq!(placed, []);
    // A stream of an earlier process of the node changes nothing.
    assert!(attached(&mut t, node, 6).is_empty());
    assert!(t.state.waits_for_stream(node));
    assert_eq!(assigned_to(&attached(&mut t, node, 7)), [node]);
    // A second NodeAttached (a stream opened again) changes nothing either.
    assert!(attached(&mut t, node, 7).is_empty());
    assert_eq!(t.state.status(id[0]).unwrap().state, TaskState::Running);
    // An unknown node is refused.
    let err = t
        .try_apply(Command::NodeAttached {
            node: NodeId(99),
            boot: 1,
        })
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// `RejoinNodeUnattached` of node `node` named `name`, from boot `boot`, running `running`.
fn rejoin(t: &mut TestState, node: NodeId, name: &str, boot: u64, running: &[(TaskId, u32)]) {
    let back = Returning {
        cluster: CLUSTER.into(),
        node,
        secret: secret(name),
        running: running
            .iter()
            .map(|&(task_id, attempt)| escher_proto::types::RunningTask { task_id, attempt })
            .collect(),
        finished: Vec::new(),
    };
    t.apply(Command::RejoinNodeUnattached {
        worker: joining(name, "cpu=2", boot),
        back,
    });
}

#[test]
fn the_same_process_returning_keeps_its_tasks_and_a_restarted_one_waits_again() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 1);
    attached(&mut t, node, 1);
    let (ids, placed) = submit(&mut t, 1);
    assert_eq!(placed, [node]);
    let running = t.state.status(ids[0]).unwrap();

    // The same process finds a new leader: it still takes tasks, its task runs on.
    rejoin(&mut t, node, "w", 1, &[(ids[0], running.attempt)]);
    assert!(!t.state.waits_for_stream(node));
    let (_, placed) = submit(&mut t, 1);
    assert_eq!(placed, [node]);

    // A restarted process lost its tasks: it takes none until its stream attaches.
    rejoin(&mut t, node, "w", 2, &[]);
    assert!(t.state.waits_for_stream(node));
    let retried = t.state.status(ids[0]).unwrap();
    assert_eq!(retried.state, TaskState::Pending, "{retried:?}");
    let (_, placed) = submit(&mut t, 1);
    assert_eq!(placed, []);
    let placed = assigned_to(&attached(&mut t, node, 2));
    assert_eq!(placed, [node, node], "the retried task and the new one");

    // A node that waits and returns as the same process still waits.
    let other = register_unattached(&mut t, "v", "cpu=2", 5);
    rejoin(&mut t, other, "v", 5, &[]);
    assert!(t.state.waits_for_stream(other));
}

#[test]
fn a_node_that_drains_before_it_attaches_takes_nothing_once_it_does() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 1);
    t.apply(Command::DrainNode { node });
    let (ids, _) = submit(&mut t, 1);
    assert!(attached(&mut t, node, 1).is_empty());
    assert!(t.state.node_draining(node));
    let status = t.state.status(ids[0]).unwrap();
    assert_eq!(status.state, TaskState::Pending, "{status:?}");
}

#[test]
fn a_snapshot_keeps_a_node_waiting_and_the_restored_state_admits_it_alike() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 1);
    submit(&mut t, 1);
    let bytes = bincode::serde::encode_to_vec(&t.state, bincode::config::standard()).unwrap();
    let (image, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    let mut restored = image.restore(StateConfig::default());
    assert!(restored.waits_for_stream(node));
    let entry = Entry::new(t.now, Command::NodeAttached { node, boot: 1 });
    restored.apply(entry).unwrap();
    assert_eq!(assigned_to(&restored.take_effects()), [node]);
    assert_eq!(assigned_to(&attached(&mut t, node, 1)), [node]);
}

#[test]
fn a_returning_worker_is_told_to_stop_a_given_up_attempt_before_it_runs_the_next() {
    let mut t = TestState::new();
    let node = register_unattached(&mut t, "w", "cpu=2", 1);
    attached(&mut t, node, 1);
    let (ids, placed) = submit(&mut t, 1);
    assert_eq!(placed, [node]);
    let first = t.state.status(ids[0]).unwrap().attempt;

    // The head gives the attempt up (its node came back as boot 2) and places the next
    // attempt on the same node.
    rejoin(&mut t, node, "w", 2, &[(ids[0], first)]);
    let placed = assigned_to(&attached(&mut t, node, 2));
    assert_eq!(placed, [node]);
    let second = t.state.status(ids[0]).unwrap().attempt;
    assert!(second > first, "{first} then {second}");

    // The worker returns on a new stream still running the first attempt (the cancel was
    // lost with the old stream) and not the second (its assignment was lost too).
    let back = Returning {
        cluster: CLUSTER.into(),
        node,
        secret: secret("w"),
        running: vec![escher_proto::types::RunningTask {
            task_id: ids[0],
            attempt: first,
        }],
        finished: Vec::new(),
    };
    let effects = t
        .apply(Command::RejoinNodeUnattached {
            worker: joining("w", "cpu=2", 2),
            back,
        })
        .effects;
    let at = |wanted: u32, cancel: bool| {
        effects.iter().position(|e| match e {
            Effect::Cancel { task, attempt, .. } => cancel && *task == ids[0] && *attempt == wanted,
            Effect::Assign { assignment, .. } => {
                !cancel && assignment.task_id == ids[0] && assignment.attempt == wanted
            }
            _ => false,
        })
    };
    let cancel = at(first, true).expect("the first attempt is cancelled");
    let assign = at(second, false).expect("the second attempt is sent again");
    assert!(cancel < assign, "the cancel goes first: {effects:?}");
}
