//! The partitioning policy on fleets of simulated A100s and H100s: mixed profiles served with
//! no layout planned by hand, gangs on one parent GPU, idle slices reused first, adoption after
//! a restart, driver errors at every phase of a reconfiguration, bad input; and, after every
//! run, the history check that no slice was ever held by two tasks at once.

use escher_proto::mig::{GpuModel, JobModel, LatencyModel, Layout, Placement};
use escher_proto::types::TaskId;

use super::fleet::{Fleet, Phase, Placer, compare_packing, workload};
use super::{Partitioner, Request, SubmitError};
use crate::Command;

const TICK_MS: u64 = 50;

fn job(s: f64) -> JobModel {
    JobModel::fixed(s, 7, 1.0)
}

/// Steps until every submitted task has launched (or `limit` steps).
fn until_launched(fleet: &mut Fleet, policy: &mut dyn Placer, limit: usize) {
    for _ in 0..limit {
        if fleet.times.values().all(|(_, l)| l.is_some()) {
            return;
        }
        fleet.step(policy);
    }
}

/// The checks every run ends with: no slice held by two tasks at once, no command refused by
/// a GPU, nothing launched on a failed GPU.
fn clean(fleet: &Fleet) {
    assert!(
        fleet.double_holds().is_empty(),
        "{:?}",
        fleet.double_holds()
    );
    assert!(fleet.refused.is_empty(), "{:?}", fleet.refused);
    assert!(
        fleet.launched_on_failed.is_empty(),
        "{:?}",
        fleet.launched_on_failed
    );
}

fn layout(model: GpuModel, slices: &[(&str, u8)]) -> Layout {
    let mut l = Layout::new(model);
    for (name, start) in slices {
        l.insert(Placement::new(model.profile(name).unwrap(), *start))
            .unwrap();
    }
    l
}

#[test]
fn mixed_profiles_are_served_on_a100s_and_h100s_without_a_layout_planned_by_hand() {
    let models = [
        GpuModel::A100_40GB,
        GpuModel::A100_40GB,
        GpuModel::H100_80GB,
        GpuModel::H100_80GB,
    ];
    let mut fleet = Fleet::new(models.iter().map(|m| Layout::new(*m)).collect(), TICK_MS);
    let mut p = Partitioner::new();
    let asks = [
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
        "mig.1g.10gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "1g.5gb",
        "1g.20gb",
    ];
    for (i, a) in asks.iter().enumerate() {
        fleet
            .submit(&mut p, Request::single(TaskId(i as u64 + 1), a), job(5.0))
            .unwrap();
    }
    until_launched(&mut fleet, &mut p, 40_000);
    clean(&fleet);
    let (launched, _, _) = fleet.admission();
    assert_eq!(
        launched,
        asks.len(),
        "{:?}",
        p.pending().collect::<Vec<_>>()
    );
    // The first request on each GPU waited one reshaping: the modelled create time plus at
    // most a round (simulated time).
    let create = LatencyModel::default().create.as_millis() as u64;
    let mut firsts: Vec<u64> = Vec::new();
    for g in 0..models.len() {
        if let Some(h) = fleet
            .holds
            .iter()
            .filter(|h| h.gpu == g)
            .min_by_key(|h| h.from_ms)
        {
            let (submitted, launched) = fleet.times[&h.task];
            firsts.push(launched.unwrap() - submitted);
        }
    }
    assert_eq!(firsts.len(), models.len());
    assert!(firsts.iter().all(|w| *w <= create + 100), "{firsts:?}");
    // Every task holds a slice of the profile it asked for, on a GPU whose model has it.
    for h in &fleet.holds {
        let asked = asks[h.task.0 as usize - 1];
        let name = asked.strip_prefix("mig.").unwrap_or(asked);
        assert_eq!(h.slice.profile.name, name);
        assert!(models[h.gpu].profile(name).is_some());
    }
}

#[test]
fn a_gang_of_two_slices_lands_on_one_parent_gpu() {
    // An idle 3g on each GPU: a gang of two 3g must not take one from each.
    let m = GpuModel::A100_40GB;
    let mut fleet = Fleet::new(
        vec![layout(m, &[("3g.20gb", 4)]), layout(m, &[("3g.20gb", 4)])],
        TICK_MS,
    );
    let mut p = Partitioner::new();
    let gang = Request::gang(&[(TaskId(1), "3g.20gb"), (TaskId(2), "3g.20gb")]);
    fleet.submit(&mut p, gang, job(60.0)).unwrap();
    until_launched(&mut fleet, &mut p, 2000);
    clean(&fleet);
    assert_eq!(fleet.holds.len(), 2);
    assert_eq!(fleet.holds[0].gpu, fleet.holds[1].gpu, "{:?}", fleet.holds);
    assert_ne!(fleet.holds[0].slice, fleet.holds[1].slice);
    // Both members launched in the same round.
    assert_eq!(fleet.holds[0].from_ms, fleet.holds[1].from_ms);
}

