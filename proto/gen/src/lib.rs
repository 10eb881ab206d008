//! The generator of escher-proto's committed gRPC code (`proto/src/generated/escher.v1.rs`,
//! included by `proto/src/wire.rs`), a package of its own so that it builds without
//! escher-proto: after a change to `proto/proto/escher.proto` the library does not compile until
//! its code is generated again, so the generator must not need it.
//!
//! `cargo run -p escher-proto-gen` writes the file; its test (`cargo test -p escher-proto-gen`)
//! generates into a temporary directory and fails when the committed file differs, naming that
//! command. No build of escher, nor of a crate that depends on it, runs protoc or prost-build:
//! an ESL author's first build compiles 31 crates fewer (docs/writing-an-esl.md, "Measurements").

use std::error::Error;
use std::path::{Path, PathBuf};

/// The command that writes `src/generated/escher.v1.rs` anew.
pub const REFRESH: &str = "cargo run -p escher-proto-gen";

/// Generates the code of `proto/escher.proto` into `out` (as `escher.v1.rs`).
pub fn generate(out: &Path) -> Result<(), Box<dyn Error>> {
    let root = proto_dir();
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

pub fn committed() -> PathBuf {
    proto_dir().join("src/generated/escher.v1.rs")
}

/// escher-proto's directory (this package lives in its `gen/`).
fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .expect("proto/gen has a parent")
}

/// The code generated now, as a string.
pub fn fresh() -> Result<String, Box<dyn Error>> {
    let out = tempfile::tempdir()?;
    generate(out.path())?;
    Ok(std::fs::read_to_string(out.path().join("escher.v1.rs"))?)
}
