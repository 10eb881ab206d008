//! What it takes to go from one layout to another: [`diff`] (which instances go, which come)
//! and [`LatencyModel`] (how long that takes), for simulated GPUs and for policies that weigh
//! a reconfiguration against its benefit.
//!
//! An instance is the same in both layouts when its profile and start are; such instances are
//! left alone and cost nothing. Every other instance of `from` is destroyed and every other
//! instance of `to` is created and then initialized.
//!
//! # Where the default figures come from
//!
//! Measured by MIGRator (P0, arXiv:2407.13126, §4.1 Fig. 5, p.8), on an A100-40GB for
//! ConvNeXt, ResNet50 and MobileNet:
//! - a reconfiguration has four phases: *instance destruction*, *instance initialization*,
//!   *library load* and *model load*;
//! - in total it "can take more than 6,000 milliseconds" (the figure's axis runs to 7,000 ms),
//!   over 1,000 times one inference;
//! - instances being reconfigured serve nothing;
//! - pre-initialization (building future instances from idle ones while the others serve)
//!   hides 83% of the overhead (p.11).
//!
//! The text keeps only the figure's caption, not the per-phase bars, and MIGM (P2) reports no
//! create or destroy latency at all. So **the split below is our assumption**, chosen so that
//! replacing one instance by another (one destroy, one create, one initialize) costs 6.0 s,
//! MIGRator's upper figure:
//! - `destroy` = 0.5 s per instance destroyed (P0's "instance destruction");
//! - `create` = 1.5 s per instance created (P0's "instance initialization": the driver making
//!   the GPU and compute instance);
//! - `library_load` = 1.5 s per instance created (P0's "library load": the CUDA context and the
//!   framework's kernels on the new instance);
//! - `model_load` = 2.5 s per instance created (P0's "model load": the weights copied to the
//!   instance, which varies with the model).
//!
//! Library and model load together are the *initialization* of a new instance (4.0 s). Costs
//! add up one operation after another, as `nvidia-smi` performs them. An executor that overlaps
//! them (pre-initialization, parallel model loads) should model that itself.
//!
//! [`ReconfigurationCost`] is also what a worker reports of a reconfiguration it carried out
//! (`MigDone`): modelled for a simulated GPU, the driver calls timed for a real one (whose
//! library and model loads belong to the tasks and are reported as zero).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Layout, Placement};

/// The instances only in `from` (to destroy) and those only in `to` (to create), each by
/// start. Instances with the same profile and start in both are in neither list.
pub fn diff(from: &Layout, to: &Layout) -> (Vec<Placement>, Vec<Placement>) {
    let removed = from
        .placements()
        .iter()
        .filter(|p| !to.contains(p))
        .copied()
        .collect();
    let added = to
        .placements()
        .iter()
        .filter(|p| !from.contains(p))
        .copied()
        .collect();
    (removed, added)
}

/// Per-instance reconfiguration latencies. [`Default`] gives the figures documented in the
/// module doc (0.5 s, 1.5 s, 1.5 s, 2.5 s: an assumed split of MIGRator's measured total, which
/// the paper gives only as "more than 6,000 milliseconds"). MIGRator's planner in `escher-gpu`
/// plans with the same split (`escher_gpu::migrator::reconfig::phases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LatencyModel {
    /// Destroying one instance.
    pub destroy: Duration,
    /// Creating one instance (GPU instance and compute instance).
    pub create: Duration,
    /// Loading the libraries (CUDA context, framework kernels) on a new instance.
    pub library_load: Duration,
    /// Loading the model onto a new instance.
    pub model_load: Duration,
}

impl Default for LatencyModel {
    fn default() -> LatencyModel {
        LatencyModel {
            destroy: Duration::from_millis(500),
            create: Duration::from_millis(1500),
            library_load: Duration::from_millis(1500),
            model_load: Duration::from_millis(2500),
        }
    }
}

/// The cost of one reconfiguration, phase by phase: MIGRator's four phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ReconfigurationCost {
    /// Instances destroyed.
    pub destroyed: u32,
    /// Instances created (and initialized).
    pub created: u32,
    /// Time spent destroying.
    pub destroy: Duration,
    /// Time spent creating (GPU and compute instances).
    pub create: Duration,
    /// Time spent loading libraries on the new instances.
    pub library_load: Duration,
    /// Time spent loading the model on the new instances.
    pub model_load: Duration,
}

impl ReconfigurationCost {
    /// All phases together.
    pub fn total(&self) -> Duration {
        self.destroy + self.create + self.initialize()
    }

