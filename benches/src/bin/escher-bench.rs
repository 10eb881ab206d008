//! `escher-bench`: runs the benchmark harness (see the crate docs) and prints the Markdown
//! table. Exits non-zero when a workload failed. `escher-bench compare OLD NEW` compares two
//! runs' figures instead (`compare.rs`).

use clap::Parser;
use escher_bench::compare::{self, CompareArgs};
use escher_bench::{Options, markdown, run};

/// The same allocator as the binaries it measures (the in-process clusters' heads and workers
/// allocate from many threads at once). jemalloc's per-thread caches serve that better than glibc's
/// locked arenas (docs/benchmarks-history.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    // The `gpu` workload's jobs run `escher sim-work`: this binary serves as that program.
    if std::env::args().nth(1).as_deref() == Some(escher_bench::workloads::gpu::SIM_WORK_ARG) {
        return escher_cli::main();
    }
    let outcome = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(harness()));
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn harness() -> anyhow::Result<()> {
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
