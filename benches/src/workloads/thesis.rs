//! The thesis' end-to-end evaluation (thesis §4.6.1): E1 WordCount with data locality, E2
//! hierarchical fair sharing at 100 nodes, E3 AlphaZero-style co-location, E4 EscherTune, and
//! Cilantro's synthetic 5-user experiment. The applications are the examples' own (the crate
//! `escher-apps`, `examples/apps/`, linked here unchanged), so the figures come from the code
//! a reader runs with `cargo run --example`. Each runs on an embedded cluster (real gRPC on loopback,
//! in-process workers), with the injected costs each application documents.

use serde_json::json;

use super::Ctx;
use crate::report::{Better, Figure, Line, Plot, PlotData, WorkloadReport};

use escher_apps as apps;

use apps::common::{Clock, policy_lines};

fn higher(mut f: Figure) -> Figure {
    f.better = Better::Higher;
    f
}

/// The run-to-run spread of one placement's jobs: the slowest's makespan over the fastest's.
fn spread(id: String, what: String, makespans: &[f64]) -> Figure {
    let (lo, hi) = makespans
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), m| {
            (lo.min(*m), hi.max(*m))
        });
    let mut f = Figure::new(
        id,
        format!(
            "{what}: slowest / fastest of its {} jobs' makespans (run-to-run noise of the same \
             maps on the same nodes; measured)",
            makespans.len()
        ),
        "×",
        if lo > 0.0 { hi / lo } else { 1.0 },
    );
    f.better = Better::Lower;
    f
}

