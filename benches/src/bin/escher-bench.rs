//! `escher-bench`: runs the benchmark harness (see the crate docs) and prints the Markdown
//! table. Exits non-zero when a workload failed. `escher-bench compare OLD NEW` compares two
//! runs' figures instead (`compare.rs`).

use clap::Parser;
use escher_bench::compare::{self, CompareArgs};
use escher_bench::{Options, markdown, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cmd` measures its worker with a fence supervisor too: this binary serves as one.
    if std::env::args().nth(1).as_deref() == Some(escher::worker::fence::SUPERVISOR_ARG) {
        escher::worker::fence::supervise();
        return Ok(());
    }
    if std::env::args().nth(1).as_deref() == Some("compare") {
        let args = CompareArgs::parse_from(std::env::args().skip(1));
        if compare::run(&args)? && args.fail_on_worse {
            std::process::exit(1);
        }
        return Ok(());
    }
    let options = Options::parse();
    let summary = run(&options).await?;
    println!("{}", markdown(&summary));
    eprintln!(
        "escher-bench: results in {} (summary.json, results.md, one JSON per workload, PNGs)",
        options.out.display()
    );
    if !summary.failures.is_empty() {
        anyhow::bail!("failed workloads: {}", summary.failures.join("; "));
    }
    Ok(())
}
