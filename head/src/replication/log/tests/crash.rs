//! The storage crash test: a real writer process appends and syncs as fast as it can, printing
//! each write once `sync` has returned; the test SIGKILLs it at random moments, reopens the log,
//! and checks that every entry reported synced is there and intact, that the log verifies, and
//! that the hard state is no older than the last one reported. The next writer continues on the
//! recovered log, so later rounds replay logs that were cut in earlier ones.
//!
//! The writer is this test binary run again with `ESCHER_RAFTLOG_CRASH_WRITER` set to the log
//! directory: the same test sees the variable and writes instead of checking. It truncates now
//! and then (a new term rewriting the last few uncommitted entries), compacts every few dozen
//! writes, and uses small segments, so kills land in rotations and compactions too.
//! `ESCHER_RAFTLOG_CRASH_SEED` replays a run; the seed is printed.
//!
//! SIGKILL almost never tears a write of this size (the kernel finishes copying a small write
//! into the page cache before the process dies), so this test proves that what `sync` reported
//! survives a kill at any moment; `damage.rs` cuts and flips the bytes of the last write to
//! prove that a torn one is detected and cut.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use raft::eraftpb::HardState;
use raft::{GetEntriesContext, Storage};

use super::super::{DiskLog, LogStore};
use super::{conf, entry_with_data, open_small, payload};

const WRITER_ENV: &str = "ESCHER_RAFTLOG_CRASH_WRITER";
const SEED_ENV: &str = "ESCHER_RAFTLOG_CRASH_SEED";
const SEGMENT_BYTES: u64 = 48 << 10;
const ROUNDS: usize = 12;

/// One write the writer reported synced.
#[derive(Debug, Clone, Copy)]
struct Report {
    first: u64,
    last: u64,
    term: u64,
    commit: u64,
}

impl Report {
    fn parse(line: &str) -> Option<Report> {
        let mut words = line
            .strip_prefix("SYNCED ")?
            .split(' ')
            .map(str::parse::<u64>);
        let mut next = || words.next()?.ok();
        Some(Report {
            first: next()?,
            last: next()?,
            term: next()?,
            commit: next()?,
        })
    }
}

