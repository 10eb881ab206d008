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

/// Starts `escher-head` on a copy of fixture `name` (its data directory and access file).
async fn head_on(name: &str) -> (Head, Client) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, dir.path());
    let (mut head, client) = start_head(dir.path(), &[]).await;
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
        .args(extra);
    command
}

/// Starts `escher-head` on `dir` (see [`head_command`]) and a client of it.
async fn start_head(dir: &Path, extra: &[&std::ffi::OsStr]) -> (Head, Client) {
    let access = dir.join("access.json");
    let address = dir.join("address");
    let _ = std::fs::remove_file(&address);
    let child = head_command(dir, extra)
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
    let (head, client) = head_on("data-format-1").await;

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
