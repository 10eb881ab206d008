//! [`Arbiter`]: the pure decision function of fair share over time. Events in (a job arrives,
//! a job ends, the cluster's capacity), decisions out (admit this job, preempt that one);
//! time is passed in, nothing is read from a clock or a cluster, and every map is ordered, so
//! the same events give the same decisions.
//!
//! ```text
//!   arrive(job) ─┐                         ┌─► Admit { job }
//!   end(job) ────┼─► Arbiter::decide(now) ─┤
//!   capacity ────┘                         └─► Preempt { job, for_job, reason, then }
//! ```
//!
//! Each round, waiting jobs are taken in order of priority (highest first), then those whose
//! namespace stays within its guarantee once they are admitted (before those that would
//! borrow), then fair-share factor (highest first: the namespace that used least of its share
//! over time), then the weighted cost its namespace holds now per unit of weight (lowest
//! first), then arrival. A
//! job is admitted if it fits the cluster's capacity and its cohort's quota (the sum of its
//! members' guarantees; a namespace without a cohort is a cohort of its own). If it does not
//! fit, the arbiter looks for running jobs to preempt, and preempts only if enough are found
//! for it to fit; a job may be preempted only while its namespace holds more than its
//! guarantee, and only for one of these reasons:
//!
//! - **priority**: the waiting job's priority is higher;
//! - **reclaim**: both namespaces are of one cohort and the waiting one stays within its
//!   guarantee once admitted (it takes back what it lent);
//! - **fair share**: equal priorities, the waiting namespace's fair-share factor is higher,
//!   and once the swap is made it holds no more per unit of weight than the victim's does
//!   (so the swap cannot be undone by the same rule at once).
//!
//! Victims are taken lowest priority first, then from the namespace most over its share, then
//! the most recently admitted (the least work lost).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{Amount, ResourceSet};

use super::config::{FairTimeConfig, FairTimeError, check_priority};
use super::round::{Entry, Round, Vector, add, vector};
use super::usage::{DecayedUsage, fair_share_factor};

/// A job of the policy: the unit that is admitted and preempted (one task on a cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

/// What a preempted job becomes, as its submitter said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPreempt {
    /// It waits again in its place, and runs anew when admitted again.
    Requeue,
    /// It ends, failed as preempted.
    Fail,
}

/// Why a job was preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A job of higher priority waits.
    Priority,
    /// A namespace of its cohort takes back its guarantee.
    Reclaim,
    /// A namespace that used less of its share over time waits.
    FairShare,
}

/// One decision of a round, in the order they are to be carried out.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start `job` now.
    Admit {
        /// The job.
        job: JobId,
        /// Its namespace.
        namespace: String,
    },
    /// Stop `job` so that `for_job` fits, then requeue or fail it as `then` says.
    Preempt {
        /// The job stopped.
        job: JobId,
        /// Its namespace.
        namespace: String,
        /// The job it makes room for.
        for_job: JobId,
        /// Why.
        reason: Reason,
        /// What becomes of it.
        then: OnPreempt,
    },
}

/// A job as it arrives.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its namespace.
    pub namespace: String,
    /// Its priority; `None` takes the namespace's.
    pub priority: Option<i32>,
    /// What it holds while it runs.
    pub resources: ResourceSet,
    /// What becomes of it when preempted.
    pub on_preempt: OnPreempt,
}

/// A running job as a possible victim: its place in the order victims are taken (lowest
/// priority, then most loaded namespace, then most recently admitted, then highest id).
type Candidate<'e> = (
    (i32, Reverse<u64>, Reverse<u64>, Reverse<JobId>),
    JobId,
    &'e Entry,
);

/// The pure fair-share-over-time policy. See the module doc.
#[derive(Debug, Clone)]
pub struct Arbiter {
    config: FairTimeConfig,
    usage: DecayedUsage,
    /// Finite capacity per resource; a resource not here is not limited by capacity, unless
    /// `closed`.
    capacity: Vector,
    /// Whether `capacity` names everything the cluster has, so that a resource it does not
    /// name has none ([`Arbiter::set_cluster_capacity`]).
    closed: bool,
    waiting: BTreeMap<JobId, Entry>,
    admitted: BTreeMap<JobId, Entry>,
    next: u64,
}

