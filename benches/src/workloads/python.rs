//! Python: escher beside Ray, each from one Python driver of its own, in the same run:
//! no-op remote functions submitted one `.remote()` at a time (tasks/s;
//! target ≥ 3× Ray's), escher's batched `f.map` (no Ray figure: Ray has no batch submit), the
//! `f.remote()` then `get` round trip (p50; target ≤ ½ of Ray's), remote functions given a
//! 1 MiB argument (tasks/s), and actors: a method call's round trip (p50), pipelined calls
//! (calls/s) and an actor created then called once (p50), whose targets
//! [`super::actors::targets`] checks.
//!
//! The measuring is `python/bench/compare.py` (the script users run by hand), here with its
//! `--one SYSTEM` mode: one process per system, escher's first, then Ray's. Both run with the
//! harness' own virtual environment (`.venv-bench`, where the peers' pins live, Ray among them),
//! into which this workload installs the `escher` package from this checkout first
//! (`pip install ./python`: maturin builds it with the release profile, in the workspace's
//! target directory, so a second run rebuilds nothing). Each system gets 4 CPUs: Ray
//! `num_cpus=4`; escher one embedded worker with `cpu=4`, so 4 warm interpreters.
//!
//! Not part of `all`: it needs PyPI (Ray) and builds the wheel. Name it:
//! `escher-bench python --size full`. Its targets are checked when it ran ([`targets`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::process::Command;

use super::Ctx;
use crate::peers::venv;
use crate::report::{Figure, PeerFigure, TargetCheck, WorkloadReport, num, ratio};
use crate::size::Size;

/// How long installing the package (a release build of the native module) may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(2_400);
/// How long one system's measurement may take.
const DRIVER_LIMIT: Duration = Duration::from_secs(900);

/// The figures, by the key `compare.py` prints them under: (id, what, unit, compared with Ray).
const FIGURES: [(&str, &str, &str, bool); 7] = [
    (
        "noop_tasks_per_s",
        "no-op remote functions, one `.remote()` each, then one get of all",
        "tasks/s",
        true,
    ),
    (
        "noop_batched_tasks_per_s",
        "no-op remote functions submitted with `f.map` (one request), then one get",
        "tasks/s",
        false,
    ),
    (
        "round_trip_p50_ms",
        "`f.remote()` then get of a no-op, one at a time, p50",
        "ms",
        true,
    ),
    (
        "one_mib_args_tasks_per_s",
        "remote functions given a 1 MiB argument (50 submitted, then one get)",
        "tasks/s",
        true,
    ),
    (
        "actor_round_trip_p50_ms",
        "actor method call then get, one at a time, p50",
        "ms",
        true,
    ),
    (
        "actor_calls_per_s",
        "actor method calls made with `.remote()` in a loop, then one get of all",
        "calls/s",
        true,
    ),
    (
        "actor_create_to_first_call_p50_ms",
        "an actor (one CPU) created, its first call answered, then killed: p50 of 30",
        "ms",
        true,
    ),
];

/// Runs the Python workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let tasks = match ctx.size {
        Size::Tiny => 200,
        Size::Small => 1_000,
        Size::Full => 2_000,
    };
    let mut report = WorkloadReport::new(
        "python",
        "Python remote functions from one Python driver: escher beside Ray",
        ctx.size.as_str(),
    );
    let python = tokio::task::spawn_blocking(venv::ensure)
        .await
        .context("the benchmark venv")??;
    let installed = install_escher(&python, &ctx.out).await?;
    let script = venv::workspace_root()
        .join("python")
        .join("bench")
        .join("compare.py");
    let escher = one(&python, &script, "escher", tasks, &ctx.out).await?;
    let ray = match one(&python, &script, "ray", tasks, &ctx.out).await {
        Ok(values) => Some(values),
        Err(e) => {
            report
                .notes
                .push(format!("Ray did not run, so no ratio: {e:#}"));
            None
        }
    };
    report.setup = json!({
        "driver": "python/bench/compare.py --one SYSTEM, one process per system, escher first",
        "escher": "escher.init(num_workers=1, resources={\"cpu\": 4}): 4 warm interpreters",
        "ray": format!("ray.init(num_cpus=4), Ray {}", pinned("ray")),
        "tasks": tasks,
        "round_trips": 200,
        "one_mib_tasks": 50,
        "actor_round_trips": 1_000,
        "actor_calls": actor_calls(tasks),
        "actors_created": 30,
        "package": installed,
    });
    for (key, what, unit, compared) in FIGURES {
        let Some(value) = escher.get(key).and_then(Value::as_f64) else {
            bail!("compare.py printed no {key} for escher: {escher}");
        };
        let what = if key.starts_with("noop") {
            format!("{} {what}", num(tasks as f64))
        } else if key == "actor_calls_per_s" {
            format!("{} {what}", num(actor_calls(tasks) as f64))
        } else {
            what.to_string()
        };
        let mut figure = Figure::new(format!("python.{key}"), what, unit, value);
        if compared
            && let Some(peer) = ray
                .as_ref()
                .and_then(|r| r.get(key))
                .and_then(Value::as_f64)
            && peer > 0.0
        {
            figure.peer = Some(PeerFigure {
                peer: "ray".into(),
                value: peer,
                ratio: value / peer,
            });
        }
        report.figures.push(figure);
    }
    report.detail = json!({"escher": escher, "ray": ray});
    report.notes.push(
        "`.remote()` sends its task without waiting for the head's answer (a loop of them \
         shares requests on the client's submission stream); a 1 MiB argument travels inside \
         the task's spec (client, head, worker, the interpreter's pipe), where Ray puts it once \
         in its shared-memory object store"
            .into(),
    );
    Ok(report)
}

