//! MIGM (the `migm` and `restarts` parts of `escher-bench gpu`): the paper's mixes with
//! schemes A and B against the sequential full GPU, and the out-of-memory and early restarts,
//! each on a cluster's simulated A100 (the module doc of `gpu/mod.rs`).

use super::*;

/// A mix as the MIGM paper defines it (appendix A.1, Table 1; §5.1 and §5.2.1), with the paper's
/// throughput gains of scheme A and B over the sequential full GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PaperMix {
    name: &'static str,
    /// `small : medium : large : full` in lowest terms, the paper's buckets by memory (§5.1:
    /// the 5, 10, 20 and 40 GB partitions).
    ratio: [usize; 4],
    /// Whether the paper makes each size group's total runtime about equal (Ht1, A.1) rather
    /// than drawing each job from the pool.
    equal_group_runtime: bool,
    /// Throughput over the sequential full GPU, scheme A and B (×).
    gain: (f64, f64),
    /// Where the paper gives the mix and its figures.
    source: &'static str,
}

/// The MIGM mixes the harness may name. A mix is labelled only with a name whose ratio (and,
/// for Ht1, equal group runtimes) its jobs have: [`check_mix`].
const PAPER_MIXES: [PaperMix; 4] = [
    PaperMix {
        name: "Hm2",
        ratio: [1, 0, 0, 0],
        equal_group_runtime: false,
        gain: (6.2, 6.2),
        source: "§5.1: Hm2/Hm3, small Rodinia jobs x50/x100, up to 6.2x",
    },
    PaperMix {
        name: "Ht1",
        ratio: [11, 0, 2, 2],
        equal_group_runtime: true,
        gain: (1.64, 1.47),
        source: "§5.1 and A.1: 15 jobs, 11 small, 2 medium, 2 large, each group's total runtime about equal; A +64%, B +47%",
    },
    PaperMix {
        name: "Ht3",
        ratio: [4, 0, 1, 1],
        equal_group_runtime: false,
        gain: (1.29, 1.21),
        source: "§5.1 and A.1: 4:0:1:1 x36; A +29%, B +21%",
    },
    PaperMix {
        name: "Ml3",
        ratio: [0, 0, 1, 0],
        equal_group_runtime: false,
        gain: (1.24, 1.43),
        source: "§5.2.1 and A.1: large DNN training jobs x18 on the 4/7 and 3/7 20 GB instances; A +24%, B +43%",
    },
];

fn paper_mix(name: &str) -> &'static PaperMix {
    PAPER_MIXES
        .iter()
        .find(|m| m.name == name)
        .expect("a mix of the paper")
}

/// One mix as run here: the paper's mix it is labelled with, and its jobs.
struct Mix {
    paper: &'static PaperMix,
    jobs: Vec<JobModel>,
}

/// The paper's bucket of a job (§5.1: the smallest of the 5, 10, 20 and 40 GB partitions its
/// memory estimate fits): 0 small, 1 medium, 2 large, 3 full.
fn bucket(job: &JobModel) -> usize {
    match estimate_gb(job) {
        gb if gb <= 5.0 => 0,
        gb if gb <= 10.0 => 1,
        gb if gb <= 20.0 => 2,
        _ => 3,
    }
}

/// The jobs' `small : medium : large : full` counts in lowest terms.
fn ratio_of(jobs: &[JobModel]) -> [usize; 4] {
    let mut counts = [0usize; 4];
    for job in jobs {
        counts[bucket(job)] += 1;
    }
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let g = counts.iter().fold(0, |g, &c| gcd(g, c)).max(1);
    counts.map(|c| c / g)
}

/// `4:0:1:1`.
fn ratio_text(ratio: [usize; 4]) -> String {
    ratio.map(|c| c.to_string()).join(":")
}

/// Whether the non-empty size groups' total runtimes (on the whole GPU) are within 10%.
fn equal_group_runtime(jobs: &[JobModel]) -> bool {
    let mut totals = [0.0f64; 4];
    for job in jobs {
        totals[bucket(job)] += job.work_s;
    }
    let present: Vec<f64> = totals.into_iter().filter(|t| *t > 0.0).collect();
    let (lo, hi) = present.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), t| {
        (lo.min(*t), hi.max(*t))
    });
    present.is_empty() || hi <= 1.1 * lo
}

