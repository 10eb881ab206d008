//! Generates the gRPC code for `proto/escher.proto` with the vendored `protoc`, so that building
//! escher needs no system protobuf compiler.
//!
//! The vendored binary is handed to prost through `Config::protoc_executable`, which does what
//! setting `PROTOC` would, without `std::env::set_var` (unsafe in edition 2024).

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    // Without the `grpc` feature the crate is the domain types alone: nothing to generate.
    #[cfg(feature = "grpc")]
    generate()?;
    Ok(())
}

#[cfg(feature = "grpc")]
fn generate() -> Result<(), Box<dyn Error>> {
    let proto = "proto/escher.proto";
    let mut config = tonic_prost_build::Config::new();
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
    tonic_prost_build::configure().compile_with_config(config, &[proto], &["proto"])?;
    println!("cargo:rerun-if-changed={proto}");
    Ok(())
}
