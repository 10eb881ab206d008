//! [`Round`]: what each namespace and cohort holds while one round of the [`Arbiter`]
//! takes its decisions, and the rules that read it: whether a job fits the capacity and its
//! cohort's quota, whether its namespace stays within its guarantee, and why a running job may
//! be preempted for a waiting one (the module doc of [`arbiter`](super::arbiter) states them).
//!
//! [`Arbiter`]: super::Arbiter

use std::collections::{BTreeMap, BTreeSet};

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
    config: &'a FairTimeConfig,
    capacity: &'a Vector,
    /// Whether a resource `capacity` does not name has none (else: no limit).
    closed: bool,
    /// Each namespace's guarantee.
    guarantees: BTreeMap<&'a str, Vector>,
    /// Each namespace's cohort: its name, or the namespace's own for one in none.
    cohort_of: BTreeMap<&'a str, (bool, &'a str)>,
    /// Each cohort's quota: the sum of its members' guarantees, for the resources they name.
    quota: BTreeMap<(bool, &'a str), Vector>,
    /// What each cohort's members hold.
    cohort_used: BTreeMap<(bool, &'a str), Vector>,
    held: BTreeMap<String, Vector>,
    cost: BTreeMap<String, f64>,
    used: Vector,
    /// The lowest priority of a job each namespace holds (or held this round).
    lowest: BTreeMap<String, i32>,
    pub(super) factor: BTreeMap<String, f64>,
}

impl<'a> Round<'a> {
    /// A round over `config` with nothing admitted yet.
    pub(super) fn new(
        config: &'a FairTimeConfig,
        capacity: &'a Vector,
        closed: bool,
        factor: BTreeMap<String, f64>,
    ) -> Round<'a> {
        let mut round = Round {
            config,
            capacity,
            closed,
            guarantees: BTreeMap::new(),
            cohort_of: BTreeMap::new(),
            quota: BTreeMap::new(),
            cohort_used: BTreeMap::new(),
            held: BTreeMap::new(),
            cost: BTreeMap::new(),
            used: Vector::new(),
            lowest: BTreeMap::new(),
            factor,
        };
        for n in config.namespaces.values() {
            let cohort = match &n.cohort {
                Some(c) => (true, c.as_str()),
                None => (false, n.name.as_str()),
            };
            let guarantee = vector(&n.guarantee);
            add(round.quota.entry(cohort).or_default(), &guarantee);
            round.cohort_of.insert(&n.name, cohort);
            round.guarantees.insert(&n.name, guarantee);
        }
        round
    }

    fn namespace(&self, name: &str) -> &Namespace {
        &self.config.namespaces[name]
    }

    fn guarantee(&self, name: &str) -> &Vector {
        &self.guarantees[name]
    }

    pub(super) fn held(&self, name: &str) -> &Vector {
        static NOTHING: Vector = BTreeMap::new();
        self.held.get(name).unwrap_or(&NOTHING)
    }

    /// Cost held per unit of weight.
    pub(super) fn load(&self, name: &str) -> f64 {
        self.cost.get(name).copied().unwrap_or(0.0) / f64::from(self.namespace(name).weight)
    }

    pub(super) fn over_guarantee(&self, name: &str) -> bool {
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
            None => !self.closed,
        });
        if !room {
            return false;
        }
        let cohort = self.cohort_of[job.namespace.as_str()];
        let quota = &self.quota[&cohort];
        let used = self.cohort_used.get(&cohort);
        job.demand.iter().all(|(k, a)| match quota.get(k) {
            Some(q) => used.and_then(|u| u.get(k)).copied().unwrap_or(0) + a <= *q,
            None => true,
        })
    }

    pub(super) fn take(&mut self, job: &Entry) {
        let lowest = self
            .lowest
            .entry(job.namespace.clone())
            .or_insert(job.priority);
        *lowest = (*lowest).min(job.priority);
        let cohort = self.cohort_of[job.namespace.as_str()];
        add(self.cohort_used.entry(cohort).or_default(), &job.demand);
        add(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        add(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() += job.cost;
    }

    pub(super) fn give_back(&mut self, job: &Entry) {
        let cohort = self.cohort_of[job.namespace.as_str()];
        sub(self.cohort_used.entry(cohort).or_default(), &job.demand);
        sub(
            self.held.entry(job.namespace.clone()).or_default(),
            &job.demand,
        );
        sub(&mut self.used, &job.demand);
        *self.cost.entry(job.namespace.clone()).or_default() -= job.cost;
    }

    /// The namespaces that may yield a job to `waiting`: a quick bound on [`Round::reason`],
    /// which decides for each job.
    pub(super) fn yielding(&self, waiting: &Entry) -> BTreeSet<String> {
        let w = self.namespace(&waiting.namespace);
        let entitled = self.entitled(waiting);
        let after_waiting =
            (self.cost.get(&w.name).copied().unwrap_or(0.0) + waiting.cost) / f64::from(w.weight);
        self.lowest
            .iter()
            .filter(|(ns, lowest)| {
                if **lowest > waiting.priority || !self.over_guarantee(ns) {
                    return false;
                }
                if **lowest < waiting.priority {
                    return true;
                }
                let v = self.namespace(ns);
                v.name != w.name
                    && ((entitled && w.cohort.is_some() && w.cohort == v.cohort)
                        || (self.factor[&w.name] > self.factor[&v.name]
                            && after_waiting <= self.load(ns)))
            })
            .map(|(ns, _)| ns.clone())
            .collect()
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
