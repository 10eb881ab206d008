//! The pool of empty task cgroups behind [`TaskCgroups`](super::TaskCgroups), and the thread
//! that puts a task's cgroup back into it once the task is over.
//!
//! Containment must cost little per task (the `cmd` benchmark holds a worker with a cgroup
//! per task and a user per namespace to 0.8 of one without either), so a task's start touches
//! as little of the cgroup file system as it can:
//!
//! - a cgroup is made once and reused: a task gets one from the pool ([`Slot`]), with the
//!   limits it holds already written (they are rewritten only when the task asks for other
//!   limits; the pool hands out a cgroup holding the same limits first);
//! - the files every task needs stay open in the slot: each `cgroup.procs` the task's process
//!   writes itself into (`spawn.rs`), and the `cgroup.events` and `cpu.stat` read when it ends
//!   (read again from the start with `pread`, no `open` per task);
//! - what a task's end costs is off its path: the task's cgroup goes to a thread of its own
//!   (the **releaser**), which kills what is left in it, waits for it to empty, reads the CPU
//!   time it counts (the next task's starting point) and puts it back into the pool; one that
//!   had to be killed (processes left in it, a cancelled or timed-out task) or does not empty
//!   is removed, never reused (see [`Slot::killed`]).
//!
//! The pool is closed when the worker's `TaskCgroups` goes: cgroups released after that are
//! removed, and the worker's directories with the last of them.

use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::cgroup::{LimitDir, cpu_usage, kill_cgroup, populated};
use super::limits::TaskLimits;

/// One task cgroup (and those that hold its limits in v1 hierarchies), with the files each of
/// its tasks uses open.
#[derive(Debug, Default)]
pub(super) struct Slot {
    /// Its directory in the hierarchy that kills it.
    pub(super) path: PathBuf,
    /// The cgroups that hold its limits (`path` itself among them, for the unified hierarchy).
    pub(super) limit_dirs: Vec<LimitDir>,
    /// The `cgroup.procs` of `path` (first) and of each limit cgroup, open for writing.
    pub(super) procs: Vec<OwnedFd>,
    /// `path` itself, open, where it is a cgroup v2 directory: what `clone3` starts a task in
    /// (`CLONE_INTO_CGROUP`).
    pub(super) dir: Option<OwnedFd>,
    /// `cgroup.events` (cgroup v2), open for reading.
    events: Option<File>,
    /// `cpu.stat` (cgroup v2), open for reading.
    cpu_stat: Option<File>,
    /// The limits written into its cgroups; `None`: not known (not all were written).
    pub(super) written: Option<TaskLimits>,
    /// The CPU time it had counted when it came back empty: the next task's zero.
    pub(super) cpu_before: Duration,
    /// Whether it was killed (`cgroup.kill`, or the freezer's kill): such a cgroup is removed,
    /// never reused. On the developers' kernel (6.18), a child that `clone3` started in a
    /// cgroup `cgroup.kill` had been written to was SIGKILLed at birth: every task after a
    /// killed one on that slot died at once (`e2e_failures`' cgroup v2 fence test).
    pub(super) killed: std::sync::atomic::AtomicBool,
}

impl Slot {
    /// A new slot for the cgroup at `path` (made already), whose limit cgroups are
    /// `limit_dirs`: its files opened, nothing written yet.
    pub(super) fn open(path: PathBuf, limit_dirs: Vec<LimitDir>) -> io::Result<Slot> {
        let mut procs = Vec::new();
        for dir in std::iter::once(path.as_path()).chain(
            limit_dirs
                .iter()
                .map(|d| d.path.as_path())
                .filter(|d| *d != path),
        ) {
            let file = dir.join("cgroup.procs");
            let fd = fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
            procs.push(OwnedFd::from(fd));
        }
        let dir = if super::cgroup::is_freezer(&path) {
            None
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            let dir = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Some(OwnedFd::from(dir))
        };
        let events = File::open(path.join("cgroup.events")).ok();
        let cpu_stat = File::open(path.join("cpu.stat")).ok();
        let mut slot = Slot {
            path,
            limit_dirs,
            procs,
            dir,
            events,
            cpu_stat,
            written: None,
            cpu_before: Duration::ZERO,
            killed: Default::default(),
        };
        slot.cpu_before = slot.cpu();
        Ok(slot)
    }

    /// Whether a process is in it; `None` if that cannot be read.
    pub(super) fn populated(&self) -> Option<bool> {
        match &self.events {
            Some(events) => {
                let text = read_from_start(events)?;
                text.lines()
                    .find_map(|l| l.strip_prefix("populated "))
                    .map(|v| v.trim() != "0")
            }
            None => populated(&self.path),
        }
    }

