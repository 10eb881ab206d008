//! Astraea's communication-aware placement (§6.2): stages to nodes by Algorithm 1
//! (Balanced-Kmeans++ on the min-cut of the stage graph, on as few nodes as hold the
//! allocation), then instances to the GPUs of each node: next to a heavily communicating
//! adjacent stage, next to instances of the same stage, and otherwise on the GPU with the
//! fewest free resources (global memory first), so the pool does not fragment. FIRM's random
//! placement is here too, for its baseline.

use fastrand::Rng;

use super::service::{Device, Service};

/// One GPU of the topology.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Its node, an index into the topology's nodes.
    pub node: usize,
    /// Its capacities.
    pub device: Device,
}

/// The GPUs Astraea may use, by node.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Every GPU, grouped by node (a node's GPUs are contiguous).
    pub gpus: Vec<Gpu>,
}

impl Topology {
    /// `nodes` nodes of `per_node` GPUs of `device`.
    pub fn uniform(nodes: usize, per_node: usize, device: Device) -> Topology {
        Topology {
            gpus: (0..nodes * per_node)
                .map(|g| Gpu {
                    node: g / per_node,
                    device,
                })
                .collect(),
        }
    }

    /// How many nodes.
    pub fn nodes(&self) -> usize {
        self.gpus.iter().map(|g| g.node + 1).max().unwrap_or(0)
    }

    /// The GPUs of node `node`, by index.
    pub fn gpus_of(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.gpus.len()).filter(move |&g| self.gpus[g].node == node)
    }
}

/// One instance (an MPS client): its stage, its GPU and its SM share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instance {
    /// Its stage.
    pub stage: usize,
    /// Its GPU, an index into the topology's GPUs.
    pub gpu: usize,
    /// Its share of the GPU's SMs, in (0, 1].
    pub share: f64,
}

/// An allocation: for every stage, its instances' count and SM share (Eq. 2's `N_i`, `p_i`).
pub type Allocation = Vec<(u32, f64)>;

/// What is used of each GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// SM share.
    pub sm: f64,
    /// MPS clients.
    pub clients: u32,
    /// Memory, GB.
    pub mem: f64,
    /// Bandwidth at full speed, GB/s.
    pub bw: f64,
}

const EPS: f64 = 1e-9;

impl Usage {
    fn fits(&self, device: &Device, share: f64, mem: f64, bw: Option<f64>) -> bool {
        self.sm + share <= 1.0 + EPS
            && self.clients < device.mps_clients
            && self.mem + mem <= device.mem_gb + EPS
            && bw.is_none_or(|b| self.bw + b <= device.bw_gbs + EPS)
    }

    fn add(&mut self, share: f64, mem: f64, bw: f64) {
        self.sm += share;
        self.clients += 1;
        self.mem += mem;
        self.bw += bw;
    }
}

/// What each GPU of `topo` holds under `instances`.
pub fn usage(service: &Service, topo: &Topology, instances: &[Instance]) -> Vec<Usage> {
    let mut out = vec![Usage::default(); topo.gpus.len()];
    for i in instances {
        let s = &service.stages[i.stage];
        out[i.gpu].add(i.share, s.mem_gb, s.bandwidth(i.share));
    }
    out
}

/// Edges heavier than this (MB per query) pull the adjacent stage onto the same GPU ("if the
/// data transmitted between two adjacent stages is particularly large", §6.2.2; the threshold
/// is ours).
pub const HEAVY_MB: f64 = 1.0;

/// Algorithm 1: the stages clustered onto `capacity.len()` nodes, each with `capacity[j]` of
/// compute (SM shares), stage `i` needing `compute[i]`. The distance between stages is
/// `1 / Com_ij` (infinite without an edge); the seeds are stages far apart (the first the
/// most demanding, each next the farthest by shortest path from those chosen); the rest, in a
/// random order, join the cluster at the least Eq. 3 distance that still has room. Returns
/// each stage's cluster, or `None` if a stage fits no cluster.
pub fn cluster_stages(
    service: &Service,
    compute: &[f64],
    capacity: &[f64],
    rng: &mut Rng,
) -> Option<Vec<usize>> {
    let n = service.stages.len();
    let k = capacity.len().min(n);
    if k == 0 {
        return None;
    }
    let x = |a: usize, b: usize| {
        let c = service.traffic(a, b);
        if c > 0.0 { 1.0 / c } else { f64::INFINITY }
    };
    // Shortest paths over the 1/Com lengths (Floyd–Warshall; services are small).
    let mut d = vec![vec![f64::INFINITY; n]; n];
    for (a, row) in d.iter_mut().enumerate() {
        for (b, v) in row.iter_mut().enumerate() {
            *v = if a == b { 0.0 } else { x(a, b) };
        }
    }
    for m in 0..n {
        for a in 0..n {
            for b in 0..n {
                let via = d[a][m] + d[m][b];
                if via < d[a][b] {
                    d[a][b] = via;
                }
            }
        }
    }
    let mut seeds = vec![
        (0..n)
            .max_by(|&a, &b| compute[a].total_cmp(&compute[b]).then(b.cmp(&a)))
            .expect("stages"),
    ];
    while seeds.len() < k {
        let far = (0..n)
            .filter(|i| !seeds.contains(i))
            .max_by(|&a, &b| {
                let da = seeds.iter().map(|&s| d[s][a]).fold(f64::INFINITY, f64::min);
                let db = seeds.iter().map(|&s| d[s][b]).fold(f64::INFINITY, f64::min);
                da.total_cmp(&db).then(b.cmp(&a))
            })
            .expect("more stages than seeds");
        seeds.push(far);
    }
    let mut of = vec![usize::MAX; n];
    let mut room = capacity.to_vec();
    for (j, &s) in seeds.iter().enumerate() {
        if compute[s] > room[j] + EPS {
            return None;
        }
        of[s] = j;
        room[j] -= compute[s];
    }
    let mut rest: Vec<usize> = (0..n).filter(|i| !seeds.contains(i)).collect();
    rng.shuffle(&mut rest);
    for i in rest {
        let dist = |j: usize| {
            let finite: Vec<f64> = (0..n)
                .filter(|&m| of[m] == j)
                .map(|m| x(i, m))
                .filter(|v| v.is_finite())
                .collect();
            if finite.is_empty() {
                f64::INFINITY
            } else {
                finite.iter().sum()
            }
        };
        let j = (0..k)
            .filter(|&j| room[j] + EPS >= compute[i])
            .min_by(|&a, &b| {
                dist(a)
                    .total_cmp(&dist(b))
                    .then(room[b].total_cmp(&room[a]))
            })?;
        of[i] = j;
        room[j] -= compute[i];
    }
    Some(of)
}

