//! Python tasks and actors held to their requests, as command tasks are (`limits.rs`), against a
//! real interpreter (`python3` with `cloudpickle` from PyPI, which `.ci/run` installs) on a root
//! worker (CI runs as root): a warm interpreter holds the limits of each task it runs in turn, a
//! CPU hog asking `cpu=0.2` measured against its quota by its cgroup's own counter, a memory hog
//! failed with "exceeded its memory request" and the next task running fine, a warm interpreter
//! holding more than the next task's memory limit replaced by a fresh one, a fork bomb held to the
//! process limit while a neighbour starts its processes, and an actor that allocates past its
//! request ended with that reason; and a worker without task cgroups holding Python tasks to
//! nothing, as its node's labels say.
//!
//! The envelopes are made here as the Python package makes them (`worker/src/python/mod.rs`
//! and `actor.rs` describe the formats).

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use escher_proto::types::{
    ActorSpec, Assignment, HeadMessage, Lifetime, TaskFinished, WorkerMessage,
};
use escher_proto::{ResourceSet, TaskId, TaskKind, TaskResult, TaskSpec};
use sha2::{Digest as _, Sha256};
use support::{FakeHead, RunningWorker, attached, sh, spec, worker};

const HEARTBEAT: Duration = Duration::from_millis(200);

/// The functions and the actor class the tests run, made by the interpreter the worker runs:
/// the driver's versions, then each pickle in hex, one a line.
const MAKE: &str = r#"
import pickle, sys, cloudpickle

def _cgroup_dirs():
    # Each controller's cgroup directory ("unified" for the cgroup v2 one).
    mounts = {}
    for line in open("/proc/self/mountinfo"):
        left, right = line.split(" - ", 1)
        fstype, _, options = right.split()[:3]
        mount = left.split()[4]
        if fstype == "cgroup2":
            mounts["unified"] = mount
        elif fstype == "cgroup":
            for option in options.split(","):
                mounts[option] = mount
    dirs = {}
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        for c in controllers.split(",") if controllers else ["unified"]:
            if c in mounts:
                dirs[c] = mounts[c] + path
    return dirs

def _limit(controller, v2_file, v1_file):
    # Where the unified cgroup has the controller's file, it holds the limit; else the
    # controller's v1 cgroup does. "max" for none.
    import os
    dirs = _cgroup_dirs()
    v2 = os.path.join(dirs["unified"], v2_file)
    path = v2 if os.path.exists(v2) else os.path.join(dirs[controller], v1_file)
    value = open(path).read().split()[0]
    if value in ("max", "-1") or (value.isdigit() and int(value) >= 1 << 62):
        return "max"
    return value

def limits():
    import os
    print(os.getpid(), _limit("cpu", "cpu.max", "cpu.cfs_quota_us"),
          _limit("memory", "memory.max", "memory.limit_in_bytes"),
          _limit("pids", "pids.max", "pids.max"))

def hog(seconds):
    import os, time
    stat = os.path.join(_cgroup_dirs()["unified"], "cpu.stat")
    def usage():
        for line in open(stat):
            if line.startswith("usage_usec "):
                return int(line.split()[1])
    before, t0 = usage(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass
    print(before, usage(), t0, time.monotonic())

def alloc(mib):
    filled = b"x" * (mib << 20)
    print(len(filled) >> 20)

def keep(mib):
    import builtins, os
    builtins._kept_by_a_test = b"x" * (mib << 20)
    print(os.getpid())

def bomb(hold):
    import os, signal, time
    children, error = [], None
    try:
        while len(children) < 300:
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    except OSError as e:
        error = e.errno
    time.sleep(hold)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)
    print(len(children), error)

class Grower:
    def __init__(self, mib):
        import threading, time
        def grow():
            time.sleep(0.5)
            self.held = b"x" * (mib << 20)
        threading.Thread(target=grow, daemon=True).start()

print(sys.version.split()[0], cloudpickle.__version__)
for f in (limits, hog, alloc, keep, bomb, Grower):
    print(cloudpickle.dumps(f).hex())
"#;

/// The driver's versions, and each function (and the actor class) by name.
struct Pickles {
    versions: String,
    by_name: BTreeMap<&'static str, Vec<u8>>,
}

