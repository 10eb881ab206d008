//! Criterion benchmarks of the scheduler core alone (no runtime, no network).
//!
//! - `dispatch_1000_nodes`: decisions per second for single-resource tasks on 1,000 nodes;
//! - `unrelated_resources/N`: one decision (submit, dispatch, finish) with N unrelated ephemeral
//!   resources in the table (target: flat);
//! - `requested_resources/K`: one decision for a task requesting K ephemeral resources
//!   (target: K = 100 costs at most 2x K = 1).
//!
//! Run: `cargo bench -p escher-core --bench scheduler`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use escher_core::scheduler::{Decision, Event, Scheduler};
use escher_proto::types::{
    Amount, Capacity, CapacityOp, Labels, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId,
};

fn cluster(nodes: u64, cpus: u64) -> Scheduler {
    let mut core = Scheduler::new();
    let mut out = Vec::new();
    for n in 0..nodes {
        let resources = vec![(
            ResourceName::cpu(),
            Capacity::Finite(Amount::units(cpus).unwrap()),
        )];
        core.handle(
            Event::NodeAdded {
                node: NodeId(n),
                resources,
                labels: Labels::new(),
            },
            0,
            &mut out,
        )
        .unwrap();
    }
    core
}

fn add_resources(core: &mut Scheduler, count: u64, nodes: u64, everywhere: bool) {
    let mut out = Vec::new();
    for i in 0..count {
        let name = ResourceName::new(&format!("er-{i}")).unwrap();
        let targets: Vec<u64> = if everywhere {
            (0..nodes).collect()
        } else {
            vec![i % nodes]
        };
        for n in targets {
            let op = CapacityOp::Set(Capacity::Finite(Amount::units(1_000_000).unwrap()));
            core.handle(
                Event::ResourceChanged {
                    target: NodeSpec::Node(NodeId(n)),
                    name: name.clone(),
                    op,
                },
                0,
                &mut out,
            )
            .unwrap();
        }
    }
}

/// Runs `iters` submit-dispatch-finish cycles and returns the time they took.
fn cycles(core: &mut Scheduler, req: &ResourceSet, first_id: &mut u64, iters: u64) -> Duration {
    let mut out = Vec::with_capacity(4);
    let start = Instant::now();
    for _ in 0..iters {
        *first_id += 1;
        let task = TaskId(*first_id);
        core.handle(
            Event::TaskSubmitted {
                task,
                resources: req.clone(),
                deadline: None,
                time_limit: None,
            },
            0,
            &mut out,
        )
        .unwrap();
        debug_assert!(matches!(out.last(), Some(Decision::Dispatch { .. })));
        core.handle(Event::TaskFinished { task }, 0, &mut out)
            .unwrap();
        out.clear();
    }
    black_box(&out);
    start.elapsed()
}

fn dispatch_1000_nodes(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_1000_nodes");
    let batch = 8_000u64; // fills 1,000 nodes x 8 cpus exactly
    group.throughput(Throughput::Elements(batch));
    group.bench_function("submit_8000_then_finish", |b| {
        let mut core = cluster(1_000, 8);
        let req: ResourceSet = "cpu=1".parse().unwrap();
        let mut next = 0u64;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut out = Vec::with_capacity(batch as usize);
            for _ in 0..iters {
                let first = next;
                let start = Instant::now();
                for _ in 0..batch {
                    next += 1;
                    let ev = Event::TaskSubmitted {
                        task: TaskId(next),
                        resources: req.clone(),
                        deadline: None,
                        time_limit: None,
                    };
                    core.handle(ev, 0, &mut out).unwrap();
                }
                total += start.elapsed();
                assert_eq!(out.len() as u64, batch, "every task dispatched");
                out.clear();
                for t in first + 1..=next {
                    core.handle(Event::TaskFinished { task: TaskId(t) }, 0, &mut out)
                        .unwrap();
                }
            }
            total
        });
    });
    group.finish();
}

fn unrelated_resources(c: &mut Criterion) {
    let mut group = c.benchmark_group("unrelated_resources");
    for count in [0u64, 1_000, 10_000, 100_000] {
        let mut core = cluster(50, 8);
        add_resources(&mut core, count, 50, false);
        let req: ResourceSet = "cpu=1".parse().unwrap();
        let mut next = 0;
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(BenchmarkId::from_parameter(count), &count, |b, _| {
            b.iter_custom(|iters| cycles(&mut core, &req, &mut next, iters));
        });
    }
    group.finish();
}

fn requested_resources(c: &mut Criterion) {
    let mut group = c.benchmark_group("requested_resources");
    let mut core = cluster(50, 8);
    add_resources(&mut core, 1_000, 50, true);
    let mut next = 0;
    for k in [1u64, 10, 50, 100] {
        let req: ResourceSet = (0..k)
            .map(|i| format!("er-{i}=1"))
            .collect::<Vec<_>>()
            .join(",")
            .parse()
            .unwrap();
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, _| {
            b.iter_custom(|iters| cycles(&mut core, &req, &mut next, iters));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = dispatch_1000_nodes, unrelated_resources, requested_resources
}
criterion_main!(benches);
