//! Slices made on demand on a real cluster: `escher_gpu::partition::cluster::ClusterFleet`
//! (the partitioning policy through the cluster API) against an `escher-head` process and an
//! `escher-worker` process whose GPUs are the worker's simulated NVML devices (`--sim-gpu`: an
//! H100-80GB and an A100-40GB, both in MIG mode with no slice at start; reconfigurations with
//! the worker's latency model, scaled). Jobs are real command tasks running `escher sim-work`
//! on the slice they are given.
//!
//! Checked: a task asking `mig.2g.20gb=1` (a profile only the H100 has, and no slice offers)
//! gets a slice made on the H100 and runs on it; a second one while the first runs gets a
//! second slice, the busy one left in every layout asked for; once both are done, a third
//! reuses an idle slice with no reconfiguration; a gang of two slices lands on one GPU, and so
//! do the two slices one task asks for (it holds both while it runs); a new
//! driver (the policy restarted) adopts the GPUs as they are: the slice a running task holds is
//! busy to it, an idle one is reused at once, and a task the old driver had queued is adopted
//! and runs. Bad input (no MIG ask, more slices or profiles than one GPU can hold, a profile no GPU
//! has, a gang no GPU can hold) is refused with a reason and submits nothing.

mod common;
mod procs;

use std::time::Duration;

use escher::Client;
use escher::types::{TaskId, TaskSpec, TaskState};
use escher_gpu::partition::SubmitError;
use escher_gpu::partition::cluster::{ClusterFleet, FleetError};
use procs::{ProcessCluster, WorkerExtra};

/// A sim-work job of `work` simulated seconds on 2 GPCs (100x compressed) asking `ask`.
fn job(work: &str, ask: &str) -> TaskSpec {
    common::sim_work(&[
        "--work",
        work,
        "--gpcs",
        "2",
        "--mem-gb",
        "4",
        "--iterations",
        "4",
    ])
    .resources_str(ask)
    .build()
    .expect("a valid spec")
}

