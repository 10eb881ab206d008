//! [`TaskCgroups`]: a kernel container (a cgroup v2) per command task, killed whole.
//!
//! A process group holds a task only while its processes stay in it: `setsid`, `setpgid` or a
//! double fork leaves it, and then no `killpg` reaches them. A cgroup holds every descendant
//! whatever it does, and `cgroup.kill` (Linux 5.14) SIGKILLs all of them at once. So each command
//! task gets a cgroup of its own, `slot-K`, under one directory per worker,
//! `escher-worker-PID-N` (N counts the workers of one process), created inside the worker's own cgroup in the unified (v2) hierarchy (on
//! a host that mounts cgroup v1 controllers too, the unified hierarchy beside them). When the
//! task ends, its cgroup is killed and removed; the fence supervisor (`crate::fence`) kills the
//! cgroups it holds when the worker dies or loses its lease; and a worker that starts kills and
//! removes what is left of workers on this host that died with their supervisor (a
//! `kill -9` of every process of theirs), before it takes any task.
//!
//! The task's main process is moved into its cgroup as soon as it is spawned (the worker's next
//! step), and then every process it has started already, walking the process tree down from it
//! (a process forked after its parent moved is born in the cgroup). The standard library could
//! only move the child before it runs its program with a `pre_exec` hook, which makes it fork
//! instead of using `posix_spawn`, the cost of every command task.
//!
//! A host without a writable cgroup v2 hierarchy (one that mounts only cgroup v1, as older
//! distributions and Kubernetes nodes do) gets the same containers in the v1 **freezer**
//! hierarchy ([`Hierarchy`]): there is no `cgroup.kill`, so a kill freezes the cgroup first
//! (`freezer.state`), so that no process in it can fork while they are listed and SIGKILLed,
//! and thaws it, letting them die. Without either (a worker that is not root and was not
//! delegated a subtree) tasks are held by their process group only, as the worker's log says at
//! start.
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
    /// Empty cgroups, ready for the next task.
    free: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
    /// The number of the next new one.
    next: std::sync::atomic::AtomicU64,
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
        match hierarchy {
            Hierarchy::Unified => unified(),
            Hierarchy::Freezer => freezer(),
            Hierarchy::Auto => unified()
                .or_else(|v2| freezer().map_err(|v1| format!("cgroup v2: {v2}; cgroup v1: {v1}"))),
        }
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
        Ok(TaskCgroups {
            root,
            free: std::sync::Arc::default(),
            next: std::sync::atomic::AtomicU64::new(0),
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

    /// An empty cgroup for one task: one from the pool, or a new one.
    pub fn create(&self) -> io::Result<TaskCgroup> {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let path = match reused {
            Some(path) => path,
            None => {
                let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = self.root.join(format!("slot-{n}"));
                fs::create_dir(&path)?;
                path
            }
        };
        let cpu_before = cpu_usage(&path);
        Ok(TaskCgroup {
            path,
            cpu_before,
            free: std::sync::Arc::clone(&self.free),
        })
    }
}

impl Drop for TaskCgroups {
    fn drop(&mut self) {
        let free = std::mem::take(
            &mut *self
                .free
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for path in free {
            let _ = fs::remove_dir(path);
        }
        let _ = fs::remove_dir(&self.root);
    }
}

/// One task's cgroup: killed when dropped, and back in its pool once empty.
#[derive(Debug)]
pub struct TaskCgroup {
    path: PathBuf,
    /// Its CPU time when the task got it.
    cpu_before: Duration,
    free: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
}

impl TaskCgroup {
    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves process `pid` into the cgroup, then every descendant it has already started (a
    /// process forked after its parent moved is born inside).
    pub fn enter(&self, pid: u32) -> io::Result<()> {
        let procs = self.path.join("cgroup.procs");
        fs::write(&procs, pid.to_string())?;
        let mut parents = vec![pid];
        let mut moved = 0;
        while let Some(parent) = parents.pop() {
            for child in children(parent) {
                // Gone already, or moved: either way it is not left outside.
                if fs::write(&procs, child.to_string()).is_ok() {
                    moved += 1;
                }
                parents.push(child);
            }
            if moved > 4096 {
                break;
            }
        }
        Ok(())
    }

    /// What the task's processes used so far: CPU time, and the memory they hold now where
    /// the kernel counts it for this cgroup.
    pub fn usage(&self) -> CgroupUsage {
        let cpu = cpu_usage(&self.path).saturating_sub(self.cpu_before);
        let memory = fs::read_to_string(self.path.join("memory.current"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .or_else(|| resident_memory(&self.path));
        CgroupUsage { cpu, memory }
    }

    /// SIGKILLs every process in the cgroup, wherever it went in the process tree.
    pub fn kill(&self) {
        if populated(&self.path) != Some(false) {
            kill_cgroup(&self.path);
        }
    }
}

impl Drop for TaskCgroup {
    fn drop(&mut self) {
        self.kill();
        if populated(&self.path) == Some(false) {
            self.free
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(std::mem::take(&mut self.path));
            return;
        }
        // Its processes are still dying: never reused, removed once empty.
        remove(&self.path);
    }
}

/// Whether the cgroup at `path` belongs to the cgroup v1 freezer hierarchy.
fn is_freezer(path: &Path) -> bool {
    path.join("freezer.self_freezing").exists() || path.join("freezer.state").exists()
}

/// Whether the cgroup at `path` holds a process (`cgroup.events` in v2, `cgroup.procs` in v1);
/// `None` if unreadable.
fn populated(path: &Path) -> Option<bool> {
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
fn cpu_usage(path: &Path) -> Duration {
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
fn remove(path: &Path) {
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
        // Empty again, so the next task gets it.
        assert_eq!(populated(&path), Some(false));
        assert_eq!(cgroups.create().unwrap().path(), path);
    }
}
