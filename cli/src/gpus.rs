//! `escher gpus` (every node's GPUs, MIG slices, which task holds each device, and what the
//! last reconfiguration took phase by phase) and the `escher mig` changes of one GPU:
//! `apply NODE GPU LAYOUT` (a whole layout, atomically), `create NODE GPU PROFILE[@START]` and
//! `destroy NODE GPU INSTANCE` (one instance), `prepare NODE GPU LAYOUT` (pre-initialization:
//! the steps toward a layout that leave busy instances alone).
//!
//! Each prints the plan (what is destroyed and created, the tasks it waits for, the estimated
//! time on hardware) and returns; with `--wait` it returns once the worker has done the change,
//! printing the GPU afterwards and what each phase took, and exits non-zero if the change
//! failed or `--timeout` passed first.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use escher_proto::mig::ReconfigurationCost;
use escher_proto::types::{GpuInfo, GpuStatus, MigChange, MigPlan, MigReport, NodeGpus};
use escher_proto::{Amount, NodeId};
use indicatif::{ProgressBar, ProgressStyle};

use super::ctx::Ctx;
use super::render::{ids, key_values, lines, table};
use super::values::parse_duration;

/// Options of `escher gpus`.
#[derive(Debug, Clone, Args)]
pub struct GpusArgs {}

impl GpusArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let nodes = ctx.client().await?.gpus().await?;
        if ctx.json {
            ctx.emit_json(&nodes)?;
        } else {
            ctx.emit(&render_gpus(&nodes))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The `escher mig` commands.
#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// Change the MIG layout of one GPU of one node, atomically, e.g. `escher mig apply 1 0
    /// 3g.20gb,2g.10gb,1g.5gb,1g.5gb` (instances in both layouts are left alone)
    Apply(MigApplyArgs),
    /// Create one MIG instance, e.g. `escher mig create 1 0 1g.5gb@6` (or `1g.5gb`: the start
    /// that keeps the most full layouts reachable); the other instances are left alone
    Create(MigCreateArgs),
    /// Destroy one MIG instance, named PROFILE@START or by its UUID, e.g. `escher mig destroy
    /// 1 0 1g.5gb@6`
    Destroy(MigDestroyArgs),
    /// Pre-initialize toward a layout: do now every step that leaves busy instances alone
    /// (destroy the idle ones it does not keep, create what then fits), so that a later
    /// `mig apply` of the same layout does only what is left
    Prepare(MigPrepareArgs),
}

/// The GPU a `escher mig` command changes.
#[derive(Debug, Clone, Args)]
pub struct MigTarget {
    /// The node id (see `escher gpus`)
    #[arg(value_name = "NODE")]
    pub node: NodeId,

    /// The GPU's index on the node
    #[arg(value_name = "GPU")]
    pub gpu: u32,
}

/// How long a `escher mig` command waits.
#[derive(Debug, Clone, Args)]
pub struct MigWait {
    /// Return once the change is done (or failed), with what each phase took
    #[arg(long)]
    pub wait: bool,

    /// With --wait: give up waiting after this long (seconds, or 500ms / 5m)
    #[arg(long, value_name = "SECS", value_parser = parse_duration, requires = "wait")]
    pub timeout: Option<Duration>,
}

/// Options of `escher mig apply`.
#[derive(Debug, Clone, Args)]
pub struct MigApplyArgs {
    #[command(flatten)]
    pub(crate) target: MigTarget,

    /// The layout: profiles, comma-separated, each optionally at a start memory slice
    /// (`3g.20gb,2g.10gb,1g.5gb@6`); the GPU's model decides which are legal
    #[arg(value_name = "LAYOUT")]
    pub layout: String,

    /// If a slice the change destroys is in use, admit nothing new to it and change the
    /// layout once it is free (instead of refusing)
    #[arg(long)]
    pub drain: bool,

    #[command(flatten)]
    pub(crate) wait: MigWait,
}

