//! The watch thread: it waits on the supervisor process, and when it dies (SIGKILLed by hand,
//! by the OOM killer, or crashed) starts another at once, which the worker tells everything
//! the dead one held ([`Fence::restart`]). The tasks are unfenced only between the death and
//! the new supervisor's first lines, a fork and an exec later. What this cannot cover is a
//! supervisor that dies while the worker is already stopped or wedged (nothing of the worker
//! runs to replace it), or a worker stopped in that window: both faults at once.
//!
//! A supervisor that cannot be started, or that keeps dying (more than [`MAX_RESTARTS`] times
//! in [`RESTART_WINDOW`]: a broken binary, a host that kills it as soon as it runs), is given
//! up on ([`Fence::give_up`]): the worker stops its tasks itself and takes no new ones, rather
//! than run them unfenced.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::Fence;

/// The most supervisors started in [`RESTART_WINDOW`] after one died.
pub const MAX_RESTARTS: usize = 5;

/// The window [`MAX_RESTARTS`] counts deaths in.
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Starts the thread that waits on `child`, the first supervisor, and replaces it.
pub(super) fn watch(fence: &'static Fence, child: Child) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("escher-fence-watch".into())
        .spawn(move || keep_running(fence, child))?;
    Ok(())
}

fn keep_running(fence: &'static Fence, mut child: Child) {
    let mut deaths: VecDeque<Instant> = VecDeque::new();
    loop {
        let how = match child.wait() {
            Ok(status) => ended(status),
            Err(error) => format!("could not be waited for ({error})"),
        };
        let now = Instant::now();
        while deaths
            .front()
            .is_some_and(|at| now.duration_since(*at) > RESTART_WINDOW)
        {
            deaths.pop_front();
        }
        deaths.push_back(now);
        if deaths.len() > MAX_RESTARTS {
            fence.give_up(&format!(
                "the fence supervisor {how} (its {} death in {}s)",
                ordinal(deaths.len()),
                RESTART_WINDOW.as_secs()
            ));
            return;
        }
        match fence.restart(&how) {
            Ok(next) => child = next,
            Err(error) => {
                fence.give_up(&format!(
                    "the fence supervisor {how} and another could not be started ({error})"
                ));
                return;
            }
        }
    }
}

/// How a supervisor ended, after "the fence supervisor".
fn ended(status: ExitStatus) -> String {
    match (status.signal(), status.code()) {
        (Some(signal), _) => match Signal::try_from(signal) {
            Ok(Signal::SIGKILL) => "was killed by SIGKILL (by hand or by the OOM killer)".into(),
            Ok(signal) => format!("was killed by {signal}"),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, Some(code)) => format!("exited with code {code}"),
        (None, None) => "ended".into(),
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, ...
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_supervisor_is_described() {
        assert_eq!(
            ended(ExitStatus::from_raw(9)),
            "was killed by SIGKILL (by hand or by the OOM killer)"
        );
        assert_eq!(ended(ExitStatus::from_raw(11)), "was killed by SIGSEGV");
        assert_eq!(ended(ExitStatus::from_raw(3 << 8)), "exited with code 3");
        assert_eq!(ordinal(6), "6th");
        assert_eq!(ordinal(2), "2nd");
        assert_eq!(ordinal(12), "12th");
    }
}
