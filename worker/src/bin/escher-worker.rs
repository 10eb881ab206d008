//! `escher-worker`: runs a node agent that registers this machine with an escher head and runs
//! the tasks it assigns (docs/DESIGN.md §9).
//!
//! Thin by design: parse flags into [`WorkerArgs`], turn them into a validated
//! [`WorkerConfig`], install tracing (`RUST_LOG`), and run the library's [`Worker`] until
//! Ctrl-C or SIGTERM, which drain it gracefully.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use escher_proto::{Labels, ResourceSet};
use escher_worker::{DEFAULT_HEAD, LogRetention, WorkerBuilder, WorkerConfig, scaled_latency};

/// The worker allocates and frees small objects from many threads at once (messages, task records,
/// output buffers). jemalloc's per-thread caches serve that better than glibc's locked arenas
/// (BENCHMARKS.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The version `--version` prints: the package's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ESCHER_COMMIT"),
    ")"
);

/// Run an escher worker: register this machine's resources with the head and run its tasks.
#[derive(Debug, Parser)]
#[command(name = "escher-worker", version = VERSION)]
struct WorkerArgs {
    /// The head's URL; for a replicated head, every replica's URL, comma-separated (the
    /// worker follows whichever leads).
    /// [default: the heads of the access file, else http://127.0.0.1:7600]
    #[arg(long, env = "ESCHER_HEAD", value_name = "URL[,URL...]")]
    head: Option<String>,

    /// Where the worker keeps its node id and secret, so that it comes back as the same node
    /// after it restarts [default: $ESCHER_HOME/workers/NAME with --name, else
    /// $ESCHER_HOME/worker; ESCHER_HOME defaults to ~/.escher]. Each worker on a machine needs
    /// its own; remove it to join as a new node.
    #[arg(long, env = "ESCHER_WORKER_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// Refused: a command line is readable by every user of the machine (`ps`,
    /// `/proc/PID/cmdline`), so the join token never goes there. Kept only to say so.
    #[arg(long, value_name = "TOKEN", hide = true)]
    token: Option<String>,

    /// A file holding the token to join with (the `worker_token` of the head's access file,
    /// or an admin token), alone, readable by its owner only (mode 0600)
    /// [default: ESCHER_TOKEN, else the access file]
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,

    /// The head's access file, to take the join token from [default: ESCHER_ACCESS_FILE,
    /// else $ESCHER_HOME/access.json, ESCHER_HOME defaulting to ~/.escher]
    #[arg(long, value_name = "PATH")]
    access_file: Option<PathBuf>,

    /// The certificate (PEM) to trust for an https:// head [default: the access file's]
    #[arg(long, value_name = "PEM")]
    ca: Option<PathBuf>,

    /// The worker's name [default: HOSTNAME-PID].
    #[arg(long, value_name = "NAME")]
    name: Option<String>,

    /// Static resources, e.g. `ssd=1,license.x=4`; `cpu=` or `memory=` replace the detected
    /// amounts.
    #[arg(long, value_name = "K=V,...", value_parser = parse_resources)]
    resources: Option<ResourceSet>,

    /// Node labels, e.g. `zone=a,rack=12`.
    #[arg(long, value_name = "K=V,...", value_parser = parse_labels)]
    labels: Option<Labels>,

    /// The number of CPUs to report [default: detected].
    #[arg(long, value_name = "N")]
    cpus: Option<u64>,

    /// The MiB of memory to report [default: detected MemTotal].
    #[arg(long, value_name = "MIB")]
    memory: Option<u64>,

    /// Where task logs go [default: a temporary directory, removed on exit].
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,

    /// Remove task logs last written longer ago than this (`90s`, `12h`, `7days`); the logs of
    /// running attempts always stay. The head keeps the last 4 KiB of each finished attempt's
    /// output either way.
    #[arg(long, value_name = "DURATION", default_value_t = LogRetention::default().max_age.into())]
    log_retention: humantime::Duration,

    /// While task logs take more than this many bytes, remove the oldest.
    #[arg(long, value_name = "BYTES", default_value_t = LogRetention::default().max_bytes)]
    log_max_bytes: u64,