/// Options of `escher mig create`.
#[derive(Debug, Clone, Args)]
pub struct MigCreateArgs {
    #[command(flatten)]
    pub(crate) target: MigTarget,

    /// The instance: PROFILE@START (`1g.5gb@6`), or PROFILE alone
    #[arg(value_name = "INSTANCE")]
    pub instance: String,

    #[command(flatten)]
    pub(crate) wait: MigWait,
}

/// Options of `escher mig destroy`.
#[derive(Debug, Clone, Args)]
pub struct MigDestroyArgs {
    #[command(flatten)]
    pub(crate) target: MigTarget,

    /// The instance: PROFILE@START (`1g.5gb@6`) or its UUID (`MIG-...`)
    #[arg(value_name = "INSTANCE")]
    pub instance: String,

    /// If the instance is in use, admit nothing new to it and destroy it once it is free
    /// (instead of refusing)
    #[arg(long)]
    pub drain: bool,

    #[command(flatten)]
    pub(crate) wait: MigWait,
}

/// Options of `escher mig prepare`.
#[derive(Debug, Clone, Args)]
pub struct MigPrepareArgs {
    #[command(flatten)]
    pub(crate) target: MigTarget,

    /// The layout to prepare for, as `escher mig apply` takes it
    #[arg(value_name = "LAYOUT")]
    pub layout: String,

    #[command(flatten)]
    pub(crate) wait: MigWait,
}

impl MigCommand {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let (target, change, drain, wait) = match self {
            MigCommand::Apply(a) => (a.target, MigChange::Layout(a.layout), a.drain, a.wait),
            MigCommand::Create(a) => (a.target, MigChange::Create(a.instance), false, a.wait),
            MigCommand::Destroy(a) => (a.target, MigChange::Destroy(a.instance), a.drain, a.wait),
            MigCommand::Prepare(a) => (a.target, MigChange::Prepare(a.layout), false, a.wait),
        };
        change_mig(ctx, target, change, drain, wait).await
    }
}

