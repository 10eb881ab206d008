//! Tests of fair share over time: the decay formula, the fair-share factor, the arbiter's
//! rules (priority, reclaim within a cohort, fair share, guarantees), a property test over
//! random arrival sequences, and a scenario like Ray #63790 on the in-memory cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use escher_client::Task;
use escher_proto::types::{ResourceSet, TaskId};
use proptest::prelude::*;

use super::*;
use crate::{ClusterApi, InMemoryCluster, Mode};

fn set(text: &str) -> ResourceSet {
    text.parse().unwrap()
}

fn hours(h: f64) -> HalfLife {
    HalfLife::from_secs(h * 3600.0).unwrap()
}

fn job(namespace: &str, resources: &str) -> Job {
    Job {
        namespace: namespace.into(),
        priority: None,
        resources: set(resources),
        on_preempt: OnPreempt::Requeue,
    }
}

fn admitted(decisions: &[Decision]) -> Vec<JobId> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Admit { job, .. } => Some(*job),
            Decision::Preempt { .. } => None,
        })
        .collect()
}

fn preempted(decisions: &[Decision]) -> Vec<(JobId, Reason)> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt { job, reason, .. } => Some((*job, *reason)),
            Decision::Admit { .. } => None,
        })
        .collect()
}

#[test]
fn a_half_life_of_zero_negative_or_not_finite_is_refused() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = HalfLife::from_secs(bad).unwrap_err();
        assert!(matches!(err, FairTimeError::HalfLife(_)), "{err:?}");
        assert!(err.to_string().contains("above 0"), "{err}");
    }
    assert!(HalfLife::from_duration(Duration::ZERO).is_err());
    assert_eq!(HalfLife::from_secs(60.0).unwrap().secs(), 60.0);
}

#[test]
fn bad_namespaces_and_priorities_are_refused_and_change_nothing() {
    let config = FairTimeConfig::new(hours(1.0));
    let err = config
        .clone()
        .namespace(Namespace::new("a").priority(1001))
        .unwrap_err();
    assert_eq!(err, FairTimeError::Priority(1001));
    assert!(err.to_string().contains("-1000..=1000"), "{err}");
    assert!(
        config
            .clone()
            .namespace(Namespace::new("a").weight(0))
            .is_err()
    );
    let config = config.namespace(Namespace::new("a")).unwrap();
    assert_eq!(
        config.clone().namespace(Namespace::new("a")).unwrap_err(),
        FairTimeError::Duplicate("a".into())
    );
    let mut arbiter = Arbiter::new(config);
    let mut high = job("a", "cpu=1");
    high.priority = Some(-1001);
    assert_eq!(
        arbiter.arrive(high).unwrap_err(),
        FairTimeError::Priority(-1001)
    );
    assert_eq!(
        arbiter.arrive(job("b", "cpu=1")).unwrap_err(),
        FairTimeError::UnknownNamespace("b".into())
    );
    assert!(arbiter.decide(0).is_empty(), "nothing was queued");
    assert!(ResourceWeights::default().set("cpu", -1.0).is_err());
    assert!(ResourceWeights::default().set("cpu", f64::NAN).is_err());
}

#[test]
fn usage_halves_with_every_half_life() {
    let h = HalfLife::from_secs(100.0).unwrap();
    let mut usage = DecayedUsage::new(h);
    usage.record("a", 1000.0, 0);
    usage.advance(100_000);
    assert!((usage.usage("a") - 500.0).abs() < 1e-9);
    usage.advance(300_000);
    assert!((usage.usage("a") - 125.0).abs() < 1e-9);
    assert_eq!(usage.usage("nobody"), 0.0);
}

#[test]
fn continuous_usage_is_the_decayed_integral_however_often_it_is_updated() {
    let h = HalfLife::from_secs(100.0).unwrap();
    let mut once = DecayedUsage::new(h);
    let mut often = DecayedUsage::new(h);
    once.set_rate("a", 2.0, 0);
    often.set_rate("a", 2.0, 0);
    once.advance(100_000);
    for t in 1..=1000 {
        often.advance(t * 100);
    }
    // ∫₀¹⁰⁰ 2 · 2^(-(100−s)/100) ds = 2 · 100/ln 2 · (1 − ½).
    let exact = 2.0 * 100.0 / std::f64::consts::LN_2 * 0.5;
    assert!(
        (once.usage("a") - exact).abs() < 1e-9,
        "{}",
        once.usage("a")
    );
    assert!(
        (often.usage("a") - exact).abs() < 1e-6,
        "{}",
        often.usage("a")
    );
    // Without decay it would be 200: one half-life forgets a good part of it.
    assert!(exact < 200.0 && exact > 100.0);
}

