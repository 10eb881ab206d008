//! [`TaskCgroups`]: a kernel container (a cgroup v2) per command task, killed whole.
//!
//! A process group holds a task only while its processes stay in it: `setsid`, `setpgid` or a
//! double fork leaves it, and then no `killpg` reaches them. A cgroup holds every descendant
//! whatever it does, and `cgroup.kill` (Linux 5.14) SIGKILLs all of them at once. So each command
//! task gets a cgroup of its own, `slot-K`, under one directory per worker,
//! `escher-worker-PID-N` (N counts the workers of one process), created inside the worker's own cgroup in the unified (v2) hierarchy (on
//! a host that mounts cgroup v1 controllers too, the unified hierarchy beside them). When the
//! task ends, its cgroup is killed and, once empty, reused by a later task (`cgroup_pool.rs`:
//! a pool of cgroups with their limits written and their files open, put back off the task's
//! path); the fence supervisor (`crate::fence`) kills the
//! cgroups it holds when the worker dies or loses its lease; and a worker that starts kills and
//! removes what is left of workers on this host that died with their supervisor (a
//! `kill -9` of every process of theirs), before it takes any task.
//!
//! The task's main process enters its cgroup before it executes its program: the worker's
//! one-exec spawn (`spawn.rs`) writes `0` into the cgroup's `cgroup.procs` from the child
//! ([`TaskCgroup::procs_files`]), so nothing of the task ever runs outside it. Where the
//! standard library spawns instead (a kernel without pidfds), the main process is moved in as
//! soon as it is spawned ([`TaskCgroup::enter`]), and then every process it has started
//! already, walking the process tree down from it (a process forked after its parent moved is
//! born in the cgroup).
//!
//! A host without a writable cgroup v2 hierarchy (one that mounts only cgroup v1, as older
//! distributions and Kubernetes nodes do) gets the same containers in the v1 **freezer**
//! hierarchy ([`Hierarchy`]): there is no `cgroup.kill`, so a kill freezes the cgroup first
//! (`freezer.state`), so that no process in it can fork while they are listed and SIGKILLed,
//! and thaws it, letting them die. Without either (a worker that is not root and was not
//! delegated a subtree) tasks are held by their process group only, as the worker's log says at
//! start.
//!
//! The same cgroup holds the task to its limits ([`TaskLimits`]: a CPU quota, a memory limit, a
//! process limit) where the unified hierarchy has those controllers; where they are cgroup v1
//! hierarchies instead (all of them on a v1 host, and on many hybrid hosts whose unified
//! hierarchy has no controller), the task also gets a cgroup of the same name, `slot-K`, under
//! `escher-worker-PID-N` in each of those hierarchies, entered with it and given its limits
//! (see `limits.rs`). The kill stays the unified or freezer cgroup's. The worker's directory
//! in the hierarchy that holds CPU quotas weighs, against the host's other processes, as the
//! node's CPUs ([`TaskCgroups::weigh_as_cpus`]): at the default weight, all of a node's tasks
//! shared one process's CPU time on a host where anything else ran.
//!
//! The cgroup also measures what the task used: CPU time from `cpu.stat` (always there in v2)
//! and memory from `memory.peak` / `memory.current` where the memory controller is enabled for
//! it. A freezer cgroup counts neither: there the CPU time and memory are those of the
//! processes it holds at the moment (`/proc/PID/stat`, `statm`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::cgroup_pool::{Pool, Slot};
use super::limits::{Controller, Enforcement, TaskLimits, Version, oom_kills, write_cpu_weight};

/// The prefix of a worker process's directory of task cgroups.
const WORKER_PREFIX: &str = "escher-worker-";

/// Which cgroup hierarchy holds the task cgroups (`escher-worker --task-cgroup-hierarchy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hierarchy {
    /// The unified (v2) hierarchy where the worker may create cgroups, else the v1 freezer.
    #[default]
    Auto,
    /// The unified (cgroup v2) hierarchy only.
    Unified,
    /// The cgroup v1 freezer hierarchy only.
    Freezer,
}

