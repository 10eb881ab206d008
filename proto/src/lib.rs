//! escher's shared vocabulary: the domain types every crate speaks, and the wire protocol.
//!
//! # Layout
//!
//! - [`types`]: resource names, fixed-point amounts and capacities, resource sets, node and task
//!   ids, node specifications, and the compact `cpu=2,gpu=0.5` text syntax; tasks and their
//!   life cycle; what the API reports (cluster, node and task status, pending reasons); and the
//!   requests and replies of both services as domain values; GPUs and MIG slices as workers
//!   report them, and the resource names and labels they become (`gpu`, `gpu.<uuid>`,
//!   `mig.<profile>`, `mig.<uuid>`). Pure data with validation: no async, no network, usable
//!   from the scheduler core.
//! - [`access`]: the access file a head writes for the clients and workers of its machine
//!   (docs/DESIGN.md §10), and where it is found.
//! - [`batch`]: batching a link's messages without a timer (the worker link's `WorkerBatch`
//!   and `HeadBatch`).
//! - [`codec`]: the encoding of function-task arguments and results (bincode over serde).
//! - [`wire`]: the protobuf messages and the tonic clients and servers generated from
//!   `proto/escher.proto` (package `escher.v1`): the `Cluster` service that applications call,
//!   and the `WorkerLink` service that workers call. Only the gRPC edge touches these.
//! - [`convert`]: `From<domain> for wire` and `TryFrom<wire> for domain` for every message, the
//!   latter validating every field and failing with a [`ConvertError`] that names the field
//!   path (and becomes a `tonic::Status::invalid_argument`).
//! - [`replicas`]: the replicas of a head group, a channel to each and which one leads; the
//!   client and the worker follow the leader through it.
//! - [`transfer`]: object bytes on the data plane: cutting an object into checksummed chunks
//!   and checking a stream of them (the `Objects` service's two ends).
//! - [`data_channel`]: the HTTP/2 connection a transfer runs on, with large frames.
//! - [`mig`]: a pure model of NVIDIA MIG: profile tables (A100-40GB/80GB, H100-80GB, H200),
//!   legal layouts of instances, MIGM's reachability-guided placement, maximal layouts, and
//!   MIGRator's reconfiguration latency.
//!
//! [`batch`], [`wire`], [`convert`], [`transfer`] and [`data_channel`] (and the access file's TLS and bearer-token helpers) are
//! the gRPC edge, behind the default `grpc` feature; `escher-core` builds without it.
//!
//! Everything a user can get wrong is rejected by a constructor with a [`types::TypeError`]
//! that says what was wrong.
#![warn(missing_docs)]

pub mod access;
pub mod backup;
#[cfg(feature = "grpc")]
pub mod batch;
pub mod codec;
#[cfg(feature = "grpc")]
pub mod convert;
#[cfg(feature = "grpc")]
pub mod data_channel;
pub mod mig;
#[cfg(feature = "grpc")]
pub mod object_stream;
#[cfg(feature = "grpc")]
pub mod replicas;
#[cfg(feature = "grpc")]
pub mod transfer;
pub mod types;
#[cfg(feature = "grpc")]
pub mod wire;
#[cfg(feature = "grpc")]
mod wire_watch;

#[cfg(feature = "grpc")]
pub use convert::ConvertError;
pub use types::{
    Amount, Capacity, CapacityOp, ClusterStatus, Delta, Labels, LogStream, Namespace, NodeId,
    NodeSpec, NodeStatus, PendingReason, ResourceKind, ResourceName, ResourceSet, ResourceStatus,
    ResourceUpdate, TaskId, TaskInfo, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus,
    TaskSummary, TypeError,
};
