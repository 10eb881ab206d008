//! escher-esl: scheduling libraries (ESLs).
//!
//! Every policy of the ESCHER thesis (locality, anti-affinity, gang, DAG ordering, queues, soft
//! constraints, hierarchical fair sharing, ...) is built here only on the public client API,
//! through the [`ClusterApi`] seam. A policy returns [`ResourceSpec`]s that the application
//! attaches to its tasks; specs of several policies compose on one task.
//!
//! # Layout
//!
//! - [`api`]: the [`ClusterApi`] seam, implemented for the real client;
//! - [`InMemoryCluster`] (feature `in-memory`, on by default): the seam over the head's real
//!   state machine with simulated workers, for unit tests of policies;
//! - [`spec`]: [`ResourceSpec`], what a policy hands the application.
#![warn(missing_docs)]

pub mod api;
mod error;
#[cfg(feature = "in-memory")]
mod in_memory;
pub mod spec;

pub use api::ClusterApi;
pub use error::EslError;
#[cfg(feature = "in-memory")]
pub use in_memory::{InMemoryCluster, Mode};
pub use spec::ResourceSpec;
