//! [`TaskLimits`]: what a command task may use, CPU, memory and processes, written into its
//! cgroups; and [`Enforcement`], what this host lets the worker hold its tasks to.
//!
//! A task's `cpu` request becomes a CPU quota, its `memory` request a memory limit (the kernel's
//! OOM killer ends it in its own cgroup when it goes past, and the worker reports that as the
//! reason it failed), and every task gets a process limit (`--task-pids-max`,
//! [`DEFAULT_TASK_PIDS_MAX`] by default), so that a fork bomb fills its own cgroup, not the
//! node. A task that asks for no memory gets what the node has that no running task asked for
//! ([`MemoryLedger`]), at least [`MIN_UNREQUESTED_MEMORY`]: never the whole machine. A task
//! that asks for no CPU gets no quota (CPU time is shared, not lost, when others want it).
//!
//! Each limit goes where the kernel has its controller: the unified (v2) hierarchy when the
//! controller is enabled there (`cpu.max`, `memory.max`, `pids.max`), else the controller's
//! own cgroup v1 hierarchy (`cpu.cfs_quota_us`, `memory.limit_in_bytes`, `pids.max`), where the
//! task then sits in a cgroup of that hierarchy too. Hosts often mix both: a unified hierarchy
//! with no controller beside v1 `cpu`, `memory` and `pids` hierarchies. A controller found in
//! neither, or one the worker may not write, is named at start (a warning, and the node's
//! [`LIMITS_MISSING_LABEL`]); `--require-limits` refuses to start instead.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The processes (threads included) one task may have at once, unless `--task-pids-max` says.
pub const DEFAULT_TASK_PIDS_MAX: u64 = 4096;
/// The least memory a task that asked for none gets, even when running tasks asked for all of
/// the node's (64 MiB).
pub const MIN_UNREQUESTED_MEMORY: u64 = 64 * 1024 * 1024;
pub use escher_proto::types::{LIMITS_LABEL, LIMITS_MISSING_LABEL};

/// The CFS period the CPU quota is given over (100 ms, the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel takes (1 ms per period).
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// A kernel resource controller that holds a task to a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    /// CPU time: a quota per period.
    Cpu,
    /// Memory: a hard limit, past which the kernel's OOM killer ends the task.
    Memory,
    /// Processes and threads: a most at once.
    Pids,
}

impl Controller {
    /// Every controller a task's limits need.
    pub const ALL: [Controller; 3] = [Controller::Cpu, Controller::Memory, Controller::Pids];

    /// Its name in the kernel (`/proc/cgroups`, `cgroup.controllers`).
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which cgroup interface a directory speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// cgroup v1: one hierarchy per controller (or a few mounted together).
    V1,
    /// cgroup v2: the unified hierarchy.
    V2,
}

/// What one task may use. `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskLimits {
    /// CPUs' worth of CPU time per second, in 1/10,000 CPUs (a request's `cpu` amount, raw).
    pub cpu: Option<u64>,
    /// Bytes of memory.
    pub memory: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
}

impl TaskLimits {
    /// No limit at all (what a cgroup taken from the pool is reset to).
    pub fn none() -> TaskLimits {
        TaskLimits::default()
    }

    /// Writes the limit of `controller` into the cgroup at `dir`, replacing what a task before
    /// left there.
    pub(super) fn write(
        &self,
        dir: &Path,
        version: Version,
        controller: Controller,
    ) -> io::Result<()> {
        let put = |file: &str, value: String| {
            fs::write(dir.join(file), &value).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: writing {value:?}: {e}", dir.join(file).display()),
                )
            })
        };
        match (controller, version) {
            (Controller::Cpu, Version::V2) => put(
                "cpu.max",
                match self.cpu {
                    Some(raw) => format!("{} {CPU_PERIOD_US}", cpu_quota_us(raw)),
                    None => format!("max {CPU_PERIOD_US}"),
                },
            ),
            (Controller::Cpu, Version::V1) => {
                put("cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                put(
                    "cpu.cfs_quota_us",
                    self.cpu
                        .map_or("-1".to_string(), |raw| cpu_quota_us(raw).to_string()),
                )
            }
            (Controller::Memory, Version::V2) => {
                put(
                    "memory.max",
                    self.memory.map_or("max".into(), |b| b.to_string()),
                )?;
                // Swap would let a task hold more than its request; a kernel without swap
                // accounting has no such file.
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                // The task is the unit the kernel's OOM killer stops, as a container is: a
                // shell whose child went past the request must not carry on and succeed.
                // Kernels before 4.19 have no such file, and kill one process.
                let _ = fs::write(dir.join("memory.oom.group"), "1");
                Ok(())
            }
            (Controller::Memory, Version::V1) => write_v1_memory(dir, self.memory),
            (Controller::Pids, _) => put(
                "pids.max",
                self.pids.map_or("max".into(), |n| n.to_string()),
            ),
        }
    }
}

