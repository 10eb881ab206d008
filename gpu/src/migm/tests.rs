//! MIGM's behaviour on the simulated GPU: schemes A and B, OOM restart, early restart.

use escher_proto::mig::{GpuModel, Layout};
use escher_proto::types::TaskId;

use super::*;
use crate::{GpuPolicy, JobModel, MemoryModel, Sequential, SimGpu, TaskModel, run};

const A100: GpuModel = GpuModel::A100_40GB;

/// Every layout the GPU went through is legal.
fn assert_legal_history(gpu: &SimGpu) {
    for (at, layout) in gpu.history() {
        layout
            .validate()
            .unwrap_or_else(|e| panic!("illegal layout at {at} ms: {e}"));
    }
}

/// Runs `jobs` (task id i+1) under `policy`; the time the last one finished, in seconds.
fn makespan(policy: &mut dyn GpuPolicy, gpu: &mut SimGpu, jobs: &[JobModel]) -> f64 {
    for (i, job) in jobs.iter().enumerate() {
        gpu.add_task(TaskId(i as u64 + 1), TaskModel::Batch(*job));
    }
    let report = run(policy, gpu, 10_000_000);
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    assert_legal_history(gpu);
    report.finished_at.expect("all jobs finish") as f64 / 1000.0
}

fn migm(scheme: Scheme, early: bool, jobs: &[JobModel], estimates: &[Option<f64>]) -> Migm {
    let mut m = Migm::new(A100, scheme, early);
    for (i, job) in jobs.iter().enumerate() {
        m.submit(MigmJob {
            task: TaskId(i as u64 + 1),
            memory_gb: estimates[i],
            iterations: job.iterations,
        });
    }
    m
}

fn sequential(jobs: &[JobModel]) -> f64 {
    let mut s = Sequential::new(A100);
    for i in 0..jobs.len() {
        s.submit(TaskId(i as u64 + 1));
    }
    makespan(&mut s, &mut SimGpu::new(Layout::new(A100), 100), jobs)
}

fn estimates(jobs: &[JobModel]) -> Vec<Option<f64>> {
    jobs.iter()
        .map(|j| Some(j.memory.peak(j.iterations)))
        .collect()
}

#[test]
fn small_jobs_run_seven_at_a_time() {
    // Hm2/Hm3-like: 14 jobs of 4 GB that use one GPC each.
    let jobs = vec![JobModel::fixed(20.0, 1, 4.0); 14];
    let base = sequential(&jobs);
    for scheme in [Scheme::BySize, Scheme::Fifo] {
        let mut m = migm(scheme, false, &jobs, &estimates(&jobs));
        let mut gpu = SimGpu::new(Layout::new(A100), 100);
        let t = makespan(&mut m, &mut gpu, &jobs);
        let speedup = base / t;
        // Seven 1g instances, two rounds, plus 1.5 s of instance creation.
        assert!(speedup > 6.0 && speedup < 7.0, "{scheme:?}: {speedup}");
        assert!(gpu.history().iter().any(|(_, l)| l.len() == 7));
    }
}

#[test]
fn scheme_b_beats_scheme_a_on_the_4g_3g_asymmetry() {
    // Ml3-like: 18 jobs of 18 GB that can use 4 GPCs. Scheme A deals 9 to the 4g and 9 to the
    // 3g, so the 3g's lane finishes last; scheme B gives the next job to whichever instance
    // is free.
    let jobs = vec![JobModel::fixed(10.0, 4, 18.0); 18];
    let a = makespan(
        &mut migm(Scheme::BySize, false, &jobs, &estimates(&jobs)),
        &mut SimGpu::new(Layout::new(A100), 100),
        &jobs,
    );
    let mut gpu = SimGpu::new(Layout::new(A100), 100);
    let b = makespan(
        &mut migm(Scheme::Fifo, false, &jobs, &estimates(&jobs)),
        &mut gpu,
        &jobs,
    );
    // Two 20 GB instances are a 4g and a 3g (MIGM §5.2.1).
    assert!(
        gpu.history()
            .iter()
            .any(|(_, l)| l.to_string() == "4g.20gb@0,3g.20gb@4")
    );
    let base = sequential(&jobs);
    assert!(b < a, "B {b} s should beat A {a} s");
    assert!(base / a > 1.0 && base / b > base / a);
}

