//! End to end: GPUs and MIG slices on a real [`LocalCluster`] whose workers have simulated
//! GPUs (`--sim-gpu`), plus one worker that looks for real GPUs through NVML (on a machine
//! without an NVIDIA driver it finds none and starts all the same).
//!
//! Topics, in order: every `mig.1g.5gb` task sees its own slice in `CUDA_VISIBLE_DEVICES`
//! (and a pinned one sees exactly its slice); fractional `gpu` tasks share one device;
//! reconfiguring a busy GPU is refused, and with drain waits for the slice and then applies;
//! after a reconfiguration the old slice resources are gone and the new slices run tasks; an
//! illegal simulated GPU is refused at start; no driver means no GPUs.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{
    LIMIT, eventually, finished, functions, init_tracing, resource, running, status, within,
};
use escher::types::{
    GpuInfo, LogStream, MigRefusal, NodeGpus, NodeId, TaskId, TaskState, mig_identity,
};
use escher::{Client, LocalCluster, LocalClusterError, Task};
use escher_proto::mig::{GpuModel, Layout};

/// `echo` of both device variables, then a long sleep (the test cancels it).
fn show_devices_and_hold() -> Task {
    Task::command([
        "sh",
        "-c",
        "echo \"cuda=[${CUDA_VISIBLE_DEVICES-unset}] nvidia=[${NVIDIA_VISIBLE_DEVICES-unset}]\"; \
         exec sleep 30",
    ])
}

/// Starts one worker with these simulated GPUs (and the common functions, plus `devices`,
/// which returns its `visible_devices` after sleeping its argument in ms).
async fn gpu_cluster(gpus: &[&str]) -> (LocalCluster, Client, NodeId) {
    init_tracing();
    let functions = functions().typed_function("devices", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.visible_devices().to_vec())
    });
    let cluster = LocalCluster::builder()
        .functions(functions)
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus("cpu=16".parse().unwrap(), gpus.iter().copied())
        .sim_mig_latency_scale(0.01)
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    (cluster, client, node)
}

/// The node's GPUs, as the head reports them.
async fn gpus(client: &Client, node: NodeId) -> NodeGpus {
    let nodes = within("gpus", client.gpus()).await.unwrap();
    nodes
        .into_iter()
        .find(|n| n.node == node)
        .expect("the node reports GPUs")
}

/// The `cuda=[...] nvidia=[...]` line a command task printed (waits for it).
async fn printed(client: &Client, task: TaskId) -> String {
    eventually(&format!("task {task} printing"), || async {
        let out = client.logs(task, LogStream::Stdout).await.ok()?;
        let text = String::from_utf8(out).ok()?;
        text.ends_with('\n').then(|| text.trim().to_string())
    })
    .await
}

/// The one device `cuda=[X] nvidia=[X]` names, checking both variables agree.
fn device(line: &str) -> String {
    let cuda = line
        .split("cuda=[")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap();
    let nvidia = line
        .split("nvidia=[")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap();
    assert_eq!(cuda, nvidia, "{line}");
    cuda.to_string()
}

