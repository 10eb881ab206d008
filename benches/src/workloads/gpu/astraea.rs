//! Astraea end to end on a cluster (`escher_gpu::astraea`): its plan and its paper's
//! baselines' (FIRM, Laius) deployed on a `LocalCluster` whose workers have simulated
//! A100-40GBs, every GPU's SMs, MPS clients, memory and bandwidth ephemeral resources and every
//! instance a task (`sleep`) holding its share of them; the requests are the simulated part,
//! served by the instances whose tasks the cluster runs, and the metric is the paper's: the
//! peak load sustained with the p99 latency within the QoS target (§8.2).
//!
//! Two settings: one server of two GPUs with the paper's seven two-stage services (Table 1,
//! §8.2), and three servers of two GPUs with a six-stage pipeline of ours (the paper's
//! multi-node run uses a 21-microservice application, §8.6), three seeds each at full size.
//! Each runs twice, every policy on the same interconnect: without NVLink (the paper's §8.2
//! server) and with NVLink between a node's GPUs for every policy. Laius is laid on the
//! segmentation with the least communication (§8.6).
//! Astraea-NC (no bandwidth constraint) is run at three loads per service, as the paper's
//! ablation (§8.3).

use std::time::Duration;

use escher::LocalCluster;
use escher_gpu::astraea::compare::peak_of;
use escher_gpu::astraea::{
    Links, MpsGpus, Policy, Service, Topology, plan, six_stage, table1, tuned,
};
use serde_json::json;

use super::Ctx;
use crate::report::{Better, Figure, WorkloadReport};

/// What one policy got on one service and seed.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    interconnect: &'static str,
    service: String,
    seed: u64,
    policy: &'static str,
    budget: f64,
    instances: usize,
    refused: usize,
    misplaced: usize,
    gpus_used: usize,
    nodes_used: usize,
    alloc: Vec<(u32, f64)>,
    peak_qps: f64,
    p99_ms: f64,
    qos_ms: f64,
}

async fn cluster(nodes: usize) -> anyhow::Result<LocalCluster> {
    let mut b = LocalCluster::builder().no_workers();
    for _ in 0..nodes {
        b = b.worker_with_gpus("cpu=256".parse()?, ["a100-40gb", "a100-40gb"]);
    }
    Ok(b.start().await?)
}

