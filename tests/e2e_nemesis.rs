//! Faults at the network, the processes and the disk, checked against a recorded history
//! (issue 31; docs/RELIABILITY.md): three durable head replicas and four workers, each in a
//! network namespace of its own, under load from several recording clients, with each
//! nemesis of the short schedule injected once and healed; then the checker's rules over the
//! whole history must find nothing.
//!
//! Needs root (network namespaces, iptables, a tmpfs mount): without them the test fails,
//! naming the command that could not run. The real binaries must be built
//! (`cargo build --bins`, as for every end-to-end test).
//!
//! `scripts/nemesis-soak` runs the same test with the long schedule
//! (`ESCHER_NEMESIS_SCHEDULE=long`), every nemesis included. The checker's own tests (each
//! rule fails on a history that breaks it) are in `nemesis/checker.rs` and
//! `nemesis/linear.rs` and run with this file's tests.

mod nemesis;
mod procs;

use nemesis::nemeses::Nemesis;
use nemesis::run::{Schedule, run};

/// The nemeses the CI schedule injects: those escher survives today with a clean history.
/// The others run in the soak schedule only, until the fixes of issue 31 land; each is named
/// here with the anomaly it produces (see docs/RELIABILITY.md).
const CI_NEMESES: &[Nemesis] = &[
    Nemesis::PartitionWorker,
    Nemesis::PartitionLeader,
    // Its one OverCapacity was the checker's (an attempt killed before its first beat stayed
    // counted as running; docs/RELIABILITY.md).
    Nemesis::WorkerFromLeader,
    Nemesis::LeaderFromFollowers,
    Nemesis::OneWayLeaderLoss,
    Nemesis::SlowLossyLeader,
    Nemesis::KillLeader,
    Nemesis::PauseLeader,
    Nemesis::PauseWorker,
    Nemesis::KillWorker,
    Nemesis::PkillWorker,
    // Not yet: Nemesis::KillWorkerAndFence. Killing the worker and its fence supervisor
    // together (`pkill -9 escher`) leaves the worker's tasks running unfenced while the head
    // retries them elsewhere after the heartbeat timeout: AttemptsOverlap (soak run of
    // docs/RELIABILITY.md: a 6.7 s task ran 3.2 s beside its retry). It needs the kernel
    // container per task of issue 31 (a cgroup killed whole); the soak schedule keeps it.
    //
    // The leader's syncs made to wait 250 ms each: clean in six soak injections (two runs).
    Nemesis::SlowDisk,
    // Replica h3's data file system filled, then freed: clean in every soak injection since a
    // stalled leader stopped renewing leases (docs/RELIABILITY.md).
    Nemesis::DiskFull,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_nemesis_schedule_under_load_leaves_a_history_the_checker_finds_clean() {
    let schedule = Schedule::from_env(CI_NEMESES).expect("the schedule");
    let report = run(&schedule).await.expect("the nemesis run");
    println!("{}", report.table);
    if let Ok(path) = std::env::var("ESCHER_NEMESIS_REPORT") {
        std::fs::write(&path, &report.table).expect("writing the report");
    }
    assert_eq!(
        report.windows.len(),
        schedule.steps.len(),
        "every nemesis of the schedule was injected"
    );
    assert!(
        report.history.submits.iter().any(|s| s.outcome.is_ok()),
        "no submit was acknowledged: the load did not run"
    );
    assert!(
        !report.history.execs.is_empty(),
        "no task recorded an execution: the tasks did not run"
    );
    assert!(
        report.anomalies.is_empty() && report.findings.is_empty(),
        "the checker found {} anomalies, the recovery {} findings:\n{}",
        report.anomalies.len(),
        report.findings.len(),
        report.table
    );
}

/// The slow-disk nemesis' shim (`nemesis/slowdisk.c`), preloaded into a process, makes each of
/// its syncs wait for as long as its file says, and none once the file says 0: checked on
/// `dd conv=fsync`, which writes one byte and fsyncs it.
#[test]
fn the_slow_disk_shim_delays_syncs_by_what_its_file_says() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let shim = dir.path().join("slowdisk.so");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nemesis/slowdisk.c");
    let cc = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let control = dir.path().join("delay");
    let synced = |ms: u64| {
        std::fs::write(&control, ms.to_string()).unwrap();
        let started = std::time::Instant::now();
        let out = std::process::Command::new("dd")
            .args(["if=/dev/zero", "bs=1", "count=1", "conv=fsync"])
            .arg(format!("of={}", dir.path().join("file").display()))
            .env("LD_PRELOAD", &shim)
            .env("NEMESIS_SLOW_DISK_FILE", &control)
            .output()
            .expect("dd");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        started.elapsed()
    };
    let slow = synced(nemesis::nemeses::SLOW_DISK_MS);
    assert!(
        slow >= std::time::Duration::from_millis(nemesis::nemeses::SLOW_DISK_MS),
        "a slowed sync took {slow:?}"
    );
    // Healed: no wait is added (what is left is dd's own time, far under the delay).
    let fast = synced(0);
    assert!(fast < slow, "{fast:?} then {slow:?}");
}
