//! Random sequences of appends (with truncation), hard and conf state changes, syncs,
//! compactions, installed snapshots and reopens keep a `DiskLog` equal to a `MemLog` given the
//! same writes. A reopen without a sync drops the writes queued since the last one, so at a
//! reopen the model is rebuilt from the writes that were durable.
//!
//! The generator keeps raft's own rules, which the log does not enforce but recovery checks:
//! nothing at or below the commit index is truncated, only committed entries are compacted, and
//! the commit index never passes the last entry.

use proptest::prelude::*;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, Storage};

use super::super::{DiskLog, LogStore, MemLog};
use super::{conf, entry_with_data, open_small, snapshot};

/// An operation as drawn, relative to the log's state when it runs.
#[derive(Debug, Clone)]
enum Op {
    /// Append `count` entries starting `back` entries before the end (truncating), in a new
    /// term when `back > 0`.
    Append {
        back: u64,
        count: u64,
    },
    /// Commit up to `back` entries before the end, voting for `vote`.
    HardState {
        back: u64,
        vote: u64,
    },
    ConfState {
        voters: Vec<u64>,
    },
    Sync,
    /// Compact at `back` entries before the commit index.
    Compact {
        back: u64,
    },
    /// Install a snapshot `ahead` entries past the end.
    ApplySnapshot {
        ahead: u64,
    },
    /// Drop the `DiskLog` (without a sync) and open it again.
    Reopen,
}

/// A write as it was made, to be replayed into a fresh model.
#[derive(Debug, Clone)]
enum Write {
    Append(Vec<Entry>),
    HardState(HardState),
    ConfState(ConfState),
    Compact(u64, ConfState, Vec<u8>),
    ApplySnapshot(Snapshot),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4u64, 1..6u64).prop_map(|(back, count)| Op::Append { back, count }),
        2 => (0..3u64, 1..4u64).prop_map(|(back, vote)| Op::HardState { back, vote }),
        1 => prop::collection::vec(1..6u64, 1..4).prop_map(|voters| Op::ConfState { voters }),
        4 => Just(Op::Sync),
        1 => (0..3u64).prop_map(|back| Op::Compact { back }),
        1 => (1..4u64).prop_map(|ahead| Op::ApplySnapshot { ahead }),
        1 => Just(Op::Reopen),
    ]
}

/// Turns a drawn operation into a concrete write that keeps raft's rules for `log`.
fn resolve(op: &Op, log: &MemLog) -> Option<Write> {
    let first = log.first_index().unwrap();
    let last = log.last_index().unwrap();
    let hs = log.initial_state().unwrap().hard_state;
    let term = log.term(last).unwrap().max(hs.term).max(1);
    match *op {
        Op::Append { back, count } => {
            let start = (last + 1)
                .saturating_sub(back)
                .max(first)
                .max(hs.commit + 1);
            let term = if start <= last { term + 1 } else { term };
            Some(Write::Append(
                (start..start + count)
                    .map(|i| entry_with_data(i, term))
                    .collect(),
            ))
        }
        Op::HardState { back, vote } => Some(Write::HardState(HardState {
            term,
            vote,
            commit: last.saturating_sub(back).max(hs.commit),
            ..HardState::default()
        })),
        Op::ConfState { ref voters } => Some(Write::ConfState(conf(voters))),
        Op::Compact { back } => {
            let at = hs.commit.saturating_sub(back);
            Some(Write::Compact(
                at,
                conf(&[1, 2]),
                format!("state at {at}").into_bytes(),
            ))
        }
        Op::ApplySnapshot { ahead } => {
            let mut snap = snapshot(last + ahead, term + 1, &[1, 2, 3]);
            snap.data = format!("leader state at {}", last + ahead)
                .into_bytes()
                .into();
            Some(Write::ApplySnapshot(snap))
        }
        Op::Sync | Op::Reopen => None,
    }
}

fn apply(log: &impl LogStore, write: &Write) {
    match write {
        Write::Append(ents) => log.append(ents),
        Write::HardState(hs) => log.set_hard_state(hs.clone()),
        Write::ConfState(cs) => log.set_conf_state(cs.clone()),
        Write::Compact(at, cs, data) => log.compact(*at, cs.clone(), data.clone()),
        Write::ApplySnapshot(snap) => log.apply_snapshot(snap.clone()),
    }
    .unwrap_or_else(|e| panic!("{write:?} refused: {e}"));
}

/// Asserts that every read of `disk` answers as `model` does.
fn assert_same(disk: &DiskLog, model: &MemLog, step: usize) {
    let (first, last) = (model.first_index().unwrap(), model.last_index().unwrap());
    assert_eq!(
        disk.first_index().unwrap(),
        first,
        "first index after step {step}"
    );
    assert_eq!(
        disk.last_index().unwrap(),
        last,
        "last index after step {step}"
    );
    let ctx = || GetEntriesContext::empty(false);
    assert_eq!(
        disk.entries(first, last + 1, None, ctx()),
        model.entries(first, last + 1, None, ctx()),
        "entries after step {step}"
    );
    for i in first - 1..=last {
        assert_eq!(disk.term(i), model.term(i), "term {i} after step {step}");
    }
    let (d, m) = (
        disk.initial_state().unwrap(),
        model.initial_state().unwrap(),
    );
    assert_eq!(d.hard_state, m.hard_state, "hard state after step {step}");
    assert_eq!(d.conf_state, m.conf_state, "conf state after step {step}");
    assert_eq!(
        disk.snapshot(0, 0),
        model.snapshot(0, 0),
        "snapshot after step {step}"
    );
    assert_eq!(
        disk.bytes_since_snapshot(),
        model.bytes_since_snapshot(),
        "bytes after step {step}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn disk_log_matches_mem_log(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        // Segments of 256 bytes: most syncs start a new one, and compaction deletes them.
        let mut disk = open_small(dir.path(), 256);
        let mut model = MemLog::new();
        let mut durable: Vec<Write> = Vec::new();
        let mut queued: Vec<Write> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Sync => {
                    disk.sync().unwrap();
                    durable.append(&mut queued);
                }
                Op::Reopen => {
                    drop(disk);
                    disk = open_small(dir.path(), 256);
                    queued.clear();
                    model = MemLog::new();
                    durable.iter().for_each(|w| apply(&model, w));
                }
                op => {
                    let write = resolve(op, &model).expect("a write");
                    let snapshot_before = model.first_index().unwrap();
                    apply(&disk, &write);
                    apply(&model, &write);
                    // A stored snapshot is durable when the call returns, and so is everything
                    // queued before it; a compaction with nothing to do writes nothing.
                    let stored = model.first_index().unwrap() != snapshot_before
                        || matches!(write, Write::ApplySnapshot(_));
                    queued.push(write);
                    if stored {
                        durable.append(&mut queued);
                    }
                }
            }
            assert_same(&disk, &model, step);
        }
    }
}
