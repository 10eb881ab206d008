//! Astraea against its paper's baselines (§8.1) on the same services and GPUs, by the paper's
//! metric: the peak load sustained with the p99 latency within the QoS target (§8.2).
//!
//! - **Astraea**: Eq. 2 by epsilon-greedy search with all five constraints, placed by
//!   Algorithm 1 and the intra-node rules, over its channels (IPC on a GPU, NVLink between
//!   GPUs).
//! - **FIRM** (as the paper adapts it): the best allocation of instances and SM shares found
//!   by brute force (every `(N_i, p_i)` pair for two stages; the same search as Astraea's for
//!   more) without the bandwidth constraint, then placed at random (Kubernetes' default spread),
//!   every edge copied through the host.
//! - **Laius** (as the paper adapts it): no scale-out; two stages per GPU, one copy of the
//!   pipeline per group of GPUs, the stages paired and laid on the GPUs by the segmentation
//!   with the least communication (§8.6), the stage with the lower throughput best-effort: the
//!   other gets the smallest SM share that keeps the latency within the target and the
//!   best-effort stage the rest; edges through the host.
//!
//! **The same interconnect for every policy.** NVLink is the machine's, not a policy's: with
//! [`Links::nvlink_for_all`] every policy's edges between two GPUs of a node take it; with
//! [`Links::without_nvlink`] none do (the paper's §8.2 servers of two RTX 2080 Ti). The
//! default [`Links`] is the paper's DGX-2 run with GPU-to-GPU communication (§8.5, Fig. 17),
//! where only Astraea's channels use NVLink because the baselines do not manage their
//! deployment across GPUs. On one GPU only Astraea passes an IPC handle (its channels, §7).
//!
//! **The same information for every policy.** Each plans to a latency target `budget × QoS`
//! (the room left for queueing) and each gets the budget of [`BUDGETS`] under which its own
//! deployment sustains the most load in the simulation, so no policy is tuned and another not.

use fastrand::Rng;

use super::alloc::{Search, allocate, critical_path, feasible};
use super::place::{Allocation, Instance, Topology, place_randomly};
use super::service::{Apart, Links, Service};
use super::sim::Deployment;

/// The latency targets each policy is tried at, as fractions of the QoS target (ours).
pub const BUDGETS: [f64; 6] = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// The policies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Astraea.
    Astraea,
    /// Astraea without the bandwidth constraint (the paper's Astraea-NC ablation, §8.3).
    AstraeaNc,
    /// FIRM, adapted as the paper does.
    Firm,
    /// Laius, adapted as the paper does.
    Laius,
}

impl Policy {
    /// Its name as printed.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Astraea => "Astraea",
            Policy::AstraeaNc => "Astraea-NC",
            Policy::Firm => "FIRM",
            Policy::Laius => "Laius",
        }
    }

    /// Whether its edges go over Astraea's channels.
    pub fn astraea_channels(self) -> bool {
        matches!(self, Policy::Astraea | Policy::AstraeaNc)
    }

    /// Whether it accounts memory bandwidth (and so requests it on a cluster).
    pub fn accounts_bandwidth(self) -> bool {
        self == Policy::Astraea
    }
}

/// A policy's deployment plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The policy.
    pub policy: Policy,
    /// The latency budget it planned to.
    pub budget: f64,
    /// `(N_i, p_i)` per stage.
    pub alloc: Allocation,
    /// The instances, placed.
    pub instances: Vec<Instance>,
}

/// `policy`'s plan for `service` on `topo` at latency budget `budget`; `None` if it finds
/// none.
pub fn plan(
    policy: Policy,
    service: &Service,
    topo: &Topology,
    links: &Links,
    budget: f64,
    seed: u64,
) -> Option<Planned> {
    let (alloc, instances) = match policy {
        Policy::Astraea | Policy::AstraeaNc => {
            let search = Search {
                bandwidth: policy == Policy::Astraea,
                budget,
                seed,
                ..Search::default()
            };
            let a = allocate(service, topo, links, &search)?;
            (a.alloc, a.instances)
        }
        Policy::Firm => {
            let search = Search {
                bandwidth: false,
                transfers: Some(false),
                budget,
                seed,
                ..Search::default()
            };
            let alloc = if service.stages.len() <= 2 {
                brute_force(service, topo, links, &search)?
            } else {
                allocate(service, topo, links, &search)?.alloc
            };
            let mut rng = Rng::with_seed(seed);
            let instances = place_randomly(service, &alloc, topo, &mut rng)?;
            (alloc, instances)
        }
        Policy::Laius => laius(service, topo, links, budget)?,
    };
    Some(Planned {
        policy,
        budget,
        alloc,
        instances,
    })
}

