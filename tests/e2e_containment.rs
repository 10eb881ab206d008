//! Tasks held to their requests across the tenant boundary, against real `escher-head` and
//! `escher-worker` processes on a root worker (CI runs as root): one tenant's fork bomb, memory
//! hog and log flood, each beside another tenant's task that must succeed on the same node.
//!
//! The worker runs each namespace's tasks as a user of its own, in a cgroup per task that
//! holds the task to its `cpu` and `memory` request and to `--task-pids-max` processes. The
//! same attacks within one tenant, with a head of the test's own, are `worker/tests/limits.rs`.
//! A task's `/tmp`, `/var/tmp` and `/dev/shm` are its own scratch by default, which another
//! tenant's task does not see; `--no-private-tmp` gives tasks the host's again.

mod procs;

use std::time::Duration;

use escher::types::{Grant, LogStream, Role, TaskId, TaskState, TaskStatus};
use escher::{Client, Task};
use escher_proto::types::{ISOLATION_LABEL, TMP_LABEL};
use procs::{ProcessCluster, WorkerExtra, eventually};

/// The worker's process limit per task in these tests.
const PIDS_MAX: u32 = 64;
/// The worker's log cap per task in these tests.
const LOG_CAP: u64 = 256 * 1024;

/// A client of `namespace` with an app token for it.
async fn tenant(cluster: &ProcessCluster, admin: &Client, namespace: &str) -> Client {
    let grant = Grant::new(Role::App, Some(namespace.parse().unwrap())).unwrap();
    let token = admin.create_token(grant, namespace).await.unwrap().token;
    cluster.client().await.with_token(token)
}

/// A cluster with one root worker of 4 CPUs and 1 GiB that holds every task to its request,
/// runs each namespace as its own user, caps each task at [`PIDS_MAX`] processes and
/// [`LOG_CAP`] bytes of output, and (by default, no flag) gives each its scratch as its `/tmp`.
async fn contained() -> (ProcessCluster, Client) {
    contained_with(&[]).await
}

