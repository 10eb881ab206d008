//! What an ESL author compiles: `escher-esl` with its default features depends on the client
//! (without the CLI) and the pure core, never on the head's runtime, the CLI, the binaries' own
//! crates or the GPU reproductions (`escher-gpu`, with its MILP solver); it has only the client
//! half of gRPC (no axum, no server side of tonic or hyper) and runs no code generator at build
//! time; and the core depends on no runtime, transport or consensus crate. Read from `cargo
//! tree` over the workspace's lock file, so a dependency added by mistake fails here.
//!
//! Without its default `grpc` (`default-features = false, features = ["in-memory"]`, what `escher
//! new esl` writes for a policy crate), it has no network stack at all: neither gRPC, HTTP/2
//! nor TLS.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates (names only) in `package`'s normal dependency tree with its default features.
fn tree(package: &str) -> BTreeSet<String> {
    lines(package, "normal")
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The features turned on in `package`'s normal dependency tree, as `crate feature "name"`.
fn features(package: &str) -> BTreeSet<String> {
    lines(package, "normal,features")
        .iter()
        .filter(|line| line.contains(" feature \""))
        .map(|line| line.trim_end_matches(" (*)").to_owned())
        .collect()
}

/// `cargo tree`'s lines for `package` over the edges `edges`, without the tree's drawing.
fn lines(package: &str, edges: &str) -> Vec<String> {
    lines_with(package, edges, &[])
}

/// [`lines`] with more arguments to `cargo tree` (features).
fn lines_with(package: &str, edges: &str, more: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked", "-e", edges])
        .args(["--prefix", "none", "-p", package])
        .args(more)
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
            // The server side of HTTP: tonic's router is built on axum, and the head's
            // endpoints use it directly.
            "axum",
            "axum-core",
        ],
    );
}

/// The GPU reproductions' MILP solver sits behind `escher-gpu`'s default `milp` feature: a policy
/// crate that uses the other reproductions (`default-features = false`) compiles no solver. CI
/// builds the crate so (`.ci/run`'s clippy step for it); this reads what it then depends on.
#[test]
fn the_gpu_crate_without_milp_compiles_no_solver() {
    let without = ["--no-default-features"];
    let crates: BTreeSet<String> = lines_with("escher-gpu", "normal", &without)
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        crates.contains("escher-esl"),
        "escher-gpu no longer depends on escher-esl: {crates:?}"
    );
    assert_none_of("escher-gpu", &crates, &["good_lp", "microlp"]);
    // The check reads what it means to: with the default features the solver is there.
    let with = tree("escher-gpu");
    assert!(
        with.contains("good_lp") && with.contains("microlp"),
        "escher-gpu's default features no longer bring the solver: {with:?}"
    );
}

/// The network stack: gRPC, HTTP/2, HTTP, TLS, the tower middleware and protobuf.
const NETWORK: [&str; 12] = [
    "tonic",
    "tonic-prost",
    "prost",
    "hyper",
    "hyper-util",
    "h2",
    "http",
    "tower",
    "rustls",
    "ring",
    "tokio-rustls",
    "tokio-stream",
];

#[test]
fn without_grpc_an_esl_compiles_no_network_stack() {
    let without = ["--no-default-features", "--features", "in-memory"];
    let crates: BTreeSet<String> = lines_with("escher-esl", "normal,build", &without)
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for needed in ["escher-client", "escher-core", "escher-proto"] {
        assert!(
            crates.contains(needed),
            "escher-esl without grpc lacks {needed}"
        );
    }
    assert_none_of("escher-esl without grpc", &crates, &NETWORK);
    // The client without its network half: the task builder and the error type, no runtime.
    let client: BTreeSet<String> = lines_with("escher-client", "normal,build", &without[..1])
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(client.contains("escher-proto"), "{client:?}");
    assert_none_of("escher-client without grpc", &client, &NETWORK);
    assert_none_of("escher-client without grpc", &client, &["tokio"]);
    // The check reads what it means to: with the default features the stack is there.
    let with = tree("escher-esl");
    for needed in ["tonic", "hyper", "h2"] {
        assert!(with.contains(needed), "escher-esl with grpc lacks {needed}");
    }
}

#[test]
fn an_esl_build_runs_no_code_generator() {
    // escher-proto ships the code generated from escher.proto (proto/gen, escher-proto-gen, keeps
    // it fresh), so no build script in an ESL's tree runs protoc or prost-build.
    let crates: BTreeSet<String> = lines("escher-esl", "normal,build")
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        crates.contains("escher-proto"),
        "escher-esl without escher-proto"
    );
    assert_none_of(
        "escher-esl (normal and build dependencies)",
        &crates,
        &[
            "tonic-prost-build",
            "tonic-build",
            "prost-build",
            "protoc-bin-vendored",
        ],
    );
}

#[test]
fn an_esl_author_compiles_the_client_half_of_grpc_only() {
    let on = features("escher-esl");
    for needed in [
        r#"tonic feature "channel""#,
        r#"tonic feature "codegen""#,
        r#"hyper feature "client""#,
    ] {
        assert!(on.contains(needed), "escher-esl's tree lacks {needed}");
    }
    let server: Vec<&String> = on
        .iter()
        .filter(|f| {
            [
                r#"tonic feature "server""#,
                r#"tonic feature "router""#,
                r#"tonic feature "transport""#,
                r#"tonic feature "default""#,
                r#"hyper feature "server""#,
                r#"hyper-util feature "server""#,
            ]
            .contains(&f.as_str())
        })
        .collect();
    assert!(
        server.is_empty(),
        "escher-esl's tree turns on the server side: {server:?}"
    );
}

#[test]
fn the_head_serves_grpc() {
    // The other half of the split: without these the head would not build, so this only
    // shows that the check above reads features the way it means to.
    let on = features("escher-head");
    for needed in [r#"tonic feature "server""#, r#"hyper feature "server""#] {
        assert!(on.contains(needed), "escher-head's tree lacks {needed}");
    }
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
