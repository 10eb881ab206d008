//! `escher new esl NAME` from the outside: the crate it writes into a directory outside the
//! workspace inherits nothing from escher's workspace, resolves offline against this checkout,
//! and its dependency trees are what an ESL author compiles: by default no network stack at
//! all (the library and its unit tests on the in-memory cluster), with `--features grpc` the
//! client half of gRPC (no server), with `--features cluster` the facade for the end-to-end
//! test; bad input writes nothing.
//!
//! Building and testing the written crate (`cargo test` in it) is `scripts/esl-template`, a
//! step of CI of its own: a `cargo` run from inside this test would wait forever for the build
//! directory that the `cargo test` running it holds, and one with a target directory of its
//! own would build every dependency a second time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The checkout's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// `escher new esl` with `args`, in a home of its own.
fn new_esl(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("a temporary home");
    Command::new(env!("CARGO_BIN_EXE_escher"))
        .env("ESCHER_HOME", home.path())
        .env_remove("ESCHER_HEAD")
        .args(["new", "esl"])
        .args(args)
        .output()
        .expect("escher runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cargo tree` over the crate in `dir` with `more` arguments (features): its lines, each a
/// crate (`name v1.2.3 ...`), or a feature (`crate feature "name"`) with `-e normal,features`.
fn tree(dir: &Path, edges: &str, more: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", edges, "--prefix", "none"])
        .args(more)
        .current_dir(dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree in {} failed: {}",
        dir.display(),
        text(&out.stderr)
    );
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn a_new_esl_outside_the_workspace_resolves_against_this_checkout() {
    let outside = tempfile::tempdir().expect("a temporary directory");
    assert!(
        !outside.path().starts_with(repo()),
        "the temporary directory must be outside the workspace"
    );
    let dir = outside.path().join("spot-cap");
    let repo = repo();
    let out = new_esl(&[
        "spot-cap",
        "--dir",
        dir.to_str().unwrap(),
        "--escher-path",
        repo.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("wrote the ESL crate spot-cap"));

    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(!manifest.contains("workspace"), "{manifest}");
    assert!(
        manifest.contains(r#"debug = "line-tables-only""#),
        "{manifest}"
    );
    for file in ["src/lib.rs", "src/tests.rs", "tests/e2e.rs", ".gitignore"] {
        let written = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            !written.contains("escher_custom_esl") && !written.contains("escher-custom-esl"),
            "{file} still names the template"
        );
    }
    let e2e = std::fs::read_to_string(dir.join("tests/e2e.rs")).unwrap();
    assert!(e2e.contains("use spot_cap::ExposureCap;"));

    // The workspace's lock file pins the versions this checkout builds with, offline; cargo
    // drops what the new crate does not use.
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    // Normal and build dependencies: every crate `cargo build` compiles for the library.
    let lines = tree(&dir, "normal,build", &[]);
    let crates = names(&lines);
    let builds = versions(&lines);
    for needed in ["spot-cap", "escher-esl", "escher-client", "escher-proto"] {
        assert!(
            crates.contains(needed),
            "the new crate's tree lacks {needed}"
        );
    }
    for absent in [
        "escher",
        "escher-head",
        "escher-worker",
        // Its tests' in-memory cluster, a dev-dependency.
        "escher-core",
        "axum",
        "raft",
        "clap",
        // No network stack without `--features grpc`.
        "tonic",
        "prost",
        "hyper",
        "h2",
        "tower",
        "rustls",
        "ring",
        // escher-proto ships its generated code (escher-proto-gen in proto/gen/ keeps it fresh).
        "tonic-prost-build",
        "prost-build",
        "protoc-bin-vendored",
        // The client's and the ESL library's tokio features, not the workspace's `full`.
        "parking_lot",
        "signal-hook-registry",
        // Secrets and client ids come from getrandom alone.
        "rand",
    ] {
        assert!(
            !crates.contains(absent),
            "the new crate's tree (normal and build) has {absent}"
        );
    }
    // What an author's library build compiles: 48 crates (each version counted, the new
    // crate included), from 107 with the client half of gRPC and 149 when escher-proto
    // generated its code at build time (docs/writing-an-esl.md, "Measurements").
    assert!(
        builds.len() <= 55,
        "{} crates in the new crate's tree: {builds:?}",
        builds.len()
    );

    // `cargo test`: the unit tests add the in-memory cluster (escher-core) and nothing of
    // the network or the facade.
    let lines = tree(&dir, "normal,build,dev", &[]);
    let crates = names(&lines);
    assert!(crates.contains("escher-core"), "the tests lack escher-core");
    for absent in [
        "escher",
        "escher-head",
        "escher-worker",
        "tonic",
        "hyper",
        "h2",
    ] {
        assert!(
            !crates.contains(absent),
            "the new crate's tests build {absent}"
        );
    }
    let test_builds = versions(&lines);
    assert!(
        test_builds.len() <= 56,
        "{} crates in the new crate's test tree: {test_builds:?}",
        test_builds.len()
    );

    // `--features cluster`: the facade, for the end-to-end test.
    let crates = names(&tree(&dir, "normal", &["--features", "cluster"]));
    for needed in ["escher", "escher-head", "escher-worker", "tonic"] {
        assert!(crates.contains(needed), "--features cluster lacks {needed}");
    }

    // `--features grpc`, what an application that runs the policies on a cluster builds: the
    // client half of gRPC, no server.
    let crates = names(&tree(&dir, "normal", &["--features", "grpc"]));
    assert!(crates.contains("tonic"), "--features grpc lacks tonic");
    for absent in ["escher", "escher-head", "axum"] {
        assert!(!crates.contains(absent), "--features grpc builds {absent}");
    }
    let features = tree(&dir, "normal,features", &["--features", "grpc"]);
    let server = features.iter().find(|line| {
        line.starts_with(r#"tonic feature "server""#)
            || line.starts_with(r#"tonic feature "router""#)
            || line.starts_with(r#"hyper feature "server""#)
    });
    assert_eq!(server, None, "the new crate's tree serves gRPC");
}

/// The crates' names in `cargo tree`'s `lines`.
fn names(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Each crate once per version (`name v1.2.3`), as cargo builds them.
fn versions(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .map(|line| {
            line.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn bad_input_writes_nothing() {
    let outside = tempfile::tempdir().expect("a temporary directory");
    let repo = repo();

    // A name that is not a package name.
    let dir = outside.path().join("bad");
    let out = new_esl(&["2 bad", "--dir", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not a package name"));
    assert!(!dir.exists());

    // A directory that holds something already.
    let dir = outside.path().join("taken");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let out = new_esl(&["my-esl", "--dir", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("exists and is not empty"));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(
        left.len(),
        1,
        "something was written into {}",
        dir.display()
    );

    // A path that is not an escher checkout.
    let dir = outside.path().join("nowhere");
    let out = new_esl(&[
        "my-esl",
        "--dir",
        dir.to_str().unwrap(),
        "--escher-path",
        outside.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not an escher checkout"));
    assert!(!dir.exists());

    // Both sources at once.
    let out = new_esl(&[
        "my-esl",
        "--escher-path",
        repo.to_str().unwrap(),
        "--escher-version",
        "0.1",
    ]);
    assert!(!out.status.success());
}

#[test]
fn the_guide_shows_the_manifest_escher_new_esl_writes() {
    let outside = tempfile::tempdir().expect("a temporary directory");
    let dir = outside.path().join("my-esl");
    let out = new_esl(&[
        "my-esl",
        "--dir",
        dir.to_str().unwrap(),
        "--escher-version",
        "0.1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let guide = std::fs::read_to_string(repo().join("docs/writing-an-esl.md")).unwrap();
    let start = guide.find("```toml\n").expect("the guide shows a manifest") + "```toml\n".len();
    let shown = &guide[start..start + guide[start..].find("```").expect("its end")];
    assert!(
        manifest.contains(shown),
        "the guide's manifest is not what `escher new esl` writes:\n{shown}\n---\n{manifest}"
    );
}
