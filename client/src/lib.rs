//! escher-client: the application's way into an escher cluster.
//!
//! ```no_run
//! use escher_client::{Client, ResourceUpdateExt, Task};
//! use escher_proto::{NodeSpec, ResourceUpdate};
//!
//! # async fn demo() -> Result<(), escher_client::ClientError> {
//! let client = Client::from_env().await?; // ESCHER_HEAD, else http://127.0.0.1:7600
//!
//! // A command task that, when it succeeds, creates `done-t1` on its node...
//! let t1 = client
//!     .submit(
//!         Task::command(["./prepare.sh"])
//!             .resources_str("cpu=1")
//!             .on_success(ResourceUpdate::set("done-t1", 1, NodeSpec::Local)?),
//!     )
//!     .await?;
//! // ...and a function task that can only start where `done-t1` exists.
//! let t2 = client
//!     .submit_typed::<u64>(Task::function_typed("count", &"data.csv").resource("done-t1", 1))
//!     .await?;
//! let rows = t2.get(&client, None).await?;
//! # let _ = (t1, rows);
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`Client`] (`client.rs`): the async connection and its configuration (head URL,
//!   namespace, calling task); its task methods are in `tasks.rs` (submit, get, wait, cancel,
//!   describe, list, logs) and its resource methods in `resources.rs` (`set_resource`,
//!   `adjust_resource`, `delete_resource`, the batch `set_resources`, `cluster_status`).
//! - Submissions (`submissions.rs`): `submit` and `submit_batch` travel over one long-lived
//!   `SubmitStream` to the head, concurrent `submit` calls coalesced into shared requests;
//!   each call still succeeds or fails on its own.
//! - Results (`results.rs`): `get` waits on one long-lived `WaitStream`, on which the head
//!   pushes each task's final status as it finishes.
//! - Resource updates (`resource_updates.rs`): concurrent `set_resource`, `adjust_resource`
//!   and `delete_resource` calls are coalesced into shared `SetResources` calls, each still
//!   answered or refused on its own.
//! - The head group (`heads.rs`, `heads_api.rs`): a client knows every replica of a
//!   replicated head (`--head URL1,URL2,URL3`), follows the leader through elections, and sends
//!   every write with an idempotency key so that its retries are never applied twice;
//!   `Client::heads`, `Client::add_head`, `Client::remove_head`. How a call retries (follow
//!   a named leader, pause and try the next replica, give up, an unknown outcome) is
//!   [`retry`], clock-free, which the deterministic simulation (`escher-sim`) runs too.
//! - GPUs (`gpus.rs`): `Client::gpus` (each node's GPUs, MIG slices and who holds each
//!   device), `Client::apply_mig_layout` and `Client::wait_mig_layout`.
//! - [`Reservation`] (`reservation.rs`): `Client::reserve`, head-native all-or-nothing
//!   reservations of resource bundles (gang scheduling), and the handle to wait for and
//!   release one.
//! - [`BlockingClient`] (`blocking.rs`): the same methods for code without a runtime.
//! - [`Task`] (`builder.rs`): the builder of task specs, reporting misuse at `build`.
//! - [`ActorHandle`] (`actors.rs`): `Client::actor` creates an actor, `Client::actor_named`
//!   finds one; its method calls go straight to the worker that hosts it.
//! - [`TaskRef`] and [`TypedTaskRef`] (`task_ref.rs`): handles to submitted tasks.
//! - [`objects`]: [`objects::fetch_object`] and [`objects::push_object`], an object's bytes
//!   between this process and a worker's data plane.
//! - [`ResourceUpdateExt`] (`update.rs`): `ResourceUpdate::set / adjust / delete`.
//! - [`LogReader`] (`logs.rs`): reads and follows a task's output.
//! - [`ClientError`] (`error.rs`): every failure, retryable ones apart.
//! - `args.rs`: the conversions that let calls take `"cpu"`, `2`, `"0.5"` or `"unbounded"`.
//!
//! # Features
//!
//! - `grpc` (on by default): the network client, everything above but [`Task`],
//!   [`ResourceUpdateExt`], the argument conversions, [`retry`] and [`ClientError`]. Without it
//!   (`default-features = false`) this crate is the task builder and the error type alone,
//!   with neither tonic, hyper nor tokio: what a scheduling library's policies and their unit
//!   tests on `escher_esl::InMemoryCluster` need (docs/writing-an-esl.md).
//!
//! The `escher` command-line tool is its own crate (`escher-cli`, `cli/`) on this one, so that a
//! program or a policy crate that uses the client compiles none of it.
//!
//! Domain types (`TaskSpec`, `NodeSpec`, `ClusterStatus`, ...) come from [`escher_proto`] and
//! are used here as they are.
#![warn(missing_docs)]

mod args;
mod builder;
mod error;
pub mod retry;
mod update;

#[cfg(feature = "grpc")]
mod actors;
#[cfg(feature = "grpc")]
mod admin;
#[cfg(feature = "grpc")]
mod blocking;
#[cfg(feature = "grpc")]
mod client;
#[cfg(feature = "grpc")]
mod credentials;
#[cfg(feature = "grpc")]
mod gpus;
#[cfg(feature = "grpc")]
mod heads;
#[cfg(feature = "grpc")]
mod heads_api;
#[cfg(feature = "grpc")]
mod logs;
#[cfg(feature = "grpc")]
pub mod objects;
#[cfg(feature = "grpc")]
mod reservation;
#[cfg(feature = "grpc")]
mod resource_updates;
#[cfg(feature = "grpc")]
mod resources;
#[cfg(feature = "grpc")]
mod results;
#[cfg(feature = "grpc")]
mod submissions;
#[cfg(feature = "grpc")]
mod task_ref;
#[cfg(feature = "grpc")]
mod tasks;
#[cfg(feature = "grpc")]
mod telemetry;
#[cfg(feature = "grpc")]
mod watch;

pub use args::{IntoAmount, IntoCapacity, IntoDelta, IntoResourceName};
pub use builder::{DEFAULT_RESOURCES, IntoTaskSpec, Task};
pub use error::ClientError;
pub use update::ResourceUpdateExt;

#[cfg(feature = "grpc")]
pub use actors::{ActorHandle, CallCanceller, CallResult};
#[cfg(feature = "grpc")]
pub use admin::Backup;
#[cfg(feature = "grpc")]
pub use blocking::BlockingClient;
#[cfg(feature = "grpc")]
pub use client::{
    Client, DEFAULT_FAILOVER_TIMEOUT, DEFAULT_HEAD_URL, ENV_HEAD, ENV_NAMESPACE, ENV_TASK_ID,
    MAX_MESSAGE_BYTES, SILENT_REPLICA_TIMEOUT, caller_task_from_env,
};
#[cfg(feature = "grpc")]
pub use credentials::Credentials;
#[cfg(feature = "grpc")]
pub use heads::ClusterRpc;
#[cfg(feature = "grpc")]
pub use heads_api::DashboardTicket;
#[cfg(feature = "grpc")]
pub use logs::LogReader;
#[cfg(feature = "grpc")]
pub use objects::{
    CallerSession, ClosedSession, ObjectRead, ObjectRef, PlacedPut, REBUILD_PATIENCE,
};
#[cfg(all(feature = "grpc", target_os = "linux"))]
pub use objects::{LentObject, MAP_ENV, MAX_LEASES, ObjectLease};
#[cfg(feature = "grpc")]
pub use reservation::Reservation;
#[cfg(feature = "grpc")]
pub use task_ref::{TaskKindTag, TaskRef, TypedTaskRef};
#[cfg(feature = "grpc")]
pub use tasks::{CancelOptions, failure_reason};
#[cfg(feature = "grpc")]
pub use watch::Watch;
