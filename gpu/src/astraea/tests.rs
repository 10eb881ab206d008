//! Astraea's decisions on small cases whose answers can be checked by hand, its resources on a
//! cluster, and the direction of its comparison with FIRM and Laius.

use escher_proto::mig::GpuModel;
use escher_proto::types::{GpuInfo, GpuStatus, NodeGpus, NodeId};
use fastrand::Rng;

use super::alloc::{Search, allocate, feasible, min_gpus};
use super::cluster::MpsGpus;
use super::compare::{Policy, brute_force, plan, tuned};
use super::place::{Instance, Topology, cluster_stages, place, usage};
use super::service::{Device, Edge, Links, Service, Stage, table1};
use super::sim::Deployment;
use escher_esl::{InMemoryCluster, Mode};

fn st(name: &'static str, solo_ms: f64, serial: f64, bw_gbs: f64, mem_gb: f64) -> Stage {
    Stage {
        name,
        solo_ms,
        serial,
        bw_gbs,
        mem_gb,
        gflop: 10.0,
    }
}

fn chain(stages: Vec<Stage>, mbs: &[f64]) -> Service {
    Service {
        name: "test",
        edges: mbs
            .iter()
            .enumerate()
            .map(|(i, &mb)| Edge {
                from: i,
                to: i + 1,
                mb,
            })
            .collect(),
        stages,
    }
}

#[test]
fn the_stage_model_is_its_formula() {
    let s = st("s", 10.0, 0.2, 100.0, 1.0);
    // 10 × (0.2 + 0.8 / 0.5) = 18 ms; 1000 / 18 queries per second; bandwidth 100 × 10 / 18.
    assert!((s.latency_ms(0.5) - 18.0).abs() < 1e-9);
    assert!((s.throughput(0.5) - 1000.0 / 18.0).abs() < 1e-9);
    assert!((s.bandwidth(0.5) - 100.0 * 10.0 / 18.0).abs() < 1e-9);
    assert!((s.latency_ms(1.0) - 10.0).abs() < 1e-9);
}

#[test]
fn the_qos_is_one_and_a_half_solo_runs_with_host_copies() {
    let links = Links::default();
    let svc = chain(
        vec![st("a", 12.0, 0.2, 1.0, 1.0), st("b", 4.0, 0.3, 1.0, 1.0)],
        &[40.0],
    );
    // 12 + 4 + 2 × 40 MB / 10 GB/s = 24 ms; QoS 36 ms.
    assert!((svc.solo_ms(&links) - 24.0).abs() < 1e-9);
    assert!((svc.qos_ms(&links) - 36.0).abs() < 1e-9);
    // Astraea's channels: an IPC handle on one GPU, NVLink between GPUs, host and network
    // between nodes.
    use super::service::Apart;
    assert_eq!(links.transfer_ms(40.0, Apart::SameGpu, true), 0.05);
    assert_eq!(links.transfer_ms(40.0, Apart::SameGpu, false), 8.0);
    assert!((links.transfer_ms(44.0, Apart::SameNode, true) - 2.0).abs() < 1e-9);
    assert_eq!(links.transfer_ms(44.0, Apart::SameNode, false), 8.8);
    assert!((links.transfer_ms(9.8, Apart::Nodes, true) - (1.96 + 1.0)).abs() < 1e-9);
    // §3.2: moving img-to-img's edge to another node adds 17% to its latency.
    let img = &table1()[0];
    let solo = img.solo_ms(&links);
    let across = links.transfer_ms(img.edges[0].mb, Apart::Nodes, false)
        - links.transfer_ms(img.edges[0].mb, Apart::SameGpu, false);
    assert!((across / solo - 0.17).abs() < 0.005, "{}", across / solo);
    // Below the 0.02 MB crossover a copy is used even by Astraea.
    assert_eq!(links.transfer_ms(0.01, Apart::SameGpu, true), 0.002);
}

