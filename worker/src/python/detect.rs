//! Which Python interpreter a worker runs Python tasks with, if any: the one `ESCHER_PYTHON`
//! names, else (for `escher-worker`, [`PythonDetection::Detect`]) `python3` on `PATH`; each
//! checked once, at start, by running it briefly **as a task would run it**: where the worker
//! gives each namespace's tasks a user of their own, as a user of that kind (a uid of the
//! range, the same as its gid, no other groups: its rights over the interpreter are every
//! namespace user's, since none of them owns it), in a private home, with the tasks'
//! environment. It must be CPython 3.9 or later and import
//! `cloudpickle`, as the interpreters' side of the protocol (`runner.py`) does. An interpreter
//! the worker itself could run but its tasks' users cannot (one under a private home, such as
//! pyenv's or conda's under `/root`, or a virtual environment made from one) is refused, saying
//! which directory is closed to them. The worker logs what it found or why it offers no
//! Python, and says the same in its node's [`LABEL`] (`escher nodes`, `status`, the dashboard).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{CLOUDPICKLE_LABEL, ENV_PYTHON, LABEL};
use crate::error::WorkerError;
use crate::exec::{Isolation, TaskUser};

/// Whether a worker looks for a Python interpreter by itself (`escher-worker --no-python`
/// turns Python off; `ESCHER_PYTHON` overrides what is found, whatever this says, unless off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PythonDetection {
    /// Python only where `ESCHER_PYTHON` names an interpreter (or says `auto`): the library's
    /// default, so that a worker embedded in a program (a `LocalCluster`) offers Python only
    /// when asked (`escher.init()` asks, with its own interpreter).
    #[default]
    FromEnv,
    /// `ESCHER_PYTHON` if set, else `python3` on `PATH` when it is usable: `escher-worker`'s
    /// default.
    Detect,
    /// No Python, whatever `ESCHER_PYTHON` says (`escher-worker --no-python`).
    Off,
}

/// How long the check of an interpreter may take (a cold start of Python and `cloudpickle` on
/// a loaded machine takes well under a second).
const PROBE_LIMIT: Duration = Duration::from_secs(20);

/// What the check runs: prints `ok MAJOR.MINOR.MICRO CLOUDPICKLE-VERSION`, or why not, on one
/// line (Python 2 syntax too, so that an old `python3` says what it is).
const PROBE: &str = "import sys\n\
v = sys.version_info\n\
if v[0] < 3 or (v[0] == 3 and v[1] < 9):\n    \
    print('old %d.%d.%d' % (v[0], v[1], v[2])); sys.exit(0)\n\
try:\n    import cloudpickle\n\
except Exception as e:\n    \
    print('nocloudpickle %d.%d.%d %s' % (v[0], v[1], v[2], e)); sys.exit(0)\n\
print('ok %d.%d.%d %s' % (v[0], v[1], v[2], getattr(cloudpickle, '__version__', '?')))\n";

/// A usable interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Its path (as found on `PATH`, not resolved: a virtual environment's `bin/python3` is
    /// a link whose place says which environment it runs).
    pub(crate) exe: PathBuf,
    /// Its version, `3.11.2`.
    pub(crate) version: String,
    /// cloudpickle's version.
    pub(crate) cloudpickle: String,
}

/// Why an interpreter cannot run Python tasks: a short cause for the node's [`LABEL`]
/// (`no-cloudpickle`, `closed-to-task-users:/root`) and the whole story for the log and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unusable {
    /// The label's cause.
    pub(crate) cause: String,
    /// What was wrong, and what to do.
    pub(crate) why: String,
}

impl Unusable {
    fn new(cause: impl Into<String>, why: impl Into<String>) -> Unusable {
        Unusable {
            cause: cause.into(),
            why: why.into(),
        }
    }
}

/// What a worker offers: Python, or why not.
#[derive(Debug)]
pub(crate) enum Offer {
    /// Python tasks, with this interpreter.
    Serve(Found),
    /// No Python tasks, for this cause (the node's [`LABEL`] says `none:CAUSE`; the log says
    /// the whole story).
    Refused(String),
    /// No Python tasks, and none asked for (a worker embedded without `ESCHER_PYTHON`): no
    /// label, nothing logged.
    NotAsked,
}

