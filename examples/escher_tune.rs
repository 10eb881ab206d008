//! E4 of the thesis' evaluation: EscherTune, a training job that migrates to consolidate
//! (Fig. 4.6b).
//!
//! Run it with `cargo run --release --example escher_tune`. The application is
//! `examples/apps/src/tune.rs` (shared with `escher-bench e4` and the tests). Five short one-slot
//! jobs, then a 4-worker job that must start spread over 3 nodes of 4 slots; the migration ESL
//! moves it onto one node once a short job's end leaves room, with unchanged requests. It
//! prints the long job's throughput with and without migration.

use escher_apps as apps;

use apps::common::{AnyResult, check, policy_lines};
use apps::tune::{Costs, Policy, SOURCE, Tune};

#[tokio::main]
async fn main() -> AnyResult<()> {
    let mut tune = Tune::start(Costs::default()).await?;
    println!(
        "EscherTune on 3 nodes x 4 slots; the migration policy takes {} lines",
        policy_lines(SOURCE)
    );
    let fixed = tune.run(Policy::Static).await?;
    let moving = tune.run(Policy::EscherTune).await?;
    for o in [&fixed, &moving] {
        println!(
            "   {:>12}: {:.3} steps/s over {:.1} s, {} migration(s), ends on {} node(s)",
            o.policy.name(),
            o.throughput,
            o.duration_s,
            o.migrations,
            o.final_nodes
        );
    }
    check(
        moving.migrations >= 1 && moving.final_nodes == 1,
        "the job moved onto one node",
    )?;
    check(
        moving.requests_unchanged,
        "the relaunched tasks carry the first launch's requests",
    )?;
    check(
        moving.throughput > fixed.throughput,
        "migration raises the long job's throughput",
    )?;
    println!(
        "   throughput gain: +{:.1}%",
        100.0 * (moving.throughput / fixed.throughput - 1.0)
    );
    tune.shutdown().await;
    Ok(())
}
