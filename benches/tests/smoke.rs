//! Keeps the harness from rotting: runs every workload of `all` at `--size tiny` without peers
//! through the real binary (the GPU workload, the longest, in a run of its own beside the
//! others'), and checks that each one wrote well-formed JSON with figures. Nothing here
//! asserts a timing: performance is measured by the full run, never by tests.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const WORKLOADS: [&str; 22] = [
    "w1",
    "w2",
    "w3",
    "w4",
    "w5",
    "w6",
    "w7",
    "w8",
    "w9",
    "w10",
    "cmd",
    "retention",
    "sec",
    "watch",
    "esl",
    "e1",
    "e2",
    "e3",
    "e4",
    "cilantro",
    "gpu",
    "actors",
];

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Runs `workloads` at `--size tiny` through the real binary and checks every report and the
/// summary.
fn runs_at_tiny_size_and_writes_json(workloads: &[&str]) {
    let out = tempfile::tempdir().unwrap();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_escher-bench"));
    bench
        .args(workloads)
        .args(["--size", "tiny", "--out"])
        .arg(out.path());
    // W8's head: the one this test build built beside escher-bench (`cargo test --workspace`
    // builds every binary). Left to itself under cargo, the harness would build `escher-head`
    // alone, whose dependencies' features differ from the test build's: the next `cargo test`
    // in this target directory would then rebuild rustls, tonic and every escher crate.
    let head = Path::new(env!("CARGO_BIN_EXE_escher-bench")).with_file_name("escher-head");
    if head.is_file() {
        bench.arg("--head-bin").arg(&head);
    }
    let output = bench.output().expect("run escher-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "escher-bench failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("| workload | metric |"),
        "no table:\n{stdout}"
    );
    assert!(
        stdout.contains("docs/DESIGN.md §8 target"),
        "no targets:\n{stdout}"
    );

    for id in workloads {
        let report = read_json(&out.path().join(format!("{id}.json")));
        assert_eq!(report["id"], *id);
        assert_eq!(report["size"], "tiny");
        let figures = report["figures"].as_array().expect("figures is a list");
        assert!(!figures.is_empty(), "{id} reported no figure: {report:#}");
        for f in figures {
            assert!(f["id"].as_str().is_some_and(|s| s.starts_with(id)), "{f}");
            assert!(f["unit"].is_string(), "{f}");
            let value = f["escher"].as_f64().expect("a number");
            assert!(value.is_finite() && value >= 0.0, "{id}: {f}");
        }
        assert!(report["notes"].is_array());
        assert!(report["elapsed_s"].as_f64().is_some());
    }

    let summary = read_json(&out.path().join("summary.json"));
    assert_eq!(summary["size"], "tiny");
    assert_eq!(summary["failures"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        summary["workloads"].as_array().map(Vec::len),
        Some(workloads.len())
    );
    let targets = summary["targets"].as_array().expect("targets");
    // The eleven of docs/DESIGN.md §8, each with what was measured (or that its workload was
    // not run), and the three of the actors where `actors` ran.
    let actors = if workloads.contains(&"actors") { 3 } else { 0 };
    assert_eq!(targets.len(), 11 + actors);
    for t in targets {
        assert!(t["target"].is_string() && t["measured"].is_string(), "{t}");
    }
    assert!(out.path().join("results.md").is_file());
    // Plots need a TrueType font; where there is one, each plot is a PNG.
    for plot in summary["plots"].as_array().expect("plots") {
        let path = Path::new(plot.as_str().expect("a path"));
        let bytes = std::fs::read(path).expect("plot file");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    }
}

/// Every workload of `all` but `gpu`, in one run (as `all` runs them); `gpu`, the longest, runs
/// beside it in the next test.
#[test]
fn every_workload_but_gpu_runs_at_tiny_size_and_writes_json() {
    let workloads: Vec<&str> = WORKLOADS.into_iter().filter(|w| *w != "gpu").collect();
    runs_at_tiny_size_and_writes_json(&workloads);
}

#[test]
fn the_gpu_workload_runs_at_tiny_size_and_writes_json() {
    runs_at_tiny_size_and_writes_json(&["gpu"]);
}

#[test]
fn help_lists_the_options() {
    let output = Command::new(env!("CARGO_BIN_EXE_escher-bench"))
        .arg("--help")
        .output()
        .expect("run escher-bench --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in ["--size", "--peers", "--out", "--head-bin"] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    // The workloads `all` runs (those --help lists that do not say "not in `all`") are the ones
    // the tiny runs above cover.
    let arguments = help.split("Options:").next().unwrap_or_default();
    let in_all: Vec<&str> = arguments
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter(|l| !l.contains("not in `all`"))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .filter(|name| !["all", "thesis"].contains(name))
        .collect();
    assert_eq!(
        in_all, WORKLOADS,
        "the workloads of `all`, as --help lists them"
    );
}
