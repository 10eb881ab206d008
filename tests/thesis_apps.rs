//! The thesis' application experiments (thesis §4.6.1 and §3.7.3) at small sizes: each runs the
//! examples' own application (`examples/apps/`) on an embedded cluster and checks its qualitative
//! claim. The figures come from `escher-bench e1 e2 e3 e4 cilantro`, never from these tests:
//! nothing here compares a duration.

use escher_apps as apps;

use apps::common::{Clock, policy_lines};
use escher::esl::cilantro::{Objective, njc_split};

type Result = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test]
async fn wordcount_locality_reads_every_chunk_where_it_lies() -> Result {
    use apps::wordcount::{Costs, Outcome, Placement, SOURCE, WordCount};
    assert_eq!(policy_lines(SOURCE), 2, "the thesis' two lines");
    let costs = Costs {
        clock: Clock { ms_per_s: 2.0 },
        ..Costs::default()
    };
    let wc = WordCount::start(12, 3, costs, 5).await?;
    let out = wc.compare(1000.0, 1).await?;
    let get = |p| Outcome::of(&out, p);
    let (unaware, esl, hard) = (
        get(Placement::Unaware),
        get(Placement::Esl),
        get(Placement::HardCoded),
    );
    // The job itself checks that every word was counted; here, where the maps ran.
    assert_eq!((esl.local_maps, esl.transfer_share), (12, 0.0), "{esl:?}");
    assert_eq!(
        (hard.local_maps, hard.transfer_share),
        (12, 0.0),
        "{hard:?}"
    );
    assert!(unaware.local_maps < 12, "{unaware:?}");
    assert!(unaware.transfer_share > esl.transfer_share, "{unaware:?}");
    // One job per placement: its makespan is the only one.
    assert_eq!(esl.makespans_s, [esl.makespan_s]);
    wc.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn hierarchical_fair_shares_converge_to_the_weights_and_stay() -> Result {
    use apps::hfs::{Config, run};
    let config = Config {
        nodes: 20,
        task_s: 4.0,
        rebalance_s: 2.0,
        tolerance: 2,
        clock: Clock { ms_per_s: 25.0 },
    };
    let out = run(config).await?;
    let targets = [[20, 0, 0], [8, 12, 0], [4, 6, 10]];
    for (phase, target) in out.phases.iter().zip(targets) {
        assert_eq!(phase.target, target);
        // Settled within half the phase, and every later sample of the phase within ±2.
        let after = phase.converged_after_s;
        assert!(
            after.is_some_and(|s| s <= 30.0),
            "{phase:?}\n{:?}",
            out.samples
        );
        for (mean, want) in phase.mean.iter().zip(target) {
            assert!((mean - want as f64).abs() <= 2.0, "{phase:?}");
        }
    }
    assert!(out.tasks > 0);
    assert_eq!(
        out.local, out.tasks,
        "fairness AND locality: every map on its chunk's node"
    );
    // B's and C's arrivals take nodes from A and then from A and B, which withdraw what they
    // had queued there: found with one read of their pending tasks per step, not a call per
    // task (a call per task kept the drivers from their own nodes at 100 nodes).
    assert!(out.withdrawn > 0, "{out:?}");
    assert!(
        out.lookups < out.withdrawn,
        "{} reads to withdraw {} tasks",
        out.lookups,
        out.withdrawn
    );
    Ok(())
}

#[tokio::test]
async fn alphazero_er_policy_co_locates_every_pair() -> Result {
    use apps::alphazero::{AlphaZero, Costs, Placement, SOURCE};
    assert!(policy_lines(SOURCE) <= 6);
    let az = AlphaZero::start(4, Costs::default()).await?;
    for p in [Placement::Er, Placement::HardCoded] {
        let o = az.run(p, 8, 2, 2).await?;
        assert_eq!(o.colocated, 8, "{o:?}");
        assert_eq!(o.explorations, 16);
    }
    // Twice, so the policy's resources were dissolved and made again cleanly.
    let o = az.run(Placement::Er, 8, 1, 1).await?;
    assert_eq!(o.colocated, 8, "{o:?}");
    az.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn escher_tune_moves_the_long_job_onto_one_node_with_unchanged_requests() -> Result {
    use apps::tune::{Costs, Policy, Tune};
    let costs = Costs {
        clock: Clock { ms_per_s: 5.0 },
        ..Costs::default()
    };
    let mut tune = Tune::start(costs).await?;
    let fixed = tune.run(Policy::Static).await?;
    assert_eq!(fixed.migrations, 0);
    assert_eq!(
        fixed.final_nodes, 2,
        "it starts spread and stays: {fixed:?}"
    );
    let moving = tune.run(Policy::EscherTune).await?;
    assert_eq!(moving.migrations, 1, "{moving:?}");
    assert_eq!(moving.final_nodes, 1, "{moving:?}");
    assert!(moving.requests_unchanged);
    tune.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn cilantro_stays_within_pool_and_budget_and_converges_without_noise() -> Result {
    use apps::cilantro::{Config, Experiment, MIDPOINTS, Report, SLO};
    let mut exp = Experiment::start().await?;
    let config = Config {
        rounds: 80,
        noise: 0.0,
        job3: Report::Truthful,
        seed: 3,
    };
    for objective in Objective::ALL {
        let o = exp.run(objective, config).await?;
        assert_eq!(o.violations, 0, "{objective:?}");
        assert!(o.allocations.iter().all(|a| a.iter().sum::<u64>() <= 100));
        if objective == Objective::Njc {
            // The NJC split of the true demands (where each curve reaches the SLO).
            let demands = MIDPOINTS.map(|m| m + 3.0 * (SLO / (1.0 - SLO)).ln());
            let truth = njc_split(&demands, 100.0);
            for a in &o.allocations[o.allocations.len() - 10..] {
                for (got, want) in a.iter().zip(&truth) {
                    assert!((*got as f64 - want).abs() <= 3.0, "{a:?} vs {truth:?}");
                }
            }
        }
    }
    exp.shutdown().await;
    Ok(())
}