#[test]
fn the_factor_is_one_for_no_use_a_half_at_the_share_and_falls_beyond() {
    assert_eq!(fair_share_factor(0.0, 0.0, 1.0, 2.0), 1.0);
    assert_eq!(fair_share_factor(0.0, 10.0, 1.0, 2.0), 1.0);
    assert!((fair_share_factor(5.0, 10.0, 1.0, 2.0) - 0.5).abs() < 1e-12);
    assert!((fair_share_factor(10.0, 10.0, 1.0, 2.0) - 0.25).abs() < 1e-12);
    // A bigger weight makes the same usage weigh less.
    assert!(fair_share_factor(5.0, 10.0, 3.0, 4.0) > fair_share_factor(5.0, 10.0, 1.0, 4.0));
}

#[test]
fn mig_slices_weigh_their_compute_slices() {
    let w = ResourceWeights::default();
    assert_eq!(w.of("gpu"), 8.0);
    assert!((w.of("mig.3g.40gb") - 8.0 * 3.0 / 7.0).abs() < 1e-12);
    assert!((w.of("mig.1g.10gb") - 8.0 / 7.0).abs() < 1e-12);
    assert_eq!(
        w.of("mig.MIG-0c3f"),
        0.0,
        "a slice's identity weighs nothing"
    );
    assert!((w.of("memory") * 1024.0 - 0.25).abs() < 1e-12);
    assert_eq!(w.of("fs-top-a"), 0.0);
    let cost = w.cost(&set("cpu=2,mig.2g.20gb=1,mig.MIG-1=1"));
    assert!((cost - (2.0 + 16.0 / 7.0)).abs() < 1e-9, "{cost}");
}

/// The cluster's capacity as a round reads it names everything the cluster has: a job that
/// asks for a resource no node has waits, and so does every job while no node's capacity is
/// known yet (a worker that has registered and not attached shows none). A capacity given
/// with `set_capacity` limits only what it names.
#[test]
fn a_resource_the_cluster_does_not_have_admits_nothing_until_it_appears() {
    let config = FairTimeConfig::new(HalfLife::from_secs(600.0).unwrap())
        .namespace(Namespace::new("a"))
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    let cpu = arbiter.arrive(job("a", "cpu=1")).unwrap();
    let gpu = arbiter.arrive(job("a", "cpu=1,gpu=1")).unwrap();

    arbiter.set_cluster_capacity(&ResourceSet::new());
    assert_eq!(admitted(&arbiter.decide(0)), [], "no capacity known yet");
    arbiter.set_cluster_capacity(&set("cpu=4"));
    assert_eq!(admitted(&arbiter.decide(1)), [cpu], "no node has a GPU");
    arbiter.set_cluster_capacity(&set("cpu=4,gpu=1"));
    assert_eq!(admitted(&arbiter.decide(2)), [gpu]);

    let mut open = Arbiter::new(arbiter.config().clone());
    let other = open.arrive(job("a", "cpu=1,gpu=1")).unwrap();
    open.set_capacity(&set("cpu=4"));
    assert_eq!(admitted(&open.decide(0)), [other], "only cpu is limited");
}