impl Arbiter {
    /// An arbiter with no jobs, at time 0, with no capacity limit until
    /// [`set_capacity`](Arbiter::set_capacity).
    pub fn new(config: FairTimeConfig) -> Arbiter {
        Arbiter {
            usage: DecayedUsage::new(config.half_life),
            config,
            capacity: Vector::new(),
            closed: false,
            waiting: BTreeMap::new(),
            admitted: BTreeMap::new(),
            next: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FairTimeConfig {
        &self.config
    }

    /// The cluster's finite capacity, per resource (a resource not named is not limited).
    pub fn set_capacity(&mut self, capacity: &ResourceSet) {
        self.capacity = vector(capacity);
        self.closed = false;
    }

    /// Everything the cluster has, per resource (an unbounded one at
    /// [`Amount::MAX`](escher_proto::types::Amount::MAX)): a job that asks for a resource
    /// not named here does not fit, and waits until some node has it. What
    /// [`FairTime`](super::FairTime) reads from the cluster each round: a cluster with no live
    /// node (or one whose worker has not attached yet) admits nothing.
    pub fn set_cluster_capacity(&mut self, capacity: &ResourceSet) {
        self.capacity = vector(capacity);
        self.closed = true;
    }

    /// A job arrives; it waits until a [`decide`](Arbiter::decide) admits it. Refused if its
    /// namespace is not configured or its priority is out of range.
    pub fn arrive(&mut self, job: Job) -> Result<JobId, FairTimeError> {
        let Some(namespace) = self.config.namespaces.get(&job.namespace) else {
            return Err(FairTimeError::UnknownNamespace(job.namespace));
        };
        let priority = check_priority(job.priority.unwrap_or(namespace.priority))?;
        let id = JobId(self.next);
        self.next += 1;
        let entry = Entry {
            cost: self.config.weights.cost(&job.resources),
            demand: vector(&job.resources),
            namespace: job.namespace,
            priority,
            on_preempt: job.on_preempt,
            seq: id.0,
            admitted_ms: 0,
        };
        self.waiting.insert(id, entry);
        Ok(id)
    }

    /// A job ended (or was cancelled by its owner): it holds nothing from `now_ms` on.
    pub fn end(&mut self, job: JobId, now_ms: u64) -> Result<(), FairTimeError> {
        if self.waiting.remove(&job).is_some() {
            return Ok(());
        }
        let entry = self
            .admitted
            .remove(&job)
            .ok_or(FairTimeError::UnknownJob(job.0))?;
        self.update_rate(&entry.namespace, now_ms);
        Ok(())
    }

    /// An admitted job goes back to waiting in its place (its start could not be carried
    /// out); it holds nothing from `now_ms` on.
    pub fn put_back(&mut self, job: JobId, now_ms: u64) -> Result<(), FairTimeError> {
        let mut entry = self
            .admitted
            .remove(&job)
            .ok_or(FairTimeError::UnknownJob(job.0))?;
        entry.admitted_ms = 0;
        let namespace = entry.namespace.clone();
        self.waiting.insert(job, entry);
        self.update_rate(&namespace, now_ms);
        Ok(())
    }

    /// Adds past usage to a namespace (weighted resource-seconds at `now_ms`).
    pub fn record_usage(
        &mut self,
        namespace: &str,
        resource_seconds: f64,
        now_ms: u64,
    ) -> Result<(), FairTimeError> {
        if !self.config.namespaces.contains_key(namespace) {
            return Err(FairTimeError::UnknownNamespace(namespace.to_string()));
        }
        self.usage.record(namespace, resource_seconds, now_ms);
        Ok(())
    }

    /// Whether `job` is admitted (running or about to).
    pub fn is_admitted(&self, job: JobId) -> bool {
        self.admitted.contains_key(&job)
    }

    /// Whether `job` waits.
    pub fn is_waiting(&self, job: JobId) -> bool {
        self.waiting.contains_key(&job)
    }

    /// Every namespace's decayed usage, fair-share factor and holdings at `now_ms`, in name
    /// order.
    pub fn shares(&mut self, now_ms: u64) -> Vec<Share> {
        self.usage.advance(now_ms);
        let mut factors = self.factors();
        let mut holds: BTreeMap<&str, Vector> = BTreeMap::new();
        for e in self.admitted.values() {
            add(holds.entry(&e.namespace).or_default(), &e.demand);
        }
        self.config
            .namespaces
            .keys()
            .map(|name| Share {
                namespace: name.clone(),
                waiting: self
                    .waiting
                    .values()
                    .filter(|e| e.namespace == *name)
                    .count(),
                running: self
                    .admitted
                    .values()
                    .filter(|e| e.namespace == *name)
                    .count(),
                usage: self.usage.usage(name),
                factor: factors.remove(name).unwrap_or(1.0),
                holds: holds
                    .remove(name.as_str())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, a)| (k, Amount::from_raw(a).map_or(f64::MAX, Amount::as_f64)))
                    .collect(),
            })
            .collect()
    }

