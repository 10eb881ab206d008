//! Installing the binaries, as the README's "Installing the binaries" says: `cargo install
//! --locked --path head|worker|cli` builds each package's binary and copies it into `<root>/bin`.
//! This test checks both halves without building anything a second time:
//! - what cargo would build: each of the three packages has its binary target, and that
//!   target's required features are among the package's default ones (`cargo install` builds
//!   with the defaults, while `cargo test --workspace` turns on every feature some member asks
//!   for, so a binary left out of the defaults would pass every other test and install nothing);
//! - what it would copy: the binaries `cargo test` has already built (`target/<profile>/`), put
//!   into a root of their own (`--root`, not `~/.cargo`) and run from there, away from the
//!   checkout: each one's `--version` names the version and the commit, and the installed
//!   `escher-head`, `escher-worker` and `escher` run a task together.
//!
//! It once ran `cargo install --debug` three times into a target directory of its own: a
//! second build of every dependency, the longest part of the test suite's build.

mod procs;

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

/// The packages `cargo install --path` is given and the binary each one installs.
const PACKAGES: [(&str, &str, &str); 3] = [
    ("head", "escher-head", "escher-head"),
    ("worker", "escher-worker", "escher-worker"),
    ("cli", "escher-cli", "escher"),
];

#[test]
fn each_package_installs_its_binary_with_its_default_features() {
    let metadata = run(
        "cargo metadata",
        Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["metadata", "--no-deps", "--offline", "--locked"])
            .args(["--format-version", "1"]),
    );
    let metadata: serde_json::Value = serde_json::from_str(&metadata).expect("cargo's JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    for (dir, package, binary) in PACKAGES {
        let found = packages
            .iter()
            .find(|p| p["name"] == package)
            .unwrap_or_else(|| panic!("no package {package} in the workspace"));
        let manifest = found["manifest_path"].as_str().expect("a manifest path");
        assert!(
            Path::new(manifest).starts_with(root().join(dir)),
            "{package} is not the package at {dir}/: {manifest}"
        );
        let target = found["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .find(|t| t["name"] == binary && t["kind"][0] == "bin")
            .unwrap_or_else(|| panic!("{package} has no binary {binary}"));
        let defaults: Vec<&str> = found["features"]["default"]
            .as_array()
            .map(|d| d.iter().filter_map(|f| f.as_str()).collect())
            .unwrap_or_default();
        let required: Vec<&str> = target["required-features"]
            .as_array()
            .map(|r| r.iter().filter_map(|f| f.as_str()).collect())
            .unwrap_or_default();
        for feature in required {
            assert!(
                defaults.contains(&feature),
                "`cargo install --path {dir}` would not install {binary}: it requires feature \
                 {feature}, which is not among {package}'s default features {defaults:?}"
            );
        }
    }
}

#[test]
fn the_installed_binaries_report_their_commit_and_run_a_task() {
    let install_root = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir(install_root.path().join("bin")).expect("mkdir bin");
    for (_, _, binary) in PACKAGES {
        // What `cargo install` does once it has built: a copy, which keeps the mode.
        std::fs::copy(
            procs::binary(binary),
            install_root.path().join("bin").join(binary),
        )
        .unwrap_or_else(|e| panic!("copying {binary}: {e}"));
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
            .current_dir(home.path())
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
