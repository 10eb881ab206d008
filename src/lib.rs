//! escher: a distributed task framework whose every scheduling policy is expressed with
//! ephemeral resources.
//!
//! This facade re-exports what an application needs. It will grow the client API, the
//! scheduling libraries and `LocalCluster` (a head and workers in one process).
//!
//! # Layout
//!
//! - [`types`]: resource names, amounts, capacities, resource sets, node specs.
#![warn(missing_docs)]

pub use escher_proto::types;
