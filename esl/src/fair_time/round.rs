//! [`Round`]: what each namespace and cohort holds while one round of the [`Arbiter`]
//! takes its decisions, and the rules that read it: whether a job fits the capacity and its
//! cohort's quota, whether its namespace stays within its guarantee, and why a running job may
//! be preempted for a waiting one (the module doc of [`arbiter`](super::arbiter) states them).
//!
//! [`Arbiter`]: super::Arbiter

use std::collections::BTreeMap;

use escher_proto::types::ResourceSet;

use super::arbiter::{OnPreempt, Reason};
use super::config::{FairTimeConfig, Namespace};

/// Amounts per resource, raw fixed-point ([`Amount::raw`](escher_proto::types::Amount::raw)).
pub(super) type Vector = BTreeMap<String, u64>;

/// A job as the arbiter keeps it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) namespace: String,
    pub(super) priority: i32,
    pub(super) demand: Vector,
    pub(super) cost: f64,
    pub(super) on_preempt: OnPreempt,
    /// Arrival order: a requeued job keeps its place.
    pub(super) seq: u64,
    /// When admitted (ms), for victims' order.
    pub(super) admitted_ms: u64,
}

pub(super) fn vector(resources: &ResourceSet) -> Vector {
    resources
        .iter()
        .filter(|(_, a)| !a.is_zero())
        .map(|(n, a)| (n.as_str().to_string(), a.raw()))
        .collect()
}

pub(super) fn add(into: &mut Vector, v: &Vector) {
    for (k, a) in v {
        *into.entry(k.clone()).or_default() += a;
    }
}

pub(super) fn sub(from: &mut Vector, v: &Vector) {
    for (k, a) in v {
        if let Some(x) = from.get_mut(k) {
            *x = x.saturating_sub(*a);
        }
    }
}

/// Whether `held` is within `guarantee` in every resource (one not guaranteed counts as 0).
pub(super) fn within(held: &Vector, guarantee: &Vector) -> bool {
    held.iter()
        .all(|(k, a)| *a <= guarantee.get(k).copied().unwrap_or(0))
}

/// The state of one round: what each namespace and cohort holds, as decisions are taken.
pub(super) struct Round<'a> {
    pub(super) config: &'a FairTimeConfig,
    pub(super) capacity: &'a Vector,
    /// Each namespace's guarantee.
    pub(super) guarantees: BTreeMap<String, Vector>,
    pub(super) held: BTreeMap<String, Vector>,
    pub(super) cost: BTreeMap<String, f64>,
    pub(super) used: Vector,
    pub(super) factor: BTreeMap<String, f64>,
}

impl Round<'_> {
    fn namespace(&self, name: &str) -> &Namespace {
        &self.config.namespaces[name]
    }

    fn guarantee(&self, name: &str) -> &Vector {
        &self.guarantees[name]
    }

    fn cohort(&self, name: &str) -> Vec<&Namespace> {
        let cohort = &self.namespace(name).cohort;
        self.config
            .namespaces
            .values()
            .filter(|n| n.name == name || (cohort.is_some() && n.cohort == *cohort))
            .collect()
    }

    pub(super) fn held(&self, name: &str) -> &Vector {
        static NOTHING: Vector = BTreeMap::new();
        self.held.get(name).unwrap_or(&NOTHING)
    }

    /// Cost held per unit of weight.
    pub(super) fn load(&self, name: &str) -> f64 {
        self.cost.get(name).copied().unwrap_or(0.0) / f64::from(self.namespace(name).weight)
    }

    fn over_guarantee(&self, name: &str) -> bool {
        !within(self.held(name), self.guarantee(name))
    }

    /// Whether `job`'s namespace stays within its guarantee once `job` is admitted.
    pub(super) fn entitled(&self, job: &Entry) -> bool {
        let mut after = self.held(&job.namespace).clone();
        add(&mut after, &job.demand);
        within(&after, self.guarantee(&job.namespace))
    }

    pub(super) fn fits(&self, job: &Entry) -> bool {
        let capacity = self.capacity;
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

    pub(super) fn take(&mut self, job: &Entry) {
        add(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        add(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() += job.cost;
    }

    pub(super) fn give_back(&mut self, job: &Entry) {
        sub(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        sub(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() -= job.cost;
    }

    /// Why `waiting` may preempt `victim` now, if it may.
    pub(super) fn reason(&self, waiting: &Entry, victim: &Entry) -> Option<Reason> {
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
