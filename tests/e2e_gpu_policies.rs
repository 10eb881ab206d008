//! GPU policies end to end: MIGM (issue 13) driven on a [`LocalCluster`] whose worker has a
//! simulated A100-40GB, through the cluster API ([`escher::esl::gpu::drive`]): real MIG
//! reconfigurations by the worker (scaled latency), jobs that are real command processes
//! running `escher sim-work` on the slices they are given, typed out-of-memory failures, and
//! restarts that keep each job's task id.
//!
//! Checked: every job succeeds under its own id (the one that outgrew its first slice on a
//! second attempt, on a larger slice), the policy is done with nothing refused, every layout
//! the GPU showed is legal, and no other task was ever submitted.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::time::Duration;

use common::{init_tracing, within, within_for};
use escher::LocalCluster;
use escher::esl::gpu::migm::RestartReason;
use escher::esl::gpu::{ClusterGpu, GpuPolicy, Migm, MigmJob, Scheme, drive};
use escher::types::{TaskId, TaskSpec, TaskState};
use escher_proto::mig::{GpuModel, Layout};

/// `escher sim-work` with these flags, time compressed 100x, as a spec.
fn job(flags: &[&str]) -> TaskSpec {
    common::sim_work(flags).build().expect("a valid spec")
}

async fn run_migm(scheme: Scheme) {
    init_tracing();
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus("cpu=8".parse().unwrap(), ["a100-40gb:mig="])
        .sim_mig_latency_scale(0.01)
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    let mut gpu = within("the GPU", ClusterGpu::new(client.clone(), node, 0))
        .await
        .unwrap();
    assert_eq!(gpu.model(), GpuModel::A100_40GB);

    // (flags, MIGM's memory estimate in GB): small, medium and large jobs, and one whose
    // estimate is too low (it needs 7 GB, is told 3): it runs out of memory on its first slice.
    let jobs: [(&[&str], Option<f64>); 5] = [
        (
            &["--work", "100", "--gpcs", "1", "--mem-gb", "3"],
            Some(3.0),
        ),
        (
            &["--work", "100", "--gpcs", "1", "--mem-gb", "2"],
            Some(2.0),
        ),
        (
            &["--work", "150", "--gpcs", "2", "--mem-gb", "8"],
            Some(8.0),
        ),
        (
            &["--work", "150", "--gpcs", "3", "--mem-gb", "16"],
            Some(16.0),
        ),
        (
            &["--work", "100", "--gpcs", "1", "--mem-gb", "7"],
            Some(3.0),
        ),
    ];
    let specs = jobs.iter().map(|(flags, _)| job(flags)).collect();
    let ids = within("submit", gpu.submit(specs)).await.unwrap();
    let mut migm = Migm::new(GpuModel::A100_40GB, scheme, false);
    for (id, (_, estimate)) in ids.iter().zip(&jobs) {
        migm.submit(MigmJob {
            task: *id,
            memory_gb: *estimate,
            iterations: 10,
        });
    }

    let report = within_for(
        Duration::from_secs(60),
        "MIGM on the cluster",
        drive(&mut migm, &mut gpu, Duration::from_secs(50)),
    )
    .await
    .unwrap();
    assert!(
        report.finished_at.is_some(),
        "{}: not done: {report:?}",
        migm.name()
    );
    assert!(report.refused.is_empty(), "{:?}", report.refused);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.reconfigurations >= 1);
    // Every layout the GPU showed is legal (read back by the MIG model) and several were seen.
    assert!(report.layouts.len() >= 2, "{:?}", report.layouts);
    for (_, layout) in &report.layouts {
        assert_eq!(
            Layout::parse(GpuModel::A100_40GB, &layout.to_string()).as_ref(),
            Ok(layout)
        );
    }

    // Every job succeeded under its own id; the one that ran out of memory did so on its
    // second attempt, after MIGM restarted it on a larger class.
    for (i, id) in ids.iter().enumerate() {
        let info = within("info", client.task_info(*id)).await.unwrap();
        assert_eq!(
            info.status.state,
            TaskState::Succeeded,
            "job {i}: {:?}",
            info.status
        );
        if i == 4 {
            assert_eq!(info.status.attempt, 2, "{:?}", info.attempts);
            let first = info.attempts[0].ended.clone().unwrap_or_default();
            assert!(first.contains("out of GPU memory"), "{first}");
        } else {
            assert_eq!(info.status.attempt, 1, "job {i}: {:?}", info.attempts);
        }
    }
    let restarts = migm.restarts();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(
        (restarts[0].task, restarts[0].reason),
        (ids[4], RestartReason::OutOfMemory)
    );
    // Nothing but the five jobs was ever submitted.
    let all = within("list", client.list_tasks(None, None)).await.unwrap();
    let mut listed: Vec<TaskId> = all.iter().map(|t| t.id).collect();
    listed.sort();
    assert_eq!(listed, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migm_scheme_b_runs_jobs_on_right_sized_slices_of_a_cluster_gpu() {
    run_migm(Scheme::Fifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migm_scheme_a_runs_jobs_on_right_sized_slices_of_a_cluster_gpu() {
    run_migm(Scheme::BySize).await;
}