    /// Whom command tasks run as: `auto` runs each namespace's tasks as a user of their own
    /// (uids 300000-365535) when the worker may change user (root, or CAP_SETUID, CAP_SETGID
    /// and CAP_CHOWN) and as the worker's user otherwise, with a warning; a range such as
    /// `400000-400999` uses those uids and refuses to start without the privilege; `off` runs
    /// every task as the worker's user.
    #[arg(long, value_name = "auto|off|FIRST-LAST", default_value = "auto")]
    task_uids: escher_worker::exec::TaskUsers,

    /// Refuse to start unless tasks run as users of their own (tenants isolated on this node).
    #[arg(long)]
    require_isolation: bool,

    /// Hold command tasks by their process group only, without a cgroup of their own (by
    /// default each gets one where the worker may create it, so that a process that leaves the
    /// task's process group is still killed with it)
    #[arg(long)]
    no_task_cgroups: bool,

    /// The processes (threads included) each task may have at once (a command, or the Python
    /// interpreter of a Python task or actor), held by the `pids` controller in the task's
    /// cgroup: a fork bomb fills its own cgroup, not the node
    #[arg(long, value_name = "N", default_value_t = escher_worker::exec::DEFAULT_TASK_PIDS_MAX)]
    task_pids_max: u64,

    /// The most bytes of each output stream (stdout, stderr) a command task's log keeps; past
    /// it, output is dropped and the log ends with one line that says so. Checked every 100 ms
    /// while the task runs, and when it ends
    #[arg(long, value_name = "BYTES", default_value_t = escher_worker::exec::DEFAULT_TASK_LOG_BYTES)]
    task_log_bytes: u64,

    /// Where the tasks' homes and scratch directories are made (default: the system's
    /// temporary directory, TMPDIR or /tmp)
    #[arg(long, value_name = "DIR")]
    task_dir: Option<std::path::PathBuf>,

    /// The size in bytes of each command task's scratch when it asks for no `disk`: on a root
    /// worker every command task gets a tmpfs of its own, of its `disk` request or this size,
    /// as its HOME, TMPDIR and working directory, unmounted when it ends. A task that fills it
    /// fails with a reason that says so; its pages count against its memory limit
    #[arg(long, value_name = "BYTES", default_value_t = escher_worker::exec::DEFAULT_TASK_SCRATCH_BYTES)]
    task_scratch_bytes: u64,

    /// Give command tasks no scratch of their own: they write in their namespace's home, on
    /// the disk of --task-dir
    #[arg(long)]
    no_task_scratch: bool,

    /// Let command tasks share the host's /tmp, /var/tmp and /dev/shm. By default each command
    /// task that has a scratch (a root worker) gets its scratch as its /tmp, /var/tmp and
    /// /dev/shm too, in a mount namespace of its own, so that it can neither fill the host's
    /// nor read or leave files another tenant's task uses there. With this flag every tenant's
    /// tasks can fill the host's /tmp and read, replace or pre-create what another tenant's
    /// task leaves in a world-writable directory; use it only where tasks must reach files the
    /// host keeps under /tmp. The node's escher.tmp label says private or host
    #[arg(long)]
    no_private_tmp: bool,

    /// The free space to keep on the file systems of the log directory and --task-dir: `5%`,
    /// `512MiB`, `1GiB`, or `0` for none. While one has less free, the node starts no new task
    /// (it waits, unstarted, for space; heartbeats say `disk_under_reserve`) and running
    /// tasks' logs stop where they are, with one line that says why. By default 5% of the
    /// file system, at most 1 GiB
    #[arg(long, value_name = "SIZE|PERCENT")]
    disk_reserve: Option<escher_worker::exec::Reserve>,

    /// This node ends after this long (`2h`, `90m`): it carries its end as the labels
    /// `escher.ends-at` and `escher.drain-at`, and --walltime-margin before the end the head
    /// drains it (nothing new is admitted; running tasks finish) and labels it
    /// `escher.ending-soon=true`. Inside a Slurm job, the job's end (SLURM_JOB_END_TIME) is the
    /// default
    #[arg(long, value_name = "DURATION")]
    walltime: Option<humantime::Duration>,

    /// How long before the walltime's end the node stops taking new work
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    walltime_margin: humantime::Duration,

