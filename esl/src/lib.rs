//! escher-esl: scheduling libraries (ESLs).
//!
//! Every policy of the ESCHER thesis (locality, anti-affinity, gang, DAG ordering, queues, soft
//! constraints, hierarchical fair sharing, ...) is built here only on the public client API,
//! through the [`ClusterApi`] seam. A policy returns [`ResourceSpec`]s that the application
//! attaches to its tasks; specs of several policies compose on one task.
//!
//! # Layout
//!
//! - [`api`]: the [`ClusterApi`] seam, implemented for the real client (feature `grpc`, on by
//!   default);
//! - [`InMemoryCluster`] (feature `in-memory`, on by default): the seam over the head's real
//!   state machine with simulated workers, for unit tests of policies;
//! - [`testing`]: what a policy's tests need, on any [`ClusterApi`]: bounded waits, waits on
//!   the cluster's events, submitting and reading where tasks run;
//! - [`spec`]: [`ResourceSpec`], what a policy hands the application;
//! - [`Policy`]: the one small trait every policy implements (a task's key in, its spec out),
//!   and [`Domain`], the nodes a per-node policy resource lives on.
//!
//! Policies, one module each (thesis §4.4; each module's doc gives the construction, what it
//! needs from the cluster, and its limits):
//!
//! - [`locality`] (P1): [`Affinity`] (co-location with a group's first task) and
//!   [`DataLocality`] (tasks run where their data is);
//! - [`anti_affinity`]: [`AntiAffinity`], the ghost construction of Table 4.2 with the barrier
//!   that makes it correct;
//! - [`load_balance`]: [`LoadBalance`] (static per-node slots) and [`LeastLoaded`] (dynamic,
//!   least-utilised node);
//! - [`signal`] (P2): [`Dag`], [`Barrier`], [`Semaphore`] (and mutexes) from single-shot
//!   [`Signal`]s;
//! - [`queue`] (P3): [`Queue`] (release, batch, drain), [`FairQueues`] (weighted fair
//!   queueing), [`PriorityQueues`] (strict priority);
//! - [`locking`] (P4): [`Lock`], a bundle reserved by a ghost task;
//! - [`bin_packing`]: [`BinPacking`], best fit decreasing with targeted placement;
//! - [`gang`]: gang scheduling in the thesis' three designs behind [`GangScheduler`]:
//!   [`GhostGangs`] (AppSpace: ghosts, timeouts, back-off), [`GangCoordinator`] (LibSpace: a
//!   serializing service), [`NativeGangs`] (FrameSpace: the head's atomic reservations);
//! - [`soft`]: soft constraints, an ordered list of preferred requirements ([`SoftConstraints`]);
//! - [`objective`]: the α/β `obj` construction that approximates an objective function with
//!   soft constraints ([`Objective`]).
//! - [`fair_share`]: [`Hfs`], hierarchical max-min fair sharing over node domains
//!   (`create_user(id, weight)`, idle shares lent and reclaimed, child instances over the nodes
//!   their parent grants), driven by a [`Periodic`] rebalancer or by the application;
//! - [`fair_time`]: [`FairTime`], fair share over time: usage in weighted resource-seconds
//!   decayed by a half-life, Slurm's fair-share factor, priorities, guarantees that a cohort
//!   borrows and lends, and preemption of over-share or lower-priority jobs, decided by the pure
//!   [`fair_time::Arbiter`];
//! - [`migration`]: [`Migrator`], the EscherTune pattern: a job's co-location resource moves
//!   to a node that now has room, and its tasks are relaunched with unchanged requests;
//! - [`compose`]: [`Composition`] (AND by concatenation, OR as soft-constraint alternatives,
//!   relaxation in a stated order) and [`validate`](compose::validate), which rejects before
//!   launch a spec no live node can ever satisfy, naming the resource;
//! - [`cilantro`]: [`Cilantro`](cilantro::Cilantro), performance-aware allocation learned
//!   online (thesis chapter 3): per-job resources whose capacities each round sets from
//!   learned confidence bounds, under NJC fairness, social or egalitarian welfare;
//! - [`resilience`]: [`Journal`], a [`ClusterApi`] decorator that journals the resources
//!   created through it, replays a lost node's on another eligible node, and restores them
//!   when the node returns.
//!
//! # Features
//!
//! - `in-memory` (default): [`InMemoryCluster`], on escher-core's state machine;
//! - `grpc` (default): [`ClusterApi`] for the network client (`escher_client::Client`), and
//!   that client. A policy crate whose unit tests run on the in-memory cluster depends on this
//!   one with `default-features = false, features = ["in-memory"]` and compiles no gRPC
//!   (tonic, hyper, h2, rustls); the application that runs its policies on a real cluster, or
//!   its end-to-end test, turns `grpc` on (docs/writing-an-esl.md).
//!
//! The GPU policies reproduced from their papers (MIGM, MIGRator, Ekya, OLTunes, Astraea,
//! PARIS), with their simulators and MIGRator's integer program, are a crate of their own,
//! `escher-gpu`, built on this one like any other policy crate.
#![warn(missing_docs)]

pub mod anti_affinity;
pub mod api;
pub mod bin_packing;
pub mod cilantro;
pub mod compose;
mod ends;
mod error;
pub mod fair_share;
pub mod fair_time;
pub mod gang;
#[cfg(feature = "in-memory")]
mod in_memory;
pub mod load_balance;
pub mod locality;
pub mod locking;
pub mod migration;
pub mod objective;
mod periodic;
mod policy;
pub mod queue;
pub mod resilience;
pub mod signal;
pub mod soft;
pub mod spec;
mod target;
pub mod testing;

pub use anti_affinity::AntiAffinity;
pub use api::ClusterApi;
pub use bin_packing::BinPacking;
pub use compose::{Composition, Unsatisfiable};
pub use error::EslError;
pub use fair_share::{Hfs, User};
pub use fair_time::FairTime;
pub use gang::{Gang, GangCoordinator, GangRequest, GangScheduler, GhostGangs, NativeGangs};
#[cfg(feature = "in-memory")]
pub use in_memory::{InMemoryCluster, Mode};
pub use load_balance::{LeastLoaded, LoadBalance};
pub use locality::{Affinity, DataLocality};
pub use locking::Lock;
pub use migration::Migrator;
pub use objective::{NodeShape, Objective};
pub use periodic::Periodic;
pub use policy::{Domain, Policy};
pub use queue::{FairQueues, PriorityQueues, Queue};
pub use resilience::Journal;
pub use signal::{Barrier, Dag, Semaphore, Signal};
pub use soft::SoftConstraints;
pub use spec::ResourceSpec;
