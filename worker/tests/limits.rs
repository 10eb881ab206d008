//! Command tasks held to their requests, against real processes on a root worker (CI runs as
//! root): a CPU hog asking `cpu=0.1` measured against its quota by its cgroup's own counter, a
//! task forking without end held to its process limit, a memory hog failed with "exceeded its
//! memory request" while a neighbour succeeds, a log flood stopped at the cap with one marker
//! line, and `no_new_privs` on every task.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use escher_proto::types::{Assignment, HeadMessage, TaskFinished, WorkerMessage};
use escher_proto::{ResourceSet, TaskId, TaskResult, TaskSpec};
use support::{FakeHead, RunningWorker, attached, sh, worker};

const HEARTBEAT: Duration = Duration::from_millis(200);

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

/// `sh -c script`, asking for `resources`.
fn asking(resources: &str, script: &str) -> TaskSpec {
    let mut spec = sh(script);
    spec.resources = resources.parse().unwrap();
    spec
}

/// A root worker on a node of 2 CPUs and 1 GiB, whose tasks may have 64 processes each.
fn limited(head: &FakeHead) -> escher_worker::WorkerBuilder {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests hold tasks in cgroups: run them as root (CI does)"
    );
    worker(head)
        .resources("cpu=2,memory=1024".parse().unwrap())
        .task_pids_max(64)
        .require_limits(true)
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
        match head.report().await {
            WorkerMessage::TaskStarted { .. } | WorkerMessage::Heartbeat { .. } => {}
            WorkerMessage::TaskFinished(f) => {
                done.insert(f.task_id.0, f);
            }
            _ => {}
        }
    }
    done
}

fn stdout(done: &TaskFinished) -> String {
    let tail = done.output.as_ref().expect("a command reports its output");
    String::from_utf8_lossy(&tail.stdout).into_owned()
}

/// Where the unified (cgroup v2) hierarchy is mounted.
fn unified_mount() -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            (rest.split_whitespace().next()? == "cgroup2")
                .then(|| fields.split_whitespace().nth(4).map(str::to_string))?
        })
        .expect("a cgroup v2 hierarchy is mounted")
}

#[tokio::test]
async fn needs_root_the_node_says_which_limits_it_holds() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    let (registration, _) = attached(&mut head).await;
    assert_eq!(
        registration.labels.get(escher_worker::exec::LIMITS_LABEL),
        Some("cpu+memory+pids")
    );
    assert_eq!(
        registration
            .labels
            .get(escher_worker::exec::LIMITS_MISSING_LABEL),
        None
    );
    w.stop().await.unwrap();
}

/// Where the cgroup v1 hierarchy of `controller` is mounted.
fn v1_mount(controller: &str) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let mut rest = rest.split_whitespace();
            let (fstype, options) = (rest.next()?, rest.nth(1)?);
            (fstype == "cgroup" && options.split(',').any(|o| o == controller))
                .then(|| fields.split_whitespace().nth(4).map(str::to_string))?
        })
        .unwrap_or_else(|| panic!("a cgroup v1 {controller} hierarchy is mounted"))
}

/// Each task's limits are written for it (on this host, into its v1 `cpu`, `memory` and
/// `pids` cgroups), and a cgroup a task leaves behind forgets that task's: the next task in it
/// has no CPU quota, the node's memory and the worker's process limit (and a task asking what
/// the last one in its cgroup asked for finds them there, unwritten).
#[tokio::test]
async fn needs_root_each_task_gets_its_own_limits_and_none_of_the_last_ones() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let script = format!(
        r#"sleep 0.3
dir() {{ echo "$1$(awk -F: -v c="$2" '{{n=split($2,a,","); for(i=1;i<=n;i++) if(a[i]==c) print $3}}' /proc/$$/cgroup)"; }}
echo $(cat "$(dir {} cpu)/cpu.cfs_quota_us" "$(dir {} memory)/memory.limit_in_bytes" "$(dir {} pids)/pids.max")"#,
        v1_mount("cpu"),
        v1_mount("memory"),
        v1_mount("pids")
    );
    let first = run_all(&mut head, vec![(1, asking("cpu=0.5,memory=100", &script))]).await;
    assert_eq!(stdout(&first[&1]), format!("50000 {} 64\n", 100 << 20));
    let next = run_all(&mut head, vec![(2, sh(&script))]).await;
    assert_eq!(stdout(&next[&2]), format!("-1 {} 64\n", 1u64 << 30));
    // The same request again: its cgroup holds what was written for the one before.
    for task in [3, 4] {
        let again = run_all(&mut head, vec![(task, sh(&script))]).await;
        assert_eq!(stdout(&again[&task]), format!("-1 {} 64\n", 1u64 << 30));
    }
    w.stop().await.unwrap();
}

