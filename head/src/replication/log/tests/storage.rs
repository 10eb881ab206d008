//! raft-rs's `MemStorage` tests (`src/storage.rs` of tikv/raft-rs 0.7), run against both stores.
//!
//! raft-rs sets its fixture up by poking entries 3..=5 into an empty storage; here the same log
//! is reached through the public API: a snapshot at (2, 2), then entries 3..=5. The one visible
//! difference is that term 2 is then the snapshot's (raft-rs: "the term of the entry before
//! first_index is retained"), where raft-rs's fixture has no entry 2 at all. raft-rs's
//! `compact(i)` drops entries `< i`; ours stores a snapshot and drops entries `<= i`.

use std::cell::Cell;

use protobuf::Message as _;
use raft::eraftpb::Entry;
use raft::{GetEntriesContext, Storage, StorageError};
use tempfile::TempDir;

use super::super::{LogError, LogStore, MemLog};
use super::{conf, entry, open_small, snapshot};

/// Makes fresh stores of one kind.
trait Stores {
    type Log: LogStore;
    fn fresh(&self) -> Self::Log;
}

struct Mem;

impl Stores for Mem {
    type Log = MemLog;
    fn fresh(&self) -> MemLog {
        MemLog::new()
    }
}

struct Disk {
    root: TempDir,
    next: Cell<u32>,
}

impl Disk {
    fn new() -> Self {
        Disk {
            root: tempfile::tempdir().expect("tempdir"),
            next: Cell::new(0),
        }
    }
}

impl Stores for Disk {
    type Log = super::super::DiskLog;
    fn fresh(&self) -> Self::Log {
        self.next.set(self.next.get() + 1);
        // Small segments, so the fixtures span several.
        open_small(&self.root.path().join(self.next.get().to_string()), 64)
    }
}

fn no_ctx() -> GetEntriesContext {
    GetEntriesContext::empty(false)
}

fn store_err(e: StorageError) -> raft::Error {
    raft::Error::Store(e)
}

/// raft-rs's fixture: entries (3, 3), (4, 4), (5, 5) after a snapshot at (2, 2), all synced.
fn fixture<S: Stores>(stores: &S, ents: &[Entry]) -> S::Log {
    let log = stores.fresh();
    log.apply_snapshot(snapshot(2, 2, &[1, 2, 3])).unwrap();
    log.append(ents).unwrap();
    log.sync().unwrap();
    log
}

fn three() -> Vec<Entry> {
    vec![entry(3, 3), entry(4, 4), entry(5, 5)]
}

fn term<S: Stores>(stores: &S) {
    let log = fixture(stores, &three());
    assert_eq!(log.term(1), Err(store_err(StorageError::Compacted)));
    assert_eq!(log.term(2), Ok(2));
    assert_eq!(log.term(3), Ok(3));
    assert_eq!(log.term(4), Ok(4));
    assert_eq!(log.term(5), Ok(5));
    assert_eq!(log.term(6), Err(store_err(StorageError::Unavailable)));
}

fn entries<S: Stores>(stores: &S) {
    let ents = vec![entry(3, 3), entry(4, 4), entry(5, 5), entry(6, 6)];
    let size = |i: usize| u64::from(ents[i].compute_size());
    let cases: Vec<(u64, u64, u64, raft::Result<Vec<Entry>>)> = vec![
        (2, 6, u64::MAX, Err(store_err(StorageError::Compacted))),
        (3, 4, u64::MAX, Ok(vec![entry(3, 3)])),
        (4, 5, u64::MAX, Ok(vec![entry(4, 4)])),
        (4, 6, u64::MAX, Ok(vec![entry(4, 4), entry(5, 5)])),
        (
            4,
            7,
            u64::MAX,
            Ok(vec![entry(4, 4), entry(5, 5), entry(6, 6)]),
        ),
        // even if max_size is zero, the first entry is returned
        (4, 7, 0, Ok(vec![entry(4, 4)])),
        (4, 7, size(1) + size(2), Ok(vec![entry(4, 4), entry(5, 5)])),
        (
            4,
            7,
            size(1) + size(2) + size(3) / 2,
            Ok(vec![entry(4, 4), entry(5, 5)]),
        ),
        (
            4,
            7,
            size(1) + size(2) + size(3) - 1,
            Ok(vec![entry(4, 4), entry(5, 5)]),
        ),
        (
            4,
            7,
            size(1) + size(2) + size(3),
            Ok(vec![entry(4, 4), entry(5, 5), entry(6, 6)]),
        ),
        // past the end: raft-rs's MemStorage panics; ours refuses
        (4, 8, u64::MAX, Err(store_err(StorageError::Unavailable))),
    ];
    let log = fixture(stores, &ents);
    for (i, (lo, hi, max, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            log.entries(lo, hi, max, no_ctx()),
            want,
            "case {i}: [{lo}, {hi}) max {max}"
        );
    }
}