#[test]
fn every_table1_service_communicates_as_much_as_the_paper_measured() {
    // §3.2: on one node, communication is 26.4–46.9% of the latency.
    let links = Links::default();
    for svc in table1() {
        let copy: f64 = svc.edges.iter().map(|e| links.host_copy_ms(e.mb)).sum();
        let share = copy / svc.solo_ms(&links);
        assert!((0.25..=0.47).contains(&share), "{}: {share}", svc.name);
    }
}

#[test]
fn eq1_counts_gpus_by_compute_and_by_memory() {
    let dev = Device {
        name: "t",
        bw_gbs: 1000.0,
        mem_gb: 10.0,
        gflops: 1000.0,
        mps_clients: 48,
    };
    // Two stages of 10 GFLOP each at 60 queries/s: 1200 GFLOPS over 1000 → 2 GPUs.
    let svc = chain(
        vec![st("a", 1.0, 0.0, 1.0, 1.0), st("b", 1.0, 0.0, 1.0, 1.0)],
        &[1.0],
    );
    assert_eq!(min_gpus(&svc, &dev, 60.0), 2);
    assert_eq!(min_gpus(&svc, &dev, 40.0), 1);
    // 25 GB of memory over 10 GB GPUs → 3, whatever the load.
    let big = chain(
        vec![st("a", 1.0, 0.0, 1.0, 12.5), st("b", 1.0, 0.0, 1.0, 12.5)],
        &[1.0],
    );
    assert_eq!(min_gpus(&big, &dev, 1.0), 3);
}

#[test]
fn algorithm1_cuts_the_light_edge() {
    // A →100 MB→ B →1 MB→ C →100 MB→ D, one GPU of compute each, two nodes of two GPUs: the
    // seeds are A (first of the most demanding) and D (farthest from A over 1/Com: 1.02), B
    // joins A (distance 0.01 against none) and C joins D, so only the 1 MB edge crosses.
    let s = || st("s", 1.0, 0.0, 1.0, 1.0);
    let svc = chain(vec![s(), s(), s(), s()], &[100.0, 1.0, 100.0]);
    for seed in 0..8 {
        let of = cluster_stages(&svc, &[1.0; 4], &[2.0, 2.0], &mut Rng::with_seed(seed)).unwrap();
        assert_eq!(of, vec![0, 0, 1, 1], "seed {seed}");
    }
    // A node's room binds: with room for one stage each on three nodes and one on a fourth,
    // no cluster takes two.
    let of = cluster_stages(&svc, &[1.0; 4], &[1.0; 4], &mut Rng::with_seed(1)).unwrap();
    let mut sorted = of.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1, 2, 3]);
    // A stage bigger than every node fits nowhere.
    assert!(
        cluster_stages(
            &svc,
            &[3.0, 1.0, 1.0, 1.0],
            &[2.0, 2.0],
            &mut Rng::with_seed(1)
        )
        .is_none()
    );
}

#[test]
fn placement_uses_as_few_nodes_as_hold_the_allocation() {
    let s = || st("s", 1.0, 0.0, 1.0, 1.0);
    let svc = chain(vec![s(), s(), s(), s()], &[100.0, 1.0, 100.0]);
    let topo = Topology::uniform(2, 2, Device::A100_40GB);
    // Two instances of 50% per stage: 4 GPUs of compute, both nodes; the light edge is cut.
    let two = vec![(2, 0.5); 4];
    let inst = place(&svc, &two, &topo, true, 1).unwrap();
    let node = |s: usize| {
        let nodes: Vec<usize> = inst
            .iter()
            .filter(|i| i.stage == s)
            .map(|i| topo.gpus[i.gpu].node)
            .collect();
        assert!(nodes.windows(2).all(|w| w[0] == w[1]));
        nodes[0]
    };
    assert_eq!(node(0), node(1));
    assert_eq!(node(2), node(3));
    assert_ne!(node(1), node(2));
    // One instance of 50% per stage: 2 GPUs, one node.
    let one = vec![(1, 0.5); 4];
    let inst = place(&svc, &one, &topo, true, 1).unwrap();
    assert!(inst.iter().all(|i| topo.gpus[i.gpu].node == 0), "{inst:?}");
}