/// Two namespaces keep the cluster busy; `a` ran the whole cluster for the day before.
#[test]
fn heavy_past_usage_gets_less_until_it_decays() {
    let config = FairTimeConfig::new(HalfLife::from_secs(600.0).unwrap())
        .namespace(Namespace::new("a"))
        .unwrap()
        .namespace(Namespace::new("b"))
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&set("cpu=4"));
    arbiter.record_usage("a", 4.0 * 86_400.0, 0).unwrap();
    let shares = arbiter.shares(0);
    // All the usage is a's, with half the weight: 2^(-1/0.5).
    assert!(
        shares[0].factor == 0.25 && shares[1].factor == 1.0,
        "{shares:?}"
    );

    // Every minute each namespace has 8 one-CPU jobs waiting; the running ones end.
    let mut got: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut running: Vec<JobId> = Vec::new();
    let mut waiting: BTreeMap<&str, usize> = BTreeMap::new();
    for minute in 0..240u64 {
        let now = minute * 60_000;
        for id in running.drain(..) {
            arbiter.end(id, now).unwrap();
        }
        for ns in ["a", "b"] {
            while waiting.get(ns).copied().unwrap_or(0) < 8 {
                arbiter.arrive(job(ns, "cpu=1")).unwrap();
                *waiting.entry(ns).or_default() += 1;
            }
        }
        let decisions = arbiter.decide(now);
        assert!(preempted(&decisions).is_empty(), "nothing needs preempting");
        let mut this = BTreeMap::from([("a", 0.0), ("b", 0.0)]);
        for d in &decisions {
            if let Decision::Admit { job, namespace } = d {
                running.push(*job);
                let ns = if namespace == "a" { "a" } else { "b" };
                *waiting.get_mut(ns).unwrap() -= 1;
                *this.get_mut(ns).unwrap() += 1.0;
            }
        }
        arbiter.sanity_check().unwrap();
        for (ns, cpus) in this {
            got.entry(ns).or_default().push(cpus);
        }
    }
    let share = |ns: &str, from: usize, to: usize| -> f64 {
        let mine: f64 = got[ns][from..to].iter().sum();
        let all: f64 =
            got["a"][from..to].iter().sum::<f64>() + got["b"][from..to].iter().sum::<f64>();
        mine / all
    };
    // The first half hour is b's: a's day of use still weighs more than b's minutes.
    assert!(share("b", 0, 30) > 0.9, "b's share {}", share("b", 0, 30));
    // Three hours on (18 half-lives), a's past is forgotten: they split the cluster.
    let late = share("a", 180, 240);
    assert!((0.4..=0.6).contains(&late), "a's late share {late}");
}

fn two(guarantee_a: &str, guarantee_b: &str, cohort: bool) -> Arbiter {
    let mut a = Namespace::new("a").guarantee(set(guarantee_a));
    let mut b = Namespace::new("b").guarantee(set(guarantee_b));
    if cohort {
        a = a.cohort("team");
        b = b.cohort("team");
    }
    let config = FairTimeConfig::new(hours(1.0))
        .namespace(a)
        .unwrap()
        .namespace(b)
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&set("cpu=4"));
    arbiter
}

#[test]
fn a_cohort_lends_idle_guarantee_and_takes_it_back() {
    let mut arbiter = two("cpu=2", "cpu=2", true);
    let a: Vec<JobId> = (0..4)
        .map(|_| arbiter.arrive(job("a", "cpu=1")).unwrap())
        .collect();
    assert_eq!(
        admitted(&arbiter.decide(0)),
        a,
        "a borrows b's idle guarantee"
    );
    let b1 = arbiter.arrive(job("b", "cpu=1")).unwrap();
    let decisions = arbiter.decide(1000);
    // The most recently admitted of a's (ties: the highest id) makes room.
    assert_eq!(preempted(&decisions), vec![(a[3], Reason::Reclaim)]);
    assert_eq!(admitted(&decisions), vec![b1]);
    assert!(arbiter.is_waiting(a[3]), "requeued");
    let b2 = arbiter.arrive(job("b", "cpu=1")).unwrap();
    let decisions = arbiter.decide(2000);
    assert_eq!(preempted(&decisions), vec![(a[2], Reason::Reclaim)]);
    assert_eq!(admitted(&decisions), vec![b2]);
    // Beyond its guarantee b cannot reclaim, and a is within its own: nothing moves.
    arbiter.arrive(job("b", "cpu=1")).unwrap();
    assert!(arbiter.decide(3000).is_empty());
    arbiter.sanity_check().unwrap();
}

#[test]
fn no_cohort_no_borrowing() {
    let mut arbiter = two("cpu=2", "cpu=2", false);
    let a: Vec<JobId> = (0..3)
        .map(|_| arbiter.arrive(job("a", "cpu=1")).unwrap())
        .collect();
    assert_eq!(admitted(&arbiter.decide(0)), a[..2].to_vec());
}

