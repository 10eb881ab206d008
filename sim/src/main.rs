//! `escher-sim`: runs seeds of the replica group's simulation.
//!
//! `escher-sim --seed N` replays one seed and prints its event trace; `escher-sim --seeds N`
//! runs seeds 0..N and prints each failing seed, the count and the rate.

use std::time::Instant;

use anyhow::bail;
use clap::Parser;
use escher_sim::{Options, Stats, run};

/// A deterministic simulation of escher's replica group (docs/RELIABILITY.md).
#[derive(Debug, Parser)]
#[command(name = "escher-sim")]
struct Args {
    /// Replay this one seed and print its event trace.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds, from --first.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Replicas in the group.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    replicas: u64,
    /// Clients writing at once.
    #[arg(long, default_value_t = 3)]
    clients: u64,
    /// Simulated milliseconds of faults and writes before the quiet end.
    #[arg(long, default_value_t = 20_000)]
    duration_ms: u64,
    /// Clients send no idempotency keys: a retried write may apply twice (the checker's own
    /// test; every seed should then be able to fail).
    #[arg(long)]
    no_keys: bool,
    /// Disks never fail (no torn writes, full disks or slow fsyncs).
    #[arg(long)]
    no_disk_faults: bool,
    /// The group's membership never changes (no replica is added or removed).
    #[arg(long)]
    no_membership: bool,
    /// Simulated workers (0: none, the nodes never run anything; seeds then replay as they
    /// did before the workers).
    #[arg(long, default_value_t = 2)]
    workers: u64,
    /// The workers run without their fence (the checker's own test: tasks then run twice).
    #[arg(long)]
    no_fence: bool,
    /// No planned restarts (the leader handing the lead over and stopping); seeds then replay
    /// as they did before them.
    #[arg(long)]
    no_hand_overs: bool,
    /// The clients retry by the simulation's own rules of before, not the real client's
    /// (`escher_client::retry`), and workers leave a stream after 500 ms without a message
    /// rather than by the real worker's rule (`Protocol::stale`); seeds found before
    /// 2026-12-07 then replay as they ran.
    #[arg(long)]
    old_client_rules: bool,
    /// No assignment is sent twice to a worker; seeds found before 2026-12-07 then replay as
    /// they ran (with --old-client-rules).
    #[arg(long)]
    no_duplicate_assignments: bool,
    /// A replica that stops leading answers the writes it proposed "not leader", as the head
    /// did before, instead of "it may still commit": the checker's own test (a caller is told
    /// a write was not applied that then commits).
    #[arg(long)]
    no_in_doubt_answers: bool,
    /// A leader whose disk fills up answers what waits on it only when it loses the lead, as
    /// the simulation did before, instead of at once as the head's owner does.
    #[arg(long)]
    no_stall_answers: bool,
    /// A leader removes a node it declared lost with the plain `RemoveNode` (data formats
    /// before 9), which removes whatever registration it meets, instead of naming the one it
    /// judged: the checker's own test (a removal then removes a registration it never judged).
    #[arg(long)]
    plain_removals: bool,
    /// The workers' streams are never closed by the network, never stop being read and never
    /// fill, and a broken one is forgotten by the leader at once, as before 2026-12-07's stream
    /// faults: seeds found before them replay as they ran.
    #[arg(long)]
    no_stream_faults: bool,
    /// The workers' stream queues are bounded in messages only, not in bytes, and tasks carry
    /// no arguments, as before 2026-12-07's second round: seeds found before then replay as
    /// they ran.
    #[arg(long)]
    no_stream_bytes: bool,
    /// A worker's stream never closes at one end only (the head's side while the worker
    /// reads on, or the worker's while the head still holds it): seeds found before then
    /// replay as they ran.
    #[arg(long)]
    no_half_closes: bool,
    /// In one seed of two, a crash also cuts the tail of a replica's log (the newest records
    /// it had synced); off by default while the head's replica does not survive every such cut
    /// (docs/RELIABILITY.md, "A cut tail").
    #[arg(long)]
    cut_tails: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let options = Options {
        replicas: args.replicas,
        clients: args.clients,
        duration_ms: args.duration_ms,
        trace: args.seed.is_some(),
        idempotency_keys: !args.no_keys,
        disk_faults: !args.no_disk_faults,
        membership: !args.no_membership,
        workers: args.workers,
        fence: !args.no_fence,
        hand_overs: !args.no_hand_overs,
        client_rules: !args.old_client_rules,
        duplicate_assignments: !args.no_duplicate_assignments,
        in_doubt_answers: !args.no_in_doubt_answers,
        stall_answers: !args.no_stall_answers,
        judged_removals: !args.plain_removals,
        stream_faults: !args.no_stream_faults,
        stream_bytes: !args.no_stream_bytes,
        half_closes: !args.no_half_closes,
        cut_tails: args.cut_tails,
    };
    if let Some(seed) = args.seed {
        let outcome = run(seed, &options);
        for line in &outcome.trace {
            println!("{line}");
        }
        println!("seed {seed}: {:?}", outcome.stats);
        if !outcome.violations.is_empty() {
            for v in &outcome.violations {
                println!("VIOLATION: {v}");
            }
            bail!("seed {seed} broke {} properties", outcome.violations.len());
        }
        println!("seed {seed} passed");
        return Ok(());
    }
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut sum = Stats::default();
    for seed in args.first..args.first + args.seeds {
        let outcome = run(seed, &options);
        sum.add(&outcome.stats);
        if !outcome.violations.is_empty() {
            println!("seed {seed} FAILED: {}", outcome.violations.join("; "));
            failed.push(seed);
        }
    }
    let took = started.elapsed().as_secs_f64();
    println!(
        "{} seeds ({} replicas) in {took:.1}s: {:.0} seeds/minute; {} failed {failed:?}",
        args.seeds,
        args.replicas,
        args.seeds as f64 * 60.0 / took.max(1e-9),
        failed.len()
    );
    let per = |n: u64| n as f64 / args.seeds.max(1) as f64;
    println!(
        "per seed: {:.1} faults ({:.2} crashes, {:.2} of them inside an fsync, {:.2} \
         partitions, {:.2} full disks, {:.2} slow disks, {:.2} crashes that cut a log's tail ({:.2} synced records cut, {:.2} \
         leaders skipped ids for a lost tail), {:.2} membership changes, {:.2} \
         planned restarts ({:.2} after handing the lead over), {:.2} worker crashes, {:.2} \
         worker freezes, {:.2} workers cut off, {:.2} worker streams closed by the network, {:.2} \
         worker streams unread for a while, {:.2} worker streams whose head's side closed, {:.2} \
         whose worker's side closed), {:.2} worker streams dropped full ({:.2} of them by their \
         bytes), {:.2} messages offered to a closed stream, {:.2} taken by a stream whose \
         worker's side had closed, {:.0} fsyncs, {:.0} raft messages lost, \
         {:.0} acknowledged writes, {:.2} unknown outcomes, {:.2} proposals answered \"may \
         still commit\" ({:.2} of them committed after all; {:.2} stalled leaders answered \
         theirs at once), {:.2} membership-change calls with an unknown outcome, {:.1} task executions, {:.2} tasks fenced, {:.2} nodes declared \
         lost ({:.2} removals that applied after the node registered again changed nothing)",
        per(sum.faults()),
        per(sum.crashes),
        per(sum.torn),
        per(sum.partitions),
        per(sum.disks_full),
        per(sum.slow_disks),
        per(sum.cut_tails),
        per(sum.records_cut),
        per(sum.skips),
        per(sum.membership_changes),
        per(sum.planned_restarts),
        per(sum.hand_overs),
        per(sum.worker_crashes),
        per(sum.freezes),
        per(sum.worker_cuts),
        per(sum.stream_closes),
        per(sum.stream_stalls),
        per(sum.head_half_closes),
        per(sum.worker_half_closes),
        per(sum.stream_overflows),
        per(sum.stream_full_by_bytes),
        per(sum.offered_closed),
        per(sum.taken_unread),
        per(sum.fsyncs),
        per(sum.lost),
        per(sum.acknowledged),
        per(sum.unknown_outcomes),
        per(sum.in_doubt),
        per(sum.in_doubt_committed),
        per(sum.stall_answers),
        per(sum.unknown_change_outcomes),
        per(sum.executions),
        per(sum.fenced),
        per(sum.nodes_lost),
        per(sum.stale_removals),
    );
    if !failed.is_empty() {
        bail!("{} seeds failed; replay one with --seed N", failed.len());
    }
    Ok(())
}