#[test]
fn instances_go_next_to_their_heavy_neighbour_then_on_the_fullest_gpu() {
    let topo = Topology::uniform(1, 2, Device::A100_40GB);
    // a (30% each, 3 instances) then b (30%, 1 instance) with a heavy edge: a's three fill
    // GPU 0 to 90% (same stage packed, then the fullest GPU); b's 30% does not fit there and
    // goes to GPU 1.
    let svc = chain(
        vec![st("a", 1.0, 0.0, 1.0, 1.0), st("b", 1.0, 0.0, 1.0, 1.0)],
        &[50.0],
    );
    let inst = place(&svc, &vec![(3, 0.3), (1, 0.3)], &topo, true, 1).unwrap();
    assert_eq!(
        inst.iter().map(|i| i.gpu).collect::<Vec<_>>(),
        vec![0, 0, 0, 1]
    );
    // b at 10% fits beside its heavy neighbour on GPU 0.
    let inst = place(&svc, &vec![(3, 0.3), (1, 0.1)], &topo, true, 1).unwrap();
    assert_eq!(inst[3].gpu, 0);
    // With a light edge b still goes to the fullest GPU that fits, GPU 0.
    let light = chain(
        vec![st("a", 1.0, 0.0, 1.0, 1.0), st("b", 1.0, 0.0, 1.0, 1.0)],
        &[0.5],
    );
    let inst = place(&light, &vec![(3, 0.3), (1, 0.1)], &topo, true, 1).unwrap();
    assert_eq!(inst[3].gpu, 0);
}

#[test]
fn at_most_48_mps_clients_and_the_bandwidth_bind_the_allocation() {
    // One stage whose latency does not depend on its share (serial = 1): every instance serves
    // 100 queries/s, so the best allocation is as many instances as fit. In 2% steps the SMs
    // allow 50 on one GPU, MPS only 48.
    let svc = Service {
        name: "one",
        stages: vec![st("s", 10.0, 1.0, 100.0, 0.1)],
        edges: Vec::new(),
    };
    let topo = Topology::uniform(1, 1, Device::A100_40GB);
    let links = Links::default();
    let nc = Search {
        granularity: 0.02,
        bandwidth: false,
        ..Search::default()
    };
    let a = allocate(&svc, &topo, &links, &nc).unwrap();
    assert_eq!(a.alloc, vec![(48, 0.02)]);
    assert!((a.objective - 4800.0).abs() < 1e-6);
    assert!(feasible(&svc, &topo, &links, &vec![(49, 0.02)], &nc).is_none());
    // With the bandwidth constraint, 100 GB/s each on 1555 GB/s: 15.
    let with_bw = Search {
        bandwidth: true,
        ..nc
    };
    let a = allocate(&svc, &topo, &links, &with_bw).unwrap();
    assert_eq!(a.alloc[0].0, 15);
    let used = usage(&svc, &topo, &a.instances);
    assert!(used[0].bw <= 1555.0 && used[0].clients == 15);
}

