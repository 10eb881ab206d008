//! Snapshots of the head's state (what raft snapshots hold): a state restored from a snapshot
//! taken at any point makes exactly the decisions the original makes from there on: the same
//! replies, the same effects, and, at the end, the same snapshot bytes.

mod state_support;

use std::time::Duration;

use escher_core::state::{ClusterState, Entry, Reply, RetentionPolicy, StateConfig};
use proptest::prelude::*;
use state_support::ops::{Op, command_for, op};
use state_support::{TestState, check_invariants};

fn snapshot(state: &ClusterState) -> Vec<u8> {
    bincode::serde::encode_to_vec(state, bincode::config::standard()).unwrap()
}

fn restore(bytes: &[u8], config: StateConfig) -> ClusterState {
    let (state, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(bytes, bincode::config::standard()).unwrap();
    state.restore(config)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_restored_state_decides_exactly_as_the_original(
        ops in proptest::collection::vec(op(), 1..80),
        cut in any::<proptest::sample::Index>(),
    ) {
        // A small retention, so that evictions, tombstones and reclaimed nodes and names are
        // part of what a snapshot must carry exactly.
        let retention = RetentionPolicy {
            finished: 3,
            finished_for: Duration::from_millis(200),
            tombstones: 4,
            dead_nodes_for: Duration::from_millis(100),
            node_tombstones: 2,
        };
        // A small quota too, so that refused batches and the counts a restore rebuilds are part
        // of what must match.
        let config = StateConfig {
            max_result_bytes: 32,
            retention,
            namespace_unfinished: 3,
            namespace_result_bytes: 48,
            namespace_resources: 6,
            max_task_bytes: 4096,
            namespace_spec_bytes: 2048,
            namespace_object_bytes: 4096,
            min_time_left: std::time::Duration::ZERO,
        };
        let mut a = TestState::with_config(config.clone());
        let cut = cut.index(ops.len());
        let mut b: Option<ClusterState> = None;
        let mut known = 0u64;
        for (i, op) in ops.iter().enumerate() {
            if i == cut {
                let bytes = snapshot(&a.state);
                let restored = restore(&bytes, config.clone());
                prop_assert_eq!(snapshot(&restored), bytes, "a snapshot is canonical");
                check_invariants(&restored);
                b = Some(restored);
            }
            match op {
                Op::Tick { advance } => a.advance(u64::from(*advance)),
                _ => a.advance(1),
            }
            let Some(command) = command_for(&a, op, known) else { continue };
            let entry = Entry::new(a.now, command);
            let reply_a = a.state.apply(entry.clone());
            let effects_a = a.state.take_effects();
            if let Some(b) = &mut b {
                let reply_b = b.apply(entry);
                let effects_b = b.take_effects();
                prop_assert_eq!(&reply_a, &reply_b);
                prop_assert_eq!(&effects_a, &effects_b);
                check_invariants(b);
            }
            if let Ok(Reply::Submitted(ids)) = &reply_a {
                known += ids.len() as u64;
            }
        }
        if let Some(b) = &b {
            prop_assert_eq!(snapshot(&a.state), snapshot(b));
        }
    }
}
