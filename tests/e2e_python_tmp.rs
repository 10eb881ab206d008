//! A Python task's `/tmp`, `/var/tmp` and `/dev/shm` are its interpreter's own scratch on a
//! node labelled `escher.tmp=private`, as a command task's are its own (tests/e2e_containment.rs),
//! against real `escher-head` and `escher-worker` processes on a root worker (CI runs as root)
//! and a real interpreter (`python3` on `PATH` with `cloudpickle`, which `.ci/run` installs;
//! hence the `needs_pypi` marker): what a Python function writes there never reaches the
//! host's directories and it does not see what the host keeps there, another namespace's
//! interpreter does not see it either, a large result still goes through the node's object
//! store and is handed to the next task as a mapped file, and `--no-private-tmp` gives Python
//! tasks the host's `/tmp` again.
//!
//! The envelopes are made here as the Python package makes them (format 1, which carries no
//! versions: `worker/src/python/mod.rs` describes it).

mod procs;

use std::process::Command;
use std::time::Duration;

use escher::types::{Grant, LogStream, Role, TaskId, TaskResult, TaskState, TaskStatus};
use escher::{Client, Task};
use escher_proto::types::{ISOLATION_LABEL, TMP_LABEL};
use procs::{ProcessCluster, WorkerExtra};
use sha2::{Digest as _, Sha256};

/// The functions, made by the `python3` the worker runs (the first on `PATH`).
///
/// - `probe(write, marker)` writes "x" to each path of `write`, then prints its `HOME`,
///   `TMPDIR` and working directory, the marker file's text (or `absent`) and what `/tmp`
///   holds;
/// - `big(n)` returns `n` bytes (a result kept in the node's store);
/// - `size(b)` prints and returns the length and SHA-256 of `b`;
/// - the actor class `Prober(write, marker)`, whose constructor calls `probe`.
///
/// The first line is the versions of the interpreter and of cloudpickle (an actor's envelope
/// carries them).
const MAKE: &str = r#"
import cloudpickle

def probe(write, marker):
    import os
    for path in write:
        with open(path, "w") as f:
            f.write("x")
    print("env", os.environ.get("HOME"), os.environ.get("TMPDIR"), os.getcwd())
    try:
        print("marker", open(marker).read().strip())
    except OSError:
        print("marker", "absent")
    print("tmp", " ".join(sorted(os.listdir("/tmp"))))
    return "ok"

def big(n):
    return bytes(range(256)) * (n // 256)

def size(b):
    import hashlib
    print("size", len(b), hashlib.sha256(b).hexdigest())
    return len(b)

class Prober:
    def __init__(self, write, marker):
        probe(write, marker)

import sys
print(sys.version.split()[0], cloudpickle.__version__)
for f in (probe, big, size, Prober):
    print(cloudpickle.dumps(f).hex())
"#;

/// The interpreter the worker runs Python tasks with (`ESCHER_PYTHON`), which also makes the
/// pickles: the first of `python3` on `PATH` and `/usr/bin/python3` that imports cloudpickle
/// and that a task's user can run (every directory above it searchable by others: a `python3`
/// under `/root`, as pyenv's is, is not). `.ci/run` installs Debian's cloudpickle for
/// `/usr/bin/python3` where the one on `PATH` is closed to other users.
fn interpreter() -> &'static str {
    static FOUND: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt as _;
        let open_to_others = |path: &std::path::Path| {
            path.ancestors().skip(1).all(|dir| {
                std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
            }) && std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
        };
        let mut tried = Vec::new();
        for candidate in ["python3", "/usr/bin/python3"] {
            let out = Command::new(candidate)
                .args(["-c", "import sys, cloudpickle; print(sys.executable)"])
                .output();
            let Ok(out) = out
                .as_ref()
                .map_err(|e| tried.push(format!("{candidate}: {e}")))
            else {
                continue;
            };
            let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() {
                tried.push(format!("{candidate}: no cloudpickle"));
            } else if !open_to_others(std::path::Path::new(&exe)) {
                tried.push(format!("{candidate}: {exe} is closed to other users"));
            } else {
                return exe;
            }
        }
        panic!(
            "no python3 with cloudpickle that a task's user can run ({}); `.ci/run` installs \
             Debian's python3-cloudpickle for /usr/bin/python3",
            tried.join("; ")
        )
    })
}

