//! Python tasks held to their tenant, tried as an attacker would against a real head, a real
//! worker and a real Python interpreter (`python3` with `cloudpickle` from PyPI, which
//! `.ci/run` installs; hence the tests' `needs_pypi` marker): a
//! function planted under another function's SHA-256 is refused before any interpreter
//! loads it (inline, or through a store task), a store task of one namespace is nothing to
//! another's calls, and what a Python function prints is its task's output (`escher logs`),
//! not the worker's.
//!
//! The envelopes are made here as the Python package makes them (`worker/src/python/mod.rs`
//! describes the format), so that a test can put wrong bytes under a hash, which the package
//! never does.

mod common;

use std::process::Command;

use common::{cluster, finished, within};
use escher::types::{Grant, LogStream, Role, TaskResult, TaskState, TaskStatus};
use escher::worker::PythonDetection;
use escher::{Client, Task};
use sha2::{Digest as _, Sha256};

/// The pickles the test needs, made by the interpreter the worker runs: hex, one a line.
const MAKE: &str = r#"
import pickle, sys, cloudpickle

def a():
    return "A"

def b():
    return "B"

def p():
    print("printed-to-stdout")
    print("printed-to-stderr", file=sys.stderr)
    return "P"

values = [cloudpickle.dumps(f) for f in (a, b, p)]
values.append(pickle.dumps(([], {})))
values += [pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for v in ("A", "B", "P")]
print("\n".join(v.hex() for v in values))
"#;

/// Functions `a`, `b`, `p`, the empty arguments, and the pickled results "A", "B", "P".
struct Pickles {
    a: Vec<u8>,
    b: Vec<u8>,
    p: Vec<u8>,
    no_args: Vec<u8>,
    result_a: Vec<u8>,
    result_p: Vec<u8>,
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
    let mut lines = std::str::from_utf8(&out.stdout)
        .unwrap()
        .lines()
        .map(|l| hex::decode(l.trim()).expect("hex"));
    let mut next = || lines.next().expect("a line per pickle");
    let (a, b, p, no_args, result_a, _result_b, result_p) =
        (next(), next(), next(), next(), next(), next(), next());
    Pickles {
        a,
        b,
        p,
        no_args,
        result_a,
        result_p,
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A call of the function `hash` names: `inline` travels with it, else the worker fetches
/// the result of store task `blob`.
fn call(hash: [u8; 32], blob: u64, inline: &[u8], args: &[u8]) -> Task {
    let mut v = b"ESPY\x01\x01".to_vec();
    v.extend_from_slice(&hash);
    v.extend_from_slice(&blob.to_le_bytes());
    v.extend_from_slice(&(inline.len() as u32).to_le_bytes());
    v.extend_from_slice(inline);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(args);
    python_task(v)
}

/// A store task, whose result holds `function` for later calls.
fn store(function: &[u8]) -> Task {
    let mut v = b"ESPY\x01\x02".to_vec();
    v.extend_from_slice(function);
    python_task(v)
}

fn python_task(envelope: Vec<u8>) -> Task {
    Task::function(escher::worker::PYTHON_FUNCTION, envelope).resources_str("shared/python=1")
}

async fn run(client: &Client, task: Task) -> TaskStatus {
    let task = within("submitting", client.submit(task)).await.unwrap();
    finished(client, &task).await
}

fn returned(status: &TaskStatus) -> &[u8] {
    match (&status.state, &status.result) {
        (TaskState::Succeeded, Some(TaskResult::Returned(bytes))) => bytes,
        _ => panic!("the task did not return a value: {status:?}"),
    }
}

fn failed(status: &TaskStatus) -> String {
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    status.reason.clone().unwrap_or_default()
}

async fn app(admin: &Client, namespace: &str) -> Client {
    let grant = Grant::new(Role::App, Some(namespace.parse().unwrap())).unwrap();
    let token = admin.create_token(grant, namespace).await.unwrap().token;
    admin.clone().with_token(&token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_pypi_a_function_planted_under_another_hash_is_refused_and_the_store_is_per_namespace()
 {
    let p = pickles();
    let cluster = within(
        "starting",
        cluster().workers(1).python(PythonDetection::Detect).start(),
    )
    .await
    .unwrap();
    let admin = cluster.client().await.unwrap();
    let (a, other) = (app(&admin, "a").await, app(&admin, "b").await);
    let hash_a = sha256(&p.a);

    // Function b's bytes under a's hash, inline: refused before an interpreter sees them. (Taken,
    // the warm interpreter would keep b under a's hash and run it for the next call of a.)
    let planted = run(&a, call(hash_a, 0, &p.b, &p.no_args)).await;
    let why = failed(&planted);
    assert!(
        why.contains("refused the function") && why.contains("SHA-256"),
        "{why}"
    );
    // The real a, in the same namespace (and so the same warm interpreter), runs a.
    let real = run(&a, call(hash_a, 0, &p.a, &p.no_args)).await;
    assert_eq!(returned(&real), p.result_a);

    // The same through the store: a store task that holds b, named as the store of p (which
    // no interpreter of this namespace holds yet, so the worker fetches it).
    let hash_p = sha256(&p.p);
    let store_b = within("submitting", a.submit(store(&p.b))).await.unwrap();
    assert_eq!(returned(&finished(&a, &store_b).await), p.b);
    let planted = run(&a, call(hash_p, store_b.id().0, &[], &p.no_args)).await;
    let why = failed(&planted);
    assert!(
        why.contains(&format!("function stored by task {}", store_b.id().0))
            && why.contains("SHA-256"),
        "{why}"
    );
    let store_p = within("submitting", a.submit(store(&p.p))).await.unwrap();
    finished(&a, &store_p).await;
    let stored = run(&a, call(hash_p, store_p.id().0, &[], &p.no_args)).await;
    assert_eq!(returned(&stored), p.result_p);

    // Another namespace cannot name a's store task: to it, the task does not exist.
    let foreign = run(&other, call(hash_p, store_p.id().0, &[], &p.no_args)).await;
    let why = failed(&foreign);
    assert!(why.contains("cannot fetch the function"), "{why}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_pypi_what_a_python_function_prints_is_its_tasks_output() {
    let p = pickles();
    let cluster = within(
        "starting",
        cluster().workers(1).python(PythonDetection::Detect).start(),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let printing = within(
        "submitting",
        client.submit(call(sha256(&p.p), 0, &p.p, &p.no_args)),
    )
    .await
    .unwrap();
    assert_eq!(returned(&finished(&client, &printing).await), p.result_p);
    let stdout = client.logs(&printing, LogStream::Stdout).await.unwrap();
    let stderr = client.logs(&printing, LogStream::Stderr).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&stdout), "printed-to-stdout\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "printed-to-stderr\n");

    // The next task of the same warm interpreter has its own (empty) output.
    let quiet = within(
        "submitting",
        client.submit(call(sha256(&p.a), 0, &p.a, &p.no_args)),
    )
    .await
    .unwrap();
    assert_eq!(returned(&finished(&client, &quiet).await), p.result_a);
    for stream in [LogStream::Stdout, LogStream::Stderr] {
        let log = client.logs(&quiet, stream).await.unwrap();
        assert!(
            log.is_empty(),
            "{stream:?}: {}",
            String::from_utf8_lossy(&log)
        );
    }
    cluster.shutdown().await;
}
