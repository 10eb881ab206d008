//! escher-head: the head node of an escher cluster.
//!
//! # Layout
//!
//! - [`scheduler`]: the pure scheduler core, events in and decisions out, with no I/O.
//! - [`state`]: the head's durable state (nodes, resources, tasks, results) and the single
//!   deterministic `apply(command)` that changes it: the seam raft replication uses.
//! - [`replication`]: raft around the state machine; [`replication::log`] is its durable log
//!   (`--data-dir`) and its in-memory one.
//! - [`auth`]: who is calling (tokens, roles, task credentials) and what they may do; one
//!   tower layer in front of every service (DESIGN §10).
//! - [`runtime`]: the owner task, the `Cluster` and `WorkerLink` gRPC services, heartbeats,
//!   waiters, and [`run`], the entry point the `escher-head` binary and `LocalCluster` call.
#![warn(missing_docs)]

pub mod auth;
pub mod replication;
pub mod runtime;
pub mod scheduler;
pub mod state;

pub use runtime::{HeadConfig, HeadError, run};
