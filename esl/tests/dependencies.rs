//! What an ESL author compiles: `escher-esl` with its default features depends on the client
//! (without the CLI) and the pure core, never on the head's runtime, the CLI, the binaries' own
//! crates or the GPU reproductions (`escher-gpu`, with its MILP solver); and the core depends
//! on no runtime, transport or consensus crate. Read from `cargo tree` over the workspace's
//! lock file, so a dependency added by mistake fails here.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates (names only) in `package`'s normal dependency tree with its default features.
fn tree(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn assert_none_of(package: &str, crates: &BTreeSet<String>, forbidden: &[&str]) {
    let found: Vec<&&str> = forbidden.iter().filter(|c| crates.contains(**c)).collect();
    assert!(found.is_empty(), "{package} depends on {found:?}");
}

#[test]
fn an_esl_author_compiles_the_client_and_the_core_only() {
    let crates = tree("escher-esl");
    for needed in ["escher-client", "escher-core", "escher-proto"] {
        assert!(
            crates.contains(needed),
            "escher-esl no longer depends on {needed}"
        );
    }
    assert_none_of(
        "escher-esl",
        &crates,
        &[
            // The head's runtime and the other binaries.
            "escher-head",
            "escher-worker",
            "escher-cli",
            "escher",
            // What only they use: consensus, certificates, metrics, the CLI's parsing and
            // rendering, the binaries' allocator and log output.
            "raft",
            "protobuf",
            "rcgen",
            "prometheus-client",
            "clap",
            "comfy-table",
            "indicatif",
            "tikv-jemallocator",
            "tracing-subscriber",
            // The GPU policies reproduced from their papers are a policy crate on this one,
            // with the MILP solver only MIGRator's planner uses.
            "escher-gpu",
            "good_lp",
            "microlp",
        ],
    );
}

#[test]
fn the_gpu_crate_is_a_policy_crate_on_the_esl_library() {
    let crates = tree("escher-gpu");
    for needed in ["escher-esl", "escher-client", "good_lp"] {
        assert!(
            crates.contains(needed),
            "escher-gpu no longer depends on {needed}"
        );
    }
    assert_none_of(
        "escher-gpu",
        &crates,
        &["escher-head", "escher-worker", "escher-cli", "escher"],
    );
}

#[test]
fn the_core_has_no_runtime_transport_or_consensus() {
    let crates = tree("escher-core");
    assert_none_of(
        "escher-core",
        &crates,
        &[
            "tokio",
            "tonic",
            "prost",
            "raft",
            "protobuf",
            "axum",
            "hyper",
            "escher-client",
        ],
    );
}