/// Sends one change, waits if asked, and prints the plan (and the GPU afterwards).
async fn change_mig(
    ctx: &mut Ctx<'_>,
    MigTarget { node, gpu }: MigTarget,
    change: MigChange,
    drain: bool,
    MigWait { wait, timeout }: MigWait,
) -> anyhow::Result<ExitCode> {
    let client = ctx.client().await?;
    let plan = client.change_mig(node, gpu, change, drain).await?;
    let after = if wait && !plan.is_unchanged() {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        let show = |status: &GpuStatus| {
            if let Some(bar) = &bar {
                bar.set_message(mig_progress(node, status));
            }
        };
        let done = client.wait_mig_layout_with(node, gpu, timeout, show).await;
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        Some(done?)
    } else {
        None
    };
    if ctx.json {
        ctx.emit_json(&serde_json::json!({ "plan": plan, "after": after }))?;
    } else {
        let mut text = render_plan(&plan);
        if let Some(gpu) = &after {
            text.push_str(&format!(
                "done: GPU {} is now {}\n",
                gpu.info.index,
                layout_of(&gpu.info)
            ));
            if let Some(report) = &gpu.last_reconfiguration {
                text.push_str(&format!("took: {}\n", render_phases(report)));
            }
        }
        ctx.emit(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a reconfiguration took: the wait for its slices, then each phase.
pub fn render_phases(report: &MigReport) -> String {
    let ReconfigurationCost {
        destroyed,
        created,
        destroy,
        create,
        library_load,
        model_load,
    } = report.phases;
    let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    let whole = Duration::from_millis(report.done_ms.saturating_sub(report.asked_ms));
    let waited = whole.saturating_sub(report.phases.total());
    format!(
        "{} from the request ({} waiting for slices); destroy {destroyed} in {}, create \
         {created} in {}, library load {}, model load {}",
        secs(whole),
        secs(waited),
        secs(destroy),
        secs(create),
        secs(library_load),
        secs(model_load),
    )
}

/// How a reconfiguration goes, for `mig apply --wait`'s progress line.
fn mig_progress(node: NodeId, status: &GpuStatus) -> String {
    let gpu = status.info.index;
    match &status.reconfiguring {
        None => format!("GPU {gpu} of node {node}: done"),
        Some(p) if !p.waiting_for.is_empty() => format!(
            "GPU {gpu} of node {node}: reconfiguring to {} · waiting for tasks {} to finish \
             on the slices it replaces",
            p.target,
            ids(&p.waiting_for)
        ),
        Some(p) => format!(
            "GPU {gpu} of node {node}: reconfiguring to {} · the worker destroys {} slice(s) \
             and creates the new ones",
            p.target,
            p.retiring.len()
        ),
    }
}

/// The text of `escher mig apply`.
pub fn render_plan(plan: &MigPlan) -> String {
    if plan.is_unchanged() {
        return format!(
            "GPU {} of node {} already has layout {}; nothing to do\n",
            plan.gpu, plan.node, plan.to
        );
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    let waiting = if plan.waiting_for.is_empty() {
        "nothing".to_string()
    } else {
        format!("tasks {} to finish (draining)", ids(&plan.waiting_for))
    };
    key_values(&[
        ("gpu", format!("{} of node {}", plan.gpu, plan.node)),
        ("from", plan.from.clone()),
        ("to", plan.to.clone()),
        ("destroy", list(&plan.destroy)),
        ("create", list(&plan.create)),
        ("waits for", waiting),
        (
            "estimated",
            format!("{:.1} s on hardware", plan.estimated.as_secs_f64()),
        ),
    ])
}

/// The explicit layout of a GPU's slices, or what it is when it has none.
fn layout_of(gpu: &GpuInfo) -> String {
    if !gpu.mig_enabled {
        return "a whole GPU (not in MIG mode)".to_string();
    }
    if gpu.slices.is_empty() {
        return "in MIG mode with no slices".to_string();
    }
    let entries: Vec<String> = gpu.slices.iter().map(|s| s.placement_text()).collect();
    entries.join(",")
}

/// The text of `escher gpus`: per node, one line per device (a whole GPU, or each MIG slice),
/// with its holders, then any reconfiguration in progress or failed.
pub fn render_gpus(nodes: &[NodeGpus]) -> String {
    if nodes.is_empty() {
        return "no node reports GPUs\n".to_string();
    }
    let mut out = String::new();
    for (i, node) in nodes.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let alive = if node.alive { "" } else { ", down" };
        out.push_str(&format!("node {} ({}{alive})\n", node.node, node.name));
        let mut t = table(&[
            "GPU", "MODEL", "MIG", "DEVICE", "PROFILE", "SLICES", "MEMORY", "HELD BY",
        ]);
        let mut notes = Vec::new();
        for gpu in &node.gpus {
            add_gpu_rows(&mut t, gpu);
            if let Some(p) = &gpu.reconfiguring {
                let waiting = if p.waiting_for.is_empty() {
                    "in progress".to_string()
                } else {
                    format!("waiting for tasks {}", ids(&p.waiting_for))
                };
                notes.push(format!(
                    "  GPU {}: reconfiguring to {} ({waiting})",
                    gpu.info.index, p.target
                ));
            }
            if let Some(e) = &gpu.last_error {
                notes.push(format!(
                    "  GPU {}: last reconfiguration failed: {e}",
                    gpu.info.index
                ));
            } else if let Some(report) = &gpu.last_reconfiguration {
                notes.push(format!(
                    "  GPU {}: last reconfiguration (to {}): {}",
                    gpu.info.index,
                    report.target,
                    render_phases(report)
                ));
            }
        }
        out.push_str(&lines(&t));
        for note in notes {
            out.push_str(&note);
            out.push('\n');
        }
    }
    out
}

fn add_gpu_rows(t: &mut comfy_table::Table, gpu: &GpuStatus) {
    let info = &gpu.info;
    let model = if info.simulated {
        format!("{} (simulated)", info.model_label())
    } else {
        info.model_label()
    };
    let held = |uuid: &str| {
        let holders: Vec<String> = gpu
            .holders
            .iter()
            .filter(|h| h.uuid == uuid)
            .map(|h| {
                if h.amount == Amount::ONE {
                    format!("task {}", h.task)
                } else {
                    format!("task {} ({})", h.task, h.amount)
                }
            })
            .collect();
        if holders.is_empty() {
            "-".to_string()
        } else {
            holders.join(", ")
        }
    };
    if !info.mig_enabled {
        t.add_row(vec![
            info.index.to_string(),
            model,
            "no".into(),
            info.uuid.clone(),
            "-".into(),
            "-".into(),
            format!("{} MiB", info.memory_mib),
            held(&info.uuid),
        ]);
        return;
    }
    if info.slices.is_empty() {
        t.add_row(vec![
            info.index.to_string(),
            model,
            "yes".into(),
            format!("{} (no slices)", info.uuid),
            "-".into(),
            "-".into(),
            format!("{} MiB", info.memory_mib),
            "-".into(),
        ]);
        return;
    }
    let retiring = |uuid: &str| {
        gpu.reconfiguring
            .as_ref()
            .is_some_and(|p| p.retiring.iter().any(|r| r == uuid))
    };
    let mut slices: Vec<_> = info.slices.iter().collect();
    slices.sort_by_key(|s| s.start);
    for (i, s) in slices.into_iter().enumerate() {
        let first = i == 0;
        let profile = if retiring(&s.uuid) {
            format!("{} (retiring)", s.profile)
        } else {
            s.profile.clone()
        };
        t.add_row(vec![
            if first {
                info.index.to_string()
            } else {
                String::new()
            },
            if first { model.clone() } else { String::new() },
            if first { "yes".into() } else { String::new() },
            s.uuid.clone(),
            profile,
            format!("{}-{}", s.start, (s.start + s.size).saturating_sub(1)),
            format!("{} MiB", s.memory_mib),
            held(&s.uuid),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::TaskId;
    use escher_proto::mig::{GpuModel, LatencyModel, Layout};
    use escher_proto::types::{DeviceHolder, MigDevice, MigProgress};

    use super::*;

    fn node() -> NodeGpus {
        let a100 = GpuInfo {
            index: 0,
            uuid: "GPU-a".into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            memory_mib: 40960,
            mig_enabled: true,
            simulated: true,
            slices: vec![
                MigDevice {
                    profile: "3g.20gb".into(),
                    start: 4,
                    size: 4,
                    memory_mib: 19968,
                    uuid: "MIG-d".into(),
                },
                MigDevice {
                    profile: "1g.5gb".into(),
                    start: 0,
                    size: 1,
                    memory_mib: 4864,
                    uuid: "MIG-a".into(),
                },
            ],
        };
        let h100 = GpuInfo {
            index: 1,
            uuid: "GPU-h".into(),
            product: "NVIDIA H100 80GB HBM3".into(),
            model: Some(GpuModel::H100_80GB),
            memory_mib: 81920,
            mig_enabled: false,
            simulated: false,
            slices: vec![],
        };
        let holder = |uuid: &str, task, amount: &str| DeviceHolder {
            uuid: uuid.into(),
            task: TaskId(task),
            amount: amount.parse().unwrap(),
        };
        NodeGpus {
            node: NodeId(1),
            name: "box".into(),
            alive: true,
            gpus: vec![
                GpuStatus {
                    info: a100,
                    holders: vec![holder("MIG-a", 7, "1")],
                    reconfiguring: Some(MigProgress {
                        target: "1g.5gb@0,1g.5gb@1".into(),
                        retiring: vec!["MIG-d".into()],
                        waiting_for: vec![],
                        since_ms: 0,
                    }),
                    last_error: None,
                    last_reconfiguration: Some(MigReport {
                        target: "1g.5gb@0,3g.20gb@4".into(),
                        asked_ms: 10_000,
                        done_ms: 18_100,
                        // One slice replaced by another: MIGRator's 6 s, phase by phase.
                        phases: LatencyModel::default().cost(
                            &Layout::parse(GpuModel::A100_40GB, "2g.10gb@0").unwrap(),
                            &Layout::parse(GpuModel::A100_40GB, "1g.5gb@0").unwrap(),
                        ),
                        error: None,
                    }),
                },
                GpuStatus {
                    info: h100,
                    holders: vec![holder("GPU-h", 8, "0.5"), holder("GPU-h", 9, "0.5")],
                    reconfiguring: None,
                    last_error: Some("in use".into()),
                    last_reconfiguration: None,
                },
            ],
        }
    }

    #[test]
    fn gpus_table() {
        let text = render_gpus(&[node()]);
        let expected = "\
node 1 (box)
 GPU  MODEL                  MIG  DEVICE  PROFILE             SLICES  MEMORY     HELD BY
 0    a100-40gb (simulated)  yes  MIG-a   1g.5gb              0-0     4864 MiB   task 7
                                  MIG-d   3g.20gb (retiring)  4-7     19968 MiB  -
 1    h100-80gb              no   GPU-h   -                   -       81920 MiB  task 8 (0.5), task 9 (0.5)
  GPU 0: reconfiguring to 1g.5gb@0,1g.5gb@1 (in progress)
  GPU 0: last reconfiguration (to 1g.5gb@0,3g.20gb@4): 8.1 s from the request (2.1 s waiting for slices); destroy 1 in 0.5 s, create 1 in 1.5 s, library load 1.5 s, model load 2.5 s
  GPU 1: last reconfiguration failed: in use
";
        assert_eq!(text, expected, "\n{text}");
        assert_eq!(render_gpus(&[]), "no node reports GPUs\n");
    }

    #[test]
    fn plan_text() {
        let plan = MigPlan {
            node: NodeId(1),
            gpu: 0,
            from: "7g.40gb@0".into(),
            to: "4g.20gb@0,3g.20gb@4".into(),
            destroy: vec!["7g.40gb@0".into()],
            create: vec!["4g.20gb@0".into(), "3g.20gb@4".into()],
            waiting_for: vec![TaskId(3)],
            estimated: Duration::from_millis(11_500),
        };
        let text = render_plan(&plan);
        assert!(text.contains("destroy:    7g.40gb@0"), "{text}");
        assert!(text.contains("create:     4g.20gb@0 3g.20gb@4"), "{text}");
        assert!(text.contains("tasks 3 to finish (draining)"), "{text}");
        assert!(text.contains("11.5 s on hardware"), "{text}");
        let same = MigPlan {
            destroy: vec![],
            create: vec![],
            ..plan
        };
        assert!(render_plan(&same).contains("nothing to do"));
    }

    #[test]
    fn mig_wait_progress_says_what_it_waits_for() {
        let mut status = node().gpus.remove(0);
        status.reconfiguring = Some(MigProgress {
            target: "7g.40gb@0".into(),
            retiring: vec!["MIG-a".into(), "MIG-b".into()],
            waiting_for: vec![TaskId(3), TaskId(4)],
            since_ms: 0,
        });
        let line = mig_progress(NodeId(1), &status);
        assert_eq!(
            line,
            "GPU 0 of node 1: reconfiguring to 7g.40gb@0 · waiting for tasks 3 4 to finish \
             on the slices it replaces"
        );
        status.reconfiguring.as_mut().unwrap().waiting_for.clear();
        assert!(
            mig_progress(NodeId(1), &status)
                .ends_with("destroys 2 slice(s) and creates the new ones"),
        );
        status.reconfiguring = None;
        assert_eq!(mig_progress(NodeId(1), &status), "GPU 0 of node 1: done");
    }
}