impl std::str::FromStr for Hierarchy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Hierarchy::Auto),
            "v2" => Ok(Hierarchy::Unified),
            "v1" => Ok(Hierarchy::Freezer),
            other => Err(format!(
                "{other:?} is not a cgroup hierarchy: auto, v2 (unified) or v1 (the freezer)"
            )),
        }
    }
}

/// The cgroups of one worker process's tasks.
#[derive(Debug)]
pub struct TaskCgroups {
    /// `<cgroup2 mount>/<the worker's cgroup>/escher-worker-PID-N`.
    root: PathBuf,
    /// Empty cgroups, ready for the next task (`cgroup_pool.rs`).
    free: Pool,
    /// The number of the next new one.
    next: std::sync::atomic::AtomicU64,
    /// Where each enforced limit is written.
    places: Vec<Place>,
    /// Which limits are held, and why the others are not.
    enforcement: Enforcement,
}

/// The worker's directory of task cgroups in one hierarchy that holds limits, and the
/// controllers it holds them with.
#[derive(Debug)]
struct Place {
    /// `<mount>/<the worker's cgroup there>/escher-worker-PID-N`; the task cgroups' own root
    /// for the unified hierarchy.
    root: PathBuf,
    version: Version,
    controllers: Vec<Controller>,
}

/// What a task's cgroup measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupUsage {
    /// CPU time of every process the task ran (user and system).
    pub cpu: Duration,
    /// The memory its processes hold now: the cgroup's `memory.current` where the memory
    /// controller counts it, else the sum of its processes' resident sets.
    pub memory: Option<u64>,
}