/// Whether `mix`'s jobs are the mix its name says: the paper's ratio, and equal group runtimes
/// where the paper makes them equal.
fn check_mix(mix: &Mix) -> Result<(), String> {
    let ratio = ratio_of(&mix.jobs);
    if ratio != mix.paper.ratio {
        return Err(format!(
            "{} is {} in the paper ({}), these jobs are {}",
            mix.paper.name,
            ratio_text(mix.paper.ratio),
            mix.paper.source,
            ratio_text(ratio)
        ));
    }
    if mix.paper.equal_group_runtime && !equal_group_runtime(&mix.jobs) {
        return Err(format!(
            "{}'s groups have equal total runtimes in the paper ({}), these do not",
            mix.paper.name, mix.paper.source
        ));
    }
    Ok(())
}

/// The label a mix is printed with: the paper's name and the ratio of the jobs themselves.
fn mix_label(mix: &Mix) -> String {
    format!(
        "{} ({}, {} jobs)",
        mix.paper.name,
        ratio_text(ratio_of(&mix.jobs)),
        mix.jobs.len()
    )
}

/// `small : medium : large : full` jobs, interleaved as MIGM's heterogeneous mixes.
fn mix(small: usize, medium: usize, large: usize, full: usize) -> Vec<JobModel> {
    let kinds = [
        (small, JobModel::fixed(20.0, 1, 4.0)),
        (medium, JobModel::fixed(20.0, 2, 9.0)),
        (large, JobModel::fixed(20.0, 3, 15.0)),
        (full, JobModel::fixed(20.0, 7, 30.0)),
    ];
    let most = kinds.iter().map(|(n, _)| *n).max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..most {
        for (n, job) in &kinds {
            if i < *n {
                out.push(*job);
            }
        }
    }
    out
}

/// The mixes on the cluster: Hm2, Ht3 and Ml3 with fewer jobs than the paper's (Ht1, whose
/// groups have equal total runtimes in the paper, is not run here).
fn mixes(size: crate::size::Size) -> Vec<Mix> {
    let k = size.pick(1, 2, 2);
    vec![
        Mix {
            paper: paper_mix("Hm2"),
            jobs: vec![JobModel::fixed(20.0, 1, 4.0); 7 * k],
        },
        Mix {
            paper: paper_mix("Ht3"),
            jobs: mix(4 * k, 0, k, k),
        },
        Mix {
            paper: paper_mix("Ml3"),
            jobs: vec![JobModel::fixed(20.0, 4, 18.0); 3 * k],
        },
    ]
}

/// Runs `policy` over `jobs` on a fresh cluster; the outcome and the drive's report.
async fn run_one(
    policy: &mut dyn Policy,
    jobs: &[JobModel],
    scale: f64,
) -> anyhow::Result<(Outcome, DriveReport)> {
    let (cluster, client, node) = gpu_cluster("a100-40gb:mig=", scale).await?;
    let mut gpu = ClusterGpu::new(client.clone(), node, 0).await?;
    let exe = std::env::current_exe()?.display().to_string();
    let specs = jobs.iter().map(|j| spec(&exe, j, scale)).collect();
    let ids = gpu.submit(specs).await?;
    for (id, job) in ids.iter().zip(jobs) {
        policy.add(*id, job);
    }
    let started = Instant::now();
    let report = drive(policy.as_policy(), &mut gpu, Duration::from_secs(600)).await?;
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.finished_at.is_some() && report.refused.is_empty() && report.failed.is_empty(),
        "{} did not finish cleanly: {:?}",
        policy.as_policy().name(),
        report
    );
    let telemetry = client.telemetry(ids.clone(), None).await?;
    let busy: f64 = telemetry.iter().filter_map(|t| t.latest("energy_j")).sum();
    let makespan_s = wall / scale;
    let idle = PowerModel::default().power_w(0) * makespan_s;
    let outcome = Outcome {
        policy: policy.as_policy().name(),
        makespan_s,
        energy_j: busy + idle,
        reconfigurations: report.reconfigurations,
        restarts: policy.restarts(),
        layouts: report
            .layouts
            .iter()
            .map(|(ms, l)| {
                (
                    *ms as f64 / 1000.0 / scale,
                    l.placements().len(),
                    l.to_string(),
                )
            })
            .collect(),
    };
    cluster.shutdown().await;
    Ok((outcome, report))
}

/// The policies compared, behind one face.
trait Policy: Send {
    fn add(&mut self, task: TaskId, job: &JobModel);
    fn as_policy(&mut self) -> &mut dyn GpuPolicy;
    fn restarts(&self) -> usize;
}

