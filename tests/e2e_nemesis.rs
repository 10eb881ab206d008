//! Faults at the network, the processes and the disk, checked against a recorded history
//! (docs/RELIABILITY.md): three durable head replicas and four workers, each in a
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
//! rule fails on a hand-made history that breaks it) are in `nemesis/checker.rs`,
//! `nemesis/checker/` and `nemesis/linear.rs`, and run with this file's tests, or alone and
//! without a cluster: `cargo test --test e2e_nemesis nemesis::`.

mod nemesis;
mod procs;

use nemesis::nemeses::Nemesis;
use nemesis::run::{Schedule, run};

/// The nemeses the CI schedule injects: every one, each once. Those that once found anomalies
/// (docs/RELIABILITY.md): `worker-from-leader`'s OverCapacity was the checker's (an attempt
/// killed before its first beat stayed counted as running); `disk-full` is clean since a
/// stalled leader stopped renewing leases; `kill-worker-and-fence` since the worker's PID
/// namespace ends its tasks with it.
const CI_NEMESES: &[Nemesis] = &Nemesis::ALL;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn needs_root_the_nemesis_schedule_under_load_leaves_a_history_the_checker_finds_clean() {
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
        report.history.tasks.values().all(|t| t.attempts.is_some()),
        "the head's attempts were not read for every task: the executions were not checked \
         against them"
    );
    assert!(
        !report.history.capacity.is_empty(),
        "no status read recorded a capacity: the capacity rule had nothing to go by"
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
