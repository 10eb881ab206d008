//! escher: a distributed task framework whose every scheduling policy is expressed with
//! ephemeral resources.
//!
//! This facade is what an application depends on. It re-exports the client API, the
//! scheduling libraries, the worker library (to build workers with your own functions), and
//! [`LocalCluster`], a head and workers in one process.
//!
//! ```no_run
//! use escher::{LocalCluster, Task};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = LocalCluster::start().await?;
//! let client = cluster.client().await?;
//! let task = client.submit(Task::command(["echo", "hello"]).resources_str("cpu=1")).await?;
//! let status = client.get(&task, None).await?;
//! println!("{status:?}");
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`LocalCluster`]: an embedded cluster on loopback ports, for tours, tests and laptops.
//! - [`client`]: [`Client`], [`BlockingClient`], the [`Task`] builder and the errors.
//! - [`esl`]: scheduling libraries built on the client API.
//! - [`worker`]: build a worker with your own function handlers.
//! - [`types`]: resource names, amounts, capacities, resource sets, node specs, task types.
#![warn(missing_docs)]

mod local_cluster;

pub use escher_client as client;
pub use escher_client::{
    ActorHandle, BlockingClient, CallCanceller, CallResult, CancelOptions, Client, ClientError,
    ClosedSession, Credentials, ObjectRef, Task, TaskRef, Watch,
};
pub use escher_esl as esl;
pub use escher_proto::access;
pub use escher_proto::codec;
pub use escher_proto::types;
pub use escher_worker as worker;
pub use escher_worker::{ActorClass, Functions, TaskContext};
pub use local_cluster::{LocalCluster, LocalClusterBuilder, LocalClusterError};

/// The README's Rust example, compiled as a doctest so the README cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The client API page's Rust example, compiled as a doctest for the same reason.
#[doc = include_str!("../docs/client.md")]
#[cfg(doctest)]
pub struct ClientPageDoctests;