/// A pickled function, and the SHA-256 it is called by.
struct Function {
    bytes: Vec<u8>,
    hash: [u8; 32],
}

fn functions() -> (String, [Function; 4]) {
    let out = Command::new(interpreter())
        .args(["-c", MAKE])
        .output()
        .expect("python3 runs (with cloudpickle from PyPI: `python3 -m pip install cloudpickle`; CI installs it)");
    assert!(
        out.status.success(),
        "making the pickles failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let versions = text.lines().next().unwrap_or_default().to_string();
    let made: Vec<Function> = text
        .lines()
        .skip(1)
        .map(|l| {
            let bytes = hex::decode(l.trim()).expect("hex");
            Function {
                hash: Sha256::digest(&bytes).into(),
                bytes,
            }
        })
        .collect();
    let made = made
        .try_into()
        .unwrap_or_else(|_| panic!("four pickles: {text}"));
    (versions, made)
}

/// Pickled call arguments: `python` is the list of `(kind, value)` pairs, as Python source.
fn arguments(python: &str) -> Vec<u8> {
    let out = Command::new(interpreter())
        .args([
            "-c",
            &format!("import pickle, sys; sys.stdout.write(pickle.dumps(({python}, {{}})).hex())"),
        ])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    hex::decode(out.stdout).expect("hex")
}

/// A call of `function` (inline), whose arguments may name the results of `deps`.
fn call(function: &Function, deps: &[TaskId], args: &[u8]) -> Task {
    let mut v = b"ESPY\x01\x01".to_vec();
    v.extend_from_slice(&function.hash);
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(function.bytes.len() as u32).to_le_bytes());
    v.extend_from_slice(&function.bytes);
    v.extend_from_slice(&(deps.len() as u32).to_le_bytes());
    for dep in deps {
        v.extend_from_slice(&dep.0.to_le_bytes());
    }
    v.extend_from_slice(args);
    let mut task = Task::function(escher::worker::PYTHON_FUNCTION, v)
        .resources_str("cpu=1,memory=256,shared/python=1");
    for &dep in deps {
        task = task.result_arg(dep);
    }
    task
}

/// An actor of class `class` (inline, as `Prober`) in an interpreter of its own, made with
/// the constructor arguments `args` (pickled `(args, kwargs)`, values themselves).
fn actor(versions: &str, class: &Function, args: &[u8]) -> Task {
    let mut v = b"ESPY\x02\x03".to_vec();
    v.push(versions.len() as u8);
    v.extend_from_slice(versions.as_bytes());
    v.extend_from_slice(&class.hash);
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&(class.bytes.len() as u32).to_le_bytes());
    v.extend_from_slice(&class.bytes);
    v.extend_from_slice(args);
    Task::actor(escher::worker::PYTHON_ACTOR_CLASS, v)
        .resources_str("cpu=1,memory=256,shared/python=1")
}

/// `probe` writing `write` and reading `marker`, as Python arguments.
fn probe_args(write: &[String], marker: &str) -> Vec<u8> {
    let list = write
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    arguments(&format!("[('v', [{list}]), ('v', {marker:?})]"))
}

/// A client of `namespace` with an app token for it.
async fn tenant(cluster: &ProcessCluster, admin: &Client, namespace: &str) -> Client {
    let grant = Grant::new(Role::App, Some(namespace.parse().unwrap())).unwrap();
    let token = admin.create_token(grant, namespace).await.unwrap().token;
    cluster.client().await.with_token(token)
}

