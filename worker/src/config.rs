//! [`WorkerConfig`]: everything a worker is configured with, with its defaults defined once.
//!
//! The binary turns its flags into a `WorkerConfig` (docs/STYLE.md §17); the library builder
//! ([`WorkerBuilder`](crate::WorkerBuilder)) edits one. [`WorkerConfig::validate`] checks it as
//! a whole, with errors that name the setting as its command-line flag does.

use std::path::PathBuf;
use std::time::Duration;

use escher_proto::convert::MAX_NAME_BYTES;
use escher_proto::mig::LatencyModel;
use escher_proto::types::is_gpu_resource;
use escher_proto::{Amount, Labels, ResourceName, ResourceSet};
use tonic::transport::Uri;

use crate::discovery::Discovered;
use crate::error::WorkerError;
use crate::exec::{DEFAULT_GRACE, LogRetention, TaskUsers};
use crate::gpu::SimGpuSpec;

/// Where the head is unless told otherwise (docs/DESIGN.md §9).
pub const DEFAULT_HEAD: &str = "http://127.0.0.1:7600";
/// How long running tasks may go on finishing after shutdown is asked for, unless told otherwise.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// The first delay before trying to reach the head again.
pub const DEFAULT_RECONNECT_INITIAL: Duration = Duration::from_millis(50);
/// The longest delay between attempts to reach the head.
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(2);

