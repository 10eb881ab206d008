//! What an operator configures for fair share over time: the half-life of past usage, what a
//! second of each resource weighs, and the namespaces with their weights, priorities,
//! guarantees and cohorts. Everything is checked when it is built, so that a policy never
//! runs on a configuration it would misread.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use escher_proto::types::ResourceSet;
use thiserror::Error;

use crate::EslError;

/// The priorities a namespace or a task may have; higher runs first and may preempt lower.
pub const PRIORITIES: RangeInclusive<i32> = -1000..=1000;

/// Why a fair-share configuration or request was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FairTimeError {
    /// The half-life was zero, negative or not a number.
    #[error(
        "half-life {0} s is not allowed: give a finite number of seconds above 0 (Slurm's default is 7 days, 604800 s)"
    )]
    HalfLife(f64),
    /// A priority outside [`PRIORITIES`].
    #[error("priority {0} is outside the range {min}..={max}: pick one inside it", min = PRIORITIES.start(), max = PRIORITIES.end())]
    Priority(i32),
    /// A namespace weight of zero.
    #[error(
        "namespace {0} has weight 0: weights are at least 1 (a namespace that should get nothing should not be configured)"
    )]
    Weight(String),
    /// A resource weight that is negative or not a number.
    #[error(
        "resource weight {weight} for {resource} is not allowed: give a finite number of at least 0"
    )]
    ResourceWeight {
        /// The resource.
        resource: String,
        /// The weight given.
        weight: f64,
    },
    /// The same namespace configured twice.
    #[error("namespace {0} is configured twice: give each namespace once")]
    Duplicate(String),
    /// A request named a namespace that is not configured.
    #[error("namespace {0} is not configured: add it to the FairTimeConfig first")]
    UnknownNamespace(String),
    /// A request named a job the policy does not know (it ended, or never was).
    #[error("job {0} is not known to this policy (it ended, or was never submitted through it)")]
    UnknownJob(u64),
}

impl From<FairTimeError> for EslError {
    fn from(e: FairTimeError) -> EslError {
        EslError::Refused(e.to_string())
    }
}

/// How fast past usage is forgotten: usage recorded `h` ago counts half, `2h` ago a quarter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HalfLife(f64);

impl HalfLife {
    /// A half-life of `seconds`: finite and above 0, else [`FairTimeError::HalfLife`].
    pub fn from_secs(seconds: f64) -> Result<HalfLife, FairTimeError> {
        if seconds.is_finite() && seconds > 0.0 {
            Ok(HalfLife(seconds))
        } else {
            Err(FairTimeError::HalfLife(seconds))
        }
    }

    /// A half-life of `duration` (not zero).
    pub fn from_duration(duration: Duration) -> Result<HalfLife, FairTimeError> {
        HalfLife::from_secs(duration.as_secs_f64())
    }

    /// The half-life in seconds.
    pub fn secs(self) -> f64 {
        self.0
    }

    /// What one unit of usage recorded `elapsed_secs` ago counts for now: `2^(-elapsed/h)`.
    pub fn decay(self, elapsed_secs: f64) -> f64 {
        (-elapsed_secs / self.0).exp2()
    }
}

/// What one unit of each resource weighs per second of use (Slurm's `TRESBillingWeights`).
///
/// `cpu`: 1 per core; `memory` (MiB): 1/4096 per MiB, a quarter per GiB; `gpu`: 8 per GPU;
/// a MIG slice `mig.<N>g.<memory>`: the GPU's weight times `N / 7`, its share of an A100's
/// or H100's seven compute slices (so `mig.3g.40gb` weighs 8 × 3/7); a slice's identity
/// resource `mig.<uuid>` and `gpu.<uuid>` weigh 0 (they name a device, the size is elsewhere).
/// Any other resource weighs 0 unless [`ResourceWeights::set`] says otherwise: an ephemeral
/// resource an ESL creates is a label, not a cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceWeights {
    explicit: BTreeMap<String, f64>,
    gpu: f64,
}

impl Default for ResourceWeights {
    fn default() -> ResourceWeights {
        let explicit = BTreeMap::from([
            ("cpu".to_string(), 1.0),
            ("memory".to_string(), 0.25 / 1024.0),
        ]);
        ResourceWeights { explicit, gpu: 8.0 }
    }
}

/// Compute slices of a whole GPU that MIG profiles count in (A100, H100, H200).
const GPU_SLICES: f64 = 7.0;