/// A hog asking for a tenth of a CPU burns for two seconds; its cgroup's own counter
/// (`usage_usec` of its unified cgroup, which counts every process it ran) says how much CPU it
/// got. Without a quota it gets a whole CPU, or near it on a loaded machine.
#[tokio::test]
async fn needs_root_a_cpu_hog_gets_its_quota() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    // The worker moves the task into its cgroups just after it starts: look after that.
    let script = format!(
        r#"sleep 0.5
stat="{}$(sed -n 's/^0:://p' /proc/$$/cgroup)/cpu.stat"
usage() {{ sed -n 's/^usage_usec //p' "$stat"; }}
before=$(usage); t0=$(date +%s%N)
sh -c 'while :; do :; done' & hog=$!
sleep 2
kill $hog; wait $hog
echo "$before $(usage) $t0 $(date +%s%N)""#,
        unified_mount()
    );
    let done = run_all(&mut head, vec![(1, asking("cpu=0.1", &script))]).await;
    let out = stdout(&done[&1]);
    let figures: Vec<f64> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
    let [before, after, t0, t1] = figures[..] else {
        panic!("unexpected output {out:?}");
    };
    let cpus = (after - before) / 1e6 / ((t1 - t0) / 1e9);
    assert!(
        cpus > 0.02 && cpus < 0.3,
        "a task asking for 0.1 CPU used {cpus:.3} CPUs ({out})"
    );
    w.stop().await.unwrap();
}

/// A task that forks without end fills its own process limit (64), not the node: it starts
/// fewer than 64 processes, and a neighbour that starts its own meanwhile succeeds.
#[tokio::test]
async fn needs_root_a_fork_bomb_is_held_to_its_process_limit() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    // The inner shell stops at its first failed fork; the outer one holds the processes.
    let bomb = r#"sh -c 'i=0; while [ $i -lt 300 ]; do sleep 60 & i=$((i+1)); echo $i; done' 2>/dev/null
echo full; sleep 3"#;
    let neighbour = r#"sleep 1; for i in $(seq 100); do sh -c true || exit 1; done; echo ok"#;
    let mut bomb = sh(bomb);
    bomb.timeout = Some(Duration::from_secs(4));
    let done = run_all(&mut head, vec![(1, bomb), (2, sh(neighbour))]).await;
    assert_eq!(
        done[&2].outcome,
        Ok(TaskResult::Exited { code: 0 }),
        "{:?}",
        done[&2]
    );
    assert_eq!(stdout(&done[&2]), "ok\n");
    let out = stdout(&done[&1]);
    let started: usize = out.lines().filter(|l| l.parse::<u32>().is_ok()).count();
    assert!(
        (50..64).contains(&started) && out.ends_with("full\n"),
        "the bomb started {started} processes: {out}"
    );
    w.stop().await.unwrap();
}