/// The CPU weight of one busy process of default priority: `cpu.shares` (cgroup v1) and
/// `cpu.weight` (cgroup v2) of a cgroup that should weigh as much.
const SHARES_PER_CPU: u64 = 1024;
const WEIGHT_PER_CPU: u64 = 100;
/// The largest weight each interface takes.
const MAX_SHARES: u64 = 1 << 18;
const MAX_WEIGHT: u64 = 10_000;

/// Gives the cgroup at `dir` (the worker's directory of task cgroups, in the hierarchy that
/// holds their CPU quotas) the CPU weight of `raw` 1/10,000 CPUs' worth of busy processes.
///
/// The scheduler shares CPU time between the children of a cgroup by weight, and the worker's
/// directory is one child among the host's processes: at the default weight, every task the
/// worker runs together weighs as much as one process, so that on a host where anything else
/// runs (another service, a build) a node's eight tasks got the CPU time of one. Weighed as
/// the CPUs the node offers, its tasks get what they would get as as many processes outside
/// any cgroup, and their quotas still hold each of them to its request.
pub(super) fn write_cpu_weight(dir: &Path, version: Version, raw: u64) -> io::Result<()> {
    let (file, value) = cpu_weight(version, raw);
    let path = dir.join(file);
    fs::write(&path, value.to_string()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{}: writing \"{value}\": {e}", path.display()),
        )
    })
}

/// The file and value of [`write_cpu_weight`].
fn cpu_weight(version: Version, raw: u64) -> (&'static str, u64) {
    let per_cpu = |unit: u64| {
        u64::try_from(
            u128::from(raw) * u128::from(unit) / u128::from(escher_proto::Amount::ONE.raw()),
        )
        .unwrap_or(u64::MAX)
    };
    match version {
        Version::V1 => ("cpu.shares", per_cpu(SHARES_PER_CPU).clamp(2, MAX_SHARES)),
        Version::V2 => ("cpu.weight", per_cpu(WEIGHT_PER_CPU).clamp(1, MAX_WEIGHT)),
    }
}

/// The CFS quota, in microseconds per [`CPU_PERIOD_US`], of `raw` 1/10,000 CPUs.
fn cpu_quota_us(raw: u64) -> u64 {
    (raw.saturating_mul(CPU_PERIOD_US) / escher_proto::Amount::ONE.raw()).max(MIN_CPU_QUOTA_US)
}

/// Sets a v1 memory cgroup's limit (and its memory+swap limit, where the kernel accounts swap,
/// to the same). Page cache a task before left charged to the cgroup can make the kernel
/// refuse a lower limit (`EBUSY`): then the cgroup is emptied (`memory.force_empty`) and the
/// limit written again.
fn write_v1_memory(dir: &Path, limit: Option<u64>) -> io::Result<()> {
    let value = limit.map_or("-1".to_string(), |b| b.to_string());
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let swap_accounted = memsw.exists();
    // memory+swap is never below memory: lift it first, lower it last.
    if swap_accounted {
        let _ = fs::write(&memsw, "-1");
    }
    let file = dir.join("memory.limit_in_bytes");
    if fs::write(&file, &value).is_err() {
        let _ = fs::write(dir.join("memory.force_empty"), "0");
        fs::write(&file, &value).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: writing {value:?}: {e}", file.display()),
            )
        })?;
    }
    if swap_accounted {
        fs::write(&memsw, &value)?;
    }
    Ok(())
}

