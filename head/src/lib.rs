//! escher-head: the head node of an escher cluster.
//!
//! # Layout
//!
//! - [`scheduler`] and [`state`]: re-exported from `escher-core`, the pure scheduler and the
//!   replicated state machine with its single deterministic `apply(command)`, the seam raft
//!   replication uses. They live in their own crate so that an ESL's in-memory cluster and the
//!   core's own tests need none of the runtime below.
//! - [`replication`]: raft around the state machine; [`replication::log`] is its durable log
//!   (`--data-dir`) and its in-memory one.
//! - [`auth`]: who is calling (tokens, roles, task credentials) and what they may do; one
//!   tower layer in front of every service (docs/DESIGN.md §10).
//! - [`runtime`]: the owner task, the `Cluster` and `WorkerLink` gRPC services, heartbeats,
//!   waiters, and [`run`], the entry point the `escher-head` binary and `LocalCluster` call.
#![warn(missing_docs)]

pub mod auth;
pub mod replication;
pub mod runtime;

pub use escher_core::{scheduler, state};

pub use runtime::{HeadConfig, HeadError, run};