#[test]
fn idle_slices_are_reused_before_any_reconfiguration_and_reclaimed_only_under_pressure() {
    let m = GpuModel::A100_40GB;
    let mut fleet = Fleet::new(
        vec![layout(
            m,
            &[
                ("2g.10gb", 0),
                ("2g.10gb", 2),
                ("1g.5gb", 4),
                ("1g.5gb", 5),
                ("1g.5gb", 6),
            ],
        )],
        TICK_MS,
    );
    let mut p = Partitioner::new();
    fleet
        .submit(&mut p, Request::single(TaskId(1), "1g.5gb"), job(60.0))
        .unwrap();
    fleet
        .submit(&mut p, Request::single(TaskId(2), "1g.5gb"), job(60.0))
        .unwrap();
    fleet.step(&mut p);
    // Both launched at once on slices that existed; the layout never changed.
    assert_eq!(fleet.holds.len(), 2);
    assert_eq!(fleet.gpus[0].history().len(), 1);
    // A 3g needs room: on an A100-40GB it starts at 0 or 4, and 4 is busy, so the two idle 2g
    // at 0 and 2 are destroyed, and only those (the idle 1g at 6 stays).
    fleet
        .submit(&mut p, Request::single(TaskId(3), "3g.20gb"), job(60.0))
        .unwrap();
    let orders = p.round(&fleet.views());
    let destroyed: Vec<String> = orders
        .iter()
        .filter_map(|(_, c)| match c {
            Command::Destroy(p) => Some(p.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(destroyed, ["2g.10gb@0", "2g.10gb@2"], "{orders:?}");
    assert!(
        orders
            .iter()
            .any(|(_, c)| c.to_string() == "create 3g.20gb@0"),
        "{orders:?}"
    );
}

#[test]
fn slices_are_adopted_as_they_are_after_a_restart() {
    let m = GpuModel::H100_80GB;
    let mut fleet = Fleet::new(vec![Layout::new(m), Layout::new(m)], TICK_MS);
    let mut first = Partitioner::new();
    for (i, a) in ["3g.40gb", "2g.20gb", "1g.10gb"].iter().enumerate() {
        fleet
            .submit(
                &mut first,
                Request::single(TaskId(i as u64 + 1), a),
                job(120.0),
            )
            .unwrap();
    }
    until_launched(&mut fleet, &mut first, 2000);
    // A request is being served by a reshaping when the policy restarts.
    fleet
        .submit(
            &mut first,
            Request::single(TaskId(4), "4g.40gb"),
            job(120.0),
        )
        .unwrap();
    fleet.step(&mut first);
    let before: Vec<Layout> = fleet.views().into_iter().map(|v| v.layout).collect();
    // The restarted policy knows nothing; the cluster still has task 4 pending and submits it
    // again, and a new task 5 asks for a profile an idle or new slice can serve.
    let mut second = Partitioner::new();
    let views = fleet.views();
    second
        .submit(&views, Request::single(TaskId(4), "4g.40gb"), fleet.now())
        .unwrap();
    fleet
        .submit(
            &mut second,
            Request::single(TaskId(5), "1g.10gb"),
            job(10.0),
        )
        .unwrap();
    until_launched(&mut fleet, &mut second, 4000);
    clean(&fleet);
    assert_eq!(fleet.admission().0, 5);
    // The slices the first policy made and its tasks hold are still there, as they were.
    for (g, l) in before.iter().enumerate() {
        for p in l.placements() {
            let held = fleet
                .holds
                .iter()
                .any(|h| h.gpu == g && h.slice == *p && h.task.0 <= 3);
            if held {
                assert!(fleet.views()[g].layout.contains(p), "{p} on GPU {g}");
            }
        }
    }
}

#[test]
fn a_driver_error_at_each_phase_fails_the_gpu_closed() {
    let m = GpuModel::A100_40GB;
    for phase in [Phase::Destroy, Phase::Create, Phase::Ready] {
        // GPU 0: seven idle 1g slices, so a 3g there needs destroys and a create. GPU 1: one
        // 7g slice running a long task, so GPU 0 is the one reshaped first.
        let ones: Vec<(&str, u8)> = (0..7).map(|s| ("1g.5gb", s)).collect();
        let mut fleet = Fleet::new(
            vec![layout(m, &ones), layout(m, &[("7g.40gb", 0)])],
            TICK_MS,
        );
        let mut p = Partitioner::new();
        fleet
            .submit(&mut p, Request::single(TaskId(1), "7g.40gb"), job(20.0))
            .unwrap();
        fleet.step(&mut p);
        assert_eq!(fleet.holds[0].gpu, 1);
        fleet.faults.push((0, phase));
        fleet
            .submit(&mut p, Request::single(TaskId(2), "3g.20gb"), job(20.0))
            .unwrap();
        // And a 1g request after the failure: GPU 0's idle 1g slices are not used.
        until_launched(&mut fleet, &mut p, 40);
        assert!(fleet.failed_at.contains_key(&0), "{phase:?}");
        assert!(p.failed_gpus().contains_key(&0));
        fleet
            .submit(&mut p, Request::single(TaskId(3), "1g.5gb"), job(5.0))
            .unwrap();
        until_launched(&mut fleet, &mut p, 4000);
        clean(&fleet);
        // Both served on GPU 1 once its task finished; nothing ever ran on GPU 0.
        assert_eq!(
            fleet.admission().0,
            3,
            "{phase:?}: {:?}",
            p.pending().collect::<Vec<_>>()
        );
        assert!(
            fleet.holds.iter().all(|h| h.gpu == 1),
            "{phase:?}: {:?}",
            fleet.holds
        );
        assert!(
            p.failed_gpus()[&0].contains("NVML"),
            "{:?}",
            p.failed_gpus()
        );
    }
}

#[test]
fn bad_requests_are_refused_at_submit_with_nothing_queued() {
    let fleet = Fleet::new(vec![Layout::new(GpuModel::A100_40GB)], TICK_MS);
    let views = fleet.views();
    let mut p = Partitioner::new();
    let err = p
        .submit(&views, Request::single(TaskId(1), "5g.99gb"), 0)
        .unwrap_err();
    assert!(matches!(err, SubmitError::UnknownProfile { .. }), "{err}");
    assert!(err.to_string().contains("a100-40gb"), "{err}");
    // An H100 profile on an A100 fleet.
    assert!(
        p.submit(&views, Request::single(TaskId(1), "1g.20gb"), 0)
            .is_err()
    );
    let too_many = Request::gang(&[(TaskId(1), "4g.20gb"), (TaskId(2), "4g.20gb")]);
    let err = p.submit(&views, too_many, 0).unwrap_err();
    assert!(matches!(err, SubmitError::TooManyForOneGpu { .. }), "{err}");
    let empty = Request {
        members: Vec::new(),
        one_gpu: false,
    };
    assert!(p.submit(&views, empty, 0).is_err());
    let twice = Request::gang(&[(TaskId(1), "1g.5gb"), (TaskId(1), "1g.5gb")]);
    assert!(p.submit(&views, twice, 0).is_err());
    assert_eq!(p.pending().count(), 0);
    // Without a gang, slices that need not share a GPU are fine even if one GPU cannot hold
    // them all... but a single A100 cannot: they wait, with a reason.
    p.submit(&views, Request::single(TaskId(3), "4g.20gb"), 0)
        .unwrap();
    p.submit(&views, Request::single(TaskId(4), "4g.20gb"), 0)
        .unwrap();
    let orders = p.round(&views);
    assert!(orders.iter().all(|(g, _)| *g == 0));
    // A reconfiguration is in flight on the only GPU: the second request waits with a reason,
    // and no second reconfiguration is ordered.
    let creates = orders
        .iter()
        .filter(|(_, c)| matches!(c, Command::Create(_)))
        .count();
    assert_eq!(creates, 1, "{orders:?}");
    let reasons: Vec<String> = p.pending().map(|q| q.reason.clone()).collect();
    assert!(
        reasons[1].contains("no GPU can make 4g.20gb"),
        "{reasons:?}"
    );
}

#[test]
fn no_slice_is_ever_held_by_two_tasks_under_a_random_workload_with_faults() {
    let models = [
        GpuModel::A100_40GB,
        GpuModel::A100_40GB,
        GpuModel::A100_40GB,
    ];
    for seed in 0..4 {
        let arrivals = workload(&models, 30, 30_000, seed);
        let mut fleet = Fleet::new(models.iter().map(|m| Layout::new(*m)).collect(), TICK_MS);
        fleet.faults.push((
            2,
            [Phase::Destroy, Phase::Create, Phase::Ready][seed as usize % 3],
        ));
        let mut p = Partitioner::new();
        let mut next = 0;
        while fleet.now() < 1_500_000 {
            while next < arrivals.len() && arrivals[next].0 <= fleet.now() {
                let (_, r, j) = arrivals[next].clone();
                fleet.submit(&mut p, r, j).unwrap();
                next += 1;
            }
            fleet.step(&mut p);
        }
        clean(&fleet);
        // Every gang's members on one GPU.
        for (_, r, _) in &arrivals {
            if r.one_gpu {
                let gpus: Vec<usize> = fleet
                    .holds
                    .iter()
                    .filter(|h| r.members.iter().any(|m| m.0 == h.task))
                    .map(|h| h.gpu)
                    .collect();
                assert!(gpus.windows(2).all(|w| w[0] == w[1]), "{gpus:?}");
            }
        }
        // Everything was served in the end (no request starved), on two GPUs if one failed.
        assert_eq!(
            fleet.admission().0,
            fleet.times.len(),
            "seed {seed}: {:?}",
            p.pending().collect::<Vec<_>>()
        );
    }
}

#[test]
fn the_packing_comparison_runs_the_same_workload_for_every_policy() {
    let models = [GpuModel::A100_40GB, GpuModel::A100_40GB];
    let arrivals = workload(&models, 40, 30_000, 7);
    let rows = compare_packing(&models, &arrivals, 1_000_000, 100);
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r.double_holds, 0, "{r:?}");
        assert_eq!(r.submitted, rows[0].submitted);
        println!("{r:?}");
    }
    // The partitioner serves every task; the static layout cannot serve a 4g (it has none).
    assert_eq!(rows[0].launched, rows[0].submitted);
    assert!(rows[2].launched < rows[2].submitted);
}
