//! How big each workload is at each `--size`: `full` is the scale docs/DESIGN.md §8 and the thesis
//! measure at, `small` a tenth of it for a quick look, `tiny` a few seconds in all for CI.

use serde::Serialize;

/// The scale of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    /// Seconds in all, for CI: proves every workload still runs end to end.
    Tiny,
    /// About a tenth of `full`.
    Small,
    /// The scale docs/DESIGN.md §8 and the thesis measure at (minutes on 2 cores).
    Full,
}

impl Size {
    /// The name used in file names and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Size::Tiny => "tiny",
            Size::Small => "small",
            Size::Full => "full",
        }
    }

    /// Picks the value for this size.
    pub fn pick<T>(self, tiny: T, small: T, full: T) -> T {
        match self {
            Size::Tiny => tiny,
            Size::Small => small,
            Size::Full => full,
        }
    }
}

/// Every workload's parameters at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// W1: batch sizes of no-op tasks submitted asynchronously from one client.
    pub w1_tasks: Vec<usize>,
    /// W2: sequential submit-then-get round trips.
    pub w2_round_trips: usize,
    /// Actors: sequential method-call round trips to one actor.
    pub actor_round_trips: usize,
    /// Actors: method calls in flight at once, per round of the pipelined figure.
    pub actor_pipelined: usize,
    /// Actors: actors created, each called once and killed.
    pub actor_creations: usize,
    /// W3: clients, and tasks each submits.
    pub w3_clients: usize,
    /// W3: tasks per client.
    pub w3_tasks_per_client: usize,
    /// W4, W5, W6: emulated nodes.
    pub er_nodes: usize,
    /// W4: how many resources to create, one run per value.
    pub w4_counts: Vec<usize>,
    /// W5: no-op tasks per makespan.
    pub w5_tasks: usize,
    /// W5: unrelated resources present, one run per value.
    pub w5_resources: Vec<usize>,
    /// W5: makespans measured per value (the median is reported).
    pub w5_repeats: usize,
    /// W6: resources in the cluster.
    pub w6_resources: usize,
    /// W6: resources requested per task, one run per value.
    pub w6_requested: Vec<usize>,
    /// W6: sequential tasks measured per value.
    pub w6_tasks: usize,
    /// W7: nodes, each with `w7_cpus` CPUs.
    pub w7_nodes: usize,
    /// W7: CPUs per node.
    pub w7_cpus: usize,
    /// W7: bundles per gang (1 CPU each).
    pub w7_gang: usize,
    /// W7: concurrent clients.
    pub w7_clients: usize,
    /// W7: gangs each client requests, one after another.
    pub w7_gangs_per_client: usize,
    /// W7: one-bundle reservations created and removed in a row (Ray's placement-group
    /// microbenchmark).
    pub w7_pg_rate: usize,
    /// W8: simulated nodes.
    pub w8_nodes: usize,
    /// W8: queued tasks.
    pub w8_tasks: usize,
    /// HyperQueue comparison: command tasks (`true`).
    pub cmd_tasks: usize,
    /// W9: no-op tasks per configuration (in-memory, durable, three replicas).
    pub w9_tasks: usize,
    /// W10: leader kills.
    pub w10_kills: usize,
    /// Retention: short tasks pushed through the head, in each of its two runs.
    pub retention_tasks: usize,
    /// Retention: tasks per `Submit` call (at most four batches unfinished at a time).
    pub retention_batch: usize,
    /// Retention: the head's memory is read every so many tasks.
    pub retention_every: usize,
}

impl Params {
    /// The parameters at `size`.
    pub fn at(size: Size) -> Params {
        let s = size;
        Params {
            w1_tasks: s.pick(vec![200, 1_000], vec![1_000, 10_000], vec![10_000, 100_000]),
            w2_round_trips: s.pick(50, 300, 1_000),
            actor_round_trips: s.pick(100, 1_000, 5_000),
            actor_pipelined: s.pick(1_000, 10_000, 50_000),
            actor_creations: s.pick(10, 50, 200),
            w3_clients: 4,
            w3_tasks_per_client: s.pick(200, 2_000, 10_000),
            er_nodes: s.pick(5, 50, 50),
            w4_counts: s.pick(
                vec![10, 50],
                vec![10, 100, 500],
                vec![10, 100, 1_000, 5_000],
            ),
            w5_tasks: s.pick(500, 5_000, 50_000),
            w5_resources: s.pick(
                vec![0, 100, 1_000],
                vec![0, 1_000, 10_000],
                vec![0, 1_000, 10_000, 100_000],
            ),
            w5_repeats: s.pick(1, 3, 5),
            w6_resources: s.pick(100, 1_000, 1_000),
            w6_requested: vec![1, 10, 50, 100],
            w6_tasks: s.pick(20, 200, 1_000),
            w7_nodes: s.pick(4, 32, 32),
            w7_cpus: 8,
            w7_gang: 8,
            w7_clients: s.pick(2, 4, 4),
            w7_gangs_per_client: s.pick(3, 25, 100),
            w7_pg_rate: s.pick(20, 100, 1_000),
            w8_nodes: s.pick(10, 100, 1_000),
            w8_tasks: s.pick(2_000, 100_000, 1_000_000),
            cmd_tasks: s.pick(20, 500, 2_000),
            w9_tasks: s.pick(500, 5_000, 20_000),
            w10_kills: s.pick(2, 5, 10),
            retention_tasks: s.pick(4_000, 30_000, 300_000),
            retention_batch: s.pick(500, 1_000, 1_000),
            retention_every: s.pick(1_000, 5_000, 10_000),
        }
    }
}
