//! A full disk (DESIGN §13): a lone durable head whose data directory's file system fills up
//! refuses writes with a clear error, keeps answering reads, and resumes by itself once space
//! is freed, without losing a write it acknowledged; the process stays up throughout.
//!
//! The file system is a small tmpfs the test mounts (and unmounts) itself, so the test runs as
//! root, as CI does.

mod procs;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use escher::types::{NodeSpec, TaskId};
use escher::{Client, ClientError, Task};
use procs::{WAIT, binary, eventually};

/// A tmpfs mounted at a temporary directory; unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount (the test mounts a tmpfs: it runs as root)");
        assert!(
            status.success(),
            "mount -t tmpfs failed: the test runs as root"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        if file.write_all(&chunk).is_err() {
            break;
        }
    }
    // What is left of a page: a byte at a time.
    while file.write_all(&[0]).is_ok() {}
    let _ = file.sync_all();
}

struct Head {
    child: Child,
}

impl Drop for Head {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(data: &Path, home: &Path) -> (Head, Client) {
    let address = home.join("address");
    let _ = std::fs::remove_file(&address);
    let child = Command::new(binary("escher-head"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--address-file")
        .arg(&address)
        .arg("--access-file")
        .arg(home.join("access.json"))
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let head = Head { child };
    let client = procs::admin_client_of(&address, &home.join("access.json")).await;
    (head, client)
}

/// Another client of the same head, with the same credentials.
async fn fresh(client: &Client) -> Client {
    Client::connect(client.leader_url())
        .await
        .unwrap()
        .with_credentials(client.credentials().clone())
}

fn pending_task(i: usize) -> Task {
    // No worker: every task stays pending, and each submit is one write.
    Task::command(["true"])
        .name(format!("t{i}"))
        .resources_str("cpu=1")
}

#[tokio::test]
async fn needs_root_a_full_disk_refuses_writes_serves_reads_and_resumes() {
    let disk = Tmpfs::mount(2 * 1024 * 1024);
    let home = tempfile::tempdir().unwrap();
    let data: PathBuf = disk.path().join("data");
    let (mut head, client) = start(&data, home.path()).await;

    let mut acknowledged: Vec<TaskId> = Vec::new();
    for i in 0..5 {
        acknowledged.push(client.submit(pending_task(i)).await.unwrap().id());
    }
    fill(&disk.path().join("filler"));

    // The next writes: those that still fit in the file's last page are acknowledged, the
    // first that does not waits in the stalled log (acknowledged once space returns), and every
    // later one is refused at once, saying why. (Each from a client of its own: one client's
    // submissions are answered in order.)
    let mut in_limbo = Vec::new();
    let mut refusal = None;
    for i in 5..200 {
        let c = fresh(&client).await;
        let mut submit = tokio::spawn(async move { c.submit(pending_task(i)).await });
        match tokio::time::timeout(Duration::from_secs(2), &mut submit).await {
            Ok(Ok(Ok(task))) => acknowledged.push(task.id()),
            Ok(Ok(Err(err))) => {
                refusal = Some(err);
                break;
            }
            Ok(Err(join)) => panic!("{join}"),
            Err(_) => in_limbo.push(submit),
        }
    }
    eprintln!(
        "acknowledged {}, waiting for space {}",
        acknowledged.len(),
        in_limbo.len()
    );
    let refusal = refusal.expect("a write refused while the disk is full");
    let text = refusal.to_string();
    assert!(text.contains("no space left for the raft log"), "{text}");
    assert!(text.contains("reads go on"), "{text}");
    assert!(
        !matches!(refusal, ClientError::UnknownOutcome { .. }),
        "a refusal is not an unknown outcome: {text}"
    );
    assert!(
        matches!(head.child.try_wait(), Ok(None)),
        "the head stays up"
    );

    // Reads go on, with everything acknowledged.
    let listed: Vec<TaskId> = client
        .list_tasks(None, None)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    for id in &acknowledged {
        assert!(listed.contains(id), "{id} in {listed:?}");
    }
    client.cluster_status().await.unwrap();

    // Space returns: writes resume by themselves.
    std::fs::remove_file(disk.path().join("filler")).unwrap();
    let resumed = eventually("a write to be acknowledged again", WAIT, || {
        let client = client.clone();
        async move { client.submit(pending_task(99)).await.ok() }
    })
    .await;
    acknowledged.push(resumed.id());
    // What waited in the stalled log is acknowledged now.
    for waiting in in_limbo {
        let task = tokio::time::timeout(WAIT, waiting)
            .await
            .expect("a write that waited for space is answered")
            .unwrap()
            .expect("and acknowledged");
        acknowledged.push(task.id());
    }

    // Everything acknowledged is on disk: a restart has it.
    let _ = head.child.kill();
    let _ = head.child.wait();
    drop(head);
    let (_head, client) = start(&data, home.path()).await;
    let listed: Vec<TaskId> = client
        .list_tasks(None, None)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    for id in &acknowledged {
        assert!(
            listed.contains(id),
            "{id} lost after the restart: {listed:?}"
        );
    }
}

/// A full disk under the leader of a group (DESIGN §13). A stalled replica takes no raft tick,
/// so it would go on believing it leads (check-quorum never runs) while the others elect
/// another: renewing its workers' leases meanwhile let the new leader declare their nodes lost
/// (what the nemesis harness found: a counter resource on a worker's node read 0 while it stood
/// at 176). The stalled leader lets its workers go at once, takes none back and renews no
/// lease, so they attach to the new leader before it declares them lost: the node stays the
/// same live node with its ephemeral resources, and writes go on.
#[tokio::test(flavor = "multi_thread")]
async fn needs_root_a_leader_whose_disk_fills_lets_its_workers_go_and_their_nodes_live_on() {
    let cluster = procs::ProcessCluster::builder()
        .heads(3)
        .durable()
        .small_disks(16 * 1024 * 1024)
        .start()
        .await;
    let client = cluster.client().await;
    let node = cluster.node("w1");
    let counter = |status: &escher::types::ClusterStatus| {
        status
            .node(node)
            .filter(|n| n.alive)
            .and_then(|n| n.resource("kept"))
            .map(|r| r.total.to_string())
    };
    client
        .set_resource("kept", 5, NodeSpec::Node(node))
        .await
        .unwrap();
    let leader = cluster.wait_leader().await;
    fill(&cluster.head_data_dir(leader).join("filler"));

    // Writes until the leader's log has used what it had preallocated and stalls, and another
    // leads; each +1 counted as acknowledged or only tried (an unknown outcome may have
    // applied).
    let (mut acked, mut tried) = (0u64, 0u64);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        tried += 1;
        if client
            .adjust_resource("kept", 1, NodeSpec::Node(node))
            .await
            .is_ok()
        {
            acked += 1;
        }
        // The stalled replica still calls itself the leader (it takes no raft message, so it
        // learns of no newer term): another one must.
        let heads = client.heads().await.ok();
        let other = heads.iter().flat_map(|h| &h.replicas).any(|r| {
            r.role == Some(escher::types::ReplicaRole::Leader) && r.id != leader as u64 + 1
        });
        if other {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the full disk never moved the lead ({acked} of {tried} writes acknowledged)"
        );
    }
    // Writes go on through the new leader, and the node was never lost: its resource holds
    // every acknowledged +1.
    let client = &client;
    eventually("a write through the new leader", WAIT, || async move {
        client
            .adjust_resource("kept", 1, NodeSpec::Node(node))
            .await
            .ok()
    })
    .await;
    let status = client.cluster_status().await.unwrap();
    let kept: u64 = counter(&status)
        .unwrap_or_else(|| panic!("node {node} lost its resource: {status:?}"))
        .parse()
        .expect("a whole number");
    assert!(
        (6 + acked..=6 + tried).contains(&kept),
        "the resource is {kept}; 5, then {acked} of {tried} +1s acknowledged and one more"
    );
    // The worker is the same live node, attached to the new leader: a task runs there.
    let ran = client
        .run(Task::command(["true"]), Some(WAIT))
        .await
        .unwrap();
    assert_eq!(ran.node, Some(node), "{ran:?}");
    // `escher heads` says which replica is stalled and why, and names the new leader as the
    // one that leads.
    let filled = leader as u64 + 1;
    let heads = eventually(
        "the filled replica to say it is stalled",
        WAIT,
        || async move {
            let heads = client.heads().await.ok()?;
            heads
                .replicas
                .iter()
                .any(|r| r.id == filled && r.stalled.is_some())
                .then_some(heads)
        },
    )
    .await;
    let why = heads.replicas.iter().find(|r| r.id == filled).unwrap();
    let why = why.stalled.as_deref().unwrap();
    assert!(
        why.contains(&format!("replica {filled}'s raft log"))
            && why.contains(&cluster.head_data_dir(leader).display().to_string())
            && why.contains("has been full"),
        "{why}"
    );
    assert_ne!(heads.leader().map(|r| r.id), Some(filled), "{heads:?}");
    // Space back: the replica goes on, learns of the newer term and follows.
    let _ = std::fs::remove_file(cluster.head_data_dir(leader).join("filler"));
    eventually("the filled replica to follow again", WAIT, || async move {
        let heads = client.heads().await.ok()?;
        heads
            .replicas
            .iter()
            .any(|r| {
                r.id == filled
                    && r.stalled.is_none()
                    && r.role == Some(escher::types::ReplicaRole::Follower)
            })
            .then_some(())
    })
    .await;
}

/// A node whose disk is under its reserve gets no new task: the head labels it
/// `escher.disk.under-reserve` from its worker's heartbeats, tasks go to the other node, a task
/// that only it could hold waits pending (not dispatched there to wait unstarted), and once
/// space returns the label goes and that task runs there. The node's task directory is a small
/// tmpfs the test fills from outside.
#[tokio::test(flavor = "multi_thread")]
async fn needs_root_a_node_under_its_disk_reserve_gets_no_task_while_another_takes_them() {
    use escher::types::{DISK_UNDER_RESERVE_LABEL, TaskState};
    use procs::{ProcessCluster, WorkerExtra};

    let fs = Tmpfs::mount(32 << 20);
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    cluster.next_workers(WorkerExtra {
        args: vec![
            "--task-dir".into(),
            fs.path().display().to_string(),
            "--disk-reserve".into(),
            "8MiB".into(),
        ],
        ..WorkerExtra::default()
    });
    let full = cluster.start_worker("full", "cpu=4,spot=1").await;
    cluster.next_workers(WorkerExtra::default());
    let roomy = cluster.start_worker("roomy", "cpu=2").await;
    let client = cluster.client().await;
    let labelled = |under: bool| {
        let client = client.clone();
        async move {
            let status = client.cluster_status().await.ok()?;
            let node = status.nodes.iter().find(|n| n.id == full)?;
            (node.labels.get(DISK_UNDER_RESERVE_LABEL).is_some() == under
                && node.takes_tasks() != under)
                .then_some(())
        }
    };

    // 28 MiB of the 32: less free than the reserve.
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0u8; 28 << 20]).unwrap();
    eventually("the head to label the full node", WAIT, || labelled(true)).await;

    // Only the full node has `spot`: the task waits at the head.
    let spot = client
        .submit(Task::command(["true"]).resources_str("cpu=1,spot=1"))
        .await
        .unwrap()
        .id();
    // Round-robin over both nodes would give the full one some of these; all run on the
    // other (two at a time), and none is left waiting unstarted on the full one.
    let mut others = Vec::new();
    for _ in 0..6 {
        let task = Task::command(["true"]).resources_str("cpu=1");
        others.push(client.submit(task).await.unwrap().id());
    }
    for task in others {
        let status = client.get(task, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        assert_eq!(status.node, Some(roomy), "{status:?}");
    }
    let waiting = client.task_info(spot).await.unwrap().status;
    assert_eq!(waiting.state, TaskState::Pending, "{waiting:?}");
    assert_eq!(waiting.node, None, "{waiting:?}");

    // Space returns: the label goes and the task runs there.
    std::fs::remove_file(&filler).unwrap();
    eventually("the head to unlabel the node", WAIT, || labelled(false)).await;
    let ran = client.get(spot, Some(WAIT)).await.unwrap();
    assert_eq!(ran.state, TaskState::Succeeded, "{ran:?}");
    assert_eq!(ran.node, Some(full), "{ran:?}");
    drop(cluster);
}
