//! The generated protobuf messages and gRPC services of `proto/escher.proto` (package
//! `escher.v1`).
//!
//! Everything here is produced by `tonic-prost-build` at build time; the `.proto` file is the
//! documentation. Other crates should convert to and from the domain types in
//! [`crate::types`] at the gRPC edge (see [`crate::convert`]) rather than pass these around.
//!
//! Services: [`cluster_server::ClusterServer`] / [`cluster_client::ClusterClient`] and
//! [`worker_link_server::WorkerLinkServer`] / [`worker_link_client::WorkerLinkClient`].
#![allow(
    missing_docs,
    clippy::all,
    rust_2018_idioms,
    missing_debug_implementations
)]

tonic::include_proto!("escher.v1");

pub use crate::wire_watch::WatchResponse;
