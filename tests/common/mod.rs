//! Shared helpers of the end-to-end tests: a [`LocalCluster`] with a standard set of
//! functions, bounded waits, and tracing when `RUST_LOG` is set.
//!
//! Every await in a test goes through [`within`] (or [`eventually`]), so a bug makes the test
//! fail with a message instead of hanging the suite. Bounds are generous (tests share a small
//! machine with other test binaries); tests assert behaviours, never speed.
//!
//! Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use escher::types::{
    Capacity, CapacityOp, ClusterStatus, NodeId, ResourceName, ResourceStatus, TaskState,
    TaskStatus,
};
use escher::{Client, Functions, LocalCluster, LocalClusterBuilder};

/// The bound on any single wait in a test.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The functions every test cluster registers:
///
/// | name        | argument | returns                                                  |
/// |-------------|----------|----------------------------------------------------------|
/// | `noop`      | `()`     | `()`                                                     |
/// | `echo`      | bytes    | its argument bytes (raw)                                 |
/// | `len`       | bytes    | the number of argument bytes, as a `u64`                 |
/// | `nap`       | `u64` ms | sleeps that long, then its node id                       |
/// | `fail`      | `String` | `Err` with that message                                  |
/// | `panic`     | `String` | panics with that message                                 |
/// | `mark_here` | `String` | creates that resource, unbounded, on its node; node id   |
/// | `where`     | `()`     | its node id                                              |
/// | `big`       | `u64` n  | a `Vec<u8>` of n bytes                                   |
pub fn functions() -> Functions {
    Functions::new()
        .typed_function("noop", |_ctx, ()| async move { Ok::<_, String>(()) })
        .function("echo", |_ctx, args| async move { Ok(args) })
        .function("len", |_ctx, args: Vec<u8>| async move {
            escher::codec::encode(&(args.len() as u64)).map_err(|e| e.to_string())
        })
        .typed_function("nap", |ctx, ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, String>(ctx.node_id().0)
        })
        .typed_function(
            "fail",
            |_ctx, why: String| async move { Err::<(), String>(why) },
        )
        .typed_function("panic", |_ctx, why: String| async move {
            if !why.is_empty() {
                panic!("{why}");
            }
            Ok::<_, String>(())
        })
        .typed_function("mark_here", |ctx, name: String| async move {
            let name = ResourceName::new(&name).map_err(|e| e.to_string())?;
            ctx.set_resource(name, CapacityOp::Set(Capacity::Unbounded))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(ctx.node_id().0)
        })
        .typed_function("object_args", |ctx, ()| async move {
            // Each object argument as (id, length, CRC-32C of the bytes read), and this node.
            let seen: Vec<(String, u64, u32, u64)> = ctx
                .object_args()
                .iter()
                .map(|o| {
                    let bytes = o.as_slice();
                    let crc = crc32c::crc32c(bytes);
                    (o.id().to_string(), bytes.len() as u64, crc, ctx.node_id().0)
                })
                .collect();
            Ok::<_, String>(seen)
        })
        .typed_function("where", |ctx, ()| async move {
            Ok::<_, String>(ctx.node_id().0)
        })
        .typed_function("big", |_ctx, n: u64| async move {
            Ok::<_, String>(vec![7u8; n as usize])
        })
}

/// A cluster builder with [`functions`] registered and a short cancel grace; add workers
/// and head settings, then `start`.
pub fn cluster() -> LocalClusterBuilder {
    init_tracing();
    LocalCluster::builder()
        .functions(functions())
        .grace(Duration::from_secs(2))
}

/// Starts a cluster of `workers` default workers (4 CPUs each) and connects a client.
pub async fn start(workers: usize) -> (LocalCluster, Client) {
    let cluster = within("starting the cluster", cluster().workers(workers).start())
        .await
        .expect("the local cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("the client connects");
    (cluster, client)
}

/// Awaits `f`, failing the test if it takes longer than [`LIMIT`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    within_for(LIMIT, what, f).await
}

