//! The Python package's suite (`python/tests`, pytest) and its examples (`python/examples`),
//! run by `cargo test --workspace` as docs/python.md installs the package: a fresh virtual
//! environment in a temporary directory, `pip install ./python` (maturin builds the native
//! module, abi3, once, with the dev profile, reusing what `cargo test` built), pytest, mypy and
//! NumPy from PyPI. Fails if pytest fails.
//!
//! Needs `python3` (3.9 or later, with `venv` and `pip`) and PyPI, as CI has; `ESCHER_TEST_PYTHON`
//! names another interpreter. `python/tests/test_processes.py` and `test_failover.py` run this
//! build's `escher-head` and `escher-worker` (which `cargo test --workspace` builds): workers
//! that find Python by themselves or say why not, Python tasks' processes held by task cgroups
//! (a worker SIGKILLed with its fence included), and a head of three replicas whose leader is
//! SIGKILLed under a Python driver.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long installing the package (building the module) and running the suite may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(40 * 60);
const SUITE_LIMIT: Duration = Duration::from_secs(15 * 60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Waits for `child` at most `limit`; kills it (it is ours) past that.
fn finish(mut child: Child, limit: Duration, what: &str) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!("{what} failed: {status}");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run(cmd: &mut Command, limit: Duration, what: &str) -> Result<()> {
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {what}: {cmd:?}"))?;
    finish(child, limit, what)
}

/// Where cargo put the workspace's binaries (`escher-head`, `escher-worker`): the directory
/// above the test executable's `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable is in a directory");
    match deps.file_name() {
        Some(name) if name == "deps" => deps.parent().unwrap_or(deps).to_path_buf(),
        _ => deps.to_path_buf(),
    }
}

/// The target directory of the cargo that built this test (`bin_dir()` is its `debug/`).
fn target_dir() -> PathBuf {
    let bins = bin_dir();
    bins.parent().map(Path::to_path_buf).unwrap_or(bins)
}

/// A virtual environment with the package, pytest, mypy, NumPy and cloudpickle installed.
fn venv(dir: &Path) -> Result<PathBuf> {
    let python = std::env::var("ESCHER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let venv = dir.join("venv");
    run(
        Command::new(&python).args(["-m", "venv"]).arg(&venv),
        Duration::from_secs(300),
        "creating a virtual environment (python3 -m venv; on Debian: apt-get install python3-venv)",
    )?;
    let py = venv.join("bin").join("python");
    run(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg("./python")
            // NumPy: test_objects.py checks that arrays travel out of band and come back as
            // views of the object's bytes.
            .args(["pytest", "mypy", "numpy"])
            .current_dir(root())
            // docs/python.md's install, built with the dev profile in the workspace's target
            // directory, beside what `cargo test` built (cargo holds no lock on it while
            // tests run).
            .env("MATURIN_PEP517_ARGS", "--profile dev")
            .env("CARGO_TARGET_DIR", target_dir()),
        INSTALL_LIMIT,
        "pip install ./python pytest mypy numpy",
    )?;
    Ok(py)
}

#[test]
fn needs_pypi_python_suite_and_examples_pass() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Readable by others: a worker run as root runs Python tasks as users of their own, with
    // this environment's interpreter (test_processes.py).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let py = venv(dir.path())?;
    let mut pytest = Command::new(&py);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root().join("python").join("tests"))
        // From the temporary directory: the package comes from the environment, never from
        // the source tree.
        .current_dir(dir.path())
        // The binaries test_processes.py runs: those of this build (beside `deps/`).
        .env("ESCHER_TEST_BIN_DIR", bin_dir())
        .env_remove("ESCHER_HEAD")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_PYTHON")
        .env_remove("ESCHER_NAMESPACE");
    run(
        &mut pytest,
        SUITE_LIMIT,
        "the Python suite (pytest python/tests)",
    )
}