    /// Making the new instances ready to serve: library and model load.
    pub fn initialize(&self) -> Duration {
        self.library_load + self.model_load
    }
}

impl LatencyModel {
    /// The phase-by-phase cost of going from `from` to `to`.
    pub fn cost(&self, from: &Layout, to: &Layout) -> ReconfigurationCost {
        let (removed, added) = diff(from, to);
        // At most 7 instances a side: the counts always fit.
        let destroyed = u32::try_from(removed.len()).unwrap_or(u32::MAX);
        let created = u32::try_from(added.len()).unwrap_or(u32::MAX);
        ReconfigurationCost {
            destroyed,
            created,
            destroy: self.destroy * destroyed,
            create: self.create * created,
            library_load: self.library_load * created,
            model_load: self.model_load * created,
        }
    }

    /// Making one new instance ready to serve: library and model load.
    pub fn initialize(&self) -> Duration {
        self.library_load + self.model_load
    }

    /// Every phase multiplied by `factor` (time scaled for tests and fast simulations).
    pub fn scaled(&self, factor: f64) -> LatencyModel {
        let f = |d: Duration| d.mul_f64(factor);
        LatencyModel {
            destroy: f(self.destroy),
            create: f(self.create),
            library_load: f(self.library_load),
            model_load: f(self.model_load),
        }
    }

    /// How long going from `from` to `to` takes: `destroy` per instance only in `from`,
    /// `create + initialize` per instance only in `to`, nothing for the others.
    pub fn reconfiguration_time(&self, from: &Layout, to: &Layout) -> Duration {
        self.cost(from, to).total()
    }
}

#[cfg(test)]
mod tests {
    use super::super::GpuModel;
    use super::*;

    fn layout(text: &str) -> Layout {
        Layout::parse(GpuModel::A100_40GB, text).unwrap()
    }

    #[test]
    fn diff_keeps_what_is_unchanged() {
        let from = layout("3g.20gb@0,2g.10gb@4,1g.5gb@6");
        let to = layout("3g.20gb@0,1g.5gb@4,1g.5gb@5,1g.5gb@6");
        let (removed, added) = diff(&from, &to);
        let names = |v: &[Placement]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&removed), ["2g.10gb@4"]);
        assert_eq!(names(&added), ["1g.5gb@4", "1g.5gb@5"]);
        assert_eq!(diff(&from, &from), (vec![], vec![]));
    }

    #[test]
    fn latencies_add_up_per_instance() {
        let m = LatencyModel::default();
        let s = Duration::from_secs_f64;
        let from = layout("3g.20gb@0,2g.10gb@4,1g.5gb@6");
        let to = layout("3g.20gb@0,1g.5gb@4,1g.5gb@5,1g.5gb@6");
        let cost = m.cost(&from, &to);
        assert_eq!((cost.destroyed, cost.created), (1, 2));
        assert_eq!(
            (
                cost.destroy,
                cost.create,
                cost.library_load,
                cost.model_load
            ),
            (s(0.5), s(3.0), s(3.0), s(5.0))
        );
        assert_eq!(cost.initialize(), s(8.0));
        assert_eq!(m.reconfiguration_time(&from, &to), s(11.5));
        // Unchanged: free. One instance for another: MIGRator's 6 s.
        assert_eq!(m.reconfiguration_time(&from, &from), Duration::ZERO);
        assert_eq!(
            m.reconfiguration_time(&layout("7g.40gb"), &layout("4g.20gb")),
            s(6.0)
        );
        // From the full GPU to seven 1g instances: 1 destroy, 7 creates and initializations.
        let seven = layout("1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb");
        assert_eq!(
            m.reconfiguration_time(&layout("7g.40gb"), &seven),
            s(0.5 + 7.0 * 5.5)
        );
        // Back again: 7 destroys, 1 create and initialization.
        assert_eq!(
            m.reconfiguration_time(&seven, &layout("7g.40gb")),
            s(7.0 * 0.5 + 5.5)
        );
        let custom = LatencyModel {
            destroy: Duration::from_millis(1),
            create: Duration::from_millis(10),
            library_load: Duration::from_millis(40),
            model_load: Duration::from_millis(60),
        };
        assert_eq!(
            custom.reconfiguration_time(&from, &to),
            Duration::from_millis(221)
        );
        assert_eq!(
            custom.scaled(2.0).reconfiguration_time(&from, &to),
            Duration::from_millis(442)
        );
    }
}
