//! How a deployment serves: an open-loop generator with exponential inter-arrival times (the
//! paper's, §8.1) feeds queries through the stage graph; each stage hands a query to the
//! instance that would finish it first (the controller's load balancing, §7.1), after the
//! edge's transfer from where the previous stage ran; a GPU whose instances draw more memory
//! bandwidth than it has slows every one of them by the excess (the contention constraint 3
//! guards against; the model is ours, the paper shows QoS violations up to 2x without it,
//! §8.3). The paper's metric is the peak load sustained with the p99 latency within the QoS
//! target (§8.2), found here by bisection on the arrival rate.

use fastrand::Rng;

use super::place::{Instance, Topology, usage};
use super::service::{Apart, Links, Service};

/// A deployment to serve with.
#[derive(Debug, Clone, Copy)]
pub struct Deployment<'a> {
    /// The service.
    pub service: &'a Service,
    /// The GPUs.
    pub topo: &'a Topology,
    /// The instances that run.
    pub instances: &'a [Instance],
    /// The links.
    pub links: &'a Links,
    /// Whether Astraea's channels carry the edges (IPC on a GPU, NVLink between GPUs).
    pub astraea_channels: bool,
}

/// Queries per p99 measurement (the first tenth is warm-up).
pub const QUERIES: usize = 3000;

impl Deployment<'_> {
    /// Each GPU's slowdown from memory bandwidth contention (≥ 1).
    pub fn slowdowns(&self) -> Vec<f64> {
        usage(self.service, self.topo, self.instances)
            .iter()
            .zip(&self.topo.gpus)
            .map(|(u, g)| (u.bw / g.device.bw_gbs).max(1.0))
            .collect()
    }

    fn apart(&self, a: &Instance, b: &Instance) -> Apart {
        if a.gpu == b.gpu {
            Apart::SameGpu
        } else if self.topo.gpus[a.gpu].node == self.topo.gpus[b.gpu].node {
            Apart::SameNode
        } else {
            Apart::Nodes
        }
    }

    /// The bottleneck stage's throughput, queries per second (0 if a stage has no instance).
    pub fn capacity(&self) -> f64 {
        let slow = self.slowdowns();
        (0..self.service.stages.len())
            .map(|s| {
                self.instances
                    .iter()
                    .filter(|i| i.stage == s)
                    .map(|i| self.service.stages[s].throughput(i.share) / slow[i.gpu])
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// The p99 latency, ms, of `queries` queries arriving at `rate` per second.
    pub fn p99_ms(&self, rate: f64, queries: usize, seed: u64) -> f64 {
        let n = self.service.stages.len();
        if rate <= 0.0 || (0..n).any(|s| !self.instances.iter().any(|i| i.stage == s)) {
            return f64::INFINITY;
        }
        let slow = self.slowdowns();
        let service_ms: Vec<f64> = self
            .instances
            .iter()
            .map(|i| self.service.stages[i.stage].latency_ms(i.share) * slow[i.gpu])
            .collect();
        let mut free = vec![0.0f64; self.instances.len()];
        let mut rng = Rng::with_seed(seed);
        let mut t = 0.0;
        let mut latencies = Vec::with_capacity(queries);
        let mut done = vec![(0.0f64, 0usize); n];
        for q in 0..queries {
            t += -(1.0 - rng.f64()).ln() / rate * 1000.0;
            for s in 0..n {
                let mut best: Option<(f64, usize)> = None;
                for (j, inst) in self.instances.iter().enumerate() {
                    if inst.stage != s {
                        continue;
                    }
                    let ready = self
                        .service
                        .inputs(s)
                        .map(|e| {
                            let (at, from) = done[e.from];
                            let apart = self.apart(&self.instances[from], inst);
                            at + self.links.transfer_ms(e.mb, apart, self.astraea_channels)
                        })
                        .fold(t, f64::max);
                    let end = ready.max(free[j]) + service_ms[j];
                    if best.is_none_or(|(b, _)| end < b) {
                        best = Some((end, j));
                    }
                }
                let (end, j) = best.expect("every stage has an instance");
                free[j] = end;
                done[s] = (end, j);
            }
            if q >= queries / 10 {
                let last = done.iter().map(|d| d.0).fold(0.0, f64::max);
                latencies.push(last - t);
            }
        }
        latencies.sort_by(f64::total_cmp);
        let k = ((latencies.len() as f64 * 0.99).ceil() as usize).saturating_sub(1);
        latencies[k.min(latencies.len() - 1)]
    }

    /// The peak load (queries per second) whose p99 latency is within `qos_ms`, by bisection
    /// (0 if even a trickle misses it), and the p99 there.
    pub fn peak_load(&self, qos_ms: f64, seed: u64) -> (f64, f64) {
        let cap = self.capacity();
        if !cap.is_finite() || cap <= 0.0 {
            return (0.0, f64::INFINITY);
        }
        let trickle = cap * 0.01;
        let p = self.p99_ms(trickle, QUERIES, seed);
        if p > qos_ms {
            return (0.0, p);
        }
        let (mut lo, mut hi, mut at_lo) = (trickle, cap, p);
        for _ in 0..16 {
            let mid = (lo + hi) / 2.0;
            let p = self.p99_ms(mid, QUERIES, seed);
            if p <= qos_ms {
                lo = mid;
                at_lo = p;
            } else {
                hi = mid;
            }
        }
        (lo, at_lo)
    }
}
