//! `cargo install`, as the README's "Installing the binaries" says: the three packages installed
//! from this checkout into a root of their own (`--root`, not `~/.cargo`), then used from
//! there: each binary's `--version` names the version and the commit, and the installed
//! `escher-head`, `escher-worker` and `escher` run a task together.
//!
//! The install builds in `target/install` (debug, to keep CI's build short: what is checked
//! here is that the packages install and the installed binaries work, not their speed), from
//! the crates cargo has already fetched (`--offline`) and the workspace's lock file
//! (`--locked`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command` and returns its stdout, or panics with everything it printed.
fn run(what: &str, command: &mut Command) -> String {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `file` holds something, or panics after a minute.
fn wait_for_file(file: &Path, process: &mut Running) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && !text.trim().is_empty()
        {
            return text.trim().to_string();
        }
        if let Ok(Some(status)) = process.0.try_wait() {
            panic!("the installed escher-head exited with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{} was not written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cargo_install_installs_the_three_binaries_and_they_run_a_task() {
    let install_root = tempfile::tempdir().expect("a temporary directory");
    let target_dir = root().join("target").join("install");
    for package in ["head", "worker", "cli"] {
        run(
            &format!("cargo install --path {package}"),
            Command::new(env!("CARGO"))
                .current_dir(root())
                .args(["install", "--locked", "--offline", "--debug", "--quiet"])
                .args(["--path", package, "--root"])
                .arg(install_root.path())
                .arg("--target-dir")
                .arg(&target_dir)
                .env_remove("CARGO_TARGET_DIR"),
        );
    }
    let bin = install_root.path().join("bin");
    for name in ["escher-head", "escher-worker", "escher"] {
        let version = run(
            &format!("{name} --version"),
            Command::new(bin.join(name)).arg("--version"),
        );
        assert!(
            version.contains(env!("CARGO_PKG_VERSION")) && version.contains("commit"),
            "{name} --version: {version}"
        );
    }

    // The installed binaries together, on loopback, in a home of their own.
    let home = tempfile::tempdir().expect("a temporary directory");
    let address_file = home.path().join("head.url");
    let env = |command: &mut Command| {
        command
            .env("ESCHER_HOME", home.path())
            .env_remove("ESCHER_HEAD")
            .env_remove("ESCHER_ACCESS_FILE")
            .env_remove("ESCHER_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let mut head = Command::new(bin.join("escher-head"));
    head.args(["--listen", "127.0.0.1:0", "--address-file"])
        .arg(&address_file);
    env(&mut head);
    let mut head = Running(head.spawn().expect("the installed escher-head"));
    let url = wait_for_file(&address_file, &mut head);
    let mut worker = Command::new(bin.join("escher-worker"));
    worker
        .args([
            "--head",
            &url,
            "--name",
            "installed",
            "--resources",
            "cpu=1",
        ])
        .arg("--state-dir")
        .arg(home.path().join("worker"))
        .arg("--log-dir")
        .arg(home.path().join("logs"));
    env(&mut worker);
    let _worker = Running(worker.spawn().expect("the installed escher-worker"));
    let mut submit = Command::new(bin.join("escher"));
    submit
        .args(["--head", &url, "submit", "--resources", "cpu=1", "--wait"])
        .args(["--timeout", "60", "--", "echo", "installed"]);
    env(&mut submit);
    submit.stdout(Stdio::piped()).stderr(Stdio::piped());
    let submitted = run("the installed escher submit", &mut submit);
    let id = submitted
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut logs = Command::new(bin.join("escher"));
    logs.args(["--head", &url, "logs", &id]);
    env(&mut logs);
    logs.stdout(Stdio::piped()).stderr(Stdio::piped());
    assert_eq!(
        run("the installed escher logs", &mut logs).trim(),
        "installed"
    );
    drop(head);
}
