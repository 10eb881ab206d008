//! escher-worker: the node agent.
//!
//! It registers its node's resources with the head (CPUs, memory, NVIDIA GPUs and MIG slices,
//! custom static resources), keeps one stream to the head for assignments and status, and runs
//! command, function and ghost tasks. The runtime lands with the runtime issue.
#![warn(missing_docs)]

pub mod exec;
