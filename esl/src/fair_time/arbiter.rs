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

use super::config::{FairTimeConfig, FairTimeError, Namespace, check_priority};
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

type Vector = BTreeMap<String, u64>;

#[derive(Debug, Clone)]
struct Entry {
    namespace: String,
    priority: i32,
    demand: Vector,
    cost: f64,
    on_preempt: OnPreempt,
    /// Arrival order: a requeued job keeps its place.
    seq: u64,
    /// When admitted (ms), for victims' order.
    admitted_ms: u64,
}

/// The pure fair-share-over-time policy. See the module doc.
#[derive(Debug, Clone)]
pub struct Arbiter {
    config: FairTimeConfig,
    usage: DecayedUsage,
    /// Finite capacity per resource; a resource not here is not limited by capacity.
    capacity: Vector,
    waiting: BTreeMap<JobId, Entry>,
    admitted: BTreeMap<JobId, Entry>,
    next: u64,
}

fn vector(resources: &ResourceSet) -> Vector {
    resources
        .iter()
        .filter(|(_, a)| !a.is_zero())
        .map(|(n, a)| (n.as_str().to_string(), a.raw()))
        .collect()
}

fn add(into: &mut Vector, v: &Vector) {
    for (k, a) in v {
        *into.entry(k.clone()).or_default() += a;
    }
}

fn sub(from: &mut Vector, v: &Vector) {
    for (k, a) in v {
        if let Some(x) = from.get_mut(k) {
            *x = x.saturating_sub(*a);
        }
    }
}

/// Whether `held` is within `guarantee` in every resource (one not guaranteed counts as 0).
fn within(held: &Vector, guarantee: &Vector) -> bool {
    held.iter()
        .all(|(k, a)| *a <= guarantee.get(k).copied().unwrap_or(0))
}

/// The state of one round: what each namespace and cohort holds, as decisions are taken.
struct Round<'a> {
    arbiter: &'a Arbiter,
    held: BTreeMap<String, Vector>,
    cost: BTreeMap<String, f64>,
    used: Vector,
    factor: BTreeMap<String, f64>,
}