/// FIRM's offline brute force over every `(N_i, p_i)` of up to two stages (shares in 10%
/// steps, `N_i p_i` at most the GPUs), by Eq. 2's objective under `search`'s constraints.
pub fn brute_force(
    service: &Service,
    topo: &Topology,
    links: &Links,
    search: &Search,
) -> Option<Allocation> {
    let n = topo.gpus.len() as f64;
    let steps = (1.0 / search.granularity).round() as u32;
    let per_stage: Vec<(u32, f64)> = (1..=steps)
        .flat_map(|k| {
            let p = f64::from(k) * search.granularity;
            (1..=((n / p + 1e-9).floor() as u32)).map(move |c| (c, p))
        })
        .collect();
    let mut best: Option<(f64, f64, Allocation)> = None;
    let mut consider = |alloc: Allocation| {
        if let Some(a) = feasible(service, topo, links, &alloc, search) {
            let sm: f64 = alloc.iter().map(|&(c, p)| f64::from(c) * p).sum();
            if best.as_ref().is_none_or(|(o, s, _)| {
                a.objective > *o + 1e-9 || ((a.objective - o).abs() <= 1e-9 && sm < *s)
            }) {
                best = Some((a.objective, sm, alloc));
            }
        }
    };
    match service.stages.len() {
        1 => per_stage.iter().for_each(|&x| consider(vec![x])),
        2 => {
            for &a in &per_stage {
                for &b in &per_stage {
                    consider(vec![a, b]);
                }
            }
        }
        _ => return None,
    }
    best.map(|(_, _, a)| a)
}

/// Laius' plan (see the module doc): two stages per GPU, one copy of the pipeline per group
/// of GPUs (a copy's GPUs consecutive, so on as few nodes as they fit), the stages paired and
/// their pairs laid on the copy's GPUs by the segmentation with the least communication
/// ([`least_communication`], the paper's §8.6: "Laius first manually finds the segmentation
/// method with the least communication overhead"); in each pair the stage with the higher
/// throughput on the whole GPU is the QoS stage and the other best-effort. The QoS stages'
/// shares (10% steps, the rest of each GPU to its best-effort stage) are the combination whose
/// critical path, edges through the host, stays within the latency target with the most
/// throughput for the slowest best-effort stage: for one pair, the QoS stage's smallest share
/// that meets the target.
fn laius(
    service: &Service,
    topo: &Topology,
    links: &Links,
    budget: f64,
) -> Option<(Allocation, Vec<Instance>)> {
    let m = service.stages.len();
    let per_copy = m.div_ceil(2);
    let copies = topo.gpus.len() / per_copy;
    if copies == 0 {
        return None;
    }
    let target = budget * service.qos_ms(links);
    let slot = least_communication(service, topo, links, per_copy, copies);
    let pairs: Vec<(usize, Option<usize>)> = (0..per_copy)
        .map(|j| {
            let mut on: Vec<usize> = (0..m).filter(|&s| slot[s] == j).collect();
            on.sort_by(|&a, &b| {
                service.stages[b]
                    .throughput(1.0)
                    .total_cmp(&service.stages[a].throughput(1.0))
                    .then(a.cmp(&b))
            });
            (on[0], on.get(1).copied())
        })
        .collect();
    let place = |shares: &[f64]| -> Vec<Instance> {
        let mut out = Vec::new();
        for c in 0..copies {
            for (s, &share) in shares.iter().enumerate() {
                out.push(Instance {
                    stage: s,
                    gpu: c * per_copy + slot[s],
                    share,
                });
            }
        }
        out
    };
    let mut best: Option<(f64, Vec<f64>)> = None;
    let combos = 9usize.pow(pairs.iter().filter(|p| p.1.is_some()).count() as u32);
    for code in 0..combos {
        let mut shares = vec![1.0; m];
        let mut rest = code;
        for &(qos, be) in &pairs {
            if let Some(be) = be {
                let p = (rest % 9 + 1) as f64 * 0.1;
                rest /= 9;
                shares[qos] = p;
                shares[be] = 1.0 - p;
            }
        }
        let alloc: Allocation = shares.iter().map(|&p| (copies as u32, p)).collect();
        // The latency of the slowest copy (a query stays within the copy it enters; copies
        // may span nodes differently).
        let all = place(&shares);
        let cp = all
            .chunks(m)
            .map(|one| critical_path(service, topo, links, &alloc, one, Some(false)))
            .fold(0.0, f64::max);
        if cp > target {
            continue;
        }
        let be_throughput = pairs
            .iter()
            .filter_map(|&(_, be)| be)
            .map(|be| service.stages[be].throughput(shares[be]))
            .fold(f64::INFINITY, f64::min);
        if best.as_ref().is_none_or(|b| be_throughput > b.0 + 1e-9) {
            best = Some((be_throughput, shares));
        }
    }
    let (_, shares) = best?;
    let alloc = shares.iter().map(|&p| (copies as u32, p)).collect();
    Some((alloc, place(&shares)))
}

