//! [`spawn`]: starts a command task in one exec, already in its cgroup, as its user, with
//! `no_new_privs`, in a process group of its own.
//!
//! The standard library spawns with `posix_spawn` (a `vfork` and one `exec`) only while it
//! has nothing to do in the child that `posix_spawn` cannot: changing user is not among those,
//! so a task that ran as its namespace's user cost either a `fork` of the whole worker (its
//! page tables copied for every task) or a second `exec` (`setpriv`, which changes user and
//! executes the program); and its cgroup could only be entered from outside after the spawn,
//! when the program may already have started children. Here the worker does what
//! `posix_spawn` does itself: a child that shares the worker's memory (`clone` with `CLONE_VM`
//! and `CLONE_VFORK`, on a stack of its own) and does, with system calls only, in this order:
//!
//! 1. every signal with a handler back to its default, `SIGPIPE` too (the worker ignores it);
//! 2. a process group of its own (`setpgid`);
//! 3. into its cgroups: `0` written to each `cgroup.procs` the worker opened for it, so that
//!    nothing of the task ever runs outside them; where its cgroup is a cgroup v2 one and the
//!    kernel has `clone3` with `CLONE_INTO_CGROUP` (Linux 5.7; x86-64 here), the child is
//!    born in that one instead (cheaper than a move, and the pidfd comes with it) and writes
//!    only the v1 cgroups that hold its limits;
//! 4. its standard streams (`/dev/null`, its two log files);
//! 5. where the task has a scratch (`Launch::private_tmp`), a mount namespace of its own
//!    (`CLONE_NEWNS`, with the clone), its mounts made slaves (nothing it mounts reaches the
//!    worker's or the host's), and its scratch bound over `/tmp`, `/var/tmp` and `/dev/shm`
//!    (those that exist), so that a task that looks for the host's world-writable directories
//!    finds its own scratch there;
//! 6. its user: no supplementary groups, then the gid, then the uid (`setgroups`, `setresgid`,
//!    `setresuid` as raw system calls: the C library's wrappers would try to change the user
//!    of every thread of the worker, whose memory the child shares);
//! 7. its working directory, as its user;
//! 8. `no_new_privs`, so that no set-uid or set-gid program or file capability gives it more;
//! 9. no blocked signal, then `execve`.
//!
//! The worker's thread waits (`CLONE_VFORK`) until the child has executed its program or
//! failed; a failure writes its step and `errno` where the worker reads them, and the child
//! exits. The worker then waits for the task through a pidfd, readable when it has ended.
//!
//! Linux only (pidfds are Linux 5.3); [`available`] says whether this kernel has them, and
//! without them the worker spawns through the standard library as before.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::OnceLock;

use tokio::io::unix::AsyncFd;

/// The child's stack: what its steps need, with room to spare.
const STACK: usize = 64 * 1024;

/// The steps of the child that can fail, as it reports them.
const STEP_PGID: c_int = 1;
const STEP_CGROUP: c_int = 2;
const STEP_STDIO: c_int = 3;
const STEP_USER: c_int = 4;
const STEP_CWD: c_int = 5;
const STEP_NO_NEW_PRIVS: c_int = 6;
const STEP_EXEC: c_int = 7;
const STEP_TMP: c_int = 8;

/// Where a task with a private `/tmp` finds its scratch, in this order: the first one that
/// exists is bound to the scratch, the others to that first one (so that a scratch whose own
/// path runs through one of them is resolved before it is covered).
const PRIVATE_TMP: [&std::ffi::CStr; 3] = [c"/tmp", c"/var/tmp", c"/dev/shm"];

/// Whether this kernel gives pidfds (Linux 5.3), which [`spawn`] waits through.
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| match pidfd_open(std::process::id() as libc::pid_t) {
        Ok(_fd) => true,
        Err(error) => {
            tracing::debug!(%error, "no pidfds: command tasks spawn through the standard library");
            false
        }
    })
}