fn last_index<S: Stores>(stores: &S) {
    let log = fixture(stores, &three());
    assert_eq!(log.last_index(), Ok(5));
    log.append(&[entry(6, 5)]).unwrap();
    assert_eq!(log.last_index(), Ok(6));
}

fn first_index<S: Stores>(stores: &S) {
    let log = fixture(stores, &three());
    assert_eq!(log.first_index(), Ok(3));
    log.compact(3, conf(&[1, 2, 3]), Vec::new()).unwrap();
    assert_eq!(log.first_index(), Ok(4));
}

fn compact<S: Stores>(stores: &S) {
    // (compact at, first index, term of the first entry, entries left)
    let cases = [
        (1, 3, 3, 3),
        (2, 3, 3, 3),
        (3, 4, 4, 2),
        (4, 5, 5, 1),
        (5, 6, 0, 0),
    ];
    for (i, (at, want_first, want_term, want_len)) in cases.into_iter().enumerate() {
        let log = fixture(stores, &three());
        log.compact(at, conf(&[1, 2, 3]), format!("state at {at}").into_bytes())
            .unwrap();
        let first = log.first_index().unwrap();
        assert_eq!(first, want_first, "case {i}");
        let term = log
            .entries(first, first + 1, 1, no_ctx())
            .map_or(0, |v| v.first().map_or(0, |e| e.term));
        assert_eq!(term, want_term, "case {i}");
        let last = log.last_index().unwrap();
        assert_eq!(
            log.entries(first, last + 1, 100, no_ctx()).unwrap().len(),
            want_len,
            "case {i}"
        );
        if at > 2 {
            let snap = log.snapshot(0, 0).unwrap();
            assert_eq!(snap.get_metadata().index, at, "case {i}");
            assert_eq!(snap.get_metadata().term, at, "case {i}");
            assert_eq!(
                &snap.data[..],
                format!("state at {at}").as_bytes(),
                "case {i}"
            );
            assert_eq!(
                log.term(at),
                Ok(at),
                "case {i}: the snapshot keeps its entry's term"
            );
        }
    }
    let log = fixture(stores, &three());
    assert!(matches!(
        log.compact(6, conf(&[1]), Vec::new()),
        Err(LogError::Unavailable {
            index: 6,
            last_index: 5
        })
    ));
    assert_eq!(
        log.first_index(),
        Ok(3),
        "a refused compaction changes nothing"
    );
}

fn create_snapshot<S: Stores>(stores: &S) {
    let unavailable = Err(store_err(StorageError::SnapshotTemporarilyUnavailable));
    assert_eq!(
        stores.fresh().snapshot(0, 0),
        unavailable,
        "no snapshot yet"
    );
    let log = fixture(stores, &three());
    log.compact(4, conf(&[1, 2, 3]), b"state".to_vec()).unwrap();
    let mut want = snapshot(4, 4, &[1, 2, 3]);
    want.data = b"state".to_vec().into();
    assert_eq!(log.snapshot(0, 0), Ok(want.clone()));
    assert_eq!(log.snapshot(4, 2), Ok(want));
    assert_eq!(
        log.snapshot(5, 2),
        unavailable,
        "not recent enough for the request"
    );
}

