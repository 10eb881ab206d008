//! escher-sim: a deterministic simulation of the head's replica group (docs/RELIABILITY.md,
//! "The deterministic simulation").
//!
//! One run is one seed. N real replicas (`escher_head::replication::sim::SimReplica`: the
//! head's `Replica`, raft-rs, the real `ClusterState` and scheduler, an in-memory log) live in
//! one process with simulated clients, an operator that adds and removes replicas, and
//! simulated workers that hold leases and run and report what the leader assigns, under a
//! queue of events in simulated time; every choice (delays, losses, duplicates, partitions,
//! crashes, planned restarts with their hand-overs of the lead, membership changes, what
//! clients write, workers' faults, election timeouts) is
//! drawn from one generator seeded from the run's number, and nothing reads a clock or
//! iterates a hash map, so a seed replays exactly. The [`checker`] judges every run.
//!
//! - [`world`]: the run, its events and the replicas' slots;
//! - [`network`]: the simulated links;
//! - [`client`]: clients that write with idempotency keys and retry;
//! - [`worker`]: a worker's side of its protocol with the head (the world plays the leader's,
//!   deciding about the workers' liveness with the head's own `Liveness`);
//! - [`checker`]: the properties of the replicas and the acknowledged writes;
//! - [`history`]: what the workers ran, and the rules that find double runs and lost tasks.

pub mod checker;
pub mod client;
pub mod history;
pub mod network;
pub mod worker;
pub mod world;

pub use world::{Options, Outcome, Stats, run};
