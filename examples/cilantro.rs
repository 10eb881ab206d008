//! Cilantro as an ESL (thesis chapter 3): the synthetic 5-user experiment.
//!
//! Run it with `cargo run --release --example cilantro`. The application is
//! `examples/apps/src/cilantro.rs` (shared with `escher-bench cilantro` and the tests). Five jobs
//! with logistic performance curves share 100 CPUs; the ESL learns each job's curve from what
//! its monitor task reports and sets the jobs' resources each round. It prints each policy's
//! utilities and welfare, the jobs NJC lifts over resource-fair, and what misreporting gets.

use escher_apps as apps;

use apps::cilantro::{Config, Experiment, Report, SOURCE, lifted};
use apps::common::{AnyResult, check, policy_lines};
use escher::esl::cilantro::Objective;

#[tokio::main]
async fn main() -> AnyResult<()> {
    let mut exp = Experiment::start().await?;
    let config = Config {
        rounds: 150,
        noise: 0.05,
        job3: Report::Truthful,
        seed: 1,
    };
    println!(
        "Cilantro: 5 jobs, 100 CPUs, {} rounds; the application's policy lines: {}",
        config.rounds,
        policy_lines(SOURCE)
    );
    let mut outcomes = Vec::new();
    for objective in Objective::ALL {
        let o = exp.run(objective, config).await?;
        println!(
            "   {:>14}: utilities {:.2?}, welfare {:.3}, egalitarian {:.3}, NJC fairness {:.2}",
            o.objective, o.utilities, o.social_welfare, o.egalitarian_welfare, o.njc_fairness
        );
        outcomes.push(o);
    }
    let (njc, fair) = (&outcomes[0], &outcomes[3]);
    let up = lifted(njc, fair);
    println!("   NJC lifts over resource-fair: {up:.2?} (job, ratio)");
    check(
        outcomes.iter().all(|o| o.violations == 0),
        "every round within the pool and the budget",
    )?;
    check(!up.is_empty(), "NJC lifts some jobs over resource-fair")?;
    for (name, report) in [
        ("claims x2 demand", Report::Scaled(0.5)),
        ("claims x0.5 demand", Report::Scaled(2.0)),
    ] {
        let o = exp
            .run(
                Objective::Njc,
                Config {
                    job3: report,
                    ..config
                },
            )
            .await?;
        println!(
            "   job 3 {name}: true utility {:.3} (truthful {:.3})",
            o.utilities[2], njc.utilities[2]
        );
    }
    exp.shutdown().await;
    Ok(())
}