    /// Every namespace's fair-share factor, as of the ledger's last update.
    fn factors(&self) -> BTreeMap<String, f64> {
        let total_usage = self.usage.total();
        let total_weight = self.total_weight();
        self.config
            .namespaces
            .values()
            .map(|n| {
                let usage = self.usage.usage(&n.name);
                let factor =
                    fair_share_factor(usage, total_usage, f64::from(n.weight), total_weight);
                (n.name.clone(), factor)
            })
            .collect()
    }

    fn total_weight(&self) -> f64 {
        self.config
            .namespaces
            .values()
            .map(|n| f64::from(n.weight))
            .sum()
    }

    fn update_rate(&mut self, namespace: &str, now_ms: u64) {
        let rate = self
            .admitted
            .values()
            .filter(|e| e.namespace == namespace)
            .map(|e| e.cost)
            .sum();
        self.usage.set_rate(namespace, rate, now_ms);
    }

    /// One round at `now_ms`: the admissions and preemptions, in the order to carry them out.
    pub fn decide(&mut self, now_ms: u64) -> Vec<Decision> {
        self.usage.advance(now_ms);
        let factor: BTreeMap<String, f64> = self.factors();
        let mut round = Round::new(&self.config, &self.capacity, self.closed, factor);
        for e in self.admitted.values() {
            round.take(e);
        }
        let mut order: Vec<(JobId, &Entry)> = self.waiting.iter().map(|(id, e)| (*id, e)).collect();
        // Keys computed once per job (factors are in (0, 1] and loads at least 0, so their
        // bits order as the numbers do).
        order.sort_by_cached_key(|(_, e)| {
            (
                Reverse(e.priority),
                !round.entitled(e),
                Reverse(round.factor[&e.namespace].to_bits()),
                round.load(&e.namespace).max(0.0).to_bits(),
                e.seq,
            )
        });
        // Victims in the order they are taken (module doc), by the loads at the round's start.
        let mut candidates: BTreeMap<&str, Vec<Candidate<'_>>> = BTreeMap::new();
        for (id, e) in &self.admitted {
            let key = (
                e.priority,
                Reverse(round.load(&e.namespace).max(0.0).to_bits()),
                Reverse(e.admitted_ms),
                Reverse(*id),
            );
            candidates
                .entry(&e.namespace)
                .or_default()
                .push((key, *id, e));
        }
        // Jobs of a shape that found no victims since the last change: their like find none.
        let mut hopeless: BTreeSet<(&str, i32, &Vector)> = BTreeSet::new();
        let mut decisions = Vec::new();
        let mut admit = Vec::new();
        let mut stopped: BTreeSet<JobId> = BTreeSet::new();
        for (id, job) in order {
            if round.fits(job) {
                hopeless.clear();
                round.take(job);
                admit.push(id);
                decisions.push(Decision::Admit {
                    job: id,
                    namespace: job.namespace.clone(),
                });
                continue;
            }
            let shape = (job.namespace.as_str(), job.priority, &job.demand);
            if hopeless.contains(&shape) {
                continue;
            }
            let Some(victims) = Arbiter::victims(&mut round, job, &candidates, &stopped) else {
                hopeless.insert(shape);
                continue;
            };
            hopeless.clear();
            for (victim, reason) in victims {
                let entry = &self.admitted[&victim];
                stopped.insert(victim);
                decisions.push(Decision::Preempt {
                    job: victim,
                    namespace: entry.namespace.clone(),
                    for_job: id,
                    reason,
                    then: entry.on_preempt,
                });
            }
            round.take(job);
            admit.push(id);
            decisions.push(Decision::Admit {
                job: id,
                namespace: job.namespace.clone(),
            });
        }
        self.apply(&admit, &stopped, now_ms);
        decisions
    }

