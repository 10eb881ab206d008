//! A model of NVIDIA Multi-Instance GPU (MIG): the profile tables, which layouts of instances
//! are legal, which fully configured layouts a partial one can still reach, and what a
//! reconfiguration costs. Pure and deterministic: no I/O, no clock, no async.
//!
//! The worker uses it to validate and name the slices of real and simulated GPUs (`mig.1g.5gb`
//! resources); the head and the MIG policies use it to plan reconfigurations. The sources are
//! NVIDIA's MIG User Guide and two MIG papers: MIGRator (P0; Wang et al., "Improving GPU
//! Multi-Tenancy Through Dynamic Multi-Instance GPU Reconfiguration", 2024) and MIGM (P2;
//! "Managing Multi Instance GPUs for High Throughput and Energy Savings").
//!
//! # The hardware model
//!
//! A MIG GPU has 7 compute slices (GPCs) and 8 memory slices. A [`Profile`] (`3g.20gb`) takes
//! a number of each and may start only at certain memory slices (`nvidia-smi mig -lgipp`'s
//! `{0,4}:4`). A [`Layout`] is legal when every instance sits at a legal start, no two share a
//! memory slice, at most 7 GPCs are used and no profile exceeds its instance limit.
//!
//! ```text
//! memory slice   0    1    2    3    4    5    6    7
//! 1g.5gb         [0]  [1]  [2]  [3]  [4]  [5]  [6]          size 1
//! 2g.10gb        [0 ----]  [2 ----]  [4 ----]               size 2
//! 3g.20gb        [0 --------------]  [4 --------------]     size 4
//! 4g.20gb        [0 --------------]                         size 4
//! 7g.40gb        [0 ------------------------------------]   size 8
//! ```
//!
//! # Layout
//!
//! - `model.rs`: [`GpuModel`], with names (`a100-40gb`) and NVML product names.
//! - `profile.rs`: [`Profile`] and its resource name.
//! - `tables.rs`: the static profile tables and their sources.
//! - `placement.rs`: [`Placement`], one instance, `profile@start`.
//! - `layout.rs`: [`Layout`], the instances of one GPU, legal at every step; `parse` is in
//!   `parse.rs`.
//! - `reachability.rs`: [`maximal_layouts`], [`reachable`], [`reachability`], [`best_start`]
//!   (MIGM's future configuration reachability).
//! - `reconfiguration.rs`: [`diff`] and [`LatencyModel`] (MIGRator's reconfiguration cost).
//! - `work.rs`: what a simulated GPU runs ([`JobModel`], [`MemoryModel`], [`InferenceModel`])
//!   and how fast and at what power ([`SpeedModel`], [`PowerModel`]).
//! - `trainer.rs`: a retraining job run as an actor of the built-in trainer class
//!   ([`TrainerArgs`], [`TrainerProgress`], its telemetry keys).
//! - `profiler.rs`: a micro-profiling run of a retraining configuration, run by an actor of
//!   the built-in profiler class ([`ProfileRun`], [`ProfileMeasured`], [`measure_accuracy`]).
//! - `device.rs`: [`find_simulated_device`], what a device of a simulated GPU is.
//! - `error.rs`: [`MigError`].

mod device;
mod error;
mod layout;
mod model;
mod parse;
mod placement;
mod profile;
mod profiler;
mod reachability;
mod reconfiguration;
mod tables;
mod trainer;
mod work;

pub use device::{SimDevice, find_simulated_device};
pub use error::MigError;
pub use layout::Layout;
pub use model::GpuModel;
pub use placement::Placement;
pub use profile::Profile;
pub use profiler::{ProfileMeasured, ProfileRun, measure_accuracy};
pub use reachability::{
    best_start, maximal_layouts, maximal_layouts_with, reachability, reachable, reachable_with,
};
pub use reconfiguration::{LatencyModel, ReconfigurationCost, diff};
pub use trainer::{
    DONE_KEY, ITERATION_KEY, LIMIT_KEY, MEMORY_KEY, OUT_OF_MEMORY_KEY, TrainerArgs, TrainerProgress,
};
pub use work::{InferenceModel, JobModel, MemoryModel, PowerModel, SpeedModel, unit};
