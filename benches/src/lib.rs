//! escher-bench: the benchmark harness. It reproduces the ESCHER thesis' microbenchmarks on
//! escher and runs Ray and HyperQueue side by side in the same invocation.
//!
//! ```text
//! cargo run --release -p escher-bench -- [all|w1|..|w10|cmd|retention|..|gpu|thesis|python]... [--size tiny|small|full]
//!                                        [--peers] [--out bench-results/]
//! cargo run --release -p escher-bench -- compare OLD NEW [--threshold 0.1] [--fail-on-worse]
//! ```
//!
//! Every workload prints its table rows, writes `<out>/<id>.json`, and contributes plots;
//! the run ends with the whole table, the docs/DESIGN.md §8 targets (met, missed or not measured),
//! `<out>/summary.json` and `<out>/results.md`. Every workload is bounded in time and stops by
//! itself. Performance is measured here, never asserted by tests.
//!
//! # Layout
//!
//! - [`workloads`]: W1–W8 (`BENCHMARKS.md` says what each measures), the command-task workload
//!   HyperQueue is compared on, head memory under retention (docs/DESIGN.md §7), the GPU policies
//!   end to end (`workloads/gpu.rs`, whose jobs run `escher-bench sim-work`, the CLI's simulated
//!   GPU job), and the thesis' applications (E1–E4, Cilantro: `workloads/thesis.rs`, over the
//!   examples' `examples/apps/`), one module each; [`cluster`] is the embedded escher cluster they
//!   share.
//! - [`compare`]: `escher-bench compare OLD NEW`, two runs' figures as ratios, better or worse.
//! - [`sim`]: light simulated workers speaking the real `WorkerLink` protocol (W8, retention);
//!   [`head_process`]: `escher-head` as a separate process, and its memory.
//! - [`peers`]: the Python virtual environment and the Ray and HyperQueue drivers
//!   (`benches/peers/*.py`).
//! - [`report`]: figures, tables and JSON; [`targets`]: docs/DESIGN.md §8 checked; [`plot`]: PNGs.
//! - [`size`]: what `tiny`, `small` and `full` mean for each workload; [`stats`]: percentiles.
#![warn(missing_docs)]

pub mod cluster;
pub mod compare;
pub mod head_process;
pub mod load;
pub mod peers;
pub mod plot;
pub mod report;
pub mod sim;
pub mod size;
pub mod stats;
pub mod targets;
pub mod workloads;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;

use crate::report::{TargetCheck, WorkloadReport};
use crate::size::{Params, Size};
use crate::workloads::{Ctx, Workload};

/// The longest one workload may take before the harness gives up on it.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(1_800);

/// What to run.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "escher-bench",
    version,
    about = "escher's benchmark harness: the thesis' microbenchmarks, with Ray and HyperQueue side by side"
)]
pub struct Options {
    /// Workloads to run: `all` (the default), `thesis`, or any of the workloads by name.
    #[arg(value_name = "WORKLOAD", value_enum)]
    pub workloads: Vec<Selection>,
    /// How big: tiny (seconds, for CI), small, or full (the scale of docs/DESIGN.md §8 and the
    /// thesis).
    #[arg(long, value_enum, default_value = "full")]
    pub size: Size,
    /// Also run the peers (Ray, HyperQueue) in a virtualenv the harness creates.
    #[arg(long)]
    pub peers: bool,
    /// Where JSON, plots and logs go.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// The `escher-head` binary W8 runs (default: next to this one, built if missing).
    #[arg(long, env = "ESCHER_HEAD_BIN")]
    pub head_bin: Option<PathBuf>,
    /// The parts of the `gpu` workload to run, comma-separated (default: every one), so that a
    /// long run can be split: migm, restarts, preinit, migrator, oltunes, ekya-profile,
    /// partition, migrator-cluster, astraea.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub gpu_parts: Vec<workloads::gpu::Part>,
}

/// A workload on the command line: every one, the thesis' group, or one by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Every workload of `all` ([`Workload::ALL`]).
    All,
    /// The thesis' application experiments: E1–E4 and Cilantro.
    Thesis,
    /// One workload.
    One(Workload),
}