/// What to start.
pub(super) struct Launch<'a> {
    /// The program's path, as `execve` takes it (found on `PATH` already).
    pub path: CString,
    /// Its arguments, `argv[0]` first.
    pub argv: Vec<CString>,
    /// Its whole environment, `KEY=value`.
    pub envp: Vec<CString>,
    /// Its working directory; the worker's if `None`.
    pub cwd: Option<CString>,
    /// The uid (and gid) to run as; the worker's if `None`.
    pub uid: Option<u32>,
    /// Its standard output and error.
    pub stdout: &'a std::fs::File,
    pub stderr: &'a std::fs::File,
    /// The `cgroup.procs` files of its cgroups, open for writing.
    pub cgroups: &'a [OwnedFd],
    /// The cgroup v2 directory whose `cgroup.procs` is `cgroups[0]`, open: where this kernel
    /// and machine allow, the child is started in it (`clone3` with `CLONE_INTO_CGROUP`) and
    /// writes only the others.
    pub cgroup_dir: Option<&'a OwnedFd>,
    /// Its scratch directory, bound over `/tmp`, `/var/tmp` and `/dev/shm` in a mount
    /// namespace of its own (needs `CAP_SYS_ADMIN`); `None` leaves it the worker's mounts.
    pub private_tmp: Option<CString>,
}

/// Why [`spawn`] failed.
#[derive(Debug)]
pub(super) enum Failed {
    /// Entering its cgroup.
    Cgroup(io::Error),
    /// Anything else: the program, its directory, the user, the system's resources.
    Spawn(io::Error),
}

/// What the child reads, and writes when it fails. Shared memory: the child runs in the
/// worker's address space until it executes its program.
#[repr(C)]
struct ChildArgs {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    change_user: bool,
    uid: libc::uid_t,
    stdio: [RawFd; 3],
    cgroups: *const RawFd,
    cgroup_count: usize,
    /// The scratch to bind over [`PRIVATE_TMP`] (null: none, and no mount namespace).
    private_tmp: *const c_char,
    /// The step that failed (0: none) and its errno, written by the child.
    failed_step: c_int,
    failed_errno: c_int,
}

