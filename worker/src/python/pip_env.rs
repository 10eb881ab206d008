//! `runtime_env={"pip": [...]}`: the requirements a Python call needs, installed by the worker
//! into a virtual environment of their own, made once per requirement set and reused.
//!
//! A call whose envelope names requirements (format 3, `mod.rs`) runs in an interpreter of the
//! environment of that set instead of the worker's own. The environment is keyed by a hash of
//! the sorted, deduplicated set and of the worker's interpreter (its path and its Python's and
//! cloudpickle's versions), and lives under the task user's home
//! (`~/.escher/python-envs/KEY`): each namespace's user has its own, as its interpreters do.
//! It is made by `pip_env.py`, run with the worker's interpreter as the task's user: `python -m
//! venv`, then `pip install` of the set from the package index that pip's own configuration
//! names (its files, and the worker's `PIP_*` and proxy variables, which reach pip and not the
//! tasks), under a file lock so that two interpreters of the host never make it twice. The
//! environment sees the worker interpreter's packages after its own, so cloudpickle is there
//! and a requirement can replace anything else. Within a worker, one build per set runs at a
//! time and its interpreter's path is kept (while the environment's marker is there), so a
//! later call pays nothing. A failing install
//! fails the call with pip's words and leaves nothing behind; the next call tries again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::detect::Found;
use crate::exec::TaskUser;

/// The builder, run as `python -c <it> KEY REQUIREMENT...`.
const BUILDER: &str = include_str!("pip_env.py");
/// The most requirements one call may name, and the longest one.
pub(super) const MAX_REQUIREMENTS: usize = 256;
const MAX_REQUIREMENT_LEN: usize = 1024;

/// The requirement set of a call, read from its envelope: one requirement a line. Sorted and
/// deduplicated (the driver sends them so; a set is one set whatever its order). Options
/// (`--index-url ...`) are refused: where pip looks is the worker's configuration.
pub(super) fn parse(text: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(text)
        .map_err(|_| "the pip requirements are not UTF-8 text".to_string())?;
    let mut set: Vec<String> = text
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if set.len() > MAX_REQUIREMENTS {
        return Err(format!(
            "runtime_env's pip names {} requirements, at most {MAX_REQUIREMENTS} are allowed",
            set.len()
        ));
    }
    for r in &set {
        if r.len() > MAX_REQUIREMENT_LEN || r.chars().any(char::is_control) {
            return Err(format!(
                "runtime_env's pip requirement {:?} is not one requirement of at most \
                 {MAX_REQUIREMENT_LEN} bytes on one line",
                r.chars().take(80).collect::<String>()
            ));
        }
        if r.trim_start().starts_with('-') {
            return Err(format!(
                "runtime_env's pip requirement {r:?} is an option of pip: a call names \
                 packages only, and where pip finds them is the worker's pip configuration \
                 (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS)"
            ));
        }
    }
    set.sort();
    set.dedup();
    Ok(set)
}

/// The interpreter of one environment once made, behind the lock its build holds.
type Slot = Arc<Mutex<Option<PathBuf>>>;

/// The environments of one worker's requirement sets: the interpreter of each one made, by
/// namespace and key, and a lock per set so that one build runs at a time.
#[derive(Debug, Default)]
pub(super) struct Envs {
    made: Mutex<HashMap<(String, String), Slot>>,
}

impl Envs {
    /// The interpreter of the environment of `set` for namespace `ns` (whose tasks run as
    /// `user`), made now if it is not yet.
    pub(super) async fn interpreter(
        &self,
        found: &Found,
        ns: &str,
        user: Option<&TaskUser>,
        set: &[String],
    ) -> Result<PathBuf, String> {
        let key = key(found, set);
        let slot = Arc::clone(
            self.made
                .lock()
                .await
                .entry((ns.to_string(), key.clone()))
                .or_default(),
        );
        let mut slot = slot.lock().await;
        // Kept while its marker is there: one removed (to free its space) is made again.
        if let Some(python) = slot.as_ref()
            && ready(python)
        {
            return Ok(python.clone());
        }
        let started = std::time::Instant::now();
        let python = build(found, user, &key, set).await.inspect_err(|why| {
            tracing::warn!(namespace = ns, %why, "a runtime_env's pip environment could not be made");
        })?;
        // Made now, or found made by an earlier build (of this worker or another on the host).
        tracing::info!(
            namespace = ns,
            requirements = %set.join(" "),
            python = %python.display(),
            seconds = started.elapsed().as_secs_f64(),
            "a runtime_env's pip environment is ready"
        );
        *slot = Some(python.clone());
        Ok(python)
    }
}

