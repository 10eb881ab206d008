//! E3 of the thesis' evaluation: AlphaZero-style pairs, co-located and load-balanced with
//! ephemeral resources (Fig. 4.6a, 4.7).
//!
//! Run it with `cargo run --release --example alphazero`. The application is
//! `examples/apps/src/alphazero.rs` (shared with `escher-bench e3` and the tests). It prints the
//! median and P95 exploration latency of 24 aggregator/predictor pairs on 8 nodes with no
//! placement policy, with the ER policy and with hard-coded placement, and checks that the
//! ER policy co-locates every pair and beats no policy.

use escher_apps as apps;

use apps::alphazero::{AlphaZero, Costs, Placement, SOURCE};
use apps::common::{AnyResult, check, policy_lines};

#[tokio::main]
async fn main() -> AnyResult<()> {
    let (nodes, pairs) = (8, 24);
    let az = AlphaZero::start(nodes, Costs::default()).await?;
    println!(
        "AlphaZero: {pairs} pairs on {nodes} nodes; the ER policy takes {} lines",
        policy_lines(SOURCE)
    );
    println!(
        "{:>12} {:>12} {:>10} {:>12}",
        "placement", "median (ms)", "p95 (ms)", "co-located"
    );
    let mut out = Vec::new();
    for p in Placement::ALL {
        let o = az.run(p, pairs, 10, 4).await?;
        println!(
            "{:>12} {:>12.1} {:>10.1} {:>9}/{}",
            p.name(),
            o.median_s,
            o.p95_s,
            o.colocated,
            o.pairs
        );
        out.push(o);
    }
    let (none, er, hard) = (&out[0], &out[1], &out[2]);
    check(
        er.colocated == er.pairs,
        "the ER policy co-locates every pair",
    )?;
    check(
        er.median_s < none.median_s,
        "co-location beats no policy at the median",
    )?;
    println!(
        "   co-location vs none: median -{:.1}%, p95 -{:.1}%; ER / hard-coded median {:.3}",
        100.0 * (1.0 - er.median_s / none.median_s),
        100.0 * (1.0 - er.p95_s / none.p95_s),
        er.median_s / hard.median_s
    );
    az.shutdown().await;
    Ok(())
}