#[test]
fn the_allocation_meets_the_latency_target_and_scales_the_slow_stage_out() {
    // Table 4's pattern: the stage with the long processing time gets more instances.
    let svc = chain(
        vec![
            st("slow", 20.0, 0.2, 50.0, 1.0),
            st("fast", 4.0, 0.2, 50.0, 1.0),
        ],
        &[10.0],
    );
    let topo = Topology::uniform(1, 2, Device::A100_40GB);
    let links = Links::default();
    let a = allocate(&svc, &topo, &links, &Search::default()).unwrap();
    assert!(a.critical_path_ms <= svc.qos_ms(&links) + 1e-9);
    let (n_slow, _) = a.alloc[0];
    let (n_fast, _) = a.alloc[1];
    assert!(n_slow > n_fast, "{:?}", a.alloc);
    // By hand (QoS 1.5 × (24 + 2) = 39 ms; IPC 0.05 ms): two slow instances at 80% (24 ms)
    // leave 20% on each GPU, and fast at 20% takes 16.8 ms (40.85 in all, over 39), so at most
    // 70%: 20 × (0.2 + 0.8 / 0.7) = 26.86 ms, with fast at 30% (11.47 ms) beside one of them,
    // 38.38 ms. Two slow instances serve 2000 / 26.86 = 74.5/s, one fast 87.2/s; three slow
    // ones need 60% or less (30.67 ms) and fast then 50%, 2.3 GPUs. Exhaustive search agrees,
    // and the epsilon-greedy search (not exhaustive) finds it.
    let exhaustive = brute_force(&svc, &topo, &links, &Search::default()).unwrap();
    let best = feasible(&svc, &topo, &links, &exhaustive, &Search::default()).unwrap();
    assert!(
        (best.objective - 2000.0 / (20.0 * (0.2 + 0.8 / 0.7))).abs() < 1e-6,
        "{exhaustive:?}"
    );
    assert!(
        (a.objective - best.objective).abs() < 1e-9,
        "{:?} against {exhaustive:?}",
        a.alloc
    );
}

#[test]
fn laius_splits_each_gpu_between_a_pair_without_scaling_out() {
    let links = Links::default();
    // a: 10 ms, serial 0.5; b: 5 ms, serial 0.5; 10 MB edge (2 ms through the host). Solo 17
    // ms, QoS 25.5 ms. b has the higher throughput: the QoS stage, given the smallest share
    // with g_b(p) + g_a(1 − p) + 2 ≤ 25.5: p = 0.3 gives 5(0.5 + 0.5/0.3) + 10(0.5 + 0.5/0.7)
    // + 2 = 10.83 + 12.14 + 2 = 24.98; p = 0.2 gives 15 + 11.25 + 2 = 28.25.
    let svc = chain(
        vec![st("a", 10.0, 0.5, 1.0, 1.0), st("b", 5.0, 0.5, 1.0, 1.0)],
        &[10.0],
    );
    let topo = Topology::uniform(1, 2, Device::A100_40GB);
    let p = plan(Policy::Laius, &svc, &topo, &links, 1.0, 1).unwrap();
    assert_eq!(p.alloc.len(), 2);
    assert_eq!(p.alloc[0].0, 2);
    assert!((p.alloc[1].1 - 0.3).abs() < 1e-9, "{:?}", p.alloc);
    assert!((p.alloc[0].1 - 0.7).abs() < 1e-9);
    let gpus: Vec<usize> = p.instances.iter().map(|i| i.gpu).collect();
    assert_eq!(gpus, vec![0, 0, 1, 1]);
}

#[test]
fn bandwidth_contention_slows_a_gpu_by_its_excess() {
    let svc = Service {
        name: "one",
        stages: vec![st("s", 10.0, 1.0, 500.0, 0.1)],
        edges: Vec::new(),
    };
    let topo = Topology::uniform(1, 1, Device::A100_40GB);
    let links = Links::default();
    let four: Vec<Instance> = (0..4)
        .map(|_| Instance {
            stage: 0,
            gpu: 0,
            share: 0.25,
        })
        .collect();
    let d = Deployment {
        service: &svc,
        topo: &topo,
        instances: &four,
        links: &links,
        astraea_channels: true,
    };
    // 2000 GB/s asked of 1555: every instance 2000/1555 slower.
    assert!((d.slowdowns()[0] - 2000.0 / 1555.0).abs() < 1e-9);
    assert!((d.capacity() - 400.0 * 1555.0 / 2000.0).abs() < 1e-6);
    // At a trickle the p99 is the service time (10 ms × the slowdown), well under a QoS of 15.
    let p = d.p99_ms(1.0, 500, 1);
    assert!((p - 10.0 * 2000.0 / 1555.0).abs() < 1e-6, "{p}");
    let (peak, p99) = d.peak_load(15.0, 1);
    assert!(peak > 0.0 && peak < d.capacity() && p99 <= 15.0);
}