#[test]
fn scheme_a_beats_scheme_b_on_a_mixed_queue() {
    // Ht1-like: small, medium and full jobs interleaved. B waits behind the full job; A runs
    // the small ones together first.
    let small = JobModel::fixed(10.0, 1, 4.0);
    let medium = JobModel::fixed(10.0, 3, 15.0);
    let full = JobModel::fixed(10.0, 7, 30.0);
    let mut jobs = Vec::new();
    for i in 0..12 {
        jobs.push(if i % 4 == 3 {
            full
        } else if i % 4 == 1 {
            medium
        } else {
            small
        });
    }
    let est = estimates(&jobs);
    let a = makespan(
        &mut migm(Scheme::BySize, false, &jobs, &est),
        &mut SimGpu::new(Layout::new(A100), 100),
        &jobs,
    );
    let b = makespan(
        &mut migm(Scheme::Fifo, false, &jobs, &est),
        &mut SimGpu::new(Layout::new(A100), 100),
        &jobs,
    );
    let base = sequential(&jobs);
    assert!(a < b && b < base, "A {a}, B {b}, sequential {base}");
}

#[test]
fn oom_restart_keeps_the_task_id_and_grows_the_slice() {
    // Estimated at 4 GB, really 8 GB: starts on a 1g.5gb, fails, runs again on a 2g.10gb.
    let jobs = [JobModel::fixed(10.0, 1, 8.0)];
    for scheme in [Scheme::BySize, Scheme::Fifo] {
        let mut m = migm(scheme, false, &jobs, &[Some(4.0)]);
        let mut gpu = SimGpu::new(Layout::new(A100), 100);
        makespan(&mut m, &mut gpu, &jobs);
        let task = TaskId(1);
        let r = m.restarts();
        assert_eq!(r.len(), 1, "{scheme:?}");
        assert_eq!((r[0].task, r[0].reason), (task, RestartReason::OutOfMemory));
        assert_eq!((r[0].from.profile.name, r[0].to_class), ("1g.5gb", 10));
        let stats = gpu.stats(task).unwrap();
        assert_eq!(stats.attempts, 2);
        assert!(stats.finished_at.is_some());
        assert!(m.failed().is_empty());
    }
}

/// A Qwen2-like job: 4.1 GB growing 0.081 GB per iteration over 100 iterations (peak about
/// 12.2 GB; out of memory on a 10 GB slice around iteration 73).
fn growing_job() -> JobModel {
    JobModel {
        work_s: 100.0,
        parallelism: 2,
        pcie_bound: false,
        memory: MemoryModel::Growing {
            base_gb: 4.1,
            per_iteration_gb: 0.081,
            jitter_gb: 0.15,
            seed: 3,
        },
        iterations: 100,
    }
}

#[test]
fn early_restart_fires_before_the_oom_when_the_predictor_converges() {
    let jobs = [growing_job()];
    let oom_at = (1..=100).find(|&i| jobs[0].memory.at(i) > 10.0).unwrap();
    let mut results = Vec::new();
    for early in [false, true] {
        // Estimated at 9 GB: a 2g.10gb, too small by the end.
        let mut m = migm(Scheme::Fifo, early, &jobs, &[Some(9.0)]);
        let mut gpu = SimGpu::new(Layout::new(A100), 100);
        makespan(&mut m, &mut gpu, &jobs);
        let r = m.restarts()[0];
        assert_eq!(r.task, TaskId(1));
        assert_eq!(r.to_class, 20);
        let stats = gpu.stats(TaskId(1)).unwrap().clone();
        assert_eq!(stats.attempts, 2);
        results.push((r, stats.wasted_gpc_s));
    }
    let (late, late_waste) = results[0];
    let (early, early_waste) = results[1];
    assert_eq!(late.reason, RestartReason::OutOfMemory);
    assert_eq!(early.reason, RestartReason::Predicted);
    assert!(
        late.iteration + 1 >= oom_at - 1,
        "OOM at {}",
        late.iteration
    );
    assert!(
        early.iteration <= 15,
        "predicted at iteration {}",
        early.iteration
    );
    assert!(
        early_waste * 5.0 < late_waste,
        "{early_waste} vs {late_waste}"
    );
}

#[test]
fn a_job_too_big_for_the_gpu_is_refused_not_hung() {
    let mut m = Migm::new(A100, Scheme::Fifo, false);
    m.submit(MigmJob {
        task: TaskId(9),
        memory_gb: Some(64.0),
        iterations: 1,
    });
    assert_eq!(m.failed(), [TaskId(9)]);
    assert!(m.is_done());
}
