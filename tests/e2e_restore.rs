//! A restore with live workers: a backup taken while tasks run, more tasks after it,
//! the head stopped and started again from the backup on its address, the worker coming back
//! by itself. The restored head is a new incarnation of the cluster
//! (`core/src/state/incarnation.rs`): every task ends, no id given out before the restore is
//! given out again, `escher logs` of a new task shows its own output, what the worker ran that
//! the backup did not know is stopped, and the node's capacity is free again. And a lone head
//! whose log tail was cut never gives out again an id the cut write may have held.

mod procs;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use escher::types::{Amount, TaskId, TaskState};
use escher::{Client, Task};
use procs::{ProcessCluster, WAIT, binary, eventually};

/// `escher ARGS` with the cluster's access file.
fn escher(cluster: &ProcessCluster, args: &[&str]) -> std::process::Output {
    Command::new(binary("escher"))
        .args(args)
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_ACCESS_FILE")
        .output()
        .expect("the escher CLI runs")
}

/// A task that prints `word`, then sleeps `secs`; retried once.
fn printing(word: &str, secs: u32) -> Task {
    Task::command(["sh", "-c", &format!("echo {word}; sleep {secs}")])
        .resources_str("cpu=1")
        .max_retries(1)
}

/// Waits until `id` runs.
async fn running(client: &Client, id: TaskId) {
    eventually(&format!("task {id} to run"), WAIT, || async move {
        let info = client.task_info(id).await.ok()?;
        (info.status.state == TaskState::Running).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_restore_with_a_live_worker_ends_every_task_and_never_gives_out_an_id_again() {
    // A long heartbeat timeout: the worker's lease outlives the head's stop and restart, so
    // its tasks go on running meanwhile, as they would with a quick restore.
    let mut cluster = ProcessCluster::builder()
        .durable()
        .resources("cpu=4,memory=512")
        .heartbeat_timeout_ms(60_000)
        .start()
        .await;
    let client = cluster.client().await;
    let node = cluster.node("w1");

    // Four tasks run when the backup is taken: three end soon after it, one outlives the
    // restore.
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(
            client
                .submit(printing(&format!("before-{i}"), 3))
                .await
                .unwrap()
                .id(),
        );
    }
    let outliving = client.submit(printing("outliving", 20)).await.unwrap().id();
    for &id in before.iter().chain([&outliving]) {
        running(&client, id).await;
    }
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("cluster.backup");
    let save = escher(
        &cluster,
        &["admin", "snapshot", "save", file.to_str().unwrap()],
    );
    assert!(save.status.success(), "{save:?}");

    // After the backup: the three end, five more tasks run and end, and one more task is still
    // running when the head stops (the restored head never heard of it).
    for &id in &before {
        let status = client.get(id, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    }
    let mut after = Vec::new();
    for i in 0..5 {
        let task = Task::command(["sh", "-c", &format!("echo lost-{i}")]).resources_str("cpu=1");
        let status = client.run(task, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        after.push(status.id);
    }
    let marker = cluster.shared_path("unknown-task-finished");
    let unknown = Task::command([
        "sh",
        "-c",
        &format!("echo unknown; sleep 8; touch {}", marker.display()),
    ])
    .resources_str("cpu=1");
    let unknown = client.submit(unknown).await.unwrap().id();
    running(&client, unknown).await;
    let given_out: Vec<TaskId> = before
        .iter()
        .chain([&outliving])
        .chain(&after)
        .chain([&unknown])
        .copied()
        .collect();
    drop(client);

    // The head stops and starts again from the backup, on its address, in a new directory.
    cluster.terminate_head_at(0).await;
    cluster.restore_head_at(0, &file).await;
    let client = cluster.client().await;

    // Every task the backup knew ends. What ended after the backup either reaches the restored
    // head through the worker, which still held its report unacknowledged when the head
    // stopped (the attempt the backup believed running is the one that ended: attempt 1), or
    // runs again, the first attempt ended by the restore (the head could not know its outcome).
    for &id in &before {
        let status = client.get(id, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        let info = client.task_info(id).await.unwrap();
        match status.attempt {
            1 => assert_eq!(info.attempts.len(), 1, "{info:?}"),
            2 => {
                let first = info.attempts.first().expect("attempts kept");
                let ended = first.ended.as_deref().unwrap_or_default();
                assert!(ended.contains("restored from a backup"), "{info:?}");
            }
            _ => panic!("task {id} ran more than twice: {info:?}"),
        }
    }
    let status = client.get(outliving, Some(WAIT)).await.unwrap();
    assert_eq!(
        (status.state, status.attempt),
        (TaskState::Succeeded, 1),
        "{status:?}"
    );

    // New tasks: ids never given out before, their own output in `escher logs`.
    let mut new = Vec::new();
    for i in 0..5 {
        let task = Task::command(["sh", "-c", &format!("echo fresh-{i}")]).resources_str("cpu=1");
        let status = client.run(task, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        assert!(
            given_out.iter().all(|old| *old < status.id),
            "{} given out again ({given_out:?})",
            status.id
        );
        new.push(status.id);
    }
    for (i, id) in new.iter().enumerate() {
        let logs = escher(&cluster, &["logs", &id.to_string()]);
        assert!(logs.status.success(), "{logs:?}");
        let text = String::from_utf8_lossy(&logs.stdout);
        assert!(text.contains(&format!("fresh-{i}")), "logs of {id}: {text}");
        assert!(!text.contains("lost-"), "logs of {id}: {text}");
    }

    // The task the restored head never knew was stopped: it never finished its work, and the
    // node's CPUs are all free again.
    let free = eventually("the node's CPUs to be free", WAIT, || {
        let client = client.clone();
        async move {
            let status = client.cluster_status().await.ok()?;
            let n = status.nodes.into_iter().find(|n| n.id == node)?;
            let cpu = n.resources.into_iter().find(|r| r.name.as_str() == "cpu")?;
            (cpu.used == Amount::ZERO).then_some(cpu)
        }
    })
    .await;
    assert_eq!(free.total.to_string(), "4");
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        !Path::new(&marker).exists(),
        "task {unknown}, unknown to the restored head, ran to its end"
    );
    let said = cluster.worker_output("w1");
    assert!(said.contains("restored from a backup"), "{said}");
}

/// The newest log segment of a lone durable head cut 10 bytes short while it was stopped:
/// the head cannot tell a write it never finished from one a cut took after it
/// was acknowledged, so it never gives out again an id that write may have held, and says so
/// without calling the write "never acknowledged".
#[tokio::test]
async fn a_lone_head_whose_log_tail_was_cut_skips_the_ids_the_cut_may_have_held() {
    let mut cluster = ProcessCluster::builder().durable().start().await;
    let client = cluster.client().await;
    let mut given_out = Vec::new();
    for i in 0..3 {
        let task = Task::command(["sh", "-c", &format!("echo kept-{i}")]);
        given_out.push(client.run(task, Some(WAIT)).await.unwrap().id);
    }
    // The last one, acknowledged, whose entry may be in the last write.
    given_out.push(client.submit(Task::command(["true"])).await.unwrap().id());
    drop(client);
    cluster.kill_head();

    let data = cluster.head_data_dir(0);
    let mut segments: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    let newest = segments.last().expect("a log segment");
    let len = std::fs::metadata(newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(newest)
        .unwrap()
        .set_len(len - 10)
        .unwrap();

    cluster.restart_head().await;
    let client = cluster.client().await;
    let next = client.submit(Task::command(["true"])).await.unwrap().id();
    let newest_id = *given_out.iter().max().unwrap();
    assert!(
        next.0 > newest_id.0 + escher_head::replication::CUT_TAIL_IDS,
        "{next} after {newest_id}: the ids the cut write may have held were given out again"
    );
    let said = cluster.head_output(0);
    assert!(said.contains("cannot tell"), "{said}");
}

/// The backup of a cluster with one task that never ran (it has no worker): the file, and the
/// task's id in it.
async fn another_clusters_backup(dir: &Path) -> (std::path::PathBuf, TaskId) {
    let other = ProcessCluster::builder().workers(0).start().await;
    let other_client = other.client().await;
    let theirs = other_client
        .submit(Task::command(["sh", "-c", "echo theirs"]).name("of-the-other-cluster"))
        .await
        .unwrap()
        .id();
    let file = dir.join("other.backup");
    let save = escher(
        &other,
        &["admin", "snapshot", "save", file.to_str().unwrap()],
    );
    assert!(save.status.success(), "{save:?}");
    (file, theirs)
}

/// Waits until the head has recorded its cluster in its access file; returns the id.
async fn recorded_cluster(cluster: &ProcessCluster) -> String {
    eventually(
        "the head to record its cluster in its access file",
        WAIT,
        || {
            let path = cluster.access_file();
            async move { escher::access::AccessFile::read(&path).ok()?.cluster }
        },
    )
    .await
}

/// A backup of another cluster given to this cluster's head (its address, its access file,
/// which names this cluster since its head first ran): refused, saying which cluster each is
/// and what to do; nothing is written, and this cluster's head, started again on its own data
/// directory, goes on with the task its worker ran throughout.
#[tokio::test]
async fn a_backup_of_another_cluster_is_refused_by_this_clusters_head() {
    let backups = tempfile::tempdir().unwrap();
    let (file, _) = another_clusters_backup(backups.path()).await;

    let mut cluster = ProcessCluster::builder()
        .durable()
        .heartbeat_timeout_ms(60_000)
        .start()
        .await;
    let ours = recorded_cluster(&cluster).await;
    let client = cluster.client().await;
    let task = client
        .submit(Task::command(["sh", "-c", "sleep 4; echo done"]))
        .await
        .unwrap()
        .id();
    running(&client, task).await;
    drop(client);
    cluster.terminate_head_at(0).await;
    let (status, said, fresh) = cluster.restore_head_expecting_exit(0, &file).await;
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("it is a backup of cluster")
            && said.contains(&format!("is cluster {ours}'s"))
            && said.contains("--access-file")
            && said.contains("nothing was written"),
        "{said}"
    );
    assert!(
        !fresh.exists(),
        "the refused restore made {}",
        fresh.display()
    );
    assert_eq!(
        escher::access::AccessFile::read(&cluster.access_file())
            .unwrap()
            .cluster
            .as_deref(),
        Some(ours.as_str())
    );
    // This cluster's head again: the task its worker ran throughout ends as attempt 1.
    cluster.restart_head().await;
    let client = cluster.client().await;
    let status = client.get(task, Some(WAIT)).await.unwrap();
    assert_eq!(
        (status.state, status.attempt),
        (TaskState::Succeeded, 1),
        "{status:?}"
    );
}

/// A backup of another cluster restored in this cluster's place with an access file that
/// names no cluster (one an earlier release wrote): the restore cannot tell the two apart
/// (docs/RELIABILITY.md), so the restored head is the other cluster, whole; this cluster's
/// worker, presenting an identity the other cluster never issued, is turned away as a
/// stranger naming both clusters, stops the task it ran (which never reaches its end), and
/// joins as a new node. Nothing of this cluster's data directory is written.
#[tokio::test]
async fn a_backup_of_another_cluster_turns_this_clusters_workers_away_as_strangers() {
    let backups = tempfile::tempdir().unwrap();
    let (file, theirs) = another_clusters_backup(backups.path()).await;

    // This cluster: a worker running a task when its head is replaced.
    let mut cluster = ProcessCluster::builder()
        .durable()
        .heartbeat_timeout_ms(60_000)
        .start()
        .await;
    let client = cluster.client().await;
    let node = cluster.node("w1");
    let marker = cluster.shared_path("this-clusters-task-finished");
    let ours = client
        .submit(Task::command([
            "sh",
            "-c",
            &format!("sleep 8; touch {}", marker.display()),
        ]))
        .await
        .unwrap()
        .id();
    running(&client, ours).await;
    drop(client);
    cluster.terminate_head_at(0).await;
    let data = cluster.head_data_dir(0);
    let listing = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().len())
            })
            .collect();
        names.sort();
        names
    };
    let before = listing(&data);
    // The access file as an earlier release wrote it: no cluster named.
    recorded_cluster(&cluster).await;
    let access = cluster.access_file();
    let mut unnamed = escher::access::AccessFile::read(&access).unwrap();
    unnamed.cluster = None;
    unnamed.replace(&access).unwrap();
    cluster.restore_head_at(0, &file).await;
    let client = cluster.client().await;

    // The restored head is the other cluster: its task, under its name.
    let info = client.task_info(theirs).await.unwrap();
    assert_eq!(info.spec.name, "of-the-other-cluster", "{info:?}");
    // This cluster's worker is a stranger to it: it registers as a new node, and says why.
    let joined = eventually("w1 to join the other cluster as a new node", WAIT, || {
        let client = client.clone();
        async move {
            let status = client.cluster_status().await.ok()?;
            status
                .nodes
                .into_iter()
                .find(|n| n.name == "w1" && n.alive && n.id != node)
        }
    })
    .await;
    assert_ne!(joined.id, node);
    let said = cluster.worker_output("w1");
    assert!(
        said.contains("does not know this worker") && said.contains("was issued by cluster"),
        "{said}"
    );
    // The task it ran for this cluster was stopped: it never reached its end.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        !marker.exists(),
        "task {ours} of this cluster ran to its end under the other cluster's head"
    );
    // This cluster's data directory is as it was left.
    assert_eq!(listing(&data), before);
}