/// E1: WordCount with data locality (Fig. 4.5a/b).
pub async fn e1(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    use apps::wordcount::{Costs, Outcome, Placement, SOURCE, WordCount};
    let size = ctx.size;
    let nodes = size.pick(10, 50, 100);
    let chunks_mb: Vec<f64> = size.pick(
        vec![500.0],
        vec![500.0, 5000.0],
        vec![500.0, 1000.0, 2000.0, 5000.0],
    );
    let reps = size.pick(1, 1, 5);
    let sweep: Vec<usize> = size.pick(vec![], vec![], vec![25, 50, 100]);
    let costs = Costs::default();
    let mut report = WorkloadReport::new(
        "e1",
        "E1 WordCount with data locality: makespan and transfer share per placement",
        size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{nodes} in-process workers, cpu=1 each (one map slot), one chunk each, random layout"),
        "job": "one map per chunk (real word count, partial counts as results), 10 reduces",
        "costs": costs,
        "input_gb": chunks_mb.iter().map(|c| c * nodes as f64 / 1000.0).collect::<Vec<_>>(),
        "repeats": format!("{reps} job(s) per placement and size, interleaved; the median makespan's job is reported"),
        "node_sweep": sweep,
    });
    let policy = policy_lines(SOURCE);
    report.figures.push(
        Figure::new(
            "e1.policy_lines",
            "lines the locality policy takes in the application",
            "lines",
            policy as f64,
        )
        .thesis(2.0),
    );
    let wc = WordCount::start(nodes, 10, costs, 7)
        .await
        .map_err(anyhow::Error::from_boxed)?;
    let mut lines: Vec<Line> = Placement::ALL
        .iter()
        .map(|p| Line {
            name: p.name().into(),
            points: Vec::new(),
        })
        .collect();
    let mut detail = Vec::new();
    for &mb in &chunks_mb {
        let gb = mb * nodes as f64 / 1000.0;
        let out = wc
            .compare(mb, reps)
            .await
            .map_err(anyhow::Error::from_boxed)?;
        for (i, o) in out.iter().enumerate() {
            lines[i].points.push((gb, o.makespan_s));
            report.figures.push(Figure::new(
                format!("e1.makespan.{}.{gb}", o.placement.name()),
                format!("{gb} GB input, {}: makespan", o.placement.name()),
                "s (simulated)",
                o.makespan_s,
            ));
        }
        let get = |p| Outcome::of(&out, p);
        let (unaware, esl, hard) = (
            get(Placement::Unaware),
            get(Placement::Esl),
            get(Placement::HardCoded),
        );
        report.figures.push(
            Figure::new(
                format!("e1.transfer_share.unaware.{gb}"),
                format!(
                    "{gb} GB input, unaware: share of the maps' time moving input (measured; the \
                     assumed rates set it: a remote map moves its chunk at {} MB/s and counts it at \
                     {} MB/s, {:.1}% moving)",
                    costs.net_mb_s,
                    costs.compute_mb_s,
                    100.0 * (1.0 / costs.net_mb_s)
                        / (1.0 / costs.net_mb_s + 1.0 / costs.compute_mb_s)
                ),
                "%",
                100.0 * unaware.transfer_share,
            )
            .thesis(58.3),
        );
        report.figures.push(Figure::new(
            format!("e1.transfer_share.esl.{gb}"),
            format!(
                "{gb} GB input, esl: share of the maps' time moving input ({}/{} maps local)",
                esl.local_maps, esl.maps
            ),
            "%",
            100.0 * esl.transfer_share,
        ));
        report.figures.push(
            Figure::new(
                format!("e1.esl_vs_hard.{gb}"),
                format!("{gb} GB input: esl makespan / hard-coded makespan"),
                "×",
                esl.makespan_s / hard.makespan_s,
            )
            .thesis(1.019),
        );
        // What separates the two is mostly noise: they run the same maps on the same nodes.
        // Each placement's own jobs say how much, slowest over fastest.
        for o in [esl, hard] {
            report.figures.push(spread(
                format!("e1.spread.{}.{gb}", o.placement.name()),
                format!("{gb} GB input, {}", o.placement.name()),
                &o.makespans_s,
            ));
        }
        detail.push(json!({ "chunk_mb": mb, "outcomes": out }));
    }
    wc.shutdown().await;
    report.plots.push(Plot {
        file: "fig4.5a-wordcount.png".into(),
        title: format!("Fig. 4.5a: WordCount makespan on {nodes} nodes per placement"),
        x_label: "input (GB, simulated)".into(),
        y_label: "makespan (simulated s)".into(),
        data: PlotData::Lines {
            lines,
            x_log: false,
        },
    });
    let mut sweep_lines = vec![
        Line {
            name: "esl".into(),
            points: Vec::new(),
        },
        Line {
            name: "hard-coded".into(),
            points: Vec::new(),
        },
    ];
    for &n in &sweep {
        let wc = WordCount::start(n, 10, costs, 11)
            .await
            .map_err(anyhow::Error::from_boxed)?;
        let out = wc
            .compare(2000.0, reps)
            .await
            .map_err(anyhow::Error::from_boxed)?;
        wc.shutdown().await;
        for p in [Placement::Esl, Placement::HardCoded] {
            report.figures.push(spread(
                format!("e1.spread.{}.nodes{n}", p.name()),
                format!("{n} nodes, 2 GB per chunk, {}", p.name()),
                &Outcome::of(&out, p).makespans_s,
            ));
        }
        let get = |p| Outcome::of(&out, p).makespan_s;
        let (esl, hard) = (get(Placement::Esl), get(Placement::HardCoded));
        sweep_lines[0].points.push((n as f64, esl));
        sweep_lines[1].points.push((n as f64, hard));
        report.figures.push(
            Figure::new(
                format!("e1.nodes.{n}"),
                format!("{n} nodes, 2 GB per chunk: esl / hard-coded makespan"),
                "×",
                esl / hard,
            )
            .thesis(1.019),
        );
        detail.push(json!({ "nodes": n, "chunk_mb": 2000.0, "outcomes": out }));
    }
    if !sweep.is_empty() {
        report.plots.push(Plot {
            file: "fig4.5b-wordcount-nodes.png".into(),
            title: "Fig. 4.5b: WordCount makespan against cluster size, 2 GB per node".into(),
            x_label: "nodes".into(),
            y_label: "makespan (simulated s)".into(),
            data: PlotData::Lines {
                lines: sweep_lines,
                x_log: false,
            },
        });
    }
    report.detail = json!(detail);
    report.notes.push(format!(
        "Simulated time: {} ms of wall time per simulated second. Assumed (examples/apps/src/wordcount.rs, \
         not from the thesis): CPU {} MB/s, disk {} MB/s, one {} MB/s link per node. Measured: the \
         makespans, the transfer shares and the maps that ran local; the transfer share is what \
         the assumed rates make it.",
        costs.clock.ms_per_s, costs.compute_mb_s, costs.disk_mb_s, costs.net_mb_s
    ));
    Ok(report)
}

