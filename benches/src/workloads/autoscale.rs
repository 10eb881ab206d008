//! Autoscaling: how long a pending task waits for a worker that `escher-autoscaler` starts
//! for it, through each provider, and how long an idle worker lasts before it is given back.
//!
//! A head (`escher-head`, a process of its own) starts with no worker. `escher-autoscaler run`
//! watches it with one provider at a time:
//!
//! - **docker**: the project's image, made from this build's binaries (`deploy/make-base-image`
//!   and `deploy/build-image`, nothing pulled), one container per worker on the host's network;
//! - **slurm**: a Slurm of the harness' own on this machine (munged, slurmctld and slurmd with a
//!   configuration in a temporary directory, one node of 2 CPUs), `sbatch` of
//!   `deploy/slurm/escher-workers.sbatch`.
//!
//! Each round submits one command task (`sleep 1`, `cpu=1`) to the empty cluster and records,
//! polling every 50 ms: submit → the new worker's node alive at the head; submit → the task
//! running on it; the task's end → the worker gone (its node no longer alive and its container
//! or job removed), which includes the autoscaler's `--idle-for` (4 s) and the drain.
//! The autoscaler runs with `--pending-for 0s --interval 250ms`, so up to 250 ms of each wait
//! is its polling. Medians and maxima over the rounds.
//!
//! Not part of `all`: it needs root, a Docker engine and Slurm's daemons (Debian's `slurm-wlm`,
//! which `.ci/run` installs). Name it: `escher-bench autoscale --size full`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::types::TaskState;
use escher::{Client, Task};
use serde_json::json;

use super::Ctx;
use crate::head_process::{HeadProcess, find_bin, find_head_bin};
use crate::peers::venv::workspace_root;
use crate::report::{Figure, WorkloadReport};
use crate::size::Size;

/// How often the harness looks at the head, the containers and the Slurm queue.
const POLL: Duration = Duration::from_millis(50);
/// The autoscaler's `--idle-for`.
const IDLE_FOR: &str = "4s";
/// How long one step of a round may take.
const STEP_LIMIT: Duration = Duration::from_secs(180);

/// One round: seconds from submit to the node alive and to the task running, and from the
/// task's end to the worker gone.
#[derive(Debug, Clone, Copy)]
struct Round {
    registered_s: f64,
    running_s: f64,
    gone_s: f64,
}

/// Runs the autoscale workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let rounds = match ctx.size {
        Size::Tiny => 1,
        Size::Small => 2,
        Size::Full => 5,
    };
    let mut report = WorkloadReport::new(
        "autoscale",
        "autoscaling: a pending task to a worker started for it, and an idle worker given \
         back, through the Docker and the Slurm providers",
        ctx.size.as_str(),
    );
    let bins = Bins::find(ctx)?;
    let docker = provider_rounds(&bins, Provider::Docker, rounds).await?;
    let slurm = provider_rounds(&bins, Provider::Slurm, rounds).await?;
    for (name, list) in [("docker", &docker), ("slurm", &slurm)] {
        let pick = |f: fn(&Round) -> f64| list.iter().map(f).collect::<Vec<f64>>();
        let steps = [
            (
                "registered",
                "a pending task's submission to the new worker's node alive at the head",
                pick(|r| r.registered_s),
            ),
            (
                "running",
                "a pending task's submission to the task running on the new worker",
                pick(|r| r.running_s),
            ),
            (
                "gone",
                "the worker's last task ended to the worker gone (idle 4 s, drained, stopped)",
                pick(|r| r.gone_s),
            ),
        ];
        for (key, what, mut values) in steps {
            values.sort_by(f64::total_cmp);
            let median = values[values.len() / 2];
            let max = values[values.len() - 1];
            report.figures.push(Figure::new(
                format!("autoscale.{name}.{key}_p50_s"),
                format!("{name}: {what}, median of {rounds}"),
                "s",
                median,
            ));
            report.figures.push(Figure::new(
                format!("autoscale.{name}.{key}_max_s"),
                format!("{name}: {what}, the longest of {rounds}"),
                "s",
                max,
            ));
        }
    }
    report.setup = json!({
        "rounds": rounds,
        "task": "sleep 1, cpu=1, submitted to a cluster with no worker",
        "autoscaler": format!("--worker-shape cpu=2 --max-workers 1 --pending-for 0s \
                               --idle-for {IDLE_FOR} --interval 250ms"),
        "docker": "the project's image from this build's binaries, on the host's network",
        "slurm": "munged, slurmctld and slurmd of the harness' own, one node of 2 CPUs; \
                  sbatch of deploy/slurm/escher-workers.sbatch",
        "poll_ms": POLL.as_millis(),
    });
    report.detail = json!({
        "docker": docker.iter().map(|r| json!([r.registered_s, r.running_s, r.gone_s])).collect::<Vec<_>>(),
        "slurm": slurm.iter().map(|r| json!([r.registered_s, r.running_s, r.gone_s])).collect::<Vec<_>>(),
    });
    report.notes.push(
        "each wait includes up to 250 ms of the autoscaler's polling and up to 50 ms of the \
         harness'; the worker's own start (process, registration, stream) is in both providers"
            .into(),
    );
    Ok(report)
}

