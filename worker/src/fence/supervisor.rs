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
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

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
    let mut lease: Option<Duration> = None;
    // How long the supervisor waits for the next line before it kills.
    let mut wait: Option<Duration> = None;
    loop {
        let next = match wait {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(line) => match line.split_at_checked(1) {
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
                Some(("d", path)) => {
                    cgroups.remove(std::path::Path::new(path));
                }
                Some(("l", ms)) => {
                    lease = ms.parse().ok().map(Duration::from_millis);
                    wait = lease;
                }
                Some(("h", "")) => wait = lease,
                Some(("h", ms)) => {
                    // What is left of the worker's lease, never more than a lease of silence.
                    let left = ms.parse().ok().map(Duration::from_millis);
                    wait = match (left, lease) {
                        (Some(left), Some(lease)) => Some(left.min(lease)),
                        (left, lease) => left.or(lease),
                    };
                }
                _ => {}
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker's lease ran out, or it has been silent for \
                         {:?}; killing its {} task process group(s) before the head retries \
                         them elsewhere",
                        wait.unwrap_or_default(),
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups);
                // Until the next line: a process group that starts then is held, not killed.
                wait = lease;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !groups.is_empty() {
                    eprintln!(
                        "escher fence: the worker is gone; killing its {} task process group(s)",
                        groups.len()
                    );
                }
                kill_all(&mut groups, &mut cgroups);
                return;
            }
        }
    }
}

/// SIGKILLs every process group and cgroup in `groups` and `cgroups`, and forgets them.
pub(super) fn kill_all(groups: &mut BTreeSet<i32>, cgroups: &mut BTreeSet<PathBuf>) {
    for pgid in std::mem::take(groups) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // What left its process group is still in its cgroup.
    for cgroup in std::mem::take(cgroups) {
        crate::exec::kill_cgroup(&cgroup);
    }
}