#[test]
fn astraea_sustains_more_load_than_firm_and_laius_in_the_papers_direction() {
    // The paper: +15.5–45.1% over FIRM and +10.9–82.3% over Laius on one server (§8.2). The
    // direction on three of Table 1's services, one node of two GPUs.
    let topo = Topology::uniform(1, 2, Device::A100_40GB);
    let links = Links::default();
    for svc in table1().into_iter().take(3) {
        let peak = |p: Policy| tuned(p, &svc, &topo, &links, 3).map_or(0.0, |t| t.peak);
        let (a, f, l) = (
            peak(Policy::Astraea),
            peak(Policy::Firm),
            peak(Policy::Laius),
        );
        assert!(
            a > f && a > l,
            "{}: Astraea {a}, FIRM {f}, Laius {l}",
            svc.name
        );
    }
}

fn inventory(nodes: &[NodeId]) -> Vec<NodeGpus> {
    nodes
        .iter()
        .map(|&node| NodeGpus {
            node,
            name: format!("w{}", node.0),
            alive: true,
            gpus: (0..2)
                .map(|i| GpuStatus {
                    info: GpuInfo {
                        index: i,
                        uuid: format!("GPU-{}-{i}", node.0),
                        product: "NVIDIA A100-SXM4-40GB".into(),
                        model: Some(GpuModel::A100_40GB),
                        memory_mib: 40_960,
                        mig_enabled: false,
                        simulated: true,
                        slices: Vec::new(),
                    },
                    holders: Vec::new(),
                    reconfiguring: None,
                    last_error: None,
                    last_reconfiguration: None,
                })
                .collect(),
        })
        .collect()
}

#[tokio::test]
async fn the_core_admits_at_most_48_clients_per_gpu_and_places_them_on_its_node() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let a = cluster.add_node("cpu=256");
    let b = cluster.add_node("cpu=256");
    let (gpus, topo) = MpsGpus::create(cluster.clone(), "t", &inventory(&[a, b]))
        .await
        .unwrap();
    assert_eq!(topo.gpus.len(), 4);
    assert_eq!(topo.nodes(), 2);
    let svc = Service {
        name: "one",
        stages: vec![st("s", 10.0, 1.0, 1.0, 0.1)],
        edges: Vec::new(),
    };
    // 49 clients of 2% on b's second GPU: the SMs hold 50, MPS 48.
    let many: Vec<Instance> = (0..49)
        .map(|_| Instance {
            stage: 0,
            gpu: 3,
            share: 0.02,
        })
        .collect();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
    let d = gpus
        .deploy(&svc, &many, true, &["sleep", "60"], Some(deadline))
        .await
        .unwrap();
    assert_eq!(d.running.len(), 48);
    assert_eq!(d.refused.len(), 1);
    assert_eq!(d.misplaced, 0);
    assert!(cluster.running().iter().all(|(_, n)| *n == b));
    gpus.undeploy(&d).await.unwrap();
    // SMs bind too: three of 40% on one GPU, two run.
    let wide: Vec<Instance> = (0..3)
        .map(|_| Instance {
            stage: 0,
            gpu: 0,
            share: 0.4,
        })
        .collect();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
    let d = gpus
        .deploy(&svc, &wide, false, &["sleep", "60"], Some(deadline))
        .await
        .unwrap();
    assert_eq!((d.running.len(), d.refused.len()), (2, 1));
    gpus.undeploy(&d).await.unwrap();
    gpus.dissolve().await.unwrap();
}