impl ResourceWeights {
    /// Sets what one unit of `resource` weighs per second; `gpu` also scales every MIG profile.
    pub fn set(mut self, resource: &str, weight: f64) -> Result<ResourceWeights, FairTimeError> {
        if !weight.is_finite() || weight < 0.0 {
            return Err(FairTimeError::ResourceWeight {
                resource: resource.to_string(),
                weight,
            });
        }
        if resource == "gpu" {
            self.gpu = weight;
        } else {
            self.explicit.insert(resource.to_string(), weight);
        }
        Ok(self)
    }

    /// What one unit of `resource` weighs per second.
    pub fn of(&self, resource: &str) -> f64 {
        if let Some(w) = self.explicit.get(resource) {
            return *w;
        }
        if resource == "gpu" {
            return self.gpu;
        }
        match resource.strip_prefix("mig.").and_then(mig_compute_slices) {
            Some(slices) => self.gpu * slices / GPU_SLICES,
            None => 0.0,
        }
    }

    /// What `resources` weigh per second, all together.
    pub fn cost(&self, resources: &ResourceSet) -> f64 {
        resources
            .iter()
            .map(|(name, amount)| self.of(name.as_str()) * amount.as_f64())
            .sum()
    }
}

/// The compute slices of a MIG profile (`3g.40gb` → 3), or `None` for what is not a profile.
fn mig_compute_slices(profile: &str) -> Option<f64> {
    let (compute, memory) = profile.split_once('.')?;
    let slices: u32 = compute.strip_suffix('g')?.parse().ok()?;
    memory.ends_with("gb").then_some(f64::from(slices))
}

/// One namespace (a tenant) of the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    pub(crate) name: String,
    pub(crate) weight: u32,
    pub(crate) priority: i32,
    pub(crate) guarantee: ResourceSet,
    pub(crate) cohort: Option<String>,
}

impl Namespace {
    /// A namespace of weight 1, priority 0, no guarantee and no cohort.
    pub fn new(name: impl Into<String>) -> Namespace {
        Namespace {
            name: name.into(),
            weight: 1,
            priority: 0,
            guarantee: ResourceSet::new(),
            cohort: None,
        }
    }

    /// Its weight: its fair share is `weight / Σ weights` of the cluster (at least 1).
    pub fn weight(mut self, weight: u32) -> Namespace {
        self.weight = weight;
        self
    }

    /// The priority of its tasks that set none of their own (in [`PRIORITIES`]).
    pub fn priority(mut self, priority: i32) -> Namespace {
        self.priority = priority;
        self
    }

    /// What it is guaranteed (Kueue's nominal quota): while it holds no more than this, none
    /// of its tasks is preempted, and within it it may reclaim what its cohort borrowed. A
    /// resource not named is guaranteed 0.
    pub fn guarantee(mut self, guarantee: ResourceSet) -> Namespace {
        self.guarantee = guarantee;
        self
    }

    /// The cohort it lends its idle guarantee to and borrows from.
    pub fn cohort(mut self, cohort: impl Into<String>) -> Namespace {
        self.cohort = Some(cohort.into());
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The whole configuration of a fair-share-over-time policy.
#[derive(Debug, Clone, PartialEq)]
pub struct FairTimeConfig {
    pub(crate) half_life: HalfLife,
    pub(crate) weights: ResourceWeights,
    pub(crate) namespaces: BTreeMap<String, Namespace>,
}

impl FairTimeConfig {
    /// A configuration with this half-life, the default [`ResourceWeights`] and no namespaces.
    pub fn new(half_life: HalfLife) -> FairTimeConfig {
        FairTimeConfig {
            half_life,
            weights: ResourceWeights::default(),
            namespaces: BTreeMap::new(),
        }
    }

    /// Replaces the resource weights.
    pub fn weights(mut self, weights: ResourceWeights) -> FairTimeConfig {
        self.weights = weights;
        self
    }

    /// Adds a namespace: refused if its weight is 0, its priority out of range, or it is
    /// configured already.
    pub fn namespace(mut self, namespace: Namespace) -> Result<FairTimeConfig, FairTimeError> {
        if namespace.weight == 0 {
            return Err(FairTimeError::Weight(namespace.name));
        }
        check_priority(namespace.priority)?;
        if self.namespaces.contains_key(&namespace.name) {
            return Err(FairTimeError::Duplicate(namespace.name));
        }
        self.namespaces.insert(namespace.name.clone(), namespace);
        Ok(self)
    }
}

/// `priority` if it is in [`PRIORITIES`].
pub(crate) fn check_priority(priority: i32) -> Result<i32, FairTimeError> {
    if PRIORITIES.contains(&priority) {
        Ok(priority)
    } else {
        Err(FairTimeError::Priority(priority))
    }
}