impl Round<'_> {
    fn namespace(&self, name: &str) -> &Namespace {
        &self.arbiter.config.namespaces[name]
    }

    fn guarantee(&self, name: &str) -> Vector {
        vector(&self.namespace(name).guarantee)
    }

    fn cohort(&self, name: &str) -> Vec<&Namespace> {
        let cohort = &self.namespace(name).cohort;
        self.arbiter
            .config
            .namespaces
            .values()
            .filter(|n| n.name == name || (cohort.is_some() && n.cohort == *cohort))
            .collect()
    }

    fn held(&self, name: &str) -> Vector {
        self.held.get(name).cloned().unwrap_or_default()
    }

    /// Cost held per unit of weight.
    fn load(&self, name: &str) -> f64 {
        self.cost.get(name).copied().unwrap_or(0.0) / f64::from(self.namespace(name).weight)
    }

    fn over_guarantee(&self, name: &str) -> bool {
        !within(&self.held(name), &self.guarantee(name))
    }

    /// Whether `job`'s namespace stays within its guarantee once `job` is admitted.
    fn entitled(&self, job: &Entry) -> bool {
        let mut after = self.held(&job.namespace);
        add(&mut after, &job.demand);
        within(&after, &self.guarantee(&job.namespace))
    }

    fn fits(&self, job: &Entry) -> bool {
        let capacity = &self.arbiter.capacity;
        let room = job.demand.iter().all(|(k, a)| match capacity.get(k) {
            Some(c) => self.used.get(k).copied().unwrap_or(0) + a <= *c,
            None => true,
        });
        if !room {
            return false;
        }
        let members = self.cohort(&job.namespace);
        job.demand.iter().all(|(k, a)| {
            let quota: Vec<u64> = members
                .iter()
                .filter_map(|n| n.guarantee.iter().find(|(r, _)| r.as_str() == k))
                .map(|(_, q)| q.raw())
                .collect();
            if quota.is_empty() {
                return true;
            }
            let cohort_used: u64 = members
                .iter()
                .map(|n| {
                    self.held
                        .get(&n.name)
                        .and_then(|h| h.get(k))
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            cohort_used + a <= quota.iter().sum::<u64>()
        })
    }

    fn take(&mut self, job: &Entry) {
        add(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        add(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() += job.cost;
    }

    fn give_back(&mut self, job: &Entry) {
        sub(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        sub(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() -= job.cost;
    }

    /// Why `waiting` may preempt `victim` now, if it may.
    fn reason(&self, waiting: &Entry, victim: &Entry) -> Option<Reason> {
        if !self.over_guarantee(&victim.namespace) {
            return None;
        }
        if waiting.priority > victim.priority {
            return Some(Reason::Priority);
        }
        if waiting.priority < victim.priority || waiting.namespace == victim.namespace {
            return None;
        }
        let (w, v) = (
            self.namespace(&waiting.namespace),
            self.namespace(&victim.namespace),
        );
        if w.cohort.is_some() && w.cohort == v.cohort && self.entitled(waiting) {
            return Some(Reason::Reclaim);
        }
        let after_waiting =
            (self.cost.get(&w.name).copied().unwrap_or(0.0) + waiting.cost) / f64::from(w.weight);
        let after_victim =
            (self.cost.get(&v.name).copied().unwrap_or(0.0) - victim.cost) / f64::from(v.weight);
        (self.factor[&w.name] > self.factor[&v.name] && after_waiting <= after_victim)
            .then_some(Reason::FairShare)
    }
}

impl Arbiter {
    /// An arbiter with no jobs, at time 0, with no capacity limit until
    /// [`set_capacity`](Arbiter::set_capacity).
    pub fn new(config: FairTimeConfig) -> Arbiter {
        Arbiter {
            usage: DecayedUsage::new(config.half_life),
            config,
            capacity: Vector::new(),
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

    /// Every namespace's decayed usage and fair-share factor at `now_ms`, in name order.
    pub fn shares(&mut self, now_ms: u64) -> Vec<Share> {
        self.usage.advance(now_ms);
        let total_usage = self.usage.total();
        let total_weight = self.total_weight();
        self.config
            .namespaces
            .values()
            .map(|n| {
                let usage = self.usage.usage(&n.name);
                Share {
                    namespace: n.name.clone(),
                    usage,
                    factor: fair_share_factor(
                        usage,
                        total_usage,
                        f64::from(n.weight),
                        total_weight,
                    ),
                    holds: self.holds(&n.name),
                }
            })
            .collect()
    }

    /// What `namespace`'s admitted jobs hold, in resource units.
    pub fn holds(&self, namespace: &str) -> BTreeMap<String, f64> {
        let mut held = Vector::new();
        for e in self.admitted.values().filter(|e| e.namespace == namespace) {
            add(&mut held, &e.demand);
        }
        held.into_iter()
            .map(|(k, a)| (k, Amount::from_raw(a).map_or(f64::MAX, Amount::as_f64)))
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
        let factor: BTreeMap<String, f64> = self
            .shares(now_ms)
            .into_iter()
            .map(|s| (s.namespace, s.factor))
            .collect();
        let mut round = Round {
            arbiter: self,
            held: BTreeMap::new(),
            cost: BTreeMap::new(),
            used: Vector::new(),
            factor,
        };
        for e in self.admitted.values() {
            round.take(e);
        }
        let mut order: Vec<(JobId, &Entry)> = self.waiting.iter().map(|(id, e)| (*id, e)).collect();
        order.sort_by(|(_, a), (_, b)| {
            Reverse(a.priority)
                .cmp(&Reverse(b.priority))
                .then(round.entitled(b).cmp(&round.entitled(a)))
                .then(round.factor[&b.namespace].total_cmp(&round.factor[&a.namespace]))
                .then(
                    round
                        .load(&a.namespace)
                        .total_cmp(&round.load(&b.namespace)),
                )
                .then(a.seq.cmp(&b.seq))
        });
        let mut decisions = Vec::new();
        let mut admit = Vec::new();
        let mut stopped: BTreeSet<JobId> = BTreeSet::new();
        for (id, job) in order {
            if round.fits(job) {
                round.take(job);
                admit.push(id);
                decisions.push(Decision::Admit {
                    job: id,
                    namespace: job.namespace.clone(),
                });
                continue;
            }
            let Some(victims) = self.victims(&mut round, job, &stopped) else {
                continue;
            };
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
        &self,
        round: &mut Round<'_>,
        job: &Entry,
        stopped: &BTreeSet<JobId>,
    ) -> Option<Vec<(JobId, Reason)>> {
        let mut candidates: Vec<(JobId, &Entry)> = self
            .admitted
            .iter()
            .filter(|(id, e)| {
                !stopped.contains(id) && e.demand.keys().any(|k| job.demand.contains_key(k))
            })
            .map(|(id, e)| (*id, e))
            .collect();
        candidates.sort_by(|(ia, a), (ib, b)| {
            a.priority
                .cmp(&b.priority)
                .then(
                    round
                        .load(&b.namespace)
                        .total_cmp(&round.load(&a.namespace)),
                )
                .then(b.admitted_ms.cmp(&a.admitted_ms))
                .then(ib.cmp(ia))
        });
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
        for namespace in touched {
            self.update_rate(&namespace, now_ms);
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
}
