//! The peers, run in the same invocation as escher's workloads (`--peers`): Ray (W1, W2, W3,
//! placement groups for W7) and HyperQueue (command tasks). Each is a small Python driver of
//! ours in `benches/peers/`, run with the harness' virtual environment; it prints one line
//! `RESULT {json}` with its figures under the keys that escher's figures name in `peer_key`.

pub mod venv;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::report::{PeerFigure, WorkloadReport};
use crate::size::Params;
use crate::workloads::Workload;

/// What a driver reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DriverResult {
    /// Figures by key, in the unit of the escher figure that names the key.
    pub values: BTreeMap<String, f64>,
    /// Versions and settings, for the record.
    #[serde(default)]
    pub info: serde_json::Value,
}

/// One peer's outcome in a run.
#[derive(Debug, Clone, Serialize)]
pub struct PeerOutcome {
    /// `ray` or `hyperqueue`.
    pub peer: String,
    /// Its figures, or why there are none.
    pub result: Result<DriverResult, String>,
    /// Where its output went.
    pub log: PathBuf,
}

/// Runs the peers the selected workloads compare with. Never fails: a peer that cannot run
/// is reported with the reason. The harness calls it right after each escher workload, with
/// that one workload, so that escher and its peer are measured minutes apart at most on a
/// machine whose load drifts.
pub async fn run(selected: &[Workload], params: &Params, out: &Path) -> Vec<PeerOutcome> {
    let tag = selected
        .iter()
        .map(|w| w.id())
        .collect::<Vec<_>>()
        .join("-");
    let ray_args = ray_args(selected, params);
    let hq = selected.contains(&Workload::Cmd);
    if ray_args.is_empty() && !hq {
        return Vec::new();
    }
    let python = match tokio::task::spawn_blocking(venv::ensure).await {
        Ok(Ok(python)) => python,
        Ok(Err(e)) => return failed_all(&ray_args, hq, out, format!("{e:#}")),
        Err(e) => return failed_all(&ray_args, hq, out, e.to_string()),
    };
    let mut outcomes = Vec::new();
    if !ray_args.is_empty() {
        let log = out.join(format!("peer-ray-{tag}.log"));
        let result = driver(
            &python,
            "ray_driver.py",
            &ray_args,
            &log,
            Duration::from_secs(1_800),
        )
        .await
        .map_err(|e| format!("{e:#}"));
        outcomes.push(PeerOutcome {
            peer: "ray".into(),
            result,
            log,
        });
    }
    if hq {
        let log = out.join(format!("peer-hyperqueue-{tag}.log"));
        let args = vec![
            "--tasks".to_string(),
            params.cmd_tasks.to_string(),
            "--cores".into(),
            "8".into(),
        ];
        let result = driver(
            &python,
            "hq_driver.py",
            &args,
            &log,
            Duration::from_secs(900),
        )
        .await
        .map_err(|e| format!("{e:#}"));
        outcomes.push(PeerOutcome {
            peer: "hyperqueue".into(),
            result,
            log,
        });
    }
    outcomes
}

fn failed_all(ray_args: &[String], hq: bool, out: &Path, why: String) -> Vec<PeerOutcome> {
    let mut v = Vec::new();
    if !ray_args.is_empty() {
        v.push(PeerOutcome {
            peer: "ray".into(),
            result: Err(why.clone()),
            log: out.to_path_buf(),
        });
    }
    if hq {
        v.push(PeerOutcome {
            peer: "hyperqueue".into(),
            result: Err(why),
            log: out.to_path_buf(),
        });
    }
    v
}

