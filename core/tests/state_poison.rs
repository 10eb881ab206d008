//! Entries a correct head never proposes (reports for tasks or attempts that do not exist,
//! changes on nodes that are gone, a cancelled reservation reported finished ...), applied to
//! two independently built states: no replica panics, both answer the same, and both end in
//! the same state, which still passes every invariant check.

mod state_support;

use escher_core::state::{ApplyError, ClusterState, Command, Entry, Reply, Returning};
use escher_proto::mig::GpuModel;
use escher_proto::types::{
    CapacityOp, DeviceHold, GangStrategy, GpuInfo, MigChange, NodeId, NodeSpec, ResourceUpdate,
    RunningTask, TaskFinished, TaskId, TaskResult, TaskState,
};
use proptest::prelude::*;
use state_support::{
    CLUSTER, TestState, adjust, check_invariants, joining, name, on, register_command, res, secret,
    task,
};

fn snapshot(state: &ClusterState) -> Vec<u8> {
    bincode::serde::encode_to_vec(state, bincode::config::standard()).unwrap()
}

/// Two replicas built independently, fed the same entries.
struct Pair {
    a: TestState,
    b: TestState,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            a: TestState::new(),
            b: TestState::new(),
        }
    }

    /// Applies `command` to both (`try_apply` checks every invariant, and that a refusal
    /// changed nothing), checks they answered and acted alike and hold the same state, and
    /// returns the answer.
    fn step(&mut self, command: Command) -> Result<Reply, ApplyError> {
        self.a.advance(1);
        self.b.advance(1);
        let a = self.a.try_apply(command.clone());
        let b = self.b.try_apply(command);
        assert_eq!(a, b, "the replicas answered differently");
        assert_eq!(
            snapshot(&self.a.state),
            snapshot(&self.b.state),
            "the replicas' states differ"
        );
        a.map(|out| out.reply)
    }

    fn task_state(&self, id: TaskId) -> TaskState {
        self.a.task_state(id)
    }
}

fn registered(reply: Result<Reply, ApplyError>) -> NodeId {
    match reply {
        Ok(Reply::Registered(id)) => id,
        other => panic!("registration answered {other:?}"),
    }
}

fn submitted(reply: Result<Reply, ApplyError>) -> Vec<TaskId> {
    match reply {
        Ok(Reply::Submitted(ids)) => ids,
        other => panic!("submit answered {other:?}"),
    }
}

/// An A100 in MIG mode with one 1g.5gb slice at 0, GPU index 0.
fn a100() -> GpuInfo {
    GpuInfo {
        index: 0,
        uuid: "GPU-a100".into(),
        product: "NVIDIA A100-SXM4-40GB".into(),
        model: Some(GpuModel::A100_40GB),
        memory_mib: 40960,
        mig_enabled: true,
        simulated: true,
        slices: vec![escher_proto::types::MigDevice {
            profile: "1g.5gb".into(),
            start: 0,
            size: 1,
            memory_mib: 4864,
            uuid: "MIG-a".into(),
        }],
    }
}

