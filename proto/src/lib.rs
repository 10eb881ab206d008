//! escher's shared vocabulary: the domain types every crate speaks, and the wire protocol.
//!
//! # Layout
//!
//! - [`types`]: resource names, fixed-point amounts and capacities, resource sets, node and task
//!   ids, node specifications, and the compact `cpu=2,gpu=0.5` text syntax. Pure data with
//!   validation: no async, no network, usable from the scheduler core.
//!
//! Everything a user can get wrong is rejected by a constructor with a [`types::TypeError`]
//! that says what was wrong.
#![warn(missing_docs)]

pub mod types;

pub use types::{
    Amount, Capacity, CapacityOp, Delta, Labels, Namespace, NodeId, NodeSpec, ResourceKind,
    ResourceName, ResourceSet, ResourceUpdate, TaskId, TaskKind, TaskResult, TaskSpec, TaskState,
    TaskStatus, TypeError,
};