/// Plans, deploys and measures every policy on `services`, on a fresh cluster of `nodes`
/// servers of two GPUs.
async fn run_setting(
    nodes: usize,
    links: Links,
    services: &[Service],
    seeds: &[u64],
    rows: &mut Vec<Row>,
    nc_cases: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    let cluster = cluster(nodes).await?;
    let client = cluster.client().await?;
    let inventory = escher::esl::ClusterApi::gpus(&client).await?;
    for (si, svc) in services.iter().enumerate() {
        for &seed in seeds {
            let inst = format!("s{nodes}x{si}x{seed}");
            let (gpus, topo): (MpsGpus<escher::Client>, Topology) =
                MpsGpus::create(client.clone(), &inst, &inventory).await?;
            let qos = svc.qos_ms(&links);
            let mut astraea_budget = 1.0;
            let mut astraea_peak = 0.0;
            for policy in [Policy::Astraea, Policy::Firm, Policy::Laius] {
                let Some(t) = tuned(policy, svc, &topo, &links, seed) else {
                    rows.push(Row {
                        interconnect: interconnect(&links),
                        service: svc.name.into(),
                        seed,
                        policy: policy.name(),
                        budget: 0.0,
                        instances: 0,
                        refused: 0,
                        misplaced: 0,
                        gpus_used: 0,
                        nodes_used: 0,
                        alloc: Vec::new(),
                        peak_qps: 0.0,
                        p99_ms: f64::INFINITY,
                        qos_ms: qos,
                    });
                    continue;
                };
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                let d = gpus
                    .deploy(
                        svc,
                        &t.plan.instances,
                        policy.accounts_bandwidth(),
                        &["sleep", "3600"],
                        Some(deadline),
                    )
                    .await?;
                let (peak, p99) = peak_of(svc, &topo, &links, policy, &d.running, qos, seed);
                gpus.undeploy(&d).await?;
                let mut used: Vec<usize> = d.running.iter().map(|i| i.gpu).collect();
                used.sort_unstable();
                used.dedup();
                let mut on: Vec<usize> = used.iter().map(|&g| topo.gpus[g].node).collect();
                on.dedup();
                if policy == Policy::Astraea {
                    astraea_budget = t.plan.budget;
                    astraea_peak = peak;
                }
                rows.push(Row {
                    interconnect: interconnect(&links),
                    service: svc.name.into(),
                    seed,
                    policy: policy.name(),
                    budget: t.plan.budget,
                    instances: d.running.len(),
                    refused: d.refused.len(),
                    misplaced: d.misplaced,
                    gpus_used: used.len(),
                    nodes_used: on.len(),
                    alloc: t.plan.alloc.clone(),
                    peak_qps: peak,
                    p99_ms: p99,
                    qos_ms: qos,
                });
            }
            // Astraea-NC (§8.3): the same search without the bandwidth constraint, at
            // Astraea's budget, deployed without the bandwidth resource, at a third, two
            // thirds and all of Astraea's peak.
            if let Some(nc) = plan(Policy::AstraeaNc, svc, &topo, &links, astraea_budget, seed) {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                let d = gpus
                    .deploy(
                        svc,
                        &nc.instances,
                        false,
                        &["sleep", "3600"],
                        Some(deadline),
                    )
                    .await?;
                let dep = escher_gpu::astraea::Deployment {
                    service: svc,
                    topo: &topo,
                    instances: &d.running,
                    links: &links,
                    astraea_channels: true,
                };
                for (level, frac) in [(1, 1.0 / 3.0), (2, 2.0 / 3.0), (3, 1.0)] {
                    let rate = astraea_peak * frac;
                    let p99 = dep.p99_ms(rate, escher_gpu::astraea::sim::QUERIES, seed);
                    nc_cases.push(json!({
                        "interconnect": interconnect(&links),
                        "service": svc.name, "seed": seed, "level": level, "rate_qps": rate,
                        "p99_ms": p99, "qos_ms": qos, "violated": p99 > qos,
                        "slowdown": dep.slowdowns().into_iter().fold(1.0, f64::max),
                    }));
                }
                gpus.undeploy(&d).await?;
            }
            gpus.dissolve().await?;
        }
    }
    cluster.shutdown().await;
    Ok(())
}

/// How a setting's GPUs of one node are linked, as printed and keyed.
fn interconnect(links: &Links) -> &'static str {
    match (links.nvlink_gbs, links.nvlink_for_every_policy) {
        (None, _) => "no_nvlink",
        (Some(_), true) => "nvlink",
        (Some(_), false) => "nvlink_astraea_only",
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The words for an interconnect key of [`interconnect`].
fn describe(ic: &str) -> &'static str {
    match ic {
        "no_nvlink" => "no NVLink (every edge between GPUs through the host, for every policy)",
        "nvlink" => "NVLink between a node's GPUs for every policy",
        _ => "NVLink for Astraea's channels only",
    }
}

fn peak(rows: &[Row], ic: &str, service: &str, policy: Policy, seed: u64) -> f64 {
    rows.iter()
        .find(|r| {
            r.interconnect == ic
                && r.service == service
                && r.policy == policy.name()
                && r.seed == seed
        })
        .map_or(0.0, |r| r.peak_qps)
}