/// Starts `launch` (see the module's doc): the running task, or why it could not start, with
/// nothing left running.
pub(super) fn spawn(launch: &Launch<'_>) -> Result<Launched, Failed> {
    let pointers = |strings: &[CString]| -> Vec<*const c_char> {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let argv = pointers(&launch.argv);
    let envp = pointers(&launch.envp);
    let cgroups: Vec<RawFd> = launch.cgroups.iter().map(AsRawFd::as_raw_fd).collect();
    let mut args = ChildArgs {
        path: launch.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: launch.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        change_user: launch.uid.is_some(),
        uid: launch.uid.unwrap_or(0),
        stdio: [
            dev_null().map_err(Failed::Spawn)?,
            launch.stdout.as_raw_fd(),
            launch.stderr.as_raw_fd(),
        ],
        cgroups: cgroups.as_ptr(),
        cgroup_count: cgroups.len(),
        private_tmp: launch
            .private_tmp
            .as_ref()
            .map_or(std::ptr::null(), |c| c.as_ptr()),
        failed_step: 0,
        failed_errno: 0,
    };
    let mut stack = vec![0u8; STACK];
    // SAFETY: as for `clone` below; `clone3` only where its child runs on `stack` too.
    let started = match launch.cgroup_dir {
        Some(dir) if !launch.cgroups.is_empty() => unsafe {
            clone_into_cgroup(&mut args, &cgroups, dir.as_raw_fd(), &mut stack)
        },
        _ => None,
    };
    let (pid, pidfd) = match started {
        Some(started) => started,
        None => {
            args.cgroups = cgroups.as_ptr();
            args.cgroup_count = cgroups.len();
            // SAFETY: see `clone_vfork`.
            (unsafe { clone_vfork(&mut args, &mut stack) }?, None)
        }
    };
    drop(stack);
    // SAFETY: the child has executed its program or exited; what it wrote is there.
    let (step, errno) = unsafe {
        (
            std::ptr::read_volatile(&raw const args.failed_step),
            std::ptr::read_volatile(&raw const args.failed_errno),
        )
    };
    if step != 0 {
        drop(pidfd);
        reap_blocking(pid);
        let error = io::Error::from_raw_os_error(errno);
        return Err(match step {
            STEP_CGROUP => Failed::Cgroup(error),
            _ => Failed::Spawn(error),
        });
    }
    let pidfd = pidfd
        .map_or_else(|| pidfd_open(pid), Ok)
        .and_then(|fd| {
            // SAFETY: the pidfd is the `AsyncFd`'s own, never closed or replaced while it is
            // registered.
            unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
        })
        .map_err(|error| {
            // SAFETY: kill(2) of our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap_blocking(pid);
            Failed::Spawn(error)
        })?;
    Ok(Launched {
        pid,
        pidfd,
        status: None,
    })
}

/// Starts the child with `clone(CLONE_VM | CLONE_VFORK)` on `stack`; its pid once it has
/// executed its program or failed.
///
/// # Safety
/// `args` and what it points to stay alive until this returns (it does after the child
/// executed or exited: `CLONE_VFORK`).
unsafe fn clone_vfork(args: &mut ChildArgs, stack: &mut [u8]) -> Result<libc::pid_t, Failed> {
    // SAFETY: the child runs `child` on its own stack, touches only `args` and what it points
    // to, and makes only system calls. Every signal is blocked around it, so that no handler of
    // the worker runs in the child before it has put the defaults back.
    unsafe {
        let top = stack.as_mut_ptr().add(stack.len());
        let top = top.sub(top as usize % 16);
        let old = block_signals();
        let pid = libc::clone(
            child,
            top.cast::<c_void>(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | new_mounts(args),
            (&raw mut *args).cast::<c_void>(),
        );
        let error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(Failed::Spawn(error));
        }
        Ok(pid)
    }
}

/// `CLONE_NEWNS` where the child binds its scratch over the host's temporary directories.
fn new_mounts(args: &ChildArgs) -> c_int {
    if args.private_tmp.is_null() {
        0
    } else {
        libc::CLONE_NEWNS
    }
}

/// Blocks every signal on this thread; the mask before.
///
/// # Safety
/// The caller puts the old mask back.
unsafe fn block_signals() -> libc::sigset_t {
    // SAFETY: plain signal-mask calls on this thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

/// `clone3`'s arguments (`struct clone_args` of linux/sched.h, its second version).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Whether `clone3` with `CLONE_INTO_CGROUP` (Linux 5.7) has failed here as unknown: then it
/// is not tried again.
static NO_CLONE_INTO_CGROUP: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// How many children `clone3` started in their cgroup (for tests).
#[cfg(test)]
static BORN_IN_CGROUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Starts the child already in the cgroup v2 directory `dir` (`clone3` with `CLONE_VM |
/// CLONE_VFORK | CLONE_INTO_CGROUP | CLONE_PIDFD`), writing itself into the other cgroups
/// (`cgroups[1..]`) only: the kernel places it at birth, which costs less than a move, and
/// hands the pidfd back with it. Its pid and pidfd once it has executed its program or failed;
/// `None` where this kernel or architecture cannot (or this cgroup refused): the caller then
/// starts it with `clone` and writes every cgroup, which reports any error.
///
/// # Safety
/// As [`clone_vfork`].
#[cfg(target_arch = "x86_64")]
unsafe fn clone_into_cgroup(
    args: &mut ChildArgs,
    cgroups: &[RawFd],
    dir: RawFd,
    stack: &mut [u8],
) -> Option<(libc::pid_t, Option<OwnedFd>)> {
    use std::sync::atomic::Ordering;
    if NO_CLONE_INTO_CGROUP.load(Ordering::Relaxed) {
        return None;
    }
    let base = stack.as_mut_ptr() as u64;
    let top = (base + stack.len() as u64) & !15;
    let mut pidfd: c_int = -1;
    let mut clone_args = CloneArgs {
        flags: libc::CLONE_VM as u64
            | libc::CLONE_VFORK as u64
            | CLONE_PIDFD
            | CLONE_INTO_CGROUP
            | new_mounts(args) as u64,
        pidfd: (&raw mut pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: base,
        stack_size: top - base,
        cgroup: dir as u64,
        ..CloneArgs::default()
    };
    args.cgroups = cgroups[1..].as_ptr();
    args.cgroup_count = cgroups.len() - 1;
    let arg = (&raw mut *args).cast::<c_void>();
    let entry: extern "C" fn(*mut c_void) -> c_int = child;
    let ret: i64;
    // SAFETY: clone3(2). The child starts on `stack` (its top, 16-byte aligned: `call` then
    // leaves it as a function expects), with the parent's registers: it calls `child(arg)`,
    // which executes the program or `_exit`s, and never comes back here; `exit` follows only
    // for form. The parent goes on at `2:` once the child has executed or exited
    // (`CLONE_VFORK`). Signals are blocked around it, as for `clone`.
    unsafe {
        let old = block_signals();
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, 60",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &raw mut clone_args,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if ret < 0 {
        let errno = (-ret) as c_int;
        if matches!(
            errno,
            libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM
        ) {
            NO_CLONE_INTO_CGROUP.store(true, Ordering::Relaxed);
        }
        tracing::debug!(
            error = %io::Error::from_raw_os_error(errno),
            "clone3 into the task's cgroup failed: the child writes itself into it instead"
        );
        return None;
    }
    #[cfg(test)]
    BORN_IN_CGROUP.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the kernel's new pidfd, ours alone.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Some((ret as libc::pid_t, pidfd))
}

/// Other architectures start every task with `clone` (see the x86-64 version).
///
/// # Safety
/// None needed: it starts nothing.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone_into_cgroup(
    _args: &mut ChildArgs,
    _cgroups: &[RawFd],
    _dir: RawFd,
    _stack: &mut [u8],
) -> Option<(libc::pid_t, Option<OwnedFd>)> {
    None
}

/// The child (see the module's doc): never returns unless `execve` failed, then exits.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while this runs; only system calls
    // follow.
    unsafe {
        let args = &mut *arg.cast::<ChildArgs>();
        for signal in 1..65 {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            let handled =
                action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            if handled || (signal == libc::SIGPIPE && action.sa_sigaction == libc::SIG_IGN) {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return failed(args, STEP_PGID);
        }
        for i in 0..args.cgroup_count {
            let fd = *args.cgroups.add(i);
            if libc::write(fd, b"0".as_ptr().cast::<c_void>(), 1) != 1 {
                return failed(args, STEP_CGROUP);
            }
        }
        for (target, fd) in args.stdio.into_iter().enumerate() {
            let target = target as c_int;
            let done = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if done < 0 {
                return failed(args, STEP_STDIO);
            }
        }
        if !args.private_tmp.is_null() && private_tmp(args.private_tmp) != 0 {
            return failed(args, STEP_TMP);
        }
        if args.change_user {
            let id = libc::c_long::from(args.uid);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, id, id, id) != 0
                || libc::syscall(libc::SYS_setresuid, id, id, id) != 0
            {
                return failed(args, STEP_USER);
            }
        }
        if !args.cwd.is_null() && libc::chdir(args.cwd) != 0 {
            return failed(args, STEP_CWD);
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return failed(args, STEP_NO_NEW_PRIVS);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(args.path, args.argv, args.envp);
        failed(args, STEP_EXEC)
    }
}

/// In the child's own mount namespace: its mounts made slaves of the worker's (so that what
/// it mounts reaches no other namespace, whatever the worker's propagation), then `scratch`
/// bound over each of [`PRIVATE_TMP`] that exists. 0, or -1 with `errno` set.
///
/// # Safety
/// Only in the child; `scratch` a C string.
unsafe fn private_tmp(scratch: *const c_char) -> c_int {
    // SAFETY: mount(2) with C strings that live as long as the call.
    unsafe {
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            return -1;
        }
        let mut source = scratch;
        for target in PRIVATE_TMP {
            let bound = libc::mount(
                source,
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            );
            if bound == 0 {
                source = target.as_ptr();
            } else if *libc::__errno_location() != libc::ENOENT {
                return -1;
            }
        }
        0
    }
}

/// Writes the failed step and `errno` for the parent, and exits.
///
/// # Safety
/// Only in the child.
unsafe fn failed(args: &mut ChildArgs, step: c_int) -> c_int {
    // SAFETY: the child's errno (the parent thread's, whose memory it shares: nothing else
    // runs on that thread until the child is gone) and its own exit.
    unsafe {
        std::ptr::write_volatile(&raw mut args.failed_errno, *libc::__errno_location());
        std::ptr::write_volatile(&raw mut args.failed_step, step);
        libc::_exit(127)
    }
}

/// `/dev/null`, open for reading once for every task's stdin.
fn dev_null() -> io::Result<RawFd> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let file = std::fs::File::open("/dev/null")?;
    Ok(NULL.get_or_init(|| file.into()).as_raw_fd())
}

