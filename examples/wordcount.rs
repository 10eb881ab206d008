//! E1 of the thesis' evaluation: WordCount over 100 nodes with data locality (Fig. 4.5a/b).
//!
//! Run it with `cargo run --release --example wordcount`. The application is
//! `examples/apps/src/wordcount.rs` (shared with `escher-bench e1` and the tests); this prints,
//! for each input size, the makespan and the share of the maps' time spent moving input under
//! the three placements, and checks that the locality ESL keeps every map on its chunk's node
//! and pays no transfer, within a few percent of the hard-coded placement.

use escher_apps as apps;

use apps::common::{AnyResult, check, policy_lines};
use apps::wordcount::{Costs, Outcome, Placement, SOURCE, WordCount};

#[tokio::main]
async fn main() -> AnyResult<()> {
    let nodes = 100;
    let wc = WordCount::start(nodes, 10, Costs::default(), 7).await?;
    println!(
        "WordCount on {nodes} nodes, one chunk each; the locality policy takes {} lines",
        policy_lines(SOURCE)
    );
    println!(
        "{:>10} {:>12} {:>14} {:>16} {:>12}",
        "input", "placement", "makespan (s)", "transfer share", "local maps"
    );
    for chunk_mb in [500.0, 2000.0, 5000.0] {
        let outcomes = wc.compare(chunk_mb, 1).await?;
        for o in &outcomes {
            println!(
                "{:>8} GB {:>12} {:>14.1} {:>15.1}% {:>8}/{}",
                chunk_mb * nodes as f64 / 1000.0,
                o.placement.name(),
                o.makespan_s,
                100.0 * o.transfer_share,
                o.local_maps,
                o.maps
            );
        }
        let get = |p| Outcome::of(&outcomes, p);
        let (unaware, esl, hard) = (
            get(Placement::Unaware),
            get(Placement::Esl),
            get(Placement::HardCoded),
        );
        check(
            esl.local_maps == esl.maps && esl.transfer_share == 0.0,
            "the ESL runs every map where its chunk is",
        )?;
        check(
            unaware.transfer_share > 0.3,
            "without locality, transfer is a large share of the maps' time",
        )?;
        check(
            esl.makespan_s < unaware.makespan_s,
            "locality beats the locality-unaware placement",
        )?;
        println!(
            "   esl / hard-coded makespan: {:.3}",
            esl.makespan_s / hard.makespan_s
        );
    }
    wc.shutdown().await;
    Ok(())
}
