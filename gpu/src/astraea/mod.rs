//! Astraea (Zhang et al., *Astraea: towards QoS-aware and resource-efficient multi-stage GPU
//! services*, ASPLOS '22): multi-stage GPU services on fractional GPU shares (MPS SM quotas, at
//! most 48 clients per device), allocated by contention-aware search and placed by
//! communication-aware clustering.
//!
//! **Policy.** For a service (a graph of stages with the data each edge carries, and a p99 QoS
//! target of 1.5× its solo run), Astraea sizes the GPUs a load needs (Eq. 1), chooses every
//! stage's instance count and SM share to maximize the bottleneck stage's throughput under the
//! SM, MPS-client, memory-bandwidth, memory and critical-path constraints (Eq. 2, by an
//! epsilon-greedy search; [`alloc`]), clusters the stages onto as few nodes as hold them by
//! Balanced-Kmeans++ on the min-cut of the stage graph (Algorithm 1), and places the instances
//! of each node next to their heavy neighbours, next to their own stage's other instances, and
//! on the fullest GPU that fits ([`mod@place`]). Its channels pass a CUDA IPC handle on one GPU and
//! use NVLink between GPUs (§7).
//!
//! **Construction.** The decisions are pure functions of the service and the GPUs. On an
//! escher cluster ([`cluster`]) every GPU's SMs, MPS clients, memory and memory bandwidth are
//! ephemeral resources on its node, and every instance is a task requesting its share of them,
//! so the core places and admission-controls what the plan assumed; requests are served by a
//! simulation ([`sim`]) of the instances whose tasks run. [`compare`](mod@compare) sets Astraea
//! beside the paper's baselines (FIRM, Laius) on the same services and GPUs, by the paper's
//! metric: the peak load sustained within the p99 target.
//!
//! **Assumptions.** The stage models (latency, bandwidth and memory per SM share) stand in for
//! the paper's GBDT predictor, and every number of them is ours ([`service`]); the link speeds
//! are the paper's ranges (§7) and ours where it gives none; the cluster's GPUs are simulated
//! A100-40GBs where the paper ran 2080Ti and V100 GPUs. Nothing is measured on a GPU.
//!
//! **Limits.** No batching with timeout padding (a query is one request); the predictor is the
//! closed form, not a GBDT; the Rodinia pipelines and the 21-microservice application of
//! §8.4–8.6 are replaced by one six-stage pipeline of ours; shares are fixed for a deployment
//! (no re-optimisation as the load changes, no process pool).

pub mod alloc;
pub mod cluster;
pub mod compare;
pub mod place;
pub mod service;
pub mod sim;

#[cfg(test)]
mod tests;

pub use alloc::{Allocated, Search, allocate, min_gpus};
pub use cluster::{Deployed, MpsGpus};
pub use compare::{BUDGETS, Planned, Policy, Tuned, plan, tuned};
pub use place::{Instance, Topology, cluster_stages, place};
pub use service::{Device, Links, Service, six_stage, table1};
pub use sim::Deployment;