impl Offer {
    /// The node's labels that say it: [`LABEL`] `3.11.2` and [`CLOUDPICKLE_LABEL`] `3.1.1`, or
    /// [`LABEL`] `none:CAUSE`; none when Python was not asked for. Each value made valid label
    /// text (at most 256 printable bytes, no space, `,` or `=`).
    pub(crate) fn labels(&self) -> Vec<(&'static str, String)> {
        let texts = match self {
            Offer::Serve(found) => vec![
                (LABEL, found.version.clone()),
                (CLOUDPICKLE_LABEL, found.cloudpickle.clone()),
            ],
            Offer::Refused(cause) => vec![(LABEL, format!("none:{cause}"))],
            Offer::NotAsked => Vec::new(),
        };
        texts
            .into_iter()
            .map(|(key, text)| {
                let mut value: String = text
                    .chars()
                    .map(|c| match c {
                        c if c.is_ascii_graphic() && c != ',' && c != '=' => c,
                        _ => '_',
                    })
                    .collect();
                if value.len() > 256 {
                    value.truncate(253);
                    value.push_str("...");
                }
                (key, value)
            })
            .collect()
    }
}

/// What this worker offers (logged, with why): the interpreter `ESCHER_PYTHON` names, or, as
/// `mode` says, `python3` on `PATH`, checked as `isolation` runs tasks. An interpreter that
/// `ESCHER_PYTHON` names but that cannot run Python tasks is an error that says why; one merely
/// looked for (`auto`, or [`PythonDetection::Detect`]) is not.
pub(crate) fn resolve(mode: PythonDetection, isolation: &Isolation) -> Result<Offer, WorkerError> {
    let set = std::env::var(ENV_PYTHON)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    if mode == PythonDetection::Off {
        tracing::info!("no Python tasks on this worker: turned off (--no-python)");
        return Ok(Offer::Refused("turned-off".into()));
    }
    let looked_for = match set.as_deref() {
        Some("none" | "off") => {
            tracing::info!("no Python tasks on this worker: {ENV_PYTHON} turns them off");
            return Ok(Offer::Refused("turned-off".into()));
        }
        Some("auto") => "python3",
        Some(named) => return named_interpreter(named, isolation).map(Offer::Serve),
        None if mode == PythonDetection::Detect => "python3",
        None => return Ok(Offer::NotAsked),
    };
    let Ok(exe) = which::which(looked_for) else {
        tracing::info!(
            "no Python tasks on this worker: no {looked_for} on PATH; set {ENV_PYTHON} to an \
             interpreter (3.9 or later, with cloudpickle) to offer them"
        );
        return Ok(Offer::Refused(format!("no-{looked_for}-on-path")));
    };
    match check(&exe, isolation) {
        Ok(found) => {
            tracing::info!(python = %found.exe.display(), version = %found.version, cloudpickle = %found.cloudpickle, "Python tasks run with the python3 found on PATH");
            Ok(Offer::Serve(found))
        }
        Err(Unusable { cause, why }) => {
            tracing::warn!(
                python = %exe.display(),
                "no Python tasks on this worker: {why}; set {ENV_PYTHON} to another \
                 interpreter, or --no-python to say none is wanted (the node's label {LABEL} \
                 says none:{cause})"
            );
            Ok(Offer::Refused(cause))
        }
    }
}

/// The interpreter `ESCHER_PYTHON` names (a path, or a name on `PATH`), checked.
fn named_interpreter(named: &str, isolation: &Isolation) -> Result<Found, WorkerError> {
    let path = Path::new(named);
    let exe = if path.is_absolute() || named.contains('/') {
        path.is_file().then(|| path.to_path_buf())
    } else {
        which::which(named).ok()
    };
    let Some(exe) = exe else {
        return Err(WorkerError::config(
            "python",
            format!(
                "{ENV_PYTHON}={named:?} names no Python interpreter here; give a path to one, \
                 `auto` (python3 on PATH, if usable) or `off`"
            ),
        ));
    };
    let found = check(&exe, isolation).map_err(|Unusable { why, .. }| {
        WorkerError::config(
            "python",
            format!(
                "{ENV_PYTHON}={named:?} cannot run Python tasks: {why}; name another \
                 interpreter, or `off`"
            ),
        )
    })?;
    tracing::info!(python = %found.exe.display(), version = %found.version, cloudpickle = %found.cloudpickle, "Python tasks run with the interpreter {ENV_PYTHON} names");
    Ok(found)
}