/// A worker's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The head's URL, such as `http://10.0.0.1:7600`, or the URLs of every replica of a
    /// replicated head, comma-separated: the worker follows whichever leads.
    pub head: String,
    /// The worker's name; `None` for `{hostname}-{pid}` (with a counter for the second and
    /// later workers of one process).
    pub name: Option<String>,
    /// Static resources added to the discovered ones; a physical name here (`cpu`, `memory`)
    /// replaces the discovered amount.
    pub resources: ResourceSet,
    /// The number of CPUs to report instead of the discovered number.
    pub cpus: Option<u64>,
    /// The MiB of memory to report instead of the discovered amount.
    pub memory_mib: Option<u64>,
    /// Labels added to (and overriding) the discovered ones.
    pub labels: Labels,
    /// When this node's allocation ends (`--walltime`, or a Slurm job's end), if it does: the
    /// node carries it as labels and the head drains it `margin` before (see [`Walltime`]).
    pub walltime: Option<Walltime>,
    /// Where command logs go; `None` for a fresh temporary directory, removed when the worker
    /// is dropped.
    pub log_dir: Option<PathBuf>,
    /// How long, and how much of, the command logs to keep (`--log-retention`,
    /// `--log-max-bytes`); the logs of running attempts always stay.
    pub log_retention: LogRetention,
    /// Where the worker keeps its identity (node id and secret) across its own restarts;
    /// `None` keeps it in memory, for the life of the process. `escher-worker` defaults to
    /// `$ESCHER_HOME/workers/NAME` (with `--name`), else `$ESCHER_HOME/worker`.
    pub state_dir: Option<PathBuf>,
    /// Time a stopped command gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How long, after shutdown is asked for, running tasks may go on to finish before they are
    /// cancelled.
    pub drain: Duration,
    /// Simulated GPU specifications (`--sim-gpu`), such as `h100-80gb` or
    /// `a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb`; see [`SimGpuSpec`].
    pub sim_gpus: Vec<String>,
    /// Whether to look for real NVIDIA GPUs through NVML (`--no-nvml` turns it off).
    pub discover_gpus: bool,
    /// How long a simulated MIG reconfiguration takes (`--sim-mig-latency-scale` scales the
    /// default, MIGRator's figures).
    pub sim_mig_latency: LatencyModel,
    /// The token the worker joins with (the worker join token, or an admin token); `None`
    /// finds it as the [`crate::join_token`] function says.
    pub token: Option<String>,
    /// The certificate (PEM) to trust for `https://` heads, and the name to check it against
    /// (the URL's host when `None`); `None` takes the access file's.
    pub tls_trust: Option<(String, Option<String>)>,
    /// The first delay before trying to reach the head again.
    pub reconnect_initial: Duration,
    /// The longest delay between attempts to reach the head.
    pub reconnect_max: Duration,
    /// Whom command tasks run as (`--task-uids`): a user per namespace when the worker may
    /// change user, by default (see [`Isolation`](crate::exec::Isolation)).
    pub task_users: TaskUsers,
    /// Refuse to start unless tasks run as users of their own (`--require-isolation`).
    pub require_isolation: bool,
    /// Give each command task a cgroup of its own, killed whole, where the worker may create
    /// one (`--no-task-cgroups` turns it off; see `exec/cgroup.rs`).
    pub task_cgroups: bool,
    /// Which cgroup hierarchy holds them (`--task-cgroup-hierarchy`): the unified one where
    /// the worker may create cgroups, else the v1 freezer, by default.
    pub task_cgroup_hierarchy: crate::exec::Hierarchy,
    /// The processes (threads included) each task (a command, a Python task's or actor's
    /// interpreter) may have at once (`--task-pids-max`; see `exec/limits.rs`).
    pub task_pids_max: u64,
    /// The most bytes of each output stream a command task's log keeps (`--task-log-bytes`);
    /// past it, output is dropped with one line that says so.
    pub task_log_bytes: u64,
    /// Refuse to start unless every limit (CPU, memory, processes) is held in the tasks'
    /// cgroups (`--require-limits`).
    pub require_limits: bool,
    /// Where the tasks' homes and scratch directories are made (`--task-dir`); `None`: the
    /// system's temporary directory.
    pub task_dir: Option<PathBuf>,
    /// Give each command task a scratch directory of its own, a tmpfs of its `disk` request or
    /// `task_scratch_bytes`, where the worker may mount one (`--no-task-scratch` turns it off;
    /// see `exec/scratch.rs`).
    pub task_scratch: bool,
    /// The scratch size of a task that asks for no `disk` (`--task-scratch-bytes`).
    pub task_scratch_bytes: u64,
    /// Bind each command task's scratch over its `/tmp`, `/var/tmp` and `/dev/shm` too, in a
    /// mount namespace of its own (see `exec/scratch.rs`). On by default, where the worker
    /// gives scratch (a root worker); `--no-private-tmp` turns it off, and such tasks then
    /// share the host's `/tmp` with every other tenant's.
    pub private_tmp: bool,
    /// The free space the worker keeps on the file systems of its log directory and its tasks'
    /// directory (`--disk-reserve`; see `exec/disk.rs`).
    pub disk_reserve: crate::exec::Reserve,
    /// Whether the worker looks for a Python interpreter by itself when `ESCHER_PYTHON` names
    /// none (`escher-worker` does; `--no-python` turns Python off; see `python/detect.rs`).
    pub python: crate::python::PythonDetection,
    /// Variables of the worker's environment passed to command tasks besides the usual few
    /// (`--pass-env`; see [`PASSED_ENV`](crate::exec::PASSED_ENV)).
    pub pass_env: Vec<String>,
    /// The most bytes of objects this node's store holds in memory
    /// (`--object-store-memory`); `None`: [`default_capacity`](crate::objects::default_capacity),
    /// 30% of the node's memory.
    pub object_store_memory: Option<u64>,
    /// The directory (a tmpfs) the object store's memory directory is made in
    /// (`--object-store-dir`); `None`: [`DEFAULT_MEMORY_ROOT`](crate::objects::DEFAULT_MEMORY_ROOT).
    pub object_store_dir: Option<PathBuf>,
    /// The directory (a disk) cold objects are spilled to (`--object-spill-dir`); `None`: the
    /// state directory when there is one, else
    /// [`DEFAULT_SPILL_ROOT`](crate::objects::DEFAULT_SPILL_ROOT).
    pub object_spill_dir: Option<PathBuf>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            head: DEFAULT_HEAD.to_string(),
            name: None,
            resources: ResourceSet::new(),
            cpus: None,
            memory_mib: None,
            labels: Labels::new(),
            log_dir: None,
            log_retention: LogRetention::default(),
            state_dir: None,
            grace: DEFAULT_GRACE,
            drain: DEFAULT_DRAIN,
            sim_gpus: Vec::new(),
            discover_gpus: true,
            sim_mig_latency: LatencyModel::default(),
            token: None,
            tls_trust: None,
            reconnect_initial: DEFAULT_RECONNECT_INITIAL,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            task_users: TaskUsers::Auto,
            require_isolation: false,
            task_cgroups: true,
            task_cgroup_hierarchy: crate::exec::Hierarchy::Auto,
            task_pids_max: crate::exec::DEFAULT_TASK_PIDS_MAX,
            task_log_bytes: crate::exec::DEFAULT_TASK_LOG_BYTES,
            require_limits: false,
            task_dir: None,
            task_scratch: true,
            task_scratch_bytes: crate::exec::DEFAULT_TASK_SCRATCH_BYTES,
            private_tmp: true,
            disk_reserve: crate::exec::DEFAULT_DISK_RESERVE,
            python: crate::python::PythonDetection::FromEnv,
            pass_env: Vec::new(),
            walltime: None,
            object_store_memory: None,
            object_store_dir: None,
            object_spill_dir: None,
        }
    }
}