/// Runs both settings and adds their figures and notes to `report`.
pub(super) async fn astraea_on_cluster(
    ctx: &Ctx,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let seeds: &[u64] = ctx.size.pick(&[1], &[1, 2], &[1, 2, 3]);
    let services = table1();
    let one_server: Vec<Service> = ctx.size.pick(
        services[..2].to_vec(),
        services[..4].to_vec(),
        services.clone(),
    );
    // The same interconnect for every policy, so that the comparison is fair: no NVLink, as the paper's §8.2 server
    // of two RTX 2080 Ti, and NVLink between a node's GPUs taken by every policy's edges.
    let settings = [Links::without_nvlink(), Links::nvlink_for_all()];
    let multi = vec![six_stage()];
    let mut rows = Vec::new();
    let mut nc = Vec::new();
    let mut multi_rows = Vec::new();
    let mut multi_nc = Vec::new();
    for links in settings {
        run_setting(1, links, &one_server, seeds, &mut rows, &mut nc).await?;
        run_setting(3, links, &multi, seeds, &mut multi_rows, &mut multi_nc).await?;
    }

    println!(
        "Astraea on a cluster (peak load within the p99 QoS, queries/s; simulated serving on the instances the cluster ran):"
    );
    println!(
        "{:<9} {:<22} {:>4} {:<8} {:>7} {:>5} {:>4} {:>9} {:>8} {:>7}  allocation (N, SM share) per stage",
        "links",
        "service",
        "seed",
        "policy",
        "budget",
        "inst",
        "gpus",
        "peak q/s",
        "p99 ms",
        "QoS ms"
    );
    for r in rows.iter().chain(&multi_rows) {
        println!(
            "{:<9} {:<22} {:>4} {:<8} {:>7.1} {:>5} {:>4} {:>9.1} {:>8.1} {:>7.1}  {:?}{}",
            r.interconnect,
            r.service,
            r.seed,
            r.policy,
            r.budget,
            r.instances,
            r.gpus_used,
            r.peak_qps,
            r.p99_ms,
            r.qos_ms,
            r.alloc
                .iter()
                .map(|(n, p)| format!("({n}, {:.0}%)", p * 100.0))
                .collect::<Vec<_>>(),
            if r.refused > 0 || r.misplaced > 0 {
                format!(" refused {} misplaced {}", r.refused, r.misplaced)
            } else {
                String::new()
            }
        );
    }

    // Over the seeds at which the baseline sustained any load within the QoS (a baseline that
    // sustains none has no ratio; the table above shows it).
    let ratio = |rows: &[Row], ic: &str, svc: &str, base: Policy| -> Option<f64> {
        let r: Vec<f64> = seeds
            .iter()
            .filter(|&&s| peak(rows, ic, svc, base, s) > 0.0)
            .map(|&s| peak(rows, ic, svc, Policy::Astraea, s) / peak(rows, ic, svc, base, s))
            .collect();
        (!r.is_empty()).then(|| mean(r.into_iter()))
    };
    let mut without = Vec::new();
    for links in settings {
        let ic = interconnect(&links);
        for svc in &one_server {
            for (base, paper) in [
                (
                    Policy::Firm,
                    if ic == "no_nvlink" {
                        "+15.5-45.1% per service on one server of two 2080Ti without NVLink, §8.2 Fig. 10"
                    } else {
                        "no figure with NVLink for every policy; on DGX-2 V100s +31.2% without \
                         GPU-to-GPU communication (§8.5 Fig. 16), and Astraea +26.4% more with \
                         it while FIRM does not use it (Fig. 17)"
                    },
                ),
                (
                    Policy::Laius,
                    if ic == "no_nvlink" {
                        "+10.9-82.3% per service on one server of two 2080Ti without NVLink, §8.2 Fig. 10"
                    } else {
                        "no figure with NVLink for every policy; on DGX-2 V100s +40.2% without \
                         GPU-to-GPU communication (§8.5 Fig. 16), and Astraea +26.4% more with \
                         it while Laius does not use it (Fig. 17)"
                    },
                ),
            ] {
                let Some(value) = ratio(&rows, ic, svc.name, base) else {
                    without.push(format!("{} against {} ({ic})", svc.name, base.name()));
                    continue;
                };
                let mut f = Figure::new(
                    format!(
                        "gpu.astraea.server.{ic}.{}.vs_{}",
                        svc.name.replace(' ', "_"),
                        base.name().to_lowercase()
                    ),
                    format!(
                        "Astraea's peak load / {}'s, {} (Table 1's stages, models assumed: \
                         gpu/src/astraea/service.rs), one server of two simulated A100s, {}, \
                         mean over {} seeds (measured in the simulation on the instances the \
                         cluster ran; the paper: {paper})",
                        base.name(),
                        svc.name,
                        describe(ic),
                        seeds.len()
                    ),
                    "x",
                    value,
                );
                f.better = Better::Higher;
                report.figures.push(f);
            }
        }
        for (base, paper) in [(Policy::Firm, 1.472), (Policy::Laius, 1.329)] {
            let svc = six_stage();
            let Some(value) = ratio(&multi_rows, ic, svc.name, base) else {
                without.push(format!("{} against {} ({ic})", svc.name, base.name()));
                continue;
            };
            let mut f = Figure::new(
                format!("gpu.astraea.nodes.{ic}.vs_{}", base.name().to_lowercase()),
                format!(
                    "Astraea's peak load / {}'s, three servers of two simulated A100s, {}, our \
                     six-stage pipeline (assumed), Laius on the segmentation with the least \
                     communication, mean over {} seeds (measured in the simulation on the \
                     instances the cluster ran; the paper's figure is for its 21-microservice \
                     application on 3 nodes x 2 V100, between nodes through the host and gRPC, \
                     §8.6 Fig. 18)",
                    base.name(),
                    describe(ic),
                    seeds.len()
                ),
                "x",
                value,
            )
            .thesis(paper);
            f.better = Better::Higher;
            report.figures.push(f);
        }
    }
    let violated = |cases: &[serde_json::Value], seed: u64| {
        cases
            .iter()
            .filter(|c| {
                c["seed"] == seed && c["interconnect"] == "no_nvlink" && c["violated"] == true
            })
            .count()
    };
    for &seed in seeds {
        let mut f = Figure::new(
            format!("gpu.astraea.nc_violations.seed{seed}"),
            format!(
                "Astraea-NC (no bandwidth constraint): QoS violations among {} cases ({} services x 3 \
                 loads: 1/3, 2/3 and all of Astraea's peak), one server without NVLink, seed {seed} \
                 (the paper: 14 of 21 on its 2080Ti server, §8.3)",
                one_server.len() * 3,
                one_server.len()
            ),
            "cases",
            violated(&nc, seed) as f64,
        )
        .thesis(14.0);
        f.better = Better::Lower;
        report.figures.push(f);
    }
    if !without.is_empty() {
        report.notes.push(format!(
            "Astraea: no ratio where the baseline sustained no load within the QoS at any seed: {}",
            without.join(", ")
        ));
    }
    let refused: usize = rows.iter().chain(&multi_rows).map(|r| r.refused).sum();
    let misplaced: usize = rows.iter().chain(&multi_rows).map(|r| r.misplaced).sum();
    report.notes.push(format!(
        "Astraea (gpu.astraea.*): each policy's instances are tasks on a LocalCluster holding \
         ephemeral resources of their GPU (SM %, one of its 48 MPS clients, memory, and for Astraea \
         bandwidth); {refused} instance(s) the core did not admit and {misplaced} placed off their \
         GPU's node over the run. The peak loads are measurements of the serving simulation on the \
         instances that ran (stage models, link speeds and the contention model are assumptions: \
         gpu/src/astraea/service.rs and sim.rs); every policy planned to the latency budget \
         (of 0.5-1.0 x QoS) under which its own deployment sustained the most. The paper ran on \
         2080Ti and V100 GPUs with real services; its per-service figures are in plots only \
         (ranges from §8.2's text)."
    ));
    Ok(json!({
        "mix": "astraea",
        "one_server": rows,
        "three_servers": multi_rows,
        "nc": nc,
        "nc_three_servers": multi_nc,
    }))
}
