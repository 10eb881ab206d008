//! Readers on other threads while one thread appends, syncs and compacts: every read sees a
//! consistent log (entries contiguous from the first index, each intact), and nothing deadlocks.

use std::sync::atomic::{AtomicBool, Ordering};

use raft::{GetEntriesContext, Storage};

use super::super::LogStore;
use super::{conf, entry_with_data, open_small, payload};

#[test]
fn reads_stay_consistent_while_another_thread_writes() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_small(dir.path(), 4 << 10);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            let (log, done) = (log.clone(), &done);
            s.spawn(move || {
                let mut reads = 0u64;
                while !done.load(Ordering::Relaxed) || reads == 0 {
                    // Each call is consistent on its own; the log may move between calls.
                    let first = log.first_index().unwrap();
                    let Ok(ents) =
                        log.entries(first, first + 8, None, GetEntriesContext::empty(false))
                    else {
                        continue; // compacted or shortened meanwhile
                    };
                    for (i, e) in (first..).zip(&ents) {
                        assert_eq!(e.index, i);
                        assert_eq!(&e.data[..], payload(e.index, e.term));
                    }
                    reads += 1;
                }
            });
        }
        for n in 1..=300u64 {
            log.append(&[entry_with_data(n, 1)]).unwrap();
            if n % 3 == 0 {
                log.sync().unwrap();
            }
            if n % 50 == 0 {
                log.compact(n - 10, conf(&[1]), Vec::new()).unwrap();
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!((log.first_index(), log.last_index()), (Ok(291), Ok(300)));
}