/// A head and one worker, `w1` (`cpu=8`), whose simulated GPUs are `gpus` (`--sim-gpu`'s
/// texts), reconfiguring at 0.05 of MIGRator's latencies, with `env` in its environment; a
/// client.
async fn cluster_with_gpus(gpus: &[&str], env: Vec<(String, String)>) -> (ProcessCluster, Client) {
    // A node lost after 3 s of silence, not the harness's 1.2 s: on a loaded CI machine the
    // head's renewals paused 0.4 s, the worker's 0.6 s lease ran out and the fence killed the
    // task under test.
    let mut cluster = ProcessCluster::builder()
        .workers(0)
        .heartbeat_timeout_ms(3_000)
        .start()
        .await;
    let mut args: Vec<String> = gpus
        .iter()
        .flat_map(|g| ["--sim-gpu".to_string(), g.to_string()])
        .collect();
    args.extend(["--sim-mig-latency-scale".to_string(), "0.05".to_string()]);
    cluster.next_workers(WorkerExtra {
        env,
        args,
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=8").await;
    let client = cluster.client().await;
    (cluster, client)
}

async fn state(client: &Client, task: TaskId) -> TaskState {
    client.task_info(task).await.expect("a status").status.state
}

/// The MIG slice (profile and start) that `task` holds now on the worker's GPU `index`.
async fn held(client: &Client, index: u32, task: TaskId) -> Option<(String, u8)> {
    let nodes = client.gpus().await.expect("the GPUs");
    let gpu = nodes[0].gpus.iter().find(|g| g.info.index == index)?;
    let uuid = &gpu.holders.iter().find(|h| h.task == task)?.uuid;
    let s = gpu.info.slices.iter().find(|s| &s.uuid == uuid)?;
    Some((s.profile.clone(), s.start))
}

async fn pending_tasks(client: &Client) -> u64 {
    client
        .cluster_status()
        .await
        .expect("a status")
        .pending_tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_made_on_demand_reused_and_adopted_after_a_restart() {
    common::init_tracing();
    let (_cluster, client) =
        cluster_with_gpus(&["h100-80gb:mig=", "a100-40gb:mig="], Vec::new()).await;
    let mut fleet = ClusterFleet::new(client.clone()).await.expect("a fleet");
    assert_eq!(fleet.gpus().len(), 2, "both simulated GPUs are in MIG mode");
    let h100 = 0usize;

    // Bad input: refused with the reason, nothing submitted.
    let before = pending_tasks(&client).await;
    let e = fleet.submit(job("10", "cpu=1")).await.unwrap_err();
    assert!(
        matches!(e, FleetError::Spec(_)) && e.to_string().contains("mig.<profile>=1"),
        "{e}"
    );
    let e = fleet.submit(job("10", "mig.2g.20gb=8")).await.unwrap_err();
    assert!(e.to_string().contains("whole slices, 1 to 7"), "{e}");
    // Two 4g.40gb slices fit no one GPU; 1g.5gb (A100 only) with 2g.20gb (H100 only) neither.
    for ask in ["mig.4g.40gb=2", "mig.1g.5gb=1,mig.2g.20gb=1"] {
        let e = fleet.submit(job("10", ask)).await.unwrap_err();
        assert!(
            matches!(e, FleetError::Policy(SubmitError::TooManyForOneGpu { .. })),
            "{ask}: {e}"
        );
    }
    let e = fleet
        .submit_gang(vec![job("10", "mig.1g.5gb=2"), job("10", "mig.1g.5gb=1")])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("each task of a gang"), "{e}");
    let e = fleet.submit(job("10", "mig.5g.99gb=1")).await.unwrap_err();
    assert!(
        matches!(e, FleetError::Policy(SubmitError::UnknownProfile { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("5g.99gb"), "{e}");
    let e = fleet
        .submit_gang(vec![job("10", "mig.4g.40gb=1"), job("10", "mig.4g.40gb=1")])
        .await
        .unwrap_err();
    assert!(
        matches!(e, FleetError::Policy(SubmitError::TooManyForOneGpu { .. })),
        "{e}"
    );
    assert_eq!(
        pending_tasks(&client).await,
        before,
        "nothing was submitted"
    );
    assert!(fleet.pending().is_empty());

    // A: no slice offers 2g.20gb; the H100 is reshaped for it and it runs there.
    let a = fleet.submit(job("400", "mig.2g.20gb=1")).await.unwrap();
    // The driver must round for A to run: drive it until then.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while held(&client, 0, a).await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "A never ran: {:?}",
            fleet.pending()
        );
        fleet.round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let a_slice = held(&client, 0, a).await.unwrap();
    assert_eq!(a_slice.0, "2g.20gb");
    assert!(!fleet.report().reconfigurations.is_empty());
    assert!(
        fleet
            .report()
            .reconfigurations
            .iter()
            .all(|(g, _)| *g == h100)
    );
    let made = fleet.report().reconfigurations.len();

    // B while A runs: a second slice, A's kept in every layout asked for.
    let b = fleet.submit(job("100", "mig.2g.20gb=1")).await.unwrap();
    assert!(
        fleet.run(Duration::from_secs(60)).await.unwrap(),
        "{:?}",
        fleet.pending()
    );
    for t in [a, b] {
        assert_eq!(state(&client, t).await, TaskState::Succeeded, "{t}");
    }
    let a_place = format!("2g.20gb@{}", a_slice.1);
    for (_, layout) in &fleet.report().reconfigurations[made..] {
        assert!(
            layout.contains(&a_place),
            "{layout} dropped A's busy {a_place}"
        );
    }
    let (_, b_gpu, b_on) = *fleet.report().launches.iter().find(|l| l.0 == b).unwrap();
    assert_eq!(b_gpu, h100);
    assert_ne!(b_on.start, a_slice.1, "B is not on A's slice");
    assert!(
        fleet.report().failed.is_empty(),
        "{:?}",
        fleet.report().failed
    );
    assert!(
        fleet.report().refused.is_empty(),
        "{:?}",
        fleet.report().refused
    );

    // C: both 2g.20gb slices are idle: reused, nothing reconfigured.
    let made = fleet.report().reconfigurations.len();
    let c = fleet.submit(job("50", "mig.2g.20gb=1")).await.unwrap();
    assert!(fleet.run(Duration::from_secs(90)).await.unwrap());
    assert_eq!(state(&client, c).await, TaskState::Succeeded);
    assert_eq!(
        fleet.report().reconfigurations.len(),
        made,
        "C reused an idle slice"
    );

    // A gang of two 1g.5gb slices (only the A100 has the profile): one GPU, two slices.
    let gang = fleet
        .submit_gang(vec![job("50", "mig.1g.5gb=1"), job("50", "mig.1g.5gb=1")])
        .await
        .unwrap();
    assert!(
        fleet.run(Duration::from_secs(120)).await.unwrap(),
        "{:?}",
        fleet.pending()
    );
    let placed: Vec<_> = fleet
        .report()
        .launches
        .iter()
        .filter(|l| gang.contains(&l.0))
        .collect();
    assert_eq!(placed.len(), 2);
    assert_eq!(
        placed[0].1, placed[1].1,
        "the gang is on one GPU: {placed:?}"
    );
    assert_ne!(placed[0].2, placed[1].2);

    // One task asking for two 1g.5gb slices (only the A100 has the profile): both on one GPU,
    // the task holding both at once, in one requeue.
    let two = fleet.submit(job("200", "mig.1g.5gb=2")).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let holds = loop {
        fleet.round().await.unwrap();
        let nodes = client.gpus().await.expect("the GPUs");
        let holds: Vec<(u32, String)> = nodes[0]
            .gpus
            .iter()
            .flat_map(|g| {
                g.holders
                    .iter()
                    .filter(|h| h.task == two)
                    .map(|h| (g.info.index, h.uuid.clone()))
            })
            .collect();
        if !holds.is_empty() {
            break holds;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the task never ran: {:?}",
            fleet.pending()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(holds.len(), 2, "it holds two slices: {holds:?}");
    assert_eq!(holds[0].0, holds[1].0, "on one GPU: {holds:?}");
    assert_ne!(holds[0].1, holds[1].1);
    let placed: Vec<_> = fleet
        .report()
        .launches
        .iter()
        .filter(|l| l.0 == two)
        .collect();
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert_eq!(placed[0].1, placed[1].1);
    assert!(fleet.run(Duration::from_secs(90)).await.unwrap());
    assert_eq!(state(&client, two).await, TaskState::Succeeded);

    // D runs long on one 2g.20gb slice; F is queued and never launched; the driver stops.
    let d = fleet.submit(job("600", "mig.2g.20gb=1")).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while held(&client, 0, d).await.is_none() {
        assert!(std::time::Instant::now() < deadline, "D never ran");
        fleet.round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let d_slice = held(&client, 0, d).await.unwrap();
    let f_spec = job("50", "mig.2g.20gb=1");
    let f_ask = f_spec.resources.clone();
    let f = fleet.submit(f_spec).await.unwrap();
    drop(fleet);

    // A new driver: D's slice is busy to it; E reuses the idle one in its first round, with no
    // reconfiguration; F (adopted) gets a slice too, and no layout asked drops D's.
    let mut fleet = ClusterFleet::new(client.clone())
        .await
        .expect("a new fleet");
    let e_task = fleet.submit(job("50", "mig.2g.20gb=1")).await.unwrap();
    fleet.round().await.unwrap();
    let (_, g, on) = *fleet
        .report()
        .launches
        .iter()
        .find(|l| l.0 == e_task)
        .expect("E launched at once");
    assert_eq!(g, h100);
    assert_ne!(on.start, d_slice.1, "E is not on D's busy slice");
    assert!(
        fleet.report().reconfigurations.is_empty(),
        "the idle slice was reused: {:?}",
        fleet.report().reconfigurations
    );
    fleet.adopt(f, &f_ask).unwrap();
    let e_err = fleet.adopt(f, &f_ask).unwrap_err();
    assert!(e_err.to_string().contains("already pending"), "{e_err}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        fleet.round().await.unwrap();
        let done = [e_task, f]
            .iter()
            .all(|t| fleet.report().times.get(t).is_some_and(|x| x.2.is_some()));
        if done && fleet.pending().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            fleet.pending()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(state(&client, d).await, TaskState::Running, "D still runs");
    assert_eq!(held(&client, 0, d).await, Some(d_slice.clone()));
    let d_place = format!("2g.20gb@{}", d_slice.1);
    for (_, layout) in &fleet.report().reconfigurations {
        assert!(
            layout.contains(&d_place),
            "{layout} dropped D's busy {d_place}"
        );
    }
    let (_, _, on) = *fleet.report().launches.iter().find(|l| l.0 == f).unwrap();
    assert_ne!(on.start, d_slice.1, "F is not on D's busy slice");
    assert!(fleet.run(Duration::from_secs(90)).await.unwrap());
    for t in [e_task, f] {
        assert_eq!(state(&client, t).await, TaskState::Succeeded, "{t}");
    }
    client.cancel(vec![d]).await.unwrap();
}

/// Two simulated H100s, the first failing every reconfiguration at its create phase (the
/// worker's injected NVML error, `ESCHER_SIM_MIG_FAIL=0:create`): the partitioner reshapes
/// GPU 0 first (equal choices go to the first GPU), hears the failure, fails GPU 0 closed, and
/// serves the task on GPU 1; nothing is ever launched on GPU 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_error_fails_the_gpu_closed_and_the_task_runs_on_another() {
    common::init_tracing();
    let (_cluster, client) = cluster_with_gpus(
        &["h100-80gb:mig=", "h100-80gb:mig="],
        vec![("ESCHER_SIM_MIG_FAIL".into(), "0:create".into())],
    )
    .await;
    let mut fleet = ClusterFleet::new(client.clone()).await.expect("a fleet");
    let a = fleet.submit(job("50", "mig.2g.20gb=1")).await.unwrap();
    assert!(
        fleet.run(Duration::from_secs(60)).await.unwrap(),
        "{:?}",
        fleet.pending()
    );
    assert_eq!(state(&client, a).await, TaskState::Succeeded);
    let failed = &fleet.report().failed;
    assert_eq!(
        failed.keys().copied().collect::<Vec<_>>(),
        [0],
        "{failed:?}"
    );
    assert!(failed[&0].contains("NVML error"), "{failed:?}");
    assert!(
        fleet.report().reconfigurations.iter().any(|(g, _)| *g == 0),
        "GPU 0 was tried first"
    );
    // Another task: GPU 0 is never used again.
    let b = fleet.submit(job("50", "mig.1g.10gb=1")).await.unwrap();
    assert!(
        fleet.run(Duration::from_secs(60)).await.unwrap(),
        "{:?}",
        fleet.pending()
    );
    assert_eq!(state(&client, b).await, TaskState::Succeeded);
    assert!(
        fleet.report().launches.iter().all(|(_, g, _)| *g == 1),
        "{:?}",
        fleet.report().launches
    );
    let after = fleet
        .report()
        .reconfigurations
        .iter()
        .filter(|(g, _)| *g == 0)
        .count();
    assert_eq!(after, 1, "GPU 0 was asked once, then left alone");
}

/// The worker's MIG slices, by GPU: (GPU, profile, start, UUID), as the head has them.
async fn slices(client: &Client) -> Vec<(u32, String, u8, String)> {
    let nodes = client.gpus().await.expect("the GPUs");
    nodes[0]
        .gpus
        .iter()
        .flat_map(|g| {
            g.info
                .slices
                .iter()
                .map(|s| (g.info.index, s.profile.clone(), s.start, s.uuid.clone()))
        })
        .collect()
}

/// A worker SIGKILLed and started again finds its GPUs as it left them, as a real GPU's driver
/// keeps its MIG instances (`worker/src/gpu/sim.rs`, kept in the worker's state directory): the
/// slice made for A is registered again with its UUID, and a new driver serves B on it in its
/// first round, with no reconfiguration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_outlive_a_worker_restart_and_are_adopted_as_they_are() {
    common::init_tracing();
    let (mut cluster, client) = cluster_with_gpus(&["h100-80gb:mig="], Vec::new()).await;
    assert!(slices(&client).await.is_empty(), "no slice at start");
    let mut fleet = ClusterFleet::new(client.clone()).await.expect("a fleet");
    let a = fleet.submit(job("10", "mig.2g.20gb=1")).await.unwrap();
    assert!(fleet.run(Duration::from_secs(60)).await.unwrap());
    assert_eq!(state(&client, a).await, TaskState::Succeeded);
    assert_eq!(
        fleet.report().reconfigurations.len(),
        1,
        "A's slice was made"
    );
    let made = slices(&client).await;
    assert!(
        made.iter().any(|s| s.1 == "2g.20gb"),
        "the H100 has a 2g.20gb slice: {made:?}"
    );
    drop(fleet);

    cluster.kill_worker("w1");
    cluster.start_worker_known("w1", "cpu=8").await;
    let kept = slices(&client).await;
    assert_eq!(
        kept, made,
        "the restarted worker registers the slices it left"
    );
    assert!(
        std::fs::read_to_string(cluster.state_dir("w1").join("sim-gpus").join("0"))
            .unwrap()
            .contains("2g.20gb"),
        "the layout is kept in the worker's state directory"
    );

    let mut fleet = ClusterFleet::new(client.clone())
        .await
        .expect("a new fleet");
    let b = fleet.submit(job("10", "mig.2g.20gb=1")).await.unwrap();
    fleet.round().await.unwrap();
    assert!(
        fleet.report().launches.iter().any(|l| l.0 == b),
        "B launched in the first round on the kept slice"
    );
    assert!(fleet.run(Duration::from_secs(60)).await.unwrap());
    assert!(
        fleet.report().reconfigurations.is_empty(),
        "the kept slice was reused: {:?}",
        fleet.report().reconfigurations
    );
    assert_eq!(state(&client, b).await, TaskState::Succeeded);
}
