//! Upgrades keep the data (DESIGN §14): a head of this build opens a data directory that an
//! earlier build wrote, in every data format a release wrote, and goes on from it.
//!
//! The fixtures in `tests/fixtures/data-format-N/` were written by `scripts/make-format-fixture`
//! with the build that introduced format N (a snapshot, log segments after it, a node, finished
//! and pending tasks, an ephemeral resource, an application token) and are never rewritten: a
//! later build that changes an encoded type adds format N+1 and must still pass this test for
//! every fixture here.

mod procs;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use escher::types::{NodeSpec, TaskState};
use escher::{Client, Task};
use escher_head::replication::DATA_FORMAT;
use procs::{WAIT, binary};

/// A head started on a copy of a fixture; killed when dropped.
struct Head {
    child: Child,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Head {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Starts `escher-head` on a copy of fixture `name` (its data directory and access file), with
/// `env` in its environment.
async fn head_on(name: &str, env: &[(&str, &str)]) -> (Head, Client) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, dir.path());
    let (mut head, client) = start_head_with(dir.path(), &[], env).await;
    head._dir = Some(dir);
    (head, client)
}

/// The `escher-head` command for `dir` (its `access.json`, made private, and `data/`) with
/// `extra` flags.
fn head_command(dir: &Path, extra: &[&std::ffi::OsStr]) -> Command {
    let access = dir.join("access.json");
    // git keeps no file modes: the access file must be private again.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&access, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut command = Command::new(binary("escher-head"));
    command
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--address-file")
        .arg(dir.join("address"))
        .arg("--access-file")
        .arg(&access)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--heartbeat-timeout-ms")
        .arg("600000")
        // The fixtures' tasks finished when the fixtures were made: kept for ten years, so that
        // the default retention (a day after they finished) never evicts what the tests read.
        .arg("--retain-for")
        .arg("3650days")
        .args(extra);
    command
}

/// Starts `escher-head` on `dir` (see [`head_command`]) and a client of it.
async fn start_head(dir: &Path, extra: &[&std::ffi::OsStr]) -> (Head, Client) {
    start_head_with(dir, extra, &[]).await
}

