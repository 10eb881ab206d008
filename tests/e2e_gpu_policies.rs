//! GPU policies end to end (docs/DESIGN.md §6), driven on a [`LocalCluster`] whose worker has a
//! simulated A100-40GB, through the cluster API ([`escher_gpu::drive`]): real MIG
//! reconfigurations by the worker (scaled latency), jobs that are real command processes
//! running `escher sim-work` on the slices they are given, typed out-of-memory failures,
//! restarts that keep each job's task id, and inference replicas that are actors of the
//! built-in serving class on the slices a plan binds them to.
//!
//! Checked for MIGM: every job succeeds under its own id (the one that outgrew its first slice
//! on a second attempt, on a larger slice), the policy is done with nothing refused, every
//! layout the GPU showed is legal, and no other task was ever submitted. For MIGRator's and
//! Ekya's schedules of one window: nothing refused or failed, every layout legal, no request
//! lost (served, shed past its SLO, or queued), most on time, each retraining run once to its
//! end, every replica an actor that holds the device of its slice and counted what it served
//! as the driver did, and every replica ended by the driver (drained, told and killed before
//! its slice went, or at the end). In Ekya's window each retraining runs as an actor of the
//! built-in trainer class: created on its slice's MIG device at the launch, every iteration
//! read by the driver, asked how far it got and killed at its end; and Ekya's micro-profiler
//! runs before the window as calls to actors of the built-in profiler class on the tenants'
//! slices, the profiles it chooses each retraining's configuration from being what those
//! actors answered, and each trainer running its tenant's chosen configuration.
//!
//! OLTunes, on a worker with three simulated whole A100s (standing for its A100, A30 and
//! RTX 4090), through `escher_gpu::oltunes::OlTunesCluster`: every inference server its
//! scheduler places is an actor of the built-in serving class holding a co-location slot of
//! the GPU it chose and its memory; servers the cluster refuses (another tenant holds the GPUs)
//! are killed and placed again by OLTunes' feedback; each task is served by one actor that
//! counted what the driver says it served on its GPU's device, and every share is free at the
//! end.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::time::Duration;

use common::{eventually, init_tracing, within, within_for};
use escher::types::{
    PROFILER_CLASS, SERVING_REPLICA_CLASS, TRAINER_CLASS, TaskId, TaskSpec, TaskState,
};
use escher::worker::ReplicaInfo;
use escher::{LocalCluster, Task};
use escher_gpu::ekya_cluster::profile_on;
use escher_gpu::ekya_profiler::{
    PROFILE_EPOCHS, RetrainConfig, Truth, configurations, configured_on_mig, profiles_from,
    retrain_table, truth,
};
use escher_gpu::migm::RestartReason;
use escher_gpu::migrator::ilp::{Solved, solve};
use escher_gpu::migrator::workload::two_tenants;
use escher_gpu::{
    ClusterGpu, GpuPolicy, InferenceModel, Migm, MigmJob, Migrator, Scheme, TenantTasks,
    TrainerEnd, drive, drive_with,
};
use escher_proto::mig::{
    GpuModel, Layout, ProfileMeasured, ProfileRun, TrainerArgs, TrainerProgress, measure_accuracy,
};

/// `escher sim-work` with these flags, time compressed 100x, as a spec.
fn job(flags: &[&str]) -> TaskSpec {
    common::sim_work(flags).build().expect("a valid spec")
}

/// Iterations of a retraining run as a trainer actor.
const ITERATIONS: u32 = 10;

/// Standard deviation of a micro-profiling epoch's measured accuracy on a 5% sample.
const NOISE: f64 = 0.01;

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