/// How many pipelined actor calls `compare.py` makes for `tasks` tasks.
fn actor_calls(tasks: usize) -> usize {
    tasks * 5
}

/// The version the peers' pins give `package`.
pub(crate) fn pinned(package: &str) -> &'static str {
    venv::PINS
        .iter()
        .find(|(p, _)| *p == package)
        .map_or("?", |(_, v)| v)
}

/// Installs the `escher` package of this checkout into the venv of `python` (a release build
/// of the native module, in the workspace's target directory); its version, for the record.
pub(crate) async fn install_escher(python: &Path, out: &Path) -> anyhow::Result<String> {
    let root = venv::workspace_root();
    let log = out.join("python-install.log");
    eprintln!(
        "escher-bench: pip install ./python into {} (a release build; see {}) ...",
        python.display(),
        log.display()
    );
    let log_file = std::fs::File::create(&log)?;
    let mut child = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--force-reinstall",
        ])
        .arg("./python")
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .context("cannot run pip in the benchmark venv")?;
    match tokio::time::timeout(INSTALL_LIMIT, child.wait()).await {
        Ok(status) => {
            let status = status?;
            if !status.success() {
                bail!(
                    "pip install ./python failed ({status}); see {}",
                    log.display()
                );
            }
        }
        Err(_) => bail!(
            "pip install ./python did not finish within {INSTALL_LIMIT:?}; see {}",
            log.display()
        ),
    }
    let version = Command::new(python)
        .args([
            "-c",
            "from importlib import metadata; print(metadata.version('escher'))",
        ])
        .output()
        .await?;
    Ok(String::from_utf8_lossy(&version.stdout).trim().to_string())
}

/// One system's figures: `compare.py --one SYSTEM`'s JSON line.
async fn one(
    python: &Path,
    script: &Path,
    system: &str,
    tasks: usize,
    out: &Path,
) -> anyhow::Result<Value> {
    one_of("python", python, script, system, tasks, out).await
}

/// One system's figures from a bench script of `python/bench/` run with `--one SYSTEM
/// --tasks N` (its last JSON line); its stderr in `WORKLOAD-SYSTEM.log` of `out`.
pub(crate) async fn one_of(
    workload: &str,
    python: &Path,
    script: &Path,
    system: &str,
    tasks: usize,
    out: &Path,
) -> anyhow::Result<Value> {
    let log: PathBuf = out.join(format!("{workload}-{system}.log"));
    eprintln!("escher-bench: {workload} {system} ({tasks} tasks) ...");
    let cwd = tempfile::tempdir()?;
    let child = Command::new(python)
        .arg(script)
        .args(["--one", system, "--tasks", &tasks.to_string()])
        .current_dir(cwd.path())
        .env_remove("ESCHER_HEAD")
        .env_remove("ESCHER_PYTHON")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", script.display()))?;
    let output = match tokio::time::timeout(DRIVER_LIMIT, child.wait_with_output()).await {
        Ok(output) => output?,
        Err(_) => bail!("{system} did not finish within {DRIVER_LIMIT:?}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{system} exited with {} (see {})",
            output.status,
            log.display()
        );
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("{system} printed no result (see {})", log.display()))?;
    Ok(serde_json::from_str(line)?)
}

/// The Python targets, checked where the workload ran (none otherwise): no-op remote
/// functions from one client ≥ 3× Ray's, and the round trip's p50 ≤ ½ of Ray's.
pub fn targets(figs: &[&Figure]) -> Vec<TargetCheck> {
    let find = |id: &str| figs.iter().copied().find(|f| f.id == id);
    let mut checks = Vec::new();
    if let Some(f) = find("python.noop_tasks_per_s") {
        let target = "Python no-op remote functions from one Python client ≥ 3× Ray's";
        checks.push(match &f.peer {
            Some(p) => TargetCheck {
                target: target.into(),
                measured: format!(
                    "{} vs Ray {} tasks/s = {}",
                    num(f.escher),
                    num(p.value),
                    ratio(p.ratio)
                ),
                met: Some(p.ratio >= 3.0),
            },
            None => TargetCheck {
                target: target.into(),
                measured: format!("{} tasks/s; Ray did not run", num(f.escher)),
                met: None,
            },
        });
    }
    if let Some(f) = find("python.round_trip_p50_ms") {
        let target = "Python `f.remote()` then get, p50 ≤ ½ of Ray's";
        checks.push(match &f.peer {
            Some(p) => TargetCheck {
                target: target.into(),
                measured: format!(
                    "p50 {} ms vs Ray {} ms = {}",
                    num(f.escher),
                    num(p.value),
                    ratio(p.ratio)
                ),
                met: Some(p.ratio <= 0.5),
            },
            None => TargetCheck {
                target: target.into(),
                measured: format!("p50 {} ms; Ray did not run", num(f.escher)),
                met: None,
            },
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_only_where_the_workload_ran() {
        assert!(targets(&[]).is_empty());
        let mut fast = Figure::new("python.noop_tasks_per_s", "x", "tasks/s", 3_000.0);
        fast.peer = Some(PeerFigure {
            peer: "ray".into(),
            value: 600.0,
            ratio: 5.0,
        });
        let mut slow = Figure::new("python.round_trip_p50_ms", "y", "ms", 2.0);
        slow.peer = Some(PeerFigure {
            peer: "ray".into(),
            value: 2.0,
            ratio: 1.0,
        });
        let checks = targets(&[&fast, &slow]);
        assert_eq!(checks.len(), 2);
        assert_eq!((checks[0].met, checks[1].met), (Some(true), Some(false)));
    }
}
