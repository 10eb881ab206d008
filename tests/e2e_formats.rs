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
use procs::{WAIT, binary, eventually};

/// A head started on a copy of a fixture; killed when dropped.
struct Head {
    child: Child,
    _dir: tempfile::TempDir,
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
    let access = dir.path().join("access.json");
    // git keeps no file modes: the access file must be private again.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&access, std::fs::Permissions::from_mode(0o600)).unwrap();
    let address = dir.path().join("address");
    let child = Command::new(binary("escher-head"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--address-file")
        .arg(&address)
        .arg("--access-file")
        .arg(&access)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--heartbeat-timeout-ms")
        .arg("600000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = eventually("the head to write its address", WAIT, || {
        let text = std::fs::read_to_string(&address).ok();
        async move { text.filter(|t| !t.trim().is_empty()) }
    })
    .await;
    let url = match url.trim() {
        u if u.starts_with("http") => u.to_string(),
        u => format!("http://{u}"),
    };
    let file = escher::access::AccessFile::read(&access).unwrap();
    let client = eventually("the head to answer", WAIT, || {
        let (url, token) = (url.clone(), file.admin_token.clone());
        async move {
            let client = Client::connect(&url).await.ok()?.with_token(token);
            client.cluster_status().await.ok()?;
            Some(client)
        }
    })
    .await;
    let head = Head { child, _dir: dir };
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