/// E2: hierarchical fair sharing at 100 nodes, composed with locality (Fig. 4.5c).
pub async fn e2(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    use apps::hfs::{Config, SOURCE, USERS, run};
    let size = ctx.size;
    let config = Config {
        nodes: size.pick(10, 50, 100),
        task_s: 4.0,
        rebalance_s: 2.0,
        tolerance: size.pick(1, 3, 5),
        clock: Clock {
            ms_per_s: size.pick(8.0, 15.0, 20.0),
        },
    };
    let mut report = WorkloadReport::new(
        "e2",
        "E2 hierarchical fair sharing: running tasks per user over time, and convergence",
        size.as_str(),
    );
    report.setup = json!({
        "config": config,
        "hierarchy": "top {org1: 1, org2: 1}; org1 {A: 2, B: 3}; org2 {C: 1}; A, B, C start at t = 0, 60, 120 simulated s",
        "tasks": "WordCount maps of 4 simulated s: fair-share spec AND data-locality spec, two outstanding per node of the user's share",
    });
    report.figures.push(Figure::new(
        "e2.policy_lines",
        "lines the two policies take in the application",
        "lines",
        policy_lines(SOURCE) as f64,
    ));
    let out = run(config).await.map_err(anyhow::Error::from_boxed)?;
    for (p, phase) in out.phases.iter().enumerate() {
        let users: Vec<&str> = USERS
            .iter()
            .filter(|u| u.1 <= phase.start_s)
            .map(|u| u.0)
            .collect();
        report.figures.push(Figure::new(
            format!("e2.converge.{p}"),
            format!(
                "from t = {} s ({}): time until shares stay within ±{} of {:?}",
                phase.start_s,
                users.join(", "),
                config.tolerance,
                phase.target
            ),
            "s (simulated)",
            phase.converged_after_s.unwrap_or(phase_length(p)),
        ));
        if phase.converged_after_s.is_none() {
            report.notes.push(format!(
                "The phase from t = {} s never settled within ±{}; its figure is the phase's length.",
                phase.start_s, config.tolerance
            ));
        }
        for (u, name) in users.iter().enumerate() {
            report.figures.push(higher(
                Figure::new(
                    format!("e2.share.{p}.{name}"),
                    format!(
                        "from t = {} s: {name}'s mean running share once settled",
                        phase.start_s
                    ),
                    "%",
                    100.0 * phase.mean[u] / config.nodes as f64,
                )
                .thesis(100.0 * USERS[u].2[p]),
            ));
        }
    }
    report.figures.push(higher(Figure::new(
        "e2.local",
        "maps that ran on their chunk's node",
        "%",
        100.0 * out.local as f64 / out.tasks.max(1) as f64,
    )));
    let mut lines: Vec<Line> = (0..3)
        .map(|u| Line {
            name: format!("user {}", USERS[u].0),
            points: out
                .samples
                .iter()
                .map(|s| (s.t_s, 100.0 * s.running[u] as f64 / config.nodes as f64))
                .collect(),
        })
        .collect();
    // The thesis' shares beside ours, as steps at each arrival.
    for (name, _, shares) in USERS {
        let mut points = Vec::new();
        for (p, share) in shares.iter().enumerate() {
            let from = USERS[p].1;
            points.push((from, 100.0 * share));
            points.push((from + phase_length(p), 100.0 * share));
        }
        lines.push(Line {
            name: format!("{name}, thesis"),
            points,
        });
    }
    report.plots.push(Plot {
        file: "fig4.5c-hfs.png".into(),
        title: format!("Fig. 4.5c: hierarchical fair sharing on {} nodes (A:B = 2:3 in Sub-Org1, C in Sub-Org2)", config.nodes),
        x_label: "time (simulated s)".into(),
        y_label: "running tasks (% of nodes)".into(),
        data: PlotData::Lines { lines, x_log: false },
    });
    report.detail = json!(out);
    Ok(report)
}

/// The length of E2's phase `p`, simulated seconds.
fn phase_length(p: usize) -> f64 {
    use apps::hfs::{END_S, USERS};
    USERS.get(p + 1).map_or(END_S, |u| u.1) - USERS[p].1
}