fn pickles() -> Pickles {
    let out = Command::new("python3")
        .args(["-c", MAKE])
        .output()
        .expect("python3 runs (with cloudpickle from PyPI: `python3 -m pip install cloudpickle`; CI installs it)");
    assert!(
        out.status.success(),
        "making the pickles failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let versions = lines.next().expect("the versions").to_string();
    let names = ["limits", "hog", "alloc", "keep", "bomb", "Grower"];
    let by_name = names
        .into_iter()
        .map(|name| (name, unhex(lines.next().expect("a line per pickle"))))
        .collect();
    Pickles { versions, by_name }
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The pickled arguments of a call: `(spec, kwargs)`, each argument a value (`("v", x)`).
fn args(values: &[u32]) -> Vec<u8> {
    let list = values
        .iter()
        .map(|v| format!("('v', {v})"))
        .collect::<Vec<_>>()
        .join(", ");
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import pickle, sys; sys.stdout.write(pickle.dumps(([{list}], {{}})).hex())"),
        ])
        .output()
        .expect("python3 runs");
    unhex(std::str::from_utf8(&out.stdout).unwrap())
}

/// A Python task calling `function` (inline) with `arguments`, asking for `resources`.
fn call(p: &Pickles, function: &str, arguments: &[u32], resources: &str) -> TaskSpec {
    let function = &p.by_name[function];
    let mut v = b"ESPY\x02\x01".to_vec();
    v.push(p.versions.len() as u8);
    v.extend_from_slice(p.versions.as_bytes());
    v.extend_from_slice(&Sha256::digest(function));
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(function.len() as u32).to_le_bytes());
    v.extend_from_slice(function);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&args(arguments));
    let mut task = spec(TaskKind::Function {
        name: escher_worker::PYTHON_FUNCTION.to_string(),
        args: Bytes::from(v),
    });
    task.resources = resources.parse().unwrap();
    task
}

/// A Python actor of class `class` constructed with `arguments`, asking for `resources`.
fn actor(p: &Pickles, class: &str, arguments: &[u32], resources: &str) -> TaskSpec {
    let class = &p.by_name[class];
    let mut v = b"ESPY\x02\x03".to_vec();
    v.push(p.versions.len() as u8);
    v.extend_from_slice(p.versions.as_bytes());
    v.extend_from_slice(&Sha256::digest(class));
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(class.len() as u32).to_le_bytes());
    v.extend_from_slice(class);
    // The constructor's (args, kwargs), values themselves.
    let list = arguments
        .iter()
        .map(|a| format!("{a},"))
        .collect::<String>();
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import pickle, sys; sys.stdout.write(pickle.dumps((({list}), {{}})).hex())"),
        ])
        .output()
        .expect("python3 runs");
    v.extend_from_slice(&unhex(std::str::from_utf8(&out.stdout).unwrap()));
    let mut task = spec(TaskKind::Actor(Box::new(ActorSpec {
        class: escher_worker::PYTHON_ACTOR_CLASS.to_string(),
        args: Bytes::from(v),
        max_concurrency: 1,
        max_task_retries: 0,
        name: None,
        lifetime: Lifetime::Owned,
    })));
    task.resources = resources.parse().unwrap();
    task
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

/// A root worker with Python, on a node of 2 CPUs and 1 GiB, whose tasks may have 64
/// processes each. Its tasks run as the worker's user: the limits are the cgroups', whoever
/// runs in them, and the `python3` with `cloudpickle` a machine has may be readable by root
/// alone (pyenv's, under `/root`), which a task user could not run.
fn limited(head: &FakeHead) -> escher_worker::WorkerBuilder {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests hold tasks in cgroups: run them as root (CI does)"
    );
    worker(head)
        .resources("cpu=2,memory=1024".parse().unwrap())
        .task_pids_max(64)
        .require_limits(true)
        .python(escher_worker::PythonDetection::Detect)
        .task_users(escher_worker::exec::TaskUsers::Off)
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

/// Runs one task to its end.
async fn run(head: &mut FakeHead, id: u64, spec: TaskSpec) -> TaskFinished {
    run_all(head, vec![(id, spec)]).await.remove(&id).unwrap()
}

