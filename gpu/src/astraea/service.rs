//! Astraea's inputs: a multi-stage GPU service (its stages, the bytes each edge carries, its
//! QoS), the GPUs it runs on, and how fast data moves between two instances.
//!
//! **Performance model (assumed).** The paper predicts a stage's latency `g(p, s)`, bandwidth
//! `b(p, s)` and throughput `f(p, s)` with a GBDT trained on solo runs (§5); we give each stage
//! a closed form instead, the prediction the GBDT would converge to on a simulated GPU: one
//! query alone on a share `p` of the SMs takes `solo_ms · (serial + (1 − serial) / p)` (the
//! serial part does not speed up with SMs), draws memory bandwidth in proportion to its speed
//! (`bw_gbs` at `p = 1`), and holds `mem_gb` of memory per instance. Every number of the
//! services below is ours, chosen so that copying each edge through the host is 26–47% of the
//! solo latency, the share the paper measured (§3.2, Fig. 2); the stage names are Table 1's.

/// One stage (microservice) of a service.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Its name (Table 1's where it is one of the paper's services).
    pub name: &'static str,
    /// Latency of one query alone on the whole GPU, ms.
    pub solo_ms: f64,
    /// Fraction of `solo_ms` that does not speed up with more SMs.
    pub serial: f64,
    /// Memory bandwidth one instance draws running at `p = 1`, GB/s.
    pub bw_gbs: f64,
    /// Global memory one instance holds, GB.
    pub mem_gb: f64,
    /// Floating-point work per query, GFLOP (Eq. 1's `C(i, s)`).
    pub gflop: f64,
}

impl Stage {
    /// `g(p)`: latency of one query on an SM share `p` (0 < p ≤ 1), ms, without contention.
    pub fn latency_ms(&self, p: f64) -> f64 {
        let p = p.clamp(1e-6, 1.0);
        self.solo_ms * (self.serial + (1.0 - self.serial) / p)
    }

    /// `f(p)`: queries per second one instance serves on a share `p`.
    pub fn throughput(&self, p: f64) -> f64 {
        1000.0 / self.latency_ms(p)
    }

    /// `b(p)`: memory bandwidth one instance draws on a share `p`, GB/s.
    pub fn bandwidth(&self, p: f64) -> f64 {
        self.bw_gbs * self.solo_ms / self.latency_ms(p)
    }
}

/// An edge of a service's graph: `from`'s output goes to `to`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// The sending stage.
    pub from: usize,
    /// The receiving stage.
    pub to: usize,
    /// Data per query, MB.
    pub mb: f64,
}

/// A multi-stage GPU service: stages, edges (a DAG), and its QoS.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// Its name.
    pub name: &'static str,
    /// Its stages.
    pub stages: Vec<Stage>,
    /// Its edges; stages are numbered in a topological order (every edge goes forward).
    pub edges: Vec<Edge>,
}

impl Service {
    /// The stages feeding `stage`, with the edge's data.
    pub fn inputs(&self, stage: usize) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.to == stage)
    }

    /// Data exchanged between stages `a` and `b` per query, MB (0 if not adjacent).
    pub fn traffic(&self, a: usize, b: usize) -> f64 {
        self.edges
            .iter()
            .filter(|e| (e.from, e.to) == (a, b) || (e.from, e.to) == (b, a))
            .map(|e| e.mb)
            .sum()
    }

    /// The longest path through the graph with `node_ms[i]` on stage `i` and `edge_ms[k]` on
    /// edge `k` (the paper's weighted longest path for the critical path, §6.1).
    pub fn critical_path(&self, node_ms: &[f64], edge_ms: &[f64]) -> f64 {
        let mut done = vec![0.0f64; self.stages.len()];
        for i in 0..self.stages.len() {
            let ready = self
                .edges
                .iter()
                .enumerate()
                .filter(|(_, e)| e.to == i)
                .map(|(k, e)| done[e.from] + edge_ms[k])
                .fold(0.0, f64::max);
            done[i] = ready + node_ms[i];
        }
        done.into_iter().fold(0.0, f64::max)
    }

    /// The solo-run latency: every stage alone on the whole GPU, every edge copied through the
    /// host on one GPU (how the paper's services run without Astraea's channels, §3.2).
    pub fn solo_ms(&self, links: &Links) -> f64 {
        let nodes: Vec<f64> = self.stages.iter().map(|s| s.latency_ms(1.0)).collect();
        let edges: Vec<f64> = self
            .edges
            .iter()
            .map(|e| links.host_copy_ms(e.mb))
            .collect();
        self.critical_path(&nodes, &edges)
    }

    /// The QoS target: the p99 latency at most 1.5× the solo run (§8.2).
    pub fn qos_ms(&self, links: &Links) -> f64 {
        1.5 * self.solo_ms(links)
    }
}

