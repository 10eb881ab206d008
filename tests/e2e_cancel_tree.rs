//! Recursive and forced cancels end to end, with real `escher-head` and `escher-worker`
//! processes (`procs/mod.rs`): a command task submits children with the real CLI and the
//! credential its worker gave it, so the head records it as their parent (`escher info` shows
//! it); a recursive cancel of the parent ends the children with it, also after the leader of a
//! three-replica head was SIGKILLed (the parents are replicated state); a plain one leaves them
//! running; a forced cancel kills a command that traps SIGTERM without the worker's grace.

mod common;
mod procs;

use escher::types::{LogStream, TaskId, TaskState};
use escher::{CancelOptions, Client, Task};
use procs::{ProcessCluster, WAIT, eventually};

/// A command task that submits `n` children (`sleep 600`, named `child`) with the CLI, as
/// itself, then sleeps.
fn parent(n: usize) -> Task {
    let submit = r#""$ESCHER_BIN" submit --name child -r cpu=1 -- sleep 600"#;
    let script = format!("{} && exec sleep 600", vec![submit; n].join(" && "));
    Task::command(["sh", "-c", script.as_str()])
        .env("ESCHER_BIN", common::escher_bin().display().to_string())
        .resources_str("cpu=1")
}

/// Waits until `n` children of `parent` run (the ids after it: nothing else submits); their
/// ids.
async fn running_children(client: &Client, parent: TaskId, n: usize) -> Vec<TaskId> {
    let ids: Vec<TaskId> = (1..=n as u64).map(|i| TaskId(parent.0 + i)).collect();
    for id in &ids {
        let info = eventually("a child to run", WAIT, || async {
            let info = client.task_info(*id).await.ok()?;
            (info.status.state == TaskState::Running).then_some(info)
        })
        .await;
        assert_eq!(info.spec.name, "child");
        assert_eq!(info.parent, Some(parent), "{info:?}");
    }
    ids
}

/// The CLI's output, run as the cluster's administrator (each replica's address given: it
/// finds the leader).
fn escher_cli(cluster: &ProcessCluster, args: &[&str]) -> String {
    let out = std::process::Command::new(common::escher_bin())
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_TASK_TOKEN")
        .env("ESCHER_ACCESS_FILE", cluster.access_file())
        .args(["--head", cluster.head_url()])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "escher {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn state_of(client: &Client, id: TaskId) -> TaskState {
    client.task_info(id).await.unwrap().status.state
}

async fn ended(client: &Client, id: TaskId) -> TaskState {
    eventually("the task to end", WAIT, || async {
        let state = state_of(client, id).await;
        state.is_terminal().then_some(state)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_cancel_ends_the_children_also_after_a_leader_kill() {
    let mut cluster = ProcessCluster::builder()
        .heads(3)
        .workers(1)
        .resources("cpu=8")
        .heartbeat_timeout_ms(20_000)
        .start()
        .await;
    let leader = cluster.wait_leader().await;
    let client = cluster.client().await;
    let root = client.submit(parent(2)).await.unwrap().id();
    let kids = running_children(&client, root, 2).await;
    assert_eq!(client.task_info(root).await.unwrap().parent, None);

    // The parents are replicated: the next leader knows them.
    cluster.kill_head_at(leader);
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);
    for kid in &kids {
        let info = eventually("the new leader to answer", WAIT, || async {
            client.task_info(*kid).await.ok()
        })
        .await;
        assert_eq!(info.parent, Some(root), "{info:?}");
    }
    // `escher info` names it.
    let text = escher_cli(&cluster, &["info", &kids[0].to_string()]);
    assert!(text.contains(&format!("task {root}")), "{text}");

    let after = client
        .cancel_with([root], CancelOptions::recursive())
        .await
        .unwrap();
    assert_eq!(after.len(), 1, "only the named task's status: {after:?}");
    assert_eq!(ended(&client, root).await, TaskState::Cancelled);
    for kid in kids {
        assert_eq!(
            ended(&client, kid).await,
            TaskState::Cancelled,
            "task {kid}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_cancel_leaves_the_children_and_force_skips_the_grace() {
    let cluster = ProcessCluster::builder()
        .workers(1)
        .resources("cpu=8")
        .start()
        .await;
    let client = cluster.client().await;

    // Not recursive (the Rust client's default): the children run on.
    let root = client.submit(parent(1)).await.unwrap().id();
    let kids = running_children(&client, root, 1).await;
    client.cancel([root]).await.unwrap();
    assert_eq!(ended(&client, root).await, TaskState::Cancelled);
    assert_eq!(state_of(&client, kids[0]).await, TaskState::Running);
    client.cancel(kids.clone()).await.unwrap();
    assert_eq!(ended(&client, kids[0]).await, TaskState::Cancelled);

    // A command that traps SIGTERM and goes on: a plain cancel gives it SIGTERM (it says so)
    // and SIGKILL after the worker's grace (one second here); a forced one SIGKILL at once,
    // so it never sees SIGTERM.
    let traps = || {
        Task::command([
            "sh",
            "-c",
            "trap 'echo got TERM' TERM; echo up; while :; do sleep 0.05; done",
        ])
        .resources_str("cpu=1")
    };
    for force in [false, true] {
        let id = client.submit(traps()).await.unwrap().id();
        eventually("the command to be up", WAIT, || async {
            let out = client.logs(id, LogStream::Stdout).await.ok()?;
            String::from_utf8_lossy(&out).contains("up").then_some(())
        })
        .await;
        let options = CancelOptions::default().force(force);
        client.cancel_with([id], options).await.unwrap();
        assert_eq!(ended(&client, id).await, TaskState::Cancelled);
        let out = client.logs(id, LogStream::Stdout).await.unwrap();
        let out = String::from_utf8_lossy(&out);
        assert_eq!(out.contains("got TERM"), !force, "force {force}: {out:?}");
    }
}
