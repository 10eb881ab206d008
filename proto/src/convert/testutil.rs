//! Test helpers for the conversions: a round trip through protobuf bytes, sample values that
//! cover every variant, and proptest strategies for resource sets and task specs.

use std::fmt::Debug;
use std::time::Duration;

use proptest::prelude::*;

use super::ConvertError;
use crate::types::{
    Amount, Capacity, CapacityOp, Delta, Labels, Namespace, NodeId, NodeSpec, ObjectHolder,
    ObjectId, ObjectOwner, ObjectView, ResourceName, ResourceSet, ResourceUpdate, TaskId, TaskKind,
    TaskResult, TaskSpec, TaskState, TaskStatus,
};
use crate::wire;

/// Converts `d` to its wire form, encodes and decodes it, converts it back and checks that
/// nothing changed. Returns the wire form for further checks.
pub(crate) fn round_trip<D, W>(d: D) -> W
where
    D: Clone + PartialEq + Debug + TryFrom<W, Error = ConvertError>,
    W: From<D> + prost::Message + Default + Clone + PartialEq + Debug,
{
    let w = W::from(d.clone());
    let decoded = W::decode(w.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(decoded, w, "protobuf bytes round trip");
    match D::try_from(decoded) {
        Ok(back) => assert_eq!(back, d),
        Err(e) => panic!("{d:?} did not come back: {e}"),
    }
    w
}

pub(crate) fn amount(s: &str) -> Amount {
    s.parse().expect("valid amount")
}

pub(crate) fn name(s: &str) -> ResourceName {
    ResourceName::new(s).expect("valid name")
}

pub(crate) fn set(s: &str) -> ResourceSet {
    s.parse().expect("valid resource set")
}

/// Object `(1 << 63, index)` as the head locates it for an assignment: two holders, one with
/// an address and a ticket, one with neither.
pub(crate) fn located(index: u64) -> ObjectView {
    ObjectView {
        id: ObjectId(1 << 63, index),
        namespace: Some(Namespace::new("team").expect("a namespace")),
        size: 3 << 20,
        checksum: 0x0bad_cafe,
        owner: ObjectOwner::Session(1 << 63),
        sealed_at_ms: 1_700_000_000_000,
        holders: vec![
            ObjectHolder {
                node: NodeId(2),
                address: Some("127.0.0.1:7700".into()),
                ticket: Some("o1.ticket".into()),
            },
            ObjectHolder {
                node: NodeId(5),
                address: None,
                ticket: None,
            },
        ],
        lost: None,
    }
}

/// One task spec per kind and then some, covering every optional field both ways.
pub(crate) fn sample_specs() -> Vec<TaskSpec> {
    let base = TaskSpec {
        name: "train step 1".into(),
        kind: TaskKind::Command {
            argv: vec!["python".into(), "train.py".into(), "--epochs=3".into()],
            env: vec![
                ("CUDA_VISIBLE_DEVICES".into(), "0".into()),
                ("X".into(), String::new()),
            ],
            cwd: Some("/data/run".into()),
        },
        resources: set("cpu=2,gpu=0.5,data-a=1"),
        labels: "team=ml,stage=train".parse().expect("labels"),
        max_retries: 3,
        timeout: Some(Duration::from_secs(60)),
        pending_deadline: Some(Duration::from_millis(1)),
        on_start: vec![ResourceUpdate {
            name: name("app/started"),
            op: CapacityOp::Adjust(Delta::increase(Amount::ONE)),
            target: NodeSpec::Local,
        }],
        on_success: vec![ResourceUpdate {
            name: name("next-stage"),
            op: CapacityOp::Set(Capacity::Unbounded),
            target: NodeSpec::Match {
                resources: set("zone-a=1"),
                num_nodes: Some(2),
            },
        }],
    };
    vec![
        base.clone(),
        TaskSpec {
            name: String::new(),
            kind: TaskKind::Command {
                argv: vec!["true".into()],
                env: vec![],
                cwd: None,
            },
            resources: ResourceSet::new(),
            labels: Labels::new(),
            max_retries: 0,
            timeout: None,
            pending_deadline: None,
            on_start: vec![],
            on_success: vec![],
        },
        TaskSpec {
            name: "f".into(),
            kind: TaskKind::Function {
                name: "add".into(),
                args: vec![0, 1, 255].into(),
            },
            ..base.clone()
        },
        TaskSpec {
            name: "ghost".into(),
            kind: TaskKind::Ghost {
                creates: vec![
                    (name("gang-7"), Capacity::Finite(amount("4"))),
                    (name("app/locality"), Capacity::Unbounded),
                ],
                ttl: Some(Duration::from_millis(250)),
            },
            on_success: vec![ResourceUpdate {
                name: name("gang-7"),
                op: CapacityOp::Delete,
                target: NodeSpec::Node(NodeId(2)),
            }],
            ..base.clone()
        },
        TaskSpec {
            kind: TaskKind::Ghost {
                creates: vec![],
                ttl: None,
            },
            max_retries: u32::MAX,
            ..base
        },
    ]
}

/// A status in every state, with every kind of result and none.
pub(crate) fn sample_statuses() -> Vec<TaskStatus> {
    let s = |id, state, node: Option<u64>, reason: Option<&str>, result| TaskStatus {
        id: TaskId(id),
        state,
        node: node.map(NodeId),
        attempt: 1,
        reason: reason.map(str::to_owned),
        finished_at_ms: state.is_terminal().then_some(1_700_000_000_000 + id),
        result,
        evicted: false,
        hook_errors: if id == 3 {
            vec!["node 9 is unknown".to_string()]
        } else {
            Vec::new()
        },
    };
    vec![
        s(1, TaskState::Pending, None, Some("needs gpu=2"), None),
        s(2, TaskState::Running, Some(3), None, None),
        s(
            3,
            TaskState::Succeeded,
            Some(3),
            None,
            Some(TaskResult::Exited { code: 0 }),
        ),
        s(
            4,
            TaskState::Succeeded,
            Some(0),
            None,
            Some(TaskResult::Returned(vec![7; 3].into())),
        ),
        s(
            5,
            TaskState::Succeeded,
            Some(1),
            None,
            Some(TaskResult::Released),
        ),
        s(
            6,
            TaskState::Failed,
            Some(1),
            Some("exit 2"),
            Some(TaskResult::Exited { code: 2 }),
        ),
        s(
            7,
            TaskState::Cancelled,
            None,
            Some("pending deadline passed"),
            None,
        ),
        TaskStatus {
            node: None,
            attempt: 0,
            reason: None,
            result: None,
            evicted: true,
            ..s(8, TaskState::Failed, None, None, None)
        },
    ]
}

pub(crate) fn arb_name() -> impl Strategy<Value = ResourceName> {
    "([a-z][a-z0-9]{0,4}/)?[a-zA-Z0-9][a-z0-9._-]{0,12}"
        .prop_filter_map("valid name", |s| ResourceName::new(&s).ok())
}

pub(crate) fn arb_amount() -> impl Strategy<Value = Amount> {
    prop_oneof![0..=100_000u64, 0..=Amount::MAX.raw()]
        .prop_map(|raw| Amount::from_raw(raw).expect("in range"))
}

pub(crate) fn arb_set() -> impl Strategy<Value = ResourceSet> {
    prop::collection::vec((arb_name(), arb_amount()), 0..8).prop_map(|pairs| {
        let mut set = ResourceSet::new();
        for (n, a) in pairs {
            set.insert(n, a);
        }
        set
    })
}

fn arb_capacity() -> impl Strategy<Value = Capacity> {
    prop_oneof![
        Just(Capacity::Unbounded),
        arb_amount().prop_map(Capacity::Finite)
    ]
}

fn arb_update() -> impl Strategy<Value = ResourceUpdate> {
    let max = Amount::MAX.raw() as i64;
    let op = prop_oneof![
        arb_capacity().prop_map(CapacityOp::Set),
        (-max..=max).prop_map(|raw| CapacityOp::Adjust(Delta::try_from(raw).expect("in range"))),
        Just(CapacityOp::Delete),
    ];
    let target = prop_oneof![
        Just(NodeSpec::Local),
        any::<u64>().prop_map(|n| NodeSpec::Node(NodeId(n))),
        (arb_set(), prop::option::of(1..100u32)).prop_map(|(resources, num_nodes)| {
            NodeSpec::Match {
                resources,
                num_nodes,
            }
        }),
    ];
    (arb_name(), op, target).prop_map(|(name, op, target)| ResourceUpdate { name, op, target })
}

fn arb_ms() -> impl Strategy<Value = Option<Duration>> {
    prop::option::of(any::<u64>().prop_map(Duration::from_millis))
}

fn arb_kind() -> impl Strategy<Value = TaskKind> {
    let command = (
        prop::collection::vec("[a-z0-9 ./=-]{1,12}", 1..5),
        prop::collection::vec(("[A-Z_]{1,8}", "[ -~]{0,12}"), 0..3),
        prop::option::of("/[a-z/]{0,12}"),
    )
        .prop_map(|(argv, env, cwd)| TaskKind::Command { argv, env, cwd });
    let function =
        ("[a-z_:]{1,16}", prop::collection::vec(any::<u8>(), 0..32)).prop_map(|(name, args)| {
            TaskKind::Function {
                name,
                args: args.into(),
            }
        });
    let ghost = (
        prop::collection::btree_map(arb_name(), arb_capacity(), 0..4),
        arb_ms(),
    )
        .prop_map(|(creates, ttl)| TaskKind::Ghost {
            creates: creates.into_iter().collect(),
            ttl,
        });
    prop_oneof![command, function, ghost]
}

fn arb_labels() -> impl Strategy<Value = Labels> {
    prop::collection::btree_map("[a-z][a-z0-9./-]{0,10}", "[A-Za-z0-9._-]{0,10}", 0..4).prop_map(
        |map| {
            let mut labels = Labels::new();
            for (k, v) in map {
                labels.insert(&k, &v).expect("valid label");
            }
            labels
        },
    )
}

pub(crate) fn arb_spec() -> impl Strategy<Value = TaskSpec> {
    (
        "\\PC{0,20}",
        arb_kind(),
        arb_set(),
        arb_labels(),
        any::<u32>(),
        arb_ms(),
        arb_ms(),
        prop::collection::vec(arb_update(), 0..3),
        prop::collection::vec(arb_update(), 0..3),
    )
        .prop_map(
            |(
                name,
                kind,
                resources,
                labels,
                max_retries,
                timeout,
                deadline,
                on_start,
                on_success,
            )| {
                TaskSpec {
                    name,
                    kind,
                    resources,
                    labels,
                    max_retries,
                    timeout,
                    pending_deadline: deadline,
                    on_start,
                    on_success,
                }
            },
        )
}

proptest! {
    #[test]
    fn resource_sets_round_trip(set in arb_set()) {
        let w: Vec<wire::ResourceAmount> = (&set).into();
        prop_assert_eq!(ResourceSet::try_from(w).expect("valid"), set);
    }

    #[test]
    fn task_specs_round_trip(spec in arb_spec()) {
        round_trip::<_, wire::TaskSpec>(spec);
    }
}
