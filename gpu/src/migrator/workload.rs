//! Two-tenant continual-learning workloads for MIGRator and its baselines, built from what P0
//! (MIGRator, Wang et al. 2024: §3's motivation figures, §4's design, §5's evaluation) gives
//! and, where it gives nothing, from stated assumptions.
//!
//! **From P0.** Two tenants per GPU (Table 4), a 200 s retraining window, arrival peaks near
//! 300 requests per second (Fig. 3), retraining about three times the inference cost of the
//! same data (§4.1.2), new classes cutting accuracy by 32.5% for the large models and
//! retraining recovering about 30% (§5.2), and Fig. 2's ResNet50 accuracy per inference-
//! retraining split (73.6% to 91.3% in window 1).
//!
//! **Assumed** (P0 gives no capability per instance size, no SLO value and no trace data):
//! - capability proportional to GPCs: 60 requests/s per GPC for a ResNet50-class model and
//!   40 for an Inception-class one, at batch size 1;
//! - retraining time `RT_1 / k^0.9` on `k` GPCs (slightly sublinear), with `RT_1` =
//!   120 s and 150 s on one GPC (a one-GPC retraining takes most of the window, a 4-GPC one
//!   35 to 43 s);
//! - accuracies 0.60 before and 0.90 after retraining for the first tenant (a large drop, as
//!   P0's W1), 0.78 and 0.86 for the second;
//! - a reconfiguration costs its tenant `psi` = 6 s of service (P0 Fig. 5's "more than 6,000
//!   ms");
//! - traces: the first tenant's arrivals follow an Alibaba-like pattern (a base rate with
//!   bursts: [`bursty_trace`]), the second an Azure-LLM-like one (a slow wave with noise:
//!   [`wave_trace`]), both deterministic from a seed.
//!
//! [`two_tenants`] draws each window independently. [`Workload`] is one continuous trace of a
//! [`Shape`] (P0's bursty + wave pairing, both tenants bursty, both diurnal) cut into windows,
//! so that a window has a past to forecast from; a window's real arrivals
//! ([`Workload::actual`]) are what every plan is evaluated on.

use std::f64::consts::PI;

use escher_proto::mig::GpuModel;
use escher_proto::mig::unit;

use super::problem::{Problem, Tenant};

/// Per-second arrivals: `base` requests per second, with bursts of up to `burst` more that
/// start with probability 4% each second and decay over about 8 s, and 10% noise.
pub fn bursty_trace(seconds: usize, base: f64, burst: f64, seed: u64) -> Vec<f64> {
    let mut level: f64 = 0.0;
    (0..seconds)
        .map(|s| {
            let key = seed.wrapping_mul(1_000_003).wrapping_add(s as u64);
            if unit(key) < 0.04 {
                level = burst * (0.5 + 0.5 * unit(key ^ 0xABCD));
            }
            level *= 0.88;
            let noise = 1.0 + 0.2 * (unit(key ^ 0x1234) - 0.5);
            ((base + level) * noise).max(0.0)
        })
        .collect()
}

/// Per-second arrivals: a wave between `low` and `high` with a period of `period_s`, and 10%
/// noise.
pub fn wave_trace(seconds: usize, low: f64, high: f64, period_s: f64, seed: u64) -> Vec<f64> {
    wave_trace_at(
        seconds,
        (low, high, period_s),
        unit(seed) * std::f64::consts::TAU,
        seed,
    )
}

/// [`wave_trace`] with its phase given (radians) and its noise drawn from `seed`.
pub fn wave_trace_at(
    seconds: usize,
    (low, high, period_s): (f64, f64, f64),
    phase: f64,
    seed: u64,
) -> Vec<f64> {
    (0..seconds)
        .map(|s| {
            let x = (s as f64 / period_s * std::f64::consts::TAU + phase).sin();
            let noise = 1.0 + 0.2 * (unit(seed.wrapping_mul(7919).wrapping_add(s as u64)) - 0.5);
            (low + (high - low) * (x + 1.0) / 2.0) * noise
        })
        .collect()
}

/// Capability table proportional to GPCs.
pub fn proportional(per_gpc: f64) -> [f64; 8] {
    std::array::from_fn(|k| per_gpc * k as f64)
}

/// Retraining times `rt1 / k^0.9` on 1 to 7 GPCs (infinite on 0).
pub fn retrain_times(rt1: f64) -> [f64; 8] {
    std::array::from_fn(|k| {
        if k == 0 {
            f64::INFINITY
        } else {
            rt1 / (k as f64).powf(0.9)
        }
    })
}

/// The two-tenant workload of window `window` (traces differ per window) at granularity
/// `step_s`, on an A100-40GB, both inference tasks starting on 3 GPCs.
pub fn two_tenants(window: u64, window_s: u32, step_s: f64) -> Problem {
    let n = window_s as usize;
    let tenants = vec![
        Tenant {
            name: "resnet50".into(),
            min_gpcs: 1,
            capability: proportional(60.0),
            forecast: bursty_trace(n, 140.0, 160.0, 11 + window),
            retrain_s: retrain_times(120.0),
            acc_pre: 0.60,
            acc_post: 0.90,
            psi_s: 6.0,
        },
        Tenant {
            name: "inception".into(),
            min_gpcs: 1,
            capability: proportional(40.0),
            forecast: wave_trace(n, 40.0, 160.0, 120.0, 23 + window),
            retrain_s: retrain_times(150.0),
            acc_pre: 0.78,
            acc_post: 0.86,
            psi_s: 6.0,
        },
    ];
    Problem {
        model: GpuModel::A100_40GB,
        tenants,
        window_s,
        step_s,
        initial: vec![3, 3],
    }
}

