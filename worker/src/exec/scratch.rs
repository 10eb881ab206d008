//! [`Scratch`]: a size-limited directory of each command task's own (and of each Python
//! interpreter's), its `HOME`, `TMPDIR` and default working directory, emptied (its space back)
//! the moment the task ends.
//!
//! On a root worker whose tasks run as users of their own, each command task gets a tmpfs of
//! `size=` its `disk` request (MiB) or `--task-scratch-bytes`, mounted `nosuid,nodev` at
//! `{task dir}/escher-scratch-PID-RANDOM/{uid}-{n}` (its **slot**, root 0711 and root's), its
//! home the directory `{slot}/{task}-{attempt}`, 0700 and its user's. A task that fills it gets
//! "no space left on device" from its own writes, and fails with a reason that says it filled
//! its scratch; its neighbours' directories are other file systems and do not notice. A worker
//! killed outright leaves its slots mounted: the next worker to start on that task directory
//! unmounts and removes the scratch of every worker whose process is gone. Its pages are
//! memory, charged to the task's memory cgroup as a Kubernetes memory-backed `emptyDir` is, so
//! a task's scratch and its memory together stay within its `memory` request.
//!
//! # Made ahead, and reused by the same user
//!
//! Making a tmpfs (a superblock of its own), attaching it and unmounting it again is most of
//! what a task's scratch costs, and a command task is short. So:
//!
//! - A thread of the worker's (`escher-scratch`) keeps [`READY`] empty file systems of the
//!   default size made ahead, with the kernel's mount API (`fsopen`, `fsmount`). Such a file
//!   system is mounted nowhere: no path reaches it and no other process can open it, and it
//!   goes with the worker's descriptor of it. A user's first task attaches one at a new slot
//!   (`move_mount`); a task asking for another size, or one that finds none ready, has its own
//!   made as it starts.
//! - When a task ends, its scratch goes back to that thread, which removes the task's home
//!   and everything in it (not following links), then checks with `statfs` that the file
//!   system has as many blocks and inodes free as when it was new: nothing is left in it, not
//!   even a removed file that some process still holds open. Only then is the slot kept, for
//!   the next task of the **same user** and size (up to [`IDLE_PER_USER`] a user, [`IDLE`] in
//!   all); otherwise it is unmounted. A slot is never given to another user, and users are
//!   per namespace (`isolation.rs`), so never to another namespace. It is checked empty again
//!   as it is taken, and the next task gets a new home in it (`mkdir`, `chown`): no mount, no
//!   unmount. A process of the earlier task that outlived it (until its cgroup is killed)
//!   finds none of the earlier files there and can leave none: its home was removed (a removed
//!   directory takes no new files) and the slot's root is root's.
//!
//! Reused, a task's scratch costs the worker 100–175 µs of CPU against 325–500 µs made,
//! attached and unmounted for each task (2,000 tasks, 2 cores, docs/security.md).
//!
//! A worker that cannot mount (not root, no `CAP_SYS_ADMIN`) runs tasks in their namespace's
//! home, warns at start, and its node's `escher.disk` label says `reserve` without `scratch`.
//!
//! # The task's `/tmp`
//!
//! By default ([`Scratch::with_private_tmp`]; `--no-private-tmp` turns it off), a command task
//! with a scratch also finds it at `/tmp`, `/var/tmp` and `/dev/shm`, and so reaches nothing of
//! the host's `/tmp`: it starts
//! in a mount namespace of its own (`spawn.rs`, made with its clone) where its scratch is bound
//! over the three, so that a program that writes to `/tmp` rather than `TMPDIR` writes into
//! its own bounded scratch, not the host's, and finds no other tenant's files there. Its
//! `HOME`, `TMPDIR` and default working directory are then `/tmp`. The node says so in its
//! [`TMP_LABEL`]: `private`, or `host` with `--no-private-tmp`, where its tasks get no scratch (not
//! root, `--no-task-scratch`) or where the kernel has no pidfds (the one-exec spawn, Linux
//! 5.3).

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The scratch size of a task that asks for no `disk`, unless `--task-scratch-bytes` says
/// (1 GiB).
pub const DEFAULT_TASK_SCRATCH_BYTES: u64 = 1 << 30;

