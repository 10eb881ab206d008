use super::*;
use crate::{InMemoryCluster, Mode};

/// A logistic performance curve: `1 / (1 + e^{-(a - mid)/scale})`.
fn logistic(a: f64, mid: f64, scale: f64) -> f64 {
    1.0 / (1.0 + (-(a - mid) / scale).exp())
}

fn learned(points: &[(f64, f64)]) -> Learner {
    let mut l = Learner::new(LearnerConfig::default());
    for (a, p) in points {
        for _ in 0..4 {
            l.observe(*a, *p);
        }
    }
    l
}

#[test]
fn bounds_hold_the_truth_and_tighten_with_data() {
    let truth = |a: f64| logistic(a, 20.0, 4.0);
    let empty = Learner::new(LearnerConfig::default());
    assert_eq!((empty.lcb(10.0), empty.ucb(10.0)), (0.0, 1.0));
    let points: Vec<(f64, f64)> = (0..=40)
        .step_by(5)
        .map(|a| (a as f64, truth(a as f64)))
        .collect();
    let l = learned(&points);
    for a in 0..=40 {
        let a = a as f64;
        assert!(
            l.lcb(a) <= truth(a) + 1e-9 && truth(a) <= l.ucb(a) + 1e-9,
            "at {a}"
        );
    }
    // Observed points are bounded tightly: noise 0.05, 4 samples, z = 1.645.
    assert!(l.ucb(20.0) - l.lcb(20.0) < 0.1);
    // Monotonicity carries a bound across: the UCB below a point never exceeds its bound.
    assert!(l.ucb(3.0) <= l.ucb(5.0) + 1e-12);
}

#[test]
fn njc_gives_small_demands_in_full_and_splits_the_rest() {
    // The worked example: R = 100, share 20; 14 and 19 are met; 67 left for three.
    let split = njc_split(&[14.0, 19.0, 29.0, 44.0, 59.0], 100.0);
    assert_eq!(&split[..2], &[14.0, 19.0]);
    for s in &split[2..] {
        assert!((s - 67.0 / 3.0).abs() < 1e-9);
    }
    // A demand that falls below the recomputed share is met in the second pass.
    let split = njc_split(&[10.0, 22.0, 80.0], 90.0);
    assert_eq!(split, vec![10.0, 22.0, 58.0]);
    // Everyone below the share: everyone gets their demand, the rest stays idle.
    assert_eq!(njc_split(&[1.0, 2.0], 10.0), vec![1.0, 2.0]);
}

#[test]
fn njc_is_strategy_proof_on_demands() {
    let truthful = [14.0, 19.0, 29.0, 44.0, 59.0];
    let honest = njc_split(&truthful, 100.0)[2];
    for factor in [0.5, 2.0] {
        let mut lie = truthful;
        lie[2] *= factor;
        let got = njc_split(&lie, 100.0)[2];
        // What a liar gets, counted up to its true demand, never beats the truth.
        assert!(
            got.min(truthful[2]) <= honest.min(truthful[2]) + 1e-9,
            "×{factor}"
        );
    }
}