async fn cancel_all(client: &Client, tasks: &[TaskId]) {
    within("cancel", client.cancel(tasks.iter().copied()))
        .await
        .unwrap();
    for t in tasks {
        let s = finished(client, *t).await;
        assert_eq!(s.state, TaskState::Cancelled, "{s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_tasks_each_see_their_own_slice() {
    let (cluster, client, node) =
        gpu_cluster(&["a100-40gb:mig=3g.20gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb"]).await;
    let gpu = gpus(&client, node).await.gpus.remove(0).info;
    assert!(gpu.simulated && gpu.mig_enabled);
    let small: BTreeSet<String> = gpu
        .slices
        .iter()
        .filter(|s| s.profile == "1g.5gb")
        .map(|s| s.uuid.clone())
        .collect();
    assert_eq!(small.len(), 4);
    let s = status(&client).await;
    assert_eq!(
        resource(&s, node, "mig.1g.5gb").unwrap().total.to_string(),
        "4"
    );
    let labels = &s.node(node).unwrap().labels;
    assert_eq!(labels.get("gpu.model"), Some("a100-40gb"));
    assert_eq!(labels.get("gpu.simulated"), Some("true"));

    // Three unpinned tasks and one pinned to the last 1g slice.
    let pinned_uuid = gpu
        .slices
        .iter()
        .rev()
        .find(|s| s.profile == "1g.5gb")
        .unwrap()
        .uuid
        .clone();
    let pin = mig_identity(&pinned_uuid).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let t = client
            .submit(show_devices_and_hold().resources_str("cpu=1,mig.1g.5gb=1"))
            .await
            .unwrap();
        tasks.push(TaskId::from(&t));
    }
    let pinned = client
        .submit(
            show_devices_and_hold()
                .resources_str("cpu=1,mig.1g.5gb=1")
                .resource(pin.as_str(), 1),
        )
        .await
        .unwrap();
    let pinned = TaskId::from(&pinned);
    let plain = client
        .submit(show_devices_and_hold().resources_str("cpu=1"))
        .await
        .unwrap();
    let plain = TaskId::from(&plain);

    let mut seen = BTreeSet::new();
    for t in &tasks {
        running(&client, *t).await;
        let d = device(&printed(&client, *t).await);
        assert!(small.contains(&d), "{d} is not a 1g.5gb slice");
        assert!(seen.insert(d.clone()), "slice {d} given twice");
    }
    assert_eq!(device(&printed(&client, pinned).await), pinned_uuid);
    assert!(
        !seen.contains(&pinned_uuid),
        "the pinned slice was kept for its task"
    );
    // A task holding no GPU on a GPU node sees none.
    assert_eq!(printed(&client, plain).await, "cuda=[] nvidia=[none]");

    // `escher gpus` (the Gpus call) names the holder of each slice.
    let holders = eventually("four holders", || async {
        let node = gpus(&client, node).await;
        let holders = node.gpus[0].holders.clone();
        (holders.len() == 4).then_some(holders)
    })
    .await;
    let held: BTreeSet<(String, TaskId)> = holders.into_iter().map(|h| (h.uuid, h.task)).collect();
    assert!(held.contains(&(pinned_uuid.clone(), pinned)));
    assert_eq!(
        held.iter().map(|(u, _)| u.clone()).collect::<BTreeSet<_>>(),
        small
    );

    // A fifth 1g task waits for a slice.
    let fifth = client
        .submit(Task::function_typed("devices", &0u64).resources_str("mig.1g.5gb=1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client.task_info(&fifth).await.unwrap().status.state,
        TaskState::Pending
    );
    cancel_all(&client, &[tasks[0]]).await;
    let got: Vec<String> = within("fifth", client.get_typed(&fifth, None))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(small.contains(&got[0]));
    cancel_all(&client, &[tasks[1], tasks[2], pinned, plain]).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fractional_gpu_tasks_share_one_device() {
    let (cluster, client, node) = gpu_cluster(&["h100-80gb", "h100-80gb"]).await;
    let node_gpus = gpus(&client, node).await;
    let uuids: Vec<String> = node_gpus.gpus.iter().map(|g| g.info.uuid.clone()).collect();
    assert!(node_gpus.gpus.iter().all(|g| !g.info.mig_enabled));
    let s = status(&client).await;
    assert_eq!(resource(&s, node, "gpu").unwrap().total.to_string(), "2");

    // Two halves at once: both on the first GPU; a whole GPU at the same time: the second.
    let halves = client
        .submit_batch(
            (0..2).map(|_| Task::function_typed("devices", &3000u64).resources_str("gpu=0.5")),
        )
        .await
        .unwrap();
    for h in &halves {
        running(&client, h).await;
    }
    let whole = client
        .submit(Task::function_typed("devices", &0u64).resources_str("gpu=1"))
        .await
        .unwrap();
    let whole: Vec<String> = within("whole", client.get_typed(&whole, None))
        .await
        .unwrap();
    assert_eq!(whole, [uuids[1].clone()]);
    let shared = eventually("the halves on one GPU", || async {
        let g = gpus(&client, node).await;
        let holders = g.gpus[0].holders.clone();
        (holders.len() == 2).then_some(holders)
    })
    .await;
    assert!(
        shared
            .iter()
            .all(|h| h.amount.to_string() == "0.5" && h.uuid == uuids[0])
    );
    for h in &halves {
        let got: Vec<String> = within("half", client.get_typed(h, None)).await.unwrap();
        assert_eq!(got, [uuids[0].clone()]);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_gpu_is_refused_then_drained_and_rebuilt() {
    let (cluster, client, node) =
        gpu_cluster(&["a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb"]).await;
    let before = gpus(&client, node).await.gpus.remove(0).info;
    let old: Vec<String> = before.slices.iter().map(|s| s.uuid.clone()).collect();
    let holder = client
        .submit(show_devices_and_hold().resources_str("mig.3g.20gb=1"))
        .await
        .unwrap();
    let holder = TaskId::from(&holder);
    running(&client, holder).await;
    eventually("the holder's device is known", || async {
        let g = gpus(&client, node).await;
        (!g.gpus[0].holders.is_empty()).then_some(())
    })
    .await;

    // Refused while the 3g slice is held; an illegal layout is refused with the reason.
    let err = client
        .apply_mig_layout(node, 0, "7g.40gb", false)
        .await
        .unwrap_err();
    assert_eq!(err.mig_refusal(), Some(MigRefusal::Busy), "{err:?}");
    assert!(err.is_retryable(), "a busy slice frees up");
    assert!(
        err.to_string().contains("cannot be reconfigured now"),
        "{err}"
    );
    assert!(err.to_string().contains(&holder.to_string()), "{err}");
    let err = client
        .apply_mig_layout(node, 0, "4g.20gb,4g.20gb", false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at most 1 instance(s)"), "{err}");
    assert_eq!(err.mig_refusal(), Some(MigRefusal::Illegal), "{err:?}");
    let err = client
        .apply_mig_layout(node, 3, "7g.40gb", false)
        .await
        .unwrap_err();
    assert_eq!(err.mig_refusal(), Some(MigRefusal::NoSuchGpu), "{err:?}");

    // With drain: accepted at once; every slice's resources go; the held one stays held.
    let plan = client
        .apply_mig_layout(node, 0, "7g.40gb", true)
        .await
        .unwrap();
    assert_eq!(plan.waiting_for, [holder]);
    assert_eq!(plan.to, "7g.40gb@0");
    let s = status(&client).await;
    let three = resource(&s, node, "mig.3g.20gb").unwrap();
    assert_eq!(
        (three.total.to_string(), three.used.to_string()),
        ("0".into(), "1".into())
    );
    assert!(resource(&s, node, "mig.1g.5gb").is_none());
    assert!(resource(&s, node, "mig.2g.10gb").is_none());
    // Nothing new is placed on a slice being rebuilt.
    let waiter = client
        .submit(Task::function_typed("devices", &0u64).resources_str("mig.1g.5gb=1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client.task_info(&waiter).await.unwrap().status.state,
        TaskState::Pending
    );
    let g = gpus(&client, node).await;
    assert_eq!(
        g.gpus[0].reconfiguring.as_ref().unwrap().waiting_for,
        [holder]
    );
    // A second change meanwhile is refused.
    let err = client
        .apply_mig_layout(node, 0, "7g.40gb", true)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already being reconfigured"),
        "{err}"
    );
    assert_eq!(err.mig_refusal(), Some(MigRefusal::InProgress));

    // The holder ends: the change goes through.
    cancel_all(&client, &[holder]).await;
    let after = within(
        "the reconfiguration",
        client.wait_mig_layout(node, 0, Some(LIMIT)),
    )
    .await
    .unwrap();
    assert_eq!(after.info.slices.len(), 1);
    assert_eq!(after.info.slices[0].profile, "7g.40gb");
    let s = status(&client).await;
    for name in ["mig.1g.5gb", "mig.2g.10gb", "mig.3g.20gb"] {
        assert!(resource(&s, node, name).is_none(), "{name} is still there");
    }
    for uuid in &old {
        let id = mig_identity(uuid).unwrap();
        assert!(
            resource(&s, node, id.as_str()).is_none(),
            "{id} is still there"
        );
    }
    assert_eq!(
        resource(&s, node, "mig.7g.40gb").unwrap().total.to_string(),
        "1"
    );
    let info = client.task_info(&waiter).await.unwrap();
    assert_eq!(info.status.state, TaskState::Pending);
    assert!(
        info.pending_reason.is_some(),
        "no 1g slice exists any more: {info:?}"
    );
    client.cancel([&waiter]).await.unwrap();

    // The new slice runs a task, which sees it.
    let big = client
        .submit(Task::function_typed("devices", &0u64).resources_str("mig.7g.40gb=1"))
        .await
        .unwrap();
    let got: Vec<String> = within("7g task", client.get_typed(&big, None))
        .await
        .unwrap();
    assert_eq!(got, [after.info.slices[0].uuid.clone()]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_slices_schedule_tasks_after_a_reconfiguration() {
    let (cluster, client, node) = gpu_cluster(&["a100-40gb:mig=7g.40gb"]).await;
    let full = gpus(&client, node)
        .await
        .gpus
        .remove(0)
        .info
        .slices
        .remove(0);
    let seven = ["1g.5gb"; 7].join(",");
    let plan = client
        .apply_mig_layout(node, 0, seven.as_str(), false)
        .await
        .unwrap();
    assert_eq!(plan.destroy, ["7g.40gb@0"]);
    assert_eq!(plan.create.len(), 7);
    assert!(plan.waiting_for.is_empty());
    let after = within(
        "the reconfiguration",
        client.wait_mig_layout(node, 0, Some(LIMIT)),
    )
    .await
    .unwrap();
    let new: BTreeSet<String> = after.info.slices.iter().map(|s| s.uuid.clone()).collect();
    assert_eq!(new.len(), 7);
    let s = status(&client).await;
    assert!(resource(&s, node, "mig.7g.40gb").is_none());
    assert!(resource(&s, node, mig_identity(&full.uuid).unwrap().as_str()).is_none());
    assert_eq!(
        resource(&s, node, "mig.1g.5gb").unwrap().total.to_string(),
        "7"
    );
    // Seven concurrent tasks, seven different new slices.
    let tasks = client
        .submit_batch(
            (0..7).map(|_| Task::function_typed("devices", &800u64).resources_str("mig.1g.5gb=1")),
        )
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    for t in &tasks {
        let got: Vec<String> = within("1g task", client.get_typed(t, None)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert!(new.contains(&got[0]), "{} is not a new slice", got[0]);
        seen.insert(got[0].clone());
    }
    assert_eq!(seen.len(), 7, "seven tasks at once get seven slices");
    // Back to one slice, with the CLI's plan unchanged for the same layout.
    let plan = client
        .apply_mig_layout(node, 0, seven.as_str(), false)
        .await
        .unwrap();
    assert!(plan.is_unchanged());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_illegal_simulated_gpu_is_refused_at_start() {
    init_tracing();
    let start = LocalCluster::builder()
        .no_workers()
        .worker_with_gpus("cpu=1".parse().unwrap(), ["a100-40gb:mig=4g.20gb,4g.20gb"])
        .start();
    let err = within("start", start).await.unwrap_err();
    assert!(matches!(err, LocalClusterError::Worker { .. }), "{err:?}");
    let text = format!("{err}");
    assert!(
        text.contains("sim-gpu") && text.contains("at most 1 instance(s)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_driver_reports_no_gpus() {
    init_tracing();
    // Read-only discovery here: on a machine without an NVIDIA driver it finds nothing (and
    // logs one line); on a GPU machine it finds the real GPUs, which the worker must report.
    let here: Vec<GpuInfo> = escher::worker::discovery::discover().gpus;
    let cluster = LocalCluster::builder()
        .discover_gpus(true)
        .workers(1)
        .start();
    let cluster = within("starting", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    let s = status(&client).await;
    let n = s.node(node).unwrap();
    let reported = within("gpus", client.gpus()).await.unwrap();
    if here.is_empty() {
        assert!(
            n.resources
                .iter()
                .all(|r| !escher::types::is_gpu_resource(r.name.as_str())),
            "{n:?}"
        );
        assert!(n.labels.get("gpu.count").is_none());
        assert!(reported.is_empty());
        // It runs tasks as usual, and leaves their environment alone.
        let t = client
            .submit(show_devices_and_hold().resources_str("cpu=1"))
            .await
            .unwrap();
        let t = TaskId::from(&t);
        assert_eq!(printed(&client, t).await, "cuda=[unset] nvidia=[unset]");
        cancel_all(&client, &[t]).await;
    } else {
        assert_eq!(reported[0].gpus.len(), here.len());
        assert!(reported[0].gpus.iter().all(|g| !g.info.simulated));
        assert_eq!(n.labels.get("gpu.simulated"), Some("false"));
    }
    cluster.shutdown().await;
}

/// `escher-worker --detect` prints what a worker would register (simulated GPUs and their
/// slices included) and exits without a head; a bad `--sim-gpu` says what is wrong. Where a
/// real driver is present it also sets the driver's MIG table beside escher's (checked on an
/// H100 by `scripts/real-gpu-check.sh`); without one it says why there is none.
#[test]
fn the_worker_detects_without_a_head() {
    let worker = common::escher_bin().with_file_name("escher-worker");
    let run = |args: &[&str]| {
        std::process::Command::new(&worker)
            .args(args)
            .env("ESCHER_HEAD", "http://127.0.0.1:1")
            .env("RUST_LOG", "error")
            .output()
            .expect("escher-worker runs")
    };
    let out = run(&[
        "--detect",
        "--name",
        "w",
        "--sim-gpu",
        "a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let resources = text.lines().find(|l| l.starts_with("resources: ")).unwrap();
    for r in ["mig.3g.20gb=1", "mig.2g.10gb=1", "mig.1g.5gb=1", "cpu="] {
        assert!(resources.contains(r), "{r} in {text}");
    }
    assert!(text.contains("gpu.model=a100-40gb"), "{text}");
    assert!(
        text.contains("MIG on, simulated, escher's table: a100-40gb"),
        "{text}"
    );
    assert!(
        text.contains("slice 3g.20gb at start 4 (size 4), 19968 MiB"),
        "{text}"
    );
    let nvml_line = text.lines().any(|l| l.starts_with("NVML: "));
    let table = text.contains("escher's table against the driver's");
    assert!(
        nvml_line || table,
        "either no driver, said, or a driver's table: {text}"
    );

    let none = run(&["--detect", "--no-nvml"]);
    assert!(none.status.success());
    let text = String::from_utf8(none.stdout).unwrap();
    assert!(
        text.contains("gpus: none") && text.contains("NVML: not asked for"),
        "{text}"
    );

    let bad = run(&["--detect", "--sim-gpu", "a100-40gb:mig=7g.40gb,1g.5gb"]);
    assert!(!bad.status.success());
    let err = String::from_utf8(bad.stderr).unwrap();
    assert!(err.contains("--sim-gpu") && err.contains("1g.5gb"), "{err}");
}

/// `(profile@start, uuid)` of each slice of a GPU, by start.
fn slices(info: &GpuInfo) -> Vec<(String, String)> {
    let mut v: Vec<_> = info
        .slices
        .iter()
        .map(|s| (s.placement_text(), s.uuid.clone()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_change_one_at_a_time_ahead_of_a_switch_and_report_their_phases() {
    let (cluster, client, node) = gpu_cluster(&["a100-40gb:mig=3g.20gb@4"]).await;
    let a100 = |text: &str| Layout::parse(GpuModel::A100_40GB, text).unwrap();
    let three = gpus(&client, node).await.gpus[0].info.slices[0]
        .uuid
        .clone();

    // One instance created: the 3g is left alone (same UUID), the phases are the model's
    // (the cluster's simulated GPU runs it at 1/100 of the time).
    let plan = client
        .create_mig_instance(node, 0, "2g.10gb@0")
        .await
        .unwrap();
    assert_eq!(
        (plan.create.as_slice(), plan.destroy.len()),
        (&["2g.10gb@0".to_string()][..], 0)
    );
    let after = within("the create", client.wait_mig_layout(node, 0, Some(LIMIT)))
        .await
        .unwrap();
    assert!(slices(&after.info).contains(&("3g.20gb@4".into(), three.clone())));
    let report = after
        .last_reconfiguration
        .expect("the report of the create");
    assert_eq!(report.target, "2g.10gb@0,3g.20gb@4");
    assert_eq!(report.error, None);
    let model = escher::worker::scaled_latency(0.01);
    assert_eq!(
        report.phases,
        model.cost(&a100("3g.20gb@4"), &a100("2g.10gb@0,3g.20gb@4"))
    );
    assert!(report.done_ms - report.asked_ms >= report.phases.total().as_millis() as u64);

    // Typed refusals over the wire; nothing changes.
    let err = client
        .create_mig_instance(node, 0, "1g.5gb@5")
        .await
        .unwrap_err();
    assert_eq!(err.mig_refusal(), Some(MigRefusal::Overlap), "{err:?}");
    let err = client
        .destroy_mig_instance(node, 0, "1g.5gb@6", false)
        .await
        .unwrap_err();
    assert_eq!(
        err.mig_refusal(),
        Some(MigRefusal::NoSuchInstance),
        "{err:?}"
    );

    // The 3g serves; pre-initialize toward 4g@0 + 2g@4 + 1g@6: the idle 2g@0 becomes the 4g
    // while the 3g goes on.
    let serving = client
        .submit(Task::function_typed("devices", &60_000u64).resources_str("mig.3g.20gb=1"))
        .await
        .unwrap();
    let serving = TaskId::from(&serving);
    running(&client, serving).await;
    let target = "4g.20gb@0,2g.10gb@4,1g.5gb@6";
    let plan = client.prepare_mig_layout(node, 0, target).await.unwrap();
    assert_eq!(plan.to, "4g.20gb@0,3g.20gb@4");
    assert!(plan.waiting_for.is_empty());
    let prepared = within("the prepare", client.wait_mig_layout(node, 0, Some(LIMIT)))
        .await
        .unwrap();
    assert!(slices(&prepared.info).contains(&("3g.20gb@4".into(), three.clone())));
    assert_eq!(
        client.task_info(serving).await.unwrap().status.state,
        TaskState::Running,
        "the busy instance served through the prepare"
    );
    let ahead = prepared.last_reconfiguration.unwrap().phases;
    assert_eq!((ahead.destroyed, ahead.created), (1, 1));

    // The switch, once the 3g is free, does only the rest: the 3g for the 2g and the 1g.
    cancel_all(&client, &[serving]).await;
    let plan = within("the switch", async {
        loop {
            match client.apply_mig_layout(node, 0, target, false).await {
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(plan.destroy, ["3g.20gb@4"]);
    assert_eq!(plan.create, ["2g.10gb@4", "1g.5gb@6"]);
    let done = within("the switch", client.wait_mig_layout(node, 0, Some(LIMIT)))
        .await
        .unwrap();
    let switch = done.last_reconfiguration.unwrap().phases;
    let whole = model.cost(&a100("2g.10gb@0,3g.20gb@4"), &a100(target));
    assert_eq!(
        switch,
        model.cost(&a100("4g.20gb@0,3g.20gb@4"), &a100(target))
    );
    assert!(switch.total() < whole.total(), "{switch:?} vs {whole:?}");

    // And one instance destroyed by its UUID.
    let one = done
        .info
        .slices
        .iter()
        .find(|s| s.start == 6)
        .unwrap()
        .uuid
        .clone();
    let plan = client
        .destroy_mig_instance(node, 0, one, false)
        .await
        .unwrap();
    assert_eq!(plan.destroy, ["1g.5gb@6"]);
    let after = within("the destroy", client.wait_mig_layout(node, 0, Some(LIMIT)))
        .await
        .unwrap();
    assert_eq!(
        after.info.layout().unwrap().unwrap().to_string(),
        "4g.20gb@0,2g.10gb@4"
    );
    cluster.shutdown().await;
}
