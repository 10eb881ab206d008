//! Astraea's contention-aware allocation (§6.1): the fewest GPUs a load needs (Eq. 1), and the
//! instances and SM share of every stage that maximize the bottleneck stage's throughput under
//! Eq. 2's five constraints, searched epsilon-greedily (the paper's solver, §6.1).
//!
//! **Eq. 2**, for `n` GPUs: maximize `min_i N_i · f(p_i)` subject to (1) `Σ N_i p_i ≤ n` (SMs),
//! (2) `Σ N_i ≤ 48 n` (MPS clients), (3) `Σ N_i b(p_i) ≤ n · BW` (memory bandwidth), (4)
//! `Σ N_i M_i ≤ n · F` (memory), (5) the critical path of the stage latencies and the
//! transfers (`CP(g, Trans)`) within the latency target. Constraints 1–4 are also checked per
//! GPU, by placing the instances ([`place`]): an allocation that cannot be placed is not
//! feasible. The latency target is `budget × QoS`; the queueing a load adds on top of `CP`
//! is what the budget leaves room for (see [`super::compare`]).
//!
//! **Search.** From one instance per stage at the smallest share that meets the latency
//! target, and then from random feasible states, each step moves to the best unvisited
//! neighbour (one stage's `N` by at most one and its share to any step) by (bottleneck
//! throughput, then fewer SMs) while that improves, or with probability `epsilon` to a random
//! neighbour; the best state seen is the answer. The paper gives neither epsilon nor its budget
//! beyond "10 ms"; ours are [`Search::default`]'s.

use std::collections::HashSet;

use fastrand::Rng;

use super::place::{Allocation, Instance, Topology, place};
use super::service::{Apart, Device, Links, Service};

/// Eq. 1: the fewest GPUs of `device` that hold `load` queries per second of `service` by
/// compute (`Σ C(i, s) / G`) and by memory (one instance of every stage, `Σ M(i, s) / F`).
pub fn min_gpus(service: &Service, device: &Device, load: f64) -> usize {
    let flops: f64 = service.stages.iter().map(|s| s.gflop * load).sum();
    let mem: f64 = service.stages.iter().map(|s| s.mem_gb).sum();
    ((flops / device.gflops).max(mem / device.mem_gb).ceil() as usize).max(1)
}

/// `min_i N_i f(p_i)`: the bottleneck stage's throughput, queries per second, without contention.
pub fn objective(service: &Service, alloc: &Allocation) -> f64 {
    alloc
        .iter()
        .zip(&service.stages)
        .map(|(&(n, p), s)| f64::from(n) * s.throughput(p))
        .fold(f64::INFINITY, f64::min)
}

/// The search's knobs and which constraints it keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Search {
    /// SM share step (the paper: 10%).
    pub granularity: f64,
    /// Probability of a random move.
    pub epsilon: f64,
    /// Moves per start.
    pub iterations: usize,
    /// Starts: the first from one instance per stage, the others drawn at random.
    pub restarts: usize,
    /// The random moves' seed.
    pub seed: u64,
    /// Constraint 3 (memory bandwidth): off for Astraea-NC and FIRM.
    pub bandwidth: bool,
    /// Whether the transfers count in the critical path, and over which channels: Astraea's
    /// (`Some(true)`), through the host (`Some(false)`), not at all (`None`).
    pub transfers: Option<bool>,
    /// The latency target as a fraction of the QoS target.
    pub budget: f64,
}

impl Default for Search {
    fn default() -> Search {
        Search {
            granularity: 0.1,
            epsilon: 0.1,
            iterations: 200,
            restarts: 8,
            seed: 7,
            bandwidth: true,
            transfers: Some(true),
            budget: 1.0,
        }
    }
}

/// A feasible allocation and where it is placed.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocated {
    /// `(N_i, p_i)` per stage.
    pub alloc: Allocation,
    /// The instances, placed.
    pub instances: Vec<Instance>,
    /// `min_i N_i f(p_i)`.
    pub objective: f64,
    /// The critical path, ms.
    pub critical_path_ms: f64,
}

/// The critical path of `alloc` placed as `instances`: every stage's latency on its share, and
/// every edge's worst transfer between the instances placed (through Astraea's channels or the
/// host; 0 if `transfers` is `None`).
pub fn critical_path(
    service: &Service,
    topo: &Topology,
    links: &Links,
    alloc: &Allocation,
    instances: &[Instance],
    transfers: Option<bool>,
) -> f64 {
    let nodes: Vec<f64> = alloc
        .iter()
        .zip(&service.stages)
        .map(|(&(_, p), s)| s.latency_ms(p))
        .collect();
    let edges: Vec<f64> = service
        .edges
        .iter()
        .map(|e| {
            let Some(astraea) = transfers else {
                return 0.0;
            };
            let mut worst: f64 = 0.0;
            for a in instances.iter().filter(|i| i.stage == e.from) {
                for b in instances.iter().filter(|i| i.stage == e.to) {
                    let apart = if a.gpu == b.gpu {
                        Apart::SameGpu
                    } else if topo.gpus[a.gpu].node == topo.gpus[b.gpu].node {
                        Apart::SameNode
                    } else {
                        Apart::Nodes
                    };
                    worst = worst.max(links.transfer_ms(e.mb, apart, astraea));
                }
            }
            worst
        })
        .collect();
    service.critical_path(&nodes, &edges)
}