impl Policy for Migm {
    fn add(&mut self, task: TaskId, job: &JobModel) {
        self.submit(MigmJob {
            task,
            memory_gb: Some(estimate_gb(job)),
            iterations: iterations(job),
        });
    }
    fn as_policy(&mut self) -> &mut dyn GpuPolicy {
        self
    }
    fn restarts(&self) -> usize {
        Migm::restarts(self).len()
    }
}

impl Policy for Sequential {
    fn add(&mut self, task: TaskId, _: &JobModel) {
        self.submit(task);
    }
    fn as_policy(&mut self) -> &mut dyn GpuPolicy {
        self
    }
    fn restarts(&self) -> usize {
        0
    }
}
/// MIGM's schemes A and B against the sequential full GPU on each of the paper's mixes, on a
/// cluster's simulated A100-40GB: throughput and energy over the sequential baseline of the
/// same run, and Ht3's layouts over time.
pub(super) async fn migm_on_cluster(
    ctx: &Ctx,
    scale: f64,
    report: &mut WorkloadReport,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let model = GpuModel::A100_40GB;
    let mut detail = Vec::new();
    for mix in mixes(ctx.size) {
        check_mix(&mix).map_err(anyhow::Error::msg)?;
        let label = mix_label(&mix);
        let key = mix.paper.name.to_lowercase();
        let seq = run_one(&mut Sequential::new(model), &mix.jobs, scale).await?;
        let a = run_one(
            &mut Migm::new(model, Scheme::BySize, false),
            &mix.jobs,
            scale,
        )
        .await?;
        let b = run_one(&mut Migm::new(model, Scheme::Fifo, false), &mix.jobs, scale).await?;
        let base = &seq.0;
        for ((scheme, run), paper) in [("a", &a.0), ("b", &b.0)]
            .into_iter()
            .zip([mix.paper.gain.0, mix.paper.gain.1])
        {
            let mut thru = Figure::new(
                format!("gpu.{key}.throughput.{scheme}"),
                format!(
                    "{label}: MIGM scheme {} throughput / sequential ({} reconfigurations; the paper: {})",
                    scheme.to_uppercase(),
                    run.reconfigurations,
                    mix.paper.source
                ),
                "x",
                base.makespan_s / run.makespan_s,
            )
            .thesis(paper);
            thru.better = Better::Higher;
            report.figures.push(thru);
            let mut energy = Figure::new(
                format!("gpu.{key}.energy.{scheme}"),
                format!(
                    "{label}: MIGM scheme {} energy saving (sequential / MIGM)",
                    scheme.to_uppercase()
                ),
                "x",
                base.energy_j / run.energy_j,
            );
            energy.better = Better::Higher;
            report.figures.push(energy);
        }
        if mix.paper.name == "Ht3" {
            // A staircase: each layout holds until the next, the last until the makespan.
            let step = |o: &Outcome| {
                let mut points = Vec::new();
                for (i, (t, n, _)) in o.layouts.iter().enumerate() {
                    if i > 0 {
                        points.push((*t, o.layouts[i - 1].1 as f64));
                    }
                    points.push((*t, *n as f64));
                }
                if let Some((_, n, _)) = o.layouts.last() {
                    points.push((o.makespan_s, *n as f64));
                }
                Line {
                    name: o.policy.clone(),
                    points,
                }
            };
            report.plots.push(Plot {
                file: "gpu-migm-layouts.png".into(),
                title: format!(
                    "MIGM on a cluster's A100 ({label}): instances in the GPU's layout over time"
                ),
                x_label: "simulated seconds".into(),
                y_label: "MIG instances".into(),
                data: PlotData::Lines {
                    lines: vec![step(&a.0), step(&b.0)],
                    x_log: false,
                },
            });
        }
        detail.push(json!({
            "mix": mix.paper.name,
            "ratio": ratio_text(ratio_of(&mix.jobs)),
            "jobs": mix.jobs.len(),
            "sequential": seq.0,
            "migm_a": a.0,
            "migm_b": b.0,
        }));
    }
    Ok(detail)
}

