//! The workloads W1–W8 (`BENCHMARKS.md` says what each measures), the command-task workload that
//! HyperQueue is compared on, and the head's memory under retention (docs/DESIGN.md §7). Each is
//! one `run(&Ctx) -> WorkloadReport`, bounded in time, starting and stopping its own cluster.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::size::{Params, Size};

pub mod actors;
pub mod autoscale;
pub mod cmd_tasks;
pub mod esl;
pub mod gpu;
pub mod objects;
pub mod python;
pub mod retention;
pub mod security;
pub mod thesis;
pub mod w10_failover;
pub mod w1_throughput;
pub mod w2_latency;
pub mod w3_clients;
pub mod w4_er_create;
pub mod w5_makespan;
pub mod w6_requested;
pub mod w7_gang;
pub mod w8_scale;
pub mod w9_replicated;
pub mod watch;

/// What every workload gets.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The size of the run.
    pub size: Size,
    /// The parameters at that size.
    pub params: Params,
    /// Where results go.
    pub out: PathBuf,
    /// The `escher-head` binary W8 runs as a separate process, if given.
    pub head_bin: Option<PathBuf>,
    /// The parts of the `gpu` workload to run; empty: every one.
    pub gpu_parts: Vec<gpu::Part>,
}

impl Ctx {
    /// The time limit of one wait in a workload.
    pub fn limit(&self, full: Duration) -> Duration {
        full
    }
}

/// A workload the harness can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Throughput from one client.
    W1,
    /// Submit-then-get latency.
    W2,
    /// Concurrent clients.
    W3,
    /// Ephemeral-resource creation.
    W4,
    /// Makespan against resources present.
    W5,
    /// Latency against resources requested.
    W6,
    /// Gang scheduling designs.
    W7,
    /// 1,000 nodes and 1,000,000 queued tasks.
    W8,
    /// Throughput with a durable head and with three replicas.
    W9,
    /// Leader failover time.
    W10,
    /// Command tasks (`true`), the workload HyperQueue is compared on.
    Cmd,
    /// Head memory under a stream of short tasks, with and without retention.
    Retention,
    /// The cost of authentication and TLS.
    Sec,
    /// The cost of watching: W1 with 0 and 10 watchers.
    Watch,
    /// What the ESLs ask of the head.
    Esl,
    /// E1: WordCount with data locality (thesis Fig. 4.5a/b).
    E1,
    /// E2: hierarchical fair sharing at 100 nodes (Fig. 4.5c).
    E2,
    /// E3: AlphaZero-style co-location with load balancing (Fig. 4.6a, 4.7).
    E3,
    /// E4: EscherTune migration (Fig. 4.6b).
    E4,
    /// Cilantro as an ESL: the synthetic 5-user experiment (thesis chapter 3).
    Cilantro,
    /// The GPU policies end to end: MIGM A and B against the sequential full GPU, MIGRator's
    /// pre-initialization, one MIGRator window against Ekya and PARIS.
    Gpu,
    /// Python remote functions from one Python driver, escher beside Ray (not in `all`).
    Python,
    /// Actor method calls and creation, escher beside Ray.
    Actors,
    /// Objects from one Python driver, escher beside Ray and one loopback TCP stream (not in
    /// `all`).
    Objects,
    /// A pending task to a worker `escher-autoscaler` starts for it, through the Docker and the
    /// Slurm providers (not in `all`: it needs root, Docker and Slurm).
    Autoscale,
}

impl Workload {
    /// Every workload `all` runs, in run order (`python` and `objects`, which need PyPI and
    /// build the package, only when named).
    pub const ALL: [Workload; 22] = [
        Workload::W1,
        Workload::W2,
        Workload::W3,
        Workload::W4,
        Workload::W5,
        Workload::W6,
        Workload::W7,
        Workload::W8,
        Workload::W9,
        Workload::W10,
        Workload::Cmd,
        Workload::Retention,
        Workload::Sec,
        Workload::Watch,
        Workload::Esl,
        Workload::E1,
        Workload::E2,
        Workload::E3,
        Workload::E4,
        Workload::Cilantro,
        Workload::Gpu,
        Workload::Actors,
    ];

    /// `w1` ... `w8`, `cmd`.
    pub fn id(self) -> &'static str {
        match self {
            Workload::W1 => "w1",
            Workload::W2 => "w2",
            Workload::W3 => "w3",
            Workload::W4 => "w4",
            Workload::W5 => "w5",
            Workload::W6 => "w6",
            Workload::W7 => "w7",
            Workload::W8 => "w8",
            Workload::W9 => "w9",
            Workload::W10 => "w10",
            Workload::Cmd => "cmd",
            Workload::Retention => "retention",
            Workload::Sec => "sec",
            Workload::Watch => "watch",
            Workload::Esl => "esl",
            Workload::E1 => "e1",
            Workload::E2 => "e2",
            Workload::E3 => "e3",
            Workload::E4 => "e4",
            Workload::Cilantro => "cilantro",
            Workload::Gpu => "gpu",
            Workload::Python => "python",
            Workload::Actors => "actors",
            Workload::Objects => "objects",
            Workload::Autoscale => "autoscale",
        }
    }

    /// Runs the workload.
    pub async fn run(self, ctx: &Ctx) -> anyhow::Result<crate::report::WorkloadReport> {
        match self {
            Workload::W1 => w1_throughput::run(ctx).await,
            Workload::W2 => w2_latency::run(ctx).await,
            Workload::W3 => w3_clients::run(ctx).await,
            Workload::W4 => w4_er_create::run(ctx).await,
            Workload::W5 => w5_makespan::run(ctx).await,
            Workload::W6 => w6_requested::run(ctx).await,
            Workload::W7 => w7_gang::run(ctx).await,
            Workload::W8 => w8_scale::run(ctx).await,
            Workload::W9 => w9_replicated::run(ctx).await,
            Workload::W10 => w10_failover::run(ctx).await,
            Workload::Cmd => cmd_tasks::run(ctx).await,
            Workload::Retention => retention::run(ctx).await,
            Workload::Sec => security::run(ctx).await,
            Workload::Watch => watch::run(ctx).await,
            Workload::Esl => esl::run(ctx).await,
            Workload::E1 => thesis::e1(ctx).await,
            Workload::E2 => thesis::e2(ctx).await,
            Workload::E3 => thesis::e3(ctx).await,
            Workload::E4 => thesis::e4(ctx).await,
            Workload::Cilantro => thesis::cilantro(ctx).await,
            Workload::Gpu => gpu::run(ctx).await,
            Workload::Python => python::run(ctx).await,
            Workload::Actors => actors::run(ctx).await,
            Workload::Objects => objects::run(ctx).await,
            Workload::Autoscale => autoscale::run(ctx).await,
        }
    }
}
