//! escher-gpu: GPU multi-tenancy policies on MIG slices and fractional GPUs, reproduced from the
//! papers that introduced them: MIGM's right-sizing schedulers, MIGRator's per-window integer
//! program, Ekya's thief scheduler, OLTunes, Astraea, PARIS, and the baselines they are
//! compared with, with the simulators and serving models they are measured on.
//!
//! This crate is a policy crate like any an ESL author writes: it depends on `escher-esl` (the
//! [`ClusterApi`](escher_esl::ClusterApi) seam) and the client, and `escher-esl` knows nothing
//! of it, so an author of cluster policies compiles neither these simulators nor the MILP
//! solver.
//!
//! Every policy is pure logic behind one small trait, [`GpuPolicy`] (an [`Event`] and the
//! [`GpuView`] in, [`Command`]s out), written against the [`GpuSeam`]: the GPU's geometry
//! and legal layout (the MIG model of `escher_proto::mig`), creating and destroying one
//! instance, launching, stopping, binding and draining tasks, and per-iteration telemetry.
//! [`SimGpu`] is the in-memory implementation of that seam (a fake, named as such) on which
//! the policies are tested, and [`run`] drives a policy on it in simulated time.
//!
//! # Layout
//!
//! - `seam.rs`: [`GpuSeam`], [`GpuView`], [`Command`], [`Event`];
//! - `policy.rs`: [`GpuPolicy`] and [`run`];
//! - [`cluster`]: [`ClusterGpu`] and [`drive`], the same policies on one GPU of a real cluster
//!   through [`ClusterApi`](escher_esl::ClusterApi) (slices, requeue, telemetry, typed OOM,
//!   inference services whose replicas are actors on slices, and retraining jobs run as
//!   trainer actors);
//! - [`serving`]: [`Serving`], how inference replicas serve requests (queues, SLO, drain),
//!   counted the same way on [`SimGpu`] and on a cluster's GPU;
//! - [`sim`]: [`SimGpu`] and its speed, power and memory models;
//! - [`migm`]: [`Migm`] (schemes A and B, OOM restart, early restart from the memory
//!   predictor) and its partition manager;
//! - [`migrator`]: [`Migrator`] (the per-window integer program, the timed plan with
//!   pre-initialization, and its executor with drain-before-destroy and pinned retraining);
//! - [`ekya`]: Ekya's thief scheduler given only what Ekya knows ([`online`], and on MIG
//!   slices [`online_on_mig`]), and the exact-future thief it replaced as MIGRator's baseline
//!   ([`thief`], [`thief_on_mig`]);
//! - [`ekya_profiler`]: Ekya's micro-profiler (retraining configurations' accuracy and cost
//!   profiles, curve fit, pruning) and its configuration choice inside the thief; on a
//!   cluster its profiling runs are calls to profiler actors on the slices
//!   ([`ClusterGpu::profile`], [`ekya_profiler::profile_runs`],
//!   [`ekya_profiler::profiles_from`]);
//! - [`ekya_cluster`]: Ekya's micro-profiling on a cluster's slices, calls to profiler actors
//!   whose answers its configuration choice is made from;
//! - [`compare`]: MIGRator (forecast and oracle) against its baselines over several windows of
//!   a trace shape;
//! - [`baselines`]: [`Sequential`] (MIGM's one-job-at-a-time full GPU), [`paris`] (static MIG
//!   by compute intensity), [`fn@astraea`] (MIGRator's Astraea-style baseline: dynamic SM shares
//!   without MIG);
//! - [`partition`]: slices made on demand, with no layout planned by hand: the partitioning
//!   policy ([`partition::Partitioner`]) over a fleet of GPUs, its baselines (HAMi-style
//!   first-fit, a static layout) and a simulated fleet with injectable driver errors;
//! - [`oltunes`]: OLTunes (inference tasks grouped by affinity on heterogeneous GPUs, tuned by
//!   an online predictor) against its paper's baselines;
//! - [`shares`]: fractional (MPS) plans and the common goodput evaluation of every plan;
//! - [`mod@astraea`]: Astraea itself (multi-stage services on MPS shares, its allocation and
//!   placement, on a cluster through ephemeral resources) against its paper's baselines.
//!
//! # Features
//!
//! `milp` (on by default): MIGRator's planner, its integer program solved by `good_lp`'s
//! pure-Rust `microlp` backend ([`migrator::ilp`]), and [`compare`], which is built on it.
//! Without it the crate compiles no solver and keeps every other policy; MIGRator's executor
//! ([`Migrator::execute`]) still runs schedules other policies plan.

#![warn(missing_docs)]

pub mod astraea;
pub mod baselines;
pub mod cluster;
#[cfg(feature = "milp")]
pub mod compare;
pub mod ekya;
pub mod ekya_cluster;
pub mod ekya_profiler;
pub mod migm;
pub mod migrator;
pub mod oltunes;
pub mod partition;
mod policy;
mod seam;
pub mod serving;
pub mod shares;
pub mod sim;
mod support;

pub use baselines::{Sequential, astraea, paris};
pub use cluster::{
    ClusterGpu, DriveReport, ProfilerView, ReplicaView, TrainerEnd, TrainerView, drive, drive_with,
};
pub use ekya::{online, online_on_mig, thief, thief_on_mig};
pub use migm::{Migm, MigmJob, Scheme};
pub use migrator::{Migrator, TenantTasks};
pub use policy::{GpuPolicy, RunReport, run, run_with};
pub use seam::{Command, Event, GpuSeam, GpuView, Instance, InstanceState, SeamError};
pub use serving::{ServiceStats, Serving};
pub use sim::{InferenceModel, JobModel, MemoryModel, PowerModel, SimGpu, SpeedModel, TaskModel};
