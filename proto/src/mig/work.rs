//! What a simulated GPU runs and how fast: [`JobModel`] (a batch job: work, parallelism,
//! PCIe-boundness, memory), [`InferenceModel`] (a replica's capacity), [`SpeedModel`] and
//! [`PowerModel`]. Shared by the GPU policies' in-memory fake (`escher_gpu::SimGpu`) and
//! the framework's simulated GPU (`escher sim-work`, the program a task runs on a worker's
//! `--sim-gpu` slice), so both run work at the same speed.
//!
//! # Assumptions (the papers do not give these numbers)
//!
//! - **Speed.** A job's `work_s` is its run time on the whole GPU. It can use `parallelism`
//!   GPCs (MIGM's warp folding: beyond that, more GPCs do not help), so on an instance of `c`
//!   GPCs it takes `work_s * max(1, parallelism / c)`: proportional to GPCs up to what it can
//!   use. A 4g.20gb instance therefore runs a 4-GPC job 4/3 faster than a 3g.20gb (MIGM §5.2.1,
//!   the 4/7 vs 3/7 asymmetry). A PCIe-bound job on a 1g instance takes a further
//!   `pcie_slowdown_1g` (2.2, MIGM §5.1's Needleman-Wunsch: "~2.2x increase in runtime").
//! - **Power.** `idle_w` when nothing runs, plus `busy_w` spread over the 7 GPCs: an instance
//!   running a task draws `busy_w * c / 7` whatever the task uses (the whole instance is
//!   clocked). 50 W and 200 W: an A100 PCIe's 250 W board power when all of it is busy. With
//!   this model energy tracks throughput, as MIGM reports ("energy savings tracks closely with
//!   the throughput improvements"); only ratios of energies are meaningful.

use super::Profile;

/// How a batch job's memory behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryModel {
    /// A fixed peak, reached in the first iteration.
    Fixed {
        /// Peak memory, GB.
        gb: f64,
    },
    /// Memory that grows each iteration (LLM inference with a growing context, training with
    /// accumulating state): `base + per_iteration * i` plus a deterministic jitter in
    /// `[-jitter, +jitter]`, at iteration `i` (from 1).
    Growing {
        /// Memory at iteration 0, GB.
        base_gb: f64,
        /// Growth per iteration, GB.
        per_iteration_gb: f64,
        /// Amplitude of the jitter, GB.
        jitter_gb: f64,
        /// Seed of the jitter.
        seed: u64,
    },
}

impl MemoryModel {
    /// Memory in use at iteration `i` (from 1), GB.
    pub fn at(&self, i: u32) -> f64 {
        match *self {
            MemoryModel::Fixed { gb } => gb,
            MemoryModel::Growing {
                base_gb,
                per_iteration_gb,
                jitter_gb,
                seed,
            } => {
                let u = unit(seed ^ u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                base_gb + per_iteration_gb * f64::from(i) + jitter_gb * (2.0 * u - 1.0)
            }
        }
    }

    /// The highest memory over `iterations`, GB.
    pub fn peak(&self, iterations: u32) -> f64 {
        (1..=iterations.max(1))
            .map(|i| self.at(i))
            .fold(f64::MIN, f64::max)
    }
}

/// A uniform number in `[0, 1)`, a function of `seed` alone (the first draw of a generator
/// seeded with it), so that a model's value at an iteration needs no state.
pub fn unit(seed: u64) -> f64 {
    fastrand::Rng::with_seed(seed).f64()
}

/// A batch job: how long, how parallel, how much memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobModel {
    /// Run time on the whole GPU, seconds.
    pub work_s: f64,
    /// GPCs it can use.
    pub parallelism: u8,
    /// Whether host-device transfers dominate (slower on a 1g instance).
    pub pcie_bound: bool,
    /// Its memory.
    pub memory: MemoryModel,
    /// Iterations (a telemetry sample each); the run time is spread evenly over them.
    pub iterations: u32,
}

impl JobModel {
    /// A job of `work_s` seconds on the whole GPU with a fixed peak of `gb`, using up to
    /// `parallelism` GPCs, in one iteration.
    pub fn fixed(work_s: f64, parallelism: u8, gb: f64) -> JobModel {
        JobModel {
            work_s,
            parallelism,
            pcie_bound: false,
            memory: MemoryModel::Fixed { gb },
            iterations: 1,
        }
    }

