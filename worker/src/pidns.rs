//! A PID namespace of the worker's own, so that its tasks do not outlive it: the kernel ends
//! every process of a PID namespace when the namespace's first process (its init) ends, and
//! no `setsid`, double fork or change of process group leaves a namespace.
//!
//! The fence supervisor kills the tasks' cgroups when the worker dies (`crate::fence`); a kill
//! of every escher process of a host at once (`pkill -9 escher`) killed the supervisor too and
//! left the tasks running until the worker was back. With [`enter`], `escher-worker` runs as
//! three processes:
//!
//! - the **launcher**, the process that was started (its pid is the one a service manager or a
//!   shell holds): it forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to the init and exits as the
//!   worker did;
//! - the **init** (`escher-init`), pid 1 of the new namespace: it dies with the launcher
//!   (`PR_SET_PDEATHSIG`), forwards the same signals to the worker, reaps orphaned task
//!   processes, and exits as the worker did, which ends the namespace;
//! - the **worker** itself, pid 2, which starts the fence supervisor and the tasks, all inside.
//!
//! So a SIGKILL of any escher process but the supervisor (or of all of them) ends the tasks at
//! once, and the supervisor still fences them when only the worker dies or stalls. The
//! namespace has a mount namespace of its own with its own `/proc`, so that a task's pids
//! (`$$`, `os.getpid()`) name the same processes as its `/proc` does; other mounts are the
//! host's, and later host mounts still appear inside (`MS_SLAVE`). That `/proc` is mounted
//! with `hidepid=2,gid=0`: a task, which runs as its namespace's user, sees only that user's
//! processes (another tenant's command lines, and with them any secret on one, are not
//! there), while the worker, in root's group, sees every process.
//!
//! It needs `CAP_SYS_ADMIN` (a worker run as root); a worker without it (an unprivileged user,
//! a container that drops it, a unit that restricts namespaces) runs as before in the host's
//! PID namespace and says so: there a container's or a unit's own cgroup ends the tasks.
//! `--no-pid-namespace` turns it off.
//!
//! Pids the worker logs and reports are those of its namespace; [`host_pid`] is the launcher's
//! pid on the host, which names the worker's task cgroups and its default name.
//!
//! Unsafe code: `fork` (the process has one thread when it is called) and `sigaction` (the
//! handlers only call `kill`, which is async-signal-safe).
#![allow(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};

/// The signals the launcher and the init pass on.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Where the launcher and the init forward signals to.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

/// The launcher's pid on the host, once the worker runs in a namespace of its own.
static HOST_PID: OnceLock<u32> = OnceLock::new();

/// The host's `/proc`, opened before the namespace mounted its own.
static HOST_PROC: OnceLock<OwnedFd> = OnceLock::new();

/// The worker's pid as the host sees it: the launcher's, in a namespace of its own, else this
/// process's. Names what must be unique per worker on a host.
pub fn host_pid() -> u32 {
    HOST_PID.get().copied().unwrap_or_else(std::process::id)
}