/// Checks `exe` as `isolation` runs tasks: where tasks get users of their own, as a user of
/// the same kind (a uid of the range, the same as its gid, no other groups) in a private home
/// of its own made for the check, without giving any namespace a user; else as the worker.
fn check(exe: &Path, isolation: &Isolation) -> Result<Found, Unusable> {
    let Isolation::PerUser(pool) = isolation else {
        return probe(exe, None);
    };
    let uid = pool.range().last;
    let home = check_home(uid).map_err(|e| {
        Unusable::new(
            "no-task-user",
            format!("the worker cannot make a home for uid {uid} to check the interpreter as: {e}"),
        )
    })?;
    let user = TaskUser {
        uid,
        home: home.path().to_path_buf(),
        switch: None,
    };
    probe(exe, Some(&user)).map_err(|Unusable { cause, why }| {
        let closed = closed_to(exe, user.uid);
        let worker_can = probe(exe, None).is_ok();
        let cause = match (&closed, worker_can) {
            (Some((dir, _)), _) => format!("closed-to-task-users:{}", dir.display()),
            (None, true) => "task-users-cannot-run-it".into(),
            // Unusable whoever runs it: no word about users.
            (None, false) => return Unusable { cause, why },
        };
        let closed = closed
            .map(|(dir, mode)| {
                format!(
                    "; {} (mode {:o}) is closed to it",
                    dir.display(),
                    mode & 0o7777
                )
            })
            .unwrap_or_default();
        let worker_can = if worker_can {
            ", though the worker's own user can run it"
        } else {
            ""
        };
        let why = format!(
            "as uid {uid}, the kind of user this worker runs each namespace's tasks as, {why}\
             {closed}{worker_can}. Tasks need an interpreter, and packages, that every user can \
             read: a system python3 (Debian's, with `pip install cloudpickle`) or a virtual \
             environment made from one outside any private home (under /opt, say); or run the \
             worker with --task-uids off (every task then runs as the worker's user, with no \
             isolation between namespaces)",
            uid = user.uid,
        );
        Unusable { cause, why }
    })
}

/// A private home (0700) for `uid`, removed when dropped.
fn check_home(uid: u32) -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::Builder::new()
        .prefix("escher-python-check-")
        .tempdir()?;
    std::os::unix::fs::chown(home.path(), Some(uid), Some(uid))?;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700))?;
    Ok(home)
}

/// The first place on `exe`'s way (its directories, and those of what it links to) that user
/// `uid` (gid the same, no other groups, as a task user) may not pass, with its mode; or `exe`
/// itself when that user may not run it.
pub(crate) fn closed_to(exe: &Path, uid: u32) -> Option<(PathBuf, u32)> {
    let may = |path: &Path, bits: u32| -> Option<bool> {
        let meta = std::fs::metadata(path).ok()?;
        let mode = meta.mode();
        let granted = if meta.uid() == uid {
            mode >> 6
        } else if meta.gid() == uid {
            mode >> 3
        } else {
            mode
        };
        Some(granted & bits == bits)
    };
    let mut ways = vec![exe.to_path_buf()];
    if let Ok(real) = std::fs::canonicalize(exe)
        && real != exe
    {
        ways.push(real);
    }
    for way in &ways {
        let mut dirs: Vec<&Path> = way.ancestors().skip(1).collect();
        dirs.reverse();
        for dir in dirs {
            if dir.as_os_str().is_empty() {
                continue;
            }
            if may(dir, 0o1) == Some(false) {
                let mode = std::fs::metadata(dir).map(|m| m.mode()).unwrap_or(0);
                return Some((dir.to_path_buf(), mode));
            }
        }
    }
    let real = ways.last()?;
    if may(real, 0o5) == Some(false) {
        let mode = std::fs::metadata(real).map(|m| m.mode()).unwrap_or(0);
        return Some((real.clone(), mode));
    }
    None
}

/// Runs `exe` briefly as `user` would run it (`None`: as the worker), with the environment the
/// interpreters get (`super::interpreter_command`: the worker's token never reaches Python): a
/// usable interpreter, or why it is not one.
pub(crate) fn probe(exe: &Path, user: Option<&TaskUser>) -> Result<Found, Unusable> {
    let mut child = super::interpreter_command(exe, user)
        .args(["-c", PROBE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Unusable::new("cannot-start", format!("it cannot be started ({e})")))?;
    let deadline = Instant::now() + PROBE_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Unusable::new(
                    "no-answer",
                    format!("it did not answer within {PROBE_LIMIT:?}"),
                ));
            }
            Err(e) => {
                return Err(Unusable::new(
                    "no-answer",
                    format!("cannot wait for it ({e})"),
                ));
            }
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    let verdict = verdict(out.lines().last().unwrap_or_default());
    match verdict {
        Ok((version, cloudpickle)) => Ok(Found {
            exe: exe.to_path_buf(),
            version,
            cloudpickle,
        }),
        Err(why) if why.why.is_empty() => Err(Unusable::new(
            "not-python",
            format!(
                "it is not a Python 3 interpreter it can run (it exited with {status} and said \
                 nothing escher understands)"
            ),
        )),
        Err(why) => Err(why),
    }
}