impl TaskCgroups {
    /// The task cgroups of this worker process in `hierarchy`, or why there are none (the
    /// worker then holds its tasks by process group only). Kills and removes the leftovers of
    /// dead workers.
    pub fn discover(hierarchy: Hierarchy) -> Result<TaskCgroups, String> {
        let unified = || {
            let mount = cgroup2_mount()?;
            let own = own_cgroup()?;
            TaskCgroups::under(&mount.join(own.trim_start_matches('/')))
        };
        let freezer = || {
            let mount = cgroup1_mount("freezer")?;
            let own = own_cgroup1("freezer")?;
            TaskCgroups::under(&mount.join(own.trim_start_matches('/')))
        };
        let mut cgroups = match hierarchy {
            Hierarchy::Unified => unified(),
            Hierarchy::Freezer => freezer(),
            Hierarchy::Auto => unified()
                .or_else(|v2| freezer().map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))),
        }?;
        cgroups.place_limits();
        Ok(cgroups)
    }

    /// Finds where each limit can be held: the unified hierarchy where its controller can be
    /// enabled for the task cgroups, else the controller's own v1 hierarchy.
    fn place_limits(&mut self) {
        let mut enforcement = Enforcement::default();
        let mut places: Vec<Place> = Vec::new();
        let name = self.root.file_name().map(PathBuf::from).unwrap_or_default();
        for controller in Controller::ALL {
            let unified = if self.is_freezer() {
                Err("the task cgroups are v1 freezer cgroups".to_string())
            } else {
                enable_unified(&self.root, controller)
            };
            let placed = unified
                .map(|()| (self.root.clone(), Version::V2))
                .or_else(|v2| {
                    v1_root(controller, &name)
                        .map(|root| (root, Version::V1))
                        .map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))
                });
            match placed {
                Ok((root, version)) => {
                    enforcement.enforced.insert(controller);
                    match places.iter_mut().find(|p| p.root == root) {
                        Some(place) => place.controllers.push(controller),
                        None => places.push(Place {
                            root,
                            version,
                            controllers: vec![controller],
                        }),
                    }
                }
                Err(why) => enforcement.missing.push((controller, why)),
            }
        }
        self.places = places;
        self.enforcement = enforcement;
    }

    /// Gives the task cgroups, together, the CPU weight of `cpus` (1/10,000 CPUs: the CPUs
    /// the node offers) busy processes, where a CPU controller holds them: at the default
    /// weight the worker's directory weighs as one process against the host's others, and
    /// every task of a loaded host would share that one's CPU time (see
    /// `limits::write_cpu_weight`). Without a CPU controller the tasks compete as the
    /// processes they are, and nothing is written.
    pub fn weigh_as_cpus(&self, cpus: u64) -> io::Result<()> {
        match self
            .places
            .iter()
            .find(|p| p.controllers.contains(&Controller::Cpu))
        {
            Some(place) => write_cpu_weight(&place.root, place.version, cpus),
            None => Ok(()),
        }
    }

    /// Which limits the task cgroups hold, and why the others are not held.
    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// The task cgroups of this worker process in a directory of its own under `parent`, the
    /// worker's own cgroup.
    fn under(parent: &Path) -> Result<TaskCgroups, String> {
        sweep_dead_workers(parent);
        static WORKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WORKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = parent.join(format!("{WORKER_PREFIX}{}-{n}", crate::pidns::host_pid()));
        if !parent.join("cgroup.procs").exists() {
            return Err(format!("{} is not a cgroup", parent.display()));
        }
        match fs::create_dir(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", root.display())),
        }
        let free = Pool::new().map_err(|e| format!("cannot start the cgroup releaser: {e}"))?;
        Ok(TaskCgroups {
            root,
            free,
            next: std::sync::atomic::AtomicU64::new(0),
            places: Vec::new(),
            enforcement: Enforcement::default(),
        })
    }

    /// The directory the task cgroups live in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether they are cgroup v1 freezer cgroups (else cgroup v2).
    pub fn is_freezer(&self) -> bool {
        is_freezer(&self.root)
    }

    /// An empty cgroup for one task, with no limit: one from the pool, or a new one.
    pub fn create(&self) -> io::Result<TaskCgroup> {
        self.create_limited(&TaskLimits::none())
    }

    /// An empty cgroup for one task, holding it to `limits` (those this host enforces, see
    /// [`TaskCgroups::enforcement`]): one from the pool (one holding these limits already if
    /// there is one: then nothing is written), or a new one. Fails, and the task must not
    /// start, when a limit cannot be written.
    pub fn create_limited(&self, limits: &TaskLimits) -> io::Result<TaskCgroup> {
        let mut slot = match self.free.take(limits) {
            Some(slot) => slot,
            None => self.new_slot()?,
        };
        if slot.written.as_ref() != Some(limits) {
            slot.written = None;
            if let Err(e) = write_limits(&slot, limits) {
                self.free.put_empty(slot);
                return Err(e);
            }
            slot.written = Some(*limits);
        }
        let mut cgroup = TaskCgroup {
            cpu_before: slot.cpu_before,
            slot,
            oom_before: 0,
            memory_limit: limits.memory,
            free: self.free.clone(),
        };
        // Read only for a task that has a memory limit to exceed.
        if limits.memory.is_some() {
            cgroup.oom_before = cgroup.oom_kills().unwrap_or(0);
        }
        Ok(cgroup)
    }

    /// A new task cgroup, with its cgroups in the hierarchies that hold limits, and its files
    /// open; no limit written yet.
    fn new_slot(&self) -> io::Result<Slot> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("slot-{n}");
        let path = self.root.join(&name);
        fs::create_dir(&path)?;
        let mut limit_dirs = Vec::new();
        for place in &self.places {
            let dir = if place.root == self.root {
                path.clone()
            } else {
                let dir = place.root.join(&name);
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        remove(&path);
                        return Err(e);
                    }
                }
                dir
            };
            limit_dirs.push(LimitDir {
                path: dir,
                version: place.version,
                controllers: place.controllers.clone(),
            });
        }
        Slot::open(path.clone(), limit_dirs).inspect_err(|_| {
            remove(&path);
        })
    }
}