/// A GPU's capacities (the constants of Table 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Device {
    /// Its name.
    pub name: &'static str,
    /// Global memory bandwidth `BW`, GB/s.
    pub bw_gbs: f64,
    /// Global memory `F`, GB.
    pub mem_gb: f64,
    /// Compute `G`, GFLOPS.
    pub gflops: f64,
    /// MPS clients per device `I` (Volta MPS: 48).
    pub mps_clients: u32,
}

/// At most 48 MPS clients per device (Volta MPS, Astraea §6.1).
pub const MPS_CLIENTS: u32 = 48;

impl Device {
    /// An A100-40GB, the cluster's simulated GPU: 1555 GB/s, 40 GB, 19.5 TFLOPS FP32 (NVIDIA's
    /// data sheet; assumed, the paper ran on the 2080Ti and V100 below).
    pub const A100_40GB: Device = Device {
        name: "A100-40GB",
        bw_gbs: 1555.0,
        mem_gb: 40.0,
        gflops: 19_500.0,
        mps_clients: MPS_CLIENTS,
    };

    /// The paper's RTX 2080Ti: 616 GB/s (§8.1), 11 GB, 13.4 TFLOPS (NVIDIA's data sheet).
    pub const RTX_2080TI: Device = Device {
        name: "RTX 2080Ti",
        bw_gbs: 616.0,
        mem_gb: 11.0,
        gflops: 13_400.0,
        mps_clients: MPS_CLIENTS,
    };

    /// The device of a GPU whose memory is `memory_mib` as its worker reports it: the A100's
    /// figures with its memory.
    pub fn a100_with_memory(memory_mib: u64) -> Device {
        Device {
            mem_gb: memory_mib as f64 / 1024.0,
            ..Device::A100_40GB
        }
    }
}

/// How fast data moves between two instances (assumed: the paper's ranges, §7).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Links {
    /// PCIe, GB/s (the paper: 8–12).
    pub pcie_gbs: f64,
    /// NVLink between the GPUs of a node, GB/s (the paper: 20–25); `None` without NVLink.
    pub nvlink_gbs: Option<f64>,
    /// Whether every policy's edges between two GPUs of a node take NVLink (`true`), or only
    /// Astraea's channels do (`false`: the paper's §8.5, Fig. 17, where the baselines copy
    /// through the host because they do not manage their deployment across GPUs).
    pub nvlink_for_every_policy: bool,
    /// Between nodes (gRPC over TCP), GB/s: 9.8, so that moving img-to-img's 40 MB edge to
    /// another node adds 17% to its solo latency, as moving it did in the paper (§3.2; derived).
    pub network_gbs: f64,
    /// Passing a CUDA IPC handle on one GPU, ms (ours: the paper gives only the 0.02 MB
    /// crossover below which a copy is faster).
    pub ipc_ms: f64,
}

impl Default for Links {
    fn default() -> Links {
        Links {
            pcie_gbs: 10.0,
            nvlink_gbs: Some(22.0),
            nvlink_for_every_policy: false,
            network_gbs: 9.8,
            ipc_ms: 0.05,
        }
    }
}

/// Where two communicating instances are, relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apart {
    /// On the same GPU.
    SameGpu,
    /// On two GPUs of one node.
    SameNode,
    /// On two nodes.
    Nodes,
}

impl Links {
    /// No NVLink: every edge between GPUs goes through the host (the paper's §8.2 server of two
    /// RTX 2080 Ti).
    pub fn without_nvlink() -> Links {
        Links {
            nvlink_gbs: None,
            ..Links::default()
        }
    }

    /// NVLink between a node's GPUs, taken by every policy's edges between them.
    pub fn nvlink_for_all() -> Links {
        Links {
            nvlink_for_every_policy: true,
            ..Links::default()
        }
    }

    /// Device to host and back over PCIe, ms.
    pub fn host_copy_ms(&self, mb: f64) -> f64 {
        2.0 * mb / self.pcie_gbs
    }