    /// The running jobs whose preemption makes `job` fit, with why each may be preempted;
    /// `None` (and `round` unchanged) if no such set exists.
    fn victims(
        round: &mut Round<'_>,
        job: &Entry,
        candidates: &BTreeMap<&str, Vec<Candidate<'_>>>,
        stopped: &BTreeSet<JobId>,
    ) -> Option<Vec<(JobId, Reason)>> {
        let yielding = round.yielding(job);
        let mut ordered: Vec<&Candidate<'_>> = yielding
            .iter()
            .filter_map(|ns| candidates.get(ns.as_str()))
            .flatten()
            .filter(|(_, id, e)| {
                e.priority <= job.priority
                    && !stopped.contains(id)
                    && e.demand.keys().any(|k| job.demand.contains_key(k))
            })
            .collect();
        if ordered.is_empty() {
            return None;
        }
        ordered.sort_unstable_by_key(|(key, _, _)| *key);
        let candidates = ordered.into_iter().map(|(_, id, e)| (*id, *e));
        let mut chosen = Vec::new();
        for (id, victim) in candidates {
            let Some(reason) = round.reason(job, victim) else {
                continue;
            };
            round.give_back(victim);
            chosen.push((id, victim, reason));
            if round.fits(job) {
                return Some(chosen.into_iter().map(|(id, _, r)| (id, r)).collect());
            }
        }
        for (_, victim, _) in chosen {
            round.take(victim);
        }
        None
    }

    fn apply(&mut self, admit: &[JobId], stopped: &BTreeSet<JobId>, now_ms: u64) {
        let mut touched = BTreeSet::new();
        for id in stopped {
            if let Some(mut entry) = self.admitted.remove(id) {
                touched.insert(entry.namespace.clone());
                if entry.on_preempt == OnPreempt::Requeue {
                    entry.admitted_ms = 0;
                    self.waiting.insert(*id, entry);
                }
            }
        }
        for id in admit {
            if let Some(mut entry) = self.waiting.remove(id) {
                entry.admitted_ms = now_ms;
                touched.insert(entry.namespace.clone());
                self.admitted.insert(*id, entry);
            }
        }
        let mut rates: BTreeMap<String, f64> = touched.into_iter().map(|n| (n, 0.0)).collect();
        for e in self.admitted.values() {
            if let Some(rate) = rates.get_mut(&e.namespace) {
                *rate += e.cost;
            }
        }
        for (namespace, rate) in rates {
            self.usage.set_rate(&namespace, rate, now_ms);
        }
    }

    /// Checks the invariants: admitted jobs fit the capacity, and every cohort's quota.
    /// Returns what is wrong, if anything (for tests after every step).
    pub fn sanity_check(&self) -> Result<(), String> {
        let mut used = Vector::new();
        for e in self.admitted.values() {
            add(&mut used, &e.demand);
        }
        for (k, c) in &self.capacity {
            let u = used.get(k).copied().unwrap_or(0);
            if u > *c {
                return Err(format!("{k}: admitted jobs hold {u} of a capacity of {c}"));
            }
        }
        Ok(())
    }
}

/// A namespace's standing ([`Arbiter::shares`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The namespace.
    pub namespace: String,
    /// Its decayed usage, in weighted resource-seconds.
    pub usage: f64,
    /// Its fair-share factor, in (0, 1]: 1 used nothing, ½ used exactly its share.
    pub factor: f64,
    /// What its admitted jobs hold now, in resource units.
    pub holds: BTreeMap<String, f64>,
    /// Its jobs waiting for admission.
    pub waiting: usize,
    /// Its jobs admitted and not yet ended.
    pub running: usize,
}