    /// Refuse to start unless this node holds every task (a command, a Python task or actor) to
    /// its limits: `cpu` as a CPU quota, `memory` as a memory limit (a task that asked for none
    /// gets what no running task asked for of the node's memory, at least 64 MiB), and
    /// --task-pids-max. Without it,
    /// a worker that cannot hold one (no cgroup, no such controller, a read-only hierarchy)
    /// starts, warns, and names what it does not hold in its `escher.limits.missing` label
    #[arg(long)]
    require_limits: bool,

    /// Run in the host's PID namespace. By default a worker that may (root) runs itself and
    /// its tasks in a PID namespace of their own, so that no task outlives the worker, not
    /// even a kill of every escher process at once; its tasks then see their own `/proc`
    #[arg(long)]
    no_pid_namespace: bool,

    /// Which cgroup hierarchy holds the task cgroups: `v2` (the unified hierarchy), `v1` (the
    /// cgroup v1 freezer, for hosts that mount only v1), or `auto`: v2 where the worker may
    /// create cgroups there, else v1
    #[arg(long, value_name = "auto|v2|v1", default_value = "auto")]
    task_cgroup_hierarchy: escher_worker::exec::Hierarchy,

    /// Offer no Python slots. By default the worker runs Python tasks (`@escher.remote`
    /// functions of the `escher` package) when it has a usable interpreter, CPython 3.9 or later
    /// that imports cloudpickle: the one ESCHER_PYTHON names (a path or a name on PATH; `auto`
    /// for python3, `off` for none), else python3 on PATH. It checks once, at start, and logs
    /// what it found or why it offers none; a worker without Python has no `shared/python`
    /// resource, so Python tasks wait for a worker that has one
    #[arg(long)]
    no_python: bool,

    /// A variable of the worker's environment to pass to command tasks (repeatable). Tasks get
    /// only PATH, LANG, LANGUAGE, LC_*, TZ, TERM and TMPDIR of it otherwise; escher's own
    /// variables (the worker's token among them) never pass.
    #[arg(long, value_name = "NAME")]
    pass_env: Vec<String>,

    /// The most bytes of objects this node's object store holds in memory; past it, cold
    /// objects are spilled to --object-spill-dir [default: 30% of the node's memory]
    #[arg(long, value_name = "BYTES")]
    object_store_memory: Option<u64>,

    /// The directory, a tmpfs, the object store keeps objects in (a directory of its own is
    /// made there, removed when the worker ends) [default: /dev/shm]
    #[arg(long, value_name = "DIR")]
    object_store_dir: Option<PathBuf>,

    /// The directory, on a disk, cold objects are spilled to [default: the state directory]
    #[arg(long, value_name = "DIR")]
    object_spill_dir: Option<PathBuf>,

    /// Seconds a stopped command gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    grace: f64,

    /// Seconds running tasks may go on after Ctrl-C or SIGTERM before they are cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    drain: f64,

    /// A simulated GPU (repeatable): `h100-80gb` is a whole GPU, and
    /// `a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb` one in MIG mode with those slices. Models:
    /// a100-40gb, a100-80gb, h100-80gb, h200-141gb. An illegal layout is refused with the
    /// reason.
    #[arg(long = "sim-gpu", value_name = "SPEC")]
    sim_gpu: Vec<String>,

    /// Multiplies the time simulated MIG reconfigurations take (MIGRator's figures: 0.5 s per
    /// slice destroyed, 5.5 s per slice created); 0 makes them instant.
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0)]
    sim_mig_latency_scale: f64,

    /// Do not look for real NVIDIA GPUs (NVML): report simulated ones only.
    #[arg(long)]
    no_nvml: bool,

    /// Print what this worker would report (resources, labels, GPUs and MIG slices, and each
    /// real GPU's MIG profile table beside escher's) and exit, without joining a head.
    /// Reads only: nothing on the GPUs changes.
    #[arg(long)]
    detect: bool,
}

/// Why `--token` is refused, and what to do instead.
const TOKEN_ON_COMMAND_LINE: &str = "--token puts the join token on the command line, which every \
    user of this machine can read (ps, /proc/PID/cmdline); give it in a file readable by the \
    worker's user only (--token-file PATH, mode 0600), in the environment (ESCHER_TOKEN), or with \
    the credential file of `escher token create --role worker --out FILE` (--access-file FILE)";

