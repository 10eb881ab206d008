//! escher-worker: the node agent.
//!
//! A worker registers its node's resources with the head (CPUs, memory, custom static
//! resources, NVIDIA GPUs and MIG slices, real or simulated), holds one stream to the head for
//! assignments and status, gives each task the GPU devices it holds, changes MIG layouts when
//! the head asks, and runs command, function and ghost tasks. It is both a library, for Rust
//! programs that register their own functions (and for an in-process `LocalCluster`), and the
//! `escher-worker` binary.
//!
//! ```no_run
//! # async fn demo() -> Result<(), escher_worker::WorkerError> {
//! let worker = escher_worker::Worker::builder()
//!     .head("http://127.0.0.1:7600")
//!     .typed_function("square", |_ctx, x: u64| async move { Ok::<_, String>(x * x) })
//!     .build()?;
//! let mut handle = worker.handle();
//! tokio::spawn(async move { println!("node {:?}", handle.registered().await) });
//! worker.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! # Layout
//!
//! - [`Worker`] (`worker.rs`), built by [`WorkerBuilder`] (`builder.rs`) from a
//!   [`WorkerConfig`] (`config.rs`); [`WorkerHandle`] (`handle.rs`) watches its node id.
//! - `runtime.rs`: the event loop that owns the link to the head and the running tasks:
//!   assignments, cancellations, log requests, heartbeats, re-registration, drain; its GPU
//!   side (device grants, waiting tasks, MIG reconfigurations) in `runtime/gpus.rs`.
//! - [`protocol`]: the worker's side of its protocol with the head as a plain struct, time
//!   passed in (which assignments start, what a registration lists, which reports are kept,
//!   when the lease holds), which the event loop and the simulation (`escher-sim`) both run.
//! - `link.rs`: one attempt to register and attach; `backoff.rs`: the delays between attempts;
//!   `head_conn.rs`: the channels to the head group's replicas, and which one leads;
//!   `identity.rs`: where the worker keeps its node id and secret (`--state-dir`).
//! - `runner.rs`: runs one assignment (command, function or ghost) to a `TaskFinished`.
//! - `functions.rs`: the registry of named function handlers; [`TaskContext`] (`context.rs`)
//!   is what a handler gets.
//! - [`discovery`]: the physical resources of this machine.
//! - `gpu/`: GPUs: NVML and simulated discovery ([`SimGpuSpec`]), the device allocator, MIG
//!   reconfiguration jobs.
//! - [`exec`]: the command executor (processes, signals, log files).
//! - [`objects`]: the node's object store (tmpfs files, memory-mapped, spilled to disk).
//! - [`WorkerError`] (`error.rs`).
//! - `bin/escher-worker.rs`: the binary.
#![warn(missing_docs)]

mod actors;
mod backoff;
mod builder;
mod config;
mod context;
pub mod discovery;
mod error;
pub mod exec;
pub mod fence;
mod functions;
mod gpu;
mod handle;
mod head_conn;
mod identity;
mod link;
pub mod objects;
pub mod pidns;
pub mod protocol;
mod python;
mod runner;
mod runtime;
mod spawn_latency;
mod worker;

pub use actors::{
    ActorClass, ActorHost, ActorService, DATA_PLANE_LABEL, DynamicActor, DynamicConstructor,
    PROFILER_CLASS, ReplicaInfo, SERVING_REPLICA_CLASS, TRAINER_CLASS,
};
pub use builder::WorkerBuilder;
pub use config::{
    DEFAULT_DRAIN, DEFAULT_HEAD, DEFAULT_RECONNECT_INITIAL, DEFAULT_RECONNECT_MAX, Walltime,
    WorkerConfig,
};
pub use context::{TaskContext, TaskOutput};
pub use error::WorkerError;
pub use exec::LogRetention;
pub use functions::{BoxFuture, FunctionResult, Functions};
pub use gpu::{SimGpuError, SimGpuSpec, scaled_latency};
pub use handle::WorkerHandle;
pub use head_conn::Authed;
pub use identity::{StateDirError, default_state_dir};
pub use python::{
    ACTOR_CLASS as PYTHON_ACTOR_CLASS, ENV_PYTHON, ENV_SLOTS as ENV_PYTHON_SLOTS,
    FUNCTION as PYTHON_FUNCTION, PythonDetection, RESOURCE as PYTHON_RESOURCE,
};
pub use runner::{MAX_RESULT_BYTES, NAMESPACE_LABEL};
pub use worker::Worker;

/// The token a worker joins with when none is given: `ESCHER_TOKEN`, else the worker join
/// token of a head started in this process at one of `heads` (`LocalCluster`), else that of
/// the access file on this machine (`ESCHER_ACCESS_FILE`, else `$ESCHER_HOME/access.json`).
pub fn join_token(heads: &str) -> Option<String> {
    if let Ok(token) = std::env::var(escher_proto::access::ENV_TOKEN)
        && !token.trim().is_empty()
    {
        return Some(token.trim().to_string());
    }
    head_access(heads).map(|file| file.worker_token)
}

/// The access of the heads at `heads`: registered by a head of this process, else the access
/// file of this machine (`ESCHER_ACCESS_FILE`, else `$ESCHER_HOME/access.json`).
pub fn head_access(heads: &str) -> Option<escher_proto::access::AccessFile> {
    use escher_proto::access;
    if let Some(file) = head_conn::split_heads(heads).find_map(access::registered) {
        return Some(file);
    }
    let path = access::location(None).ok()?;
    match access::AccessFile::read(&path) {
        Ok(file) => Some(file),
        Err(e) => {
            if path.exists() {
                tracing::warn!(%e, "cannot read the access file");
            }
            None
        }
    }
}