#[test]
fn higher_priority_preempts_and_the_spec_says_requeue_or_fail() {
    let config = FairTimeConfig::new(hours(1.0))
        .namespace(Namespace::new("batch").priority(-10))
        .unwrap()
        .namespace(Namespace::new("prod").priority(100))
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&set("cpu=4"));
    let mut keep = job("batch", "cpu=2");
    keep.on_preempt = OnPreempt::Fail;
    let first = arbiter.arrive(keep).unwrap();
    let second = arbiter.arrive(job("batch", "cpu=2")).unwrap();
    arbiter.decide(0);
    let urgent = arbiter.arrive(job("prod", "cpu=3")).unwrap();
    let decisions = arbiter.decide(1000);
    let stops: Vec<_> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Preempt {
                job,
                then,
                reason,
                for_job,
                ..
            } => Some((*job, *then, *reason, *for_job)),
            Decision::Admit { .. } => None,
        })
        .collect();
    assert_eq!(
        stops,
        vec![
            (second, OnPreempt::Requeue, Reason::Priority, urgent),
            (first, OnPreempt::Fail, Reason::Priority, urgent),
        ]
    );
    assert_eq!(admitted(&decisions), vec![urgent]);
    assert!(arbiter.is_waiting(second));
    assert!(
        !arbiter.is_waiting(first) && !arbiter.is_admitted(first),
        "failed, gone"
    );
}

#[test]
fn a_namespace_within_its_guarantee_is_not_preempted_even_for_higher_priority() {
    let config = FairTimeConfig::new(hours(1.0))
        .namespace(Namespace::new("low").guarantee(set("cpu=4")))
        .unwrap()
        .namespace(Namespace::new("high").priority(500))
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&set("cpu=4"));
    for _ in 0..4 {
        arbiter.arrive(job("low", "cpu=1")).unwrap();
    }
    arbiter.decide(0);
    let waits = arbiter.arrive(job("high", "cpu=1")).unwrap();
    assert!(arbiter.decide(1000).is_empty());
    assert!(arbiter.is_waiting(waits));
}

#[test]
fn an_under_share_namespace_preempts_an_over_share_one_of_equal_priority() {
    let mut arbiter = two("", "", false);
    let a: Vec<JobId> = (0..4)
        .map(|_| arbiter.arrive(job("a", "cpu=1")).unwrap())
        .collect();
    arbiter.decide(0);
    let b: Vec<JobId> = (0..4)
        .map(|_| arbiter.arrive(job("b", "cpu=1")).unwrap())
        .collect();
    let decisions = arbiter.decide(600_000);
    // b used nothing, a used ten minutes of the whole cluster: b takes half, and no more (a
    // third would leave b holding more per weight than a).
    assert_eq!(
        preempted(&decisions),
        vec![(a[3], Reason::FairShare), (a[2], Reason::FairShare)]
    );
    assert_eq!(admitted(&decisions), b[..2].to_vec());
    // The next round does not swap back.
    assert!(preempted(&arbiter.decide(601_000)).is_empty());
}

#[derive(Debug, Clone)]
enum Step {
    Arrive {
        ns: usize,
        priority: Option<i32>,
        cpu: u64,
        gpu: u64,
        fail: bool,
    },
    End(usize),
    Decide(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..4usize, prop::option::of(-3..=3i32), 1..=3u64, 0..=1u64, any::<bool>())
            .prop_map(|(ns, priority, cpu, gpu, fail)| Step::Arrive { ns, priority, cpu, gpu, fail }),
        2 => (0..64usize).prop_map(Step::End),
        3 => (1..=600_000u64).prop_map(Step::Decide),
    ]
}