/// The shape of a workload's arrivals over many windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// P0's pairing (§5.1): the first tenant on an Alibaba-like bursty trace, the second on
    /// an Azure-LLM-like wave (a 120 s period).
    Paper,
    /// Both tenants bursty (Alibaba-like, [`bursty_trace`]).
    Bursty,
    /// Both tenants diurnal: a day compressed to [`DAY_S`] seconds (four windows), low at
    /// night and high in the day, with noise ([`wave_trace`]; the compression is assumed, so
    /// that the load changes within a window and across the history).
    Diurnal,
}

/// A compressed day, seconds (the diurnal shape's period; assumed, see [`Shape::Diurnal`]).
pub const DAY_S: usize = 800;

/// Windows of history before the first window a comparison plans (two compressed days: the
/// forecaster needs two seasons).
pub const HISTORY_WINDOWS: usize = 8;

impl Shape {
    /// Every shape, in the order reports print them.
    pub const ALL: [Shape; 3] = [Shape::Paper, Shape::Bursty, Shape::Diurnal];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Paper => "paper (bursty + wave)",
            Shape::Bursty => "bursty",
            Shape::Diurnal => "diurnal",
        }
    }

    /// Its key in figure names.
    pub fn key(self) -> &'static str {
        match self {
            Shape::Paper => "paper",
            Shape::Bursty => "bursty",
            Shape::Diurnal => "diurnal",
        }
    }

    /// Each tenant's season, as its operator knows it (the forecaster's input), seconds.
    pub fn seasons(self) -> [Option<usize>; 2] {
        match self {
            Shape::Paper => [None, Some(120)],
            Shape::Bursty => [None, None],
            Shape::Diurnal => [Some(DAY_S), Some(DAY_S)],
        }
    }
}

/// Both tenants' arrivals, per second, over `windows` windows of `window_s` seconds of one
/// continuous trace of `shape` (so that a window's past is the windows before it).
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The shape.
    pub shape: Shape,
    /// Window length, seconds.
    pub window_s: u32,
    /// `arrivals[m][t]`: tenant `m`'s requests in second `t` of the trace.
    pub arrivals: Vec<Vec<f64>>,
}

impl Workload {
    /// `windows` windows of `shape`, from `seed`.
    pub fn new(shape: Shape, windows: usize, window_s: u32, seed: u64) -> Workload {
        let n = windows * window_s as usize;
        let arrivals = match shape {
            Shape::Paper => vec![
                bursty_trace(n, 140.0, 160.0, 11 + seed),
                wave_trace(n, 40.0, 160.0, 120.0, 23 + seed),
            ],
            Shape::Bursty => vec![
                bursty_trace(n, 140.0, 160.0, 11 + seed),
                bursty_trace(n, 70.0, 120.0, 37 + seed),
            ],
            Shape::Diurnal => {
                // One day for both: the second tenant's peak lags the first's by 1/20 day.
                let phase = unit(41 + seed) * std::f64::consts::TAU;
                let day = DAY_S as f64;
                vec![
                    wave_trace_at(n, (60.0, 300.0, day), phase, 41 + seed),
                    wave_trace_at(n, (30.0, 170.0, day), phase - 0.1 * PI, 53 + seed),
                ]
            }
        };
        Workload {
            shape,
            window_s,
            arrivals,
        }
    }

    /// The seconds before window `w`.
    fn start(&self, w: usize) -> usize {
        w * self.window_s as usize
    }

    /// Window `w` with its real arrivals as the tenants' "forecast": what the window is
    /// evaluated on, and the oracle's input.
    pub fn actual(&self, w: usize, step_s: f64) -> Problem {
        let from = self.start(w);
        let to = from + self.window_s as usize;
        two_tenants_with(
            self.arrivals.iter().map(|a| a[from..to].to_vec()).collect(),
            self.window_s,
            step_s,
        )
    }

    /// What was observed before window `w` starts, per tenant.
    pub fn past(&self, w: usize) -> Vec<&[f64]> {
        let from = self.start(w);
        self.arrivals.iter().map(|a| &a[..from]).collect()
    }

    /// Window `w` as MIGRator plans it: each tenant's arrivals forecast from [`Self::past`]
    /// ([`forecast`](super::forecast::forecast)), with the forecasters' fits.
    pub fn forecast(&self, w: usize, step_s: f64) -> (Problem, Vec<super::forecast::Fit>) {
        let seasons = self.shape.seasons();
        let (arrivals, fits): (Vec<Vec<f64>>, Vec<_>) = self
            .past(w)
            .iter()
            .enumerate()
            .map(|(m, past)| super::forecast::forecast(past, seasons[m], self.window_s as usize))
            .unzip();
        (two_tenants_with(arrivals, self.window_s, step_s), fits)
    }
}

/// The two tenants of [`two_tenants`] with the given per-second arrivals.
pub fn two_tenants_with(arrivals: Vec<Vec<f64>>, window_s: u32, step_s: f64) -> Problem {
    let mut p = two_tenants(0, window_s, step_s);
    for (t, a) in p.tenants.iter_mut().zip(arrivals) {
        t.forecast = a;
    }
    p
}