/// Laius' segmentation of `service` over `copies` copies of `per_copy` consecutive GPUs each
/// (copy `c` on GPUs `c * per_copy..`): for each stage the index of its GPU within a copy, at
/// most two stages per GPU, chosen among every pairing of the stages and every order of the
/// pairs on the GPUs as the one whose edges cost the least to move, summed over the copies,
/// without Astraea's channels (through the host or over NVLink when every policy has it, and
/// the network between nodes). Ties keep the first found, which for a pipeline is the stages
/// paired in order.
pub fn least_communication(
    service: &Service,
    topo: &Topology,
    links: &Links,
    per_copy: usize,
    copies: usize,
) -> Vec<usize> {
    let m = service.stages.len();
    let apart = |a: usize, b: usize| {
        if a == b {
            Apart::SameGpu
        } else if topo.gpus[a].node == topo.gpus[b].node {
            Apart::SameNode
        } else {
            Apart::Nodes
        }
    };
    let cost = |slot: &[usize]| -> f64 {
        (0..copies.max(1))
            .map(|c| {
                let gpu = |s: usize| c * per_copy + slot[s];
                service
                    .edges
                    .iter()
                    .map(|e| links.transfer_ms(e.mb, apart(gpu(e.from), gpu(e.to)), false))
                    .sum::<f64>()
            })
            .sum()
    };
    // Every assignment of stages to GPU slots with at most two stages per slot and every slot
    // used, in the order that visits the stages paired in order first.
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut slot = vec![0usize; m];
    let mut load = vec![0usize; per_copy];
    fn visit(
        s: usize,
        slot: &mut Vec<usize>,
        load: &mut Vec<usize>,
        consider: &mut dyn FnMut(&[usize]),
    ) {
        if s == slot.len() {
            if load.iter().all(|&l| l > 0) {
                consider(slot);
            }
            return;
        }
        // Stage s in pipeline order goes to slot s / 2 first.
        let n = load.len();
        for k in 0..n {
            let g = (s / 2 + k) % n;
            if load[g] < 2 {
                load[g] += 1;
                slot[s] = g;
                visit(s + 1, slot, load, consider);
                load[g] -= 1;
            }
        }
    }
    visit(0, &mut slot, &mut load, &mut |slot: &[usize]| {
        let c = cost(slot);
        if best.as_ref().is_none_or(|b| c < b.0 - 1e-9) {
            best = Some((c, slot.to_vec()));
        }
    });
    best.map_or_else(|| (0..m).map(|s| s / 2).collect(), |b| b.1)
}

/// A policy's best plan over [`BUDGETS`] by the peak load its deployment sustains, with that
/// peak (queries per second) and the p99 there.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuned {
    /// The plan.
    pub plan: Planned,
    /// Its peak load, queries per second.
    pub peak: f64,
    /// The p99 at the peak, ms.
    pub p99_ms: f64,
}

/// `policy` tuned over [`BUDGETS`] (see the module doc).
pub fn tuned(
    policy: Policy,
    service: &Service,
    topo: &Topology,
    links: &Links,
    seed: u64,
) -> Option<Tuned> {
    let qos = service.qos_ms(links);
    let mut best: Option<Tuned> = None;
    for budget in BUDGETS {
        let Some(p) = plan(policy, service, topo, links, budget, seed) else {
            continue;
        };
        let (peak, p99) = peak_of(service, topo, links, policy, &p.instances, qos, seed);
        if best.as_ref().is_none_or(|b| peak > b.peak) {
            best = Some(Tuned {
                plan: p,
                peak,
                p99_ms: p99,
            });
        }
    }
    best
}

/// The peak load of `instances` served with `policy`'s channels.
pub fn peak_of(
    service: &Service,
    topo: &Topology,
    links: &Links,
    policy: Policy,
    instances: &[Instance],
    qos_ms: f64,
    seed: u64,
) -> (f64, f64) {
    Deployment {
        service,
        topo,
        instances,
        links,
        astraea_channels: policy.astraea_channels(),
    }
    .peak_load(qos_ms, seed)
}
