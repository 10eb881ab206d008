//! `escher-autoscaler`: grows a group of workers while tasks wait for a node and gives back
//! workers that idle (docs/shared-cluster.md); everything is in `escher_cli::autoscaler`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use escher_cli::autoscaler::{
    self, Config, DockerProvider, Policy, Provider, Report, SlurmProvider,
};
use escher_client::{Client, Credentials};
use escher_proto::ResourceSet;

/// Starts workers through a provider (Docker, Slurm) for pending tasks, and drains and stops
/// workers that idle.
#[derive(Debug, Parser)]
#[command(name = "escher-autoscaler", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the autoscaler until SIGINT or SIGTERM
    Run(Box<RunArgs>),
    /// Print what a running (or stopped) autoscaler last decided, from its status file
    Status {
        /// The status file `run` writes.
        #[arg(long, default_value = "autoscaler-status.json")]
        status_file: PathBuf,
        /// Print the JSON as is.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProviderKind {
    Docker,
    Slurm,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The head's URL(s), as the autoscaler reaches them.
    #[arg(long, env = "ESCHER_HEAD")]
    head: String,
    /// The admin's access file (the autoscaler drains nodes: an admin's right).
    #[arg(long, env = "ESCHER_ACCESS_FILE")]
    access_file: PathBuf,
    /// The head's URL(s) as the workers reach them (default: --head).
    #[arg(long)]
    worker_head: Option<String>,
    /// The worker-only credential the workers join with (`escher token create --role worker`).
    #[arg(long)]
    worker_credential: PathBuf,
    /// Which provider starts workers.
    #[arg(long, value_enum)]
    provider: ProviderKind,
    /// The group's name (its workers' label `autoscaler-group`).
    #[arg(long, default_value = "autoscaled")]
    group: String,
    /// What one worker offers, `cpu=N,memory=MIB,K=V...` (cpu and memory become --cpus and
    /// --memory; the rest --resources).
    #[arg(long)]
    worker_shape: ResourceSet,
    /// More labels for the workers, `K=V,...`.
    #[arg(long, default_value = "")]
    worker_labels: String,
    /// The fewest workers.
    #[arg(long, default_value_t = 0)]
    min_workers: usize,
    /// The most workers at once.
    #[arg(long)]
    max_workers: usize,
    /// How long a task waits before it counts as demand.
    #[arg(long, default_value = "2s")]
    pending_for: humantime::Duration,
    /// How long a worker holds nothing before it is drained and stopped.
    #[arg(long, default_value = "5m")]
    idle_for: humantime::Duration,
    /// How long a launched worker may take to join.
    #[arg(long, default_value = "5m")]
    start_timeout: humantime::Duration,
    /// The most worker-hours the group spends in all (none: no limit).
    #[arg(long)]
    budget_worker_hours: Option<f64>,
    /// The pause between ticks.
    #[arg(long, default_value = "2s")]
    interval: humantime::Duration,
    /// Where the status goes (read by `escher-autoscaler status`, and at a restart).
    #[arg(long, default_value = "autoscaler-status.json")]
    status_file: PathBuf,
    /// Docker: the image (`deploy/build-image`).
    #[arg(long, default_value = "escher:local")]
    image: String,
    /// Docker: the docker command.
    #[arg(long, default_value = "docker")]
    docker: PathBuf,
    /// Slurm: the worker script.
    #[arg(long, default_value = "deploy/slurm/escher-workers.sbatch")]
    sbatch_script: PathBuf,
    /// Slurm: the directory of sbatch and scancel (default: PATH).
    #[arg(long)]
    slurm_bin_dir: Option<PathBuf>,
    /// Slurm: one more sbatch flag (repeatable), e.g. --sbatch-arg=--partition=cpu.
    #[arg(long, allow_hyphen_values = true)]
    sbatch_arg: Vec<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Cmd::Status { status_file, json } => match Report::read(&status_file) {
            Ok(r) if json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("a report serializes")
                );
                ExitCode::SUCCESS
            }
            Ok(r) => {
                print!("{}", r.render());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("escher-autoscaler: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Run(args) => {
            let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
            match runtime.block_on(run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("escher-autoscaler: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.max_workers == 0 || args.min_workers > args.max_workers {
        anyhow::bail!(
            "--max-workers must be at least 1 and at least --min-workers ({} > {})",
            args.min_workers,
            args.max_workers
        );
    }
    if let Some(b) = args
        .budget_worker_hours
        .filter(|b| !b.is_finite() || *b <= 0.0)
    {
        anyhow::bail!("--budget-worker-hours must be a positive number of hours, not {b}");
    }
    if args.worker_shape.is_empty() {
        anyhow::bail!("--worker-shape names no resource: give at least cpu=N");
    }
    let amount = |name: &str| -> anyhow::Result<Option<u64>> {
        if !args.worker_shape.contains(name) {
            return Ok(None);
        }
        let a = args.worker_shape.get(name).as_f64();
        if a.fract() != 0.0 || a < 1.0 {
            anyhow::bail!("--worker-shape's {name} must be a whole number, not {a}");
        }
        Ok(Some(a as u64))
    };
    let cpus = amount("cpu")?.map(|c| c as u32);
    let memory = amount("memory")?;
    let resources: Vec<String> = args
        .worker_shape
        .iter()
        .filter(|(n, _)| n.as_str() != "cpu" && n.as_str() != "memory")
        .map(|(n, a)| format!("{n}={a}"))
        .collect();
    let credentials =
        Credentials::from_access_file(&args.access_file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = Client::connect_with(&args.head, credentials).await?;
    let provider: Arc<dyn Provider> = match args.provider {
        ProviderKind::Docker => Arc::new(DockerProvider {
            docker: args.docker.clone(),
            image: args.image.clone(),
            credential: args.worker_credential.clone(),
            group: args.group.clone(),
        }),
        ProviderKind::Slurm => Arc::new(SlurmProvider {
            bin_dir: args.slurm_bin_dir.clone(),
            script: args.sbatch_script.clone(),
            credential: args.worker_credential.clone(),
            sbatch_args: args.sbatch_arg.clone(),
        }),
    };
    let config = Config {
        policy: Policy {
            min_workers: args.min_workers,
            max_workers: args.max_workers,
            worker_shape: args.worker_shape.clone(),
            pending_for: args.pending_for.into(),
            idle_for: args.idle_for.into(),
            start_timeout: args.start_timeout.into(),
            budget_worker_seconds: args.budget_worker_hours.map(|h| h * 3600.0),
        },
        group: args.group.clone(),
        worker_head: args
            .worker_head
            .clone()
            .unwrap_or_else(|| args.head.clone()),
        worker_resources: resources.join(","),
        worker_cpus: cpus,
        worker_memory_mib: memory,
        worker_labels: args.worker_labels.clone(),
        status_file: args.status_file.clone(),
        interval: Duration::from(args.interval).max(Duration::from_millis(100)),
    };
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    autoscaler::run(client, provider, config, stop).await
}