/// The binaries the providers start: this build's, so that the image and the jobs run what is
/// measured.
struct Bins {
    head: PathBuf,
    worker: PathBuf,
    cli: PathBuf,
    autoscaler: PathBuf,
}

impl Bins {
    fn find(ctx: &Ctx) -> anyhow::Result<Bins> {
        Ok(Bins {
            head: find_head_bin(ctx.head_bin.as_deref())?,
            worker: find_bin("escher-worker", "escher-worker")?,
            cli: find_bin("escher-cli", "escher")?,
            autoscaler: find_bin("escher-cli", "escher-autoscaler")?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Docker,
    Slurm,
}

/// What a provider leaves behind, removed when dropped (also when a round fails): the
/// autoscaler, the containers and images of the group, the Slurm daemons.
struct Scope {
    group: String,
    images: Vec<String>,
    autoscaler: Option<std::process::Child>,
    slurm: Option<Slurm>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(mut child) = self.autoscaler.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for id in containers(&self.group) {
            let _ = Command::new("docker").args(["rm", "--force", &id]).output();
        }
        for image in &self.images {
            let _ = Command::new("docker")
                .args(["rmi", "--force", image])
                .output();
        }
    }
}

/// `rounds` rounds through `provider`, against a head of their own.
async fn provider_rounds(
    bins: &Bins,
    provider: Provider,
    rounds: usize,
) -> anyhow::Result<Vec<Round>> {
    let group = format!(
        "escher-bench-{}-{}",
        match provider {
            Provider::Docker => "docker",
            Provider::Slurm => "slurm",
        },
        std::process::id()
    );
    let mut scope = Scope {
        group: group.clone(),
        images: Vec::new(),
        autoscaler: None,
        slurm: None,
    };
    let head = HeadProcess::start(&bins.head, &[]).await?;
    let client = Client::connect(head.url()).await?;
    let dir = tempfile::tempdir()?;
    let status_file = dir.path().join("autoscaler.json");
    let credential = dir.path().join("worker.json");
    std::fs::copy(head.access_file(), &credential).context("the worker's credential")?;
    set_mode_600(&credential)?;
    let mut command = Command::new(&bins.autoscaler);
    command.args(["run", "--group", &group]);
    match provider {
        Provider::Docker => {
            let bin_dir = bins.worker.parent().context("a bin dir")?;
            let base = format!("{group}-base:bench");
            let image = format!("{group}:bench");
            scope.images.push(base.clone());
            run_ok(
                Command::new(workspace_root().join("deploy/make-base-image"))
                    .args(["--tag", &base])
                    .args([&bins.head, &bins.worker, &bins.cli]),
            )?;
            scope.images.push(image.clone());
            run_ok(
                Command::new(workspace_root().join("deploy/build-image"))
                    .arg("--bin-dir")
                    .arg(bin_dir)
                    .args(["--base", &base, "--tag", &image]),
            )?;
            command.args(["--provider", "docker", "--image", &image]);
        }
        Provider::Slurm => {
            let slurm = Slurm::start()?;
            slurm.wait_idle().await?;
            command
                .args(["--provider", "slurm"])
                .arg("--sbatch-script")
                .arg(workspace_root().join("deploy/slurm/escher-workers.sbatch"))
                .arg(format!(
                    "--sbatch-arg=--output={}/job-%j.out",
                    dir.path().display()
                ))
                .env("SLURM_CONF", slurm.conf())
                .env("ESCHER_WORKER_BIN", &bins.worker);
            scope.slurm = Some(slurm);
        }
    }
    command
        .args(["--head", head.url()])
        .arg("--access-file")
        .arg(head.access_file())
        .arg("--worker-credential")
        .arg(&credential)
        .args(["--worker-shape", "cpu=2", "--max-workers", "1"])
        .args(["--pending-for", "0s", "--idle-for", IDLE_FOR])
        .args(["--interval", "250ms"])
        .arg("--status-file")
        .arg(&status_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("autoscaler.log"))?);
    scope.autoscaler = Some(command.spawn().context("cannot start escher-autoscaler")?);

    let mut out = Vec::new();
    for round in 0..rounds {
        let result = one_round(&client, &scope).await.with_context(|| {
            let status = std::fs::read_to_string(&status_file).unwrap_or_default();
            let log =
                std::fs::read_to_string(dir.path().join("autoscaler.log")).unwrap_or_default();
            format!("{provider:?} round {round}: the autoscaler's status: {status}\nits log: {log}")
        })?;
        eprintln!(
            "escher-bench: autoscale {provider:?} round {round}: alive {:.2} s, running {:.2} s, \
             gone {:.2} s",
            result.registered_s, result.running_s, result.gone_s
        );
        out.push(result);
    }
    drop(scope);
    head.stop().await;
    Ok(out)
}

/// One task to the empty cluster, and its worker back.
async fn one_round(client: &Client, scope: &Scope) -> anyhow::Result<Round> {
    until("no worker alive before the round", || async move {
        Ok(alive(client).await? == 0 && provider_empty(scope))
    })
    .await?;
    let submitted = Instant::now();
    let task = client
        .submit(Task::command(["sleep", "1"]).resources_str("cpu=1"))
        .await?
        .id();
    let mut registered = None;
    let running = loop {
        if registered.is_none() && alive(client).await? > 0 {
            registered = Some(submitted.elapsed());
        }
        let state = client.task_info(task).await?.status.state;
        if state != TaskState::Pending {
            break submitted.elapsed();
        }
        if submitted.elapsed() > STEP_LIMIT {
            bail!("the task was still pending after {STEP_LIMIT:?}");
        }
        tokio::time::sleep(POLL).await;
    };
    let registered = registered.unwrap_or(running);
    client.wait([task], 1, Some(STEP_LIMIT)).await?;
    let info = client.task_info(task).await?;
    if info.status.state != TaskState::Succeeded {
        bail!("the task did not succeed: {:?}", info.status);
    }
    let ended = Instant::now();
    until("the idle worker to be gone", || async move {
        Ok(alive(client).await? == 0 && provider_empty(scope))
    })
    .await?;
    Ok(Round {
        registered_s: registered.as_secs_f64(),
        running_s: running.as_secs_f64(),
        gone_s: ended.elapsed().as_secs_f64(),
    })
}

/// The nodes alive at the head.
async fn alive(client: &Client) -> anyhow::Result<usize> {
    Ok(client
        .cluster_status()
        .await?
        .nodes
        .iter()
        .filter(|n| n.alive)
        .count())
}

/// Whether the provider holds no worker: no container of the group, no Slurm job.
fn provider_empty(scope: &Scope) -> bool {
    match &scope.slurm {
        Some(slurm) => slurm.queue().is_empty(),
        None => containers(&scope.group).is_empty(),
    }
}

/// Polls `check` every [`POLL`] until it says yes, for at most [`STEP_LIMIT`].
async fn until<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(());
        }
        if start.elapsed() > STEP_LIMIT {
            bail!("waited {STEP_LIMIT:?} for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The containers of `group`, stopped ones too.
fn containers(group: &str) -> Vec<String> {
    let filter = format!("label=escher.autoscaler={group}");
    Command::new("docker")
        .args(["ps", "--all", "--quiet", "--filter", &filter])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `command`, failing with what it printed.
fn run_ok(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn set_mode_600(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A Slurm of the harness' own on this machine (munged, slurmctld, slurmd with a configuration
/// in a temporary directory), stopped by their pid files when dropped.
struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    fn start() -> anyhow::Result<Slurm> {
        for daemon in ["munged", "slurmctld", "slurmd", "sbatch"] {
            if run_ok(Command::new("sh").args(["-c", &format!("command -v {daemon}")])).is_err() {
                bail!(
                    "{daemon} is not installed: the Slurm provider needs Debian's slurm-wlm \
                     (apt-get install slurm-wlm), and root"
                );
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("escher-bench-slurm-")
            .tempdir()?;
        let d = dir.path().display().to_string();
        let host = run_ok(Command::new("hostname").arg("-s"))?;
        for sub in ["spool", "ctld"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut key)?;
        let key_file = dir.path().join("munge.key");
        std::fs::write(&key_file, key)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400))?;
        }
        // A port of this run's own (two: the controller's and the daemon's).
        let port = 30000 + (std::process::id() % 20000) as u16;
        let conf = format!(
            "ClusterName=escherbench\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={port}\n\
             SlurmdPort={}\nAuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\n\
             CredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/ctld\n\
             SlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\nSlurmctldLogFile={d}/slurmctld.log\n\
             SlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
             PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            port + 1
        );
        std::fs::write(dir.path().join("slurm.conf"), conf)?;
        let slurm = Slurm { dir };
        run_ok(Command::new("munged").args([
            format!("--key-file={d}/munge.key"),
            format!("--socket={d}/munge.sock"),
            format!("--pid-file={d}/munged.pid"),
            format!("--log-file={d}/munged.log"),
            format!("--seed-file={d}/munge.seed"),
        ]))?;
        run_ok(Command::new("slurmctld").args(["-c", "-f", &slurm.conf()]))?;
        run_ok(Command::new("slurmd").args(["-f", &slurm.conf()]))?;
        Ok(slurm)
    }

    fn conf(&self) -> String {
        self.dir.path().join("slurm.conf").display().to_string()
    }

    /// Waits until the node is idle (the daemons are up and talking).
    async fn wait_idle(&self) -> anyhow::Result<()> {
        let conf = self.conf();
        until("the Slurm node to be idle", || {
            let conf = conf.clone();
            async move {
                let out = Command::new("sinfo")
                    .args(["--noheader", "--format=%t"])
                    .env("SLURM_CONF", conf)
                    .output()?;
                Ok(String::from_utf8_lossy(&out.stdout).contains("idle"))
            }
        })
        .await
    }

    /// The job ids in the queue.
    fn queue(&self) -> Vec<String> {
        Command::new("squeue")
            .args(["--noheader", "--format=%i"])
            .env("SLURM_CONF", self.conf())
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for daemon in ["slurmd", "slurmctld", "munged"] {
            let pid_file = self.dir.path().join(format!("{daemon}.pid"));
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                let _ = Command::new("kill").arg(pid.trim()).output();
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