/// A cluster with one root worker of 4 CPUs and 1 GiB that runs each namespace as its own
/// user and offers Python (`python3` on `PATH`), with `more` arguments; its node's `escher.tmp`
/// label is `tmp`.
async fn cluster(more: &[&str], tmp: &str) -> (ProcessCluster, Client) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (as CI has): interpreters run as their namespace's user, in mount namespaces"
    );
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    cluster.next_workers(WorkerExtra {
        args: ["--require-isolation"]
            .iter()
            .chain(more)
            .map(|a| a.to_string())
            .collect(),
        env: vec![("ESCHER_PYTHON".into(), interpreter().into())],
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=4,memory=1024").await;
    let admin = cluster.client().await;
    let node = admin.cluster_status().await.unwrap().nodes.remove(0);
    assert_eq!(node.labels.get(ISOLATION_LABEL), Some("uid"), "{node:?}");
    assert_eq!(node.labels.get(TMP_LABEL), Some(tmp), "{node:?}");
    assert!(
        node.labels
            .get("escher.python")
            .is_some_and(|v| v.starts_with("3.")),
        "the worker offers no Python (python3 on PATH with cloudpickle, readable by other \
         users): {:?}",
        node.labels
    );
    (cluster, admin)
}

async fn ended(client: &Client, task: TaskId) -> TaskStatus {
    client
        .get(task, Some(Duration::from_secs(120)))
        .await
        .unwrap()
}

/// Submits `task` as `client`, waits for it to succeed, and returns what it printed.
async fn printed(client: &Client, task: Task) -> String {
    let id = client.submit(task).await.unwrap().id();
    let status = ended(client, id).await;
    let out = client.logs(id, LogStream::Stdout).await.unwrap_or_default();
    let err = client.logs(id, LogStream::Stderr).await.unwrap_or_default();
    assert_eq!(
        status.state,
        TaskState::Succeeded,
        "{status:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
    String::from_utf8_lossy(&out).into_owned()
}

/// The words after `key` on the line of `text` that starts with it.
fn line<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key:?} line in {text:?}"))
        .split_whitespace()
        .collect()
}

/// Files the test made, or a task may have made, on the host: removed when dropped.
struct OnHost(Vec<String>);