    /// The same job, PCIe-bound.
    pub fn pcie_bound(self) -> JobModel {
        JobModel {
            pcie_bound: true,
            ..self
        }
    }
}

/// An inference task's replica capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InferenceModel {
    /// Requests per second one GPC serves.
    pub per_gpc_rps: f64,
    /// The latency objective, milliseconds: a request served later is not on time.
    pub slo_ms: u64,
}

/// How fast a job runs on an instance (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedModel {
    /// Extra slowdown of a PCIe-bound job on a 1-GPC instance.
    pub pcie_slowdown_1g: f64,
}

impl Default for SpeedModel {
    fn default() -> SpeedModel {
        SpeedModel {
            pcie_slowdown_1g: 2.2,
        }
    }
}

impl SpeedModel {
    /// How many times longer than on the whole GPU `job` takes on `profile`.
    pub fn slowdown(&self, job: &JobModel, profile: &Profile) -> f64 {
        let c = f64::from(profile.compute.max(1));
        let fold = (f64::from(job.parallelism.max(1)) / c).max(1.0);
        let pcie = if job.pcie_bound && profile.compute == 1 {
            self.pcie_slowdown_1g
        } else {
            1.0
        };
        fold * pcie
    }

    /// `job`'s run time on `profile`, seconds.
    pub fn duration_s(&self, job: &JobModel, profile: &Profile) -> f64 {
        job.work_s * self.slowdown(job, profile)
    }
}

/// The GPU's power (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerModel {
    /// Power with nothing running, W.
    pub idle_w: f64,
    /// Extra power with all 7 GPCs running, W.
    pub busy_w: f64,
}

impl Default for PowerModel {
    fn default() -> PowerModel {
        PowerModel {
            idle_w: 50.0,
            busy_w: 200.0,
        }
    }
}

impl PowerModel {
    /// Power with `busy_gpcs` GPCs running tasks, W.
    pub fn power_w(&self, busy_gpcs: u8) -> f64 {
        self.idle_w + self.busy_w * f64::from(busy_gpcs.min(7)) / 7.0
    }
}

#[cfg(test)]
mod tests {
    use super::super::GpuModel;
    use super::*;

    #[test]
    fn speed_is_proportional_to_gpcs_up_to_the_jobs_parallelism() {
        let m = GpuModel::A100_40GB;
        let s = SpeedModel::default();
        let big = JobModel::fixed(10.0, 7, 18.0);
        let p = |n| m.profile(n).unwrap();
        assert_eq!(s.duration_s(&big, p("7g.40gb")), 10.0);
        assert_eq!(s.duration_s(&big, p("4g.20gb")), 17.5);
        assert!((s.duration_s(&big, p("3g.20gb")) - 70.0 / 3.0).abs() < 1e-9);
        let small = JobModel::fixed(10.0, 1, 4.0);
        assert_eq!(s.duration_s(&small, p("1g.5gb")), 10.0);
        assert_eq!(s.duration_s(&small.pcie_bound(), p("1g.5gb")), 22.0);
        assert_eq!(s.duration_s(&small.pcie_bound(), p("2g.10gb")), 10.0);
    }

    #[test]
    fn memory_grows_with_bounded_jitter() {
        let m = MemoryModel::Growing {
            base_gb: 2.0,
            per_iteration_gb: 0.1,
            jitter_gb: 0.05,
            seed: 7,
        };
        for i in 1..100 {
            let v = m.at(i);
            let trend = 2.0 + 0.1 * f64::from(i);
            assert!((v - trend).abs() <= 0.05 + 1e-12, "{i}: {v}");
        }
        assert!(m.peak(100) > 11.9 && m.peak(100) < 12.06);
        assert_eq!(MemoryModel::Fixed { gb: 3.0 }.peak(10), 3.0);
    }

    #[test]
    fn power_spreads_over_gpcs() {
        let p = PowerModel::default();
        assert_eq!(p.power_w(0), 50.0);
        assert_eq!(p.power_w(7), 250.0);
    }
}
