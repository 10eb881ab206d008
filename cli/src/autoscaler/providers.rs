//! Providers: what starts and stops the autoscaler's workers. [`Provider`] is the interface
//! (docs/ARCHITECTURE.md); [`DockerProvider`] runs containers of the project's image on the
//! local Docker engine, [`SlurmProvider`] submits the worker script of `deploy/slurm` with
//! `sbatch`. A Kubernetes provider is the next one: `start` creates a pod of the image with
//! the same command, `stop` deletes it, `check` asks the API server.
//!
//! Providers run commands (`docker`, `sbatch`, `scancel`) rather than speaking the engines'
//! APIs: that is what an operator runs by hand, and every error they print is the reason the
//! autoscaler's status shows.

use std::fmt::Debug;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why a provider could not do what it was asked; shown as is in the autoscaler's status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(pub String);

/// What one worker is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLaunch {
    /// Its name (unique in the group; also its `--name` where the provider chooses it).
    pub name: String,
    /// The head's URL(s) as the worker reaches them.
    pub head: String,
    /// Its labels, `K=V,...` (the autoscaler's own among them).
    pub labels: String,
    /// Its resources beyond CPU and memory, `K=V,...` (may be empty).
    pub resources: String,
    /// Its CPUs, if set.
    pub cpus: Option<u32>,
    /// Its memory in MiB, if set.
    pub memory_mib: Option<u64>,
}

impl WorkerLaunch {
    /// The `escher-worker` flags every provider passes (the head, the name is the provider's).
    pub fn worker_args(&self) -> Vec<String> {
        let mut args = vec![format!("--labels={}", self.labels)];
        if !self.resources.is_empty() {
            args.push(format!("--resources={}", self.resources));
        }
        if let Some(c) = self.cpus {
            args.push(format!("--cpus={c}"));
        }
        if let Some(m) = self.memory_mib {
            args.push(format!("--memory={m}"));
        }
        args
    }
}

/// Starts and stops workers. Calls block (they run commands); the autoscaler calls them off
/// its async loop. Implement it for another system (Kubernetes: pods) and hand it to
/// `escher_cli::autoscaler::run`.
pub trait Provider: Send + Sync + Debug {
    /// Its name in the status (`docker`, `slurm`).
    fn name(&self) -> &str;
    /// Whether it can start workers now: `Err` says why not (no Docker engine, no `sbatch`).
    fn check(&self) -> Result<(), ProviderError>;
    /// Starts one worker; answers the handle to stop it with (a container, a job id).
    fn start(&self, worker: &WorkerLaunch) -> Result<String, ProviderError>;
    /// Stops the worker of `handle` (already gone is not an error).
    fn stop(&self, handle: &str) -> Result<(), ProviderError>;
}

/// How long one provider command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// Runs `command` for at most [`COMMAND_LIMIT`]; its stdout, or an error with its stderr.
fn run(command: &mut Command) -> Result<String, ProviderError> {
    let shown = format!("{:?}", command.get_program());
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ProviderError(format!("cannot run {shown}: {e}")))?;
    let deadline = Instant::now() + COMMAND_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProviderError(format!(
                    "{shown} did not finish within {}s",
                    COMMAND_LIMIT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(ProviderError(format!("waiting for {shown}: {e}"))),
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| ProviderError(format!("reading {shown}'s output: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        Err(ProviderError(format!(
            "{shown} failed ({}): {}",
            output.status,
            if stderr.is_empty() { stdout } else { stderr }
        )))
    }
}

/// Workers in containers of the project's image (`deploy/build-image`) on the local Docker
/// engine, on the host's network (so the head's URL is the same as on the host), with the
/// worker credential mounted read-only. Containers are named `NAME` and labelled
/// `escher.autoscaler=GROUP`; `stop` removes them.
#[derive(Debug, Clone)]
pub struct DockerProvider {
    /// The `docker` command.
    pub docker: PathBuf,
    /// The image (it has `escher-worker` on its PATH).
    pub image: String,
    /// The worker credential file on the host.
    pub credential: PathBuf,
    /// The group, as the containers' label.
    pub group: String,
}

impl Provider for DockerProvider {
    fn name(&self) -> &str {
        "docker"
    }