/// A task asking for 64 MiB that fills 256 MiB is failed by the kernel's OOM killer in its
/// memory cgroup, with the reason; a neighbour filling 16 MiB succeeds beside it.
#[tokio::test]
async fn needs_root_a_memory_hog_exceeds_its_request_and_says_so() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let fill = |mib: u32| format!("dd if=/dev/zero of=/dev/null bs={mib}M count=1 2>/dev/null");
    let done = run_all(
        &mut head,
        vec![
            (1, asking("memory=64", &fill(256))),
            (2, sh(&format!("{} && echo ok", fill(16)))),
        ],
    )
    .await;
    let why = done[&1].outcome.clone().unwrap_err();
    assert!(
        why.starts_with("exceeded its memory request of 64 MiB: the kernel's out-of-memory killer"),
        "{why}"
    );
    assert_eq!(done[&2].outcome, Ok(TaskResult::Exited { code: 0 }));
    assert_eq!(stdout(&done[&2]), "ok\n");
    w.stop().await.unwrap();
}

/// A task writing 32 MiB to stdout keeps the first 256 KiB of it and one line saying the rest
/// was dropped; its neighbour's output is whole.
#[tokio::test]
async fn needs_root_a_log_flood_stops_at_the_cap() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let cap = 256 * 1024;
    let w = RunningWorker::start(limited(&head).task_log_bytes(cap));
    attached(&mut head).await;
    let flood = "head -c 33554432 /dev/zero | tr '\\0' a; echo done >&2";
    let done = run_all(&mut head, vec![(1, sh(flood)), (2, sh("echo ok"))]).await;
    assert_eq!(done[&1].outcome, Ok(TaskResult::Exited { code: 0 }));
    let tail = done[&1].output.as_ref().unwrap();
    let marker = format!(
        "\n[escher: output past {cap} bytes dropped: the task reached its log cap, the worker's \
         --task-log-bytes]\n"
    );
    assert_eq!(tail.stdout_len, cap + marker.len() as u64);
    let text = String::from_utf8_lossy(&tail.stdout);
    assert!(text.ends_with(&marker), "{text:?}");
    assert_eq!(text.matches("[escher: output past").count(), 1);
    assert_eq!(tail.stderr, b"done\n");
    assert_eq!(stdout(&done[&2]), "ok\n");
    w.stop().await.unwrap();
}

/// No exec of a task gains privileges: a set-uid program runs as the task's user.
#[tokio::test]
async fn needs_root_every_task_runs_with_no_new_privs() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let done = run_all(
        &mut head,
        vec![(1, sh("grep NoNewPrivs /proc/self/status"))],
    )
    .await;
    assert_eq!(stdout(&done[&1]), "NoNewPrivs:\t1\n");
    w.stop().await.unwrap();
}

/// A set-uid program owned by root, which gives root to a user that runs it without
/// `no_new_privs`, runs as the task's user when a task runs it.
#[tokio::test]
async fn needs_root_a_set_uid_program_does_not_give_a_task_root() {
    use std::os::unix::fs::PermissionsExt;
    let mut head = FakeHead::start(HEARTBEAT).await;
    // The program lies in the host's /tmp, which a task sees only without a private /tmp.
    let w = RunningWorker::start(limited(&head).private_tmp(false));
    attached(&mut head).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = dir.path().join("euid");
    std::fs::copy(which::which("id").unwrap(), &program).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // The program does give root to another user that runs it (the file system honours
    // set-uid bits here): what the task gets is down to its no_new_privs.
    let outside = std::process::Command::new("setpriv")
        .args(["--reuid=300999", "--regid=300999", "--clear-groups"])
        .arg(&program)
        .arg("-u")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&outside.stdout),
        "0\n",
        "{outside:?}"
    );
    let done = run_all(
        &mut head,
        vec![(1, sh(&format!("{} -u; id -u", program.display())))],
    )
    .await;
    let out = stdout(&done[&1]);
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 2, "{out:?}");
    assert_eq!(
        ids[0], ids[1],
        "the set-uid program ran as {} for the task's user {}",
        ids[0], ids[1]
    );
    assert_ne!(ids[0], "0", "{out:?}");
    w.stop().await.unwrap();
}