/// Writes `limits` into every cgroup of `slot` that holds one.
fn write_limits(slot: &Slot, limits: &TaskLimits) -> io::Result<()> {
    for dir in &slot.limit_dirs {
        for controller in &dir.controllers {
            limits.write(&dir.path, dir.version, *controller)?;
        }
    }
    Ok(())
}

impl Drop for TaskCgroups {
    fn drop(&mut self) {
        let mut roots: Vec<PathBuf> = self.places.iter().map(|p| p.root.clone()).collect();
        roots.push(self.root.clone());
        self.free.close(roots);
    }
}

/// One task's cgroup: killed when dropped, and back in its pool once empty.
#[derive(Debug)]
pub struct TaskCgroup {
    slot: Slot,
    /// Its CPU time when the task got it.
    cpu_before: Duration,
    /// The OOM kills its memory cgroup had counted when the task got it (read only for a task
    /// with a memory limit).
    oom_before: u64,
    /// The task's memory limit, in bytes.
    memory_limit: Option<u64>,
    free: Pool,
}

/// Whether the kernel's OOM killer killed a process of one task's memory cgroup (see
/// [`TaskCgroup::oom_watch`]).
#[derive(Debug, Clone)]
pub struct OomWatch {
    dir: PathBuf,
    version: Version,
    /// The kills the cgroup had counted when the task got it.
    before: u64,
    /// The task's memory limit, in bytes.
    limit: u64,
}

impl OomWatch {
    /// The task's memory limit, when the kernel's OOM killer has killed one of its processes
    /// since it got its cgroup: the task went past its memory request. Read before the cgroup
    /// goes back to the pool.
    pub fn exceeded(&self) -> Option<u64> {
        (oom_kills(&self.dir, self.version)? > self.before).then_some(self.limit)
    }

    /// [`OomWatch::exceeded`] for a task whose main process ended, `succeeded` or not. On a
    /// v2 hierarchy a success went past no limit (the kernel stops the whole task,
    /// `memory.oom.group`), so nothing is read; on v1 the kernel kills one process, and a
    /// shell whose child it killed may carry on and exit 0, so the count is read either way.
    pub fn exceeded_after(&self, succeeded: bool) -> Option<u64> {
        if succeeded && self.version == Version::V2 {
            return None;
        }
        self.exceeded()
    }
}

/// One of a task's cgroups that hold its limits.
#[derive(Debug)]
pub(super) struct LimitDir {
    pub(super) path: PathBuf,
    pub(super) version: Version,
    pub(super) controllers: Vec<Controller>,
}

