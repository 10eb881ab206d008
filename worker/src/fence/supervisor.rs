//! The supervisor process (`escher-worker __escher-fence`, renamed `escher-fence`): it reads the
//! worker's lines (see the module above) and SIGKILLs every process group and cgroup it holds
//! when the worker has been silent for a lease, when the lease runs out, and when the pipe
//! closes.
//!
//! It asks the kernel never to pick it as the victim of an out-of-memory kill
//! (`oom_score_adj` -1000): it holds a few kilobytes, and its death would leave the worker's
//! tasks unfenced until the worker starts another. Lowering the score needs root
//! (`CAP_SYS_RESOURCE`); without it the supervisor says so and keeps the worker's score.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::countdown::Countdown;

/// The lowest `oom_score_adj`: the OOM killer never picks the process.
const OOM_SCORE_ADJ_MIN: &str = "-1000";

/// The supervisor: reads the worker's lines until the pipe closes, killing every process group
/// it holds when the worker has been silent for a lease, and when the pipe closes.
pub fn supervise() {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The supervisor is the same program as the worker: renamed, so that `pkill escher-worker`
    // (which matches the process name) leaves it to do its job.
    let _ = nix::sys::prctl::set_name(c"escher-fence");
    if let Err(error) = std::fs::write("/proc/self/oom_score_adj", OOM_SCORE_ADJ_MIN) {
        eprintln!(
            "escher fence: cannot keep the OOM killer from choosing this supervisor ({error}); \
             if it does, the worker starts another one; run the worker as root to prevent it"
        );
    }
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    let mut cgroups: BTreeSet<PathBuf> = BTreeSet::new();
    // The worker's directories of task cgroups: kept after a kill (the worker registers each
    // once, when it starts).
    let mut roots: BTreeSet<PathBuf> = BTreeSet::new();
    // When to kill: the shared rule (`countdown.rs`), on this process's clock.
    let origin = std::time::Instant::now();
    let mut countdown = Countdown::default();
    loop {
        let next = match countdown.wait() {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(line) => {
                countdown.heard(&line, origin.elapsed());
                match line.split_at_checked(1) {
                    Some(("+", pgid)) => {
                        groups.extend(pgid.parse::<i32>().ok().filter(|p| *p > 1));
                    }
                    Some(("-", pgid)) => {
                        if let Ok(pgid) = pgid.parse::<i32>() {
                            groups.remove(&pgid);
                        }
                    }
                    Some(("c", path)) => {
                        cgroups.insert(path.into());
                    }
                    Some(("r", path)) => {
                        roots.insert(path.into());
                    }
                    Some(("d", path)) => {
                        cgroups.remove(std::path::Path::new(path));
                    }
                    _ => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker's lease ran out, or it has been silent for \
                         {:?}; killing its {} task process group(s) before the head retries \
                         them elsewhere",
                        countdown.wait().unwrap_or_default(),
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups, &roots);
                // Until the next line: a process group that starts then is held, not killed.
                countdown.killed(origin.elapsed());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker is gone; killing its {} task process group(s)",
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups, &roots);
                return;
            }
        }
    }
}

/// SIGKILLs every process group and cgroup in `groups` and `cgroups`, and forgets them, and
/// every populated cgroup directly under each of `roots` (an empty one is left alone: the pool
/// reuses it, and a cgroup v2 once killed must not be reused).
pub(super) fn kill_all(
    groups: &mut BTreeSet<i32>,
    cgroups: &mut BTreeSet<PathBuf>,
    roots: &BTreeSet<PathBuf>,
) {
    for pgid in std::mem::take(groups) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // What left its process group is still in its cgroup.
    for cgroup in std::mem::take(cgroups) {
        crate::exec::kill_cgroup(&cgroup);
    }
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir())
                && crate::exec::cgroup_populated(&path) != Some(false)
            {
                crate::exec::kill_cgroup(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Hierarchy, TaskCgroups};
    use std::time::{Duration, Instant};

    /// As root: the worker registers its directory of task cgroups once; a kill then reaches
    /// a task's process that left its process group (no line named its cgroup), and leaves the
    /// pool's empty cgroups alone.
    #[test]
    fn needs_root_one_registration_of_the_workers_task_cgroups_kills_every_task_in_them() {
        use std::io::BufRead;
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test creates cgroups: run it as root (CI does)"
        );
        let cgroups = TaskCgroups::discover(Hierarchy::Auto).unwrap();
        let busy = cgroups.create().unwrap();
        let idle = cgroups.create().unwrap();
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
        busy.enter(child.id()).unwrap();
        for pid in [escaped, child.id() as i32] {
            let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let name = busy.path().file_name().unwrap().to_str().unwrap();
            assert!(
                own.contains(name),
                "{pid} is not in {:?}: {own}",
                busy.path()
            );
        }

        let roots = BTreeSet::from([cgroups.root().to_path_buf()]);
        kill_all(&mut BTreeSet::new(), &mut BTreeSet::new(), &roots);

        let gone = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z')
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone(escaped) || !gone(child.id() as i32) {
            assert!(
                Instant::now() < deadline,
                "the task's processes outlived the kill of the worker's task cgroups"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        // The empty one is left as it was, for the pool to reuse.
        assert!(idle.path().exists(), "{:?}", idle.path());
        assert_eq!(crate::exec::cgroup_populated(idle.path()), Some(false));
    }
}
