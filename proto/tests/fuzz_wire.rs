//! Fuzz-style properties of the wire edge (docs/DESIGN.md §10): every request a head or a worker
//! decodes, as arbitrary bytes and as valid messages with bytes flipped, converts to a domain
//! value or to a typed `ConvertError`; nothing panics. (`prost` rejects bytes that are not a
//! message before conversion; what it accepts is exactly what a hostile caller can send.)

use escher_proto::types::{
    ApplyMigLayoutRequest, CreateTokenRequest, HeadChange, HeadMessage, ListTasksRequest,
    RegisterRequest, ReserveRequest, SetResourcesRequest, SubmitRequest, TaskLogsRequest,
    WaitRequest, WorkerMessage,
};
use escher_proto::{ConvertError, wire};
use proptest::prelude::*;
use prost::Message;

/// Decodes `bytes` as `W` and converts it to `D`: `Ok(())` whatever the outcome, as long as a
/// conversion failure is a `ConvertError` with a message (the test fails on a panic).
fn convert<W, D>(bytes: &[u8])
where
    W: Message + Default,
    D: TryFrom<W, Error = ConvertError>,
{
    if let Ok(message) = W::decode(bytes)
        && let Err(e) = D::try_from(message)
    {
        assert!(!e.to_string().is_empty());
    }
}

/// Every request type the head or a worker decodes, converted from `bytes`.
fn every_request(bytes: &[u8]) {
    convert::<wire::SubmitRequest, SubmitRequest>(bytes);
    convert::<wire::WaitRequest, WaitRequest>(bytes);
    convert::<wire::ListTasksRequest, ListTasksRequest>(bytes);
    convert::<wire::SetResourcesRequest, SetResourcesRequest>(bytes);
    convert::<wire::TaskLogsRequest, TaskLogsRequest>(bytes);
    convert::<wire::ReserveRequest, ReserveRequest>(bytes);
    convert::<wire::ApplyMigLayoutRequest, ApplyMigLayoutRequest>(bytes);
    convert::<wire::ChangeHeadsRequest, HeadChange>(bytes);
    convert::<wire::CreateTokenRequest, CreateTokenRequest>(bytes);
    convert::<wire::RegisterRequest, RegisterRequest>(bytes);
    convert::<wire::WorkerMessage, WorkerMessage>(bytes);
    convert::<wire::HeadMessage, HeadMessage>(bytes);
}

/// Valid encodings to mutate: a submit with every kind of task field set, a resource batch, a
/// registration, a report.
fn seeds() -> Vec<Vec<u8>> {
    let submit = wire::SubmitRequest {
        tasks: vec![wire::TaskSpec {
            name: "t".into(),
            kind: Some(wire::task_spec::Kind::Command(wire::CommandTask {
                argv: vec!["echo".into(), "hi".into()],
                env: vec![wire::EnvVar {
                    name: "A".into(),
                    value: "b".into(),
                }],
                ..Default::default()
            })),
            resources: vec![wire::ResourceAmount {
                name: "cpu".into(),
                amount: 10_000,
            }],
            ..Default::default()
        }],
        namespace: "ns".into(),
        key: Some(wire::RequestKey {
            client: 1,
            seq: 2,
            first_incomplete: 1,
        }),
    };
    let set = wire::SetResourcesRequest {
        updates: vec![wire::ResourceUpdate {
            name: "x".into(),
            op: Some(wire::CapacityOp {
                op: Some(wire::capacity_op::Op::Adjust(-10_000)),
            }),
            target: Some(wire::NodeSpec {
                target: Some(wire::node_spec::Target::Node(3)),
            }),
        }],
        ..Default::default()
    };
    let register = wire::RegisterRequest {
        name: "w".into(),
        address: "127.0.0.1".into(),
        resources: vec![wire::ResourceAmount {
            name: "cpu".into(),
            amount: 40_000,
        }],
        ..Default::default()
    };
    let token = wire::CreateTokenRequest {
        role: wire::Role::App.into(),
        namespace: "team".into(),
        description: "d".into(),
        key: None,
    };
    vec![
        submit.encode_to_vec(),
        set.encode_to_vec(),
        register.encode_to_vec(),
        token.encode_to_vec(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        every_request(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        seed in 0usize..4,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = seeds()[seed].clone();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= value;
        }
        every_request(&bytes);
        // Truncated anywhere, too.
        let end = cut.index(bytes.len() + 1);
        every_request(&bytes[..end]);
    }
}
