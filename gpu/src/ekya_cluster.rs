//! Ekya on a cluster's GPU: its micro-profiler's runs as calls to profiler actors on the MIG
//! slices ([`profile_on`]), from whose answers its configuration choice is made
//! ([`ekya_profiler::configured_on_mig`](super::ekya_profiler::configured_on_mig)), and its
//! retraining then run as trainer actors by the driver ([`ClusterGpu`]'s trainers).
//!
//! At a window's start, before its inference replicas are bound, each tenant's candidate
//! configurations are profiled on one idle slice (the tenants' slices at once): a profiler
//! actor of the built-in class `escher.profiler` trains each candidate for its few epochs on
//! a sample at the slice's speed and answers the accuracy it measured after each epoch and the
//! time an epoch took; the profiles are made from those answers alone
//! ([`ekya_profiler::profiles_from`](super::ekya_profiler::profiles_from)).

use escher_esl::{ClusterApi, EslError};
use escher_proto::mig::Placement;

use super::ClusterGpu;
use super::ekya_profiler::{Profile, Truth, profile_runs, profiles_from};

/// Profiles tenant `m`'s candidates `truths[m]` on slice `on[m]` (see the module doc), each
/// epoch's accuracy measured with noise `noise` (on a 5% sample), the runs' samples and seeds
/// drawn from `seed`; the profiles, tenant by tenant, in the order of `truths[m]`.
pub async fn profile_on<C: ClusterApi>(
    gpu: &mut ClusterGpu<C>,
    truths: &[Vec<Truth>],
    on: &[Placement],
    noise: f64,
    seed: u64,
) -> Result<Vec<Vec<Profile>>, EslError> {
    if truths.len() != on.len() {
        return Err(EslError::Refused(format!(
            "{} tenants to profile on {} slices: give one slice per tenant",
            truths.len(),
            on.len()
        )));
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let slices = truths
        .iter()
        .zip(on)
        .map(|(t, on)| (*on, profile_runs(t, noise, gpu.time_scale(), &mut rng)))
        .collect();
    let views = gpu.profile(slices).await?;
    let model = gpu.model();
    truths
        .iter()
        .zip(&views)
        .map(|(t, view)| {
            profiles_from(t, &view.runs, model).map_err(|why| {
                EslError::Refused(format!("profiler {} on {}: {why}", view.actor, view.on))
            })
        })
        .collect()
}
