//! The harness' own Python virtual environment for the peers: `.venv-bench/` at the workspace
//! root (git-ignored), created with `python3 -m venv` and filled with pinned packages from PyPI
//! the first time `--peers` runs; later runs reuse it when the pins match.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// What the peers need, pinned: Ray and HyperQueue, and NumPy for the objects workload's arrays
/// (`python/bench/objects.py`), which Ray does not install.
pub const PINS: [(&str, &str); 3] = [
    ("ray", "2.60.0"),
    ("hyperqueue", "0.27.0"),
    ("numpy", "2.4.6"),
];

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The folder of the peer driver scripts (`benches/peers/`).
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers")
}

/// The venv's Python, creating the venv and installing the pins if needed.
pub fn ensure() -> anyhow::Result<PathBuf> {
    let venv = workspace_root().join(".venv-bench");
    let python = venv.join("bin").join("python");
    if python.is_file() && pins_installed(&python) {
        return Ok(python);
    }
    if !python.is_file() {
        eprintln!("escher-bench: creating {} ...", venv.display());
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("cannot run python3 -m venv (is python3 installed?)")?;
        if !status.success() {
            bail!("python3 -m venv {} failed ({status})", venv.display());
        }
    }
    let specs: Vec<String> = PINS.iter().map(|(p, v)| format!("{p}=={v}")).collect();
    eprintln!("escher-bench: pip install {} ...", specs.join(" "));
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(&specs)
        .status()
        .context("cannot run pip in the benchmark venv")?;
    if !status.success() {
        bail!("pip install {} failed ({status})", specs.join(" "));
    }
    if !pins_installed(&python) {
        bail!(
            "pip reported success but {} are not importable",
            specs.join(", ")
        );
    }
    Ok(python)
}

/// Whether every pin is installed at its version.
fn pins_installed(python: &Path) -> bool {
    let check = PINS
        .iter()
        .map(|(p, v)| format!("metadata.version({p:?}) == {v:?}"))
        .collect::<Vec<_>>()
        .join(" and ");
    let code = format!("import sys; from importlib import metadata; sys.exit(0 if {check} else 1)");
    Command::new(python)
        .args(["-I", "-c", &code])
        .output()
        .is_ok_and(|o| o.status.success())
}