/// [`contained`], with more `escher-worker` arguments.
async fn contained_with(more: &[&str]) -> (ProcessCluster, Client) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (as CI has): tasks are held in cgroups and run as their namespace's user"
    );
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    cluster.next_workers(WorkerExtra {
        args: vec![
            "--require-limits".into(),
            "--require-isolation".into(),
            "--task-pids-max".into(),
            PIDS_MAX.to_string(),
            "--task-log-bytes".into(),
            LOG_CAP.to_string(),
        ]
        .into_iter()
        .chain(more.iter().map(|a| a.to_string()))
        .collect(),
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=4,memory=1024").await;
    let admin = cluster.client().await;
    let node = admin.cluster_status().await.unwrap().nodes.remove(0);
    assert_eq!(
        node.labels.get(ISOLATION_LABEL),
        Some("uid"),
        "{:?}",
        node.labels
    );
    (cluster, admin)
}

/// Waits for each task to end and returns their statuses in the order given.
async fn ended(client: &Client, tasks: &[TaskId]) -> Vec<TaskStatus> {
    let mut out = Vec::new();
    for &task in tasks {
        out.push(
            client
                .get(task, Some(Duration::from_secs(60)))
                .await
                .unwrap(),
        );
    }
    out
}

/// Submits `sh -c script` asking for `resources` as `client`; its id.
async fn sh(client: &Client, script: &str, resources: &str) -> TaskId {
    client
        .submit(Task::command(["sh", "-c", script]).resources_str(resources))
        .await
        .unwrap()
        .id()
}

async fn stdout(client: &Client, task: TaskId) -> String {
    String::from_utf8_lossy(&client.logs(task, LogStream::Stdout).await.unwrap()).into_owned()
}

/// Tenant A's fork bomb fills its own process limit, not the node's, and A's memory hog is
/// failed by the kernel in its own cgroup with the reason; tenant B's tasks on the same node,
/// forking a hundred times and filling 16 MiB meanwhile, succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_one_tenants_fork_bomb_and_memory_hog_leave_anothers_tasks_running() {
    let (cluster, admin) = contained().await;
    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;

    // The inner shell stops at its first failed fork and says how far it got; the outer one
    // holds the processes until the end.
    let bomb = r#"sh -c 'i=0; while [ $i -lt 300 ]; do sleep 30 & i=$((i+1)); echo $i; done' 2>/dev/null
echo full; sleep 3"#;
    // The shell carries on after its child is killed and exits 0 (on a v1 memory hierarchy
    // the kernel kills one process): the task still went past its request, and fails.
    let hog = "dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null; echo carried on";
    let bomb = sh(&a, bomb, "cpu=1,memory=128").await;
    let hog = sh(&a, hog, "cpu=1,memory=64").await;
    // B's tasks start while A's bomb holds its processes.
    let forks = sh(
        &b,
        "sleep 1; for i in $(seq 100); do sh -c true || exit 1; done; echo ok",
        "cpu=1,memory=64",
    )
    .await;
    let fills = sh(
        &b,
        "sleep 1; dd if=/dev/zero of=/dev/null bs=16M count=1 2>/dev/null && echo ok",
        "cpu=1,memory=64",
    )
    .await;

    let [forked, filled] = ended(&b, &[forks, fills]).await.try_into().unwrap();
    assert_eq!(forked.state, TaskState::Succeeded, "{forked:?}");
    assert_eq!(stdout(&b, forks).await, "ok\n");
    assert_eq!(filled.state, TaskState::Succeeded, "{filled:?}");
    assert_eq!(stdout(&b, fills).await, "ok\n");

    let [bombed, hogged] = ended(&a, &[bomb, hog]).await.try_into().unwrap();
    assert_eq!(bombed.state, TaskState::Succeeded, "{bombed:?}");
    let out = stdout(&a, bomb).await;
    let started = out.lines().filter(|l| l.parse::<u32>().is_ok()).count();
    assert!(
        started < PIDS_MAX as usize && started >= PIDS_MAX as usize - 16 && out.ends_with("full\n"),
        "the bomb started {started} processes under a limit of {PIDS_MAX}: {out}"
    );
    assert_eq!(hogged.state, TaskState::Failed, "{hogged:?}");
    let why = hogged.reason.clone().unwrap_or_default();
    assert!(
        why.contains("exceeded its memory request of 64 MiB"),
        "{hogged:?}"
    );
}

/// Tenant A's task writing 32 MiB to stdout keeps the first [`LOG_CAP`] bytes and one marker
/// line; tenant B's task beside it, on the same node, writes its output whole and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_one_tenants_log_flood_stops_at_its_cap_and_anothers_output_is_whole() {
    let (cluster, admin) = contained().await;
    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;
    let flood = sh(&a, "head -c 33554432 /dev/zero | tr '\\0' a", "cpu=1").await;
    let lines = sh(&b, "sleep 1; seq 10000", "cpu=1").await;

    let [written] = ended(&b, &[lines]).await.try_into().unwrap();
    assert_eq!(written.state, TaskState::Succeeded, "{written:?}");
    let expected: String = (1..=10_000).map(|i| format!("{i}\n")).collect();
    assert!(
        stdout(&b, lines).await == expected,
        "tenant B's output is not whole"
    );

    let [flooded] = ended(&a, &[flood]).await.try_into().unwrap();
    assert_eq!(flooded.state, TaskState::Succeeded, "{flooded:?}");
    let out = stdout(&a, flood).await;
    let marker = format!(
        "\n[escher: output past {LOG_CAP} bytes dropped: the task reached its log cap, the \
         worker's --task-log-bytes]\n"
    );
    assert!(
        out.ends_with(&marker),
        "{:?}",
        &out[out.len().saturating_sub(200)..]
    );
    assert_eq!(out.len() as u64, LOG_CAP + marker.len() as u64);
    assert_eq!(out.matches("[escher: output past").count(), 1);
}

/// Tenant A's task asking `cpu=0.1` and spinning for three seconds is held to about a tenth of
/// a CPU by its quota (measured by its own clock ticks), with tenant B's task asking `cpu=1`
/// spinning beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_one_tenants_cpu_hog_is_held_to_its_quota_beside_anothers_task() {
    let (cluster, admin) = contained().await;
    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;
    // The shell spins for three seconds of wall time, then prints the CPU milliseconds it and
    // its children used (its user and system clock ticks, and its waited-for children's).
    let spin = r#"end=$(( $(date +%s) + 3 )); while [ "$(date +%s)" -lt "$end" ]; do :; done