/// Astraea's placement of `alloc` on `topo` (see the module doc); `bandwidth`: whether a
/// GPU's memory bandwidth is accounted (constraint 3; off for the NC ablation). `None` if it
/// does not fit. Stages go to as few nodes as hold them.
pub fn place(
    service: &Service,
    alloc: &Allocation,
    topo: &Topology,
    bandwidth: bool,
    seed: u64,
) -> Option<Vec<Instance>> {
    let compute: Vec<f64> = alloc.iter().map(|&(n, p)| f64::from(n) * p).collect();
    let nodes = topo.nodes();
    for k in 1..=nodes {
        let capacity: Vec<f64> = (0..k).map(|j| topo.gpus_of(j).count() as f64).collect();
        if capacity.iter().sum::<f64>() + EPS < compute.iter().sum::<f64>() {
            continue;
        }
        let mut rng = Rng::with_seed(seed);
        let Some(of) = cluster_stages(service, &compute, &capacity, &mut rng) else {
            continue;
        };
        if let Some(out) = place_on_nodes(service, alloc, topo, &of, bandwidth) {
            return Some(out);
        }
    }
    None
}

/// Instances onto the GPUs of the node each stage was clustered to (§6.2.2).
fn place_on_nodes(
    service: &Service,
    alloc: &Allocation,
    topo: &Topology,
    node_of: &[usize],
    bandwidth: bool,
) -> Option<Vec<Instance>> {
    let mut used = vec![Usage::default(); topo.gpus.len()];
    let mut out: Vec<Instance> = Vec::new();
    for (stage, &(count, share)) in alloc.iter().enumerate() {
        let s = &service.stages[stage];
        let bw = s.bandwidth(share);
        for _ in 0..count {
            let best = topo
                .gpus_of(node_of[stage])
                .filter(|&g| {
                    used[g].fits(
                        &topo.gpus[g].device,
                        share,
                        s.mem_gb,
                        bandwidth.then_some(bw),
                    )
                })
                .max_by(|&a, &b| {
                    let heavy = |g: usize| {
                        out.iter()
                            .filter(|i| i.gpu == g)
                            .map(|i| service.traffic(i.stage, stage))
                            .filter(|&mb| mb >= HEAVY_MB)
                            .fold(0.0, f64::max)
                    };
                    let same = |g: usize| out.iter().any(|i| i.gpu == g && i.stage == stage);
                    let free_mem = |g: usize| topo.gpus[g].device.mem_gb - used[g].mem;
                    let free_sm = |g: usize| 1.0 - used[g].sm;
                    heavy(a)
                        .total_cmp(&heavy(b))
                        .then(same(a).cmp(&same(b)))
                        .then(free_mem(b).total_cmp(&free_mem(a)))
                        .then(free_sm(b).total_cmp(&free_sm(a)))
                        .then(b.cmp(&a))
                })?;
            used[best].add(share, s.mem_gb, bw);
            out.push(Instance {
                stage,
                gpu: best,
                share,
            });
        }
    }
    Some(out)
}

/// FIRM's placement: every instance on a GPU drawn at random among those of any node where it
/// fits (SMs, MPS clients, memory; bandwidth is not accounted), as Kubernetes' default spread
/// places FIRM's pods (§8.1, §8.6).
pub fn place_randomly(
    service: &Service,
    alloc: &Allocation,
    topo: &Topology,
    rng: &mut Rng,
) -> Option<Vec<Instance>> {
    let mut used = vec![Usage::default(); topo.gpus.len()];
    let mut out = Vec::new();
    for (stage, &(count, share)) in alloc.iter().enumerate() {
        let s = &service.stages[stage];
        for _ in 0..count {
            let fit: Vec<usize> = (0..topo.gpus.len())
                .filter(|&g| used[g].fits(&topo.gpus[g].device, share, s.mem_gb, None))
                .collect();
            if fit.is_empty() {
                return None;
            }
            let g = fit[rng.usize(..fit.len())];
            used[g].add(share, s.mem_gb, s.bandwidth(share));
            out.push(Instance {
                stage,
                gpu: g,
                share,
            });
        }
    }
    Some(out)
}