/// Reports, starts and device claims for tasks and attempts that do not exist or do not run
/// are ignored alike by every replica; changes on nodes that do not exist, or are gone, are
/// refused alike and change nothing.
#[test]
fn entries_about_what_does_not_exist_are_answered_alike_and_change_nothing() {
    let mut p = Pair::new();
    let n1 = registered(p.step(register_command("w1", "cpu=1")));
    let ids = submitted(p.step(Command::Submit {
        tasks: vec![task("cpu=1").build(), task("cpu=1").build()],
        namespace: None,
    }));
    let (running, pending) = (ids[0], ids[1]);
    assert_eq!(p.task_state(running), TaskState::Running);
    assert_eq!(p.task_state(pending), TaskState::Pending);
    let finished = |task_id, attempt| {
        Command::TaskFinished(TaskFinished {
            task_id,
            attempt,
            outcome: Ok(TaskResult::Exited { code: 0 }),
            timed_out: false,
            output: None,
        })
    };
    // A task that never existed, an attempt that never ran, a task that is pending.
    for command in [
        finished(TaskId(99), 1),
        finished(running, 0),
        finished(running, 7),
        finished(pending, 0),
        finished(pending, 1),
        Command::TaskStarted {
            task: TaskId(99),
            attempt: 1,
        },
        Command::TaskStarted {
            task: pending,
            attempt: 1,
        },
        Command::TaskDevices {
            task: pending,
            attempt: 1,
            devices: vec![DeviceHold {
                uuid: "MIG-a".into(),
                amount: escher_proto::Amount::units(1).unwrap(),
            }],
        },
    ] {
        assert_eq!(p.step(command), Ok(Reply::Done));
    }
    assert_eq!(p.task_state(running), TaskState::Running);
    assert_eq!(p.task_state(pending), TaskState::Pending);

    // A node that never existed.
    let ghost = NodeId(42);
    let unknown = Err(ApplyError::UnknownNode(ghost));
    for command in [
        Command::RemoveNode {
            node: ghost,
            reason: "gone".into(),
        },
        Command::DrainNode { node: ghost },
        Command::GpusChanged {
            node: ghost,
            gpus: vec![a100()],
            done: None,
        },
        Command::ApplyMigLayout {
            node: ghost,
            gpu: 0,
            change: MigChange::Layout("7g.40gb".into()),
            drain: false,
        },
    ] {
        assert_eq!(p.step(command), unknown);
    }
    let rejoin = |node, who: &str| Command::RejoinNode {
        worker: joining(who, "cpu=1", 1),
        back: Returning {
            cluster: CLUSTER.to_string(),
            node,
            secret: secret(who),
            running: vec![RunningTask {
                task_id: TaskId(99),
                attempt: 3,
            }],
            finished: vec![TaskFinished {
                task_id: running,
                attempt: 1,
                outcome: Ok(TaskResult::Exited { code: 0 }),
                timed_out: false,
                output: None,
            }],
        },
    };
    assert_eq!(p.step(rejoin(ghost, "w1")), unknown);
    // Someone else's node: refused before its report is read.
    assert_eq!(p.step(rejoin(n1, "w2")), Err(ApplyError::WrongSecret(n1)));
    assert_eq!(p.task_state(running), TaskState::Running);

    // A resource change on a node that is gone, a MIG change on a GPU it never had.
    // (No cpu: the pending task stays pending.)
    let n2 = registered(p.step(register_command("w2", "mem=1")));
    assert!(matches!(
        p.step(Command::ApplyMigLayout {
            node: n2,
            gpu: 3,
            change: MigChange::Layout("7g.40gb".into()),
            drain: false,
        }),
        Err(ApplyError::NoSuchGpu { .. })
    ));
    assert_eq!(
        p.step(Command::RemoveNode {
            node: n2,
            reason: "gone".into()
        }),
        Ok(Reply::Done)
    );
    let gone = Command::SetResources {
        updates: vec![adjust("x", "+1", on(n2))],
        namespace: None,
        caller_task: None,
    };
    assert_eq!(p.step(gone), Err(ApplyError::UnknownNode(n2)));
    assert!(matches!(
        p.step(Command::ApplyMigLayout {
            node: n2,
            gpu: 0,
            change: MigChange::Layout("7g.40gb".into()),
            drain: false,
        }),
        Err(ApplyError::NodeUnavailable { .. })
    ));
    // Removed twice, drained once gone: nothing to do, the same everywhere.
    for command in [
        Command::RemoveNode {
            node: n2,
            reason: "again".into(),
        },
        Command::DrainNode { node: n2 },
    ] {
        assert_eq!(p.step(command), Ok(Reply::Done));
    }
    // A cancel naming a task twice, or one that never existed, is refused whole.
    assert_eq!(
        p.step(Command::Cancel {
            tasks: vec![pending, pending]
        }),
        Err(ApplyError::DuplicateTask(pending))
    );
    assert_eq!(
        p.step(Command::Cancel {
            tasks: vec![pending, TaskId(99)]
        }),
        Err(ApplyError::UnknownTask(TaskId(99)))
    );
    assert_eq!(p.task_state(pending), TaskState::Pending);
}

/// The core's decisions are acted on once the whole command is applied. A cancel of two
/// pending reservation holders placed the second when the first left its gang, then
/// cancelled it: the stale placement used to mark the cancelled holder running (the state
/// and the core disagreeing from then on), and the first holder kept a stale pending reason.
#[test]
fn decisions_made_stale_by_the_same_command_are_dropped() {
    let mut p = Pair::new();
    let reserved = p.step(Command::Reserve {
        name: name("train"),
        bundles: vec![res("q=1"), res("q=1")],
        strategy: GangStrategy::Pack,
        timeout: None,
        namespace: None,
    });
    let Ok(Reply::Reserved { tasks, placed }) = reserved else {
        panic!("reserve answered {reserved:?}");
    };
    assert!(!placed);
    // Room for one bundle only: the gang waits.
    registered(p.step(register_command("w1", "cpu=1,q=1")));
    assert!(tasks.iter().all(|t| p.task_state(*t) == TaskState::Pending));
    let reply = p.step(Command::Cancel {
        tasks: tasks.clone(),
    });
    let Ok(Reply::Cancelled(statuses)) = reply else {
        panic!("cancel answered {reply:?}");
    };
    assert!(
        statuses.iter().all(|s| s.state == TaskState::Cancelled),
        "{statuses:?}"
    );
    for t in &tasks {
        assert_eq!(p.task_state(*t), TaskState::Cancelled);
        assert_eq!(p.a.state.core().running_on(*t), None);
        assert!(p.a.state.task(*t).unwrap().pending_reason.is_none());
    }
    // The node is free again: a new task runs there.
    let ids = submitted(p.step(Command::Submit {
        tasks: vec![task("q=1").build()],
        namespace: None,
    }));
    assert_eq!(p.task_state(ids[0]), TaskState::Running);
}

