//! The simulation's disk (`SimDisk`) keeps what a real disk keeps across a crash, no more: what
//! was only buffered is lost, an fsync cut short keeps a prefix of its records, what an fsync
//! or a snapshot made durable stays; and a full disk refuses writes the way `DiskLog` does,
//! changing nothing.

use escher_head::replication::{LogError, LogStore, SimDisk};
use raft::Storage as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

fn entry(index: u64) -> Entry {
    Entry {
        index,
        term: 1,
        data: vec![7; 16].into(),
        ..Default::default()
    }
}

fn commit(at: u64) -> HardState {
    HardState {
        term: 1,
        commit: at,
        ..Default::default()
    }
}

#[test]
fn a_crash_loses_what_was_never_synced() {
    let disk = SimDisk::new();
    disk.append(&[entry(1), entry(2)]).unwrap();
    disk.set_hard_state(commit(2)).unwrap();
    assert_eq!(disk.last_index().unwrap(), 2, "reads see writes at once");
    let after = disk.crash(usize::MAX);
    assert_eq!(after.last_index().unwrap(), 0);
    assert_eq!(after.initial_state().unwrap().hard_state.commit, 0);
}

#[test]
fn a_crash_during_an_fsync_keeps_a_prefix_of_it() {
    let disk = SimDisk::new();
    disk.append(&[entry(1)]).unwrap();
    disk.set_hard_state(commit(1)).unwrap();
    disk.sync().unwrap();
    assert!(disk.syncing());
    assert_eq!(disk.in_flight(), 2);
    disk.append(&[entry(2)]).unwrap();
    // The fsync's first record made it, its second (the hard state) was torn off; the entry
    // written after the sync was only buffered.
    let torn = disk.crash(1);
    assert_eq!(torn.last_index().unwrap(), 1);
    assert_eq!(torn.initial_state().unwrap().hard_state.commit, 0);
    assert!(!torn.syncing());
}

#[test]
fn an_ended_fsync_survives_every_crash() {
    let disk = SimDisk::new();
    disk.append(&[entry(1), entry(2)]).unwrap();
    disk.set_hard_state(commit(2)).unwrap();
    disk.sync().unwrap();
    disk.settle();
    assert!(!disk.syncing());
    let after = disk.crash(0);
    assert_eq!(after.last_index().unwrap(), 2);
    assert_eq!(after.initial_state().unwrap().hard_state.commit, 2);
    // A second life's disk crashes the same way.
    after.append(&[entry(3)]).unwrap();
    assert_eq!(after.crash(0).last_index().unwrap(), 2);

    // Every crash during a later fsync, whatever part of it the crash tears off, keeps what the
    // ended one made durable.
    let later = |disk: &SimDisk| {
        disk.append(&[entry(3)]).unwrap();
        disk.set_hard_state(commit(3)).unwrap();
        disk.sync().unwrap();
        disk.in_flight()
    };
    let in_flight = later(&disk.crash(0));
    assert!(
        in_flight >= 2,
        "the later fsync holds an entry and a hard state"
    );
    for keep in 0..=in_flight {
        let life = disk.crash(0);
        assert_eq!(later(&life), in_flight);
        let torn = life.crash(keep);
        assert!(torn.last_index().unwrap() >= 2, "a crash keeping {keep}");
        assert!(
            torn.initial_state().unwrap().hard_state.commit >= 2,
            "a crash keeping {keep}"
        );
        assert_eq!(
            torn.term(2).unwrap(),
            entry(2).term,
            "a crash keeping {keep}"
        );
    }
}

#[test]
fn a_compaction_makes_everything_before_it_durable() {
    let disk = SimDisk::new();
    disk.append(&[entry(1), entry(2), entry(3)]).unwrap();
    disk.set_hard_state(commit(3)).unwrap();
    disk.sync().unwrap();
    disk.compact(2, ConfState::default(), b"state".to_vec())
        .unwrap();
    let after = disk.crash(0);
    assert_eq!(after.first_index().unwrap(), 3);
    assert_eq!(after.last_index().unwrap(), 3);
    assert_eq!(after.snapshot(0, 1).unwrap().data.as_ref(), b"state");
}