fn append<S: Stores>(stores: &S) {
    // (entries to append, the log after it; None: refused)
    let cases: Vec<(Vec<Entry>, Option<Vec<Entry>>)> = vec![
        (three(), Some(three())),
        (
            vec![entry(3, 3), entry(4, 6), entry(5, 6)],
            Some(vec![entry(3, 3), entry(4, 6), entry(5, 6)]),
        ),
        (
            vec![entry(3, 3), entry(4, 4), entry(5, 5), entry(6, 5)],
            Some(vec![entry(3, 3), entry(4, 4), entry(5, 5), entry(6, 5)]),
        ),
        // overwriting compacted entries is refused (raft-rs's MemStorage panics)
        (vec![entry(2, 3), entry(3, 3), entry(4, 5)], None),
        // truncate the existing entries and append
        (vec![entry(4, 5)], Some(vec![entry(3, 3), entry(4, 5)])),
        // direct append
        (
            vec![entry(6, 6)],
            Some(vec![entry(3, 3), entry(4, 4), entry(5, 5), entry(6, 6)]),
        ),
        // a gap after the end is refused (raft-rs's MemStorage panics)
        (vec![entry(7, 6)], None),
    ];
    for (i, (ents, want)) in cases.into_iter().enumerate() {
        let log = fixture(stores, &three());
        let result = log.append(&ents).and_then(|()| log.sync());
        match want {
            Some(want) => {
                result.unwrap();
                let last = log.last_index().unwrap();
                assert_eq!(
                    log.entries(3, last + 1, None, no_ctx()),
                    Ok(want),
                    "case {i}"
                );
            }
            None => {
                assert!(result.is_err(), "case {i}: {ents:?} must be refused");
                assert_eq!(
                    log.entries(3, 6, None, no_ctx()),
                    Ok(three()),
                    "case {i}: unchanged"
                );
            }
        }
    }
}

fn apply_snapshot<S: Stores>(stores: &S) {
    let log = stores.fresh();
    log.append(&[entry(1, 1), entry(2, 1)]).unwrap();
    log.apply_snapshot(snapshot(4, 4, &[1, 2, 3])).unwrap();
    assert_eq!(log.first_index(), Ok(5));
    assert_eq!(log.last_index(), Ok(4));
    assert_eq!(log.term(4), Ok(4));
    let state = log.initial_state().unwrap();
    assert_eq!((state.hard_state.term, state.hard_state.commit), (4, 4));
    assert_eq!(state.conf_state, conf(&[1, 2, 3]));
    assert!(matches!(
        log.apply_snapshot(snapshot(3, 3, &[1, 2, 3])),
        Err(LogError::SnapshotOutOfDate {
            index: 3,
            first_index: 5
        })
    ));
    assert_eq!(
        log.first_index(),
        Ok(5),
        "a refused snapshot changes nothing"
    );
}

fn bytes_since_snapshot<S: Stores>(stores: &S) {
    let log = fixture(stores, &three());
    let size: u64 = three().iter().map(|e| u64::from(e.compute_size())).sum();
    assert_eq!(log.bytes_since_snapshot(), size);
    log.append(&[entry(4, 7)]).unwrap();
    let size = u64::from(entry(3, 3).compute_size() + entry(4, 7).compute_size());
    assert_eq!(
        log.bytes_since_snapshot(),
        size,
        "truncated entries no longer count"
    );
    log.compact(4, conf(&[1]), Vec::new()).unwrap();
    assert_eq!(log.bytes_since_snapshot(), 0);
}

macro_rules! for_both_stores {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $name() { super::$name(&super::Mem); })*
        }
        mod disk {
            $(#[test] fn $name() { super::$name(&super::Disk::new()); })*
        }
    };
}

for_both_stores!(
    term,
    entries,
    last_index,
    first_index,
    compact,
    create_snapshot,
    append,
    apply_snapshot,
    bytes_since_snapshot,
);