/// The join token in the file at `path`: its only content (surrounding white space aside), in
/// a file no other user may read.
fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("--token-file {shown}: cannot read it: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "--token-file {shown}: other users may read it (mode {mode:o}); `chmod 600 {shown}`"
        );
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--token-file {shown}: cannot read it: {e}"))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        anyhow::bail!(
            "--token-file {shown}: give a file holding the join token alone (the worker_token \
             of the head's access file)"
        );
    }
    Ok(token.to_string())
}

fn parse_resources(s: &str) -> Result<ResourceSet, String> {
    s.parse()
        .map_err(|e: escher_proto::TypeError| e.to_string())
}

fn parse_labels(s: &str) -> Result<Labels, String> {
    let labels: Labels = s
        .parse()
        .map_err(|e: escher_proto::TypeError| e.to_string())?;
    if let Some((key, _)) = labels
        .iter()
        .find(|(k, _)| escher_proto::types::is_reserved_label(k))
    {
        return Err(format!(
            "label {key:?} starts with \"escher.\", which escher keeps for the labels it sets \
             itself; choose another key"
        ));
    }
    Ok(labels)
}

/// Seconds from a flag as a duration: finite, not negative, at most a day.
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(0.0..=86_400.0).contains(&secs) {
        anyhow::bail!("--{flag} {secs}: give a number of seconds from 0 to 86400");
    }
    Ok(Duration::from_secs_f64(secs))
}

impl TryFrom<WorkerArgs> for WorkerConfig {
    type Error = anyhow::Error;