#[test]
fn a_full_disk_refuses_the_sync_and_keeps_the_records_for_the_next() {
    let disk = SimDisk::new();
    disk.set_full(true);
    disk.append(&[entry(1)]).unwrap();
    let refused = disk.sync().unwrap_err();
    assert!(matches!(refused, LogError::NoSpace { .. }), "{refused}");
    assert!(refused.for_want_of_space());
    assert!(!disk.syncing());
    let full = disk
        .compact(1, ConfState::default(), Vec::new())
        .unwrap_err();
    assert!(full.for_want_of_space(), "{full}");
    assert_eq!(
        disk.first_index().unwrap(),
        1,
        "a refused compaction changes nothing"
    );
    disk.set_full(false);
    disk.sync().unwrap();
    disk.settle();
    assert_eq!(disk.crash(0).last_index().unwrap(), 1);
}

#[test]
fn a_full_disk_refuses_a_leaders_snapshot_and_changes_nothing() {
    let disk = SimDisk::new();
    disk.append(&[entry(1)]).unwrap();
    disk.sync().unwrap();
    disk.settle();
    let mut snap = Snapshot::default();
    snap.mut_metadata().index = 9;
    snap.mut_metadata().term = 2;
    snap.data = b"leader's state".to_vec().into();
    disk.set_full(true);
    let refused = disk.apply_snapshot(snap.clone()).unwrap_err();
    assert!(matches!(refused, LogError::NoSpace { .. }), "{refused}");
    assert_eq!(disk.last_index().unwrap(), 1);
    assert_eq!(disk.first_index().unwrap(), 1);
    // Space again: the same snapshot goes in, durable at once.
    disk.set_full(false);
    disk.apply_snapshot(snap).unwrap();
    let after = disk.crash(0);
    assert_eq!(after.first_index().unwrap(), 10);
    assert_eq!(after.initial_state().unwrap().hard_state.commit, 9);
}

#[test]
fn a_cut_tail_loses_the_newest_synced_records_and_is_reported_once() {
    let disk = SimDisk::new();
    // Two synced writes (each an entry and a hard state), then one under way.
    for i in 1..=2 {
        disk.append(&[entry(i)]).unwrap();
        disk.set_hard_state(commit(i)).unwrap();
        disk.sync().unwrap();
        disk.settle();
    }
    disk.append(&[entry(3)]).unwrap();
    disk.sync().unwrap();
    assert_eq!(disk.lost_tail(), None, "nothing lost yet");
    // The cut takes the second write's two records and the fsync under way.
    let cut = disk.crash_cut(2);
    assert_eq!(cut.last_index().unwrap(), 1);
    assert_eq!(cut.initial_state().unwrap().hard_state.commit, 1);
    let lost = cut.lost_tail().expect("the cut write is reported");
    assert!(
        !lost.written_whole,
        "a cut tail looks like an unfinished write"
    );
    assert!(lost.bytes > 0 && lost.offset > 0, "{lost:?}");
    assert!(
        lost.ids_at_risk() > escher_head::replication::CUT_TAIL_IDS,
        "{lost:?}"
    );
    // The recovery cut the damage off: the next crash finds a clean log, with what the cut
    // left and what was synced since.
    cut.append(&[entry(2)]).unwrap();
    cut.sync().unwrap();
    cut.settle();
    let again = cut.crash(0);
    assert_eq!(again.lost_tail(), None);
    assert_eq!(again.last_index().unwrap(), 2);
    // A cut never reaches behind a compaction: it is durable with everything before it.
    again
        .compact(2, ConfState::default(), b"state".to_vec())
        .unwrap();
    let behind = again.crash_cut(4);
    assert_eq!(
        behind.lost_tail(),
        None,
        "nothing synced since the compaction"
    );
    assert_eq!(behind.first_index().unwrap(), 3);
}