/// Awaits `f`, failing the test if it takes longer than `limit`.
pub async fn within_for<F: Future>(limit: Duration, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(limit, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Polls `check` every 20 ms until it returns `Some`, failing the test after [`LIMIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within(what, poll).await
}

/// Waits (bounded) until `task` is finished and returns its status.
pub async fn finished(client: &Client, task: impl Into<escher::types::TaskId>) -> TaskStatus {
    let id = task.into();
    within(&format!("task {id}"), client.get(id, None))
        .await
        .unwrap_or_else(|e| panic!("get task {id}: {e}"))
}

/// Waits (bounded) until `task` is running and returns its status.
pub async fn running(client: &Client, task: impl Into<escher::types::TaskId>) -> TaskStatus {
    let id = task.into();
    eventually(&format!("task {id} running"), || async {
        let info = client.task_info(id).await.expect("task_info");
        assert!(
            !info.status.state.is_terminal(),
            "task {id} ended while waiting for it to run: {:?}",
            info.status
        );
        (info.status.state == TaskState::Running).then_some(info.status)
    })
    .await
}

/// The cluster status (bounded).
pub async fn status(client: &Client) -> ClusterStatus {
    within("cluster_status", client.cluster_status())
        .await
        .expect("cluster_status")
}

/// The status of resource `name` on `node`, if it has it.
pub fn resource(status: &ClusterStatus, node: NodeId, name: &str) -> Option<ResourceStatus> {
    status
        .node(node)
        .unwrap_or_else(|| panic!("node {node} missing from {status:?}"))
        .resource(name)
        .cloned()
}

/// A finite capacity of `units` whole units.
pub fn units(units: u64) -> Capacity {
    Capacity::Finite(escher::types::Amount::units(units).expect("a valid amount"))
}

/// The `escher` CLI binary that `cargo test --workspace` builds next to the test binaries
/// (`target/debug/deps/<test>` → `target/debug/escher`).
pub fn escher_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lies in <target>/<profile>/deps");
    let bin = dir.join("escher");
    assert!(
        bin.is_file(),
        "the escher CLI is not built at {}; run `cargo build --workspace` (or `cargo test \
         --workspace`) first",
        bin.display()
    );
    bin
}

/// A command task running `escher sim-work` (the simulated GPU's job) with these flags, time
/// compressed 100x.
pub fn sim_work(flags: &[&str]) -> escher::Task {
    let escher = escher_bin().display().to_string();
    let argv = [escher.as_str(), "sim-work", "--scale", "0.01"]
        .into_iter()
        .chain(flags.iter().copied())
        .map(str::to_string)
        .collect::<Vec<_>>();
    escher::Task::command(argv)
}

/// Installs a tracing subscriber for the test output once, if `RUST_LOG` is set.
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
    });
}

/// A loopback address no one listens on now (for a server the test starts next).
pub fn free_addr() -> std::net::SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().unwrap()
}

/// Submits a command task that hands its own credential (`ESCHER_TASK_TOKEN`) to the test and
/// then sleeps for a minute; waits until it runs and returns it with the credential. The
/// directory the credential passed through is returned too: keep it until the test ends.
pub async fn task_with_its_credential(
    client: &Client,
) -> (escher::TaskRef, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("token");
    // Written whole (through a rename), so the test never reads half of it.
    let script = format!(
        r#"printf %s "$ESCHER_TASK_TOKEN" > {0}.tmp && mv {0}.tmp {0} && sleep 60"#,
        file.display()
    );
    let task = within(
        "submitting",
        client.submit(escher::Task::command(["sh", "-c", &script])),
    )
    .await
    .expect("the task is submitted");
    running(client, &task).await;
    let credential = eventually("the task's credential", || async {
        std::fs::read_to_string(&file).ok()
    })
    .await;
    (task, credential, dir)
}