/// How many times the kernel's OOM killer killed a process of the cgroup at `dir` (whose
/// memory controller speaks `version`), `None` where the file says nothing.
pub(super) fn oom_kills(dir: &Path, version: Version) -> Option<u64> {
    let (file, key) = match version {
        Version::V2 => ("memory.events", "oom_kill "),
        Version::V1 => ("memory.oom_control", "oom_kill "),
    };
    fs::read_to_string(dir.join(file))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// The limits this worker holds its tasks to, and those it cannot, with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enforcement {
    /// Held, each in its cgroup.
    pub enforced: BTreeSet<Controller>,
    /// Not held, each with the reason.
    pub missing: Vec<(Controller, String)>,
}

impl Enforcement {
    /// Nothing enforced: every controller missing for `why`.
    pub fn nothing(why: &str) -> Enforcement {
        Enforcement {
            enforced: BTreeSet::new(),
            missing: Controller::ALL
                .iter()
                .map(|c| (*c, why.to_string()))
                .collect(),
        }
    }

    /// Whether every limit is held.
    pub fn complete(&self) -> bool {
        self.missing.is_empty()
    }

    /// The value of [`LIMITS_LABEL`]: the controllers held, joined with `+`, or `none`.
    pub fn label(&self) -> String {
        join(self.enforced.iter().copied())
    }

    /// The value of [`LIMITS_MISSING_LABEL`], `None` when nothing is missing.
    pub fn missing_label(&self) -> Option<String> {
        (!self.missing.is_empty()).then(|| join(self.missing.iter().map(|(c, _)| *c)))
    }