impl clap::ValueEnum for Selection {
    fn value_variants<'a>() -> &'a [Self] {
        static VARIANTS: std::sync::LazyLock<Vec<Selection>> = std::sync::LazyLock::new(|| {
            let mut all = vec![Selection::All, Selection::Thesis];
            all.extend(
                <Workload as clap::ValueEnum>::value_variants()
                    .iter()
                    .map(|w| Selection::One(*w)),
            );
            all
        });
        &VARIANTS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            Selection::All => Some(clap::builder::PossibleValue::new("all").help("Every workload")),
            Selection::Thesis => Some(
                clap::builder::PossibleValue::new("thesis")
                    .help("The thesis' application experiments: E1–E4 and Cilantro"),
            ),
            Selection::One(w) => w.to_possible_value(),
        }
    }
}

impl Options {
    /// The workloads selected, in run order.
    pub fn selected(&self) -> Vec<Workload> {
        if self.workloads.is_empty() || self.workloads.contains(&Selection::All) {
            return Workload::ALL.to_vec();
        }
        let mut v: Vec<Workload> = self
            .workloads
            .iter()
            .flat_map(|s| match s {
                Selection::All => Workload::ALL.to_vec(),
                Selection::Thesis => vec![
                    Workload::E1,
                    Workload::E2,
                    Workload::E3,
                    Workload::E4,
                    Workload::Cilantro,
                ],
                Selection::One(w) => vec![*w],
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The machine a run came from.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// The CPU model.
    pub cpu_model: String,
    /// Total memory, GiB.
    pub memory_gib: f64,
    /// The kernel release.
    pub kernel: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
}

impl Machine {
    fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|x| x.1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_gib: kib / (1024.0 * 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// What a whole run produced.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// The command line.
    pub command: String,
    /// The size.
    pub size: Size,
    /// The machine.
    pub machine: Machine,
    /// Every workload's report (failed ones carry the error in their notes).
    pub workloads: Vec<WorkloadReport>,
    /// Workloads that failed, with why.
    pub failures: Vec<String>,
    /// The peers' outcomes.
    pub peers: Vec<serde_json::Value>,
    /// docs/DESIGN.md §8.
    pub targets: Vec<TargetCheck>,
    /// PNGs written.
    pub plots: Vec<PathBuf>,
    /// Plots that could not be drawn, and why.
    pub plot_problems: Vec<String>,
    /// Seconds the run took.
    pub elapsed_s: f64,
}

/// Runs the selected workloads (and peers), writes every output, and returns the summary.
pub async fn run(options: &Options) -> anyhow::Result<RunSummary> {
    let started = Instant::now();
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create {}", options.out.display()))?;
    let selected = options.selected();
    let params = Params::at(options.size);
    let ctx = Ctx {
        size: options.size,
        params: params.clone(),
        out: options.out.clone(),
        head_bin: options.head_bin.clone(),
        gpu_parts: options.gpu_parts.clone(),
    };
    let machine = Machine::read();
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    let mut peer_values = Vec::new();
    for workload in &selected {
        eprintln!(
            "escher-bench: {} ({}) ...",
            workload.id(),
            options.size.as_str()
        );
        let start = Instant::now();
        let load_start = load::one_minute();
        let outcome = tokio::time::timeout(WORKLOAD_LIMIT, workload.run(&ctx)).await;
        let mut report = match outcome {
            Ok(Ok(report)) => report,
            Ok(Err(e)) => failed(*workload, options.size, format!("{e:#}")),
            Err(_) => failed(
                *workload,
                options.size,
                format!("did not finish within {WORKLOAD_LIMIT:?}"),
            ),
        };
        report.elapsed_s = start.elapsed().as_secs_f64();
        if let (Some(start), Some(end)) = (load_start, load::one_minute()) {
            let load = load::Load {
                start,
                end,
                cpus: machine.cpus,
            };
            if let Some(warning) = load.warning() {
                eprintln!("escher-bench: {}: {warning}", workload.id());
                report.notes.push(warning);
            }
            report.load = Some(load);
        }
        if let Some(error) = report.notes.iter().find(|n| n.starts_with("FAILED")) {
            failures.push(format!("{}: {error}", workload.id()));
        }
        if options.peers {
            // The peer right after the workload, so that both see the same machine load.
            let outcomes = peers::run(&[*workload], &params, &options.out).await;
            let mut one = [report];
            peers::apply(&mut one, &outcomes);
            workloads::w7_gang::add_peer(&mut one, &outcomes);
            [report] = one;
            for o in &outcomes {
                peer_values.push(match &o.result {
                    Ok(r) => json!({"peer": o.peer, "workload": workload.id(), "values": r.values, "info": r.info, "log": o.log}),
                    Err(e) => {
                        eprintln!("escher-bench: peer {} did not run: {e}", o.peer);
                        json!({"peer": o.peer, "workload": workload.id(), "error": e, "log": o.log})
                    }
                });
            }
        }
        eprint!("{}", report::figures_table(std::slice::from_ref(&report)));
        reports.push(report);
    }
    let targets = targets::evaluate(&reports);
    for r in &reports {
        r.write_json(&options.out)?;
    }
    let (plots, plot_problems) = plot::draw_all(&reports, &options.out);
    let summary = RunSummary {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        size: options.size,
        machine,
        workloads: reports,
        failures,
        peers: peer_values,
        targets,
        plots,
        plot_problems,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    std::fs::write(
        options.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    std::fs::write(options.out.join("results.md"), markdown(&summary))?;
    Ok(summary)
}

fn failed(workload: Workload, size: Size, error: String) -> WorkloadReport {
    let mut r = WorkloadReport::new(workload.id(), "failed", size.as_str());
    r.notes.push(format!("FAILED: {error}"));
    r
}

/// The run as Markdown: the figures, the targets, the notes.
pub fn markdown(summary: &RunSummary) -> String {
    let m = &summary.machine;
    let mut s = format!(
        "# escher-bench results ({} size)\n\nMachine: {} CPUs ({}), {:.0} GiB, Linux {}. Run took {:.0} s.\n\n",
        summary.size.as_str(),
        m.cpus,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        summary.elapsed_s
    );
    s.push_str(
        "## Figures\n\nRatios are escher/peer, measured in the same run. The load is the 1-minute \
         load average at the workload's start and end; (!) marks one above the core count, where \
         wall-clock figures include waiting for a CPU.\n\n",
    );
    s.push_str(&report::figures_table(&summary.workloads));
    s.push_str("\n## docs/DESIGN.md §8 targets\n\n");
    s.push_str(&report::targets_table(&summary.targets));
    let notes: Vec<String> = summary
        .workloads
        .iter()
        .flat_map(|r| {
            r.notes
                .iter()
                .map(move |n| format!("- {}: {n}", r.id.to_uppercase()))
        })
        .chain(summary.peers.iter().filter_map(|p| {
            p.get("error")
                .map(|e| format!("- peer {}: did not run: {}", p["peer"], e))
        }))
        .chain(summary.plot_problems.iter().map(|p| format!("- plot: {p}")))
        .collect();
    if !notes.is_empty() {
        s.push_str("\n## Notes\n\n");
        s.push_str(&notes.join("\n"));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use clap::{Parser, ValueEnum};

    use super::*;

    #[test]
    fn every_workload_can_be_selected_by_its_id() {
        for workload in Workload::ALL {
            let selection = Selection::from_str(workload.id(), false)
                .unwrap_or_else(|e| panic!("{} is not a selection: {e}", workload.id()));
            let options = Options::parse_from(["escher-bench", workload.id()]);
            assert_eq!(options.selected(), [workload], "{selection:?}");
        }
        let python = Options::parse_from(["escher-bench", "python"]);
        assert_eq!(python.selected(), [Workload::Python]);
        let objects = Options::parse_from(["escher-bench", "objects"]);
        assert_eq!(objects.selected(), [Workload::Objects]);
        let autoscale = Options::parse_from(["escher-bench", "autoscale"]);
        assert_eq!(autoscale.selected(), [Workload::Autoscale]);
    }

    #[test]
    fn all_thesis_and_several_names_select_their_workloads_once_in_run_order() {
        let selected = |args: &[&str]| {
            Options::parse_from(std::iter::once("escher-bench").chain(args.iter().copied()))
                .selected()
        };
        assert_eq!(selected(&[]), Workload::ALL);
        assert_eq!(selected(&["all", "w2"]), Workload::ALL);
        assert_eq!(
            selected(&["e4", "thesis", "w1"]),
            [
                Workload::W1,
                Workload::E1,
                Workload::E2,
                Workload::E3,
                Workload::E4,
                Workload::Cilantro
            ]
        );
        assert!(Options::try_parse_from(["escher-bench", "w11"]).is_err());
    }
}