#[test]
fn a_killed_writer_loses_no_synced_entry() {
    if let Some(dir) = std::env::var_os(WRITER_ENV) {
        write_until_killed(Path::new(&dir));
    }
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("crash test seed {seed} (set {SEED_ENV} to replay)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let test_name = concat!(module_path!(), "::a_killed_writer_loses_no_synced_entry");
    let test_name = test_name
        .split_once("::")
        .map_or(test_name, |(_, rest)| rest);

    // What the log must hold: index -> term of everything reported synced.
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    let mut commit = 0;
    let mut cut_writes = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(WRITER_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let kill_after = rng.usize(1..60);
        let mut seen = 0;
        let mut killed = false;
        for line in lines.by_ref() {
            let Some(report) = Report::parse(&line.unwrap()) else {
                continue;
            };
            record(&mut expected, &mut commit, report);
            seen += 1;
            if seen == kill_after && !killed {
                std::thread::sleep(Duration::from_micros(rng.u64(0..3_000)));
                child.kill().unwrap();
                killed = true;
            }
        }
        // Reports printed before the kill and still in the pipe were read above.
        let status = child.wait().unwrap();
        assert!(
            killed,
            "round {round}: the writer exited by itself ({status}) after {seen} writes"
        );

        let before = newest_segment_len(dir.path());
        let log = open_small(dir.path(), SEGMENT_BYTES);
        if newest_segment_len(dir.path()) < before {
            cut_writes += 1;
        }
        verify(&log, &expected, commit, round);
        // The recovered log is the truth the next writer continues from.
        expected = contents(&log);
        commit = log.initial_state().unwrap().hard_state.commit;
    }
    eprintln!("{ROUNDS} writers killed; recovery cut a torn write after {cut_writes} of them");
}

/// The size of the newest segment file: recovery shrinks it when it cuts a torn write.
fn newest_segment_len(dir: &Path) -> u64 {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .unwrap();
    std::fs::metadata(newest).unwrap().len()
}

fn record(expected: &mut BTreeMap<u64, u64>, commit: &mut u64, r: Report) {
    expected.split_off(&r.first);
    expected.extend((r.first..=r.last).map(|i| (i, r.term)));
    *commit = r.commit;
}

/// Every entry reported synced is present with its term and data, unless a later write (synced
/// but killed before it was reported) overwrote it: then the first entry that differs carries a
/// newer term, and it is above the commit index. Every entry present is intact, and the hard
/// state is no older than reported.
fn verify(log: &DiskLog, expected: &BTreeMap<u64, u64>, commit: u64, round: usize) {
    let first = log.first_index().unwrap();
    let last = log.last_index().unwrap();
    let ents = log
        .entries(first, last + 1, None, GetEntriesContext::empty(false))
        .unwrap();
    for e in &ents {
        assert_eq!(
            &e.data[..],
            payload(e.index, e.term),
            "round {round}: entry {} damaged",
            e.index
        );
    }
    let differs = expected
        .range(first - 1..)
        .find(|&(&index, &term)| log.term(index) != Ok(term));
    if let Some((&index, &term)) = differs {
        assert!(
            index > commit,
            "round {round}: committed entry {index} lost or changed"
        );
        let found = log.term(index);
        assert!(
            found.as_ref().is_ok_and(|&t| t > term),
            "round {round}: entry {index} of term {term} was synced, but the log has {found:?}"
        );
    }
    let hs = log.initial_state().unwrap().hard_state;
    assert!(
        hs.commit >= commit,
        "round {round}: commit {} < reported {commit}",
        hs.commit
    );
    assert!(
        hs.commit <= last,
        "round {round}: commit {} past the end {last}",
        hs.commit
    );
}

fn contents(log: &DiskLog) -> BTreeMap<u64, u64> {
    let (first, last) = (log.first_index().unwrap(), log.last_index().unwrap());
    (first - 1..=last)
        .filter_map(|i| Some((i, log.term(i).ok()?)))
        .collect()
}

/// The writer: appends batches, sets the hard state, syncs, reports; forever.
fn write_until_killed(dir: &Path) -> ! {
    let log = open_small(dir, SEGMENT_BYTES);
    let mut rng = fastrand::Rng::new();
    let mut out = std::io::stdout().lock();
    let mut hs = log.initial_state().unwrap().hard_state;
    let mut term = hs
        .term
        .max(log.term(log.last_index().unwrap()).unwrap())
        .max(1);
    for n in 0u64.. {
        let last = log.last_index().unwrap();
        let mut first = last + 1;
        if n % 13 == 7 {
            // A new leader overwrites the uncommitted tail.
            first = last
                .saturating_sub(3)
                .max(hs.commit + 1)
                .max(log.first_index().unwrap());
            term += 1;
        }
        let count = rng.u64(1..=40);
        let ents: Vec<_> = (first..first + count)
            .map(|i| entry_with_data(i, term))
            .collect();
        log.append(&ents).unwrap();
        // Entries first, then the hard state that commits them, as raft-rs's ready loop does.
        // The commit index trails the end by a few entries, so there is a tail to overwrite.
        hs = HardState {
            term,
            vote: 1,
            commit: (first + count - 1).saturating_sub(4).max(hs.commit),
            ..HardState::default()
        };
        log.set_hard_state(hs.clone()).unwrap();
        log.sync().unwrap();
        writeln!(
            out,
            "SYNCED {first} {} {term} {}",
            first + count - 1,
            hs.commit
        )
        .unwrap();
        out.flush().unwrap();
        if n % 29 == 28 {
            let at = hs.commit.saturating_sub(rng.u64(0..50));
            log.compact(at, conf(&[1]), format!("state at {at}").into_bytes())
                .unwrap();
        }
    }
    unreachable!("the writer runs until it is killed")
}