fn namespaces() -> impl Strategy<Value = Vec<(u32, i32, u64, u64, Option<u8>)>> {
    prop::collection::vec(
        (
            1..=3u32,
            -3..=3i32,
            0..=4u64,
            0..=1u64,
            prop::option::of(0..2u8),
        ),
        4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever arrives and ends, in any order: every preemption takes a job of a namespace
    /// that holds more than its guarantee at that moment, admitted jobs never exceed the
    /// capacity, and what is admitted and preempted is what the model expects.
    #[test]
    fn a_namespace_within_its_guarantee_is_never_preempted(
        spec in namespaces(),
        steps in prop::collection::vec(step(), 1..120),
    ) {
        let mut config = FairTimeConfig::new(HalfLife::from_secs(300.0).unwrap());
        let mut guarantees = Vec::new();
        for (i, (weight, priority, cpu, gpu, cohort)) in spec.iter().enumerate() {
            let guarantee = set(&format!("cpu={cpu},gpu={gpu}"));
            let mut ns = Namespace::new(format!("n{i}")).weight(*weight).priority(*priority).guarantee(guarantee.clone());
            if let Some(c) = cohort {
                ns = ns.cohort(format!("c{c}"));
            }
            config = config.namespace(ns).unwrap();
            guarantees.push(guarantee);
        }
        let mut arbiter = Arbiter::new(config);
        arbiter.set_capacity(&set("cpu=8,gpu=2"));
        let mut now = 0;
        let mut demand: BTreeMap<JobId, (usize, u64, u64)> = BTreeMap::new();
        let mut running: Vec<JobId> = Vec::new();
        for step in steps {
            match step {
                Step::Arrive { ns, priority, cpu, gpu, fail } => {
                    let mut j = job(&format!("n{ns}"), &format!("cpu={cpu},gpu={gpu}"));
                    j.priority = priority;
                    j.on_preempt = if fail { OnPreempt::Fail } else { OnPreempt::Requeue };
                    let id = arbiter.arrive(j).unwrap();
                    demand.insert(id, (ns, cpu, gpu));
                }
                Step::End(k) => {
                    if !running.is_empty() {
                        let id = running.remove(k % running.len());
                        arbiter.end(id, now).unwrap();
                    }
                }
                Step::Decide(dt) => {
                    now += dt;
                    // The model: what each namespace holds, from the jobs it has running.
                    let mut held = vec![(0u64, 0u64); 4];
                    for id in &running {
                        let (ns, cpu, gpu) = demand[id];
                        held[ns].0 += cpu;
                        held[ns].1 += gpu;
                    }
                    for d in arbiter.decide(now) {
                        match d {
                            Decision::Admit { job, .. } => {
                                let (ns, cpu, gpu) = demand[&job];
                                held[ns].0 += cpu;
                                held[ns].1 += gpu;
                                running.push(job);
                            }
                            Decision::Preempt { job, .. } => {
                                let (ns, cpu, gpu) = demand[&job];
                                let g = &guarantees[ns];
                                let within = held[ns].0 * 10_000 <= g.get("cpu").raw()
                                    && held[ns].1 * 10_000 <= g.get("gpu").raw();
                                prop_assert!(!within, "preempted {job:?} of n{ns} holding {:?} within {g}", held[ns]);
                                prop_assert!(running.contains(&job));
                                held[ns].0 -= cpu;
                                held[ns].1 -= gpu;
                                running.retain(|r| *r != job);
                            }
                        }
                    }
                    let cpus: u64 = held.iter().map(|h| h.0).sum();
                    let gpus: u64 = held.iter().map(|h| h.1).sum();
                    prop_assert!(cpus <= 8 && gpus <= 2, "{held:?}");
                    prop_assert_eq!(arbiter.sanity_check(), Ok(()));
                    for id in &running {
                        prop_assert!(arbiter.is_admitted(*id));
                    }
                }
            }
        }
    }
}

/// Ray #63790 (concurrent GPU jobs starve), here: 8 jobs of 3 tenants on one simulated GPU
/// cut into three `mig.2g.20gb` slices (the in-memory cluster's slices are resources: it has
/// no MIG devices), each job 100 s of work on one slice. Tenant a's four arrive first and fill
/// the GPU; b's three come 10 s later, c's one 20 s later. Shared fairly, one slice each,
/// tenant t's k-th job would be done `k × 100 s` after t arrived; each must finish within 1.5
/// times that, and none may starve. Submitted straight to the head, first come first served,
/// c's job waits behind everyone's and takes 2.5 times as long.
#[tokio::test]
async fn concurrent_gpu_jobs_of_three_tenants_none_starves() {
    let fair = run_gpu_jobs(true).await;
    let fifo = run_gpu_jobs(false).await;
    let arrivals = [("a", 0u64, 4usize), ("b", 10, 3), ("c", 20, 1)];
    let mut index = 0;
    for (tenant, arrival, jobs) in arrivals {
        for k in 1..=jobs as u64 {
            let fair_time = k * 100;
            let took = fair[index] - arrival;
            assert!(
                took as f64 <= 1.5 * fair_time as f64,
                "{tenant}'s job {k} took {took} s, fair share {fair_time} s: {fair:?}"
            );
            index += 1;
        }
    }
    let c_fifo = fifo[7] - 20;
    assert!(
        c_fifo as f64 > 1.5 * 100.0,
        "first come first served: c took {c_fifo} s ({fifo:?})"
    );
}

/// Runs the 8 jobs; when each was done (s), in submission order.
async fn run_gpu_jobs(policy: bool) -> Vec<u64> {
    let cluster = InMemoryCluster::new(Mode::Manual);
    cluster.add_node("cpu=16,mig.2g.20gb=3");
    let mut config = FairTimeConfig::new(HalfLife::from_secs(3600.0).unwrap());
    for t in ["a", "b", "c"] {
        let ns = Namespace::new(t)
            .guarantee(set("cpu=1,mig.2g.20gb=1"))
            .cohort("gpu");
        config = config.namespace(ns).unwrap();
    }
    let fair = FairTime::new(cluster.clone(), config).await.unwrap();
    let spec = || {
        Task::function("train", Vec::new())
            .resources_str("cpu=1,mig.2g.20gb=1")
            .build()
            .unwrap()
    };
    let arrivals = [("a", 0u64, 4usize), ("b", 10, 3), ("c", 20, 1)];
    let mut jobs: Vec<JobId> = Vec::new();
    let mut direct: Vec<TaskId> = Vec::new();
    let mut started: BTreeMap<TaskId, u64> = BTreeMap::new();
    let mut done: BTreeMap<usize, u64> = BTreeMap::new();
    for t in (0..2000).step_by(5) {
        for (tenant, at, n) in arrivals {
            if at == t {
                for _ in 0..n {
                    if policy {
                        jobs.push(
                            fair.submit(tenant, spec(), None, OnPreempt::Requeue)
                                .unwrap(),
                        );
                    } else {
                        direct.extend(cluster.submit(vec![spec()]).await.unwrap());
                    }
                }
            }
        }
        // Work done: a task that ran 100 s ends.
        for (task, _) in cluster.running() {
            let since = *started.entry(task).or_insert(t);
            if t - since >= 100 {
                cluster.finish(task, true);
                let i = if policy {
                    jobs.iter().position(|j| fair.task_of(*j) == Some(task))
                } else {
                    direct.iter().position(|d| *d == task)
                };
                done.insert(i.unwrap(), t);
            }
        }
        if policy {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            fair.round(t * 1000).await.unwrap();
        }
        for (task, _) in cluster.running() {
            started.entry(task).or_insert(t);
        }
        if done.len() == 8 {
            break;
        }
    }
    assert_eq!(done.len(), 8, "every job finished: {done:?}");
    if policy {
        assert!(
            jobs.iter().any(|j| fair.preemptions(*j) > 0),
            "a's borrowed slices were reclaimed"
        );
    }
    done.into_values().collect()
}

/// On the in-memory cluster: a high-priority job preempts a running one whose spec says fail;
/// the cancelled task ends cancelled, the job is recorded as preempted, and bad requests are
/// refused with nothing queued.
#[tokio::test]
async fn the_driver_cancels_a_preempted_task_and_records_that_it_failed() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    cluster.add_node("cpu=2");
    let config = FairTimeConfig::new(hours(1.0))
        .namespace(Namespace::new("batch"))
        .unwrap()
        .namespace(Namespace::new("prod").priority(10))
        .unwrap();
    let fair = FairTime::new(cluster.clone(), config).await.unwrap();
    let spec = || {
        Task::function("f", Vec::new())
            .resources_str("cpu=2")
            .build()
            .unwrap()
    };
    let err = fair
        .submit("nobody", spec(), None, OnPreempt::Fail)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("namespace nobody is not configured"),
        "{err}"
    );
    let err = fair
        .submit("prod", spec(), Some(5000), OnPreempt::Fail)
        .unwrap_err();
    assert!(
        err.to_string().contains("priority 5000 is outside"),
        "{err}"
    );
    assert!(
        fair.round(0).await.unwrap().is_empty(),
        "nothing was queued"
    );

    let batch = fair.submit("batch", spec(), None, OnPreempt::Fail).unwrap();
    fair.round(1000).await.unwrap();
    let JobState::Admitted(task) = fair.state(batch).unwrap() else {
        panic!("{:?}", fair.state(batch));
    };
    assert_eq!(cluster.running().len(), 1);
    let prod = fair
        .submit("prod", spec(), None, OnPreempt::Requeue)
        .unwrap();
    let decisions = fair.round(2000).await.unwrap();
    assert_eq!(preempted(&decisions), vec![(batch, Reason::Priority)]);
    assert_eq!(fair.state(batch).unwrap(), JobState::Preempted);
    assert_eq!(fair.preemptions(batch), 1);
    let status = cluster.status(task).await.unwrap();
    assert_eq!(status.state, escher_proto::types::TaskState::Cancelled);
    let now_running = fair.task_of(prod).unwrap();
    assert_eq!(
        cluster.running().iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![now_running]
    );
    // Its end is heard, and the job is ended.
    cluster.finish(now_running, true);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    fair.round(3000).await.unwrap();
    assert_eq!(fair.state(prod).unwrap(), JobState::Ended(now_running));
    assert!(fair.shares(3000).iter().all(|s| s.holds.is_empty()));
}