    fn check(&self) -> Result<(), ProviderError> {
        run(Command::new(&self.docker).args(["version", "--format", "{{.Server.Version}}"]))
            .map_err(|e| ProviderError(format!("no Docker engine: {e}")))?;
        run(Command::new(&self.docker).args([
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            &self.image,
        ]))
        .map_err(|e| ProviderError(format!("image {} is not there: {e}", self.image)))?;
        Ok(())
    }

    fn start(&self, worker: &WorkerLaunch) -> Result<String, ProviderError> {
        let credential = self.credential.canonicalize().map_err(|e| {
            ProviderError(format!(
                "worker credential {}: {e}",
                self.credential.display()
            ))
        })?;
        let mount = format!(
            "{}:/var/lib/escher/credential/worker.json:ro",
            credential.display()
        );
        let mut command = Command::new(&self.docker);
        command
            .args([
                "run",
                "--detach",
                "--init",
                "--network",
                "host",
                "--name",
                &worker.name,
            ])
            .arg(format!("--label=escher.autoscaler={}", self.group))
            .args(["--volume", &mount, &self.image, "escher-worker"])
            .arg(format!("--head={}", worker.head))
            .arg("--access-file=/var/lib/escher/credential/worker.json")
            .arg(format!("--name={}", worker.name))
            .arg("--state-dir=/var/lib/escher/worker")
            .arg("--log-dir=/var/lib/escher/worker/logs")
            .args(worker.worker_args());
        let id = run(&mut command)?;
        if id.is_empty() {
            return Err(ProviderError("docker run printed no container id".into()));
        }
        Ok(worker.name.clone())
    }

    fn stop(&self, handle: &str) -> Result<(), ProviderError> {
        match run(Command::new(&self.docker).args(["rm", "--force", handle])) {
            Ok(_) => Ok(()),
            Err(e) if e.0.contains("No such container") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Workers in Slurm jobs: `sbatch` of the worker script (`deploy/slurm/escher-workers.sbatch`),
/// one node per job, with `ESCHER_HEAD`, the credential and the worker's labels and
/// resources in its environment; `stop` is `scancel` (the job's workers drain on SIGTERM).
#[derive(Debug, Clone)]
pub struct SlurmProvider {
    /// The directory of `sbatch` and `scancel` (`None`: found on PATH).
    pub bin_dir: Option<PathBuf>,
    /// The worker script.
    pub script: PathBuf,
    /// The worker credential file, where every Slurm node reads it.
    pub credential: PathBuf,
    /// More `sbatch` flags (`--partition=gpu`, `--time=4:00:00`, `--account=...`).
    pub sbatch_args: Vec<String>,
}

impl SlurmProvider {
    fn tool(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }
}

impl Provider for SlurmProvider {
    fn name(&self) -> &str {
        "slurm"
    }

    fn check(&self) -> Result<(), ProviderError> {
        if !self.script.is_file() {
            return Err(ProviderError(format!(
                "no worker script at {}",
                self.script.display()
            )));
        }
        run(Command::new(self.tool("sbatch")).arg("--version"))
            .map_err(|e| ProviderError(format!("no sbatch: {e}")))?;
        Ok(())
    }

    fn start(&self, worker: &WorkerLaunch) -> Result<String, ProviderError> {
        let mut export = format!(
            "ALL,ESCHER_HEAD={},ESCHER_WORKER_CREDENTIAL={},ESCHER_WORKER_LABELS={}",
            worker.head,
            self.credential.display(),
            worker.labels.replace(',', ";")
        );
        if !worker.resources.is_empty() {
            export.push_str(&format!(
                ",ESCHER_WORKER_RESOURCES={}",
                worker.resources.replace(',', ";")
            ));
        }
        let mut command = Command::new(self.tool("sbatch"));
        command
            .arg("--parsable")
            .arg(format!("--job-name={}", worker.name))
            .arg("--nodes=1")
            .arg(format!("--export={export}"))
            .args(&self.sbatch_args)
            .arg(&self.script);
        let out = run(&mut command)?;
        // `--parsable` prints `JOBID` or `JOBID;CLUSTER`.
        let id = out.split(';').next().unwrap_or_default().trim();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err(ProviderError(format!("sbatch printed no job id: {out:?}")));
        }
        Ok(id.to_string())
    }

    fn stop(&self, handle: &str) -> Result<(), ProviderError> {
        run(Command::new(self.tool("scancel")).arg(handle)).map(|_| ())
    }
}
