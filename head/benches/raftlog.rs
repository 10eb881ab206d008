//! The raft log's store, measured: fsync'd append throughput of escher's `DiskLog` and of redb
//! (a B-tree store, the alternative docs/DESIGN.md §7 names) in the same run, with a bare
//! `write` + `fdatasync` of the same bytes as the floor the device sets.
//!
//! Each workload appends batches of 1, 10, 100 and 1,000 raft entries of ~300 bytes (encoded)
//! with one sync per batch, for `--seconds` each, in a fresh directory under the target
//! directory (so on the disk a data dir would use, not a tmpfs). `--runs N` repeats the table
//! and prints the median of each cell.
//!
//! Run: `cargo bench -p escher-head --bench raftlog -- --runs 3`.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use escher_head::replication::log::{DiskLog, LogIdentity, LogStore};
use protobuf::Message as _;
use raft::eraftpb::Entry;
use redb::{Database, TableDefinition};
use statrs::statistics::{Data, Median};

const BATCHES: [u64; 4] = [1, 10, 100, 1_000];
const DATA_BYTES: usize = 290;
const ENTRIES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("entries");

/// Entries per second and megabytes (encoded entries) per second.
#[derive(Debug, Clone, Copy)]
struct Rate {
    entries: f64,
    mb: f64,
}

/// A store under test: appends one batch and makes it durable.
trait Store {
    fn append_synced(&mut self, batch: &[Entry]);
}

struct Escher(DiskLog);

impl Store for Escher {
    fn append_synced(&mut self, batch: &[Entry]) {
        self.0.append(batch).expect("append");
        self.0.sync().expect("sync");
    }
}

struct Redb(Database);

impl Store for Redb {
    fn append_synced(&mut self, batch: &[Entry]) {
        let tx = self.0.begin_write().expect("begin");
        {
            let mut table = tx.open_table(ENTRIES).expect("table");
            for e in batch {
                table
                    .insert(e.index, e.write_to_bytes().expect("encode").as_slice())
                    .expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
}

struct BareFile(File);

impl Store for BareFile {
    fn append_synced(&mut self, batch: &[Entry]) {
        let mut buf = Vec::new();
        for e in batch {
            e.write_length_delimited_to_vec(&mut buf).expect("encode");
        }
        self.0.write_all(&buf).expect("write");
        self.0.sync_data().expect("fdatasync");
    }
}

fn measure(store: &mut dyn Store, batch: u64, budget: Duration) -> Rate {
    let data = Bytes::from(vec![0xa5u8; DATA_BYTES]);
    let make = |first: u64| -> Vec<Entry> {
        (first..first + batch)
            .map(|index| Entry {
                index,
                term: 1,
                data: data.clone(),
                ..Entry::default()
            })
            .collect()
    };
    let entry_bytes = u64::from(make(1)[0].compute_size());
    let start = Instant::now();
    let mut next = 1;
    while start.elapsed() < budget {
        let ents = make(next);
        store.append_synced(&ents);
        next += batch;
    }
    let secs = start.elapsed().as_secs_f64();
    let entries = (next - 1) as f64;
    Rate {
        entries: entries / secs,
        mb: entries * entry_bytes as f64 / secs / 1e6,
    }
}

/// One table: for each batch size, the three stores' rates.
fn run(root: &Path, budget: Duration) -> Vec<[Rate; 3]> {
    BATCHES
        .iter()
        .map(|&batch| {
            let dir = tempfile::tempdir_in(root).expect("tempdir");
            let identity = LogIdentity {
                group: "bench".into(),
                replica: 1,
            };
            let mut escher =
                Escher(DiskLog::open(&dir.path().join("log"), &identity).expect("open"));
            let mut redb = Redb(Database::create(dir.path().join("redb")).expect("redb"));
            let mut bare = BareFile(File::create(dir.path().join("bare")).expect("bare file"));
            [
                measure(&mut escher, batch, budget),
                measure(&mut redb, batch, budget),
                measure(&mut bare, batch, budget),
            ]
        })
        .collect()
}

fn median(xs: Vec<f64>) -> f64 {
    Data::new(xs).median()
}

fn print(title: &str, rows: &[[Rate; 3]]) {
    println!("{title}");
    println!(
        "| batch | escher DiskLog entries/s (MB/s) | redb entries/s (MB/s) | bare write+fdatasync entries/s (MB/s) | DiskLog / redb | DiskLog / bare |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (batch, [e, r, b]) in BATCHES.iter().zip(rows) {
        println!(
            "| {batch} | {:.0} ({:.1}) | {:.0} ({:.1}) | {:.0} ({:.1}) | {:.1}x | {:.2} |",
            e.entries,
            e.mb,
            r.entries,
            r.mb,
            b.entries,
            b.mb,
            e.entries / r.entries,
            e.entries / b.entries,
        );
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let runs = flag("--runs", 1.0) as usize;
    let budget = Duration::from_secs_f64(flag("--seconds", 1.0));
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root).expect("target tmpdir");
    let tables: Vec<_> = (1..=runs.max(1))
        .map(|i| {
            let rows = run(root, budget);
            print(&format!("run {i} of {runs}"), &rows);
            rows
        })
        .collect();
    if tables.len() > 1 {
        let medians: Vec<[Rate; 3]> = (0..BATCHES.len())
            .map(|b| {
                std::array::from_fn(|s| Rate {
                    entries: median(tables.iter().map(|t| t[b][s].entries).collect()),
                    mb: median(tables.iter().map(|t| t[b][s].mb).collect()),
                })
            })
            .collect();
        print(&format!("median of {runs} runs"), &medians);
    }
}