/// The worked example of docs/esls.md, "Fair share over time", step by step.
#[test]
fn the_worked_example_of_the_docs() {
    let config = FairTimeConfig::new(hours(24.0))
        .namespace(
            Namespace::new("research")
                .guarantee(set("cpu=16,gpu=2"))
                .cohort("lab"),
        )
        .unwrap()
        .namespace(
            Namespace::new("prod")
                .weight(2)
                .priority(100)
                .guarantee(set("cpu=32,gpu=4"))
                .cohort("lab"),
        )
        .unwrap()
        .namespace(Namespace::new("students"))
        .unwrap();
    let mut arbiter = Arbiter::new(config);
    arbiter.set_capacity(&set("cpu=64,gpu=8"));
    for (ns, usage) in [
        ("research", 600_000.0),
        ("prod", 300_000.0),
        ("students", 100_000.0),
    ] {
        arbiter.record_usage(ns, usage, 0).unwrap();
    }
    let factors: Vec<f64> = arbiter.shares(0).iter().map(|s| s.factor).collect();
    // Name order: prod, research, students.
    for (got, want) in factors.iter().zip([0.66, 0.19, 0.76]) {
        assert!((got - want).abs() < 0.005, "{factors:?}");
    }
    // A day later, with no use, research's usage has halved.
    let research = arbiter.clone().shares(86_400_000)[1].usage;
    assert!((research - 300_000.0).abs() < 1e-6, "{research}");

    // 1. Six research jobs, four on prod's idle guarantee.
    let research: Vec<JobId> = (0..6)
        .map(|_| arbiter.arrive(job("research", "cpu=4,gpu=1")).unwrap())
        .collect();
    assert_eq!(admitted(&arbiter.decide(0)), research);
    // 2. prod takes two GPUs back: research's two most recent jobs (prod's priority is
    // higher, the first reason checked; it would be a reclaim at equal priorities).
    let prod = arbiter.arrive(job("prod", "cpu=8,gpu=2")).unwrap();
    let decisions = arbiter.decide(1000);
    assert_eq!(
        preempted(&decisions),
        vec![
            (research[5], Reason::Priority),
            (research[4], Reason::Priority)
        ]
    );
    assert_eq!(admitted(&decisions), vec![prod]);
    // 3. students, in no cohort, take a free GPU of the cluster.
    let students = arbiter.arrive(job("students", "gpu=1")).unwrap();
    let decisions = arbiter.decide(2000);
    // research's two requeued jobs still wait: the cohort's quota is full.
    assert_eq!(admitted(&decisions), vec![students]);
    // 4. research's seventh waits: no reclaim, and its F is below students'.
    let seventh = arbiter.arrive(job("research", "cpu=4,gpu=1")).unwrap();
    assert!(arbiter.decide(3000).is_empty());
    assert!(arbiter.is_waiting(seventh));
    arbiter.sanity_check().unwrap();
}
