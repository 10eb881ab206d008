//! The built-in actor class [`TRAINER_CLASS`]: one run of a retraining job, holding the GPU
//! slice it was placed on from its start until it is killed.
//!
//! The GPU policies' retraining jobs (Ekya's trainers, in the end-to-end GPU workload:
//! `escher-gpu`'s `ClusterGpu`) run as actors of this class when their spec is one: the
//! driver creates the actor on the slice a policy launches the job on (the slice's resources
//! are the actor's), kills it when the policy stops the job or once it has finished, and
//! creates a new one for the next launch. The training is simulated as `escher sim-work`
//! simulates a job (`escher_proto::mig::TrainerArgs`): the job's run time on the slice's
//! profile, spread over its iterations in compressed time, with the same telemetry at each
//! iteration (`iteration`, `mem_requested_gb`). Since an actor does not exit when its work is
//! done, it reports its end as telemetry too (`trainer_done`, or `trainer_oom_used_mib` and
//! `trainer_oom_limit_mib` when its memory passes the slice's), and keeps holding its slice
//! until the driver kills it.
//!
//! Methods (arguments and results in [`escher_proto::codec`]):
//! - `progress(()) -> TrainerProgress`: the job it runs, the devices it holds, the profile its
//!   speed was computed for, the iterations begun and in all, and whether it finished or ran
//!   out of memory.
//!
//! Its constructor takes [`TrainerArgs`] and refuses to start without a device of a simulated
//! GPU (it asks the head what its device is, as `escher sim-work` does).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use escher_proto::mig::{
    DONE_KEY, ITERATION_KEY, LIMIT_KEY, MEMORY_KEY, OUT_OF_MEMORY_KEY, PowerModel, SpeedModel,
    TrainerArgs, TrainerProgress, find_simulated_device,
};
use escher_proto::types::GpusReply;
pub use escher_proto::types::TRAINER_CLASS;
use escher_proto::wire;

use super::ActorClass;
use crate::context::TaskContext;

struct Trainer {
    progress: Arc<Mutex<TrainerProgress>>,
    /// Its iterations, stopped when the instance goes (the actor killed).
    _run: AbortOnDrop,
}

/// Aborts the iterations' task when the instance is dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock(m: &Mutex<TrainerProgress>) -> MutexGuard<'_, TrainerProgress> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The class, registered by every worker.
pub(crate) fn class() -> ActorClass {
    ActorClass::new(
        TRAINER_CLASS,
        |ctx: TaskContext, args: TrainerArgs| async move {
            let job = args.job_model()?;
            let devices = ctx.visible_devices().to_vec();
            let Some(uuid) = devices.first().cloned() else {
                return Err(format!(
                    "a trainer holds a GPU slice, and this actor was given none: ask for one \
                 (`mig.<profile>=1`, or `gpu=1`, on a worker started with --sim-gpu) in its \
                 resources (job {})",
                    args.job
                ));
            };
            let reply = ctx
                .cluster_client()
                .gpus(wire::GpusRequest {})
                .await
                .map_err(|s| {
                    format!("cannot ask the head what device {uuid} is: {}", s.message())
                })?;
            let nodes = GpusReply::try_from(reply.into_inner())
                .map_err(|e| format!("the head's inventory of GPUs is malformed: {e}"))?
                .nodes;
            let device = find_simulated_device(&nodes, &uuid)?;
            let duration_s = SpeedModel::default().duration_s(&job, device.profile);
            let progress = Arc::new(Mutex::new(TrainerProgress {
                job: args.job,
                devices,
                profile: device.profile.name.to_string(),
                iteration: 0,
                iterations: args.iterations,
                duration_s,
                done: false,
                out_of_memory: None,
            }));
            let step =
                Duration::from_secs_f64(duration_s / f64::from(args.iterations) * args.scale);
            let power = PowerModel::default();
            let busy_w = power.power_w(device.profile.compute) - power.power_w(0);
            let shared = Arc::clone(&progress);
            let run = tokio::spawn(async move {
                let mut report_failed = false;
                let report = |samples: Vec<(&'static str, f64)>| {
                    let ctx = ctx.clone();
                    async move { ctx.report(&samples).await.err() }
                };
                for i in 1..=args.iterations {
                    let mem_gb = job.memory.at(i).max(0.0);
                    let mem_mib = (mem_gb * 1024.0).round() as u64;
                    lock(&shared).iteration = i;
                    let mut samples = vec![(ITERATION_KEY, f64::from(i)), (MEMORY_KEY, mem_gb)];
                    let oom = mem_mib > device.memory_mib;
                    if oom {
                        lock(&shared).out_of_memory = Some((mem_mib, device.memory_mib));
                        samples.push((OUT_OF_MEMORY_KEY, mem_mib as f64));
                        samples.push((LIMIT_KEY, device.memory_mib as f64));
                    }
                    if let Some(e) = report(samples).await
                        && !report_failed
                    {
                        report_failed = true;
                        tracing::warn!(
                            job = args.job,
                            error = %e,
                            "a trainer's telemetry was not reported; running on"
                        );
                    }
                    if oom {
                        return;
                    }
                    tokio::time::sleep(step).await;
                }
                lock(&shared).done = true;
                let done = vec![
                    (DONE_KEY, f64::from(args.iterations)),
                    ("energy_j", busy_w * duration_s),
                ];
                if let Some(e) = report(done).await {
                    tracing::warn!(job = args.job, error = %e, "a trainer's end was not reported");
                }
            });
            Ok(Trainer {
                progress,
                _run: AbortOnDrop(run.abort_handle()),
            })
        },
    )
    .method("progress", |t: &mut Trainer, (): ()| {
        Ok(lock(&t.progress).clone())
    })
}
