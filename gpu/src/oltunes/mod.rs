//! OLTunes (Kim, Ha, Kim, *OLTunes: Online learning-based auto-tuning system for DL inference
//! in heterogeneous GPU cluster*, 2025): inference tasks grouped by affinity on heterogeneous
//! GPUs, tuned by an online predictor.
//!
//! **Policy.** A task (Eq. 8) is `[(model, variant), λ, deadline, D]`: λ makes it
//! latency-critical (LC, 0.5 < λ < 1) or throughput-oriented (TO, 0 < λ ≤ 0.5), the deadline is
//! its SLO, and `D` its tuning candidates: the best `(GPU type, batch size, SM%, memory)`
//! records of its two best GPU types, scored by Eq. 4 on the predictions of a factorization
//! machine learned online by FTRL-Proximal and retrained when its error passes θ
//! ([`predictor`], [`tuner`]). The scheduler ([`sched`]) moves tasks from the main queue to
//! `Q_LC` and `Q_TO` by urgency, picks the least-utilized available GPU, fills a co-location
//! group of at most four tasks, LC first, that fit its memory, list it in their top-2 and pass
//! the affinity checker (CI/MI ratio and variant), within the window `W_time` (50–1000 ms, step
//! 10 ms, shrunk while LC tasks are more than 70% of the queue), auto-tunes one task of the
//! group into the memory left, and assigns the group; a refused assignment goes back to
//! `Q_LC` first and shrinks the window.
//!
//! **Construction.** The decisions are pure and run on a simulated heterogeneous cluster
//! ([`sim`]: the paper's 5 A100, 2 A30 and one RTX 4090; MPS co-location slowed by Table 1's
//! interference), deterministic for a seed, against the paper's baselines ([`baselines`]:
//! MLaaS' reserving-and-packing, Orion) in [`compare`](mod@compare). On an escher cluster a group's
//! placement is expressed with ephemeral resources ([`resources`]): each GPU is a pair of
//! finite resources (its memory in GB and its SM%) on its node, and a task of a group
//! requests its share of both on the GPU it was assigned, so the core admission-controls what
//! the simulation checks (a group that does not fit waits, as a refused assignment). On a real
//! cluster ([`cluster`]: a head and a worker with simulated whole GPUs) every server the
//! scheduler places is an actor of the built-in serving class holding a co-location slot of
//! the GPU it chose and its memory; a refused one is killed and placed again by the feedback.
//!
//! **Assumptions.** Every input is one: the paper's numbers (Tables 1, 3–7) where it gives
//! them, ours where it gives none (speeds, memory, CI/MI ratios, FTRL hyperparameters, θ, α,
//! β); each is marked where it is defined. Nothing here is measured on a GPU. `README.md`
//! beside this file sets the paper's figures beside ours.
//!
//! **Limits.** SM% is enforced only in the simulation (the paper does not say how it enforces
//! it either); interference is Table 1's kernel pairs applied to whole models; the paper's
//! prediction baselines (MF, RFR) are not built, only a mean predictor as the floor; MIG
//! repartitioning is not modelled (the paper leaves it to future work, §6).

pub mod baselines;
pub mod cluster;
pub mod compare;
pub mod predictor;
pub mod resources;
pub mod sched;
pub mod sim;
pub mod task;
pub mod tuner;

#[cfg(test)]
mod tests;

pub use cluster::{ClusterRun, OlTunesCluster, OltGpu, ServerEnd, ServerView};
pub use compare::{Metrics, Run, compare, compare_at, runs, table};
pub use sched::OlTunes;
pub use task::{Class, GpuType, Pattern, Task};