pub use escher_proto::types::TMP_LABEL;

/// `HOME`, `TMPDIR` and the default working directory of a task whose scratch is bound over
/// `/tmp`, as the task sees them.
pub const PRIVATE_TMP_HOME: &str = "/tmp";

/// Whether command tasks with a scratch get it as their `/tmp`, `/var/tmp` and `/dev/shm`:
/// where this kernel has the one-exec spawn, which makes their mount namespace.
pub fn private_tmp_available() -> bool {
    super::spawn::available()
}

/// The start of the name of a worker's scratch directory, `escher-scratch-PID-RANDOM`.
const PREFIX: &str = "escher-scratch-";

/// How many empty scratch file systems of the default size a worker keeps made ahead of its
/// tasks: more than the tasks a worker of a few dozen CPUs starts at once. An empty tmpfs
/// holds no pages, only its superblock.
const READY: usize = 16;

/// How many emptied scratch file systems a worker keeps attached for one user's next tasks of
/// one size: each holds no pages, only its superblock and mount.
const IDLE_PER_USER: usize = 16;

/// How many emptied scratch file systems a worker keeps attached for all its users together.
const IDLE: usize = 64;

/// Removes the scratch directories of workers that are gone (killed outright: SIGKILL, the
/// OOM killer) from `parent`, unmounting what their tasks still had mounted, so that a crash
/// leaves its tasks' scratch (memory, being tmpfs) only until the next worker starts there. A
/// live worker holds an exclusive `flock` on its directory for its whole life (the kernel drops
/// it with the process), so a directory is a dead worker's when its lock can be taken. The pid
/// in the name cannot say so alone: a root worker in a PID namespace of its own names its
/// directory with the pid it has there, which another namespace's `kill(pid, 0)` reads as
/// another process or none, and a worker sweeping from inside a namespace sees none of the
/// host's pids (it removed a live worker's scratch under its tasks). A directory whose lock is
/// free is still left alone while the pid its name gives exists here (a worker of before the
/// lock, which holds none).
fn sweep(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        // Held while the directory is swept, and dropped (unlocked) with it.
        let Some(_lock) = lock(&dir) else {
            continue; // a live worker's
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if !gone {
            continue;
        }
        if let Ok(tasks) = std::fs::read_dir(&dir) {
            for task in tasks.flatten() {
                let _ = nix::mount::umount2(&task.path(), nix::mount::MntFlags::MNT_DETACH);
                let _ = std::fs::remove_dir(task.path());
            }
        }
        match std::fs::remove_dir(&dir) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "removed the scratch of a worker that is gone")
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot remove the scratch of a worker that is gone")
            }
        }
    }
}

/// Takes the exclusive `flock` on directory `dir` without waiting; `None` when another
/// process holds it (or the directory cannot be opened).
fn lock(dir: &Path) -> Option<std::fs::File> {
    let file = std::fs::File::open(dir).ok()?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(file)
}

/// An empty tmpfs of `bytes`, `nosuid,nodev`, its root 0711 and root's, mounted nowhere: the
/// kernel's mount API (`fsopen`, `fsmount`) gives a descriptor of it, and it goes with the last
/// descriptor unless it was attached somewhere first ([`Slot::attach`]).
fn make(bytes: u64) -> std::io::Result<OwnedFd> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, fsconfig_create, fsconfig_set_string, fsmount,
        fsopen,
    };
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, "source", "escher-scratch")?;
    fsconfig_set_string(&fs, "size", bytes.to_string())?;
    fsconfig_set_string(&fs, "mode", "0711")?;
    fsconfig_create(&fs)?;
    Ok(fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?)
}

/// One scratch file system attached at `{worker dir}/{uid}-{n}` (its **slot**) for the tasks
/// of one user: its root 0711 and root's, holding at most one task's home at a time.
#[derive(Debug)]
struct Slot {
    /// Where it is attached.
    path: PathBuf,
    /// The user whose tasks it holds, and only theirs.
    uid: u32,
    /// Its size.
    bytes: u64,
    /// What it has free when it holds nothing: its free blocks and free inodes (`statfs`).
    empty: (u64, u64),
}