impl Drop for OnHost {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `text` to the host's `path`, readable by every user.
fn plant(path: &str, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// On an `escher.tmp=private` node, tenant A's Python function writes to `/tmp`, `/var/tmp`
/// and `/dev/shm`: nothing lands in the host's directories, the three are its interpreter's
/// scratch (its `HOME`, `TMPDIR` and working directory, `/tmp` to it), and it does not see
/// the marker the test put in the host's `/tmp`. A's next task, in the same warm interpreter,
/// finds its files (an interpreter's scratch lives as long as it does); tenant B's task, in an
/// interpreter of its own, finds none of them and plants nothing on the host. A 1 MiB result
/// still goes through the node's store: the client reads it, and the next task is handed it
/// as a mapped file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_needs_pypi_a_python_tasks_tmp_is_its_interpreters_scratch_not_the_hosts() {
    let (versions, [probe, big, size, prober]) = functions();
    let (cluster, admin) = cluster(&[], "private").await;
    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;
    let name = format!("escher-e2e-py-tmp-{}", std::process::id());
    let marker = format!("/tmp/{name}.marker");
    let written = [
        format!("/tmp/{name}"),
        format!("/var/tmp/{name}.var"),
        format!("/dev/shm/{name}.shm"),
    ];
    let by_b = format!("/tmp/{name}.b");
    let _on_host = OnHost(
        written
            .iter()
            .chain([&marker, &by_b, &format!("/tmp/{name}.actor")])
            .cloned()
            .collect(),
    );
    plant(&marker, "from the host");

    let out = printed(&a, call(&probe, &[], &probe_args(&written, &marker))).await;
    for path in &written {
        assert!(
            !std::path::Path::new(path).exists(),
            "tenant A's Python task wrote {path} on the host: {out}"
        );
    }
    assert_eq!(line(&out, "env"), ["/tmp", "/tmp", "/tmp"], "{out}");
    assert_eq!(line(&out, "marker"), ["absent"], "{out}");
    // The three directories are one: its scratch.
    let mine = [name.clone(), format!("{name}.shm"), format!("{name}.var")];
    assert_eq!(line(&out, "tmp"), mine, "{out}");

    // The same interpreter, warm, runs A's next task: its scratch is still there.
    let out = printed(&a, call(&probe, &[], &probe_args(&[], &marker))).await;
    assert_eq!(line(&out, "tmp"), mine, "{out}");

    // Another namespace's interpreter: none of A's files, and nothing of B's on the host.
    let out = printed(
        &b,
        call(
            &probe,
            &[],
            &probe_args(std::slice::from_ref(&by_b), &marker),
        ),
    )
    .await;
    assert_eq!(line(&out, "tmp"), [format!("{name}.b")], "{out}");
    assert_eq!(line(&out, "marker"), ["absent"], "{out}");
    assert!(
        !std::path::Path::new(&by_b).exists(),
        "tenant B's Python task wrote {by_b} on the host"
    );

    // An actor of A's: an interpreter of its own, whose /tmp is its own scratch again.
    let by_actor = format!("/tmp/{name}.actor");
    let list = format!("[{by_actor:?}]");
    let made = a
        .submit(actor(
            &versions,
            &prober,
            &arguments(&format!("({list}, {marker:?})")),
        ))
        .await
        .unwrap()
        .id();
    let out = procs::eventually("the actor's constructor to print", procs::WAIT, || async {
        let out = a.logs(made, LogStream::Stdout).await.unwrap_or_default();
        let out = String::from_utf8_lossy(&out).into_owned();
        // Its last line, whole.
        if out
            .split_once("\ntmp ")
            .is_some_and(|(_, rest)| rest.contains('\n'))
        {
            return Some(out);
        }
        let status = a.task_info(made).await.unwrap().status;
        assert!(!status.state.is_terminal(), "the actor: {status:?}");
        None
    })
    .await;
    assert_eq!(line(&out, "tmp"), [format!("{name}.actor")], "{out}");
    assert_eq!(line(&out, "marker"), ["absent"], "{out}");
    assert_eq!(line(&out, "env"), ["/tmp", "/tmp", "/tmp"], "{out}");
    assert!(
        !std::path::Path::new(&by_actor).exists(),
        "tenant A's actor wrote {by_actor} on the host"
    );
    a.cancel([made]).await.unwrap();

    // A result of 1 MiB is an object of the node's store, read by the client from there and
    // handed to the next task as the store's sealed file.
    const N: usize = 1 << 20;
    let made = a
        .submit(call(&big, &[], &arguments(&format!("[('v', {N})]"))))
        .await
        .unwrap()
        .id();
    let status = ended(&a, made).await;
    assert!(
        matches!(status.result, Some(TaskResult::Object { .. })),
        "{status:?}"
    );
    let pickled = a
        .get_bytes(made, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(pickled.len() > N, "{} bytes", pickled.len());
    let expected: Vec<u8> = (0..N).map(|i| i as u8).collect();
    let out = printed(
        &a,
        call(
            &size,
            &[made],
            &arguments(&format!("[('ref', {})]", made.0)),
        ),
    )
    .await;
    assert_eq!(
        line(&out, "size"),
        [N.to_string(), hex::encode(Sha256::digest(&expected))],
        "{out}"
    );
}

/// With `--no-private-tmp`, a Python task shares the host's `/tmp` again (`escher.tmp=host`):
/// it reads the test's marker there and what it writes lands on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_needs_pypi_no_private_tmp_gives_python_tasks_the_hosts_tmp() {
    let (_, [probe, _, _, _]) = functions();
    let (cluster, admin) = cluster(&["--no-private-tmp"], "host").await;
    let a = tenant(&cluster, &admin, "appa").await;
    let name = format!("escher-e2e-py-host-tmp-{}", std::process::id());
    let marker = format!("/tmp/{name}.marker");
    let written = format!("/tmp/{name}");
    let _on_host = OnHost(vec![marker.clone(), written.clone()]);
    plant(&marker, "from-the-host");
    let out = printed(
        &a,
        call(
            &probe,
            &[],
            &probe_args(std::slice::from_ref(&written), &marker),
        ),
    )
    .await;
    assert_eq!(line(&out, "marker"), ["from-the-host"], "{out}");
    assert!(
        std::path::Path::new(&written).exists(),
        "the task's /tmp/{name} is not the host's: {out}"
    );
    assert_ne!(line(&out, "env")[0], "/tmp", "{out}");
}
