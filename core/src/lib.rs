//! escher-core: the pure heart of an escher head, with no runtime, network, clock or consensus.
//!
//! Everything here is a deterministic function of what it is fed, so it can be replayed by every
//! raft replica, restored from a snapshot, driven step by step by a test, and embedded in an
//! ESL's in-memory test cluster without pulling in the head's gRPC runtime.
//!
//! # Layout
//!
//! - [`scheduler`]: the scheduler core, events in and decisions out: it matches each pending
//!   task's resource requirements to a node that has them available, and nothing else.
//! - [`state`]: the cluster's replicated state (nodes, the resource table, tasks and results,
//!   tokens, sessions) and the single deterministic [`state::ClusterState::apply`] that
//!   changes it: the seam the head's raft replication uses.
//!
//! `escher-head` builds its runtime (gRPC services, replication, auth) on this crate; the
//! `escher-esl` crate's in-memory cluster runs policies against it directly.
#![warn(missing_docs)]

pub mod scheduler;
pub mod state;