impl Slot {
    /// Attaches `fs` (from [`make`]) at a new slot of the worker's directory `root`.
    fn attach(fs: &OwnedFd, root: &Path, uid: u32, bytes: u64) -> std::io::Result<Slot> {
        use rustix::mount::{MoveMountFlags, move_mount};
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = root.join(format!("{uid}-{n}"));
        std::fs::create_dir(&path)?;
        if let Err(error) = move_mount(
            fs,
            "",
            rustix::fs::CWD,
            &path,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        ) {
            let _ = std::fs::remove_dir(&path);
            return Err(error.into());
        }
        let mut slot = Slot {
            path,
            uid,
            bytes,
            empty: (0, 0),
        };
        match slot.free() {
            Ok(free) => slot.empty = free,
            Err(error) => {
                slot.detach();
                return Err(error);
            }
        }
        Ok(slot)
    }

    /// Its free blocks and free inodes now.
    fn free(&self) -> std::io::Result<(u64, u64)> {
        let fs = rustix::fs::statfs(&self.path)?;
        Ok((fs.f_bfree as u64, fs.f_ffree as u64))
    }

    /// Whether it holds nothing: as many blocks and inodes free as when it was made, so no
    /// file (not even one removed and still held open) is left in it.
    fn is_empty(&self) -> bool {
        self.free().is_ok_and(|free| free == self.empty)
    }

    /// Makes `{slot}/{name}`, 0700 and its user's: a task's home.
    fn home(&self, name: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let home = self.path.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&home)?;
        // Given whole: the mode, which the umask may have narrowed, then the owner.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
        std::os::unix::fs::chown(&home, Some(self.uid), Some(self.uid))?;
        Ok(home)
    }

    /// Unmounts it (detached: a process still holding a file of it open cannot keep the mount
    /// point busy; its pages go with the last reference) and removes its mount point.
    fn detach(self) {
        if let Err(error) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.path.display(), %error, "cannot unmount a task's scratch");
            return;
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// A task's home in `slot`, back from its task: emptied by [`Pool::keep_ready`]'s thread.
#[derive(Debug)]
struct Returned {
    slot: Slot,
    home: PathBuf,
}

impl Returned {
    /// Removes the task's home and everything in it, and gives back its slot if that then
    /// holds nothing; unmounts it otherwise.
    fn empty(self) -> Option<Slot> {
        // The standard library's removal opens each directory without following links, so
        // that a link the task left cannot send it elsewhere.
        match std::fs::remove_dir_all(&self.home) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::debug!(home = %self.home.display(), %error, "cannot empty a task's scratch: it is unmounted, not reused");
                self.slot.detach();
                return None;
            }
        }
        if self.slot.is_empty() {
            Some(self.slot)
        } else {
            // A file removed that a process still holds open: its space is not free.
            tracing::debug!(path = %self.slot.path.display(), "a task's scratch is not empty once its home is removed: it is unmounted, not reused");
            self.slot.detach();
            None
        }
    }
}

/// The file systems made ahead of the tasks, the emptied slots kept for their users' next
/// tasks, and what the thread that makes and empties them waits on.
#[derive(Debug)]
struct Pool {
    /// The size of each made ahead (the default scratch size).
    bytes: u64,
    state: Mutex<Ready>,
    /// Signalled when one is taken, one is given back, and when the pool closes.
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Ready {
    /// Empty file systems, mounted nowhere, their roots root's.
    made: Vec<OwnedFd>,
    /// Emptied slots, by their user and size.
    idle: std::collections::HashMap<(u32, u64), Vec<Slot>>,
    /// How many `idle` holds in all.
    idle_count: usize,
    /// Homes of tasks that have ended, to empty.
    returned: Vec<Returned>,
    /// The worker's scratch is gone: make no more.
    closed: bool,
}

impl Pool {
    fn state(&self) -> MutexGuard<'_, Ready> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One made ahead, if there is one.
    fn take(&self) -> Option<OwnedFd> {
        let fs = self.state().made.pop();
        self.wake.notify_one();
        fs
    }

    /// An emptied slot of `uid`'s of `bytes`, if there is one.
    fn take_idle(&self, uid: u32, bytes: u64) -> Option<Slot> {
        let mut state = self.state();
        let slot = state.idle.get_mut(&(uid, bytes))?.pop()?;
        state.idle_count -= 1;
        Some(slot)
    }

