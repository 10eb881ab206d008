//! The fence supervisor of a real `escher-worker` process (the binary, against the fake head):
//! killed alone, it is replaced at once by one that holds the tasks the dead one held (it kills
//! them when the worker dies), and the worker's heartbeats say what happened.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use escher_proto::types::{Assignment, HeadMessage, WorkerMessage};
use escher_proto::{ResourceSet, TaskId};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{FakeHead, attached, bounded, sh};

/// The worker process, SIGKILLed and reaped when the test ends however it ends.
struct WorkerProcess(Child);

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pids of the processes whose parent is `parent` and whose name is `name`.
fn children_named(parent: u32, name: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // PID (COMM) STATE PPID ...
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..].split_whitespace().nth(1);
        if &stat[open + 1..close] == name && ppid == Some(parent.to_string().as_str()) {
            found.push(pid);
        }
    }
    found
}

/// Whether process `pid` lives (and is not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"))
}

/// Polls `probe` every 20 ms until it holds, for at most `support::BOUND`.
async fn until(what: &str, mut probe: impl FnMut() -> bool) {
    bounded(what, async {
        while !probe() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// The pid a task wrote to `file`, once it has.
async fn pid_in(file: &Path) -> i32 {
    let mut pid = None;
    until("the task to write its pid", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse().ok());
        pid.is_some()
    })
    .await;
    pid.unwrap_or_default()
}

#[tokio::test]
async fn a_killed_fence_supervisor_is_replaced_by_one_that_holds_the_tasks() {
    let mut head = FakeHead::start(Duration::from_millis(100)).await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Command::new(env!("CARGO_BIN_EXE_escher-worker"))
        .args([
            "--head",
            &head.url(),
            "--name",
            "fenced",
            "--no-pid-namespace",
            // The task writes its pid into this test's directory, under the host's /tmp.
            "--no-private-tmp",
        ])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--log-dir")
        .arg(dir.path().join("logs"))
        .env("ESCHER_TOKEN", "fake")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut worker = WorkerProcess(worker);
    let worker_pid = worker.0.id();
    attached(&mut head).await;
    let fences = children_named(worker_pid, "escher-fence");
    assert_eq!(fences.len(), 1, "one supervisor: {fences:?}");

    // A task that writes its pid, then runs until something kills it.
    let file = dir.path().join("task.pid");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let script = format!("echo $$ > {}; exec sleep 600", file.display());
    head.send(HeadMessage::Assign(Assignment {
        task_id: TaskId(1),
        attempt: 1,
        spec: sh(&script),
        allocation: ResourceSet::new(),
        task_token: "escher-task-1".into(),
        objects: Vec::new(),
    }));
    let task = pid_in(&file).await;

    kill(Pid::from_raw(fences[0]), Signal::SIGKILL).unwrap();
    until("another supervisor", || {
        children_named(worker_pid, "escher-fence")
            .iter()
            .any(|pid| *pid != fences[0])
    })
    .await;
    // The worker's next heartbeats say what happened.
    bounded("a heartbeat that reports the restart", async {
        loop {
            if let (_, WorkerMessage::Heartbeat { fence, metrics, .. }) = head.message().await
                && let Some(report) = fence
            {
                assert!(
                    report.starts_with(
                        "restarted 1 time(s): the last supervisor was killed by SIGKILL"
                    ),
                    "{report}"
                );
                let restarts = metrics.iter().find(|m| m.name == "fence_restarts");
                assert_eq!(restarts.map(|m| m.value), Some(1.0));
                break;
            }
        }
    })
    .await;
    assert!(alive(task), "the restart stopped nothing");

    // The new supervisor holds the task: the worker's death ends it.
    kill(Pid::from_raw(worker_pid as i32), Signal::SIGKILL).unwrap();
    let _ = worker.0.wait();
    until("the new supervisor to kill the task", || !alive(task)).await;
}