/// Whether `alloc` meets Eq. 2's constraints on `topo` (see the module doc), and if so placed.
pub fn feasible(
    service: &Service,
    topo: &Topology,
    links: &Links,
    alloc: &Allocation,
    search: &Search,
) -> Option<Allocated> {
    let n = topo.gpus.len() as f64;
    let dev = topo.gpus.first()?.device;
    let sm: f64 = alloc.iter().map(|&(k, p)| f64::from(k) * p).sum();
    let clients: u32 = alloc.iter().map(|&(k, _)| k).sum();
    let bw: f64 = alloc
        .iter()
        .zip(&service.stages)
        .map(|(&(k, p), s)| f64::from(k) * s.bandwidth(p))
        .sum();
    let mem: f64 = alloc
        .iter()
        .zip(&service.stages)
        .map(|(&(k, _), s)| f64::from(k) * s.mem_gb)
        .sum();
    if sm > n + 1e-9
        || f64::from(clients) > n * f64::from(dev.mps_clients)
        || (search.bandwidth && bw > n * dev.bw_gbs + 1e-9)
        || mem > n * dev.mem_gb + 1e-9
    {
        return None;
    }
    let qos = service.qos_ms(links) * search.budget;
    if critical_path(service, topo, links, alloc, &[], None) > qos {
        return None;
    }
    let instances = place(service, alloc, topo, search.bandwidth, search.seed)?;
    let cp = critical_path(service, topo, links, alloc, &instances, search.transfers);
    (cp <= qos).then(|| Allocated {
        objective: objective(service, alloc),
        alloc: alloc.clone(),
        instances,
        critical_path_ms: cp,
    })
}

type State = Vec<(u32, u32)>;

fn to_alloc(state: &State, granularity: f64) -> Allocation {
    state
        .iter()
        .map(|&(n, k)| (n, f64::from(k) * granularity))
        .collect()
}

fn sm_of(x: &Allocated) -> f64 {
    x.alloc.iter().map(|&(n, p)| f64::from(n) * p).sum()
}

/// Whether `a` beats `b`: higher bottleneck throughput, then fewer SMs.
fn better(a: &Allocated, b: &Allocated) -> bool {
    a.objective > b.objective + 1e-9
        || ((a.objective - b.objective).abs() <= 1e-9 && sm_of(a) < sm_of(b) - 1e-9)
}

/// Eq. 2 solved epsilon-greedily (see the module doc); `None` if no allocation meets the
/// latency target.
pub fn allocate(
    service: &Service,
    topo: &Topology,
    links: &Links,
    search: &Search,
) -> Option<Allocated> {
    let steps = (1.0 / search.granularity).round() as u32;
    let stages = service.stages.len();
    let n = topo.gpus.len() as u32;
    let max_n = n * topo.gpus.first()?.device.mps_clients;
    let check = |state: &State| {
        feasible(
            service,
            topo,
            links,
            &to_alloc(state, search.granularity),
            search,
        )
    };
    // The first start: one instance each, shares raised on the slowest stage until the
    // target is met.
    let mut first: State = vec![(1, 1); stages];
    let first_ok = loop {
        if let Some(a) = check(&first) {
            break a;
        }
        let slowest = (0..stages)
            .filter(|&i| first[i].1 < steps)
            .max_by(|&a, &b| {
                let g = |i: usize| {
                    service.stages[i].latency_ms(f64::from(first[i].1) * search.granularity)
                };
                g(a).total_cmp(&g(b))
            })?;
        first[slowest].1 += 1;
    };
    let mut rng = Rng::with_seed(search.seed);
    let mut best = first_ok.clone();
    let mut seen: HashSet<State> = HashSet::new();
    for restart in 0..search.restarts {
        // Later starts: random states that meet the constraints (a few draws each).
        let (mut state, mut current) = if restart == 0 {
            (first.clone(), first_ok.clone())
        } else {
            let mut drawn = None;
            for _ in 0..64 {
                let s: State = (0..stages)
                    .map(|_| {
                        let k = rng.u32(1..=steps);
                        let most = ((f64::from(n) * f64::from(steps) / f64::from(k)) as u32)
                            .clamp(1, max_n);
                        (rng.u32(1..=most), k)
                    })
                    .collect();
                if let Some(a) = check(&s) {
                    drawn = Some((s, a));
                    break;
                }
            }
            let Some(d) = drawn else { continue };
            d
        };
        seen.insert(state.clone());
        for _ in 0..search.iterations {
            let mut moves: Vec<(State, Allocated)> = Vec::new();
            for i in 0..stages {
                let (cn, ck) = state[i];
                for nn in [cn.saturating_sub(1), cn, cn + 1] {
                    if nn < 1 || nn > max_n {
                        continue;
                    }
                    for nk in 1..=steps {
                        if (nn, nk) == (cn, ck) {
                            continue;
                        }
                        let mut next = state.clone();
                        next[i] = (nn, nk);
                        if seen.contains(&next) {
                            continue;
                        }
                        if let Some(a) = check(&next) {
                            moves.push((next, a));
                        }
                    }
                }
            }
            if moves.is_empty() {
                break;
            }
            let pick = if rng.f64() < search.epsilon {
                rng.usize(..moves.len())
            } else {
                let mut b = 0;
                for (j, m) in moves.iter().enumerate() {
                    if better(&m.1, &moves[b].1) {
                        b = j;
                    }
                }
                if !better(&moves[b].1, &current) {
                    // A local optimum: this start is done.
                    break;
                }
                b
            };
            let (next, a) = moves.swap_remove(pick);
            seen.insert(next.clone());
            state = next;
            current = a;
            if better(&current, &best) {
                best = current.clone();
            }
        }
    }
    Some(best)
}
