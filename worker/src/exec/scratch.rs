//! [`Scratch`]: a size-limited directory of each command task's own, its `HOME`, `TMPDIR` and
//! default working directory, gone (and its space back) the moment the task ends.
//!
//! On a root worker whose tasks run as users of their own, each command task gets a tmpfs of
//! `size=` its `disk` request (MiB) or `--task-scratch-bytes`, mounted `nosuid,nodev` at
//! `{task dir}/escher-scratch-PID-RANDOM/{task}-{attempt}`, 0700 and its user's. A task that fills it
//! gets "no space left on device" from its own writes, and fails with a reason that says it
//! filled its scratch; its neighbours' directories are other file systems and do not notice.
//! The worker unmounts it as soon as the task has ended (after reading its outcome file): no
//! sweep, no leftover. A worker killed outright cannot: the next worker to start on that task
//! directory unmounts and removes the scratch of every worker whose process is gone. Its pages are memory, charged to the task's memory cgroup as a
//! Kubernetes memory-backed `emptyDir` is, so a task's scratch and its memory together stay
//! within its `memory` request.
//!
//! # Made ahead of the task
//!
//! Making a tmpfs (a superblock of its own) is most of what a mount costs, and a command task
//! is short: a thread of the worker's (`escher-scratch`) keeps [`READY`] empty file systems of
//! the default size made ahead, with the kernel's mount API (`fsopen`, `fsmount`). Such a file
//! system is mounted nowhere: no path reaches it and no other process can open it, and it goes
//! with the worker's descriptor of it (a worker that dies leaves none of them behind). Its root
//! is 0700 and root's until a task takes it: then it is given to the task's user (`chown` of
//! its root) and attached at the task's path (`move_mount`), which is all a task's start pays.
//! Each is used by one task only, and unmounted when that task ends (off its path), so no task
//! ever sees another's files. A task asking for another size, or one that finds none ready,
//! has its own made as it starts.
//!
//! A worker that cannot mount (not root, no `CAP_SYS_ADMIN`) runs tasks in their namespace's
//! home, warns at start, and its node's `escher.disk` label says `reserve` without `scratch`.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The scratch size of a task that asks for no `disk`, unless `--task-scratch-bytes` says
/// (1 GiB).
pub const DEFAULT_TASK_SCRATCH_BYTES: u64 = 1 << 30;

/// The start of the name of a worker's scratch directory, `escher-scratch-PID-RANDOM`.
const PREFIX: &str = "escher-scratch-";

/// How many empty scratch file systems of the default size a worker keeps made ahead of its
/// tasks: more than the tasks a worker of a few dozen CPUs starts at once. An empty tmpfs
/// holds no pages, only its superblock.
const READY: usize = 16;

/// Removes the scratch directories of workers that are gone (killed outright: SIGKILL, the
/// OOM killer) from `parent`, unmounting what their tasks still had mounted, so that a crash
/// leaves its tasks' scratch (memory, being tmpfs) only until the next worker starts there. A
/// directory is a dead worker's when the process its name gives no longer exists.
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
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if !gone {
            continue;
        }
        let dir = entry.path();
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

/// An empty tmpfs of `bytes`, `nosuid,nodev`, its root 0700 and root's, mounted nowhere: the
/// kernel's mount API (`fsopen`, `fsmount`) gives a descriptor of it, and it goes with the last
/// descriptor unless it was attached somewhere first ([`attach`]).
fn make(bytes: u64) -> std::io::Result<OwnedFd> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, fsconfig_create, fsconfig_set_string, fsmount,
        fsopen,
    };
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, "source", "escher-scratch")?;
    fsconfig_set_string(&fs, "size", bytes.to_string())?;
    fsconfig_set_string(&fs, "mode", "0700")?;
    fsconfig_create(&fs)?;
    Ok(fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?)
}

/// Gives the file system `fs` (from [`make`]) to `uid` (its root's owner and group) and
/// attaches it at `path`, an empty directory.
fn attach(fs: &OwnedFd, path: &Path, uid: u32) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, CWD, Gid, Uid, chownat};
    use rustix::mount::{MoveMountFlags, move_mount};
    chownat(
        fs,
        "",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(uid)),
        AtFlags::EMPTY_PATH,
    )?;
    move_mount(fs, "", CWD, path, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)?;
    Ok(())
}

/// The file systems of the default size made ahead of the tasks, and what the thread that
/// makes them waits on.
#[derive(Debug)]
struct Pool {
    /// The size of each (the default scratch size).
    bytes: u64,
    state: Mutex<Ready>,
    /// Signalled when one is taken and when the pool closes.
    taken: Condvar,
}

#[derive(Debug, Default)]
struct Ready {
    /// Empty file systems, mounted nowhere, their roots root's.
    made: Vec<OwnedFd>,
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
        self.taken.notify_one();
        fs
    }

    /// The thread's loop: keeps [`READY`] made until the pool closes. A failure to make one
    /// (which the trial at start did not meet) stops it: tasks then have theirs made as they
    /// start, and say so if that fails too.
    fn keep_ready(&self) {
        loop {
            {
                let mut state = self.state();
                while !state.closed && state.made.len() >= READY {
                    state = self.taken.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                if state.closed {
                    return;
                }
            }
            match make(self.bytes) {
                Ok(fs) => self.state().made.push(fs),
                Err(error) => {
                    tracing::warn!(%error, "cannot make tasks' scratch ahead of them: each is made as its task starts");
                    return;
                }
            }
        }
    }

    /// Makes no more, and lets go of those made (the kernel frees them).
    fn close(&self) {
        let made = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.made)
        };
        self.taken.notify_all();
        drop(made);
    }
}