    /// A task's home, back from its task, for the thread to empty; emptied here if the pool
    /// is closed.
    fn give_back(&self, returned: Returned) {
        let mut state = self.state();
        if state.closed {
            drop(state);
            if let Some(slot) = returned.empty() {
                slot.detach();
            }
            return;
        }
        state.returned.push(returned);
        drop(state);
        self.wake.notify_one();
    }

    /// The thread's loop until the pool closes: empties what tasks gave back (keeping a slot
    /// for its user's next task, up to [`IDLE_PER_USER`] each and [`IDLE`] in all) and keeps
    /// [`READY`] made. A failure to make one (which the trial at start did not meet) stops the
    /// making: tasks then have theirs made as they start, and say so if that fails too.
    fn keep_ready(&self) {
        let mut making = true;
        loop {
            let returned = {
                let mut state = self.state();
                while !state.closed
                    && state.returned.is_empty()
                    && (!making || state.made.len() >= READY)
                {
                    state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                if state.closed {
                    return;
                }
                std::mem::take(&mut state.returned)
            };
            if !returned.is_empty() {
                for back in returned {
                    let Some(slot) = back.empty() else { continue };
                    let mut state = self.state();
                    let key = (slot.uid, slot.bytes);
                    let kept = state.idle.get(&key).map_or(0, Vec::len);
                    if state.closed || kept >= IDLE_PER_USER || state.idle_count >= IDLE {
                        drop(state);
                        slot.detach();
                    } else {
                        state.idle.entry(key).or_default().push(slot);
                        state.idle_count += 1;
                    }
                }
                continue;
            }
            match make(self.bytes) {
                Ok(fs) => self.state().made.push(fs),
                Err(error) => {
                    tracing::warn!(%error, "cannot make tasks' scratch ahead of them: each is made as its task starts");
                    making = false;
                }
            }
        }
    }

    /// Makes no more, and lets go of those made (the kernel frees them). What is attached is
    /// unmounted with the worker's directory ([`Scratch`]'s drop).
    fn close(&self) {
        let made = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.made)
        };
        self.wake.notify_all();
        drop(made);
    }
}

/// Where a worker mounts its tasks' scratch directories.
#[derive(Debug)]
pub struct Scratch {
    /// `{task dir}/escher-scratch-PID-RANDOM`, 0711, the worker's: a task reaches its own
    /// directory and lists none.
    root: tempfile::TempDir,
    /// The directory opened with its `flock` held, for as long as the worker lives: another
    /// worker's [`sweep`] leaves a locked directory alone.
    _lock: std::fs::File,
    /// The size of a task's scratch when it asks for no `disk`.
    default_bytes: u64,
    /// Scratch file systems of `default_bytes` made ahead, and emptied slots.
    pool: Arc<Pool>,
    /// The thread that makes and empties them.
    maker: Option<std::thread::JoinHandle<()>>,
    /// Whether command tasks also get their scratch as `/tmp`, `/var/tmp` and `/dev/shm`
    /// (unless `--no-private-tmp`; see the module's doc).
    private_tmp: bool,
}

impl Scratch {
    /// Gives command tasks their scratch as `/tmp`, `/var/tmp` and `/dev/shm` too, when `on`
    /// and [`private_tmp_available`] (unless `--no-private-tmp`).
    pub fn with_private_tmp(mut self, on: bool) -> Scratch {
        self.private_tmp = on && private_tmp_available();
        self
    }

    /// Whether command tasks get their scratch as `/tmp`, `/var/tmp` and `/dev/shm`.
    pub fn private_tmp(&self) -> bool {
        self.private_tmp
    }