/// One 200 s window of MIGRator's two tenants (10 s steps, time compressed 50x) executed on
/// the cluster's GPU by `policy`'s schedule: inference replicas are actors of the built-in
/// serving class on the slices the plan binds them to (a resize drains, tells and kills one
/// and creates the next), retraining is `escher sim-work` launched on its pinned slice.
async fn run_window(policy: &str) {
    init_tracing();
    // A simulated second lasts 20 ms: the driver's 25 ms round is about a simulated second.
    let scale = 0.02;
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus(
            "cpu=8".parse().unwrap(),
            ["a100-40gb:mig=3g.20gb@0,3g.20gb@4"],
        )
        .sim_mig_latency_scale(scale)
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    let gpu = within("the GPU", ClusterGpu::new(client.clone(), node, 0))
        .await
        .unwrap();
    let mut gpu = gpu.with_time_scale(scale);

    let p = two_tenants(1, 200, 10.0);
    let start = Layout::parse(p.model, "3g.20gb@0,3g.20gb@4").unwrap();
    let slices = [*start.at(0).unwrap(), *start.at(4).unwrap()];
    // Ekya profiles each tenant's candidate configurations on the tenant's slice before the
    // window (calls to profiler actors) and chooses from what they answered; its schedule is
    // planned on the chosen configurations as profiled. MIGRator plans its own retraining.
    let mut profiled = None;
    let (planned, solved) = match policy {
        "MIGRator" => (p.clone(), solve(&p).unwrap()),
        "Ekya" => {
            let truths: Vec<Vec<Truth>> = p
                .tenants
                .iter()
                .map(|t| truth(t.acc_pre, t.acc_post, t.retrain_s[7] / 30.0))
                .collect();
            let profiles = within(
                "profiling on the slices",
                profile_on(&mut gpu, &truths, &slices, NOISE, 1),
            )
            .await
            .unwrap();
            // What Ekya has seen of each stream: the window's first 30 s stand for the past.
            let past: Vec<&[f64]> = p.tenants.iter().map(|t| &t.forecast[..30]).collect();
            let (planned, schedule, chosen) = configured_on_mig(&p, &past, 0.1, &profiles);
            profiled = Some((truths, profiles, chosen));
            let solved = Solved {
                schedule,
                objective: 0.0,
                solve_time: Duration::ZERO,
                programs: 0,
            };
            (planned, solved)
        }
        other => panic!("no policy {other}"),
    };
    let replica = Task::actor_typed(SERVING_REPLICA_CLASS, &0u64)
        .build()
        .unwrap();
    let mut services = Vec::new();
    for t in &p.tenants {
        let model = InferenceModel {
            per_gpc_rps: t.capability[1],
            slo_ms: 1000,
        };
        let id = within("a service", gpu.add_service(model, replica.clone()))
            .await
            .unwrap();
        services.push(id);
    }
    // Each retraining runs as long on its slice as the planner expects: Ekya's as trainer
    // actors (each launch an actor on the slice), MIGRator's as `escher sim-work` tasks.
    let trainers = policy == "Ekya";
    let jobs: Vec<TaskSpec> = (0..2)
        .map(|m| {
            let r = solved.schedule.retraining[m];
            let work = planned.tenants[m].retrain_s[usize::from(r.gpcs)] * f64::from(r.gpcs) / 7.0;
            if trainers {
                let args = TrainerArgs {
                    job: 0,
                    work_s: work,
                    gpcs: 7,
                    mem_gb: 2.0,
                    iterations: ITERATIONS,
                    scale,
                };
                Task::actor_typed(TRAINER_CLASS, &args).build().unwrap()
            } else {
                let work = format!("{work:.3}");
                job(&["--work", &work, "--gpcs", "7", "--mem-gb", "2"])
            }
        })
        .collect();
    let retraining = within("submit", gpu.submit(jobs)).await.unwrap();
    let tasks: Vec<TenantTasks> = (0..2)
        .map(|m| TenantTasks {
            inference: services[m],
            retraining: retraining[m],
        })
        .collect();
    // The window begins with each tenant serving on one of the 3g instances.
    for (service, on) in services.iter().zip(slices) {
        within(
            "a serving replica",
            gpu.bind_serving(*service, on, Duration::from_secs(10)),
        )
        .await
        .unwrap();
    }
    let (first_replicas, _) = within("the first replicas", gpu.report_replicas()).await;
    let first_replicas: Vec<TaskId> = first_replicas.iter().map(|r| r.task).collect();
    assert_eq!(first_replicas.len(), 2, "{first_replicas:?}");
    let t0 = gpu.now();
    let mut executor =
        Migrator::execute(policy, &planned, solved.clone(), tasks, &start, t0, true).unwrap();

    let forecast: Vec<Vec<f64>> = p.tenants.iter().map(|t| t.forecast.clone()).collect();
    let mut last = t0;
    let feed = |gpu: &mut ClusterGpu<escher::Client>| {
        let now = gpu.now();
        let (sec, dt) = (((now - t0) / 1000) as usize, (now - last) as f64 / 1000.0);
        last = now;
        if sec < 200 {
            for (m, service) in services.iter().enumerate() {
                gpu.arrive(*service, forecast[m][sec] * dt);
            }
        }
    };
    // The window, then 5 simulated seconds for the queues (in wall time since the GPU's
    // clock began).
    let until = Duration::from_secs_f64((t0 as f64 / 1000.0 + 205.0) * scale);
    let report = within_for(
        Duration::from_secs(60),
        "the window on the cluster",
        drive_with(&mut executor, &mut gpu, until, feed),
    )
    .await
    .unwrap();
    assert!(report.refused.is_empty(), "{policy}: {:?}", report.refused);
    assert!(report.failed.is_empty(), "{policy}: {:?}", report.failed);
    assert!(report.reconfigurations >= 1, "{policy}: {report:?}");
    for (_, layout) in &report.layouts {
        layout.validate().unwrap();
    }

    // No request was lost: each was served, shed past its SLO, or is still queued; and the
    // replicas served (how much on time is the harness's business: `escher-bench gpu`).
    for (m, service) in services.iter().enumerate() {
        let s = gpu.service_stats(*service).unwrap();
        assert!(s.arrived > 1000.0, "{policy}, tenant {m}: {s:?}");
        let accounted = s.served + s.expired + gpu.queued(*service);
        assert!(
            (accounted - s.arrived).abs() < 1e-6 * s.arrived,
            "{policy}, tenant {m}: {s:?}"
        );
        // Served, some within the SLO: what share, under a loaded machine's compressed time,
        // is a figure (a floor of 20% failed under load 11 on 2 cores), not a test.
        assert!(
            s.served > 0.0 && s.on_time > 0.0,
            "{policy}, tenant {m}: {s:?}"
        );
    }
    let runs = gpu.trainers().to_vec();
    if trainers {
        // Each retraining ran once, to the end, as a trainer actor on the MIG device its
        // slice names, which said so when asked; the driver read every iteration it ran (and
        // handed it to the policy), and killed it.
        assert_eq!(runs.len(), 2, "{policy}: {runs:?}");
        for (run, id) in runs.iter().zip(&retraining) {
            assert_eq!(run.job, *id, "{policy}: {run:?}");
            assert_eq!(run.end, TrainerEnd::Finished, "{policy}: {run:?}");
            assert!(run.device.starts_with("MIG-"), "{policy}: {run:?}");
            let progress = run.progress.clone().unwrap();
            assert_eq!(
                progress.devices,
                std::slice::from_ref(&run.device),
                "{policy}: {run:?}"
            );
            assert_eq!(progress.profile, run.on.profile.name, "{policy}: {run:?}");
            assert_eq!(progress.job, id.0, "{policy}: {run:?}");
            assert!(progress.done, "{policy}: {run:?}");
            assert_eq!(
                (progress.iteration, run.iterations_read),
                (ITERATIONS, ITERATIONS),
                "{policy}: {run:?}"
            );
            // The driver's kill is applied by the head after it returned: wait for it.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let info = loop {
                let info = within("a trainer's info", client.task_info(run.actor))
                    .await
                    .unwrap();
                if info.status.state != TaskState::Running || std::time::Instant::now() > deadline {
                    break info;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(
                info.status.state,
                TaskState::Cancelled,
                "{policy}: {info:?}"
            );
            assert_eq!(info.attempts.len(), 1, "{policy}: {:?}", info.attempts);
            let died = within(
                "a killed trainer's progress",
                client
                    .actor_by_id(run.actor)
                    .call::<(), TrainerProgress>("progress", &()),
            )
            .await
            .unwrap_err();
            assert!(
                matches!(&died, escher::ClientError::ActorDied { .. }),
                "{policy}: {died:?}"
            );
        }
        // Ekya's choice came from what its profiler actors answered: one on each tenant's
        // slice, holding its MIG device, measured every candidate for its epochs, an epoch
        // taking its time at a 3g slice's speed; the profiles Ekya chose from are those
        // answers' (curves fitted, times scaled back), and each trainer ran its tenant's chosen
        // configuration for as long as the answers said it takes on the trainer's slice.
        let (truths, profiles, chosen) = profiled.clone().unwrap();
        let views = gpu.profilers().to_vec();
        assert_eq!(views.len(), 2, "{views:?}");
        let mut configs = Vec::new();
        for (m, view) in views.iter().enumerate() {
            assert_eq!(view.on, slices[m], "{view:?}");
            assert!(view.device.starts_with("MIG-"), "{view:?}");
            assert_eq!(view.runs.len(), configurations().len(), "{view:?}");
            for (asked, measured) in &view.runs {
                assert_eq!(measured.devices, std::slice::from_ref(&view.device));
                assert_eq!(measured.profile, "3g.20gb", "{measured:?}");
                assert_eq!(measured.accuracy.len(), PROFILE_EPOCHS as usize);
                let on_3g = asked.epoch_s * asked.sample * 7.0 / 3.0;
                assert!(
                    (measured.epoch_s_on_slice - on_3g).abs() < 1e-9 * on_3g,
                    "{asked:?} {measured:?}"
                );
            }
            let answered = profiles_from(&truths[m], &view.runs, GpuModel::A100_40GB).unwrap();
            assert_eq!(
                answered, profiles[m],
                "tenant {m}: not the answers' profiles"
            );
            let c = chosen[m].expect("each tenant retrains");
            let r = solved.schedule.retraining[m];
            let table = retrain_table(answered[c.index].gpu_s, &p.tenants[m].retrain_s);
            let expected = table[usize::from(r.gpcs)];
            let ran = runs.iter().find(|t| t.job == retraining[m]).unwrap();
            let took = ran.progress.as_ref().unwrap().duration_s;
            assert!(
                (took - expected).abs() < 1e-6 * expected,
                "tenant {m}: ran {took} s, its chosen configuration takes {expected} s"
            );
            configs.push(answered[c.index].config);
        }
        // The profiles mattered: a tenant chose another configuration than the workload's own
        // (30 epochs on all the data, the whole network trained), which Ekya without its
        // profiler retrains with.
        let own = RetrainConfig {
            epochs: 30,
            data: 1.0,
            layers: 1.0,
        };
        assert!(configs.iter().any(|c| *c != own), "{configs:?}");
    } else {
        // Each retraining ran once, to the end, under its own id.
        assert!(runs.is_empty(), "{policy}: {runs:?}");
        for id in &retraining {
            let info = within("info", client.task_info(*id)).await.unwrap();
            assert_eq!(
                info.status.state,
                TaskState::Succeeded,
                "{policy}: {info:?}"
            );
            assert_eq!(info.status.attempt, 1, "{policy}: {:?}", info.attempts);
        }
    }
    let trainer_actors: Vec<TaskId> = runs.iter().map(|r| r.actor).collect();
    // The replicas serving at the end are actors holding their slice's device, whose own
    // count of what they served is the driver's (drained ones were checked as they went:
    // a disagreement is in `report.failed`).
    let (replicas, told) = within("telling the replicas", gpu.report_replicas()).await;
    assert!(told.is_empty(), "{policy}: {told:?}");
    let holders = within("the GPUs", client.gpus()).await.unwrap()[0].gpus[0]
        .holders
        .clone();
    let serving: Vec<_> = replicas.iter().filter(|r| r.running).collect();
    assert!(!serving.is_empty(), "{policy}: {replicas:?}");
    for r in serving {
        assert!(r.actor, "{policy}: {r:?}");
        let info: ReplicaInfo = within(
            "a replica's info",
            client.actor_by_id(r.task).call("info", &()),
        )
        .await
        .unwrap();
        assert_eq!(info.service, r.service.0, "{policy}: {r:?}");
        let held: Vec<String> = holders
            .iter()
            .filter(|h| h.task == r.task)
            .map(|h| h.uuid.clone())
            .collect();
        assert!(
            held.iter().all(|u| u.starts_with("MIG-")),
            "{policy}: {held:?}"
        );
        assert_eq!(info.devices, held, "{policy}: {r:?}");
        assert!(
            (info.served - r.served).abs() <= 1e-6 * r.served.max(1.0),
            "{policy}: {info:?} {r:?}"
        );
    }
    within("stopping the services", gpu.stop_services())
        .await
        .unwrap();
    // Replicas came and went: more replica tasks than the two the window started with, each
    // ended by the driver (drained or stopped at the end), none failed; a resize killed the
    // old actor (the two the window began with are dead) and created a new one.
    let replicas = eventually("every replica ended", || async {
        let all = client.list_tasks(None, None).await.unwrap();
        let replicas: Vec<_> = all
            .into_iter()
            .filter(|t| {
                !services.contains(&t.id)
                    && !retraining.contains(&t.id)
                    && !trainer_actors.contains(&t.id)
            })
            .collect();
        replicas
            .iter()
            .all(|t| t.state.is_terminal())
            .then_some(replicas)
    })
    .await;
    assert!(replicas.len() > 2, "{policy}: {replicas:?}");
    assert!(
        replicas.iter().all(|t| t.state == TaskState::Cancelled),
        "{policy}: {replicas:?}"
    );
    for first in &first_replicas {
        let died = within(
            "a resized replica's info",
            client
                .actor_by_id(*first)
                .call::<(), ReplicaInfo>("info", &()),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&died, escher::ClientError::ActorDied { .. }),
            "{policy}: {died:?}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrator_executes_its_window_on_a_cluster_gpu_with_replicas_drained_before_destroy() {
    run_window("MIGRator").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ekyas_schedule_on_mig_slices_runs_on_a_cluster_gpu() {
    run_window("Ekya").await;
}

/// The built-in serving replica on its own: an actor on a MIG slice holds that slice's device
/// and counts what it is told it served, refusing a count that is no count; one placed with no
/// GPU device refuses to start, saying what to ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_replica_is_an_actor_that_holds_its_slice_and_counts_what_it_served() {
    init_tracing();
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus("cpu=8".parse().unwrap(), ["a100-40gb:mig=3g.20gb@0"])
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();

    let on_slice = Task::actor_typed(SERVING_REPLICA_CLASS, &7u64).resources_str("mig.3g.20gb=1");
    let replica = within("a replica", client.actor(on_slice)).await.unwrap();
    let told: f64 = within("serve", replica.call("serve", &2.5f64))
        .await
        .unwrap();
    assert_eq!(told, 2.5);
    let refused = within("serve -1", replica.call::<f64, f64>("serve", &-1.0))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, escher::ClientError::ActorCall { .. })
            && refused.to_string().contains("not negative"),
        "{refused:?}"
    );
    let told: f64 = within("serve", replica.call("serve", &1.0f64))
        .await
        .unwrap();
    assert_eq!(told, 3.5, "a refused count changed nothing");
    let info: ReplicaInfo = within("info", replica.call("info", &())).await.unwrap();
    let held: Vec<String> = within("the GPUs", client.gpus()).await.unwrap()[0].gpus[0]
        .holders
        .iter()
        .filter(|h| h.task == replica.id())
        .map(|h| h.uuid.clone())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].starts_with("MIG-"), "{held:?}");
    assert_eq!(
        info,
        ReplicaInfo {
            service: 7,
            devices: held,
            served: 3.5
        }
    );

    let no_gpu = Task::actor_typed(SERVING_REPLICA_CLASS, &8u64).resources_str("cpu=1");
    let orphan = within("a replica with no GPU", client.actor(no_gpu))
        .await
        .unwrap();
    let died = within(
        "its first call",
        orphan.call::<(), ReplicaInfo>("info", &()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&died, escher::ClientError::ActorDied { .. })
            && died.to_string().contains("holds a GPU slice"),
        "{died:?}"
    );
    cluster.shutdown().await;
}

