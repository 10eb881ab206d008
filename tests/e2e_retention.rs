//! Retention end to end: a head that keeps only a few finished tasks answers for the evicted
//! ones with their tombstone through every call (`get`, `wait`, `info`, `logs`, `cancel`) and
//! through the `escher` CLI, never with "unknown task". That a `wait` keeps the full answer of
//! a task evicted while it waited is tested on the head's waiters directly (the order of the
//! two calls cannot be forced from outside). The memory side (300,000 tasks through a real
//! `escher-head` process) is `benches/tests/retention.rs`.

mod common;

use std::process::Command;

use common::{cluster, escher_bin, within};
use escher::types::{LogStream, TaskId, TaskState};
use escher::{ClientError, Task};
use escher_core::state::RetentionPolicy;
use escher_head::HeadConfig;

/// A head that keeps the record of `finished` finished tasks and the tombstones of `tombstones`.
fn keeping(finished: usize, tombstones: usize) -> HeadConfig {
    let mut config = HeadConfig::default();
    config.state.retention = RetentionPolicy {
        finished,
        tombstones,
        ..RetentionPolicy::default()
    };
    config
}

/// Runs `n` quick tasks to the end, one after another, pushing older ones out.
async fn churn(client: &escher::Client, n: usize) {
    for _ in 0..n {
        let t = client
            .submit(Task::function_typed("noop", &()))
            .await
            .unwrap();
        within("a quick task", client.get(&t, None)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_tasks_answer_with_their_tombstone_everywhere() {
    let cluster = within(
        "start",
        cluster().workers(1).head_config(keeping(2, 3)).start(),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();

    let old = client
        .submit(Task::command(["sh", "-c", "echo hello; exit 0"]))
        .await
        .unwrap();
    let done = within("old", client.get(&old, None)).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    let finished_at = done.finished_at_ms.expect("a finished task says when");
    assert!(!done.evicted);
    churn(&client, 3).await;

    // get: a typed error that says how and when it ended.
    let err = client.get(&old, None).await.unwrap_err();
    let ClientError::Evicted(evicted) = &err else {
        panic!("expected Evicted, got {err:?}");
    };
    assert_eq!(evicted.id, old.id());
    let tombstone = evicted.tombstone.expect("the tombstone is still kept");
    assert_eq!(tombstone.state, TaskState::Succeeded);
    assert_eq!(tombstone.finished_at_ms, finished_at);
    let text = err.to_string();
    assert!(
        text.contains("evicted by retention (succeeded at") && !text.contains("unknown"),
        "{text}"
    );
    // wait: ready, in its final state, marked evicted.
    let (ready, not_ready) = client.wait([old.id()], 1, None).await.unwrap();
    assert!(not_ready.is_empty());
    assert!(ready[0].evicted && ready[0].state == TaskState::Succeeded);
    assert_eq!(ready[0].finished_at_ms, Some(finished_at));
    // info and logs: the same typed error.
    for err in [
        client.task_info(&old).await.unwrap_err(),
        client.logs(&old, LogStream::Stdout).await.unwrap_err(),
    ] {
        assert!(
            matches!(err, ClientError::Evicted(e) if e.id == old.id()),
            "{err:?}"
        );
    }
    // cancel: nothing to do, its status from the tombstone.
    let after = client.cancel([old.id()]).await.unwrap();
    assert!(after[0].evicted && after[0].state == TaskState::Succeeded);

    // The CLI: a clear message and a failing exit status.
    let bin = escher_bin();
    for args in [vec!["get"], vec!["info"], vec!["logs"]] {
        let out = Command::new(&bin)
            .args(["--head", cluster.head_url()])
            .env("ESCHER_TOKEN", cluster.admin_token())
            .args(&args)
            .arg(old.id().to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "task {} was evicted by retention (succeeded at",
                old.id()
            )),
            "{args:?}: {stderr}"
        );
    }
    let out = Command::new(&bin)
        .args(["--head", cluster.head_url(), "wait"])
        .env("ESCHER_TOKEN", cluster.admin_token())
        .arg(old.id().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("evicted by retention (finished"),
        "{stdout}"
    );

    // Once its tombstone is gone too, the id still answers "evicted", never "unknown".
    churn(&client, 4).await;
    let err = client.get(&old, None).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Evicted(e) if e.tombstone.is_none()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("its record is no longer kept"),
        "{err}"
    );
    let err = client.get(TaskId(1_000_000), None).await.unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    cluster.shutdown().await;
}