/// The probe's line read: the versions, or why the interpreter cannot run Python tasks
/// (empty: the line is not the probe's).
fn verdict(line: &str) -> Result<(String, String), Unusable> {
    let mut words = line.trim().splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("ok"), Some(version), cloudpickle) => {
            Ok((version.to_string(), cloudpickle.unwrap_or("?").to_string()))
        }
        (Some("old"), Some(version), _) => Err(Unusable::new(
            "python-too-old",
            format!("it is Python {version}; escher's Python tasks need 3.9 or later"),
        )),
        (Some("nocloudpickle"), Some(version), why) => Err(Unusable::new(
            "no-cloudpickle",
            format!(
                "it (Python {version}) cannot import cloudpickle ({}); install it there (`pip \
                 install cloudpickle`, or the escher package, which needs it)",
                why.unwrap_or("not installed")
            ),
        )),
        _ => Err(Unusable::new("not-python", "")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_answers_are_read() {
        assert_eq!(
            verdict("ok 3.11.2 3.1.1"),
            Ok(("3.11.2".into(), "3.1.1".into()))
        );
        let old = verdict("old 3.8.10").unwrap_err();
        assert!(old.why.contains("3.9 or later"), "{old:?}");
        assert_eq!(old.cause, "python-too-old");
        let no = verdict("nocloudpickle 3.12.1 No module named 'cloudpickle'").unwrap_err();
        assert!(
            no.why.contains("3.12.1")
                && no.why.contains("No module named")
                && no.why.contains("pip"),
            "{no:?}"
        );
        assert_eq!(no.cause, "no-cloudpickle");
        assert_eq!(verdict("Hello"), Err(Unusable::new("not-python", "")));
    }

    #[test]
    fn what_is_not_python_is_refused_saying_so() {
        let why = probe(Path::new("/bin/true"), None).unwrap_err();
        assert!(why.why.contains("not a Python 3 interpreter"), "{why:?}");
        let why = probe(Path::new("/nonexistent/python3"), None).unwrap_err();
        assert!(why.why.contains("cannot be started"), "{why:?}");
        assert_eq!(why.cause, "cannot-start");
    }

    #[test]
    fn the_labels_say_the_versions_or_the_cause_as_label_text() {
        let served = Offer::Serve(Found {
            exe: "/usr/bin/python3".into(),
            version: "3.11.2".into(),
            cloudpickle: "3.1.1".into(),
        });
        assert_eq!(
            served.labels(),
            [
                (LABEL, "3.11.2".into()),
                (CLOUDPICKLE_LABEL, "3.1.1".into())
            ]
        );
        let refused = Offer::Refused("closed-to-task-users:/home/a b,c=d".into());
        assert_eq!(
            refused.labels(),
            [(LABEL, "none:closed-to-task-users:/home/a_b_c_d".into())]
        );
        let long = Offer::Refused("x".repeat(400)).labels();
        assert_eq!(long[0].1.len(), 256);
        assert!(Offer::NotAsked.labels().is_empty());
        for (key, value) in served.labels().into_iter().chain(long) {
            escher_proto::types::Labels::new()
                .insert(key, &value)
                .unwrap();
        }
    }

    /// A directory on the way closed to a uid is found (by its mode and owner: no change of
    /// user needed), and so is a program it may not run; the owner passes.
    #[test]
    fn a_place_closed_to_a_task_user_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let exe = private.join("python3");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let stranger = 300_777;
        let owner = nix::unistd::geteuid().as_raw();
        assert_eq!(closed_to(&exe, stranger), Some((private.clone(), 0o40700)));
        assert_eq!(closed_to(&exe, owner), None);
        // Through a link (a virtual environment's python3), the target's way counts too.
        let link = dir.path().join("venv-python3");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        assert_eq!(closed_to(&link, stranger), Some((private.clone(), 0o40700)));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(closed_to(&exe, stranger), Some((exe.clone(), 0o100700)));
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(closed_to(&link, stranger), None);
    }
}
