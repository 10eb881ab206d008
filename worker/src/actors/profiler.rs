//! The built-in actor class [`PROFILER_CLASS`]: Ekya's micro-profiler on one GPU slice, which
//! trains candidate retraining configurations for a few epochs and answers what it measured.
//!
//! The GPU policies' cluster driver (`escher-gpu`'s `ClusterGpu::profile`, for Ekya in the
//! end-to-end GPU workload) creates one on each slice it profiles on (the slice's resources
//! are the actor's), calls `profile` once per candidate configuration, and kills it; Ekya's
//! choice of configurations is made from the answers. The training is simulated
//! ([`escher_proto::mig::ProfileRun`]): each epoch takes its GPU time on the sample at the
//! slice's speed, slept in compressed time, and the accuracy measured after it is the
//! configuration's true curve with sampling noise.
//!
//! Methods (arguments and results in [`escher_proto::codec`]):
//! - `profile(ProfileRun) -> ProfileMeasured`: trains one candidate for its epochs on its
//!   sample; the accuracy after each epoch and the simulated seconds an epoch took on the
//!   slice, with the devices it holds and their profile.
//!
//! Its constructor takes nothing (`()`) and refuses to start without a device of a simulated
//! GPU (it asks the head what its device is, as the trainer does).

use std::time::Duration;

use escher_proto::mig::{
    ProfileMeasured, ProfileRun, SimDevice, SpeedModel, find_simulated_device, measure_accuracy,
};
use escher_proto::types::GpusReply;
pub use escher_proto::types::PROFILER_CLASS;
use escher_proto::wire;

use super::ActorClass;
use crate::context::TaskContext;

struct Profiler {
    devices: Vec<String>,
    device: SimDevice,
}

/// The class, registered by every worker.
pub(crate) fn class() -> ActorClass {
    ActorClass::new(PROFILER_CLASS, |ctx: TaskContext, (): ()| async move {
        let devices = ctx.visible_devices().to_vec();
        let Some(uuid) = devices.first().cloned() else {
            return Err(
                "a profiler holds a GPU slice, and this actor was given none: ask for \
                        one (`mig.<profile>=1`, or `gpu=1`, on a worker started with --sim-gpu) \
                        in its resources"
                    .to_string(),
            );
        };
        let reply = ctx
            .cluster_client()
            .gpus(wire::GpusRequest {})
            .await
            .map_err(|s| format!("cannot ask the head what device {uuid} is: {}", s.message()))?;
        let nodes = GpusReply::try_from(reply.into_inner())
            .map_err(|e| format!("the head's inventory of GPUs is malformed: {e}"))?
            .nodes;
        let device = find_simulated_device(&nodes, &uuid)?;
        Ok(Profiler { devices, device })
    })
    .method("profile", |p: &mut Profiler, run: ProfileRun| {
        run.validate()
            .map_err(|why| format!("profile of candidate {}: {why}", run.candidate))?;
        let epoch_s_on_slice = SpeedModel::default().duration_s(&run.epoch_job(), p.device.profile);
        // Methods run on a thread of the instance's own: an epoch's time is slept there.
        let epoch = Duration::from_secs_f64(epoch_s_on_slice * run.scale);
        let mut rng = fastrand::Rng::with_seed(run.seed);
        let accuracy = measure_accuracy(run.beta, run.sample, run.noise, run.epochs, &mut rng);
        for _ in 0..run.epochs {
            std::thread::sleep(epoch);
        }
        Ok(ProfileMeasured {
            candidate: run.candidate,
            devices: p.devices.clone(),
            profile: p.device.profile.name.to_string(),
            accuracy,
            epoch_s_on_slice,
        })
    })
}