    /// Makes the directory the scratch mounts go in, under `parent`, checks that this process
    /// may mount a tmpfs there, and starts the thread that makes scratch ahead of the tasks.
    /// The error says why not.
    pub fn open(parent: &Path, default_bytes: u64) -> Result<Scratch, String> {
        sweep(parent);
        let root = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(|e| format!("cannot create a directory in {}: {e}", parent.display()))?;
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("cannot set {}'s mode: {e}", root.path().display()))?;
        let lock =
            lock(root.path()).ok_or_else(|| format!("cannot lock {}", root.path().display()))?;
        let pool = Arc::new(Pool {
            bytes: default_bytes,
            state: Mutex::default(),
            wake: Condvar::new(),
        });
        // A trial mount, as the first task's would be, detached at once.
        let uid = nix::unistd::geteuid().as_raw();
        make(4096)
            .and_then(|fs| Slot::attach(&fs, root.path(), uid, 4096))
            .map(Slot::detach)
            .map_err(|e| {
                format!(
                    "cannot mount a tmpfs in {} for tasks' scratch: {e}",
                    root.path().display()
                )
            })?;
        let maker = {
            let pool = Arc::clone(&pool);
            std::thread::Builder::new()
                .name("escher-scratch".into())
                .spawn(move || pool.keep_ready())
                .map_err(|e| format!("cannot start the thread that makes tasks' scratch: {e}"))?
        };
        Ok(Scratch {
            root,
            _lock: lock,
            default_bytes,
            pool,
            maker: Some(maker),
            private_tmp: false,
        })
    }

    /// The size of a task's scratch: its `disk` request (MiB) if it made one, else the default.
    pub fn bytes_for(&self, disk_mib: Option<u64>) -> u64 {
        disk_mib
            .filter(|&m| m > 0)
            .map_or(self.default_bytes, |m| m.saturating_mul(1 << 20))
    }

    /// The scratch size of a task that asks for no `disk`.
    pub fn default_bytes(&self) -> u64 {
        self.default_bytes
    }

    /// Gives the attempt `name` (`{task}-{attempt}`) a scratch of `bytes`, its home owned by
    /// `uid`: an emptied slot of that user's if one is kept, else a file system made ahead
    /// (if `bytes` is the default and one is ready) or made now, attached at a new slot.
    /// Blocking (a few system calls).
    pub fn mount(&self, name: &str, uid: u32, bytes: u64) -> Result<TaskScratch, String> {
        let failed = |e: std::io::Error| {
            format!(
                "cannot mount a tmpfs of {bytes} bytes in {} for the task's scratch: {e}",
                self.root.path().display()
            )
        };
        let slot = loop {
            match self.pool.take_idle(uid, bytes) {
                // Checked again as it is taken: nothing may have come back into it since.
                Some(slot) if slot.is_empty() => break slot,
                Some(slot) => slot.detach(),
                None => {
                    let ready = if bytes == self.pool.bytes {
                        self.pool.take()
                    } else {
                        None
                    };
                    let fs = ready.map_or_else(|| make(bytes), Ok).map_err(failed)?;
                    break Slot::attach(&fs, self.root.path(), uid, bytes).map_err(failed)?;
                }
            }
        };
        let home = match slot.home(name) {
            Ok(home) => home,
            Err(e) => {
                let why = format!(
                    "cannot make the task's scratch {}: {e}",
                    slot.path.join(name).display()
                );
                slot.detach();
                return Err(why);
            }
        };
        Ok(TaskScratch {
            pool: Arc::clone(&self.pool),
            slot: Some(slot),
            home,
            bytes,
        })
    }
}

/// One attempt's scratch directory: emptied when dropped (by the worker's scratch thread),
/// its file system then kept for its user's next task or unmounted.
#[derive(Debug)]
pub struct TaskScratch {
    pool: Arc<Pool>,
    /// `None` once given back.
    slot: Option<Slot>,
    /// `{slot}/{task}-{attempt}`.
    home: PathBuf,
    bytes: u64,
}