set -- $(cut -d' ' -f14-17 /proc/$$/stat); echo "$(( ($1 + $2 + $3 + $4) * 1000 / $(getconf CLK_TCK) ))""#;
    let hog = sh(&a, spin, "cpu=0.1").await;
    let full = sh(&b, spin, "cpu=1").await;
    let [held, free] = [
        ended(&a, &[hog]).await.remove(0),
        ended(&b, &[full]).await.remove(0),
    ];
    assert_eq!(held.state, TaskState::Succeeded, "{held:?}");
    assert_eq!(free.state, TaskState::Succeeded, "{free:?}");
    let cpu_ms = |text: String| text.trim().parse::<u64>().unwrap();
    let held_ms = cpu_ms(stdout(&a, hog).await);
    let free_ms = cpu_ms(stdout(&b, full).await);
    // Three seconds at a quota of 0.1 CPU is 300 ms (the quota's first period allows a little
    // more); unheld, the spin takes whatever CPU the machine has free, up to 3,000 ms.
    assert!(
        held_ms < 600,
        "the cpu=0.1 task used {held_ms} ms of CPU in 3 s (tenant B's cpu=1 task: {free_ms} ms)"
    );
}

/// The worker's task cgroups, together, weigh as the node's CPUs (4) busy processes against the
/// host's other processes: `cpu.shares` 4096 in a cgroup v1 CPU hierarchy, `cpu.weight` 400 in
/// the unified one. At the default weight they weighed as one process, and on a host where
/// anything else ran (a build, another service) all of a node's tasks shared one process's
/// CPU time. The task says where it is (`/proc/self/cgroup`); its cgroup's parent is the
/// worker's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_a_nodes_tasks_weigh_as_its_cpus_against_the_hosts_other_processes() {
    let (cluster, admin) = contained().await;
    let a = tenant(&cluster, &admin, "appa").await;
    let task = sh(&a, "cat /proc/self/cgroup", "cpu=1").await;
    let [done] = ended(&a, &[task]).await.try_into().unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    let cgroups = stdout(&a, task).await;
    // ID:CONTROLLERS:PATH; a v1 hierarchy with the CPU controller, else the unified one.
    let place = |v1: bool| {
        cgroups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let cpu = controllers.split(',').any(|c| c == "cpu");
            (if v1 { cpu } else { id == "0" }).then(|| path.to_string())
        })
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = |v1: bool| {
        mounts.lines().find_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let mut rest = rest.split_whitespace();
            let (fstype, options) = (rest.next()?, rest.nth(1)?);
            let wanted = if v1 {
                fstype == "cgroup" && options.split(',').any(|o| o == "cpu")
            } else {
                fstype == "cgroup2"
            };
            wanted.then(|| std::path::PathBuf::from(fields.split_whitespace().nth(4).unwrap()))
        })
    };
    let (dir, file, expected) = match place(true).zip(mount(true)) {
        Some((path, mount)) => (mount.join(path.trim_start_matches('/')), "cpu.shares", 4096),
        None => {
            let path = place(false).expect("the task is in no cgroup");
            let mount = mount(false).expect("no cgroup v2 hierarchy is mounted");
            (mount.join(path.trim_start_matches('/')), "cpu.weight", 400)
        }
    };
    let worker_dir = dir.parent().unwrap();
    assert!(
        worker_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("escher-worker-"),
        "{cgroups}"
    );
    let weight = std::fs::read_to_string(worker_dir.join(file)).unwrap();
    assert_eq!(
        weight.trim().parse::<u64>().unwrap(),
        expected,
        "{} of the worker's task cgroups",
        worker_dir.join(file).display()
    );
}

