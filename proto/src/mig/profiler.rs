//! One micro-profiling run of a retraining configuration on a simulated GPU slice, as an actor
//! of the built-in class [`PROFILER_CLASS`](crate::types::PROFILER_CLASS) (the worker's
//! `actors/profiler.rs`) runs it: its argument ([`ProfileRun`]) and its answer
//! ([`ProfileMeasured`]). Shared by the worker that hosts the actor and the GPU policies'
//! cluster driver (`escher-gpu`'s `ClusterGpu::profile`), which hands Ekya's micro-profiler
//! (`escher_gpu::ekya_profiler`) what the actors measured.
//!
//! Ekya's micro-profiler (thesis §2.4.4) trains each candidate configuration for a few epochs
//! on a small sample of the window's data, measuring its accuracy after each epoch and the GPU
//! time an epoch takes. Simulated here: the configuration's true accuracy curve (`beta`, the
//! simulation's ground truth) is measured after each epoch with sampling noise
//! ([`measure_accuracy`], the same draws as the in-memory micro-profiler's), and each epoch
//! takes its GPU time on the sample at the slice's speed ([`SpeedModel`](super::SpeedModel)),
//! spent in compressed time (`scale` wall seconds per simulated second) before the epoch's
//! accuracy is known. What the run answers is what it measured: the accuracy points and the
//! simulated seconds an epoch took on its slice; the caller fits the curve and scales the time.

use serde::{Deserialize, Serialize};

use super::{JobModel, MemoryModel};

/// A profiling run's argument: one candidate configuration, trained for `epochs` on a `sample`
/// of the window's data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfileRun {
    /// Which candidate this is (an index the caller defines; echoed in the answer).
    pub candidate: u32,
    /// `β0`, `β1`, `β2` of the configuration's true accuracy curve `β2 − 1 / (β0 e + β1)`
    /// (the simulation's ground truth; what the run measures, with noise).
    pub beta: [f64; 3],
    /// GPU seconds of one epoch on all the window's data on the whole GPU (7 GPCs).
    pub epoch_s: f64,
    /// Fraction of the window's data it trains on (Ekya: 5 to 10%).
    pub sample: f64,
    /// Epochs it trains for (Ekya: about 5).
    pub epochs: u32,
    /// Standard deviation of an epoch's measured accuracy on a 5% sample (smaller on more).
    pub noise: f64,
    /// Seed of the measurement noise.
    pub seed: u64,
    /// Wall seconds per simulated second.
    pub scale: f64,
}

impl ProfileRun {
    /// What is wrong with the run's numbers, if anything.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !self.beta.iter().all(|b| b.is_finite()) {
            return Err(format!("beta {:?}: give finite numbers", self.beta));
        }
        if !(finite(self.epoch_s) && self.epoch_s <= 1e7) {
            return Err(format!(
                "epoch_s {}: give a number of seconds from 0 to 10^7",
                self.epoch_s
            ));
        }
        if !(self.sample > 0.0 && self.sample <= 1.0) {
            return Err(format!(
                "sample {}: give a fraction of the data above 0, at most 1",
                self.sample
            ));
        }
        if !(1..=100).contains(&self.epochs) {
            return Err(format!("epochs {}: give 1 to 100", self.epochs));
        }
        if !(finite(self.noise) && self.noise <= 1.0) {
            return Err(format!("noise {}: give 0 to 1", self.noise));
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 1000.0) {
            return Err(format!(
                "scale {}: give a factor above 0, at most 1000",
                self.scale
            ));
        }
        Ok(())
    }

    /// An epoch on the sample as a job (it can use the whole GPU's 7 GPCs), whose run time on
    /// a slice is the [`SpeedModel`](super::SpeedModel)'s.
    pub fn epoch_job(&self) -> JobModel {
        JobModel {
            work_s: self.epoch_s * self.sample,
            parallelism: 7,
            pcie_bound: false,
            memory: MemoryModel::Fixed { gb: 0.0 },
            iterations: 1,
        }
    }
}

/// What a profiling run measured (the profiler's `profile` method).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileMeasured {
    /// The candidate ([`ProfileRun::candidate`]).
    pub candidate: u32,
    /// The GPU devices (`MIG-…` or `GPU-…` UUIDs) the profiler holds.
    pub devices: Vec<String>,
    /// The profile of its slice (`3g.20gb`), the one an epoch's time was spent on.
    pub profile: String,
    /// `(epoch, accuracy)` measured after each epoch, from epoch 1.
    pub accuracy: Vec<(f64, f64)>,
    /// Simulated seconds one epoch on the sample took on the slice.
    pub epoch_s_on_slice: f64,
}

/// The accuracy measured after each of `epochs` epochs of a configuration whose true curve is
/// `beta`, trained on a `sample` of the data: the truth plus noise of standard deviation
/// `noise * sqrt(0.05 / sample)` (roughly normal: a sum of three uniforms), drawn from `rng`.
pub fn measure_accuracy(
    beta: [f64; 3],
    sample: f64,
    noise: f64,
    epochs: u32,
    rng: &mut fastrand::Rng,
) -> Vec<(f64, f64)> {
    let [b0, b1, b2] = beta;
    let sd = noise * (0.05 / sample).sqrt();
    (1..=epochs)
        .map(|e| {
            let e = f64::from(e);
            let z = (rng.f64() + rng.f64() + rng.f64() - 1.5) * 2.0;
            (e, b2 - 1.0 / (b0 * e + b1) + sd * z)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> ProfileRun {
        ProfileRun {
            candidate: 3,
            beta: [1.0, 3.0, 0.9],
            epoch_s: 4.0,
            sample: 0.05,
            epochs: 5,
            noise: 0.01,
            seed: 7,
            scale: 0.01,
        }
    }

    #[test]
    fn a_run_s_numbers_are_checked_and_its_epoch_is_a_job_on_the_sample() {
        run().validate().unwrap();
        assert_eq!(run().epoch_job().work_s, 0.2);
        for (bad, says) in [
            (
                ProfileRun {
                    sample: 0.0,
                    ..run()
                },
                "sample 0",
            ),
            (ProfileRun { epochs: 0, ..run() }, "epochs 0"),
            (
                ProfileRun {
                    epoch_s: f64::NAN,
                    ..run()
                },
                "epoch_s NaN",
            ),
            (
                ProfileRun {
                    beta: [f64::INFINITY, 1.0, 1.0],
                    ..run()
                },
                "beta",
            ),
            (
                ProfileRun {
                    scale: 0.0,
                    ..run()
                },
                "scale 0",
            ),
        ] {
            let why = bad.validate().unwrap_err();
            assert!(why.starts_with(says), "{why}");
        }
    }

    #[test]
    fn measurements_follow_the_curve_within_the_noise_and_repeat_with_the_seed() {
        let r = run();
        let seeded = |seed| {
            measure_accuracy(
                r.beta,
                r.sample,
                r.noise,
                r.epochs,
                &mut fastrand::Rng::with_seed(seed),
            )
        };
        let once = seeded(1);
        assert_eq!(once, seeded(1));
        assert_eq!(once.len(), 5);
        for (e, a) in &once {
            let truth = 0.9 - 1.0 / (e + 3.0);
            // Three uniforms scaled by 2: at most 3 standard deviations off.
            assert!(
                (a - truth).abs() <= 0.03 + 1e-12,
                "{e}: {a} against {truth}"
            );
        }
        let exact = measure_accuracy(r.beta, r.sample, 0.0, 2, &mut fastrand::Rng::with_seed(1));
        assert_eq!(exact, vec![(1.0, 0.9 - 0.25), (2.0, 0.9 - 0.2)]);
    }
}
