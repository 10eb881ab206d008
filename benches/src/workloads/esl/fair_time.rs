//! The cost of one decision of the fair-share-over-time ESL ([`Arbiter::decide`]) at 1,000
//! nodes and 100 namespaces: the pure policy alone, as a round of the ESL runs it between
//! reading the cluster's status and carrying its decisions out (those calls are the same as
//! any ESL's, measured by the rest of `esl`).
//!
//! The cluster: 1,000 nodes of `cpu=64,gpu=8`. The namespaces: weights 1 to 4, ten cohorts
//! of ten, each guaranteed `cpu=640,gpu=80` (together the whole cluster), every tenth of
//! priority 10. The cluster is first filled: 9,000 jobs of `cpu=8,gpu=1` (8,000 fit) from
//! namespaces drawn at random (seeded). Then each round 100 running jobs end and 100 jobs
//! arrive (one in twenty of priority 20), and one decision is timed: it admits, and preempts
//! for the high-priority arrivals and for namespaces that reclaim their guarantee.

use std::time::Instant;

use escher::esl::fair_time::{
    Arbiter, Decision, FairTimeConfig, HalfLife, Job, JobId, Namespace, OnPreempt,
};
use escher::types::ResourceSet;

use crate::stats::Summary;

/// Nodes of the simulated cluster.
pub const NODES: u64 = 1_000;
/// Namespaces.
pub const NAMESPACES: usize = 100;

/// What was measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DecisionCost {
    /// One decision with the cluster full and jobs churning, ms.
    pub decision_ms: Summary,
    /// The first decision, admitting up to 8,000 jobs of 9,000, ms.
    pub fill_ms: f64,
    /// Admissions over the timed rounds.
    pub admitted: usize,
    /// Preemptions over the timed rounds.
    pub preempted: usize,
    /// Jobs running after the last round.
    pub running: usize,
}

/// Runs `rounds` timed decisions.
pub fn measure(rounds: usize) -> anyhow::Result<DecisionCost> {
    let mut rng = fastrand::Rng::with_seed(63790);
    let mut config = FairTimeConfig::new(HalfLife::from_secs(7.0 * 86_400.0)?);
    for i in 0..NAMESPACES {
        let ns = Namespace::new(format!("ns{i}"))
            .weight(1 + (i % 4) as u32)
            .priority(if i % 10 == 0 { 10 } else { 0 })
            .guarantee("cpu=640,gpu=80".parse()?)
            .cohort(format!("cohort{}", i / 10));
        config = config.namespace(ns)?;
    }
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&format!("cpu={},gpu={}", 64 * NODES, 8 * NODES).parse()?);
    let shape: ResourceSet = "cpu=8,gpu=1".parse()?;
    let arrive = |arbiter: &mut Arbiter, rng: &mut fastrand::Rng| -> anyhow::Result<()> {
        let urgent = rng.u32(0..20) == 0;
        arbiter.arrive(Job {
            namespace: format!("ns{}", rng.usize(0..NAMESPACES)),
            priority: urgent.then_some(20),
            resources: shape.clone(),
            on_preempt: if rng.bool() {
                OnPreempt::Requeue
            } else {
                OnPreempt::Fail
            },
        })?;
        Ok(())
    };
    for _ in 0..9_000 {
        arrive(&mut arbiter, &mut rng)?;
    }
    let mut running: Vec<JobId> = Vec::new();
    let mut now_ms = 0;
    let start = Instant::now();
    let decisions = arbiter.decide(now_ms);
    let fill_ms = start.elapsed().as_secs_f64() * 1000.0;
    apply(&decisions, &mut running);
    let mut times = Vec::with_capacity(rounds);
    let (mut admitted, mut preempted) = (0, 0);
    for _ in 0..rounds {
        now_ms += 10_000;
        for _ in 0..100.min(running.len()) {
            let job = running.swap_remove(rng.usize(0..running.len()));
            arbiter.end(job, now_ms)?;
        }
        for _ in 0..100 {
            arrive(&mut arbiter, &mut rng)?;
        }
        let start = Instant::now();
        let decisions = arbiter.decide(now_ms);
        times.push(start.elapsed());
        let (a, p) = apply(&decisions, &mut running);
        admitted += a;
        preempted += p;
    }
    anyhow::ensure!(
        arbiter.sanity_check().is_ok(),
        "{:?}",
        arbiter.sanity_check()
    );
    Ok(DecisionCost {
        decision_ms: Summary::of_ms(&times),
        fill_ms,
        admitted,
        preempted,
        running: running.len(),
    })
}

/// Follows the decisions; how many admissions and preemptions they were.
fn apply(decisions: &[Decision], running: &mut Vec<JobId>) -> (usize, usize) {
    let (mut admitted, mut preempted) = (0, 0);
    for d in decisions {
        match d {
            Decision::Admit { job, .. } => {
                admitted += 1;
                running.push(*job);
            }
            Decision::Preempt { job, .. } => {
                preempted += 1;
                running.retain(|r| r != job);
            }
        }
    }
    (admitted, preempted)
}
