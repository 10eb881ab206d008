//! W10, failover time: a group of three durable `escher-head` processes; the leader is
//! SIGKILLed, and the time is taken from the kill to the first acknowledged submit (a client
//! that knows all three replicas and was talking to the leader, retrying through the
//! election). The killed replica is then restarted from its data directory and the group
//! waits until all three have caught up before the next kill. Reported: p50 and max over the
//! kills. docs/DESIGN.md §8 asks for ≤ 2 s.
//!
//! The heads run raft's default timing (`--raft-tick-ms 50`: a follower stands for election
//! after 0.5 to 1 s without a leader, after pre-vote).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::types::ReplicaRole;
use escher::{Client, Task};
use serde_json::json;

use super::Ctx;
use crate::head_process::{HeadProcess, find_head_bin};
use crate::report::{Figure, Plot, PlotData, WorkloadReport};
use crate::stats::Summary;

/// A task no node can run: it stays queued, so the head does nothing else.
fn parked() -> Task {
    Task::command(["true"]).resources_str("w10-nowhere=1")
}

/// Runs W10.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let kills = ctx.params.w10_kills;
    let mut report = WorkloadReport::new(
        "w10",
        "failover: leader SIGKILL to the first acknowledged submit, three durable replicas",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "replicas": "3 escher-head processes, --data-dir each, --raft-tick-ms 50 (default)",
        "client": "knows all three URLs; submits one task after each kill and waits for its ack",
        "kills": kills,
    });
    let bin = find_head_bin(ctx.head_bin.as_deref())?;
    let dir = tempfile::Builder::new().prefix("escher-w10-").tempdir()?;
    let addresses: Vec<String> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.to_string())
        })
        .collect::<Result<_, _>>()?;
    let peers: String = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let args = |i: usize| -> Vec<String> {
        vec![
            "--id".into(),
            (i + 1).to_string(),
            "--peers".into(),
            peers.clone(),
            "--group".into(),
            "w10".into(),
            "--data-dir".into(),
            dir.path()
                .join(format!("head-{}", i + 1))
                .display()
                .to_string(),
            // The replicas of a group share one access file.
            "--access-file".into(),
            dir.path().join("access.json").display().to_string(),
        ]
    };
    let mut heads: Vec<Option<HeadProcess>> = Vec::new();
    for (i, address) in addresses.iter().enumerate() {
        heads.push(Some(start(&bin, address, &args(i)).await?));
    }
    let urls: Vec<String> = addresses.iter().map(|a| format!("http://{a}")).collect();
    let client = Client::connect(urls.join(","))
        .await?
        .with_failover_timeout(Duration::from_secs(60));
    client.submit(parked()).await?;

    let mut times = Vec::with_capacity(kills);
    for kill in 0..kills {
        let leader = leader_index(&client, &addresses).await?;
        // The client talks to the leader when it dies.
        client.submit(parked()).await?;
        let killed_at = Instant::now();
        if let Some(head) = heads[leader].take() {
            head.stop().await;
        }
        client
            .submit(parked())
            .await
            .with_context(|| format!("the first submit after kill {kill}"))?;
        let took = killed_at.elapsed();
        eprintln!("w10: kill {kill} of replica {}: {took:?}", leader + 1);
        times.push(took.as_secs_f64() * 1e3);
        heads[leader] = Some(start(&bin, &addresses[leader], &args(leader)).await?);
        caught_up(&client).await?;
    }
    for head in heads.into_iter().flatten() {
        head.stop().await;
    }
    let summary = Summary::of(&times);
    report.figures.push(Figure::new(
        "w10.p50",
        format!("leader SIGKILL to the first acknowledged submit, p50 of {kills} kills"),
        "ms",
        summary.p50,
    ));
    report.figures.push(Figure::new(
        "w10.max",
        format!("leader SIGKILL to the first acknowledged submit, max of {kills} kills"),
        "ms",
        summary.max,
    ));
    report.plots.push(Plot {
        file: "w10-failover.png".into(),
        title: "W10: leader SIGKILL to the first acknowledged submit".into(),
        x_label: "kill".into(),
        y_label: "ms".into(),
        data: PlotData::Lines {
            lines: vec![crate::report::Line {
                name: "escher, 3 durable replicas".into(),
                points: times
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (i as f64 + 1.0, *t))
                    .collect(),
            }],
            x_log: false,
        },
    });
    report.detail = json!({ "failover_ms": times });
    Ok(report)
}

/// Starts replica at `address`; a port the kernel is still releasing is tried again.
async fn start(
    bin: &std::path::Path,
    address: &str,
    args: &[String],
) -> anyhow::Result<HeadProcess> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut last = None;
    for _ in 0..50 {
        match HeadProcess::start_at(bin, address, &args).await {
            Ok(head) => return Ok(head),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("cannot start a head at {address}")))
}

/// The index of the replica that leads.
async fn leader_index(client: &Client, addresses: &[String]) -> anyhow::Result<usize> {
    let started = Instant::now();
    loop {
        if let Ok(heads) = client.heads().await
            && let Some(leader) = heads.leader()
            && let Some(i) = addresses.iter().position(|a| *a == leader.address)
        {
            return Ok(i);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("no head replica led within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every replica answers, one leads, and all have applied the same index.
async fn caught_up(client: &Client) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Ok(heads) = client.heads().await {
            let applied: std::collections::BTreeSet<u64> =
                heads.replicas.iter().map(|r| r.applied_index).collect();
            let leaders = heads
                .replicas
                .iter()
                .filter(|r| r.role == Some(ReplicaRole::Leader))
                .count();
            if heads.replicas.iter().all(|r| r.reachable) && leaders == 1 && applied.len() == 1 {
                return Ok(());
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the restarted replica did not catch up within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