/// A cluster of one worker whose simulated A100 has a 3g.20gb slice at 0 and a 1g.5gb slice at
/// 4, and a client of it.
async fn two_slices() -> (LocalCluster, escher::Client) {
    init_tracing();
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus(
            "cpu=8".parse().unwrap(),
            ["a100-40gb:mig=3g.20gb@0,1g.5gb@4"],
        )
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    (cluster, client)
}

/// The built-in trainer on its own: an actor on a MIG slice runs its iterations at the
/// slice's speed in compressed time, reports each as telemetry and its end, and says how far
/// it got on which device; one whose memory passes its slice's stops and says so; one placed
/// with no GPU device refuses to start, saying what to ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_is_an_actor_that_runs_its_iterations_on_its_slice_and_says_how_far_it_got() {
    let (cluster, client) = two_slices().await;
    let args = TrainerArgs {
        job: 9,
        work_s: 7.0,
        gpcs: 7,
        mem_gb: 2.0,
        iterations: 4,
        scale: 0.05,
    };

    // 7 s on the whole GPU take 7 * 7/3 s on a 3g slice: about 0.8 s of wall time.
    let spec = Task::actor_typed(TRAINER_CLASS, &args).resources_str("mig.3g.20gb=1");
    let trainer = within("a trainer", client.actor(spec)).await.unwrap();
    let done = eventually("the trainer's end", || async {
        let p: TrainerProgress = trainer.call("progress", &()).await.unwrap();
        p.done.then_some(p)
    })
    .await;
    let held: Vec<String> = within("the GPUs", client.gpus()).await.unwrap()[0].gpus[0]
        .holders
        .iter()
        .filter(|h| h.task == trainer.id())
        .map(|h| h.uuid.clone())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].starts_with("MIG-"), "{held:?}");
    assert_eq!(
        (
            done.job,
            &done.devices,
            done.profile.as_str(),
            done.iteration
        ),
        (9, &held, "3g.20gb", 4)
    );
    assert!((done.duration_s - 7.0 * 7.0 / 3.0).abs() < 1e-9, "{done:?}");
    assert_eq!(done.out_of_memory, None);
    let samples = eventually("the trainer's telemetry of its end", || async {
        let t = client.telemetry([trainer.id()], None).await.unwrap();
        let samples = t.into_iter().next()?.samples;
        samples
            .iter()
            .any(|s| s.key == escher_proto::mig::DONE_KEY)
            .then_some(samples)
    })
    .await;
    let iterations: Vec<f64> = samples
        .iter()
        .filter(|s| s.key == escher_proto::mig::ITERATION_KEY)
        .map(|s| s.value)
        .collect();
    assert_eq!(iterations, [1.0, 2.0, 3.0, 4.0]);
    // Done, it still holds its slice; killed, it lets it go.
    within("killing it", trainer.kill(true)).await.unwrap();
    let id = trainer.id();
    eventually("the slice let go", || async {
        let gpus = client.gpus().await.unwrap();
        (!gpus[0].gpus[0].holders.iter().any(|h| h.task == id)).then_some(())
    })
    .await;

    // 6 GB on a 1g.5gb slice: out of memory at its first iteration.
    let big = TrainerArgs {
        mem_gb: 6.0,
        ..args
    };
    let spec = Task::actor_typed(TRAINER_CLASS, &big).resources_str("mig.1g.5gb=1");
    let trainer = within("a trainer too big", client.actor(spec))
        .await
        .unwrap();
    let oom = eventually("the trainer out of memory", || async {
        let p: TrainerProgress = trainer.call("progress", &()).await.unwrap();
        p.out_of_memory.map(|m| (m, p))
    })
    .await;
    assert_eq!(oom.0, (6144, 4864), "{oom:?}");
    assert!(!oom.1.done, "{oom:?}");

    let no_gpu = Task::actor_typed(TRAINER_CLASS, &args).resources_str("cpu=1");
    let orphan = within("a trainer with no GPU", client.actor(no_gpu))
        .await
        .unwrap();
    let died = within(
        "its first call",
        orphan.call::<(), TrainerProgress>("progress", &()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&died, escher::ClientError::ActorDied { .. })
            && died.to_string().contains("holds a GPU slice"),
        "{died:?}"
    );
    cluster.shutdown().await;
}

