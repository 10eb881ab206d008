//! Actors on a worker (docs/DESIGN.md §17, docs/ARCHITECTURE.md "Actors and objects"): the
//! classes it can host ([`ActorClass`], `class.rs`), the incarnations it hosts now and the loop
//! each runs ([`ActorHost`], `host.rs`), and the `Actors` service that takes callers' method
//! calls on the worker's data-plane listener ([`ActorService`], `service.rs`; the listener in
//! `listener.rs`), and the built-in classes of an inference service's replica
//! ([`SERVING_REPLICA_CLASS`], `serving.rs`), of a retraining job's run on a simulated GPU
//! slice ([`TRAINER_CLASS`], `trainer.rs`) and of Ekya's micro-profiler on one
//! ([`PROFILER_CLASS`], `profiler.rs`).

mod class;
mod host;
mod listener;
mod profiler;
mod service;
mod serving;
mod trainer;

pub use class::{ActorClass, DynamicActor, DynamicConstructor};
pub use host::ActorHost;
pub use listener::DATA_PLANE_LABEL;
pub(crate) use listener::DataPlane;
pub use profiler::PROFILER_CLASS;
pub(crate) use profiler::class as profiler_class;
pub use service::ActorService;
pub(crate) use serving::class as serving_replica_class;
pub use serving::{ReplicaInfo, SERVING_REPLICA_CLASS};
pub use trainer::TRAINER_CLASS;
pub(crate) use trainer::class as trainer_class;
