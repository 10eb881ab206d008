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
//! - `initialize` = 4.0 s per instance created (P0's "library load" plus "model load": the
//!   application side, which varies with the model).
//!
//! Costs add up one operation after another, as `nvidia-smi` performs them. An executor that
//! overlaps them (pre-initialization, parallel model loads) should model that itself.

use std::time::Duration;

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
/// module doc (0.5 s, 1.5 s, 4.0 s: assumed, adding up to MIGRator's measured 6 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LatencyModel {
    /// Destroying one instance.
    pub destroy: Duration,
    /// Creating one instance (GPU instance and compute instance).
    pub create: Duration,
    /// Making a new instance ready to serve: loading libraries and the model.
    pub initialize: Duration,
}

impl Default for LatencyModel {
    fn default() -> LatencyModel {
        LatencyModel {
            destroy: Duration::from_millis(500),
            create: Duration::from_millis(1500),
            initialize: Duration::from_millis(4000),
        }
    }
}

/// The cost of one reconfiguration, phase by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReconfigurationCost {
    /// Instances destroyed.
    pub destroyed: usize,
    /// Instances created (and initialized).
    pub created: usize,
    /// Time spent destroying.
    pub destroy: Duration,
    /// Time spent creating.
    pub create: Duration,
    /// Time spent initializing.
    pub initialize: Duration,
}

impl ReconfigurationCost {
    /// All phases together.
    pub fn total(&self) -> Duration {
        self.destroy + self.create + self.initialize
    }
}

impl LatencyModel {
    /// The phase-by-phase cost of going from `from` to `to`.
    pub fn cost(&self, from: &Layout, to: &Layout) -> ReconfigurationCost {
        let (removed, added) = diff(from, to);
        let times = |d: Duration, n: usize| d * u32::try_from(n).unwrap_or(u32::MAX);
        ReconfigurationCost {
            destroyed: removed.len(),
            created: added.len(),
            destroy: times(self.destroy, removed.len()),
            create: times(self.create, added.len()),
            initialize: times(self.initialize, added.len()),
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
            (cost.destroy, cost.create, cost.initialize),
            (s(0.5), s(3.0), s(8.0))
        );
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
            initialize: Duration::from_millis(100),
        };
        assert_eq!(
            custom.reconfiguration_time(&from, &to),
            Duration::from_millis(221)
        );
    }
}