/// E3: AlphaZero-style co-location with load balancing (Fig. 4.6a, 4.7).
pub async fn e3(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    use apps::alphazero::{AlphaZero, Costs, Placement, SOURCE};
    let size = ctx.size;
    let (nodes, pairs, explorations) = (
        size.pick(4, 8, 16),
        size.pick(8, 24, 48),
        size.pick(3, 10, 20),
    );
    let reps = size.pick(1, 1, 3);
    let costs = Costs::default();
    let mut report = WorkloadReport::new(
        "e3",
        "E3 AlphaZero-style pairs: exploration latency per placement",
        size.as_str(),
    );
    report.setup = json!({
        "nodes": format!("{nodes} in-process workers, cpu=4,accel=4 each"),
        "pairs": pairs,
        "explorations_per_pair": explorations,
        "moves_per_exploration": 4,
        "costs": costs,
        "repeats": reps,
    });
    report.figures.push(
        Figure::new(
            "e3.policy_lines",
            "lines the ER policy takes in the application",
            "lines",
            policy_lines(SOURCE) as f64,
        )
        .thesis(5.0),
    );
    let az = AlphaZero::start(nodes, costs)
        .await
        .map_err(anyhow::Error::from_boxed)?;
    let mut runs: Vec<Vec<apps::alphazero::Outcome>> = vec![Vec::new(); 3];
    for _ in 0..reps {
        for (i, p) in Placement::ALL.iter().enumerate() {
            runs[i].push(
                az.run(*p, pairs, explorations, 4)
                    .await
                    .map_err(anyhow::Error::from_boxed)?,
            );
        }
    }
    az.shutdown().await;
    let med = |i: usize, f: fn(&apps::alphazero::Outcome) -> f64| {
        apps::common::median(&runs[i].iter().map(f).collect::<Vec<_>>())
    };
    for (i, p) in Placement::ALL.iter().enumerate() {
        let colocated = runs[i].iter().map(|o| o.colocated).min().unwrap_or(0);
        report.figures.push(Figure::new(
            format!("e3.median.{}", p.name()),
            format!(
                "{}: median exploration latency ({colocated}/{pairs} pairs co-located)",
                p.name()
            ),
            "ms",
            med(i, |o| o.median_s),
        ));
        report.figures.push(Figure::new(
            format!("e3.p95.{}", p.name()),
            format!("{}: P95 exploration latency", p.name()),
            "ms",
            med(i, |o| o.p95_s),
        ));
    }
    let gain = |q: fn(&apps::alphazero::Outcome) -> f64| 100.0 * (1.0 - med(1, q) / med(0, q));
    // What the assumed costs allow: co-location saves the two hops of a round, nothing else.
    let ceiling = 100.0 * 2.0 * costs.hop_s / (costs.search_s + costs.infer_s + 2.0 * costs.hop_s);
    report.notes.push(format!(
        "Assumed (examples/apps/src/alphazero.rs, not from the thesis): {} ms of tree search and {} ms \
         of evaluation per round, {} ms per message between two nodes each way; so co-location can \
         save at most {ceiling:.1}% of a round. Measured: the latencies, the pairs co-located, the \
         savings.",
        costs.search_s, costs.infer_s, costs.hop_s
    ));
    report.figures.push(higher(
        Figure::new(
            "e3.gain.median",
            format!(
                "ER co-location vs none: median latency saved (measured; the assumed hop makes \
                 {ceiling:.1}% the most a round can save)"
            ),
            "%",
            gain(|o| o.median_s),
        )
        .thesis(15.4),
    ));
    report.figures.push(higher(
        Figure::new(
            "e3.gain.p95",
            "ER co-location vs none: P95 latency saved",
            "%",
            gain(|o| o.p95_s),
        )
        .thesis(20.0),
    ));
    report.figures.push(
        Figure::new(
            "e3.er_vs_hard",
            "ER / hard-coded median latency",
            "×",
            med(1, |o| o.median_s) / med(2, |o| o.median_s),
        )
        .thesis(1.01),
    );
    report.detail = json!(runs);
    Ok(report)
}

