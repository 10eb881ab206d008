//! Tests of the raft log stores.
//!
//! - `storage`: raft-rs's own `MemStorage` tests, run against both stores;
//! - `model`: random operation sequences (with reopens) keep `DiskLog` equal to `MemLog`;
//! - `damage`: torn and corrupt bytes written on purpose, and what open makes of them;
//! - `concurrent`: readers on other threads while one thread writes;
//! - `bad_input`: directories that are not this log's, and refusals that change nothing;
//! - `crash`: a writer process SIGKILLed mid-write, and every entry it reported synced intact.

mod bad_input;
mod concurrent;
mod crash;
mod damage;
mod model;
mod storage;

use std::path::Path;

use bytes::Bytes;
use raft::eraftpb::{ConfState, Entry, Snapshot};

use super::{DiskLog, DiskLogOptions, LogIdentity};

/// An entry with no data.
fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        ..Entry::default()
    }
}

/// An entry whose data is derived from its index and term, so a reader can verify it.
fn entry_with_data(index: u64, term: u64) -> Entry {
    let mut e = entry(index, term);
    e.data = Bytes::from(payload(index, term));
    e
}

/// 40 to 400 bytes determined by `(index, term)`.
fn payload(index: u64, term: u64) -> Vec<u8> {
    let seed = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ term.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let len = 40 + (seed % 361) as usize;
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn conf(voters: &[u64]) -> ConfState {
    ConfState {
        voters: voters.to_vec(),
        ..ConfState::default()
    }
}

fn snapshot(index: u64, term: u64, voters: &[u64]) -> Snapshot {
    let mut s = Snapshot::default();
    s.mut_metadata().index = index;
    s.mut_metadata().term = term;
    s.mut_metadata().set_conf_state(conf(voters));
    s
}

fn identity() -> LogIdentity {
    LogIdentity {
        group: "test-group".into(),
        replica: 1,
    }
}

/// Opens the test log in `dir` with small segments, so tests cross segment boundaries.
fn open_small(dir: &Path, segment_bytes: u64) -> DiskLog {
    DiskLog::open_with(dir, &identity(), DiskLogOptions { segment_bytes }).expect("open log")
}