/// Whether the environment of interpreter `python` (`KEY/bin/python`) is still whole: its
/// marker `KEY/escher-ready`, written last by the builder, is there.
fn ready(python: &Path) -> bool {
    python
        .parent()
        .and_then(Path::parent)
        .is_some_and(|venv| venv.join("escher-ready").is_file())
}

/// The hex SHA-256 (its first 32 digits) of the interpreter and the sorted set.
fn key(found: &Found, set: &[String]) -> String {
    let mut hash = Sha256::new();
    hash.update(found.exe.as_os_str().as_encoded_bytes());
    hash.update(b"\0");
    hash.update(found.version.as_bytes());
    hash.update(b"\0");
    hash.update(found.cloudpickle.as_bytes());
    for r in set {
        hash.update(b"\0");
        hash.update(r.as_bytes());
    }
    super::hex(&hash.finalize()[..16])
}

/// Whether a variable of the worker's environment reaches pip (and only pip): its own
/// configuration and the proxies it goes through.
fn for_pip(name: &str) -> bool {
    name.starts_with("PIP_")
        || matches!(
            name.to_ascii_lowercase().as_str(),
            "http_proxy" | "https_proxy" | "no_proxy" | "all_proxy"
        )
}

/// Runs the builder as `user` and waits for it; its process group is killed if the call is
/// dropped meanwhile (a cancelled task), which leaves no marker, so the next call makes the
/// environment again.
async fn build(
    found: &Found,
    user: Option<&TaskUser>,
    key: &str,
    set: &[String],
) -> Result<PathBuf, String> {
    let mut command = super::interpreter_command(&found.exe, user);
    command
        .envs(std::env::vars().filter(|(k, _)| for_pip(k)))
        .arg("-c")
        .arg(BUILDER)
        .arg(key)
        .args(set);
    let mut command = tokio::process::Command::from(command);
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} to make the runtime_env's pip environment: {e}",
                found.exe.display()
            )
        })?;
    let group = Group(child.id().map(|id| id as i32));
    let out = child.wait_with_output().await.map_err(|e| {
        format!("cannot wait for the making of the runtime_env's pip environment: {e}")
    })?;
    std::mem::forget(group);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "runtime_env's pip requirements [{}] could not be installed on this worker: {}",
            set.join(", "),
            stderr.trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let python = stdout
        .lines()
        .last()
        .map(Path::new)
        .filter(|p| p.is_absolute());
    python.map(Path::to_path_buf).ok_or_else(|| {
        format!(
            "the making of the runtime_env's pip environment named no interpreter (its output: \
             {:?}; {})",
            stdout.trim(),
            stderr.trim()
        )
    })
}

/// A builder's process group, killed when dropped before the builder finished.
struct Group(Option<i32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_sorted_and_options_are_refused() {
        assert_eq!(
            parse(b"b==1\na\nb==1\n").unwrap(),
            vec!["a".to_string(), "b==1".to_string()]
        );
        assert_eq!(parse(b"").unwrap(), Vec::<String>::new());
        let e = parse(b"--index-url=http://x\nrequests").unwrap_err();
        assert!(
            e.contains("option of pip") && e.contains("PIP_INDEX_URL"),
            "{e}"
        );
        assert!(parse(b"a\rb").unwrap_err().contains("one line"));
        assert!(parse(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
        let many = (0..=MAX_REQUIREMENTS)
            .map(|i| format!("p{i}"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(parse(many.as_bytes()).unwrap_err().contains("at most"));
    }

    #[test]
    fn an_environment_is_ready_while_its_marker_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("KEY").join("bin").join("python");
        std::fs::create_dir_all(python.parent().unwrap()).unwrap();
        assert!(!ready(&python));
        std::fs::write(dir.path().join("KEY").join("escher-ready"), "{}").unwrap();
        assert!(ready(&python));
        assert!(!ready(Path::new("python")));
    }

    #[test]
    fn the_key_names_the_set_and_the_interpreter() {
        let found = Found {
            exe: "/usr/bin/python3".into(),
            version: "3.11.2".into(),
            cloudpickle: "3.1.1".into(),
        };
        let set = vec!["a".to_string(), "b".to_string()];
        let k = key(&found, &set);
        assert_eq!(k.len(), 32);
        assert_eq!(k, key(&found, &set));
        assert_ne!(k, key(&found, &["ab".to_string()]));
        let other = Found {
            exe: "/opt/python3".into(),
            ..found.clone()
        };
        assert_ne!(k, key(&other, &set));
    }
}