/// E4: EscherTune (Fig. 4.6b).
pub async fn e4(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    use apps::tune::{Costs, Policy, SOURCE, Tune};
    let size = ctx.size;
    let costs = Costs {
        clock: Clock {
            ms_per_s: size.pick(3.0, 10.0, 10.0),
        },
        ..Costs::default()
    };
    let reps = size.pick(1, 1, 3);
    let mut report = WorkloadReport::new(
        "e4",
        "E4 EscherTune: the long job's throughput with and without migration",
        size.as_str(),
    );
    report.setup = json!({
        "nodes": "3 in-process workers, cpu=8,accel=4 each (12 slots)",
        "scenario": "5 short one-slot jobs pinned 2+2+1, then a 4-worker job (spread 3+1 by the migration ESL)",
        "costs": costs,
        "repeats": reps,
    });
    report.figures.push(
        Figure::new(
            "e4.policy_lines",
            "lines the migration policy takes in the application",
            "lines",
            policy_lines(SOURCE) as f64,
        )
        .thesis(50.0),
    );
    let mut tune = Tune::start(costs)
        .await
        .map_err(anyhow::Error::from_boxed)?;
    let (mut fixed, mut moving) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        fixed.push(
            tune.run(Policy::Static)
                .await
                .map_err(anyhow::Error::from_boxed)?,
        );
        moving.push(
            tune.run(Policy::EscherTune)
                .await
                .map_err(anyhow::Error::from_boxed)?,
        );
    }
    tune.shutdown().await;
    let med = |v: &[apps::tune::Outcome]| {
        apps::common::median(&v.iter().map(|o| o.throughput).collect::<Vec<_>>())
    };
    let (f, m) = (med(&fixed), med(&moving));
    report.figures.push(higher(Figure::new(
        "e4.throughput.static",
        "static placement: long job's throughput",
        "steps/s (simulated)",
        f,
    )));
    report.figures.push(higher(Figure::new(
        "e4.throughput.escher_tune",
        format!(
            "escher-tune: long job's throughput ({} migration(s), ends on {} node(s), requests unchanged: {})",
            moving[0].migrations, moving[0].final_nodes, moving.iter().all(|o| o.requests_unchanged)
        ),
        "steps/s (simulated)",
        m,
    )));
    report.figures.push(higher(
        Figure::new(
            "e4.gain",
            format!(
                "throughput gained by migrating (measured; the assumed {}× step time when spread \
                 makes +{:.0}% the most it can gain)",
                costs.spread,
                100.0 * (costs.spread - 1.0)
            ),
            "%",
            100.0 * (m / f - 1.0),
        )
        .thesis(36.3),
    ));
    report.notes.push(format!(
        "Assumed (examples/apps/src/tune.rs, not from the thesis): a step takes {} s on one node and {}× \
         that spread over nodes, restoring the checkpoint {} s, the short jobs {:?} s. Measured: the \
         long job's throughput with and without migration, its migrations and where it ends.",
        costs.step_s, costs.spread, costs.restore_s, costs.short_s
    ));
    report.detail = json!({ "static": fixed, "escher_tune": moving });
    Ok(report)
}