/// [`start_head`] with `env` in the head's environment.
async fn start_head_with(
    dir: &Path,
    extra: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> (Head, Client) {
    let access = dir.join("access.json");
    let address = dir.join("address");
    let _ = std::fs::remove_file(&address);
    let child = head_command(dir, extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = procs::admin_client_of(&address, &access).await;
    let head = Head { child, _dir: None };
    (head, client)
}

#[tokio::test]
async fn a_data_directory_of_format_1_opens_and_goes_on() {
    opens_and_goes_on(&[]).await;
}

/// What today's release wrote, the next one (with a new data format) reads: the format-1
/// fixture opened by this build under the seam that makes it the next release, which then
/// writes its own format on top.
#[tokio::test]
async fn the_next_release_opens_a_data_directory_of_format_1() {
    opens_and_goes_on(&[NEXT_RELEASE]).await;
}

/// Opens the format-1 fixture with `env` in the head's environment, checks everything it
/// holds, and writes on.
async fn opens_and_goes_on(env: &[(&str, &str)]) {
    let (head, client) = head_on("data-format-1", env).await;

    let tasks = client.list_tasks(None, None).await.unwrap();
    let done: Vec<_> = tasks
        .iter()
        .filter(|t| t.name.starts_with("fixture-done-"))
        .collect();
    assert_eq!(done.len(), 40, "{tasks:?}");
    assert!(
        done.iter().all(|t| t.state == TaskState::Succeeded),
        "{done:?}"
    );
    let pending = tasks
        .iter()
        .find(|t| t.name == "fixture-pending")
        .expect("the pending task");
    assert_eq!(pending.state, TaskState::Pending, "{pending:?}");

    let status = client.cluster_status().await.unwrap();
    let node = status
        .nodes
        .iter()
        .find(|n| n.name == "fixture-w1")
        .expect("the fixture's node");
    let slots = node
        .resources
        .iter()
        .find(|r| r.name.as_str() == "fixture-slots")
        .expect("the ephemeral resource");
    assert_eq!(slots.total.to_string(), "3", "{slots:?}");

    let tokens = client.list_tokens().await.unwrap();
    assert!(
        tokens.iter().any(|t| t.description == "fixture-app"),
        "{tokens:?}"
    );

    // It goes on: ids continue past the fixture's, and a write is acknowledged.
    let last = tasks.iter().map(|t| t.id).max().unwrap();
    let next = client
        .submit(Task::command(["true"]).resources_str("fixture-gate=1"))
        .await
        .unwrap();
    assert!(next.id() > last, "{} after {last}", next.id());
    client
        .set_resource("fixture-gate", 1, NodeSpec::Node(node.id))
        .await
        .unwrap();
    drop(head);
}

/// Backup and restore (`escher admin snapshot save FILE`, `escher-head --restore FILE`): a new
/// group started from a backup of a running one has its tasks, results, nodes, resources and
/// tokens; ids go on past the backup's. A restore into a data directory that holds a log, and a
/// damaged backup, are refused with the reason, and start nothing.
#[tokio::test]
async fn a_backup_of_a_running_head_starts_a_new_group() {
    let cluster = procs::ProcessCluster::builder().durable().start().await;
    let client = cluster.client().await;
    let node = cluster.node("w1");
    let mut ids = Vec::new();
    for i in 0..5 {
        let task = Task::command(["sh", "-c", &format!("echo {i}")]).name(format!("kept-{i}"));
        ids.push(client.run(task, Some(WAIT)).await.unwrap().id);
    }
    client
        .set_resource("kept-slots", 2, NodeSpec::Node(node))
        .await
        .unwrap();
    let home = cluster.dir().join("escher-home");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.backup");
    let save = Command::new(binary("escher"))
        .args(["admin", "snapshot", "save"])
        .arg(&file)
        .env("ESCHER_HOME", &home)
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    assert!(save.status.success(), "{save:?}");
    let said = String::from_utf8_lossy(&save.stdout);
    assert!(said.contains("--restore"), "{said}");
    // Never overwritten.
    let again = Command::new(binary("escher"))
        .args(["admin", "snapshot", "save"])
        .arg(&file)
        .env("ESCHER_HOME", &home)
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    assert!(!again.status.success(), "{again:?}");

    // A new group from it, with the cluster's access file (its tokens).
    let new = tempfile::tempdir().unwrap();
    std::fs::copy(cluster.access_file(), new.path().join("access.json")).unwrap();
    let restore: [&std::ffi::OsStr; 2] = ["--restore".as_ref(), file.as_os_str()];
    let (head, restored) = start_head(new.path(), &restore).await;
    for (i, id) in ids.iter().enumerate() {
        let status = restored.get(*id, Some(WAIT)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
        let info = restored.task_info(*id).await.unwrap();
        assert_eq!(info.spec.name, format!("kept-{i}"));
    }
    let status = restored.cluster_status().await.unwrap();
    let kept = status
        .nodes
        .iter()
        .find(|n| n.id == node)
        .expect("the node");
    assert!(
        kept.resources
            .iter()
            .any(|r| r.name.as_str() == "kept-slots" && r.total.to_string() == "2"),
        "{kept:?}"
    );
    let next = restored.submit(Task::command(["true"])).await.unwrap();
    assert!(ids.iter().all(|id| *id < next.id()), "ids go on");
    drop(head);

    // Not into a log that exists: it says so, and exits.
    let data_dir = tempfile::tempdir().unwrap();
    std::fs::copy(cluster.access_file(), data_dir.path().join("access.json")).unwrap();
    drop(start_head(data_dir.path(), &[]).await);
    let refused = head_command(data_dir.path(), &restore).output().unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("empty --data-dir"), "{said}");

    // A damaged backup.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    let damaged = dir.path().join("damaged.backup");
    std::fs::write(&damaged, bytes).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    std::fs::copy(cluster.access_file(), fresh.path().join("access.json")).unwrap();
    let refused = head_command(fresh.path(), &["--restore".as_ref(), damaged.as_os_str()])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("damaged"), "{said}");
}

/// The test seam that makes a replica act as the next release, reading and writing one data
/// format more than this build (`escher_head::replication::ENV_NEXT_FORMAT`).
const NEXT_RELEASE: (&str, &str) = ("ESCHER_TEST_NEXT_DATA_FORMAT", "1");

/// Each replica's (newest format read, format written), by id, as `escher heads` reports them
/// (`None` for one that did not answer).
async fn formats(client: &Client) -> std::collections::BTreeMap<u64, Option<(u16, u16)>> {
    let heads = client.heads().await.expect("escher heads");
    heads
        .replicas
        .iter()
        .map(|r| {
            let formats = r.data_format.zip(r.writes_data_format);
            (r.id, r.reachable.then_some(formats).flatten())
        })
        .collect()
}

/// A rolling upgrade to a release with a new data format (DESIGN §14), one replica at a time,
/// under a submit loop: while any replica reads only the old format the group writes the old
/// one (every replica keeps replicating), once all read the new one it moves to it, and no
/// acknowledged task is lost. A replica then started again on the old release refuses the
/// group's data, naming both formats, instead of misreading it. "The next release" is this
/// build under the seam [`NEXT_RELEASE`].
#[tokio::test(flavor = "multi_thread")]
async fn a_group_upgraded_replica_by_replica_moves_to_the_new_format_and_loses_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let mut cluster = procs::ProcessCluster::builder()
        .heads(3)
        .durable()
        .head_args(&["--snapshot-log-bytes", "20000"])
        .start()
        .await;
    let client = cluster.client().await;
    // This release's format, and the next release's.
    let (this, next) = (DATA_FORMAT, DATA_FORMAT + 1);
    let before = formats(&client).await;
    assert!(
        before.values().all(|f| *f == Some((this, this))),
        "before: {before:?}"
    );

    // The load: one submitter, each acknowledged task and when.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::Mutex::new(
        Vec::<(escher::types::TaskId, Instant)>::new(),
    ));
    let loader = {
        let (stop, acked) = (Arc::clone(&stop), Arc::clone(&acked));
        let client = Client::connect_lazy(cluster.head_url())
            .unwrap()
            .with_credentials(cluster.credentials())
            .with_failover_timeout(Duration::from_secs(30));
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                // Retried: a task whose node is declared lost while the leader changes runs again.
                let task = Task::command(["true"])
                    .name(format!("upgrade-{n}"))
                    .max_retries(3);
                if let Ok(handle) = client.submit(task).await {
                    acked.lock().unwrap().push((handle.id(), Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let acked_now = || acked.lock().unwrap().len();

    for index in 0..3 {
        let id = index as u64 + 1;
        let count = acked_now();
        let status = cluster.terminate_head_at(index).await;
        assert!(status.success(), "replica {id} stopped with {status}");
        cluster.set_head_env(index, &[NEXT_RELEASE]);
        cluster.restart_head_at(index).await;
        // It runs the next release, and the group goes on acknowledging.
        procs::eventually(
            &format!("replica {id} to rejoin on the next release"),
            WAIT,
            || {
                let client = &client;
                async move {
                    let f = formats(client).await;
                    f[&id].is_some_and(|(reads, _)| reads == next).then_some(())
                }
            },
        )
        .await;
        procs::eventually("writes acknowledged again", WAIT, || {
            let done = acked_now() > count + 20;
            async move { done.then_some(()) }
        })
        .await;
        let now = formats(&client).await;
        if index < 2 {
            // Someone still reads only this release's format: nobody writes the next.
            assert!(
                now.values()
                    .all(|f| f.is_some_and(|(_, writes)| writes == this)),
                "with {} replica(s) upgraded: {now:?}",
                index + 1
            );
        }
    }
    // Every replica reads the next format: the group writes it, and every replica applies it.
    procs::eventually("the group to write the next format", WAIT, || {
        let client = &client;
        async move {
            let f = formats(client).await;
            f.values().all(|f| *f == Some((next, next))).then_some(())
        }
    })
    .await;
    let count = acked_now();
    procs::eventually("writes acknowledged in the next format", WAIT, || {
        let done = acked_now() > count + 50;
        async move { done.then_some(()) }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    loader.await.unwrap();

    // Nothing acknowledged was lost, and the longest wait between two acknowledgements.
    let acked = acked.lock().unwrap().clone();
    let mut gap = Duration::ZERO;
    for pair in acked.windows(2) {
        gap = gap.max(pair[1].1 - pair[0].1);
    }
    println!(
        "rolling upgrade of three replicas: {} submits acknowledged, longest gap between two: \
         {gap:.2?}",
        acked.len()
    );
    let ids: Vec<escher::types::TaskId> = acked.iter().map(|(id, _)| *id).collect();
    for chunk in ids.chunks(500) {
        let (ready, not_ready) = client
            .wait(chunk.iter().copied(), chunk.len(), Some(WAIT))
            .await
            .expect("every acknowledged task is known");
        assert!(not_ready.is_empty(), "not finished: {not_ready:?}");
        assert!(
            ready.iter().all(|s| s.state == TaskState::Succeeded),
            "{ready:?}"
        );
    }

    // Back to the old release: the replica refuses the group's data and says why.
    cluster.terminate_head_at(2).await;
    cluster.set_head_env(2, &[]);
    let (status, said) = cluster.start_head_expecting_exit(2).await;
    assert!(
        !status.success(),
        "the old release ran on format {next}: {said}"
    );
    assert!(
        said.contains(&format!("data format {next}"))
            && said.contains(&format!("formats 1 to {this}")),
        "{said}"
    );
}

/// A backup a later release took (its image in a data format newer than this build reads, and
/// its header saying so) is refused naming both formats and what to do, and nothing is
/// written: the data directory it was given is not even created.
#[tokio::test]
async fn a_backup_in_a_newer_data_format_is_refused_naming_both_formats() {
    let cluster = procs::ProcessCluster::builder().workers(0).start().await;
    let client = cluster.client().await;
    client
        .submit(Task::command(["true"]).name("in-the-backup"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.backup");
    let save = Command::new(binary("escher"))
        .args(["admin", "snapshot", "save"])
        .arg(&file)
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    assert!(save.status.success(), "{save:?}");
    // This build's backup states the format its image is in, one it reads.
    let (header, image) = escher_proto::backup::read_backup(&file).unwrap();
    let format = escher_head::replication::image_format(&image);
    assert_eq!(header.data_format, u32::from(format), "{header:?}");
    assert!(format <= DATA_FORMAT, "{header:?}");

    // The same state as the next release would write it: behind the envelope, in its format
    // (the layout of format N+1 is this build's, as under the test seam `NEXT_RELEASE`).
    let newer = DATA_FORMAT + 1;
    let body = if format == 1 { &image[..] } else { &image[4..] };
    let mut next_image = vec![0xFF, b'E'];
    next_image.extend_from_slice(&newer.to_le_bytes());
    next_image.extend_from_slice(body);
    let next_file = dir.path().join("next-release.backup");
    let next_header = escher_proto::backup::BackupHeader {
        data_format: u32::from(newer),
        ..header
    };
    escher_proto::backup::write_backup(&next_file, next_header, &next_image).unwrap();

    let fresh = tempfile::tempdir().unwrap();
    std::fs::copy(cluster.access_file(), fresh.path().join("access.json")).unwrap();
    let refused = head_command(fresh.path(), &["--restore".as_ref(), next_file.as_os_str()])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(&format!("data format {newer}"))
            && said.contains(&format!("formats 1 to {DATA_FORMAT}"))
            && said.contains("restore it with that release"),
        "{said}"
    );
    assert!(
        !fresh.path().join("data").exists(),
        "a refused restore wrote its data directory"
    );
    // The next release itself reads it.
    let (head, restored) = start_head_with(
        fresh.path(),
        &["--restore".as_ref(), next_file.as_os_str()],
        &[NEXT_RELEASE],
    )
    .await;
    let tasks = restored.list_tasks(None, None).await.unwrap();
    assert!(tasks.iter().any(|t| t.name == "in-the-backup"), "{tasks:?}");
    drop(head);
}
