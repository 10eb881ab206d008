//! Actors: method calls to one actor, and actors created then called, escher beside Ray in
//! the same run (docs/DESIGN.md §17's targets: a call's round trip ≤ 1/3 of Ray's, pipelined
//! calls ≥ 3× Ray's rate, creation to first call ≤ ½ of Ray's).
//!
//! escher's side is its Rust client against a `LocalCluster` of one worker (`cpu=4`) hosting a
//! Rust actor class whose `noop` method returns at once: the caller resolves the actor once and
//! then calls the hosting worker's data plane directly. Ray's side (`benches/peers/
//! ray_driver.py --actors`) is Ray's Python driver and a Python actor, as Ray's own
//! `ray microbenchmark` measures actor calls: the peer's figures are labelled so. The same
//! measurement from a Python driver on both sides is `escher-bench python`.
//!
//! - round trip: `call("noop")` one after another (Ray: `ray.get(a.noop.remote())`);
//! - pipelined: as many calls in flight as `actor_pipelined`, then every answer (Ray:
//!   `ray.get([a.noop.remote() for ...])`);
//! - creation to first call: create an actor holding one CPU, call it once, kill it.

use std::time::{Duration, Instant};

use escher::{ActorClass, Task};
use serde_json::json;

use super::Ctx;
use crate::cluster;
use crate::report::{Figure, WorkloadReport};
use crate::stats::Summary;

/// Calls made first and not counted.
const WARMUP: usize = 100;
/// The class the workload's worker hosts.
const CLASS: &str = "BenchActor";

/// The actor class of the workload: `noop` answers at once.
pub fn class() -> ActorClass {
    struct Bench;
    ActorClass::new(CLASS, |_ctx, (): ()| async move { Ok(Bench) })
        .method("noop", |_b: &mut Bench, (): ()| Ok(()))
}

/// Runs the actors workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let p = &ctx.params;
    let mut report = WorkloadReport::new(
        "actors",
        "actors: method-call round trips, pipelined calls, creation to first call",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "1 in-process worker, cpu=4",
        "escher": "Rust client, a Rust actor (cpu=0), calls straight to the hosting worker",
        "ray": "Python driver, a Python actor (num_cpus=0), ray_driver.py --actors",
        "round_trips": p.actor_round_trips,
        "pipelined": p.actor_pipelined,
        "creations": p.actor_creations,
        "warmup": WARMUP,
    });
    let cluster = cluster::builder(1, "cpu=4")?
        .functions(cluster::functions().actor(class()))
        .start()
        .await?;
    let client = cluster.client().await?;
    let limit = ctx.limit(Duration::from_secs(60));

    let actor = client
        .actor(Task::actor_typed(CLASS, &()).resources_str("cpu=0"))
        .await?;
    for _ in 0..WARMUP {
        tokio::time::timeout(limit, actor.call::<(), ()>("noop", &())).await??;
    }
    let mut samples = Vec::with_capacity(p.actor_round_trips);
    for _ in 0..p.actor_round_trips {
        let start = Instant::now();
        tokio::time::timeout(limit, actor.call::<(), ()>("noop", &())).await??;
        samples.push(start.elapsed());
    }
    let rt = Summary::of_ms(&samples);

    let start = Instant::now();
    let calls = (0..p.actor_pipelined).map(|_| actor.call::<(), ()>("noop", &()));
    let answers = tokio::time::timeout(limit, futures_util::future::join_all(calls)).await?;
    let wall = start.elapsed();
    for answer in answers {
        answer?;
    }
    let pipelined = p.actor_pipelined as f64 / wall.as_secs_f64();
    drop(actor);

    let mut creations = Vec::with_capacity(p.actor_creations);
    for _ in 0..p.actor_creations {
        let start = Instant::now();
        let fresh = client
            .actor(Task::actor_typed(CLASS, &()).resources_str("cpu=1"))
            .await?;
        tokio::time::timeout(limit, fresh.call::<(), ()>("noop", &())).await??;
        creations.push(start.elapsed());
        fresh.kill(true).await?;
    }
    let created = Summary::of_ms(&creations);

    report.figures.push(
        Figure::new(
            "actors.round_trip.p50",
            "actor method call round trip, p50 (escher: Rust; Ray: Python)",
            "ms",
            rt.p50,
        )
        .vs("ray", "actors.round_trip.p50"),
    );
    report.figures.push(Figure::new(
        "actors.round_trip.p99",
        "actor method call round trip, p99 (escher: Rust)",
        "ms",
        rt.p99,
    ));
    report.figures.push(
        Figure::new(
            "actors.pipelined",
            "actor method calls in flight at once, answered (escher: Rust; Ray: Python)",
            "calls/s",
            pipelined,
        )
        .vs("ray", "actors.pipelined"),
    );
    report.figures.push(
        Figure::new(
            "actors.create_to_first_call.p50",
            "an actor created and its first call answered, p50 (escher: Rust; Ray: Python)",
            "ms",
            created.p50,
        )
        .vs("ray", "actors.create_to_first_call.p50"),
    );
    report.detail = json!({
        "round_trip_ms": rt,
        "pipelined_calls_per_s": pipelined,
        "create_to_first_call_ms": created,
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}

/// One target: the figure, the target in words, its unit, which drivers the two sides used,
/// and whether a ratio to Ray's meets it.
type Rule = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    fn(f64) -> bool,
);

