//! Limits a worker cannot keep are refused when it starts, with what to change: the real
//! `escher-worker` binary, started with `--require-limits` where the cgroup hierarchies are
//! read-only or missing (in a mount namespace of the test's own, `unshare -m`, so the host's
//! stay as they are) and as a user that is not root; and settings no task could run under.
//! The tests that change mounts or users start with `needs_root_` (CI runs as root).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_escher-worker");

/// Runs `wrap`, then the worker with `args` and a head nobody serves, and returns what it
/// wrote to stderr once it exited; fails the test if it ran on (it started: not refused).
fn refused(wrap: &[&str], args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    // Every user may write here (the test runs a worker as nobody too).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::create_dir(dir.path().join("spill")).unwrap();
    std::fs::set_permissions(
        dir.path().join("spill"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let mut command = match wrap.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(WORKER);
            c
        }
        None => Command::new(WORKER),
    };
    let mut child = command
        .args(["--head", "http://127.0.0.1:9", "--name", "refused"])
        .args(["--no-pid-namespace", "--no-python"])
        .args(["--state-dir", &path("state"), "--log-dir", &path("logs")])
        .args(["--object-spill-dir", &path("spill")])
        .args(args)
        .env("ESCHER_HOME", path("home"))
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the worker starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the worker started instead of refusing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!status.success(), "{stderr}");
    assert_ne!(
        status.code(),
        Some(97),
        "the test could not prepare its mounts: {stderr}"
    );
    stderr
}

/// A shell that changes every cgroup mount of its own mount namespace with `change` (a command
/// given the mount point as `$m`), then runs the worker.
fn with_cgroup_mounts(change: &str) -> Vec<&str> {
    vec![
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        change,
    ]
}

const EVERY_CGROUP_MOUNT: &str = r#"awk '{for(i=7;i<=NF;i++) if($i=="-"){ if($(i+1) ~ /^cgroup2?$/) print $5; break }}' /proc/self/mountinfo"#;

fn root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test changes mounts and users: run it as root (CI does)"
    );
}

#[test]
fn needs_root_require_limits_on_a_read_only_hierarchy_is_refused_with_what_to_change() {
    root();
    let script = format!(
        r#"n=0; for m in $({EVERY_CGROUP_MOUNT}); do mount -o remount,bind,ro "$m" || exit 97; n=$((n+1)); done; [ $n -gt 0 ] || exit 97; exec "$0" "$@""#
    );
    let said = refused(&with_cgroup_mounts(&script), &["--require-limits"]);
    assert!(
        said.contains("require-limits")
            && said.contains("cannot hold its tasks to every limit")
            && said.contains("mounted read-only: mount it read-write"),
        "{said}"
    );
}

#[test]
fn needs_root_require_limits_without_the_controllers_is_refused_with_what_to_change() {
    root();
    let script = format!(
        r#"n=0; for m in $({EVERY_CGROUP_MOUNT} | sort -r); do umount -l "$m" || exit 97; n=$((n+1)); done; [ $n -gt 0 ] || exit 97; exec "$0" "$@""#
    );
    let said = refused(&with_cgroup_mounts(&script), &["--require-limits"]);
    assert!(
        said.contains("cannot hold its tasks to every limit")
            && said.contains("memory: ")
            && said.contains("mount the missing controllers' hierarchies"),
        "{said}"
    );
}

#[test]
fn needs_root_require_limits_as_a_user_that_is_not_root_is_refused_with_what_to_change() {
    root();
    // The binary must be reachable by nobody.
    assert!(Path::new(WORKER).exists());
    let said = refused(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        &["--require-limits"],
    );
    assert!(
        said.contains("cannot hold its tasks to every limit")
            && said.contains("runs as uid 65534")
            && said.contains("run it as root"),
        "{said}"
    );
}

#[test]
fn settings_no_task_could_run_under_are_refused_at_start() {
    let said = refused(&[], &["--task-pids-max", "0"]);
    assert!(said.contains("task-pids-max: 0 processes"), "{said}");
    let said = refused(&[], &["--memory", "1000000000"]);
    assert!(said.contains("more than this machine has"), "{said}");
    let said = refused(&[], &["--task-scratch-bytes", "0"]);
    assert!(said.contains("--no-task-scratch"), "{said}");
}