impl TaskCgroup {
    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.slot.path
    }

    /// Moves process `pid` into the cgroup, then every descendant it has already started (a
    /// process forked after its parent moved is born inside).
    /// So are the cgroups that hold its limits in v1 hierarchies.
    pub fn enter(&self, pid: u32) -> io::Result<()> {
        let procs = self.procs_files();
        for file in &procs {
            fs::write(file, pid.to_string())?;
        }
        let mut parents = vec![pid];
        let mut moved = 0;
        while let Some(parent) = parents.pop() {
            for child in children(parent) {
                // Gone already, or moved: either way it is not left outside.
                for file in &procs {
                    if fs::write(file, child.to_string()).is_ok() {
                        moved += 1;
                    }
                }
                parents.push(child);
            }
            if moved > 4096 {
                break;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files of the cgroup and of those that hold its limits in v1
    /// hierarchies: a process is in all of them or held by none.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        std::iter::once(self.slot.path.as_path())
            .chain(
                self.slot
                    .limit_dirs
                    .iter()
                    .map(|d| d.path.as_path())
                    .filter(|d| *d != self.slot.path),
            )
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// What the task's processes used so far: CPU time, and the memory they hold now where
    /// the kernel counts it for this cgroup.
    pub fn usage(&self) -> CgroupUsage {
        let cpu = self.slot.cpu().saturating_sub(self.cpu_before);
        let counted = |file: &str, dir: &Path| {
            fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|text| text.trim().parse().ok())
        };
        let memory = counted("memory.current", &self.slot.path)
            .or_else(|| {
                let (dir, _) = self.memory_dir()?;
                counted("memory.usage_in_bytes", dir)
            })
            .or_else(|| resident_memory(&self.slot.path));
        CgroupUsage { cpu, memory }
    }

    /// The cgroup that holds its memory limit, and its interface.
    fn memory_dir(&self) -> Option<(&Path, Version)> {
        self.slot
            .limit_dirs
            .iter()
            .find(|d| d.controllers.contains(&Controller::Memory))
            .map(|d| (d.path.as_path(), d.version))
    }

    /// How many times the kernel's OOM killer has killed one of its processes, in all (the
    /// count of its memory cgroup); `None` where no memory cgroup counts them.
    fn oom_kills(&self) -> Option<u64> {
        let (dir, version) = self.memory_dir()?;
        oom_kills(dir, version)
    }

    /// Holds the cgroup, which may hold processes already (a warm Python interpreter's), to
    /// the limits of its next task from now on: writes them where they differ from those
    /// written last, and counts the kernel's OOM kills from now ([`TaskCgroup::oom_watch`]).
    /// A memory limit below what its processes hold is reclaimed down to by the kernel, which
    /// refuses it (cgroup v1) or kills them (v2) where it cannot: see
    /// [`TaskCgroup::anonymous_memory`] for what it cannot reclaim. On an error the cgroup
    /// holds an unknown mix of limits: its task must not start in it.
    pub fn hold_to(&mut self, limits: &TaskLimits) -> io::Result<()> {
        if self.slot.written.as_ref() != Some(limits) {
            self.slot.written = None;
            write_limits(&self.slot, limits)?;
            self.slot.written = Some(*limits);
        }
        self.memory_limit = limits.memory;
        self.oom_before = match limits.memory {
            Some(_) => self.oom_kills().unwrap_or(0),
            None => 0,
        };
        Ok(())
    }

    /// The anonymous memory its processes hold (`anon` of a v2 memory cgroup's `memory.stat`,
    /// `rss` of a v1 one): what the kernel cannot reclaim from them without swap, unlike the
    /// page cache it counts too. `None` where no memory cgroup counts it.
    pub fn anonymous_memory(&self) -> Option<u64> {
        let (dir, version) = self.memory_dir()?;
        let key = match version {
            Version::V2 => "anon ",
            Version::V1 => "rss ",
        };
        fs::read_to_string(dir.join("memory.stat"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
    }

    /// What tells, once the task has ended, whether it went past its memory limit; `None`
    /// where it has none or no memory cgroup counts OOM kills.
    pub fn oom_watch(&self) -> Option<OomWatch> {
        let (dir, version) = self.memory_dir()?;
        Some(OomWatch {
            dir: dir.to_path_buf(),
            version,
            before: self.oom_before,
            limit: self.memory_limit?,
        })
    }

    /// The `cgroup.procs` files of [`TaskCgroup::procs_files`], open for writing: what the
    /// one-exec spawn writes its child into.
    pub(super) fn procs_fds(&self) -> &[std::os::fd::OwnedFd] {
        &self.slot.procs
    }

    /// The cgroup's directory, open, where it is a cgroup v2 one: the one-exec spawn starts its
    /// child in it (`clone3` with `CLONE_INTO_CGROUP`), and [`TaskCgroup::procs_fds`]' first
    /// file is then not written.
    pub(super) fn dir_fd(&self) -> Option<&std::os::fd::OwnedFd> {
        self.slot.dir.as_ref()
    }

    /// SIGKILLs every process in the cgroup, wherever it went in the process tree.
    pub fn kill(&self) {
        if self.slot.populated() != Some(false) {
            self.slot
                .killed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            kill_cgroup(&self.slot.path);
        }
    }
}

impl Drop for TaskCgroup {
    fn drop(&mut self) {
        // Killed, emptied and put back by the pool's releaser, off the task's path.
        self.free.give_back(std::mem::take(&mut self.slot));
    }
}

/// Whether the cgroup at `path` belongs to the cgroup v1 freezer hierarchy.
pub(super) fn is_freezer(path: &Path) -> bool {
    path.join("freezer.self_freezing").exists() || path.join("freezer.state").exists()
}

/// Whether the cgroup at `path` holds a process (`cgroup.events` in v2, `cgroup.procs` in v1);
/// `None` if unreadable.
pub fn populated(path: &Path) -> Option<bool> {
    if let Ok(events) = fs::read_to_string(path.join("cgroup.events")) {
        return events
            .lines()
            .find_map(|l| l.strip_prefix("populated "))
            .map(|v| v.trim() != "0");
    }
    Some(!processes(path)?.is_empty())
}

/// The processes in the cgroup at `path`; `None` if unreadable.
fn processes(path: &Path) -> Option<Vec<i32>> {
    let procs = fs::read_to_string(path.join("cgroup.procs")).ok()?;
    Some(
        procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect(),
    )
}

/// The CPU time of every process that ever ran in the cgroup at `path` (v2), or of those in it
/// now (v1, whose freezer cgroup does not count CPU time).
pub(super) fn cpu_usage(path: &Path) -> Duration {
    if let Ok(stat) = fs::read_to_string(path.join("cpu.stat")) {
        return stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
            .map(Duration::from_micros)
            .unwrap_or_default();
    }
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100);
    let used: u64 = processes(path)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // PID (COMM) STATE ...: utime and stime are the 12th and 13th fields after COMM.
            let rest = &stat[stat.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace().skip(11);
            let utime: u64 = fields.next()?.parse().ok()?;
            let stime: u64 = fields.next()?.parse().ok()?;
            Some(utime + stime)
        })
        .sum();
    Duration::from_micros(used * 1_000_000 / ticks)
}

/// The resident memory of every process in the cgroup at `path` (`/proc/PID/statm`), for a
/// cgroup the memory controller does not count (a host whose memory controller is on cgroup
/// v1); `None` if its processes cannot be listed.
fn resident_memory(path: &Path) -> Option<u64> {
    let procs = fs::read_to_string(path.join("cgroup.procs")).ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    let pages: u64 = procs
        .lines()
        .filter_map(|pid| {
            let statm = fs::read_to_string(format!("/proc/{}/statm", pid.trim())).ok()?;
            statm.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum();
    Some(pages * page)
}

/// SIGKILLs every process in the cgroup at `path`: `cgroup.kill` where the kernel has it; in
/// a freezer cgroup (v1), each process it lists while it is frozen, so that none forks in
/// between; else each process it lists, until none is left.
pub fn kill_cgroup(path: &Path) {
    if fs::write(path.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    if is_freezer(path) {
        freeze_and_kill(path);
        return;
    }
    for _ in 0..64 {
        let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) else {
            return;
        };
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Freezes the v1 freezer cgroup at `path`, SIGKILLs every process in it, and thaws it: a
/// frozen process cannot fork, and a killed one dies as it thaws.
fn freeze_and_kill(path: &Path) {
    let state = path.join("freezer.state");
    for _ in 0..16 {
        if fs::write(&state, "FROZEN").is_err() {
            return;
        }
        // The kernel freezes each process in turn (FREEZING until all are).
        for wait_us in [0, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000] {
            std::thread::sleep(Duration::from_micros(wait_us));
            if fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FROZEN") {
                break;
            }
        }
        let pids = processes(path).unwrap_or_default();
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let _ = fs::write(&state, "THAWED");
        if pids.is_empty() {
            return;
        }
        // They leave the cgroup as they die.
        for wait_us in [100, 1_000, 10_000] {
            std::thread::sleep(Duration::from_micros(wait_us));
            if processes(path).is_none_or(|p| p.is_empty()) {
                return;
            }
        }
    }
}

/// The children of process `pid`, from every one of its threads.
fn children(pid: u32) -> Vec<u32> {
    let Ok(threads) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Removes the (killed) cgroup at `path`: it can be removed once its processes are gone,
/// which takes the kernel a moment after the kill.
pub(super) fn remove(path: &Path) {
    for wait_us in [0, 100, 1_000, 10_000, 50_000] {
        std::thread::sleep(Duration::from_micros(wait_us));
        match fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(_) => {}
        }
    }
    tracing::debug!(path = %path.display(), "a task cgroup is still busy; left for later");
}

/// Kills and removes the task cgroups of worker processes that are gone: a worker SIGKILLed
/// together with its fence supervisor leaves its tasks running in them.
fn sweep_dead_workers(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(WORKER_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == crate::pidns::host_pid() || crate::pidns::host_process_alive(pid) {
            continue;
        }
        let dir = entry.path();
        let Ok(tasks) = fs::read_dir(&dir) else {
            continue;
        };
        let mut killed = 0;
        for task in tasks.flatten() {
            if task.path().is_dir() {
                // A slot, busy or free: whatever is in it is a dead worker's.
                kill_cgroup(&task.path());
                remove(&task.path());
                killed += 1;
            }
        }
        let _ = fs::remove_dir(&dir);
        if killed > 0 {
            tracing::warn!(
                dead_worker = pid,
                tasks = killed,
                "killed the tasks a dead worker left running (it died with its fence supervisor)"
            );
        }
    }
}

/// Enables `controller` for the task cgroups under `root`, in the unified hierarchy: in the
/// worker's own cgroup (`root`'s parent) and in `root`. The kernel refuses it for a cgroup that
/// holds processes itself, other than the hierarchy's root: the worker's own, unless the
/// worker runs in the root cgroup or a service manager delegated it a subtree it has left.
fn enable_unified(root: &Path, controller: Controller) -> Result<(), String> {
    let name = controller.name();
    let parent = root
        .parent()
        .ok_or_else(|| format!("{} has no parent", root.display()))?;
    let listed = |dir: &Path, file: &str| {
        fs::read_to_string(dir.join(file))
            .is_ok_and(|text| text.split_whitespace().any(|c| c == name))
    };
    if !listed(parent, "cgroup.controllers") {
        return Err(format!(
            "the {name} controller is not available in the unified hierarchy at {}",
            parent.display()
        ));
    }
    for dir in [parent, root] {
        if listed(dir, "cgroup.subtree_control") {
            continue;
        }
        fs::write(dir.join("cgroup.subtree_control"), format!("+{name}")).map_err(|e| {
            format!(
                "cannot enable the {name} controller for {} ({e}); run the worker in a cgroup \
                 of its own whose controllers it may enable (systemd: Delegate=yes)",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// The worker's directory of task cgroups named `name` in the cgroup v1 hierarchy of
/// `controller`, created (with the leftovers of dead workers there swept first).
fn v1_root(controller: Controller, name: &Path) -> Result<PathBuf, String> {
    let mount = cgroup1_mount(controller.name())?;
    let own = own_cgroup1(controller.name())?;
    let parent = mount.join(own.trim_start_matches('/'));
    sweep_dead_workers(&parent);
    let root = parent.join(name);
    match fs::create_dir(&root) {
        Ok(()) => Ok(root),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(root),
        Err(e) => Err(format!(
            "cannot create {} ({e}); run the worker as root, with the cgroup hierarchies \
             mounted writable",
            root.display()
        )),
    }
}

/// Where the unified (cgroup v2) hierarchy is mounted.
fn cgroup2_mount() -> Result<PathBuf, String> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    info.lines()
        .find_map(|line| {
            // ID PARENT MAJ:MIN ROOT MOUNT OPTIONS... - FSTYPE SOURCE SUPER
            let (fields, rest) = line.split_once(" - ")?;
            (rest.split_whitespace().next()? == "cgroup2")
                .then(|| fields.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .ok_or_else(|| "no cgroup v2 hierarchy is mounted".to_string())
}

/// Where the cgroup v1 hierarchy of `controller` is mounted.
fn cgroup1_mount(controller: &str) -> Result<PathBuf, String> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    info.lines()
        .find_map(|line| {
            // ID PARENT MAJ:MIN ROOT MOUNT OPTIONS... - cgroup SOURCE rw,freezer
            let (fields, rest) = line.split_once(" - ")?;
            let mut rest = rest.split_whitespace();
            let fstype = rest.next()?;
            let options = rest.nth(1)?;
            (fstype == "cgroup" && options.split(',').any(|o| o == controller))
                .then(|| fields.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .ok_or_else(|| format!("no cgroup v1 {controller} hierarchy is mounted"))
}

/// This process's cgroup in the cgroup v1 hierarchy of `controller` (`N:CONTROLLERS:/path` in
/// `/proc/self/cgroup`).
fn own_cgroup1(controller: &str) -> Result<String, String> {
    let text = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    text.lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .ok_or_else(|| format!("this process is in no cgroup v1 {controller} hierarchy"))
}

/// This process's cgroup in the unified hierarchy (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup() -> Result<String, String> {
    let text = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .ok_or_else(|| "this process is in no cgroup v2".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_hierarchy_and_this_processs_cgroup_are_found() {
        // Every Linux machine escher runs on mounts cgroup v2 (alone, or beside v1).
        let mount = cgroup2_mount().unwrap();
        assert!(mount.join("cgroup.controllers").exists(), "{mount:?}");
        let own = own_cgroup().unwrap();
        assert!(own.starts_with('/'), "{own}");
    }

    #[test]
    fn a_hierarchy_is_named_auto_v2_or_v1() {
        assert_eq!("auto".parse(), Ok(Hierarchy::Auto));
        assert_eq!("v2".parse(), Ok(Hierarchy::Unified));
        assert_eq!("v1".parse(), Ok(Hierarchy::Freezer));
        let err = "v3".parse::<Hierarchy>().unwrap_err();
        assert!(
            err.contains("auto, v2 (unified) or v1 (the freezer)"),
            "{err}"
        );
    }

    /// On a host that mounts the cgroup v1 freezer (the CI machines mount v1 controllers beside
    /// the unified hierarchy), as root: a task's process that left its process group with
    /// `setsid` is killed with the task's freezer cgroup, and the cgroup is reused once empty.
    #[test]
    fn a_freezer_cgroup_kills_what_left_the_tasks_process_group() {
        use std::io::BufRead;
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test creates cgroups: run it as root (CI does)"
        );
        let cgroups = TaskCgroups::discover(Hierarchy::Freezer).unwrap();
        assert!(cgroups.is_freezer(), "{:?}", cgroups.root());
        let cgroup = cgroups.create().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 600 & echo $!; exec sleep 600"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let escaped: i32 = line.trim().parse().unwrap();
        cgroup.enter(child.id()).unwrap();
        let inside = processes(cgroup.path()).unwrap();
        assert!(
            inside.contains(&escaped) && inside.contains(&(child.id() as i32)),
            "{inside:?}"
        );
        assert_eq!(populated(cgroup.path()), Some(true));
        let path = cgroup.path().to_path_buf();
        drop(cgroup);
        child.wait().unwrap();
        let gone = |pid: i32| {
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z')
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gone(escaped) {
            assert!(
                std::time::Instant::now() < deadline,
                "the escaped process {escaped} outlived its cgroup"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Killed, so removed rather than reused: a child `clone3` starts in a cgroup that was
        // killed can be killed at birth (`Slot::killed`).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while path.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed cgroup was never removed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(cgroups.free.free_count(), 0);
        assert_ne!(cgroups.create().unwrap().path(), path);
    }
}