/// What a task printed, once it succeeded.
fn printed(done: &TaskFinished) -> String {
    assert!(
        matches!(
            done.outcome,
            Ok(TaskResult::Returned(_)) | Ok(TaskResult::Exited { code: 0 })
        ),
        "task {} failed: {:?}",
        done.task_id.0,
        done.outcome
    );
    let tail = done.output.as_ref().expect("a task reports its output");
    String::from_utf8_lossy(&tail.stdout).into_owned()
}

/// `pid cpu memory pids` as `limits()` prints them.
fn limits_of(done: &TaskFinished) -> (u32, String) {
    let out = printed(done);
    let (pid, rest) = out.trim().split_once(' ').expect("pid and limits");
    (pid.parse().unwrap(), rest.to_string())
}

/// One warm interpreter runs three tasks with three requests: each finds its own limits in
/// the interpreter's cgroups, none of the last one's (a quota of 0.5 CPU and 200 MiB; then no
/// quota and what the node has, 1 GiB; then 0.25 CPU and 100 MiB), with the worker's process
/// limit each time.
#[tokio::test]
async fn needs_root_a_warm_interpreter_holds_each_python_tasks_own_limits() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let first = run(&mut head, 1, call(&p, "limits", &[], "cpu=0.5,memory=200")).await;
    let (pid, held) = limits_of(&first);
    assert_eq!(held, format!("50000 {} 64", 200 << 20));
    let next = run(&mut head, 2, call(&p, "limits", &[], "")).await;
    assert_eq!(limits_of(&next), (pid, format!("max {} 64", 1u64 << 30)));
    let last = run(&mut head, 3, call(&p, "limits", &[], "cpu=0.25,memory=100")).await;
    assert_eq!(limits_of(&last), (pid, format!("25000 {} 64", 100 << 20)));
    w.stop().await.unwrap();
}

/// A Python function asking for a fifth of a CPU spins for two seconds; its cgroup's own
/// counter (`usage_usec` of its unified cgroup) says how much CPU it got. Without a quota it
/// gets a whole CPU, or near it on a loaded machine.
#[tokio::test]
async fn needs_root_a_python_cpu_hog_gets_its_quota() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let done = run(&mut head, 1, call(&p, "hog", &[2], "cpu=0.2")).await;
    let out = printed(&done);
    let figures: Vec<f64> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
    let [before, after, t0, t1] = figures[..] else {
        panic!("unexpected output {out:?}");
    };
    let cpus = (after - before) / 1e6 / (t1 - t0);
    eprintln!("a Python task asking for 0.2 CPU used {cpus:.3} CPUs ({out})");
    assert!(
        cpus > 0.05 && cpus < 0.35,
        "a Python task asking for 0.2 CPU used {cpus:.3} CPUs ({out})"
    );
    w.stop().await.unwrap();
}

/// A Python task asking for 64 MiB that fills 256 MiB is failed by the kernel's OOM killer in
/// its interpreter's memory cgroup, with the reason a command gets; the next Python task, in a
/// fresh interpreter, fills 16 MiB and succeeds.
#[tokio::test]
async fn needs_root_a_python_memory_hog_exceeds_its_request_and_the_next_task_runs() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let hog = run(&mut head, 1, call(&p, "alloc", &[256], "memory=64")).await;
    let why = hog.outcome.clone().unwrap_err();
    eprintln!("the Python memory hog failed: {why}");
    assert!(
        why.starts_with(
            "exceeded its memory request of 64 MiB: the kernel's out-of-memory killer ended it \
             in its cgroup (its Python interpreter, pid "
        ) && why.contains("killed by SIGKILL"),
        "{why}"
    );
    let next = run(&mut head, 2, call(&p, "alloc", &[16], "memory=128")).await;
    assert_eq!(printed(&next), "16\n");
    w.stop().await.unwrap();
}