/// One hostile step: every id and attempt is drawn from a small range that includes ids that
/// do not exist.
#[derive(Debug, Clone)]
enum Hostile {
    Register(u8),
    Rejoin {
        node: u8,
        restarted: bool,
        running: Vec<(u8, u8)>,
        finished: Vec<(u8, u8, u8)>,
    },
    Remove(u8),
    Drain(u8),
    Submit {
        kind: u8,
        cpu: u8,
    },
    Reserve {
        bundles: u8,
        strategy: u8,
    },
    Started(u8, u8),
    Finished(u8, u8, u8),
    Cancel(Vec<u8>),
    Requeue(u8, u8),
    Adjust {
        node: u8,
        delta: i8,
        caller: Option<(u8, u8)>,
    },
    Tick(u16),
    Gpus {
        node: u8,
        done: Option<u8>,
    },
    Mig {
        node: u8,
        gpu: u8,
        change: u8,
        drain: bool,
    },
    Devices(u8, u8),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let small = 0..8u8;
    prop_oneof![
        2 => (1..4u8).prop_map(Hostile::Register),
        2 => (
            0..5u8,
            any::<bool>(),
            proptest::collection::vec((0..8u8, 0..4u8), 0..3),
            proptest::collection::vec((0..8u8, 0..4u8, 0..4u8), 0..3),
        )
            .prop_map(|(node, restarted, running, finished)| Hostile::Rejoin {
                node,
                restarted,
                running,
                finished,
            }),
        1 => (0..5u8).prop_map(Hostile::Remove),
        1 => (0..5u8).prop_map(Hostile::Drain),
        4 => (0..4u8, 0..3u8).prop_map(|(kind, cpu)| Hostile::Submit { kind, cpu }),
        1 => (1..4u8, 0..4u8).prop_map(|(bundles, strategy)| Hostile::Reserve { bundles, strategy }),
        1 => (small.clone(), 0..4u8).prop_map(|(t, a)| Hostile::Started(t, a)),
        4 => (small.clone(), 0..4u8, 0..4u8).prop_map(|(t, a, o)| Hostile::Finished(t, a, o)),
        2 => proptest::collection::vec(small.clone(), 1..3).prop_map(Hostile::Cancel),
        1 => (small, 0..3u8).prop_map(|(t, c)| Hostile::Requeue(t, c)),
        2 => (0..5u8, -2..3i8, proptest::option::of((0..8u8, 0..3u8)))
            .prop_map(|(node, delta, caller)| Hostile::Adjust { node, delta, caller }),
        1 => (0..3000u16).prop_map(Hostile::Tick),
        1 => (0..5u8, proptest::option::of(0..2u8))
            .prop_map(|(node, done)| Hostile::Gpus { node, done }),
        1 => (0..5u8, 0..2u8, 0..4u8, any::<bool>())
            .prop_map(|(node, gpu, change, drain)| Hostile::Mig { node, gpu, change, drain }),
        1 => (0..8u8, 0..4u8).prop_map(|(t, a)| Hostile::Devices(t, a)),
    ]
}

fn outcome(o: u8) -> Result<TaskResult, String> {
    match o {
        0 => Ok(TaskResult::Exited { code: 0 }),
        1 => Ok(TaskResult::Exited { code: 3 }),
        2 => Ok(TaskResult::Released),
        _ => Err("lost".into()),
    }
}

fn report(t: u8, a: u8, o: u8) -> TaskFinished {
    TaskFinished {
        task_id: TaskId(u64::from(t)),
        attempt: u32::from(a),
        outcome: outcome(o),
        timed_out: false,
        output: None,
    }
}