    /// Moving `mb` between instances `apart`, with Astraea's channels (`astraea`: global-memory
    /// IPC on one GPU above 0.02 MB, NVLink between GPUs) or without (through the host, or
    /// NVLink between GPUs when [`Links::nvlink_for_every_policy`]).
    pub fn transfer_ms(&self, mb: f64, apart: Apart, astraea: bool) -> f64 {
        match apart {
            Apart::SameGpu if astraea && mb > 0.02 => self.ipc_ms,
            Apart::SameGpu => self.host_copy_ms(mb),
            Apart::SameNode => match self.nvlink_gbs {
                Some(nv) if astraea || self.nvlink_for_every_policy => mb / nv,
                _ => self.host_copy_ms(mb),
            },
            Apart::Nodes => self.host_copy_ms(mb) + mb / self.network_gbs,
        }
    }
}

fn stage(
    name: &'static str,
    solo_ms: f64,
    serial: f64,
    bw_gbs: f64,
    mem_gb: f64,
    gflop: f64,
) -> Stage {
    Stage {
        name,
        solo_ms,
        serial,
        bw_gbs,
        mem_gb,
        gflop,
    }
}

fn two_stage(name: &'static str, a: Stage, b: Stage, mb: f64) -> Service {
    Service {
        name,
        stages: vec![a, b],
        edges: vec![Edge { from: 0, to: 1, mb }],
    }
}

/// The paper's seven two-stage services (Table 1), with our stage models (see the module doc).
pub fn table1() -> Vec<Service> {
    vec![
        two_stage(
            "img-to-img",
            stage("face recognition", 12.0, 0.2, 300.0, 1.5, 20.0),
            stage("image enhancement", 4.0, 0.3, 500.0, 0.8, 6.0),
            40.0,
        ),
        two_stage(
            "img-to-text",
            stage("image feature extraction", 8.0, 0.15, 350.0, 2.0, 30.0),
            stage("image caption", 10.0, 0.5, 150.0, 1.0, 4.0),
            35.0,
        ),
        two_stage(
            "text-to-img",
            stage("semantic understanding", 5.0, 0.5, 120.0, 0.8, 2.0),
            stage("image generation", 14.0, 0.2, 400.0, 1.5, 25.0),
            35.0,
        ),
        two_stage(
            "text-to-text",
            stage("text summarization", 15.0, 0.25, 450.0, 2.5, 40.0),
            stage("text translation", 12.0, 0.45, 250.0, 1.8, 10.0),
            50.0,
        ),
        two_stage(
            "text-to-speech",
            stage("text-to-wave", 10.0, 0.35, 200.0, 1.2, 8.0),
            stage("waveform synthesis", 20.0, 0.3, 300.0, 1.5, 30.0),
            80.0,
        ),
        two_stage(
            "speech-to-text",
            stage("ASR", 9.0, 0.5, 150.0, 1.0, 5.0),
            stage("machine translation", 7.0, 0.5, 130.0, 1.0, 4.0),
            45.0,
        ),
        two_stage(
            "cloud gaming",
            stage("rendering", 6.0, 0.2, 600.0, 2.0, 15.0),
            stage("encoding", 3.0, 0.4, 250.0, 0.6, 3.0),
            35.0,
        ),
    ]
}

/// A six-stage pipeline for the multi-node run (ours; the paper's is a 21-microservice
/// application of Rodinia tasks, §8.6, whose graph is not in the text): two heavy edges and a
/// light one in the middle, so a two-node split has one right answer.
pub fn six_stage() -> Service {
    let stages = vec![
        stage("decode", 4.0, 0.3, 300.0, 1.0, 5.0),
        stage("detect", 12.0, 0.2, 400.0, 2.5, 30.0),
        stage("crop", 3.0, 0.4, 200.0, 0.6, 2.0),
        stage("embed", 10.0, 0.25, 350.0, 2.0, 25.0),
        stage("rank", 6.0, 0.4, 250.0, 1.2, 8.0),
        stage("render", 5.0, 0.3, 400.0, 1.0, 6.0),
    ];
    let mbs = [30.0, 25.0, 0.5, 30.0, 20.0];
    Service {
        name: "six-stage pipeline",
        stages,
        edges: mbs
            .iter()
            .enumerate()
            .map(|(i, &mb)| Edge {
                from: i,
                to: i + 1,
                mb,
            })
            .collect(),
    }
}