#[test]
fn nvlink_is_the_machine_s_and_every_policy_may_take_it() {
    use super::service::Apart;
    // Without NVLink every edge between two GPUs goes through the host, Astraea's too; on one
    // GPU Astraea still passes an IPC handle (its channels).
    let none = Links::without_nvlink();
    assert_eq!(none.transfer_ms(44.0, Apart::SameNode, true), 8.8);
    assert_eq!(none.transfer_ms(44.0, Apart::SameNode, false), 8.8);
    assert_eq!(none.transfer_ms(40.0, Apart::SameGpu, true), 0.05);
    // With NVLink for every policy, a baseline's edge between two GPUs of a node takes it.
    let all = Links::nvlink_for_all();
    assert!((all.transfer_ms(44.0, Apart::SameNode, false) - 2.0).abs() < 1e-9);
    assert!((all.transfer_ms(44.0, Apart::SameNode, true) - 2.0).abs() < 1e-9);
    assert_eq!(all.transfer_ms(40.0, Apart::SameGpu, false), 8.0);
    // The default is the paper's §8.5 run: NVLink for Astraea's channels only.
    let default = Links::default();
    assert_eq!(default.transfer_ms(44.0, Apart::SameNode, false), 8.8);
}

#[test]
fn laius_cuts_the_pipeline_where_it_carries_least() {
    use super::compare::least_communication;
    use super::service::{Apart, six_stage};
    // Three servers of two GPUs, two copies of the six-stage pipeline on three GPUs each: every
    // copy spans two nodes, and the segmentation chooses which edges cross them.
    let svc = six_stage();
    let topo = Topology::uniform(3, 2, Device::A100_40GB);
    let links = Links::without_nvlink();
    let cost = |slot: &[usize]| -> f64 {
        (0..2)
            .map(|c| {
                svc.edges
                    .iter()
                    .map(|e| {
                        let (a, b) = (3 * c + slot[e.from], 3 * c + slot[e.to]);
                        let apart = if a == b {
                            Apart::SameGpu
                        } else if topo.gpus[a].node == topo.gpus[b].node {
                            Apart::SameNode
                        } else {
                            Apart::Nodes
                        };
                        links.transfer_ms(e.mb, apart, false)
                    })
                    .sum::<f64>()
            })
            .sum()
    };
    let slot = least_communication(&svc, &topo, &links, 3, 2);
    // At most two stages per GPU, every GPU of the copy used.
    for g in 0..3 {
        let n = slot.iter().filter(|&&s| s == g).count();
        assert!((1..=2).contains(&n), "{slot:?}");
    }
    // Cheaper than pairing the stages in pipeline order, and no other segmentation is cheaper.
    let in_order = [0, 0, 1, 1, 2, 2];
    assert!(cost(&slot) < cost(&in_order) - 1e-9, "{slot:?}");
    for code in 0..3usize.pow(6) {
        let other: Vec<usize> = (0..6).map(|s| code / 3usize.pow(s as u32) % 3).collect();
        if (0..3).all(|g| (1..=2).contains(&other.iter().filter(|&&s| s == g).count())) {
            assert!(
                cost(&slot) <= cost(&other) + 1e-9,
                "{slot:?} against {other:?}"
            );
        }
    }
    // Laius' plan lays its instances by that segmentation, two stages per GPU.
    let p = plan(Policy::Laius, &svc, &topo, &links, 1.0, 1).unwrap();
    for i in &p.instances {
        assert_eq!(i.gpu % 3, slot[i.stage], "{:?}", p.instances);
    }
    // A two-stage service on one server keeps its pair on one GPU per copy.
    let two = &table1()[0];
    let one = Topology::uniform(1, 2, Device::A100_40GB);
    assert_eq!(least_communication(two, &one, &links, 1, 2), vec![0, 0]);
}