fn command(h: &Hostile, boots: &mut u64) -> Command {
    match h {
        Hostile::Register(cpu) => Command::RegisterNode {
            worker: joining("w", &format!("cpu={cpu},q=1"), 1),
            secret: secret("w"),
        },
        Hostile::Rejoin {
            node,
            restarted,
            running,
            finished,
        } => {
            if *restarted {
                *boots += 1;
            }
            Command::RejoinNode {
                worker: joining("w", "cpu=2", *boots),
                back: Returning {
                    cluster: CLUSTER.to_string(),
                    node: NodeId(u64::from(*node)),
                    secret: secret("w"),
                    running: running
                        .iter()
                        .map(|(t, a)| RunningTask {
                            task_id: TaskId(u64::from(*t)),
                            attempt: u32::from(*a),
                        })
                        .collect(),
                    finished: finished
                        .iter()
                        .map(|(t, a, o)| report(*t, *a, *o))
                        .collect(),
                },
            }
        }
        Hostile::Remove(n) => Command::RemoveNode {
            node: NodeId(u64::from(*n)),
            reason: "gone".into(),
        },
        Hostile::Drain(n) => Command::DrainNode {
            node: NodeId(u64::from(*n)),
        },
        Hostile::Submit { kind, cpu } => {
            let resources = format!("cpu={cpu}");
            let spec = match kind {
                0 => task(&resources).ghost("bundle=2"),
                1 => task("bundle=1"),
                2 => task(&resources).retries(2),
                _ => task("train.q=1"),
            };
            Command::Submit {
                tasks: vec![spec.build()],
                namespace: None,
            }
        }
        Hostile::Reserve { bundles, strategy } => Command::Reserve {
            name: name("train"),
            bundles: (0..*bundles).map(|_| res("q=1")).collect(),
            strategy: match strategy {
                0 => GangStrategy::Pack,
                1 => GangStrategy::Spread,
                2 => GangStrategy::StrictPack,
                _ => GangStrategy::StrictSpread,
            },
            timeout: None,
            namespace: None,
        },
        Hostile::Started(t, a) => Command::TaskStarted {
            task: TaskId(u64::from(*t)),
            attempt: u32::from(*a),
        },
        Hostile::Finished(t, a, o) => Command::TaskFinished(report(*t, *a, *o)),
        Hostile::Cancel(ts) => Command::Cancel {
            tasks: ts.iter().map(|t| TaskId(u64::from(*t))).collect(),
        },
        Hostile::Requeue(t, c) => Command::Requeue {
            task: TaskId(u64::from(*t)),
            resources: res(&format!("cpu={c}")),
        },
        Hostile::Adjust {
            node,
            delta,
            caller,
        } => {
            let amount =
                escher_proto::types::Amount::units(u64::from(delta.unsigned_abs())).unwrap();
            let delta = if *delta < 0 {
                escher_proto::types::Delta::decrease(amount)
            } else {
                escher_proto::types::Delta::increase(amount)
            };
            Command::SetResources {
                updates: vec![ResourceUpdate {
                    name: name("bundle"),
                    op: CapacityOp::Adjust(delta),
                    target: if caller.is_some() {
                        NodeSpec::Local
                    } else {
                        NodeSpec::Node(NodeId(u64::from(*node)))
                    },
                }],
                namespace: None,
                caller_task: caller.map(|(t, a)| (TaskId(u64::from(t)), u32::from(a))),
            }
        }
        Hostile::Tick(_) => Command::Tick,
        Hostile::Gpus { node, done } => Command::GpusChanged {
            node: NodeId(u64::from(*node)),
            gpus: vec![a100()],
            done: done.map(|gpu| escher_proto::types::MigDone {
                gpu: u32::from(gpu),
                error: None,
                phases: Box::default(),
            }),
        },
        Hostile::Mig {
            node,
            gpu,
            change,
            drain,
        } => Command::ApplyMigLayout {
            node: NodeId(u64::from(*node)),
            gpu: u32::from(*gpu),
            change: match change {
                0 => MigChange::Layout("7g.40gb".into()),
                1 => MigChange::Create("1g.5gb@1".into()),
                2 => MigChange::Destroy("MIG-a".into()),
                _ => MigChange::Prepare("3g.20gb,3g.20gb".into()),
            },
            drain: *drain,
        },
        Hostile::Devices(t, a) => Command::TaskDevices {
            task: TaskId(u64::from(*t)),
            attempt: u32::from(*a),
            devices: vec![DeviceHold {
                uuid: "MIG-a".into(),
                amount: escher_proto::Amount::units(1).unwrap(),
            }],
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn hostile_entries_leave_replicas_equal_and_sound(
        steps in proptest::collection::vec(hostile(), 1..60),
    ) {
        let mut a = TestState::new();
        let mut b = TestState::new();
        let mut boots = 1;
        for step in &steps {
            let advance = match step {
                Hostile::Tick(ms) => u64::from(*ms),
                _ => 1,
            };
            a.advance(advance);
            b.advance(advance);
            let entry = Entry::new(a.now, command(step, &mut boots));
            let reply_a = a.state.apply(entry.clone());
            let reply_b = b.state.apply(entry);
            prop_assert_eq!(&reply_a, &reply_b);
            prop_assert_eq!(a.state.take_effects(), b.state.take_effects());
            check_invariants(&a.state);
            prop_assert_eq!(snapshot(&a.state), snapshot(&b.state));
        }
    }
}