/// The actor targets of docs/DESIGN.md §17, where the workload ran: each figure against Ray's
/// from the same run.
pub fn targets(figs: &[&Figure]) -> Vec<crate::report::TargetCheck> {
    use crate::report::{TargetCheck, num, ratio};
    let find = |id: &str| figs.iter().copied().find(|f| f.id == id);
    let rules: [Rule; 6] = [
        (
            "python.actor_round_trip_p50_ms",
            "actor call round trip from one Python driver, p50 ≤ 1/3 of Ray's",
            "ms",
            "both from Python",
            |r| r <= 1.0 / 3.0,
        ),
        (
            "python.actor_calls_per_s",
            "pipelined actor calls from one Python driver ≥ 3× Ray's rate",
            "calls/s",
            "both from Python",
            |r| r >= 3.0,
        ),
        (
            "python.actor_create_to_first_call_p50_ms",
            "actor creation to first call from Python, p50 ≤ ½ of Ray's",
            "ms",
            "both from Python",
            |r| r <= 0.5,
        ),
        (
            "actors.round_trip.p50",
            "actor call round trip from Rust, p50 ≤ 1/3 of Ray's",
            "ms",
            "escher from Rust, Ray from Python",
            |r| r <= 1.0 / 3.0,
        ),
        (
            "actors.pipelined",
            "pipelined actor calls from Rust ≥ 3× Ray's rate",
            "calls/s",
            "escher from Rust, Ray from Python",
            |r| r >= 3.0,
        ),
        (
            "actors.create_to_first_call.p50",
            "actor creation to first call from Rust, p50 ≤ ½ of Ray's",
            "ms",
            "escher from Rust, Ray from Python",
            |r| r <= 0.5,
        ),
    ];
    let mut checks = Vec::new();
    for (id, target, unit, drivers, met) in rules {
        let Some(f) = find(id) else { continue };
        checks.push(match &f.peer {
            Some(p) => TargetCheck {
                target: target.into(),
                measured: format!(
                    "{} vs Ray {} {unit} = {} ({drivers})",
                    num(f.escher),
                    num(p.value),
                    ratio(p.ratio)
                ),
                met: Some(met(p.ratio)),
            },
            None => TargetCheck {
                target: target.into(),
                measured: format!("{} {unit}; Ray did not run", num(f.escher)),
                met: None,
            },
        });
    }
    checks
}