#[test]
fn every_objective_respects_the_pool_and_the_budget() {
    let curves = [(5.0, 2.0), (10.0, 3.0), (25.0, 3.0), (40.0, 4.0)];
    let learners: Vec<Learner> = curves
        .iter()
        .map(|(m, s)| {
            learned(
                &(0..=60)
                    .step_by(3)
                    .map(|a| (a as f64, logistic(a as f64, *m, *s)))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let previous = [25, 25, 25, 25];
    for objective in Objective::ALL {
        let views: Vec<JobView<'_>> = learners
            .iter()
            .zip(previous)
            .map(|(l, p)| JobView {
                learner: l,
                slo: 0.95,
                previous: p,
                previous_demand: Some(p as f64),
            })
            .collect();
        let config = RoundConfig {
            total: 100,
            ..RoundConfig::default()
        };
        let d = decide(objective, &views, config);
        assert!(d.allocations.iter().sum::<u64>() <= 100, "{objective:?}");
        if objective != Objective::ResourceFair {
            for (a, p) in d.allocations.iter().zip(previous) {
                assert!(a.abs_diff(p) <= 10 + 1, "{objective:?} moved {p} to {a}");
            }
        }
    }
}

/// A noiseless instance: each round the jobs report exactly their performance; NJC settles on
/// the allocation the NJC procedure gives for the true demands.
#[test]
fn njc_converges_on_a_noiseless_instance() {
    let curves = [(5.0, 2.0), (10.0, 3.0), (22.0, 3.0), (40.0, 4.0)];
    let slo: f64 = 0.95;
    let demand = |(m, s): (f64, f64)| m + s * (slo / (1.0 - slo)).ln();
    let truth = njc_split(&curves.map(demand), 100.0);
    let mut learners: Vec<Learner> = curves
        .iter()
        .map(|_| Learner::new(LearnerConfig::default()))
        .collect();
    let mut alloc = vec![25u64; 4];
    let mut demands: Vec<Option<f64>> = vec![None; 4];
    for _ in 0..60 {
        for (j, (m, s)) in curves.iter().enumerate() {
            learners[j].observe(alloc[j] as f64, logistic(alloc[j] as f64, *m, *s));
        }
        let views: Vec<JobView<'_>> = learners
            .iter()
            .enumerate()
            .map(|(j, l)| JobView {
                learner: l,
                slo,
                previous: alloc[j],
                previous_demand: demands[j],
            })
            .collect();
        let config = RoundConfig {
            total: 100,
            ..RoundConfig::default()
        };
        let d = decide(Objective::Njc, &views, config);
        alloc = d.allocations;
        demands = d.demands.into_iter().map(Some).collect();
    }
    for (a, t) in alloc.iter().zip(&truth) {
        assert!(
            (*a as f64 - t).abs() <= 3.0,
            "allocations {alloc:?}, truth {truth:?}"
        );
    }
}

#[test]
fn place_keeps_jobs_where_they_were_and_fits_the_nodes() {
    let sizes = [(NodeId(1), 4), (NodeId(2), 4), (NodeId(3), 4)];
    let before = BTreeMap::from([(NodeId(2), 3)]);
    let out = place(&sizes, &[(before, 5), (BTreeMap::new(), 6)]);
    assert_eq!(out[0].get(&NodeId(2)), Some(&3));
    assert_eq!(out[0].values().sum::<u64>(), 5);
    assert_eq!(out[1].values().sum::<u64>(), 6);
    for (node, size) in sizes {
        let used: u64 = out.iter().filter_map(|p| p.get(&node)).sum();
        assert!(used <= size);
    }
}

#[tokio::test]
async fn rounds_set_each_jobs_capacities_to_its_allocation() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    for _ in 0..3 {
        cluster.add_node("cpu=4");
    }
    let mut cil = Cilantro::new(
        cluster.clone(),
        "t",
        Domain::All,
        "cpu",
        Objective::ResourceFair,
    )
    .unwrap();
    cil.add_job("a", 0.9).unwrap();
    cil.add_job("b", 0.9).unwrap();
    let alloc = cil.round().await.unwrap();
    assert_eq!(alloc, BTreeMap::from([("a".into(), 6), ("b".into(), 6)]));
    let status = ClusterApi::cluster_status(&cluster).await.unwrap();
    for job in ["a", "b"] {
        let name = format!("cil-t-{job}");
        let total: f64 = status
            .nodes
            .iter()
            .filter_map(|n| n.resource(&name))
            .map(|r| match r.total {
                Capacity::Finite(a) => a.as_f64(),
                Capacity::Unbounded => f64::INFINITY,
            })
            .sum();
        assert_eq!(total, 6.0, "{name}");
    }
    assert!(cil.spec("a").unwrap().resources.contains("cil-t-a"));
    assert!(cil.report("nobody", 1, 0.5).is_err());
    cil.dissolve().await.unwrap();
    let status = ClusterApi::cluster_status(&cluster).await.unwrap();
    assert!(status.nodes.iter().all(|n| n.resource("cil-t-a").is_none()));
}
