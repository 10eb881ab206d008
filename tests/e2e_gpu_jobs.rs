//! GPU jobs end to end on a [`LocalCluster`] whose worker has a simulated A100 (`--sim-gpu`):
//! tasks run `escher sim-work` (the simulated GPU's job: time by the speed model, memory,
//! telemetry) as real command processes on real MIG slice resources.
//!
//! Topics: running out of a slice's memory is a typed failure (`OutOfMemory { used, limit }`),
//! from the simulated GPU and from any command through its outcome file; a requeue runs a
//! running task again under its id on a larger slice (its first attempt stopped first), a
//! failed one (out of memory) as its next attempt, and a pending one at once; what a requeue
//! refuses.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::time::Duration;

use common::{eventually, finished, init_tracing, running, sim_work, within};
use escher::types::{NodeId, TaskResult, TaskState};
use escher::{Client, ClientError, LocalCluster, Task};

/// One worker with an A100-40GB split into a 1g.5gb (4864 MiB) and a 2g.10gb (9856 MiB) slice,
/// plus CPUs.
async fn gpu_cluster() -> (LocalCluster, Client, NodeId) {
    init_tracing();
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus("cpu=8".parse().unwrap(), ["a100-40gb:mig=2g.10gb,1g.5gb"])
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    (cluster, client, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_memory_is_a_typed_failure() {
    let (_cluster, client, _node) = gpu_cluster().await;
    // 6 GB on a 1g.5gb slice: out of memory at the first iteration.
    let task = sim_work(&["--work", "2", "--mem-gb", "6"]).resources_str("mig.1g.5gb=1");
    let id = within("submit", client.submit(task)).await.unwrap().id();
    let status = finished(&client, id).await;
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert_eq!(
        status.result,
        Some(TaskResult::OutOfMemory {
            used_mib: 6144,
            limit_mib: 4864
        })
    );
    let reason = status.reason.clone().unwrap_or_default();
    assert!(reason.contains("out of GPU memory"), "{reason}");
    let err = within("get_result", client.get_result(id, None))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("out of GPU memory"), "{err}");

    // The same job fits the 2g.10gb slice and reports its memory as telemetry.
    let task = sim_work(&["--work", "2", "--mem-gb", "6", "--iterations", "4"])
        .resources_str("mig.2g.10gb=1");
    let id = within("submit", client.submit(task)).await.unwrap().id();
    let status = finished(&client, id).await;
    assert_eq!(
        status.result,
        Some(TaskResult::Exited { code: 0 }),
        "{status:?}"
    );
    let reported = within("telemetry", client.telemetry([id], None))
        .await
        .unwrap();
    let mem: Vec<f64> = reported[0]
        .samples
        .iter()
        .filter(|s| s.key == "mem_requested_gb")
        .map(|s| s.value)
        .collect();
    assert_eq!(mem, [6.0; 4]);

    // Any command states it through its outcome file; a file that states nothing known leaves
    // the exit code.
    let oom = Task::command([
        "sh",
        "-c",
        "echo 'out_of_memory used_mib=12288 limit_mib=9856' > \"$ESCHER_OUTCOME_FILE\"; exit 1",
    ])
    .resources_str("cpu=1");
    let other = Task::command([
        "sh",
        "-c",
        "echo segfault > \"$ESCHER_OUTCOME_FILE\"; exit 7",
    ])
    .resources_str("cpu=1");
    let ok = Task::command([
        "sh",
        "-c",
        "echo 'out_of_memory used_mib=1 limit_mib=1' > \"$ESCHER_OUTCOME_FILE\"; exit 0",
    ])
    .resources_str("cpu=1");
    let ids: Vec<_> = within("submit", client.submit_batch([oom, other, ok]))
        .await
        .unwrap()
        .iter()
        .map(|t| t.id())
        .collect();
    let results: Vec<_> = futures_results(&client, &ids).await;
    assert_eq!(
        results,
        [
            Some(TaskResult::OutOfMemory {
                used_mib: 12288,
                limit_mib: 9856
            }),
            Some(TaskResult::Exited { code: 7 }),
            Some(TaskResult::Exited { code: 0 }),
        ]
    );
}

async fn futures_results(
    client: &Client,
    ids: &[escher::types::TaskId],
) -> Vec<Option<TaskResult>> {
    let mut out = Vec::new();
    for id in ids {
        out.push(finished(client, *id).await.result);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_moves_a_running_task_to_a_larger_slice_under_its_id() {
    let (_cluster, client, _node) = gpu_cluster().await;
    // A 2-GPC job: 150 simulated s take 300 on the 1g slice (3 s of wall time at 0.01), 150 on
    // the 2g one. Its memory fits both, so nothing but the requeue ends the first attempt (as
    // MIGM's early restart does, before the out-of-memory its predictor sees coming).
    let job = &["--work", "150", "--gpcs", "2", "--mem-gb", "3"];
    let id = within(
        "submit",
        client.submit(sim_work(job).resources_str("mig.1g.5gb=1").max_retries(0)),
    )
    .await
    .unwrap()
    .id();
    running(&client, id).await;
    // The first samples are in: it has started its iterations.
    eventually("first telemetry", || async {
        let t = client.telemetry([id], None).await.ok()?;
        (!t.first()?.samples.is_empty()).then_some(())
    })
    .await;
    let after = within(
        "requeue",
        client.requeue(id, "mig.2g.10gb=1".parse().unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(after.id, id);
    let status = finished(&client, id).await;
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.attempt, 2);
    let info = within("info", client.task_info(id)).await.unwrap();
    assert_eq!(info.spec.resources.to_string(), "mig.2g.10gb=1");
    assert_eq!(info.attempts.len(), 2, "{:?}", info.attempts);
    let first = info.attempts[0].ended.clone().unwrap_or_default();
    assert!(first.contains("requeued with mig.2g.10gb=1"), "{first}");
    // The second attempt ran on the larger slice: its log says so.
    let log = within("logs", client.logs(id, escher::types::LogStream::Stdout))
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(log.contains("on 2g.10gb of a100-40gb"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ran_out_of_memory_is_reopened_on_a_larger_slice() {
    let (_cluster, client, _node) = gpu_cluster().await;
    // No retries: the out-of-memory attempt fails the task, and the policy (here, the test)
    // alone decides where it runs again: MIGM's restart on the next larger slice.
    let task = sim_work(&["--work", "2", "--mem-gb", "6"]).resources_str("mig.1g.5gb=1");
    let id = within("submit", client.submit(task)).await.unwrap().id();
    let failed = finished(&client, id).await;
    assert!(
        matches!(failed.result, Some(TaskResult::OutOfMemory { .. })),
        "{failed:?}"
    );
    let reopened = within(
        "requeue",
        client.requeue(id, "mig.2g.10gb=1".parse().unwrap()),
    )
    .await
    .unwrap();
    assert!(!reopened.state.is_terminal(), "{reopened:?}");
    let status = finished(&client, id).await;
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.result, Some(TaskResult::Exited { code: 0 }));
    assert_eq!(status.attempt, 2);
    let info = within("info", client.task_info(id)).await.unwrap();
    let first = info.attempts[0].ended.clone().unwrap_or_default();
    assert!(
        first.contains("out of GPU memory (6144 MiB needed, 4864 MiB"),
        "{first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_that_cannot_be_done_says_why_and_changes_nothing() {
    let (_cluster, client, _node) = gpu_cluster().await;
    // A pending task (no 3g slice on this GPU) takes its new request at once.
    let waiting = sim_work(&["--work", "1", "--mem-gb", "1"]).resources_str("mig.3g.20gb=1");
    let id = within("submit", client.submit(waiting)).await.unwrap().id();
    let pending = within("info", client.task_info(id)).await.unwrap();
    assert_eq!(pending.status.state, TaskState::Pending);
    within(
        "requeue",
        client.requeue(id, "mig.1g.5gb=1".parse().unwrap()),
    )
    .await
    .unwrap();
    let status = finished(&client, id).await;
    assert_eq!(status.state, TaskState::Succeeded, "{status:?}");
    assert_eq!(status.attempt, 1, "nothing ran before: {status:?}");

    // Finished: refused, and it stays as it was.
    let err = within(
        "requeue",
        client.requeue(id, "mig.2g.10gb=1".parse().unwrap()),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("has ended (succeeded)") && text.contains("submit a new task"),
        "{text}"
    );
    let info = within("info", client.task_info(id)).await.unwrap();
    assert_eq!(info.spec.resources.to_string(), "mig.1g.5gb=1");
    assert_eq!(info.status.state, TaskState::Succeeded);

    // Unknown: not found.
    let err = within(
        "requeue",
        client.requeue(escher::types::TaskId(987_654), "cpu=1".parse().unwrap()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
}