/// MIGM's restarts end to end: jobs whose memory grows past the slice their estimate picks,
/// under scheme B with the out-of-memory restart alone and with early restart from the
/// memory predictor. The waste is the GPU time of the attempts a restart threw away.
///
/// Each job draws its own memory jitter; at the full size the mix is run with three draws
/// (`RESTART_SEEDS`), and the figures without a seed pool them (total makespans, summed
/// waste), with each draw's throughputs beside them (`gpu.grow.seed<N>.*`).
pub(super) async fn restarts(
    ctx: &Ctx,
    scale: f64,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let model = GpuModel::A100_40GB;
    // 2 GB growing by 0.25 GB per iteration to 7 GB: estimated 2, so started on a 1g.5gb
    // slice, out of memory at about iteration 12 of 20 (2 s each).
    let growing = |seed: u64| JobModel {
        work_s: 40.0,
        parallelism: 1,
        pcie_bound: false,
        memory: MemoryModel::Growing {
            base_gb: 2.0,
            per_iteration_gb: 0.25,
            jitter_gb: 0.05,
            seed,
        },
        iterations: 20,
    };
    let count = ctx.size.pick(2, 4, 6);
    let draws = &RESTART_SEEDS[..ctx.size.pick(1, 1, RESTART_SEEDS.len())];
    let speed = SpeedModel::default();
    let mut out = Vec::new();
    // Pooled over the draws: sequential, out-of-memory only, early restart.
    let mut makespans = [0.0f64; 3];
    let mut wasted = [0.0f64; 2];
    let mut restarted = [0usize; 2];
    for &seed in draws {
        // Job `i` of draw `seed` jitters with its own stream.
        let jobs: Vec<JobModel> = (0..count).map(|i| growing(seed * 100 + i as u64)).collect();
        // The paper's +25.13% (§5.2.2) is against its baseline, the unpartitioned GPU running
        // the jobs one after another: that run here too.
        let (sequential, _) = run_one(&mut Sequential::new(model), &jobs, scale).await?;
        makespans[0] += sequential.makespan_s;
        let mut draw = vec![sequential.makespan_s];
        for (k, early) in [false, true].into_iter().enumerate() {
            let mut migm = Migm::new(model, Scheme::Fifo, early);
            let (outcome, _) = run_one(&mut migm, &jobs, scale).await?;
            let thrown: f64 = migm
                .restarts()
                .iter()
                .map(|r| {
                    let job = &jobs[0];
                    speed.duration_s(job, r.from.profile) / f64::from(job.iterations)
                        * f64::from(r.iteration)
                })
                .sum();
            makespans[k + 1] += outcome.makespan_s;
            wasted[k] += thrown;
            restarted[k] += outcome.restarts;
            draw.push(outcome.makespan_s);
            out.push(json!({ "seed": seed, "early_restart": early, "outcome": outcome, "wasted_s": thrown }));
        }
        if draws.len() > 1 {
            for (k, which) in ["oom", "predicted"].into_iter().enumerate() {
                let mut f = Figure::new(
                    format!("gpu.grow.seed{seed}.throughput.{which}"),
                    format!(
                        "growing jobs, memory jitter draw {seed}, MIGM B with {which} restarts: throughput / sequential full GPU"
                    ),
                    "x",
                    draw[0] / draw[k + 1],
                );
                f.better = Better::Higher;
                report.figures.push(f);
            }
            let mut vs = Figure::new(
                format!("gpu.grow.seed{seed}.throughput.predicted_vs_oom"),
                format!(
                    "growing jobs, memory jitter draw {seed}: early restart's throughput / out-of-memory restart's"
                ),
                "x",
                draw[1] / draw[2],
            );
            vs.better = Better::Higher;
            report.figures.push(vs);
        }
        out.push(json!({ "seed": seed, "sequential": sequential }));
    }
    let pooled = if draws.len() > 1 {
        format!(", {} jitter draws pooled", draws.len())
    } else {
        String::new()
    };
    for (k, (which, early)) in [("oom", false), ("predicted", true)]
        .into_iter()
        .enumerate()
    {
        let mut f = Figure::new(
            format!("gpu.grow.makespan.{which}"),
            format!(
                "{count} growing jobs, MIGM B with {}{pooled}: makespan ({} restarts, {:.0} s of slice time thrown away)",
                if early {
                    "early restart"
                } else {
                    "out-of-memory restart only"
                },
                restarted[k],
                wasted[k]
            ),
            "s (simulated)",
            makespans[k + 1],
        );
        f.better = Better::Lower;
        report.figures.push(f);
        let mut w = Figure::new(
            format!("gpu.grow.wasted.{which}"),
            format!(
                "growing jobs, {which} restarts{pooled}: slice time of the attempts thrown away"
            ),
            "s (simulated)",
            wasted[k],
        );
        w.better = Better::Lower;
        report.figures.push(w);
        let mut thru = Figure::new(
            format!("gpu.grow.throughput.{which}"),
            format!(
                "growing jobs, MIGM B with {which} restarts{pooled}: throughput / sequential full GPU{}",
                if early {
                    " (the paper's +25.13% is prediction's gain over its sequential baseline, §5.2.2, \
                     averaged over its LLM and DNN jobs)"
                } else {
                    ""
                }
            ),
            "x",
            makespans[0] / makespans[k + 1],
        );
        if early {
            thru = thru.thesis(1.2513);
        }
        thru.better = Better::Higher;
        report.figures.push(thru);
    }
    let mut vs = Figure::new(
        "gpu.grow.throughput.predicted_vs_oom",
        format!(
            "growing jobs{pooled}: early restart's throughput / out-of-memory restart's (the paper gives no such figure)"
        ),
        "x",
        makespans[1] / makespans[2],
    );
    vs.better = Better::Higher;
    report.figures.push(vs);
    Ok(json!({ "mix": "grow", "seeds": draws, "runs": out }))
}