/// The built-in profiler on its own: an actor on a MIG slice trains a candidate for its epochs
/// at the slice's speed and answers the accuracy it measured after each (the configuration's
/// curve with the run's seeded noise) and the time an epoch took there, on which device; a
/// run whose numbers are no run is refused and the actor lives on; one placed with no GPU
/// device refuses to start, saying what to ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiler_is_an_actor_that_measures_candidates_at_its_slice_s_speed() {
    let (cluster, client) = two_slices().await;
    let run = ProfileRun {
        candidate: 4,
        beta: [1.0, 3.0, 0.9],
        epoch_s: 20.0,
        sample: 0.05,
        epochs: 5,
        noise: 0.01,
        seed: 11,
        scale: 0.01,
    };
    let mut on = Vec::new();
    for (profile, gpcs) in [("3g.20gb", 3.0), ("1g.5gb", 1.0)] {
        let spec =
            Task::actor_typed(PROFILER_CLASS, &()).resources_str(&format!("mig.{profile}=1"));
        let profiler = within("a profiler", client.actor(spec)).await.unwrap();
        let measured: ProfileMeasured = within("profile", profiler.call("profile", &run))
            .await
            .unwrap();
        let held: Vec<String> = within("the GPUs", client.gpus()).await.unwrap()[0].gpus[0]
            .holders
            .iter()
            .filter(|h| h.task == profiler.id())
            .map(|h| h.uuid.clone())
            .collect();
        assert_eq!(held.len(), 1, "{held:?}");
        assert!(held[0].starts_with("MIG-"), "{held:?}");
        let noisy = measure_accuracy(
            run.beta,
            run.sample,
            run.noise,
            run.epochs,
            &mut fastrand::Rng::with_seed(run.seed),
        );
        // An epoch on 5% of 20 s of whole-GPU work: 1 s on all 7 GPCs, 7/gpcs on the slice.
        let epoch = 7.0 / gpcs;
        assert!(
            (measured.epoch_s_on_slice - epoch).abs() < 1e-9,
            "{measured:?}"
        );
        assert_eq!(
            measured,
            ProfileMeasured {
                candidate: 4,
                devices: held,
                profile: profile.to_string(),
                accuracy: noisy,
                epoch_s_on_slice: measured.epoch_s_on_slice,
            }
        );
        on.push(profiler);
    }
    let bad = ProfileRun { sample: 0.0, ..run };
    let refused = within(
        "a run that is none",
        on[0].call::<_, ProfileMeasured>("profile", &bad),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&refused, escher::ClientError::ActorCall { .. })
            && refused.to_string().contains("sample 0"),
        "{refused:?}"
    );
    let again: ProfileMeasured = within("profile again", on[0].call("profile", &run))
        .await
        .unwrap();
    assert_eq!(again.candidate, 4, "the refusal left it serving");

    let no_gpu = Task::actor_typed(PROFILER_CLASS, &()).resources_str("cpu=1");
    let orphan = within("a profiler with no GPU", client.actor(no_gpu))
        .await
        .unwrap();
    let died = within(
        "its first call",
        orphan.call::<_, ProfileMeasured>("profile", &run),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&died, escher::ClientError::ActorDied { .. })
            && died.to_string().contains("holds a GPU slice"),
        "{died:?}"
    );
    cluster.shutdown().await;
}