/// A task leaves 300 MiB in its warm interpreter. The next task of the namespace asks for
/// 400 MiB: that interpreter would leave it 100 MiB of its own, so it gets a fresh one. The
/// next fills that one again, and the one after asks for 64 MiB: written over what the
/// interpreter holds, the limit would be refused (cgroup v1) or kill it (v2), so that task
/// gets a fresh interpreter too. Each finds its own memory limit.
#[tokio::test]
async fn needs_root_a_warm_interpreter_holding_more_than_the_next_limit_is_replaced() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let filled = run(&mut head, 1, call(&p, "keep", &[300], "memory=512")).await;
    let filled_pid: u32 = printed(&filled).trim().parse().unwrap();
    let roomy = run(&mut head, 2, call(&p, "limits", &[], "memory=400")).await;
    let (pid, held) = limits_of(&roomy);
    assert_ne!(
        pid, filled_pid,
        "the interpreter holding 300 MiB took a 400 MiB task"
    );
    assert_eq!(held, format!("max {} 64", 400 << 20));
    // The fresh one, little as it holds, takes the next task, and is filled.
    let refilled = run(&mut head, 3, call(&p, "keep", &[300], "memory=512")).await;
    assert_eq!(printed(&refilled).trim().parse::<u32>().unwrap(), pid);
    let small = run(&mut head, 4, call(&p, "limits", &[], "memory=64")).await;
    let (small_pid, held) = limits_of(&small);
    assert!(
        small_pid != pid && small_pid != filled_pid,
        "an interpreter holding 300 MiB took a 64 MiB task"
    );
    assert_eq!(held, format!("max {} 64", 64 << 20));
    w.stop().await.unwrap();
}

/// A Python task that forks without end fills its interpreter's process limit (64, the
/// interpreter's own threads among them), not the node: it starts fewer than 64 processes
/// and fails a fork with EAGAIN, while a command task beside it starts 100 processes.
#[tokio::test]
async fn needs_root_a_python_fork_bomb_is_held_to_its_process_limit() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    let neighbour = r#"sleep 1; for i in $(seq 100); do sh -c true || exit 1; done; echo ok"#;
    let done = run_all(
        &mut head,
        vec![(1, call(&p, "bomb", &[3], "")), (2, sh(neighbour))],
    )
    .await;
    assert_eq!(printed(&done[&2]), "ok\n");
    let out = printed(&done[&1]);
    let (started, errno) = out.trim().split_once(' ').expect("count and errno");
    let started: u32 = started.parse().unwrap();
    eprintln!("a Python fork bomb held to 64 processes started {started} (errno {errno})");
    assert!(
        (40..64).contains(&started) && errno == (nix::errno::Errno::EAGAIN as i32).to_string(),
        "the bomb started {started} processes and stopped with {errno}"
    );
    w.stop().await.unwrap();
}

/// A Python actor asking for 64 MiB whose object grows to 256 MiB after it is constructed is
/// ended by the kernel's OOM killer, and the actor's task ends with the reason.
#[tokio::test]
async fn needs_root_a_python_actor_past_its_memory_request_dies_saying_so() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(limited(&head));
    attached(&mut head).await;
    // Held to nothing, it would live on: its end is waited for a minute.
    let done = tokio::time::timeout(
        Duration::from_secs(60),
        run(&mut head, 1, actor(&p, "Grower", &[256], "memory=64")),
    )
    .await
    .expect("the actor still lives a minute after it grew past its memory request");
    let why = done.outcome.clone().unwrap_err();
    assert!(
        why.contains(
            "exceeded its memory request of 64 MiB: the kernel's out-of-memory killer ended it \
             in its cgroup (its Python interpreter, pid "
        ),
        "{why}"
    );
    w.stop().await.unwrap();
}

/// A worker without task cgroups (`--no-task-cgroups`) holds its Python tasks to nothing, as
/// it holds its commands, and says so: its node's labels name every limit as missing, and a
/// Python task asking for 64 MiB fills 128 MiB and succeeds.
#[tokio::test]
async fn needs_pypi_a_worker_without_cgroups_says_its_python_tasks_are_held_to_nothing() {
    let p = pickles();
    let mut head = FakeHead::start(HEARTBEAT).await;
    let w = RunningWorker::start(
        worker(&head)
            .resources("cpu=2,memory=1024".parse().unwrap())
            .task_cgroups(false)
            .python(escher_worker::PythonDetection::Detect)
            .task_users(escher_worker::exec::TaskUsers::Off),
    );
    let (registration, _) = attached(&mut head).await;
    assert_eq!(
        registration.labels.get(escher_worker::exec::LIMITS_LABEL),
        Some("none")
    );
    assert_eq!(
        registration
            .labels
            .get(escher_worker::exec::LIMITS_MISSING_LABEL),
        Some("cpu+memory+pids")
    );
    let done = run(&mut head, 1, call(&p, "alloc", &[128], "memory=64")).await;
    assert_eq!(printed(&done), "128\n");
    w.stop().await.unwrap();
}
