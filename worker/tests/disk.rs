//! Bytes on disk held per task, against real processes on a root worker (CI runs as root),
//! whose log directory and tasks' directory are a small tmpfs the test mounts as the node's
//! disk: a task flooding its home, its `TMPDIR` and its log fills its own scratch and fails
//! saying so while another namespace's task beside it succeeds, and the scratch is emptied when
//! it ends; a node under its disk reserve starts nothing until space returns; a running task's
//! log stops when the disk goes under the reserve.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use escher_proto::types::{Assignment, HeadMessage, TaskFinished, WorkerMessage};
use escher_proto::{ResourceSet, TaskId, TaskResult, TaskSpec};
use escher_worker::exec::Reserve;
use support::{FakeHead, RunningWorker, attached, bounded, sh, worker};

const HEARTBEAT: Duration = Duration::from_millis(200);

/// A tmpfs of `bytes` mounted at a temporary directory, the node's disk; unmounted when
/// dropped.
struct Disk {
    dir: tempfile::TempDir,
}

impl Disk {
    fn mount(bytes: u64) -> Disk {
        assert!(
            nix::unistd::geteuid().is_root(),
            "these tests mount a small disk and run tasks as users of their own: run them as \
             root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mount -t tmpfs failed");
        Disk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn free(&self) -> u64 {
        escher_worker::exec::space_of(self.path()).unwrap().free
    }

    /// The mounts below the disk (the tasks' scratch directories).
    fn mounts_below(&self) -> Vec<String> {
        let below = format!("{}/", self.path().display());
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&below))
            .collect()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        for below in self.mounts_below() {
            let _ = Command::new("umount").args(["-l", &below]).status();
        }
        // Lazily: a worker that a failed test left running may still hold it.
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Writes a file of zeros that leaves `leave` bytes free on `disk`.
fn fill_to(disk: &Disk, leave: u64) -> std::path::PathBuf {
    let path = disk.path().join("filler");
    let size = disk.free().saturating_sub(leave);
    std::fs::write(&path, vec![0u8; usize::try_from(size).unwrap()]).unwrap();
    path
}

fn assign(task: u64, spec: TaskSpec) -> HeadMessage {
    HeadMessage::Assign(Assignment {
        task_id: TaskId(task),
        attempt: 1,
        spec,
        allocation: ResourceSet::new(),
        task_token: format!("escher-task-{task}"),
        objects: Vec::new(),
    })
}

/// `sh -c script` as a task of `namespace`.
fn of(namespace: &str, script: &str) -> TaskSpec {
    let mut spec = sh(script);
    spec.labels = format!("escher.namespace={namespace}").parse().unwrap();
    spec
}

/// A root worker of 2 CPUs and 1 GiB whose logs and tasks' directories are on `disk`.
fn on(disk: &Disk, head: &FakeHead) -> escher_worker::WorkerBuilder {
    worker(head)
        .resources("cpu=2,memory=1024".parse().unwrap())
        .log_dir(disk.path().join("logs"))
        .task_dir(disk.path())
        .task_log_bytes(256 * 1024)
}

/// Assigns every task at once and returns their reports once all have finished.
async fn run_all(head: &mut FakeHead, tasks: Vec<(u64, TaskSpec)>) -> BTreeMap<u64, TaskFinished> {
    let count = tasks.len();
    head.send_batch(
        tasks
            .into_iter()
            .map(|(id, spec)| assign(id, spec))
            .collect(),
    );
    let mut done = BTreeMap::new();
    while done.len() < count {
        if let WorkerMessage::TaskFinished(f) = head.report().await {
            done.insert(f.task_id.0, f);
        }
    }
    done
}

fn stdout(done: &TaskFinished) -> String {
    let tail = done.output.as_ref().expect("a command reports its output");
    String::from_utf8_lossy(&tail.stdout).into_owned()
}

/// A task of namespace `a` floods its log and then its home until a write fails; a task of
/// namespace `b`, started beside it, writes 4 MiB into its own home afterwards and succeeds.
/// The flood filled its own 8 MiB scratch (not the 48 MiB disk that holds the logs and the
/// homes), failed with the reason, and its scratch is emptied once it ended; none is mounted
/// once the worker has stopped.
#[tokio::test]
async fn needs_root_a_flood_fills_its_own_scratch_and_the_neighbour_succeeds() {
    let disk = Disk::mount(48 << 20);
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(
        on(&disk, &head)
            .task_scratch(Some(8 << 20))
            .disk_reserve(Reserve::Bytes(0)),
    );
    let (registration, _) = attached(&mut head).await;
    assert_eq!(
        registration.labels.get(escher_worker::exec::DISK_LABEL),
        Some("reserve+scratch")
    );
    assert_eq!(
        registration
            .labels
            .get(escher_worker::exec::DISK_SCRATCH_LABEL),
        Some("8388608")
    );
    let flood = r#"head -c 16777216 /dev/zero | tr '\0' a
dd if=/dev/zero of="$TMPDIR/t" bs=1M count=4 2>/dev/null
dd if=/dev/zero of="$HOME/fill" bs=1M count=64 2>/dev/null || exit 3"#;
    let neighbour = r#"sleep 1
dd if=/dev/zero of="$HOME/mine" bs=1M count=4 2>/dev/null || exit 4
[ "$TMPDIR" = "$HOME" ] && [ "$PWD" = "$HOME" ] || exit 9
echo ok"#;
    let done = run_all(
        &mut head,
        vec![(1, of("a", flood)), (2, of("b", neighbour))],
    )
    .await;
    assert_eq!(
        done[&2].outcome,
        Ok(TaskResult::Exited { code: 0 }),
        "{:?}",
        done[&2]
    );
    assert_eq!(stdout(&done[&2]), "ok\n");
    let why = done[&1].outcome.clone().unwrap_err();
    assert!(
        why.starts_with("filled its scratch of 8 MiB") && why.ends_with("(exit code 3)"),
        "{why}"
    );
    // Its log stopped at the cap, on the disk.
    let tail = done[&1].output.as_ref().unwrap();
    assert!(tail.stdout_len < 300 * 1024, "{}", tail.stdout_len);
    // The scratch directories are emptied with their tasks (just after their ends are
    // reported; each kept, empty, for its user's next task), and what they wrote is gone.
    let emptied = |mount: &String| {
        let mount = Path::new(mount);
        std::fs::read_dir(mount).is_ok_and(|mut d| d.next().is_none())
            && escher_worker::exec::space_of(mount).is_ok_and(|s| s.free == s.size)
    };
    bounded("the scratch directories to be emptied", async {
        while !disk.mounts_below().iter().all(emptied) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(disk.free() > 40 << 20, "{} bytes free", disk.free());
    w.stop().await.unwrap();
    assert_eq!(
        disk.mounts_below(),
        Vec::<String>::new(),
        "mounted after the worker"
    );
}

/// A task asking for `disk=2` gets a scratch of 2 MiB, not the default.
#[tokio::test]
async fn needs_root_a_disk_request_sizes_the_scratch() {
    let disk = Disk::mount(16 << 20);
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(on(&disk, &head).disk_reserve(Reserve::Bytes(0)));
    attached(&mut head).await;
    let mut spec = of("a", r#"df -k "$HOME" | awk 'NR==2 {print $2}'"#);
    spec.resources = "disk=2".parse().unwrap();
    let done = run_all(&mut head, vec![(1, spec)]).await;
    assert_eq!(stdout(&done[&1]), "2048\n", "{:?}", done[&1]);
    w.stop().await.unwrap();
}

/// The next heartbeat's figure `name`.
async fn next_figure(head: &mut FakeHead, name: &str) -> f64 {
    loop {
        if let (_, WorkerMessage::Heartbeat { metrics, .. }) = head.message().await
            && let Some(m) = metrics.iter().find(|m| m.name == name)
        {
            return m.value;
        }
    }
}

/// With less free than its reserve on the disk of its logs, a node starts nothing and says so
/// in its heartbeats; once space returns, the task that waited runs.
#[tokio::test]
async fn needs_root_a_node_under_its_disk_reserve_starts_nothing_until_space_returns() {
    let disk = Disk::mount(16 << 20);
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(on(&disk, &head).disk_reserve(Reserve::Bytes(4 << 20)));
    attached(&mut head).await;
    assert_eq!(next_figure(&mut head, "disk_under_reserve").await, 0.0);
    let filler = fill_to(&disk, 2 << 20);
    // The node's view of its disk is at most `CHECK_EVERY` old: once a heartbeat says it is
    // under its reserve, an assignment finds it so.
    bounded("the node to say it is under its reserve", async {
        while next_figure(&mut head, "disk_under_reserve").await != 1.0 {}
    })
    .await;
    head.send(assign(1, of("a", "echo ok")));
    let early = head.quiet_for(Duration::from_millis(1500)).await;
    assert!(
        early.is_none(),
        "a task started under the reserve: {early:?}"
    );
    assert_eq!(next_figure(&mut head, "disk_under_reserve").await, 1.0);
    std::fs::remove_file(filler).unwrap();
    let done = bounded("the task to run once space returned", async {
        loop {
            if let WorkerMessage::TaskFinished(f) = head.report().await {
                return f;
            }
        }
    })
    .await;
    assert_eq!(done.outcome, Ok(TaskResult::Exited { code: 0 }), "{done:?}");
    assert_eq!(stdout(&done), "ok\n");
    w.stop().await.unwrap();
}

/// A running task's log stops where it is once the disk goes under the reserve: what it writes
/// after is dropped, with one line that says why.
#[tokio::test]
async fn needs_root_a_running_tasks_log_stops_under_the_reserve() {
    let disk = Disk::mount(16 << 20);
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(on(&disk, &head).disk_reserve(Reserve::Bytes(4 << 20)));
    attached(&mut head).await;
    let script = r#"echo start; sleep 1.5; head -c 1048576 /dev/zero | tr '\0' a; sleep 0.3"#;
    head.send(assign(1, of("a", script)));
    match head.report().await {
        WorkerMessage::TaskStarted { .. } => {}
        other => panic!("{other:?}"),
    }
    let filler = fill_to(&disk, 3 << 20);
    let done = bounded("the task's end", async {
        loop {
            if let WorkerMessage::TaskFinished(f) = head.report().await {
                return f;
            }
        }
    })
    .await;
    std::fs::remove_file(filler).unwrap();
    let out = stdout(&done);
    assert!(
        out.starts_with(
            "start\n\n[escher: output past 6 bytes dropped: the node's disk is under its reserve"
        ) && out.ends_with("the worker stopped its logs]\n"),
        "{out:?}"
    );
    w.stop().await.unwrap();
}
