//! A worker with simulated GPUs against a fake head: what it registers, the devices it reports
//! for each task (`TaskDevices` before `TaskStarted`), tasks that wait for a device or can
//! never get one, GPU figures in heartbeats, and MIG reconfiguration (waiting for busy slices,
//! `GpusChanged { done }`, refusals).

mod support;

use std::time::Duration;

use escher_proto::mig::{GpuModel, Layout};
use escher_proto::types::{Assignment, HeadMessage, MigDone, RegisterRequest, WorkerMessage};
use escher_proto::{ResourceSet, TaskId, TaskKind, TaskSpec};
use escher_worker::scaled_latency;
use support::{FakeHead, RunningWorker, attached, spec, worker};

const HEARTBEAT: Duration = Duration::from_millis(100);

fn assign(task: u64, resources: &str) -> HeadMessage {
    let spec = TaskSpec {
        resources: resources.parse().unwrap(),
        ..spec(TaskKind::Ghost {
            creates: vec![],
            ttl: None,
        })
    };
    HeadMessage::Assign(Assignment {
        task_id: TaskId(task),
        attempt: 1,
        allocation: spec.resources.clone(),
        spec,
        task_token: format!("escher-task-{task}"),
        objects: Vec::new(),
    })
}

fn cancel(task: u64) -> HeadMessage {
    HeadMessage::CancelTask {
        task_id: TaskId(task),
        attempt: 1,
        reason: "test".into(),
        force: false,
    }
}

/// The next report must be `TaskDevices` for `task`; returns the device UUIDs.
async fn devices(head: &mut FakeHead, task: u64) -> Vec<String> {
    match head.report().await {
        WorkerMessage::TaskDevices {
            task_id, devices, ..
        } => {
            assert_eq!(task_id, TaskId(task));
            devices.into_iter().map(|d| d.uuid).collect()
        }
        other => panic!("expected TaskDevices for {task}, got {other:?}"),
    }
}

async fn started(head: &mut FakeHead, task: u64) {
    match head.report().await {
        WorkerMessage::TaskStarted { task_id, .. } => assert_eq!(task_id, TaskId(task)),
        other => panic!("expected TaskStarted for {task}, got {other:?}"),
    }
}

async fn finished(head: &mut FakeHead, task: u64) -> Result<(), String> {
    match head.report().await {
        WorkerMessage::TaskFinished(f) => {
            assert_eq!(f.task_id, TaskId(task), "{f:?}");
            f.outcome.map(|_| ())
        }
        other => panic!("expected TaskFinished for {task}, got {other:?}"),
    }
}

/// A worker with a simulated A100 (a 1g and a 3g slice) and a whole H100, attached to a fake
/// head; its registration.
async fn a100_and_h100() -> (FakeHead, RunningWorker, RegisterRequest) {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let builder = worker(&head)
        .discover_gpus(false)
        .sim_gpu("a100-40gb:mig=1g.5gb@0,3g.20gb@4")
        .sim_gpu("h100-80gb")
        .sim_mig_latency(scaled_latency(0.0));
    let w = RunningWorker::start(builder);
    let (reg, _) = attached(&mut head).await;
    (head, w, reg)
}

#[tokio::test]
async fn registers_its_gpus_and_reports_devices_per_task() {
    let (mut head, w, reg) = a100_and_h100().await;
    assert_eq!(reg.gpus.len(), 2);
    assert_eq!(reg.resources.get("mig.1g.5gb").to_string(), "1");
    assert_eq!(reg.resources.get("gpu").to_string(), "1");
    assert_eq!(reg.labels.get("gpu.count"), Some("2"));
    let slice = reg.gpus[0].slices[0].uuid.clone();
    let h100 = reg.gpus[1].uuid.clone();

    // A slice, and half a GPU.
    head.send(assign(1, "mig.1g.5gb=1"));
    assert_eq!(devices(&mut head, 1).await, std::slice::from_ref(&slice));
    started(&mut head, 1).await;
    head.send(assign(2, "gpu=0.5"));
    assert_eq!(devices(&mut head, 2).await, std::slice::from_ref(&h100));
    started(&mut head, 2).await;
    // Heartbeats carry the simulated GPUs' figures: 1 of 7 GPCs, half of the H100.
    let metrics = loop {
        if let (_, WorkerMessage::Heartbeat { metrics, .. }) = head.message().await {
            break metrics;
        }
    };
    let value = |name: &str| metrics.iter().find(|m| m.name == name).map(|m| m.value);
    assert_eq!(value("gpu.0.utilization"), Some(14.0));
    assert_eq!(value("gpu.1.utilization"), Some(50.0));
    assert_eq!(value("gpu.1.memory_used_mib"), Some(40960.0));

    // A task that can never get its devices here ends at once, unstarted.
    head.send(assign(3, "mig.2g.10gb=1"));
    let why = finished(&mut head, 3).await.unwrap_err();
    assert!(
        why.contains("cannot give this task its GPU devices"),
        "{why}"
    );
    // One that must wait for the slice starts when it is free.
    head.send(assign(4, "mig.1g.5gb=1"));
    assert!(head.quiet_for(Duration::from_millis(300)).await.is_none());
    head.send(cancel(1));
    finished(&mut head, 1).await.unwrap();
    assert_eq!(devices(&mut head, 4).await, std::slice::from_ref(&slice));
    started(&mut head, 4).await;
    // A task waiting for a device can be cancelled.
    head.send(assign(5, "mig.1g.5gb=1"));
    head.send(cancel(5));
    let why = finished(&mut head, 5).await.unwrap_err();
    assert!(why.contains("cancelled while waiting"), "{why}");
    head.send(cancel(2));
    finished(&mut head, 2).await.unwrap();
    head.send(cancel(4));
    finished(&mut head, 4).await.unwrap();
    w.stop().await.unwrap();
}