    fn try_from(args: WorkerArgs) -> anyhow::Result<WorkerConfig> {
        let file = match &args.access_file {
            Some(path) => Some(escher_proto::access::AccessFile::read(path)?),
            None => None,
        };
        if args.token.is_some() {
            anyhow::bail!("{TOKEN_ON_COMMAND_LINE}");
        }
        let token = match &args.token_file {
            Some(path) => Some(read_token_file(path)?),
            None => file.as_ref().map(|f| f.worker_token.clone()),
        };
        let tls_trust = match &args.ca {
            Some(path) => Some((std::fs::read_to_string(path)?, None)),
            None => file
                .as_ref()
                .and_then(|f| Some((f.ca_cert.clone()?, f.tls_name.clone()))),
        };
        let config = WorkerConfig {
            token,
            tls_trust,
            head: match args.head.filter(|h| !h.trim().is_empty()) {
                Some(head) => head,
                None => file
                    .as_ref()
                    .cloned()
                    .or_else(|| escher_worker::head_access(""))
                    .filter(|f| !f.heads.is_empty())
                    .map_or_else(|| DEFAULT_HEAD.to_string(), |f| f.heads.join(",")),
            },
            state_dir: args
                .state_dir
                .or_else(|| escher_worker::default_state_dir(args.name.as_deref())),
            name: args.name,
            resources: args.resources.unwrap_or_default(),
            cpus: args.cpus,
            memory_mib: args.memory,
            labels: args.labels.unwrap_or_default(),
            walltime: match args.walltime {
                Some(length) => Some(escher_worker::Walltime::from_now(
                    length.into(),
                    args.walltime_margin.into(),
                )),
                None => escher_worker::Walltime::from_slurm(args.walltime_margin.into()),
            },
            log_dir: args.log_dir,
            task_users: args.task_uids,
            require_isolation: args.require_isolation,
            task_cgroups: !args.no_task_cgroups,
            task_cgroup_hierarchy: args.task_cgroup_hierarchy,
            task_pids_max: args.task_pids_max,
            task_log_bytes: args.task_log_bytes,
            require_limits: args.require_limits,
            task_dir: args.task_dir,
            task_scratch: !args.no_task_scratch,
            private_tmp: !args.no_private_tmp,
            task_scratch_bytes: args.task_scratch_bytes,
            disk_reserve: args
                .disk_reserve
                .unwrap_or(escher_worker::exec::DEFAULT_DISK_RESERVE),
            python: if args.no_python {
                escher_worker::PythonDetection::Off
            } else {
                escher_worker::PythonDetection::Detect
            },
            pass_env: args.pass_env,
            object_store_memory: args.object_store_memory,
            object_store_dir: args.object_store_dir,
            object_spill_dir: args.object_spill_dir,
            log_retention: LogRetention {
                max_age: args.log_retention.into(),
                max_bytes: args.log_max_bytes,
            },
            grace: seconds("grace", args.grace)?,
            drain: seconds("drain", args.drain)?,
            sim_gpus: args.sim_gpu,
            discover_gpus: !args.no_nvml,
            sim_mig_latency: {
                if !(0.0..=1000.0).contains(&args.sim_mig_latency_scale) {
                    anyhow::bail!(
                        "--sim-mig-latency-scale {}: give a factor from 0 to 1000",
                        args.sim_mig_latency_scale
                    );
                }
                scaled_latency(args.sim_mig_latency_scale)
            },
            ..WorkerConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(escher_worker::fence::SUPERVISOR_ARG) {
        escher_worker::fence::supervise();
        return Ok(());
    }
    let args = WorkerArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // While this process has one thread: the tasks' PID namespace (the launcher and the
    // namespace's init never return from it).
    let pid_namespace = if args.detect || args.no_pid_namespace {
        Err("turned off (--no-pid-namespace)".to_string())
    } else {
        escher_worker::pidns::enter()
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(run(args, pid_namespace))
}

async fn run(args: WorkerArgs, pid_namespace: Result<(), String>) -> anyhow::Result<()> {
    if args.detect {
        let name = args
            .name
            .clone()
            .unwrap_or_else(escher_worker::discovery::hostname);
        let sim = args
            .sim_gpu
            .iter()
            .map(|s| s.parse())
            .collect::<Result<Vec<escher_worker::SimGpuSpec>, _>>()
            .context("--sim-gpu")?;
        print!(
            "{}",
            escher_worker::discovery::detect(!args.no_nvml, &sim, &name)
        );
        return Ok(());
    }
    match pid_namespace {
        Ok(()) => tracing::info!(
            launcher = escher_worker::pidns::host_pid(),
            "the worker and its tasks run in a PID namespace of their own: no task outlives it"
        ),
        Err(why) => tracing::warn!(
            %why,
            "tasks share the host's PID namespace: if every escher process of this host is \
             killed at once, its tasks run on until the worker is back (unless a service \
             manager ends them)"
        ),
    }
    let config = WorkerConfig::try_from(args)?;
    // Tasks die with this process, or when it stops answering (see `fence`).
    let program = std::env::current_exe().context("cannot find this program's path")?;
    escher_worker::fence::start(&program).context("cannot start the fence supervisor")?;
    let worker = WorkerBuilder::from_config(config)
        .build()
        .context("cannot start the worker")?;
    worker.run(shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<WorkerConfig, String> {
        // Never the user's own state directory.
        let dir = std::env::temp_dir().join(format!("escher-worker-test-{}", std::process::id()));
        let dir = dir.display().to_string();
        let fixed = ["--state-dir", dir.as_str()];
        let args = WorkerArgs::try_parse_from(
            std::iter::once("escher-worker")
                .chain(fixed)
                .chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())?;
        WorkerConfig::try_from(args).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_become_a_config() {
        let c = parse(&[
            "--head",
            "http://10.0.0.1:7600",
            "--name",
            "w1",
            "--resources",
            "ssd=1,cpu=2",
            "--labels",
            "zone=a",
            "--memory",
            "1024",
            "--grace",
            "0.5",
            "--drain",
            "0",
            "--log-retention",
            "2h",
            "--log-max-bytes",
            "1000",
            "--task-pids-max",
            "64",
            "--task-log-bytes",
            "4096",
            "--require-limits",
        ])
        .unwrap();
        assert_eq!(
            (c.task_pids_max, c.task_log_bytes, c.require_limits),
            (64, 4096, true)
        );
        assert_eq!(c.head, "http://10.0.0.1:7600");
        assert_eq!(c.log_retention.max_age, Duration::from_secs(7200));
        assert_eq!(c.log_retention.max_bytes, 1000);
        assert_eq!(c.name.as_deref(), Some("w1"));
        assert_eq!(c.resources.to_string(), "cpu=2,ssd=1");
        assert_eq!(c.labels.get("zone"), Some("a"));
        assert_eq!(c.memory_mib, Some(1024));
        assert_eq!(c.grace, Duration::from_millis(500));
        assert_eq!(c.drain, Duration::ZERO);
        assert!(c.state_dir.is_some());
        let list = parse(&["--head", "http://10.0.0.1:7600,http://10.0.0.2:7600"]).unwrap();
        assert_eq!(list.head, "http://10.0.0.1:7600,http://10.0.0.2:7600");
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        assert!(
            parse(&["--resources", "cpu=-1"])
                .unwrap_err()
                .contains("negative")
        );
        assert!(parse(&["--grace=-1"]).unwrap_err().contains("--grace"));
        assert!(parse(&["--head", "nope"]).unwrap_err().contains("head"));
        let gpu = parse(&["--sim-gpu", "a100-40gb:1g.5gb*7"]).unwrap_err();
        assert!(
            gpu.contains("sim-gpu") && gpu.contains(":mig=LAYOUT"),
            "{gpu}"
        );
        let layout = parse(&["--sim-gpu", "a100-40gb:mig=4g.20gb,4g.20gb"]).unwrap_err();
        assert!(layout.contains("at most 1 instance(s)"), "{layout}");
        let scale = parse(&["--sim-mig-latency-scale=-1"]).unwrap_err();
        assert!(scale.contains("--sim-mig-latency-scale"), "{scale}");
        let pids = parse(&["--task-pids-max", "0"]).unwrap_err();
        assert!(pids.contains("task-pids-max: 0 processes"), "{pids}");
        let logs = parse(&["--task-log-bytes", "0"]).unwrap_err();
        assert!(logs.contains("task-log-bytes"), "{logs}");
        let off = parse(&["--require-limits", "--no-task-cgroups"]).unwrap_err();
        assert!(off.contains("--no-task-cgroups"), "{off}");
        let scratch = parse(&["--task-scratch-bytes", "0"]).unwrap_err();
        assert!(scratch.contains("--no-task-scratch"), "{scratch}");
        let reserve = parse(&["--disk-reserve", "lots"]).unwrap_err();
        assert!(reserve.contains("512MiB"), "{reserve}");
        let reserve = parse(&["--disk-reserve", "2%"]).unwrap();
        assert_eq!(reserve.disk_reserve.to_string(), "2%");
    }

    #[test]
    fn a_token_is_never_taken_from_the_command_line_but_from_a_private_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let said = parse(&["--token", "escher-worker-0123456789abcdef0123456789abcdef"]);
        let said = said.unwrap_err();
        assert!(
            said.contains("/proc/PID/cmdline")
                && said.contains("--token-file")
                && said.contains("ESCHER_TOKEN"),
            "{said}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let path = file.display().to_string();
        std::fs::write(&file, "escher-worker-abc\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = parse(&["--token-file", &path]).unwrap_err();
        assert!(
            open.contains("mode 644") && open.contains("chmod 600"),
            "{open}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = parse(&["--token-file", &path]).unwrap();
        assert_eq!(c.token.as_deref(), Some("escher-worker-abc"));
        std::fs::write(&file, "two words\n").unwrap();
        let garbled = parse(&["--token-file", &path]).unwrap_err();
        assert!(garbled.contains("the join token alone"), "{garbled}");
        let missing = parse(&["--token-file", "/nonexistent/escher-token"]).unwrap_err();
        assert!(missing.contains("cannot read it"), "{missing}");
    }

    #[test]
    fn simulated_gpus_are_accepted() {
        let c = parse(&[
            "--sim-gpu",
            "a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb",
            "--sim-gpu",
            "h100-80gb",
            "--no-nvml",
            "--sim-mig-latency-scale",
            "0.5",
        ])
        .unwrap();
        assert_eq!(c.sim_gpus.len(), 2);
        assert!(!c.discover_gpus);
        assert_eq!(c.sim_mig_latency.destroy, Duration::from_millis(250));
        let built = WorkerBuilder::from_config(c).name("w").build().unwrap();
        assert_eq!(built.gpus().len(), 2);
        assert_eq!(built.resources().get("mig.1g.5gb").to_string(), "2");
        assert_eq!(built.resources().get("gpu").to_string(), "1");
        assert_eq!(built.labels().get("gpu.simulated"), Some("true"));
    }
}