/// Cilantro's synthetic 5-user experiment (thesis §3.7.3).
pub async fn cilantro(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    use apps::cilantro::{Config, Experiment, Report, SOURCE};
    use escher::esl::cilantro::Objective;
    let size = ctx.size;
    let config = Config {
        rounds: size.pick(30, 100, 200),
        noise: 0.05,
        job3: Report::Truthful,
        seed: 1,
    };
    let mut report = WorkloadReport::new(
        "cilantro",
        "Cilantro as an ESL: welfare and fairness of the learned allocations, 5 users",
        size.as_str(),
    );
    report.setup = json!({
        "cluster": "10 in-process workers of 10 CPUs (R = 100)",
        "jobs": "logistic performance, midpoints 5, 10, 20, 30, 45 CPUs, scale 3, SLO 0.95, Gaussian noise",
        "config": config,
        "round": "B = 10, β = 3/4; the second half of the rounds is measured",
    });
    report.figures.push(Figure::new(
        "cilantro.policy_lines",
        "lines the allocation policy takes in the application",
        "lines",
        policy_lines(SOURCE) as f64,
    ));
    let mut exp = Experiment::start()
        .await
        .map_err(anyhow::Error::from_boxed)?;
    let mut outcomes = Vec::new();
    for objective in Objective::ALL {
        let o = exp
            .run(objective, config)
            .await
            .map_err(anyhow::Error::from_boxed)?;
        for (key, what, value) in [
            ("welfare", "social welfare (mean utility)", o.social_welfare),
            (
                "egalitarian",
                "egalitarian welfare (least utility)",
                o.egalitarian_welfare,
            ),
            ("njc", "NJC fairness (min u / u at R/n)", o.njc_fairness),
        ] {
            report.figures.push(higher(Figure::new(
                format!("cilantro.{key}.{}", o.objective),
                format!("{}: {what}", o.objective),
                "",
                value,
            )));
        }
        report.figures.push(Figure::new(
            format!("cilantro.violations.{}", o.objective),
            format!("{}: rounds over the pool or the budget", o.objective),
            "rounds",
            o.violations as f64,
        ));
        outcomes.push(o);
    }
    let (njc_u, fair_u) = (&outcomes[0].utilities, &outcomes[3].utilities);
    let up = lifted_noticeably(njc_u, fair_u);
    report.figures.push(higher(
        Figure::new(
            "cilantro.lifted",
            format!(
                "jobs NJC lifts over resource-fair, ≥ {LIFT_RATIO}× and by ≥ {LIFT_ABS} utility: {} \
                 (utilities NJC vs resource-fair: {}; the thesis: a third of its 20 jobs, §3.7.1)",
                if up.is_empty() {
                    "none".to_string()
                } else {
                    up.iter()
                        .map(|j| format!("job {j}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                njc_u
                    .iter()
                    .zip(fair_u)
                    .enumerate()
                    .map(|(j, (n, f))| format!("job {} {n:.4} vs {f:.4}", j + 1))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "% of jobs",
            100.0 * up.len() as f64 / njc_u.len() as f64,
        )
        .thesis(33.3),
    ));
    let mut misreports = Vec::new();
    for objective in [
        Objective::Njc,
        Objective::SocialWelfare,
        Objective::Egalitarian,
    ] {
        let truthful = outcomes
            .iter()
            .find(|o| o.objective == objective.name())
            .expect("ran")
            .utilities[2];
        for factor in [0.5, 2.0] {
            let o = exp
                .run(
                    objective,
                    Config {
                        job3: Report::Scaled(factor),
                        ..config
                    },
                )
                .await
                .map_err(anyhow::Error::from_boxed)?;
            let direction = Misreport::of(factor);
            let ratio = o.utilities[2] / truthful.max(1e-9);
            report.figures.push(higher(Figure::new(
                format!(
                    "cilantro.misreport.{}.{}",
                    objective.name(),
                    direction.key()
                ),
                misreport_label(objective, factor, ratio),
                "×",
                ratio,
            )));
            misreports.push(json!({ "objective": objective.name(), "reports": direction.key(), "factor": factor, "utility": o.utilities[2], "truthful": truthful }));
        }
    }
    exp.shutdown().await;
    let njc = &outcomes[0];
    let lines = (0..njc.utilities.len())
        .map(|j| Line {
            name: format!("job {}", j + 1),
            points: njc
                .allocations
                .iter()
                .enumerate()
                .map(|(r, a)| (r as f64, a[j] as f64))
                .collect(),
        })
        .collect();
    report.plots.push(Plot {
        file: "cilantro-njc-allocations.png".into(),
        title: "Cilantro-NJC: each job's CPUs per round (learned demands, B = 10)".into(),
        x_label: "round".into(),
        y_label: "CPUs".into(),
        data: PlotData::Lines {
            lines,
            x_log: false,
        },
    });
    report.detail = json!({ "outcomes": outcomes, "misreports": misreports });
    Ok(report)
}

/// A lift NJC gives a job over resource-fair counts when its utility is at least this many
/// times resource-fair's...
const LIFT_RATIO: f64 = 1.2;
/// ...and at least this much higher (utilities are in [0, 1]): a ratio of two near-zero
/// utilities (0.056 against 0.036) is no lift.
const LIFT_ABS: f64 = 0.05;

/// The jobs (from 1) whose utility under `objective` is lifted over `fair`'s, by
/// [`LIFT_RATIO`] and [`LIFT_ABS`].
fn lifted_noticeably(objective: &[f64], fair: &[f64]) -> Vec<usize> {
    objective
        .iter()
        .zip(fair)
        .enumerate()
        .filter(|(_, (o, f))| **o >= LIFT_RATIO * **f && **o - **f >= LIFT_ABS)
        .map(|(j, _)| j + 1)
        .collect()
}

/// Which way a job misreports, in the thesis' words (§3.7.1, Fig. 3.12): it reports the
/// performance of `factor` times its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Misreport {
    /// `factor` < 1: it reports less performance than it gets, so it looks as if it needs more
    /// resources to reach its SLO (×1/2: about twice its demand).
    Under,
    /// `factor` > 1: it reports more, so it looks as if it reaches its SLO with fewer.
    Over,
}

impl Misreport {
    fn of(factor: f64) -> Misreport {
        if factor < 1.0 {
            Misreport::Under
        } else {
            Misreport::Over
        }
    }

    fn key(self) -> &'static str {
        match self {
            Misreport::Under => "under",
            Misreport::Over => "over",
        }
    }

    /// Whether the thesis finds the lie rewarded under `objective` (§3.7.1: "for Cilantro-EW,
    /// a user stands to gain by under-reporting while for Cilantro-SW, they gain by
    /// over-reporting"; under NJC neither gains).
    fn rewarded_in_thesis(self, objective: escher::esl::cilantro::Objective) -> bool {
        use escher::esl::cilantro::Objective;
        matches!(
            (objective, self),
            (Objective::Egalitarian, Misreport::Under)
                | (Objective::SocialWelfare, Misreport::Over)
        )
    }
}

/// The printed label of a misreport figure: which lie, what the thesis finds, what this run
/// found (rewarded: the liar's true utility at least 5% above truthful).
fn misreport_label(objective: escher::esl::cilantro::Objective, factor: f64, ratio: f64) -> String {
    let direction = Misreport::of(factor);
    let lie = match direction {
        Misreport::Under => format!(
            "under-reports its performance ×{factor} (looks as if it needs about ×{:.0} its demand)",
            1.0 / factor
        ),
        Misreport::Over => format!(
            "over-reports its performance ×{factor} (looks as if it needs about ×{} its demand)",
            1.0 / factor
        ),
    };
    let word = |rewarded: bool| if rewarded { "rewarded" } else { "not rewarded" };
    let thesis = direction.rewarded_in_thesis(objective);
    let ours = ratio >= 1.05;
    format!(
        "{}: job 3 {lie}: its true utility / truthful; the thesis (§3.7.1): {}; here: {} ({})",
        objective.name(),
        word(thesis),
        word(ours),
        if thesis == ours {
            "agrees"
        } else {
            "contradicts the thesis"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher::esl::cilantro::Objective;

    #[test]
    fn claiming_twice_the_demand_is_the_thesis_under_report() {
        // Reporting half the performance makes the job look as if it needs twice the CPUs:
        // the thesis' under-report, which EW rewards and SW does not (§3.7.1).
        assert_eq!(Misreport::of(0.5), Misreport::Under);
        assert_eq!(Misreport::of(2.0), Misreport::Over);
        assert!(Misreport::Under.rewarded_in_thesis(Objective::Egalitarian));
        assert!(!Misreport::Under.rewarded_in_thesis(Objective::SocialWelfare));
        assert!(Misreport::Over.rewarded_in_thesis(Objective::SocialWelfare));
        assert!(!Misreport::Over.rewarded_in_thesis(Objective::Egalitarian));
        assert!(!Misreport::Under.rewarded_in_thesis(Objective::Njc));
        assert!(!Misreport::Over.rewarded_in_thesis(Objective::Njc));
        let ew = misreport_label(Objective::Egalitarian, 0.5, 2.8);
        assert!(
            ew.contains("under-reports") && ew.contains("×2 its demand"),
            "{ew}"
        );
        assert!(ew.ends_with("here: rewarded (agrees)"), "{ew}");
        let sw = misreport_label(Objective::SocialWelfare, 0.5, 1.17);
        assert!(
            sw.ends_with("here: rewarded (contradicts the thesis)"),
            "{sw}"
        );
        let over = misreport_label(Objective::SocialWelfare, 2.0, 1.0);
        assert!(
            over.contains("over-reports") && over.contains("×0.5 its demand"),
            "{over}"
        );
    }

    #[test]
    fn a_ratio_of_near_zero_utilities_is_no_lift() {
        // The run's utilities: NJC lifts job 3 (0.64 against 0.53); jobs 4 and 5 stay near 0.
        let njc = [1.0, 1.0, 0.64, 0.056, 0.0004];
        let fair = [1.0, 1.0, 0.53, 0.036, 0.0003];
        assert_eq!(lifted_noticeably(&njc, &fair), vec![3]);
    }
}