/// Resource names travel once per stream, by number after: the devices a task gets come from
/// the names its numbers stand for, and a new stream starts a new table (the worker's table
/// must start over with the head's, or a number would name another stream's resource).
#[tokio::test]
async fn numbered_resource_names_name_the_right_devices_on_each_stream() {
    let (mut head, w, reg) = a100_and_h100().await;
    let slice = reg.gpus[0].slices[0].uuid.clone();
    let h100 = reg.gpus[1].uuid.clone();

    // Number 0 is the 1g slice on this stream: the first task sends the name, the second only
    // its number, and both get the slice.
    head.send(assign(1, "mig.1g.5gb=1"));
    assert_eq!(head.names_sent(), 1);
    assert_eq!(devices(&mut head, 1).await, std::slice::from_ref(&slice));
    started(&mut head, 1).await;
    head.send(cancel(1));
    finished(&mut head, 1).await.unwrap();
    head.send(assign(2, "mig.1g.5gb=1"));
    assert_eq!(head.names_sent(), 1, "a name is sent once per stream");
    assert_eq!(devices(&mut head, 2).await, std::slice::from_ref(&slice));
    started(&mut head, 2).await;

    // On the next stream number 0 is `gpu`: the task gets half of the H100, not a slice.
    head.drop_stream();
    attached(&mut head).await;
    assert_eq!(head.names_sent(), 0);
    head.send(assign(3, "gpu=0.5"));
    assert_eq!(head.names_sent(), 1);
    assert_eq!(devices(&mut head, 3).await, std::slice::from_ref(&h100));
    started(&mut head, 3).await;
    for task in [2, 3] {
        head.send(cancel(task));
        finished(&mut head, task).await.unwrap();
    }
    w.stop().await.unwrap();
}

#[tokio::test]
async fn reconfigures_once_its_slices_are_free() {
    let mut head = FakeHead::start(HEARTBEAT).await;
    let builder = worker(&head)
        .discover_gpus(false)
        .sim_gpu("a100-40gb:mig=1g.5gb@0,3g.20gb@4")
        .sim_mig_latency(scaled_latency(0.001));
    let w = RunningWorker::start(builder);
    let (reg, _) = attached(&mut head).await;
    let kept = reg.gpus[0].slices[0].uuid.clone();
    head.send(assign(1, "mig.3g.20gb=1"));
    devices(&mut head, 1).await;
    started(&mut head, 1).await;

    // Illegal, or for a GPU it does not have: refused at once.
    head.send(HeadMessage::ReconfigureMig {
        gpu: 0,
        layout: "4g.20gb@4".into(),
    });
    match head.report().await {
        WorkerMessage::GpusChanged {
            done: Some(MigDone { gpu: 0, error, .. }),
            ..
        } => assert!(error.unwrap().contains("not a legal start"), "refused"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    head.send(HeadMessage::ReconfigureMig {
        gpu: 9,
        layout: "7g.40gb@0".into(),
    });
    assert!(matches!(
        head.report().await,
        WorkerMessage::GpusChanged {
            done: Some(MigDone {
                gpu: 9,
                error: Some(_),
                ..
            }),
            ..
        }
    ));

    // Replace the busy 3g by 2g + 2 x 1g: nothing happens until task 1 ends.
    head.send(HeadMessage::ReconfigureMig {
        gpu: 0,
        layout: "1g.5gb@0,2g.10gb@4,1g.5gb@6,1g.5gb@2".into(),
    });
    assert!(head.quiet_for(Duration::from_millis(300)).await.is_none());
    // Nothing new goes to the retiring slice meanwhile.
    head.send(assign(2, "mig.3g.20gb=1"));
    let why = finished(&mut head, 2).await.unwrap_err();
    assert!(
        why.contains("usable") || why.contains("reconfigured"),
        "{why}"
    );
    head.send(cancel(1));
    finished(&mut head, 1).await.unwrap();
    let (gpus, phases) = match head.report().await {
        WorkerMessage::GpusChanged {
            gpus,
            done:
                Some(MigDone {
                    gpu: 0,
                    error: None,
                    phases,
                }),
        } => (gpus, phases),
        other => panic!("expected the reconfiguration's end, got {other:?}"),
    };
    let layout = gpus[0].layout().unwrap().unwrap();
    assert_eq!(layout.to_string(), "1g.5gb@0,1g.5gb@2,2g.10gb@4,1g.5gb@6");
    // What each phase took: the simulated GPU's model (at the test's scale), phase by phase.
    let from = Layout::parse(GpuModel::A100_40GB, "1g.5gb@0,3g.20gb@4").unwrap();
    assert_eq!(*phases, scaled_latency(0.001).cost(&from, &layout));
    assert_eq!((phases.destroyed, phases.created), (1, 3));
    assert_eq!(
        gpus[0].slices[0].uuid, kept,
        "the kept slice keeps its UUID"
    );
    // The new slices take tasks, and a later registration carries them.
    head.send(assign(3, "mig.2g.10gb=1"));
    assert_eq!(
        devices(&mut head, 3).await,
        [gpus[0].slices[2].uuid.clone()]
    );
    started(&mut head, 3).await;
    head.drop_stream();
    let (reg, _) = attached(&mut head).await;
    assert_eq!(reg.gpus, gpus);
    let expected: ResourceSet = "mig.1g.5gb=3,mig.2g.10gb=1".parse().unwrap();
    for (name, amount) in expected.iter() {
        assert_eq!(reg.resources.get(name.as_str()), amount, "{name}");
    }
    assert!(reg.resources.get("mig.3g.20gb").is_zero());
    head.send(cancel(3));
    finished(&mut head, 3).await.unwrap();
    w.stop().await.unwrap();
}