/// Removes the files named on the host when dropped: what a task planted there without a
/// private `/tmp`.
struct Planted(Vec<std::path::PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Tenant A's task writes 64 MiB to `/tmp`, and a file each to `/var/tmp` and `/dev/shm`, as a
/// program that ignores `TMPDIR` does: they land in its own scratch (its `HOME`, `TMPDIR` and
/// working directory, `/tmp` to it), never in the host's directories, and tenant B's task,
/// running beside it on the same node, finds none of them there and plants nothing in the
/// host's `/tmp` either. The node says so: `escher.tmp=private`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_a_tenants_files_in_tmp_stay_in_its_scratch_and_another_tenant_sees_none() {
    let (cluster, admin) = contained().await;
    let node = admin.cluster_status().await.unwrap().nodes.remove(0);
    assert_eq!(
        node.labels.get(TMP_LABEL),
        Some("private"),
        "{:?}",
        node.labels
    );
    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;
    let name = format!("escher-e2e-planted-{}", std::process::id());
    let host = [
        format!("/tmp/{name}"),
        format!("/var/tmp/{name}.var"),
        format!("/dev/shm/{name}.shm"),
        format!("/tmp/{name}.b"),
    ];
    let _planted = Planted(host.iter().map(Into::into).collect());
    // The three are one directory to the task: its scratch.
    let writer = format!(
        r#"set -e
head -c 67108864 /dev/zero > /tmp/{name}
echo a > /var/tmp/{name}.var
echo a > /dev/shm/{name}.shm
[ "$HOME" = /tmp ] && [ "$TMPDIR" = /tmp ] && [ "$(pwd)" = /tmp ]
[ -e /tmp/{name}.shm ] && [ -e /dev/shm/{name}.var ] && [ -e /var/tmp/{name} ]
echo written
sleep 600"#
    );
    let writer = sh(&a, &writer, "cpu=1,memory=256").await;
    eventually(
        "tenant A's task to write its files",
        procs::WAIT,
        || async {
            // No log yet while the task is still being started.
            let out = a.logs(writer, LogStream::Stdout).await.unwrap_or_default();
            if String::from_utf8_lossy(&out).contains("written") {
                return Some(());
            }
            let status = a.task_info(writer).await.unwrap().status;
            assert!(!status.state.is_terminal(), "tenant A's task: {status:?}");
            None
        },
    )
    .await;
    for path in &host[..3] {
        assert!(
            !std::path::Path::new(path).exists(),
            "tenant A's task wrote {path} on the host"
        );
    }

    let reader = format!(
        r#"for f in /tmp/{name} /var/tmp/{name}.var /dev/shm/{name}.shm; do
  if [ -e "$f" ]; then echo "sees $f"; fi
done
echo b > /tmp/{name}.b
echo checked"#
    );
    let reader = sh(&b, &reader, "cpu=1").await;
    let [read] = ended(&b, &[reader]).await.try_into().unwrap();
    assert_eq!(read.state, TaskState::Succeeded, "{read:?}");
    assert_eq!(stdout(&b, reader).await, "checked\n");
    assert!(
        !std::path::Path::new(&host[3]).exists(),
        "tenant B's task wrote {} on the host",
        host[3]
    );

    a.cancel([writer]).await.unwrap();
    let [stopped] = ended(&a, &[writer]).await.try_into().unwrap();
    assert_eq!(stopped.state, TaskState::Cancelled, "{stopped:?}");
}

/// With `--no-private-tmp`, a task shares the host's `/tmp` again, and the node says so:
/// `escher.tmp=host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_no_private_tmp_gives_tasks_the_hosts_tmp_and_says_so() {
    let (cluster, admin) = contained_with(&["--no-private-tmp"]).await;
    let node = admin.cluster_status().await.unwrap().nodes.remove(0);
    assert_eq!(
        node.labels.get(TMP_LABEL),
        Some("host"),
        "{:?}",
        node.labels
    );
    let a = tenant(&cluster, &admin, "appa").await;
    let name = format!("escher-e2e-host-tmp-{}", std::process::id());
    let host = std::path::PathBuf::from(format!("/tmp/{name}"));
    let _planted = Planted(vec![host.clone()]);
    std::fs::write(&host, "from the host\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let reader = sh(&a, &format!("cat /tmp/{name}"), "cpu=1").await;
    let [read] = ended(&a, &[reader]).await.try_into().unwrap();
    assert_eq!(read.state, TaskState::Succeeded, "{read:?}");
    assert_eq!(stdout(&a, reader).await, "from the host\n");
}