/// This process's own pid as the host's `/proc` names it (in a namespace of its own, the
/// worker is pid 2 inside; a reader on the host opens `/proc/PID/fd/FD` by the host's number).
pub fn own_host_pid() -> u32 {
    HOST_PROC
        .get()
        .and_then(|proc| nix::fcntl::readlinkat(proc.as_fd(), "self").ok())
        .and_then(|pid| pid.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// Whether the process `pid` of the host (as [`host_pid`] gives them) is alive.
pub fn host_process_alive(pid: u32) -> bool {
    match HOST_PROC.get() {
        Some(proc) => nix::sys::stat::fstatat(
            proc.as_fd(),
            pid.to_string().as_str(),
            nix::fcntl::AtFlags::empty(),
        )
        .is_ok(),
        None => std::path::Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// Opens `path` under the host's `/proc` (`PID/fd/FD`, a client's descriptor named by its
/// host pid): the host's `/proc` kept from before the namespace, else this process's `/proc`.
pub fn open_host_proc(path: &str, flags: nix::fcntl::OFlag) -> nix::Result<OwnedFd> {
    let mode = nix::sys::stat::Mode::empty();
    match HOST_PROC.get() {
        Some(proc) => nix::fcntl::openat(proc.as_fd(), path, flags, mode),
        None => nix::fcntl::open(format!("/proc/{path}").as_str(), flags, mode),
    }
}

/// Whether this worker runs in a PID namespace of its own.
pub fn entered() -> bool {
    HOST_PID.get().is_some()
}

/// Moves the worker into a PID namespace of its own (see the module's documentation). Must be
/// called while the process has one thread, before any runtime starts. Returns in the worker,
/// pid 2 of the new namespace, or with why it could not (nothing changed then); the launcher
/// and the init never return.
pub fn enter() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the worker is not root (a PID namespace needs CAP_SYS_ADMIN)".into());
    }
    let host_proc = nix::fcntl::open(
        "/proc",
        nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("cannot open /proc: {e}"))?;
    let launcher = getpid();
    // The launcher holds `alive`'s write end until it ends: the init learns from it whether
    // the launcher died before the init could ask to die with it.
    let (alive, alive_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("cannot make a pipe: {e}"))?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID | nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot create a PID namespace: {e}"))?;
    // SAFETY: one thread (the caller's contract); the child only makes system calls before
    // it returns into the worker's `main` or exits.
    match unsafe { fork() }.map_err(|e| format!("cannot fork the namespace's init: {e}"))? {
        ForkResult::Parent { child } => {
            drop(alive);
            launch(child, alive_w)
        }
        ForkResult::Child => drop(alive_w),
    }
    // The init, pid 1 of the namespace.
    die_with_parent(alive);
    let _ = nix::sys::prctl::set_name(c"escher-init");
    if let Err(why) = own_proc() {
        eprintln!("escher-worker: {why}; start it with --no-pid-namespace");
        std::process::exit(EXIT_NO_PROC);
    }
    // SAFETY: as above.
    match unsafe { fork() } {
        Ok(ForkResult::Parent { child }) => init(child),
        Ok(ForkResult::Child) => {}
        Err(e) => {
            eprintln!("escher-worker: cannot fork the worker in its PID namespace: {e}");
            std::process::exit(EXIT_NO_PROC);
        }
    }
    // The worker, pid 2.
    let _ = nix::sys::prctl::set_name(c"escher-worker");
    let _ = HOST_PID.set(launcher.as_raw().unsigned_abs());
    let _ = HOST_PROC.set(host_proc);
    Ok(())
}

/// What the init exits with when the namespace cannot be made usable.
const EXIT_NO_PROC: i32 = 70;

/// Gives this process its parent's fate: SIGKILL when the parent ends, now if it has already
/// (`alive`, the read end of a pipe whose write end only the parent holds, is at its end).
/// The parent is outside this process's PID namespace, so `getppid` cannot tell.
fn die_with_parent(alive: OwnedFd) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err() {
        std::process::exit(EXIT_NO_PROC);
    }
    let mut fds = [PollFd::new(alive.as_fd(), PollFlags::POLLIN)];
    let gone = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0);
    if gone {
        std::process::exit(EXIT_NO_PROC);
    }
}

/// Mounts the namespace's own `/proc` in a mount namespace whose mounts do not reach the host.
fn own_proc() -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the worker's mounts its own: {e}"))?;
    // `hidepid=2`: a process sees in `/proc` only the processes of its own user, so a
    // tenant's task (its namespace's user) cannot list another tenant's processes or read
    // their command lines; `gid=0`: the worker (root's group; tasks run with their own group
    // and no others) sees them all, whatever capabilities it was left with.
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("hidepid=2,gid=0"),
    )
    .map_err(|e| format!("cannot mount /proc for the worker's PID namespace: {e}"))
}

/// Passes the forwarded signals on to `to`.
fn forward_signals_to(to: Pid) {
    extern "C" fn pass_on(signal: std::ffi::c_int) {
        let to = FORWARD_TO.load(Ordering::Relaxed);
        if let (true, Ok(signal)) = (to > 0, Signal::try_from(signal)) {
            // kill(2) is async-signal-safe.
            let _ = kill(Pid::from_raw(to), signal);
        }
    }
    FORWARD_TO.store(to.as_raw(), Ordering::Relaxed);
    let action = SigAction::new(
        SigHandler::Handler(pass_on),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in FORWARDED {
        // SAFETY: the handler only calls kill.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

/// The launcher: forwards signals to the init and exits as it does; `_alive` stays open until
/// then (see [`die_with_parent`]).
fn launch(init: Pid, _alive: OwnedFd) -> ! {
    forward_signals_to(init);
    loop {
        match waitpid(init, None) {
            Ok(status) => exit_as(status),
            Err(Errno::EINTR) => {}
            Err(e) => {
                eprintln!("escher-worker: lost the worker's PID namespace: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// The init: forwards signals to the worker, reaps whatever is orphaned into the namespace,
/// and exits as the worker does (which ends every process left in it).
fn init(worker: Pid) -> ! {
    forward_signals_to(worker);
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::__WALL)) {
            Ok(status) if status.pid() == Some(worker) => {
                if matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..)) {
                    exit_as(status);
                }
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) => std::process::exit(1),
            Err(e) => {
                eprintln!("escher-worker: the namespace's init cannot wait: {e}");
                let _ = kill(worker, Signal::SIGKILL);
                std::process::exit(1);
            }
        }
    }
}

/// Exits as the child whose `status` this is: with its code, or by its signal.
fn exit_as(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, signal, _) => {
            let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            // SAFETY: restoring the default action.
            let _ = unsafe { sigaction(signal, &default) };
            let _ = nix::sys::signal::raise(signal);
            std::process::exit(128 + signal as i32);
        }
        _ => std::process::exit(1),
    }
}