/// The Ray driver's arguments for the selected workloads (empty: Ray is not needed).
fn ray_args(selected: &[Workload], p: &Params) -> Vec<String> {
    let mut args = Vec::new();
    let join = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if selected.contains(&Workload::W1) {
        args.extend(["--w1".to_string(), join(&p.w1_tasks)]);
    }
    if selected.contains(&Workload::W2) {
        args.extend(["--w2".to_string(), p.w2_round_trips.to_string()]);
    }
    if selected.contains(&Workload::W3) {
        args.extend([
            "--w3".to_string(),
            format!("{}x{}", p.w3_clients, p.w3_tasks_per_client),
        ]);
    }
    if selected.contains(&Workload::W7) {
        args.extend([
            "--pg".to_string(),
            p.w7_pg_rate.to_string(),
            "--gang".to_string(),
            format!("{}x{}x{}", p.w7_clients, p.w7_gangs_per_client, p.w7_gang),
            "--gang-slots".to_string(),
            (p.w7_nodes * p.w7_cpus).to_string(),
        ]);
    }
    if selected.contains(&Workload::Actors) {
        args.extend([
            "--actors".to_string(),
            format!(
                "{}x{}x{}",
                p.actor_round_trips, p.actor_pipelined, p.actor_creations
            ),
        ]);
    }
    if !args.is_empty() {
        args.extend(["--num-cpus".to_string(), "8".to_string()]);
    }
    args
}

/// Runs `script` with `args` (at most `limit`), its output to `log`; parses its `RESULT` line.
async fn driver(
    python: &Path,
    script: &str,
    args: &[String],
    log: &Path,
    limit: Duration,
) -> anyhow::Result<DriverResult> {
    let script = venv::scripts_dir().join(script);
    let cwd = tempfile::tempdir()?;
    let log_file = std::fs::File::create(log)?;
    eprintln!(
        "escher-bench: running {} {}",
        script.display(),
        args.join(" ")
    );
    let child = Command::new(python)
        .arg("-I")
        .arg(&script)
        .args(args)
        .current_dir(cwd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", script.display()))?;
    let output = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => output?,
        Err(_) => bail!("{} did not finish within {limit:?}", script.display()),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    std::fs::write(log.with_extension("stdout"), stdout.as_bytes())?;
    if !output.status.success() {
        bail!(
            "{} exited with {} (see {})",
            script.display(),
            output.status,
            log.display()
        );
    }
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .with_context(|| format!("{} printed no RESULT line", script.display()))?;
    Ok(serde_json::from_str(line)?)
}

/// Puts each peer's figure and the ratio escher/peer beside escher's figures that name it.
pub fn apply(reports: &mut [WorkloadReport], outcomes: &[PeerOutcome]) {
    for outcome in outcomes {
        let Ok(result) = &outcome.result else {
            continue;
        };
        for figure in reports.iter_mut().flat_map(|r| r.figures.iter_mut()) {
            let Some((peer, key)) = figure.peer_key.as_deref().and_then(|k| k.split_once(':'))
            else {
                continue;
            };
            if peer != outcome.peer {
                continue;
            }
            if let Some(&value) = result.values.get(key)
                && value > 0.0
            {
                figure.peer = Some(PeerFigure {
                    peer: peer.to_string(),
                    value,
                    ratio: figure.escher / value,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Figure;
    use crate::size::Size;

    #[test]
    fn ray_is_asked_only_for_what_was_selected() {
        let p = Params::at(Size::Tiny);
        assert!(ray_args(&[Workload::W4, Workload::Cmd], &p).is_empty());
        let args = ray_args(&[Workload::W1, Workload::W7], &p);
        assert_eq!(args[0], "--w1");
        assert!(args.contains(&"--pg".to_string()));
        assert!(!args.contains(&"--w2".to_string()));
    }

    #[test]
    fn peer_figures_land_beside_escher_figures() {
        let mut r = WorkloadReport::new("w1", "t", "tiny");
        r.figures
            .push(Figure::new("w1.x", "x", "tasks/s", 100.0).vs("ray", "w1.10"));
        r.figures.push(Figure::new("w1.y", "y", "tasks/s", 1.0));
        let outcome = PeerOutcome {
            peer: "ray".into(),
            result: Ok(DriverResult {
                values: [("w1.10".to_string(), 4.0)].into(),
                info: serde_json::Value::Null,
            }),
            log: PathBuf::new(),
        };
        let mut reports = vec![r];
        apply(&mut reports, &[outcome]);
        let peer = reports[0].figures[0].peer.as_ref().unwrap();
        assert_eq!((peer.value, peer.ratio), (4.0, 25.0));
        assert!(reports[0].figures[1].peer.is_none());
    }
}