impl WorkerConfig {
    /// Checks every setting; the error names the first bad one and says what would be valid.
    pub fn validate(&self) -> Result<(), WorkerError> {
        if crate::head_conn::split_heads(&self.head).next().is_none() {
            return Err(WorkerError::config(
                "head",
                "no head URL given; write one such as http://10.0.0.1:7600",
            ));
        }
        for head in crate::head_conn::split_heads(&self.head) {
            check_head(head)?;
        }
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        for var in &self.pass_env {
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                return Err(WorkerError::config(
                    "pass-env",
                    format!("{var:?} is not an environment variable's name"),
                ));
            }
            if var.starts_with("ESCHER_") {
                return Err(WorkerError::config(
                    "pass-env",
                    format!(
                        "{var} is one of escher's own variables: the worker's credentials stay \
                         with the worker, and tasks get their own (ESCHER_TASK_TOKEN, ...)"
                    ),
                ));
            }
        }
        for (field, value) in [("cpus", self.cpus), ("memory", self.memory_mib)] {
            if let Some(v) = value {
                Amount::units(v).map_err(|e| WorkerError::config(field, e.to_string()))?;
            }
        }
        if self.task_pids_max == 0 {
            return Err(WorkerError::config(
                "task-pids-max",
                "0 processes would let no task start; give at least 1 (the default is \
                 4096)",
            ));
        }
        if self.task_log_bytes == 0 {
            return Err(WorkerError::config(
                "task-log-bytes",
                "0 bytes would keep no output at all; give a positive number of bytes (the \
                 default is 67108864, 64 MiB)",
            ));
        }
        if self.task_scratch_bytes == 0 {
            return Err(WorkerError::config(
                "task-scratch-bytes",
                "0 bytes would leave a task no room for a single file; give a positive number \
                 of bytes (the default is 1073741824, 1 GiB), or --no-task-scratch",
            ));
        }
        if self.require_limits && !self.task_cgroups {
            return Err(WorkerError::config(
                "require-limits",
                "limits are held in the tasks' cgroups, which --no-task-cgroups turns off; \
                 drop one of the two",
            ));
        }
        self.sim_gpu_specs()?;
        if let Some((name, _)) = self
            .resources
            .iter()
            .find(|(n, _)| is_gpu_resource(n.as_str()))
        {
            return Err(WorkerError::config(
                "resources",
                format!(
                    "{name} is a GPU resource, which the worker reports from the GPUs it finds; \
                     use --sim-gpu for GPUs this machine does not have"
                ),
            ));
        }
        if self.reconnect_initial.is_zero() || self.reconnect_initial > self.reconnect_max {
            return Err(WorkerError::config(
                "reconnect",
                format!(
                    "the first reconnect delay ({:?}) must be positive and at most the longest \
                     ({:?})",
                    self.reconnect_initial, self.reconnect_max
                ),
            ));
        }
        Ok(())
    }

    /// The `--sim-gpu` specifications, parsed; the error names the first illegal one and says
    /// why (an unknown model, or the MIG model's reason the layout is not legal).
    pub fn sim_gpu_specs(&self) -> Result<Vec<SimGpuSpec>, WorkerError> {
        self.sim_gpus
            .iter()
            .map(|s| {
                s.parse().map_err(|e: crate::gpu::SimGpuError| {
                    WorkerError::config("sim-gpu", e.to_string())
                })
            })
            .collect()
    }

    /// The resources to register: `discovered`, then the static resources, then the `cpus` and
    /// `memory_mib` overrides, each later one replacing the amount of a name it repeats.
    pub fn resolve_resources(&self, discovered: &Discovered) -> ResourceSet {
        let mut set = discovered.resources.clone();
        for (name, amount) in self.resources.iter() {
            set.insert(name.clone(), amount);
        }
        let overrides = [
            (ResourceName::cpu(), self.cpus),
            (ResourceName::memory(), self.memory_mib),
        ];
        for (name, value) in overrides {
            if let Some(amount) = value.and_then(|v| Amount::units(v).ok()) {
                set.insert(name, amount);
            }
        }
        set
    }

    /// The labels to register: `discovered`, then the configured ones.
    pub fn resolve_labels(&self, discovered: &Discovered) -> Labels {
        let mut labels = discovered.labels.clone();
        for (k, v) in self.labels.iter() {
            // Both sides are valid labels already. The isolation and limits labels are the
            // worker's to say.
            let workers = [
                escher_proto::types::ISOLATION_LABEL,
                crate::exec::LIMITS_LABEL,
                crate::exec::LIMITS_MISSING_LABEL,
                crate::exec::DISK_LABEL,
                crate::exec::DISK_RESERVE_LABEL,
                crate::exec::DISK_SCRATCH_LABEL,
                crate::exec::TMP_LABEL,
            ];
            if !workers.contains(&k) {
                let _ = labels.insert(k, v);
            }
        }
        labels
    }
}

