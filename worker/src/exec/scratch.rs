//! [`Scratch`]: a size-limited directory of each command task's own, its `HOME`, `TMPDIR` and
//! default working directory, gone (and its space back) the moment the task ends.
//!
//! On a root worker whose tasks run as users of their own, each command task gets a tmpfs of
//! `size=` its `disk` request (MiB) or `--task-scratch-bytes`, mounted `nosuid,nodev` at
//! `{task dir}/escher-scratch-PID/{task}-{attempt}`, 0700 and its user's. A task that fills it
//! gets "no space left on device" from its own writes, and fails with a reason that says it
//! filled its scratch; its neighbours' directories are other file systems and do not notice.
//! The worker unmounts it as soon as the task has ended (after reading its outcome file): no
//! sweep, no leftover. Its pages are memory, charged to the task's memory cgroup as a
//! Kubernetes memory-backed `emptyDir` is, so a task's scratch and its memory together stay
//! within its `memory` request.
//!
//! A worker that cannot mount (not root, no `CAP_SYS_ADMIN`) runs tasks in their namespace's
//! home, warns at start, and its node's `escher.disk` label says `reserve` without `scratch`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The scratch size of a task that asks for no `disk`, unless `--task-scratch-bytes` says
/// (1 GiB).
pub const DEFAULT_TASK_SCRATCH_BYTES: u64 = 1 << 30;

/// Where a worker mounts its tasks' scratch directories.
#[derive(Debug)]
pub struct Scratch {
    /// `{task dir}/escher-scratch-PID`, 0711, the worker's: a task reaches its own directory
    /// and lists none.
    root: tempfile::TempDir,
    /// The size of a task's scratch when it asks for no `disk`.
    default_bytes: u64,
}

impl Scratch {
    /// Makes the directory the scratch mounts go in, under `parent`, and checks that this
    /// process may mount a tmpfs there. The error says why not.
    pub fn open(parent: &Path, default_bytes: u64) -> Result<Scratch, String> {
        let root = tempfile::Builder::new()
            .prefix("escher-scratch-")
            .tempdir_in(parent)
            .map_err(|e| format!("cannot create a directory in {}: {e}", parent.display()))?;
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("cannot set {}'s mode: {e}", root.path().display()))?;
        let scratch = Scratch {
            root,
            default_bytes,
        };
        // A trial mount, as the first task's would be.
        let uid = nix::unistd::geteuid().as_raw();
        drop(scratch.mount("trial", uid, 4096)?);
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

    /// Mounts a scratch of `bytes` for the attempt `name` (`{task}-{attempt}`), owned by `uid`.
    /// Blocking (a few system calls).
    pub fn mount(&self, name: &str, uid: u32, bytes: u64) -> Result<TaskScratch, String> {
        use nix::mount::{MsFlags, mount};
        let path = self.root.path().join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Left by an attempt whose release failed: start empty.
                let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            }
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        let options = format!("size={bytes},mode=0700,uid={uid},gid={uid}");
        mount(
            Some("escher-scratch"),
            &path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
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
}