/// Where a worker mounts its tasks' scratch directories.
#[derive(Debug)]
pub struct Scratch {
    /// `{task dir}/escher-scratch-PID-RANDOM`, 0711, the worker's: a task reaches its own
    /// directory and lists none.
    root: tempfile::TempDir,
    /// The size of a task's scratch when it asks for no `disk`.
    default_bytes: u64,
    /// Scratch file systems of `default_bytes` made ahead.
    pool: Arc<Pool>,
    /// The thread that makes them.
    maker: Option<std::thread::JoinHandle<()>>,
}

impl Scratch {
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
        let pool = Arc::new(Pool {
            bytes: default_bytes,
            state: Mutex::default(),
            taken: Condvar::new(),
        });
        let mut scratch = Scratch {
            root,
            default_bytes,
            pool,
            maker: None,
        };
        // A trial mount, as the first task's would be.
        let uid = nix::unistd::geteuid().as_raw();
        drop(scratch.mount("trial", uid, 4096)?);
        let pool = Arc::clone(&scratch.pool);
        let maker = std::thread::Builder::new()
            .name("escher-scratch".into())
            .spawn(move || pool.keep_ready())
            .map_err(|e| format!("cannot start the thread that makes tasks' scratch: {e}"))?;
        scratch.maker = Some(maker);
        Ok(scratch)
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

    /// Mounts a scratch of `bytes` for the attempt `name` (`{task}-{attempt}`), owned by `uid`:
    /// one made ahead if `bytes` is the default and one is ready, else one made now. Blocking
    /// (a few system calls).
    pub fn mount(&self, name: &str, uid: u32, bytes: u64) -> Result<TaskScratch, String> {
        let path = self.root.path().join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Left by an attempt whose release failed: start empty.
                let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            }
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        let ready = if bytes == self.pool.bytes {
            self.pool.take()
        } else {
            None
        };
        ready
            .map_or_else(|| make(bytes), Ok)
            .and_then(|fs| attach(&fs, &path, uid))
            .map_err(|e| {
                let _ = std::fs::remove_dir(&path);
                format!(
                    "cannot mount a tmpfs of {bytes} bytes at {} for the task's scratch: {e}",
                    path.display()
                )
            })?;
        Ok(TaskScratch { path, bytes })
    }
}

/// One attempt's scratch directory: unmounted and removed when dropped.
#[derive(Debug)]
pub struct TaskScratch {
    path: PathBuf,
    bytes: u64,
}

impl TaskScratch {
    /// Its path: the task's `HOME`, `TMPDIR` and default working directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the task filled it: less than a page is left.
    pub fn full(&self) -> bool {
        super::disk::space_of(&self.path).is_ok_and(|s| s.free < 4096)
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
        // Detached: a process of the task still holding a file open cannot keep the mount
        // point busy; its pages go with the last reference.
        if let Err(error) = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.path.display(), %error, "cannot unmount a task's scratch");
            return;
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.pool.close();
        if let Some(maker) = self.maker.take() {
            let _ = maker.join();
        }
        // What is still mounted (a task the worker never got to end) goes before the directory.
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

    /// Run as root (CI), this mounts real scratch; elsewhere it checks the refusal.
    #[test]
    fn a_scratch_holds_its_size_and_is_gone_when_dropped() {
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
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(task.path()).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (300_300, 0o700));
        assert!(!task.full());
        let big = std::fs::write(task.path().join("big"), vec![0u8; 2 << 20]);
        assert!(big.is_err(), "2 MiB fit in a 1 MiB scratch");
        assert!(task.full());
        assert!(task.full_reason().contains("filled its scratch of 1 MiB"));
        let path = task.path().to_path_buf();
        drop(task);
        assert!(!path.exists(), "the scratch is gone with its task");
    }

    /// The scratch made ahead of the tasks is mounted nowhere until a task takes it; each task
    /// gets an empty one of the default size, its user's and 0700, never one another task
    /// wrote in, however many tasks take them in a row.
    #[test]
    fn needs_root_scratch_made_ahead_is_empty_and_the_takers_own() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it mounts a tmpfs"
        );
        use std::os::unix::fs::MetadataExt;
        let parent = tempfile::tempdir().unwrap();
        let scratch = Scratch::open(parent.path(), 1 << 20).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while scratch.pool.state().made.len() < READY {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool was not filled"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
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
        assert_eq!(mounted(), held.len());
        drop(held);
        assert_eq!(mounted(), 0);
        drop(scratch);
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
        for dir in [&stale, &live] {
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
        let scratch = Scratch::open(parent.path(), 1 << 20).unwrap();
        assert!(!stale.exists(), "the dead worker's scratch stayed");
        assert!(
            live.join("7-1").join("left").exists(),
            "a live worker's scratch was touched"
        );
        nix::mount::umount2(&live.join("7-1"), nix::mount::MntFlags::MNT_DETACH).unwrap();
        drop(scratch);
    }
}