/// The memory jitter draws of [`restarts`] at the full size (the first alone at the others).
const RESTART_SEEDS: [u64; 3] = [7, 8, 9];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::Size;

    #[test]
    fn every_mix_run_is_the_paper_mix_its_label_names() {
        for size in [Size::Tiny, Size::Small, Size::Full] {
            for m in mixes(size) {
                check_mix(&m).unwrap();
                let label = mix_label(&m);
                assert!(
                    label.starts_with(&format!("{} ({},", m.paper.name, ratio_text(m.paper.ratio))),
                    "{label}"
                );
            }
        }
    }

    #[test]
    fn a_mix_under_another_mix_s_name_is_refused() {
        // Ht3's 4:0:1:1 is not Ht1 (the label the cluster's mix once had).
        let wrong = Mix {
            paper: paper_mix("Ht1"),
            jobs: mix(4, 0, 1, 1),
        };
        assert!(check_mix(&wrong).unwrap_err().contains("Ht1 is 11:0:2:2"));
        // Ht1's counts with every job 20 s (the in-memory example's Ht1): the paper makes each
        // group's total runtime equal, these are 220, 40 and 40 s.
        let same_jobs = Mix {
            paper: paper_mix("Ht1"),
            jobs: mix(11, 0, 2, 2),
        };
        assert!(
            check_mix(&same_jobs)
                .unwrap_err()
                .contains("equal total runtimes")
        );
        // Ht1 as the paper builds it: 11 small jobs of 20 s, two of each other size of 110 s.
        let mut jobs = vec![JobModel::fixed(20.0, 1, 4.0); 11];
        jobs.extend([JobModel::fixed(110.0, 3, 15.0); 2]);
        jobs.extend([JobModel::fixed(110.0, 7, 30.0); 2]);
        check_mix(&Mix {
            paper: paper_mix("Ht1"),
            jobs,
        })
        .unwrap();
    }

    #[test]
    fn a_ratio_is_counted_by_memory_bucket_in_lowest_terms() {
        assert_eq!(ratio_text(ratio_of(&mix(8, 0, 2, 2))), "4:0:1:1");
        assert_eq!(ratio_of(&[JobModel::fixed(20.0, 4, 18.0); 6]), [0, 0, 1, 0]);
        assert_eq!(ratio_of(&[JobModel::fixed(20.0, 1, 4.0); 14]), [1, 0, 0, 0]);
        assert_eq!(ratio_of(&mix(0, 3, 0, 0)), [0, 1, 0, 0]);
    }

    #[test]
    fn the_paper_s_figures_go_with_the_paper_s_mixes() {
        // §5.1: Ht1 +64% (A) / +47% (B), Ht3 +29% / +21%; §5.2.1: Ml3 +24% / +43%.
        assert_eq!(paper_mix("Ht1").gain, (1.64, 1.47));
        assert_eq!(paper_mix("Ht3").gain, (1.29, 1.21));
        assert_eq!(paper_mix("Ml3").gain, (1.24, 1.43));
        assert_eq!(paper_mix("Ht3").ratio, [4, 0, 1, 1]);
        for (i, a) in PAPER_MIXES.iter().enumerate() {
            assert!(PAPER_MIXES[i + 1..].iter().all(|b| b.name != a.name));
        }
    }
}