    /// Why each missing limit is missing, for the worker's start-up warning and errors.
    pub fn why_missing(&self) -> String {
        self.missing
            .iter()
            .map(|(c, why)| format!("{c}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn join(controllers: impl Iterator<Item = Controller>) -> String {
    let names: Vec<&str> = controllers.map(Controller::name).collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join("+")
    }
}

/// How a worker turns a task's request into its limits (`--task-pids-max`, the node's memory).
#[derive(Debug)]
pub struct LimitPolicy {
    /// Every task's process limit.
    pub pids_max: u64,
    /// The node's memory, and what running tasks asked for of it.
    pub memory: MemoryLedger,
}

impl LimitPolicy {
    /// The limits of a task that asked for `request`, and its hold on the node's memory while
    /// it runs: `cpu` (CPUs) as its quota, `memory` (MiB) as its memory limit, or what no
    /// running task asked for when it asked for none.
    pub fn task(&self, request: &escher_proto::ResourceSet) -> (TaskLimits, MemoryHeld) {
        let cpu = request.get("cpu").raw();
        let memory = request.get("memory").raw();
        let memory = (memory > 0).then(|| {
            u64::try_from(
                u128::from(memory) * (1 << 20) / u128::from(escher_proto::Amount::ONE.raw()),
            )
            .unwrap_or(u64::MAX)
        });
        let (memory, held) = self.memory.limit(memory);
        let limits = TaskLimits {
            cpu: (cpu > 0).then_some(cpu),
            memory,
            pids: Some(self.pids_max),
        };
        (limits, held)
    }
}

/// The node's memory that running tasks asked for, to give a task that asked for none what is
/// left: the node's memory less every running task's request, at least
/// [`MIN_UNREQUESTED_MEMORY`].
#[derive(Debug)]
pub struct MemoryLedger {
    /// The node's memory, in bytes (its registered `memory` resource).
    node: u64,
    /// What running tasks asked for, in bytes.
    requested: Arc<AtomicU64>,
}

/// One running task's memory request, given back to its [`MemoryLedger`] when dropped.
#[derive(Debug)]
pub struct MemoryHeld {
    bytes: u64,
    requested: Arc<AtomicU64>,
}

impl Drop for MemoryHeld {
    fn drop(&mut self) {
        self.requested.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl MemoryLedger {
    /// A ledger for a node with `node` bytes of memory.
    pub fn new(node: u64) -> MemoryLedger {
        MemoryLedger {
            node,
            requested: Arc::default(),
        }
    }

    /// The memory limit of a task that asked for `request` bytes (`None`: nothing), and its
    /// hold on the ledger while it runs. A node that does not know its memory (it registered
    /// none) gives a task that asked for none no limit.
    pub fn limit(&self, request: Option<u64>) -> (Option<u64>, MemoryHeld) {
        let bytes = request.unwrap_or(0);
        let before = self.requested.fetch_add(bytes, Ordering::Relaxed);
        let held = MemoryHeld {
            bytes,
            requested: Arc::clone(&self.requested),
        };
        let limit = match request {
            Some(bytes) => Some(bytes),
            None if self.node == 0 => None,
            None => Some(self.node.saturating_sub(before).max(MIN_UNREQUESTED_MEMORY)),
        };
        (limit, held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_amount_becomes_a_quota_per_period() {
        // 0.1 CPU: 10 ms of every 100 ms; 2 CPUs: 200 ms; a sliver: the kernel's least.
        assert_eq!(cpu_quota_us(1_000), 10_000);
        assert_eq!(cpu_quota_us(20_000), 200_000);
        assert_eq!(cpu_quota_us(1), MIN_CPU_QUOTA_US);
    }

    #[test]
    fn the_task_cgroups_weigh_as_the_nodes_cpus() {
        // 8 CPUs: eight busy processes' weight; half a CPU: half of one; within each
        // interface's bounds.
        let one = escher_proto::Amount::ONE.raw();
        assert_eq!(cpu_weight(Version::V1, 8 * one), ("cpu.shares", 8192));
        assert_eq!(cpu_weight(Version::V2, 8 * one), ("cpu.weight", 800));
        assert_eq!(cpu_weight(Version::V1, one / 2), ("cpu.shares", 512));
        assert_eq!(cpu_weight(Version::V2, one / 2), ("cpu.weight", 50));
        assert_eq!(cpu_weight(Version::V1, 0), ("cpu.shares", 2));
        assert_eq!(cpu_weight(Version::V2, 0), ("cpu.weight", 1));
        assert_eq!(cpu_weight(Version::V1, u64::MAX), ("cpu.shares", 1 << 18));
        assert_eq!(cpu_weight(Version::V2, 1_000 * one), ("cpu.weight", 10_000));
    }

    #[test]
    fn a_task_that_asks_for_no_memory_gets_what_nobody_asked_for() {
        let mib = 1024 * 1024;
        let ledger = MemoryLedger::new(1024 * mib);
        let (limit, a) = ledger.limit(Some(700 * mib));
        assert_eq!(limit, Some(700 * mib));
        let (limit, _b) = ledger.limit(None);
        assert_eq!(limit, Some(324 * mib));
        let (_, c) = ledger.limit(Some(324 * mib));
        assert_eq!(ledger.limit(None).0, Some(MIN_UNREQUESTED_MEMORY));
        drop((a, c));
        assert_eq!(ledger.limit(None).0, Some(1024 * mib));
        // A node that does not know its memory.
        assert_eq!(MemoryLedger::new(0).limit(None).0, None);
    }

    #[test]
    fn a_request_becomes_limits() {
        let policy = LimitPolicy {
            pids_max: 100,
            memory: MemoryLedger::new(1 << 30),
        };
        let (limits, _held) = policy.task(&"cpu=0.1,memory=256".parse().unwrap());
        assert_eq!(
            limits,
            TaskLimits {
                cpu: Some(1_000),
                memory: Some(256 << 20),
                pids: Some(100),
            }
        );
        // No CPU asked for: no quota; no memory: what the other task left.
        let (limits, _) = policy.task(&escher_proto::ResourceSet::new());
        assert_eq!((limits.cpu, limits.memory), (None, Some(768 << 20)));
    }

    #[test]
    fn the_labels_name_what_is_held_and_what_is_not() {
        let mut e = Enforcement::nothing("no cgroup");
        assert_eq!(e.label(), "none");
        assert_eq!(e.missing_label().as_deref(), Some("cpu+memory+pids"));
        e.enforced.insert(Controller::Pids);
        e.missing.retain(|(c, _)| *c != Controller::Pids);
        assert_eq!(e.label(), "pids");
        assert_eq!(e.missing_label().as_deref(), Some("cpu+memory"));
        assert_eq!(e.why_missing(), "cpu: no cgroup; memory: no cgroup");
        // Label values the head takes.
        let mut labels = escher_proto::Labels::new();
        labels.insert(LIMITS_LABEL, &e.label()).unwrap();
        labels
            .insert(LIMITS_MISSING_LABEL, &e.missing_label().unwrap())
            .unwrap();
    }
}
