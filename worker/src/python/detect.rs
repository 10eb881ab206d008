//! Which Python interpreter a worker runs Python tasks with, if any: the one `ESCHER_PYTHON`
//! names, else (for `escher-worker`, [`PythonDetection::Detect`]) `python3` on `PATH`; each
//! checked once, at start, by running it briefly: it must be CPython 3.9 or later and import
//! `cloudpickle`, as the interpreters' side of the protocol (`runner.py`) does. The worker logs
//! what it found, or why it offers no Python.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ENV_PYTHON;
use crate::error::WorkerError;

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

/// The interpreter this worker runs Python tasks with, or `None` (logged, with why). An
/// interpreter that `ESCHER_PYTHON` names but that cannot run Python tasks is an error that
/// says why; one merely looked for (`auto`, or [`PythonDetection::Detect`]) is not.
pub(crate) fn resolve(mode: PythonDetection) -> Result<Option<Found>, WorkerError> {
    let set = std::env::var(ENV_PYTHON)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    if mode == PythonDetection::Off {
        tracing::info!("no Python tasks on this worker: turned off (--no-python)");
        return Ok(None);
    }
    let looked_for = match set.as_deref() {
        Some("none" | "off") => {
            tracing::info!("no Python tasks on this worker: {ENV_PYTHON} turns them off");
            return Ok(None);
        }
        Some("auto") => "python3",
        Some(named) => return named_interpreter(named).map(Some),
        None if mode == PythonDetection::Detect => "python3",
        None => return Ok(None),
    };
    let Ok(exe) = which::which(looked_for) else {
        tracing::info!(
            "no Python tasks on this worker: no {looked_for} on PATH; set {ENV_PYTHON} to an \
             interpreter (3.9 or later, with cloudpickle) to offer them"
        );
        return Ok(None);
    };
    match probe(&exe) {
        Ok(found) => {
            tracing::info!(python = %found.exe.display(), version = %found.version, cloudpickle = %found.cloudpickle, "Python tasks run with the python3 found on PATH");
            Ok(Some(found))
        }
        Err(why) => {
            tracing::info!(
                python = %exe.display(),
                "no Python tasks on this worker: {why}; set {ENV_PYTHON} to another \
                 interpreter, or --no-python to say none is wanted"
            );
            Ok(None)
        }
    }
}

/// The interpreter `ESCHER_PYTHON` names (a path, or a name on `PATH`), checked.
fn named_interpreter(named: &str) -> Result<Found, WorkerError> {
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
    let found = probe(&exe).map_err(|why| {
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

/// Runs `exe` briefly: a usable interpreter, or why it is not one. With the environment the
/// interpreters get (`Pool::spawn`), not the worker's (its token never reaches Python).
pub(crate) fn probe(exe: &Path) -> Result<Found, String> {
    let pass = ["HOME", "PYTHONPATH", "VIRTUAL_ENV"].map(String::from);
    let mut child = Command::new(exe)
        .args(["-c", PROBE])
        .env_clear()
        .envs(crate::exec::task_base_env(std::env::vars(), &pass))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("it cannot be started ({e})"))?;
    let deadline = Instant::now() + PROBE_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("it did not answer within {PROBE_LIMIT:?}"));
            }
            Err(e) => return Err(format!("cannot wait for it ({e})")),
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
        Err(why) if why.is_empty() => Err(format!(
            "it is not a Python 3 interpreter (it exited with {status} and said nothing escher \
             understands)"
        )),
        Err(why) => Err(why),
    }
}

/// The probe's line read: the versions, or why the interpreter cannot run Python tasks
/// (empty: the line is not the probe's).
fn verdict(line: &str) -> Result<(String, String), String> {
    let mut words = line.trim().splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("ok"), Some(version), cloudpickle) => {
            Ok((version.to_string(), cloudpickle.unwrap_or("?").to_string()))
        }
        (Some("old"), Some(version), _) => Err(format!(
            "it is Python {version}; escher's Python tasks need 3.9 or later"
        )),
        (Some("nocloudpickle"), Some(version), why) => Err(format!(
            "it (Python {version}) cannot import cloudpickle ({}); install it there (`pip \
             install cloudpickle`, or the escher package, which needs it)",
            why.unwrap_or("not installed")
        )),
        _ => Err(String::new()),
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
        assert!(verdict("old 3.8.10").unwrap_err().contains("3.9 or later"));
        let why = verdict("nocloudpickle 3.12.1 No module named 'cloudpickle'").unwrap_err();
        assert!(
            why.contains("3.12.1") && why.contains("No module named") && why.contains("pip"),
            "{why}"
        );
        assert_eq!(verdict("Hello"), Err(String::new()));
    }

    #[test]
    fn what_is_not_python_is_refused_saying_so() {
        let why = probe(Path::new("/bin/true")).unwrap_err();
        assert!(why.contains("not a Python 3 interpreter"), "{why}");
        let why = probe(Path::new("/nonexistent/python3")).unwrap_err();
        assert!(why.contains("cannot be started"), "{why}");
    }
}