impl TaskScratch {
    /// Its path: the task's `HOME`, `TMPDIR` and default working directory.
    pub fn path(&self) -> &Path {
        &self.home
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the task filled it: less than a page is left.
    pub fn full(&self) -> bool {
        super::disk::space_of(&self.home).is_ok_and(|s| s.free < 4096)
    }

    /// Why a task that failed with its scratch full failed.
    pub fn full_reason(&self) -> String {
        format!(
            "filled its scratch of {} MiB (its HOME and TMPDIR, a tmpfs of its own): its writes \
             there failed with \"no space left on device\"; ask for more with a disk request in \
             MiB on a node that offers disk, or the worker's --task-scratch-bytes",
            self.bytes >> 20
        )
    }
}

impl Drop for TaskScratch {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool.give_back(Returned {
                slot,
                home: std::mem::take(&mut self.home),
            });
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.pool.close();
        if let Some(maker) = self.maker.take() {
            let _ = maker.join();
        }
        // What is still mounted (slots kept, a task the worker never got to end) goes before
        // the directory.
        if let Ok(entries) = std::fs::read_dir(self.root.path()) {
            for entry in entries.flatten() {
                let _ = nix::mount::umount2(&entry.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, Instant};

    /// Waits (up to 30 s) until `done` says so.
    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 30 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How many slots `scratch` keeps for `uid`'s tasks of `bytes`.
    fn idle(scratch: &Scratch, uid: u32, bytes: u64) -> usize {
        scratch
            .pool
            .state()
            .idle
            .get(&(uid, bytes))
            .map_or(0, Vec::len)
    }

    /// Run as root (CI), this mounts real scratch; elsewhere it checks the refusal.
    #[test]
    fn a_scratch_holds_its_size_and_is_emptied_when_dropped() {
        let parent = tempfile::tempdir().unwrap();
        let scratch = match Scratch::open(parent.path(), 1 << 20) {
            Ok(scratch) => scratch,
            Err(why) => {
                assert!(!nix::unistd::geteuid().is_root(), "{why}");
                assert!(why.contains("cannot mount"), "{why}");
                return;
            }
        };
        assert_eq!(scratch.bytes_for(None), 1 << 20);
        assert_eq!(scratch.bytes_for(Some(2)), 2 << 20);
        let task = scratch.mount("1-1", 300_300, 1 << 20).unwrap();
        let meta = std::fs::metadata(task.path()).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (300_300, 0o700));
        assert!(!task.full());
        let big = std::fs::write(task.path().join("big"), vec![0u8; 2 << 20]);
        assert!(big.is_err(), "2 MiB fit in a 1 MiB scratch");
        assert!(task.full());
        assert!(task.full_reason().contains("filled its scratch of 1 MiB"));
        let path = task.path().to_path_buf();
        drop(task);
        wait_until("the task's home removed", || !path.exists());
        drop(scratch);
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    /// The scratch made ahead of the tasks is mounted nowhere until a task takes it; each task
    /// gets an empty one of the default size, its user's and 0700, never one another task
    /// wrote in, however many tasks take them in a row; nothing stays mounted after the
    /// worker's scratch goes.
    #[test]
    fn needs_root_scratch_made_ahead_is_empty_and_the_takers_own() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it mounts a tmpfs"
        );
        let parent = tempfile::tempdir().unwrap();
        let scratch = Scratch::open(parent.path(), 1 << 20).unwrap();
        wait_until("the pool filled", || {
            scratch.pool.state().made.len() >= READY
        });
        let mounted = || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| l.contains(&*parent.path().to_string_lossy()))
                .count()
        };
        assert_eq!(mounted(), 0, "scratch made ahead is mounted somewhere");
        let mut held = Vec::new();
        for i in 0..3 * READY {
            let uid = 300_300 + (i % 2) as u32;
            let task = scratch.mount(&format!("{i}-1"), uid, 1 << 20).unwrap();
            let meta = std::fs::metadata(task.path()).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (uid, uid));
            assert_eq!(meta.mode() & 0o7777, 0o700);
            let found: Vec<_> = std::fs::read_dir(task.path()).unwrap().collect();
            assert!(found.is_empty(), "task {i} found {found:?}");
            assert_eq!(
                super::super::disk::space_of(task.path()).unwrap().free,
                1 << 20
            );
            std::fs::write(task.path().join("mine"), format!("task {i}")).unwrap();
            // Half are held while the next are taken, half end at once.
            if i % 2 == 0 {
                held.push(task);
            }
        }
        assert!(mounted() >= held.len());
        drop(held);
        drop(scratch);
        assert_eq!(mounted(), 0);
    }

    /// A scratch back from a task is emptied and kept for its user's next task, which finds
    /// none of the last task's files (nor its space used); it is never given to another user;
    /// and one that still holds a removed file some process has open is unmounted, not kept.
    #[test]
    fn needs_root_a_reused_scratch_holds_nothing_of_the_last_task_and_is_one_users() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it mounts a tmpfs"
        );
        let (a, b, size) = (300_310, 300_311, 1 << 20);
        let parent = tempfile::tempdir().unwrap();
        let scratch = Scratch::open(parent.path(), size).unwrap();
        let first = scratch.mount("1-1", a, size).unwrap();
        let slot = first.path().parent().unwrap().to_path_buf();
        let home = first.path().to_path_buf();
        std::fs::write(home.join("secret"), b"task 1's").unwrap();
        std::fs::create_dir_all(home.join("deep/er")).unwrap();
        std::fs::write(home.join("deep/er/file"), vec![1u8; 64 << 10]).unwrap();
        std::os::unix::fs::symlink("/etc", home.join("link")).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
        drop(first);
        wait_until("the scratch kept for a", || idle(&scratch, a, size) == 1);
        assert!(
            std::fs::read_dir("/etc").unwrap().next().is_some(),
            "the link was followed"
        );

        // Another user's task never gets it.
        let other = scratch.mount("2-1", b, size).unwrap();
        assert_ne!(other.path().parent().unwrap(), slot, "b got a's scratch");
        assert_eq!(idle(&scratch, a, size), 1);
        drop(other);

        // The same user's next task does, empty, whole and its own.
        let second = scratch.mount("3-1", a, size).unwrap();
        assert_eq!(
            second.path().parent().unwrap(),
            slot,
            "a's scratch was not reused"
        );
        assert!(!home.exists(), "task 1's home is still there");
        let found: Vec<_> = std::fs::read_dir(&slot)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(found, ["3-1"], "the slot holds more than task 3's home");
        let found: Vec<_> = std::fs::read_dir(second.path()).unwrap().collect();
        assert!(found.is_empty(), "task 3 found {found:?}");
        assert!(!second.path().join("secret").exists());
        assert_eq!(
            super::super::disk::space_of(second.path()).unwrap().free,
            size
        );
        let meta = std::fs::metadata(second.path()).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (a, 0o700));
        let root = std::fs::metadata(&slot).unwrap();
        assert_eq!((root.uid(), root.mode() & 0o7777), (0, 0o711));

        // A removed file still held open keeps its space: that scratch is not reused.
        let held_path = second.path().join("held");
        std::fs::write(&held_path, vec![2u8; 64 << 10]).unwrap();
        let held = std::fs::File::open(&held_path).unwrap();
        drop(second);
        wait_until("the scratch still holding a file unmounted", || {
            !slot.exists()
        });
        assert_eq!(idle(&scratch, a, size), 0);
        let third = scratch.mount("4-1", a, size).unwrap();
        assert_ne!(third.path().parent().unwrap(), slot);
        assert!(std::fs::read_dir(third.path()).unwrap().next().is_none());
        drop((held, third));
        drop(scratch);
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    /// A worker killed outright leaves its tasks' scratch mounted; the next one to start there
    /// unmounts and removes it, and leaves a live worker's alone.
    #[test]
    fn needs_root_a_dead_workers_scratch_is_swept_by_the_next() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it mounts a tmpfs"
        );
        let parent = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = parent.path().join(format!("{PREFIX}{dead}-abcdef"));
        let live = parent
            .path()
            .join(format!("{PREFIX}{}-ghijkl", std::process::id()));
        // A live worker seen from another PID namespace: the pid its name gives is none here,
        // but it holds its directory's lock.
        let elsewhere = parent.path().join(format!("{PREFIX}{dead}-mnopqr"));
        for dir in [&stale, &live, &elsewhere] {
            std::fs::create_dir_all(dir.join("7-1")).unwrap();
            nix::mount::mount(
                Some("escher-scratch"),
                &dir.join("7-1"),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some("size=65536"),
            )
            .unwrap();
            std::fs::write(dir.join("7-1").join("left"), b"a task's file").unwrap();
        }
        let held = lock(&elsewhere).expect("the lock is free");
        let scratch = Scratch::open(parent.path(), 1 << 20).unwrap();
        assert!(!stale.exists(), "the dead worker's scratch stayed");
        for dir in [&live, &elsewhere] {
            assert!(
                dir.join("7-1").join("left").exists(),
                "a live worker's scratch was touched: {}",
                dir.display()
            );
            nix::mount::umount2(&dir.join("7-1"), nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
        drop(held);
        drop(scratch);
    }
}
