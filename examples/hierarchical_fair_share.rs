//! E2 of the thesis' evaluation: hierarchical fair sharing on 100 nodes, composed with data
//! locality (Fig. 4.5c).
//!
//! Run it with `cargo run --release --example hierarchical_fair_share`. The application is
//! `examples/apps/src/hfs.rs` (shared with `escher-bench e2` and the tests). Sub-Org1 = {A: 2,
//! B: 3} and Sub-Org2 = {C} share 100 one-slot nodes; A, B and C start at t = 0, 60, 120
//! (simulated seconds, 20 ms each). It prints the running tasks of each user over time and
//! how long each reallocation took to settle at 100 / 40-60 / 20-30-50.

use escher_apps as apps;

use apps::common::{AnyResult, Clock, check, policy_lines};
use apps::hfs::{Config, SOURCE, run};

#[tokio::main]
async fn main() -> AnyResult<()> {
    let config = Config {
        nodes: 100,
        task_s: 4.0,
        rebalance_s: 2.0,
        tolerance: 5,
        clock: Clock { ms_per_s: 20.0 },
    };
    println!(
        "HFS on {} nodes; the policies take {} lines",
        config.nodes,
        policy_lines(SOURCE)
    );
    let out = run(config).await?;
    for s in out.samples.iter().step_by(5) {
        println!(
            "   t={:>5.0}s  running A {:>3}  B {:>3}  C {:>3}",
            s.t_s, s.running[0], s.running[1], s.running[2]
        );
    }
    for p in &out.phases {
        println!(
            "   from t={:>3.0}s target {:?}: settled after {}, then mean {:.1?}",
            p.start_s,
            p.target,
            p.converged_after_s
                .map_or("never".to_string(), |s| format!("{s:.0} s")),
            p.mean
        );
    }
    check(
        out.phases
            .iter()
            .all(|p| p.converged_after_s.is_some_and(|s| s <= 30.0)),
        "each phase settles within 30 s and stays",
    )?;
    check(
        out.local == out.tasks,
        "every map ran on its chunk's node (fairness AND locality)",
    )?;
    Ok(())
}