/// OLTunes on a cluster: its scheduler places every inference server it launches as an actor
/// of the built-in serving class on the GPU it chose, holding one co-location slot of that
/// GPU's device and its tuned batch's memory (the GPU's ephemeral resource). Another tenant
/// holds most of every GPU for the run's first two seconds, so the cluster refuses OLTunes' first
/// placements: each such server is killed having served nothing, the scheduler hears the
/// refusal (its feedback), and places the task again: a new actor, which serves it. Every task
/// is served by exactly one server whose actor counted what the driver says it served and held
/// its GPU's device and only that; every server ended, and every share is free at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oltunes_servers_are_actors_on_the_gpu_shares_it_chose_and_a_refused_one_is_recreated() {
    use escher_gpu::oltunes::compare::profile;
    use escher_gpu::oltunes::task::{GpuType, Pattern, models, workload_at};
    use escher_gpu::oltunes::{OlTunes, OlTunesCluster, ServerEnd};

    init_tracing();
    let cluster = LocalCluster::builder()
        .grace(Duration::from_secs(2))
        .no_workers()
        .worker_with_gpus(
            "cpu=8".parse().unwrap(),
            ["a100-40gb", "a100-40gb", "a100-40gb"],
        )
        .start();
    let cluster = within("starting the cluster", cluster).await.unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let node = cluster.nodes()[0];
    let types = [GpuType::A100, GpuType::A30, GpuType::Rtx4090];
    let gpus: Vec<_> = (0u32..).zip(types).map(|(i, ty)| (node, i, ty)).collect();
    let olt = within(
        "the GPUs",
        OlTunesCluster::create(client.clone(), "e2e", &gpus),
    )
    .await
    .unwrap()
    .refusing_after(Duration::from_millis(300));
    assert_eq!(olt.types(), types);

    let models = models();
    let tasks = workload_at(Pattern::Uniform, 2, 42, 0.05);
    assert!(tasks.len() >= 8, "{} tasks", tasks.len());
    let mut oltunes = OlTunes::new(models.clone(), &types, &profile(&models, 7), 42);

    // Another tenant holds 0.8 of every GPU's device for two seconds: no slot of a quarter
    // fits while it does.
    let mut tenants = Vec::new();
    for g in olt.gpus() {
        let hold = Task::command(["sleep", "2"])
            .resources_str(&format!("gpu=0.8,gpu.{}=0.8", g.uuid))
            .max_retries(0);
        tenants.push(within("a tenant", client.submit(hold)).await.unwrap().id());
    }
    for t in &tenants {
        common::running(&client, *t).await;
    }
    let run = within_for(
        Duration::from_secs(60),
        "OLTunes on the cluster",
        olt.run(&mut oltunes, &tasks, &models, 20_000, 42),
    )
    .await
    .unwrap();

    eprintln!(
        "OLTunes on the cluster: {} tasks, {} servers ({} refused), per server (task, GPU, \
         batch, SM%, GB, end): {:?}",
        tasks.len(),
        run.servers.len(),
        run.refused,
        run.servers
            .iter()
            .map(|s| (s.task, s.gpu, s.batch, s.sm_pct, s.mem_gb, &s.end))
            .collect::<Vec<_>>()
    );
    assert!(run.failed.is_empty(), "{:?}", run.failed);
    assert_eq!(run.finished(), tasks.len(), "every task served: {run:?}");
    let refused: Vec<_> = run
        .servers
        .iter()
        .filter(|s| s.end == ServerEnd::Refused)
        .collect();
    assert!(!refused.is_empty(), "the tenant's hold refused none");
    for task in &tasks {
        let mine: Vec<_> = run.servers.iter().filter(|s| s.task == task.id).collect();
        let finished: Vec<_> = mine
            .iter()
            .filter(|s| s.end == ServerEnd::Finished)
            .collect();
        assert_eq!(finished.len(), 1, "task {}: {mine:?}", task.id);
        let s = finished[0];
        let inputs = f64::from(task.inputs);
        let uuid = &olt.gpus()[s.gpu].uuid;
        assert_eq!(s.served, inputs);
        assert_eq!(s.counted, Some(inputs), "its actor's own count");
        let info = s.info.as_ref().expect("it said what it holds");
        assert_eq!(
            info.devices.as_slice(),
            std::slice::from_ref(uuid),
            "the device of the GPU OLTunes chose"
        );
        assert_eq!((info.service, info.served), (task.id as u64, inputs));
        assert_eq!(run.outcomes[task.id].gpu, Some(s.gpu));
        // A refused server of this task came before the one that served it, and served nothing.
        for r in mine.iter().filter(|s| s.end == ServerEnd::Refused) {
            assert!(r.actor < s.actor && r.counted.is_none() && r.started_ms.is_none());
        }
    }
    // Recreated: some task was refused and then served by a new actor.
    assert!(refused.iter().any(|r| {
        run.servers
            .iter()
            .any(|s| s.task == r.task && s.end == ServerEnd::Finished)
    }));
    // Every server's actor ended: killed by the driver (none ended by itself).
    for s in &run.servers {
        let info = within("a server", client.task_info(s.actor)).await.unwrap();
        assert_eq!(info.status.state, TaskState::Cancelled, "{s:?}");
    }

    // Everything is free: no device held, no GPU share used, and the memory resources gone.
    for t in &tenants {
        common::finished(&client, *t).await;
    }
    let nodes = within("the GPUs", client.gpus()).await.unwrap();
    assert!(
        nodes[0].gpus.iter().all(|g| g.holders.is_empty()),
        "{nodes:?}"
    );
    let mems: Vec<String> = olt.gpus().iter().map(|g| g.mem.to_string()).collect();
    let status = common::status(&client).await;
    let gpu = common::resource(&status, node, "gpu").expect("the node's GPUs");
    assert_eq!(gpu.used, escher::types::Amount::ZERO);
    for mem in &mems {
        let held = common::resource(&status, node, mem).expect("OLTunes' memory resource");
        assert_eq!(held.used, escher::types::Amount::ZERO, "{mem}");
    }
    within("dissolve", olt.dissolve()).await.unwrap();
    let status = common::status(&client).await;
    for mem in &mems {
        assert!(common::resource(&status, node, mem).is_none(), "{mem} left");
    }
    cluster.shutdown().await;
}
