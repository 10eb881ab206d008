//! The gRPC code of `proto/escher.proto` is committed (`src/generated/escher.v1.rs`, included by
//! `src/wire.rs`), so that no build of escher, nor of a crate that depends on it, runs protoc or
//! prost-build: an ESL author's first build compiles 31 crates fewer (docs/writing-an-esl.md,
//! "Measurements").
//!
//! This test is the generator and its freshness check in one: it generates the code again with
//! the vendored protoc into a temporary directory and fails when the committed file differs,
//! naming the command that refreshes it. With `ESCHER_REGENERATE=1` it writes the file instead.
//! The settings below are what `build.rs` used to pass.

use std::error::Error;
use std::path::{Path, PathBuf};

/// The command that writes `src/generated/escher.v1.rs` anew.
const REFRESH: &str = "ESCHER_REGENERATE=1 cargo test -p escher-proto --test generated";

/// Generates the code of `proto/escher.proto` into `out` (as `escher.v1.rs`).
fn generate(out: &Path) -> Result<(), Box<dyn Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config = tonic_prost_build::Config::new();
    // The vendored binary, so that no system protobuf compiler is needed.
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Maps (labels) decode into BTreeMaps, so iteration order is deterministic.
    config.btree_map(["."]);
    // Function arguments and results are `Bytes`, as in the domain types: a head that keeps a
    // task's arguments and sends them to a worker, or hands a result to every waiter, shares
    // them instead of copying them.
    config.bytes([
        ".escher.v1.FunctionTask.args",
        ".escher.v1.TaskResult.returned",
        ".escher.v1.TaskFinished.returned",
        ".escher.v1.ActorTask.args",
        ".escher.v1.ActorCall.args",
        ".escher.v1.ActorReply.returned",
        // Object chunks: a holder sends slices of the mapped object, a reader keeps them.
        ".escher.v1.ObjectChunk.data",
    ]);
    // Written by hand so that a head encodes each watch event once for all its watchers
    // (src/wire_watch.rs); the same bytes on the wire.
    config.extern_path(
        ".escher.v1.WatchResponse",
        "crate::wire_watch::WatchResponse",
    );
    tonic_prost_build::configure()
        .out_dir(out)
        .emit_rerun_if_changed(false)
        .compile_with_config(
            config,
            &[root.join("proto/escher.proto")],
            &[root.join("proto")],
        )?;
    Ok(())
}

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/generated/escher.v1.rs")
}

#[test]
fn the_committed_grpc_code_is_what_escher_proto_generates() {
    let out = tempfile::tempdir().expect("a temporary directory");
    if let Err(e) = generate(out.path()) {
        panic!("generating the code of proto/escher.proto failed: {e}");
    }
    let fresh = std::fs::read_to_string(out.path().join("escher.v1.rs"))
        .expect("the generator wrote escher.v1.rs");
    let path = committed();
    if std::env::var_os("ESCHER_REGENERATE").is_some() {
        std::fs::write(&path, &fresh).expect("writing src/generated/escher.v1.rs");
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old != fresh {
        let line = old
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| old.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is not what proto/escher.proto generates (first difference at line {}); \
             refresh it with `{REFRESH}` and commit it",
            path.display(),
            line + 1
        );
    }
}