fn check_head(head: &str) -> Result<(), WorkerError> {
    let bad = |why: String| WorkerError::config("head", why);
    let uri: Uri = head.parse().map_err(|e| {
        bad(format!(
            "{head:?} is not a URL ({e}); write one such as http://10.0.0.1:7600"
        ))
    })?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(bad(format!(
                "{head:?} needs an http:// or https:// scheme, e.g. http://10.0.0.1:7600"
            )));
        }
    }
    if uri.authority().is_none() {
        return Err(bad(format!(
            "{head:?} has no host, e.g. http://10.0.0.1:7600"
        )));
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), WorkerError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(WorkerError::config(
            "name",
            format!("a worker name is 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(WorkerError::config(
            "name",
            "a worker name cannot contain control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(config: WorkerConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn default_is_valid() {
        WorkerConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_settings_are_named() {
        let head = |h: &str| WorkerConfig {
            head: h.into(),
            ..Default::default()
        };
        assert!(err(head("10.0.0.1:7600")).contains("head"));
        assert!(err(head("ftp://x:1")).contains("http://"));
        assert!(err(head("not a url")).contains("not a URL"));
        assert!(err(head("http://a:1,b:2")).contains("\"b:2\""));
        assert!(err(head(" , ")).contains("no head URL"));
        head("http://a:1, http://b:2").validate().unwrap();
        let named = WorkerConfig {
            name: Some(String::new()),
            ..Default::default()
        };
        assert!(err(named).contains("name"));
        let gpus = WorkerConfig {
            sim_gpus: vec!["a100-40gb:mig=3g.20gb,3g.20gb,1g.5gb".into()],
            ..Default::default()
        };
        assert_eq!(
            err(gpus),
            "invalid worker configuration: sim-gpu: \"a100-40gb:mig=3g.20gb,3g.20gb,1g.5gb\": \
             layout entry 3 (\"1g.5gb\"): 1g.5gb needs 1 memory slice(s) but only 0 of 8 are free"
        );
        let fake = WorkerConfig {
            resources: "gpu=2".parse().unwrap(),
            ..Default::default()
        };
        assert!(err(fake).contains("--sim-gpu"));
        let fine = WorkerConfig {
            sim_gpus: vec!["h100-80gb".into(), "a100-40gb:mig=1g.5gb".into()],
            ..Default::default()
        };
        assert_eq!(fine.sim_gpu_specs().unwrap().len(), 2);
        let cpus = WorkerConfig {
            cpus: Some(u64::MAX),
            ..Default::default()
        };
        assert!(err(cpus).contains("cpus"));
        let pids = WorkerConfig {
            task_pids_max: 0,
            ..Default::default()
        };
        assert!(err(pids).contains("task-pids-max: 0 processes"));
        let logs = WorkerConfig {
            task_log_bytes: 0,
            ..Default::default()
        };
        assert!(err(logs).contains("task-log-bytes"));
        let scratch = WorkerConfig {
            task_scratch_bytes: 0,
            ..Default::default()
        };
        assert!(err(scratch).contains("task-scratch-bytes: 0 bytes"));
        let both = WorkerConfig {
            require_limits: true,
            task_cgroups: false,
            ..Default::default()
        };
        assert!(err(both).contains("--no-task-cgroups"));
    }

    #[test]
    fn overrides_replace_discovered_amounts() {
        let discovered = Discovered {
            resources: "cpu=8,memory=1024".parse().unwrap(),
            labels: "gpu.model=none".parse().unwrap(),
            gpus: Vec::new(),
        };
        let config = WorkerConfig {
            resources: "memory=512,ssd=2".parse().unwrap(),
            cpus: Some(2),
            labels: "zone=a".parse().unwrap(),
            ..Default::default()
        };
        assert_eq!(
            config.resolve_resources(&discovered).to_string(),
            "cpu=2,memory=512,ssd=2"
        );
        assert_eq!(
            config.resolve_labels(&discovered).to_string(),
            "gpu.model=none,zone=a"
        );
    }
}

/// A node that lives until a set time (a batch allocation, a spot instance): it labels itself
/// [`ENDS_AT_LABEL`](escher_proto::types::ENDS_AT_LABEL) and
/// [`DRAIN_AT_LABEL`](escher_proto::types::DRAIN_AT_LABEL), and at the drain time the head
/// drains it (nothing new is admitted, running tasks finish) and labels it
/// [`ENDING_SOON_LABEL`](escher_proto::types::ENDING_SOON_LABEL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walltime {
    /// When the node ends, in milliseconds since the Unix epoch.
    pub ends_at_ms: u64,
    /// How long before its end the node stops taking new work.
    pub margin: std::time::Duration,
}

impl Walltime {
    /// A walltime of `length` from now.
    pub fn from_now(length: std::time::Duration, margin: std::time::Duration) -> Walltime {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Walltime {
            ends_at_ms: u64::try_from((now + length).as_millis()).unwrap_or(u64::MAX),
            margin,
        }
    }

    /// The end of the Slurm job this process runs in, from `SLURM_JOB_END_TIME` (Unix seconds,
    /// which Slurm sets in a job's environment), if there is one.
    pub fn from_slurm(margin: std::time::Duration) -> Option<Walltime> {
        let end: u64 = std::env::var("SLURM_JOB_END_TIME")
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (end > 0).then(|| Walltime {
            ends_at_ms: end.saturating_mul(1000),
            margin,
        })
    }

    /// When the head drains the node: the end less the margin.
    pub fn drain_at_ms(&self) -> u64 {
        let margin = u64::try_from(self.margin.as_millis()).unwrap_or(u64::MAX);
        self.ends_at_ms.saturating_sub(margin)
    }

    /// Puts the two walltime labels on `labels`.
    pub fn label(&self, labels: &mut Labels) {
        // Both are valid label text: names and numbers.
        let _ = labels.insert(
            escher_proto::types::ENDS_AT_LABEL,
            &self.ends_at_ms.to_string(),
        );
        let _ = labels.insert(
            escher_proto::types::DRAIN_AT_LABEL,
            &self.drain_at_ms().to_string(),
        );
    }
}
