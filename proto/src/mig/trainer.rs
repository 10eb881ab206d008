//! What a retraining job on a simulated GPU slice is, run as an actor of the built-in class
//! [`TRAINER_CLASS`](crate::types::TRAINER_CLASS) (the worker's `actors/trainer.rs`): its
//! constructor's argument ([`TrainerArgs`], the job's model as `escher sim-work` takes it in
//! flags) and its answer to `progress` ([`TrainerProgress`]). Shared by the worker that hosts
//! the actor and the GPU policies' cluster driver (`escher-gpu`'s `ClusterGpu`) that creates it
//! on a slice and reads how far it got.
//!
//! A trainer runs its iterations as `escher sim-work` does: the job's run time on its slice
//! ([`SpeedModel`](super::SpeedModel)) spread evenly over its iterations, each simulated second
//! lasting `scale` wall seconds, and it reports the same task telemetry at each iteration
//! ([`ITERATION_KEY`], [`MEMORY_KEY`]). Where sim-work ends by exiting, a trainer, which lives
//! until it is killed, reports its end as telemetry too: [`DONE_KEY`] (the iterations it ran)
//! with `energy_j` when it finished, [`OUT_OF_MEMORY_KEY`] and [`LIMIT_KEY`] (MiB) when its
//! memory passed its slice's.

use serde::{Deserialize, Serialize};

use super::{JobModel, MemoryModel};

/// Telemetry key: the iteration just started (from 1), as `escher sim-work` reports it.
pub const ITERATION_KEY: &str = "iteration";
/// Telemetry key: memory in use at that iteration, GB.
pub const MEMORY_KEY: &str = "mem_requested_gb";
/// Telemetry key: the trainer finished, after this many iterations.
pub const DONE_KEY: &str = "trainer_done";
/// Telemetry key: the trainer stopped out of memory, needing this many MiB...
pub const OUT_OF_MEMORY_KEY: &str = "trainer_oom_used_mib";
/// Telemetry key: ...of the slice's this many.
pub const LIMIT_KEY: &str = "trainer_oom_limit_mib";

/// A trainer's constructor argument: the job it runs (as `escher sim-work`'s flags say it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainerArgs {
    /// The id of the job's task whose run this is (the driver's record of the job).
    pub job: u64,
    /// Run time on the whole GPU, simulated seconds.
    pub work_s: f64,
    /// GPCs it can use (1 to 7).
    pub gpcs: u8,
    /// Memory it uses at every iteration, GB.
    pub mem_gb: f64,
    /// Iterations (a telemetry sample each).
    pub iterations: u32,
    /// Wall seconds per simulated second.
    pub scale: f64,
}

impl TrainerArgs {
    /// The job's model, or what is wrong with the arguments.
    pub fn job_model(&self) -> Result<JobModel, String> {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !(finite(self.work_s) && self.work_s <= 1e7) {
            return Err(format!(
                "work_s {}: give a number of seconds from 0 to 10^7",
                self.work_s
            ));
        }
        if !(1..=7).contains(&self.gpcs) {
            return Err(format!("gpcs {}: a GPU has 1 to 7 GPCs", self.gpcs));
        }
        if !(1..=1_000_000).contains(&self.iterations) {
            return Err(format!("iterations {}: give 1 to 10^6", self.iterations));
        }
        if !(finite(self.mem_gb) && self.mem_gb <= 1e6) {
            return Err(format!(
                "mem_gb {}: give a number of GB from 0 to 10^6",
                self.mem_gb
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 1000.0) {
            return Err(format!(
                "scale {}: give a factor above 0, at most 1000",
                self.scale
            ));
        }
        Ok(JobModel {
            work_s: self.work_s,
            parallelism: self.gpcs,
            pcie_bound: false,
            memory: MemoryModel::Fixed { gb: self.mem_gb },
            iterations: self.iterations,
        })
    }
}

/// How far a trainer got (its `progress` method).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerProgress {
    /// The job whose run this is ([`TrainerArgs::job`]).
    pub job: u64,
    /// The GPU devices (`MIG-…` or `GPU-…` UUIDs) it was given.
    pub devices: Vec<String>,
    /// The profile of its slice (`3g.20gb`), the one its speed is computed for.
    pub profile: String,
    /// Iterations begun.
    pub iteration: u32,
    /// Iterations in all.
    pub iterations: u32,
    /// Its run time on its slice, simulated seconds.
    pub duration_s: f64,
    /// Whether it ran every iteration to its end.
    pub done: bool,
    /// `(used, limit)` MiB when it stopped out of memory.
    pub out_of_memory: Option<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TrainerArgs {
        TrainerArgs {
            job: 1,
            work_s: 10.0,
            gpcs: 7,
            mem_gb: 2.0,
            iterations: 10,
            scale: 0.01,
        }
    }

    #[test]
    fn arguments_become_a_job_model_or_say_what_is_wrong() {
        let job = args().job_model().unwrap();
        assert_eq!((job.work_s, job.parallelism, job.iterations), (10.0, 7, 10));
        for (bad, says) in [
            (TrainerArgs { gpcs: 8, ..args() }, "gpcs 8"),
            (
                TrainerArgs {
                    iterations: 0,
                    ..args()
                },
                "iterations 0",
            ),
            (
                TrainerArgs {
                    work_s: f64::NAN,
                    ..args()
                },
                "work_s NaN",
            ),
            (
                TrainerArgs {
                    scale: 0.0,
                    ..args()
                },
                "scale 0",
            ),
            (
                TrainerArgs {
                    mem_gb: -1.0,
                    ..args()
                },
                "mem_gb -1",
            ),
        ] {
            let why = bad.job_model().unwrap_err();
            assert!(why.starts_with(says), "{why}");
        }
    }
}