    /// The CPU time of every process that ever ran in it (cgroup v2), or of those in it now
    /// (a v1 freezer cgroup, which counts none).
    pub(super) fn cpu(&self) -> Duration {
        let Some(stat) = &self.cpu_stat else {
            return cpu_usage(&self.path);
        };
        read_from_start(stat)
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
            })
            .map(Duration::from_micros)
            .unwrap_or_default()
    }

    /// Removes its cgroups once they are empty (waiting a moment for dying processes); what
    /// cannot be removed yet is left, and logged.
    fn remove(self) {
        super::cgroup::remove(&self.path);
        for dir in &self.limit_dirs {
            if dir.path != self.path {
                super::cgroup::remove(&dir.path);
            }
        }
    }
}

/// A kernel file (`cgroup.events`, `cpu.stat`) read again from its start.
fn read_from_start(file: &File) -> Option<String> {
    let mut buf = [0u8; 1024];
    let n = file.read_at(&mut buf, 0).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The empty cgroups, and whether the pool still takes them back.
#[derive(Debug, Default)]
struct Free {
    slots: Vec<Slot>,
    /// The worker's directories, once its `TaskCgroups` is gone: cgroups released then are
    /// removed, and these after them.
    closed: Option<Vec<PathBuf>>,
}

/// The pool of one worker's empty task cgroups, shared with its releaser thread.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    free: Arc<Mutex<Free>>,
    release: mpsc::Sender<Slot>,
}

impl Pool {
    /// An empty pool, and its releaser thread (it ends when the pool and every cgroup taken
    /// from it are gone).
    pub(super) fn new() -> io::Result<Pool> {
        let free = Arc::new(Mutex::new(Free::default()));
        let (release, released) = mpsc::channel::<Slot>();
        let shared = Arc::clone(&free);
        std::thread::Builder::new()
            .name("escher-cgroups".into())
            .spawn(move || {
                for slot in released {
                    put_back(&shared, slot);
                }
            })?;
        Ok(Pool { free, release })
    }

    fn lock(&self) -> MutexGuard<'_, Free> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An empty cgroup, one that holds `limits` already if there is one.
    pub(super) fn take(&self, limits: &TaskLimits) -> Option<Slot> {
        let mut free = self.lock();
        let same = free
            .slots
            .iter()
            .rposition(|s| s.written.as_ref() == Some(limits));
        match same {
            Some(i) => Some(free.slots.swap_remove(i)),
            None => free.slots.pop(),
        }
    }

    /// Gives back a cgroup a task is done with: the releaser kills what is left in it and
    /// puts it back once empty.
    pub(super) fn give_back(&self, slot: Slot) {
        if let Err(mpsc::SendError(slot)) = self.release.send(slot) {
            // No releaser (it could not be started again): here, then.
            put_back(&self.free, slot);
        }
    }

    /// Puts an empty cgroup back at once (one whose task never started).
    pub(super) fn put_empty(&self, slot: Slot) {
        put_back(&self.free, slot);
    }

    /// Closes the pool: every empty cgroup is removed now, those released later as they
    /// come, and then `roots`.
    pub(super) fn close(&self, roots: Vec<PathBuf>) {
        let slots = {
            let mut free = self.lock();
            free.closed = Some(roots.clone());
            std::mem::take(&mut free.slots)
        };
        for slot in slots {
            slot.remove();
        }
        remove_roots(&roots);
    }

    /// How many empty cgroups the pool holds (for tests: release is asynchronous).
    #[cfg(test)]
    pub(super) fn free_count(&self) -> usize {
        self.lock().slots.len()
    }
}

/// Kills what is left in `slot`, waits for it to empty, and puts it back into `free`; one
/// that does not empty, or comes back to a closed pool, is removed.
fn put_back(free: &Mutex<Free>, mut slot: Slot) {
    let mut empty = slot.populated() == Some(false);
    if !empty {
        slot.killed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        kill_cgroup(&slot.path);
        // The kernel takes a moment to end the killed processes.
        for wait_us in [0, 100, 1_000, 10_000, 50_000] {
            std::thread::sleep(Duration::from_micros(wait_us));
            if slot.populated() == Some(false) {
                empty = true;
                break;
            }
        }
    }
    if empty {
        slot.cpu_before = slot.cpu();
    }
    let mut guard = free
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let killed = slot.killed.load(std::sync::atomic::Ordering::Relaxed);
    match (&guard.closed, empty && !killed) {
        (None, true) => guard.slots.push(slot),
        (None, false) => {
            drop(guard);
            tracing::debug!(path = %slot.path.display(), empty, killed, "a task cgroup that was killed, or does not empty, is removed, not reused");
            slot.remove();
        }
        (Some(roots), _) => {
            let roots = roots.clone();
            drop(guard);
            slot.remove();
            remove_roots(&roots);
        }
    }
}

/// Removes the worker's (empty) directories of task cgroups.
fn remove_roots(roots: &[PathBuf]) {
    for root in roots {
        let _ = fs::remove_dir(root);
    }
}