/// A pidfd for process `pid`.
fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor of our own, open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits for child `pid` to end, on this thread.
fn reap_blocking(pid: libc::pid_t) -> Option<ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) of our own child.
        let reaped = unsafe { libc::waitpid(pid, &mut status, 0) };
        if reaped == pid {
            return Some(ExitStatus::from_raw(status));
        }
        if reaped < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Reaps child `pid` into `reaped` if it has ended.
fn try_reap(pid: libc::pid_t, reaped: &mut Option<ExitStatus>) -> io::Result<Option<ExitStatus>> {
    if reaped.is_some() {
        return Ok(*reaped);
    }
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) of our own child, not waiting.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            *reaped = Some(ExitStatus::from_raw(status));
            return Ok(*reaped);
        }
        if done == 0 {
            return Ok(None);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
}

/// A task [`spawn`] started: its pid, and its end through a pidfd. Dropped before it was
/// reaped, it is SIGKILLed and reaped.
#[derive(Debug)]
pub(super) struct Launched {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Launched {
    /// Its pid.
    pub(super) fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for it to end, and reaps it.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let mut ready = self.pidfd.readable().await?;
            match try_reap(self.pid, &mut self.status)? {
                Some(status) => return Ok(status),
                None => ready.clear_ready(),
            }
        }
    }

    /// SIGKILLs it, unless it has been reaped.
    pub(super) fn start_kill(&mut self) {
        if self.status.is_none() {
            // SAFETY: kill(2) of our own child, not reaped yet, so its pid is still its own.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        self.start_kill();
        if let Ok(Some(_)) = try_reap(self.pid, &mut self.status) {
            return;
        }
        // Dying: reaped on a thread of its own rather than left a zombie.
        let pid = self.pid;
        let _ = std::thread::Builder::new()
            .name("escher-reap".into())
            .spawn(move || reap_blocking(pid));
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::fs::File;

    use super::*;

    fn c(text: &str) -> CString {
        CString::new(text).unwrap()
    }

    /// `sh -c script`, its output in `out`.
    fn launch<'a>(script: &str, out: &'a File, cgroups: &'a [OwnedFd]) -> Launch<'a> {
        Launch {
            path: c("/bin/sh"),
            argv: vec![c("sh"), c("-c"), c(script)],
            envp: vec![c("PATH=/usr/bin:/bin")],
            cwd: None,
            uid: None,
            stdout: out,
            stderr: out,
            cgroups,
            cgroup_dir: None,
            private_tmp: None,
        }
    }

    /// The worker ignores SIGPIPE (as every Rust program does) and may block signals on its
    /// threads: the task starts with neither.
    #[tokio::test]
    async fn a_task_starts_with_default_signals_and_none_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("out");
        let out = File::create(&out_path).unwrap();
        let script = "grep -E '^(SigBlk|SigIgn|NoNewPrivs):' /proc/self/status";
        let mut child = spawn(&launch(script, &out, &[])).unwrap();
        assert!(child.wait().await.unwrap().success());
        let status = std::fs::read_to_string(&out_path).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.rsplit('\t').next().unwrap(), 16).unwrap()
        };
        assert_eq!(field("SigBlk:"), 0, "{status}");
        // SIGPIPE (bit 12) back to its default; what was ignored before the worker started
        // stays ignored, as with posix_spawn.
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{status}");
        assert_eq!(field("NoNewPrivs:"), 1, "{status}");
    }

    /// A cgroup that cannot be entered starts nothing: the program never runs, and the error
    /// says it was the cgroup.
    #[tokio::test]
    async fn a_task_whose_cgroup_cannot_be_entered_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let out = File::create(dir.path().join("out")).unwrap();
        // Every write to /dev/full fails (ENOSPC), as a cgroup.procs that refuses would.
        let full: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
            .into();
        let script = format!("touch {}", marker.display());
        let failed = spawn(&launch(&script, &out, &[full])).unwrap_err();
        assert!(
            matches!(&failed, Failed::Cgroup(e) if e.raw_os_error() == Some(libc::ENOSPC)),
            "{failed:?}"
        );
        assert!(!marker.exists(), "the program ran outside its cgroup");
    }

    /// As root, in a task cgroup of the unified hierarchy (and the v1 cgroups that hold its
    /// limits, on a host that has them): the child is born in the v2 one (`clone3`, on x86-64)
    /// and writes itself into the others, so its program runs in all of them.
    #[cfg(target_arch = "x86_64")]
    #[tokio::test]
    async fn a_task_is_born_in_its_cgroup() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test creates cgroups: run it as root (CI does)"
        );
        let cgroups = super::super::TaskCgroups::discover(super::super::Hierarchy::Unified)
            .expect("a unified hierarchy where root may create cgroups");
        let cgroup = cgroups.create().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("out");
        let out = File::create(&out_path).unwrap();
        let mut task = launch("cat /proc/self/cgroup", &out, cgroup.procs_fds());
        task.cgroup_dir = cgroup.dir_fd();
        let before = BORN_IN_CGROUP.load(std::sync::atomic::Ordering::Relaxed);
        let mut child = spawn(&task).unwrap();
        assert!(child.wait().await.unwrap().success());
        assert_eq!(
            BORN_IN_CGROUP.load(std::sync::atomic::Ordering::Relaxed),
            before + 1,
            "clone3 did not start the child in its cgroup"
        );
        let text = std::fs::read_to_string(&out_path).unwrap();
        let name = cgroup.path().file_name().unwrap().to_str().unwrap();
        let unified = text.lines().find(|l| l.starts_with("0::")).unwrap();
        assert!(unified.ends_with(&format!("/{name}")), "{text}");
        // Each v1 cgroup that holds a limit has it too.
        let held = cgroup.procs_files().len() - 1;
        let in_v1 = text
            .lines()
            .filter(|l| !l.starts_with("0::") && l.ends_with(&format!("/{name}")))
            .count();
        assert_eq!(in_v1, held, "{text}");
    }

    /// The mounts at `path` in this process's mount namespace.
    fn mounts_at(path: &str) -> usize {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split_whitespace().nth(4) == Some(path))
            .count()
    }

    /// As root, with a private `/tmp`: what the task writes to `/tmp`, `/var/tmp` and `/dev/shm`
    /// lands in its scratch (here a directory under the host's `/tmp`, which the child resolves
    /// before it covers `/tmp`), none of it in the host's, and none of its mounts reaches the
    /// worker's namespace.
    #[tokio::test]
    async fn needs_root_a_private_tmp_is_the_tasks_scratch_not_the_hosts() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test makes mount namespaces: run it as root (CI does)"
        );
        let scratch = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        let out_path = logs.path().join("out");
        let out = File::create(&out_path).unwrap();
        let name = format!("escher-private-tmp-{}", std::process::id());
        let script = format!(
            "echo a > /tmp/{name} && echo b > /var/tmp/{name}.var && echo c > /dev/shm/{name}.shm \
             && cat /tmp/{name}.var /tmp/{name}.shm"
        );
        let mounts = [
            mounts_at("/tmp"),
            mounts_at("/var/tmp"),
            mounts_at("/dev/shm"),
        ];
        let mut task = launch(&script, &out, &[]);
        task.private_tmp = Some(c(scratch.path().to_str().unwrap()));
        let mut child = spawn(&task).unwrap();
        let status = child.wait().await.unwrap();
        let text = std::fs::read_to_string(&out_path).unwrap();
        let host = [
            format!("/tmp/{name}"),
            format!("/var/tmp/{name}.var"),
            format!("/dev/shm/{name}.shm"),
        ];
        let on_host: Vec<&String> = host
            .iter()
            .filter(|p| std::path::Path::new(p).exists())
            .collect();
        for path in &on_host {
            let _ = std::fs::remove_file(path);
        }
        assert!(status.success(), "{status:?}: {text}");
        assert_eq!(text, "b\nc\n");
        assert!(on_host.is_empty(), "the task wrote {on_host:?} on the host");
        let mut mine: Vec<String> = std::fs::read_dir(scratch.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        mine.sort();
        assert_eq!(
            mine,
            [name.clone(), format!("{name}.shm"), format!("{name}.var")]
        );
        assert_eq!(
            [
                mounts_at("/tmp"),
                mounts_at("/var/tmp"),
                mounts_at("/dev/shm")
            ],
            mounts,
            "the task's mounts reached the worker's namespace"
        );
    }

    /// What a private `/tmp` costs a task: the wall time from the spawn to the reaped exit of
    /// `/bin/true`, with and without its mount namespace, alternating in rounds (printed, not
    /// asserted: `cargo test -p escher-worker --lib -- --ignored --nocapture private_tmp_cost`,
    /// as root).
    #[tokio::test]
    #[ignore = "a measurement, run by hand"]
    async fn needs_root_private_tmp_cost() {
        let scratch = tempfile::tempdir().unwrap();
        let out = File::create(scratch.path().join("out")).unwrap();
        let (rounds, per_round) = (5, 200);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for private in [false, true] {
                let mut task = launch("true", &out, &[]);
                task.path = c("/bin/true");
                task.argv = vec![c("true")];
                if private {
                    task.private_tmp = Some(c(scratch.path().to_str().unwrap()));
                }
                let start = std::time::Instant::now();
                for _ in 0..per_round {
                    let mut child = spawn(&task).unwrap();
                    assert!(child.wait().await.unwrap().success());
                }
                let micros = start.elapsed().as_secs_f64() * 1e6 / f64::from(per_round);
                if private { &mut with } else { &mut without }.push(micros);
            }
        }
        println!(
            "spawn to exit of /bin/true, µs per task, {rounds} rounds of {per_round}: \
             without a mount namespace {without:.0?}, with a private /tmp {with:.0?}"
        );
    }

    /// A program that cannot be executed, or a directory that cannot be entered, is the system's
    /// error (the child that failed is reaped before `spawn` returns).
    #[tokio::test]
    async fn a_failed_exec_is_its_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let mut missing = launch("true", &out, &[]);
        missing.path = c("/nonexistent/escher-no-such-program");
        let failed = spawn(&missing).unwrap_err();
        assert!(
            matches!(&failed, Failed::Spawn(e) if e.raw_os_error() == Some(libc::ENOENT)),
            "{failed:?}"
        );
        let mut bad_dir = launch("true", &out, &[]);
        bad_dir.cwd = Some(c("/nonexistent/escher-no-such-dir"));
        assert!(matches!(spawn(&bad_dir), Err(Failed::Spawn(_))));
    }

    /// A dropped task is killed and reaped.
    #[tokio::test]
    async fn a_dropped_task_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let child = spawn(&launch("exec sleep 30", &out, &[])).unwrap();
        let pid = child.id();
        drop(child);
        let gone = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        assert!(
            gone,
            "the dropped task {pid} still runs (or was never reaped)"
        );
    }
}
