//! The nemeses: each injects one fault into a [`NetCluster`] and heals it afterwards.
//!
//! A nemesis picks its target when injected (the replica that leads then, or the next worker
//! in turn) and remembers it to heal. Worker nemeses never pick the anchor worker (the last
//! one), whose node holds the counters the clients write.

use anyhow::Context;
use nix::sys::signal::Signal;

use super::cluster::NetCluster;
use super::net::Degrade;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Nemesis {
    /// A worker's host cut from every other host and from the clients.
    PartitionWorker,
    /// The leader's host cut from every other host and from the clients.
    PartitionLeader,
    /// A worker cut from the leader, still reaching the followers.
    WorkerFromLeader,
    /// The leader cut from its followers, still reaching workers and clients.
    LeaderFromFollowers,
    /// Everything the leader sends its followers lost; what they send arrives.
    OneWayLeaderLoss,
    /// 100 ms of latency and 10% loss on the leader's link (netem, or iptables + tbf).
    SlowLossyLeader,
    /// kill -9 of the leader, restarted on healing.
    KillLeader,
    /// SIGSTOP of the leader, SIGCONT on healing.
    PauseLeader,
    /// SIGSTOP of a worker's process, SIGCONT on healing.
    PauseWorker,
    /// kill -9 of a worker's process, restarted (same node) on healing.
    KillWorker,
    /// `pkill -9 escher-worker` on a worker's host: every process named `escher-worker`
    /// (the process started and the worker in its PID namespace; the namespace's init is
    /// `escher-init`, the fence supervisor `escher-fence`), restarted on healing.
    PkillWorker,
    /// kill -9 of every escher process of a worker's host, the worker, the init of its PID
    /// namespace and its fence supervisor alike (`pkill -9 escher`), restarted on healing:
    /// the end of the namespace ends the tasks.
    KillWorkerAndFence,
    /// The data directory's file system of replica 3 filled; emptied on healing (and the
    /// replica restarted if it exited).
    DiskFull,
    /// The leader's disk made slow: every fsync and fdatasync of its process waits
    /// [`SLOW_DISK_MS`] first (the shim `slowdisk.c`); fast again on healing.
    SlowDisk,
}

/// How long each sync of a slowed disk waits, in milliseconds: a disk a hundred times slower to
/// sync than a datacentre SSD, slower than the heartbeat interval.
pub const SLOW_DISK_MS: u64 = 250;

impl Nemesis {
    /// Every nemesis.
    pub const ALL: [Nemesis; 14] = [
        Nemesis::PartitionWorker,
        Nemesis::PartitionLeader,
        Nemesis::WorkerFromLeader,
        Nemesis::LeaderFromFollowers,
        Nemesis::OneWayLeaderLoss,
        Nemesis::SlowLossyLeader,
        Nemesis::KillLeader,
        Nemesis::PauseLeader,
        Nemesis::PauseWorker,
        Nemesis::KillWorker,
        Nemesis::PkillWorker,
        Nemesis::KillWorkerAndFence,
        Nemesis::DiskFull,
        Nemesis::SlowDisk,
    ];

    /// Whether it targets a worker (and so fences that worker's tasks).
    pub fn targets_worker(self) -> bool {
        matches!(
            self,
            Nemesis::PartitionWorker
                | Nemesis::WorkerFromLeader
                | Nemesis::PauseWorker
                | Nemesis::KillWorker
                | Nemesis::PkillWorker
                | Nemesis::KillWorkerAndFence
        )
    }

    /// Its name in tables and in `ESCHER_NEMESES`.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::PartitionWorker => "partition-worker",
            Nemesis::PartitionLeader => "partition-leader",
            Nemesis::WorkerFromLeader => "worker-from-leader",
            Nemesis::LeaderFromFollowers => "leader-from-followers",
            Nemesis::OneWayLeaderLoss => "one-way-leader-loss",
            Nemesis::SlowLossyLeader => "slow-lossy-leader",
            Nemesis::KillLeader => "kill-leader",
            Nemesis::PauseLeader => "pause-leader",
            Nemesis::PauseWorker => "pause-worker",
            Nemesis::KillWorker => "kill-worker",
            Nemesis::PkillWorker => "pkill-worker",
            Nemesis::KillWorkerAndFence => "kill-worker-and-fence",
            Nemesis::DiskFull => "disk-full",
            Nemesis::SlowDisk => "slow-disk",
        }
    }

    /// The nemesis named `name`.
    pub fn parse(name: &str) -> anyhow::Result<Nemesis> {
        Nemesis::ALL
            .into_iter()
            .find(|n| n.name() == name)
            .with_context(|| {
                let names: Vec<&str> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                format!("no nemesis {name:?}; the nemeses are {}", names.join(", "))
            })
    }
}

/// A nemesis in force, and what healing it needs.
#[derive(Debug)]
pub struct Injected {
    /// Which.
    pub nemesis: Nemesis,
    /// What exactly was done, for the report.
    pub what: String,
    /// The worker's node id, for a worker nemesis.
    pub node: Option<u64>,
    target_head: Option<usize>,
    target_worker: Option<usize>,
}

/// Injects `nemesis`; a worker nemesis strikes worker `worker` (an index, never the anchor's).
pub async fn inject(
    cluster: &mut NetCluster,
    nemesis: Nemesis,
    worker: usize,
) -> anyhow::Result<Injected> {
    let heads = cluster.head_hosts();
    let workers = cluster.worker_hosts();
    anyhow::ensure!(worker + 1 < workers.len(), "worker {worker} is the anchor");
    let leader = if matches!(nemesis, Nemesis::DiskFull) {
        2
    } else {
        cluster.wait_leader().await?
    };
    let mut out = Injected {
        nemesis,
        what: String::new(),
        node: None,
        target_head: None,
        target_worker: None,
    };
    if nemesis.targets_worker() {
        let name = cluster.worker_name(worker).to_string();
        out.node = Some(cluster.node_named(&name).await?.0);
        out.target_worker = Some(worker);
    } else {
        out.target_head = Some(leader);
    }
    let net = &cluster.net;
    let w = &workers[worker];
    let l = &heads[leader];
    out.what = match nemesis {
        Nemesis::PartitionWorker => {
            net.isolate(w)?;
            format!("{} ({}) cut from all", w.label, w.ip)
        }
        Nemesis::PartitionLeader => {
            net.isolate(l)?;
            format!("leader {} ({}) cut from all", l.label, l.ip)
        }
        Nemesis::WorkerFromLeader => {
            net.cut(w, l.ip)?;
            format!("{} cut from leader {} only", w.label, l.label)
        }
        Nemesis::LeaderFromFollowers => {
            for (i, h) in heads.iter().enumerate() {
                if i != leader {
                    net.cut(l, h.ip)?;
                }
            }
            format!("leader {} cut from its followers only", l.label)
        }
        Nemesis::OneWayLeaderLoss => {
            for (i, h) in heads.iter().enumerate() {
                if i != leader {
                    net.cut_outgoing(l, h.ip)?;
                }
            }
            format!("leader {}'s packets to its followers lost", l.label)
        }
        Nemesis::SlowLossyLeader => {
            let how = net.degrade(l, 100, 10)?;
            let how = match how {
                Degrade::Netem => "netem delay 100ms loss 10%",
                Degrade::Fallback => "no netem in this kernel: iptables loss 10% + tbf 2mbit",
            };
            format!("leader {}: {how}", l.label)
        }
        Nemesis::KillLeader => {
            cluster.kill_head(leader);
            format!("leader h{} killed (-9)", leader + 1)
        }
        Nemesis::PauseLeader => {
            cluster.signal_head(leader, Signal::SIGSTOP)?;
            format!("leader h{} stopped (SIGSTOP)", leader + 1)
        }
        Nemesis::PauseWorker => {
            cluster.signal_worker(worker, Signal::SIGSTOP)?;
            format!("worker w{} stopped (SIGSTOP)", worker + 1)
        }
        Nemesis::KillWorker => {
            cluster.kill_worker(worker);
            format!("worker w{} killed (-9, its process only)", worker + 1)
        }
        Nemesis::PkillWorker => {
            let killed = cluster.kill_worker_processes(worker, false);
            format!("worker w{}: pkill -9 escher-worker: {killed:?}", worker + 1)
        }
        Nemesis::KillWorkerAndFence => {
            let killed = cluster.kill_worker_processes(worker, true);
            format!(
                "worker w{}: every escher process killed (-9): {killed:?}",
                worker + 1
            )
        }
        Nemesis::DiskFull => {
            let bytes = cluster.fill_disk()?;
            format!("replica h3's data file system filled ({} MiB)", bytes >> 20)
        }
        Nemesis::SlowDisk => {
            cluster.slow_disk(leader, SLOW_DISK_MS)?;
            format!(
                "leader h{}'s disk slowed: {SLOW_DISK_MS} ms before every sync",
                leader + 1
            )
        }
    };
    Ok(out)
}

/// How long the group gets to be whole again after a fault is healed.
const RECOVERY: std::time::Duration = std::time::Duration::from_secs(20);

/// What healing a fault found.
#[derive(Debug, Default)]
pub struct Healed {
    /// What was done besides the healing itself (a replica restarted after it exited).
    pub note: String,
    /// What went wrong: a replica still running that did not come back into the group
    /// within [`RECOVERY`] (it was then killed and restarted, as a supervisor would not have
    /// known to). The run reports these beside the checker's anomalies.
    pub findings: Vec<String>,
}

/// Heals what `injected` did, then waits for the group to be whole again.
pub async fn heal(cluster: &mut NetCluster, injected: &Injected) -> anyhow::Result<Healed> {
    let mut healed = Healed::default();
    cluster.net.heal_all()?;
    match injected.nemesis {
        Nemesis::KillLeader => {
            let i = injected.target_head.expect("a head target");
            cluster.restart_head(i).await?;
        }
        Nemesis::PauseLeader => {
            let i = injected.target_head.expect("a head target");
            cluster.signal_head(i, Signal::SIGCONT)?;
        }
        Nemesis::PauseWorker => {
            let i = injected.target_worker.expect("a worker target");
            cluster.signal_worker(i, Signal::SIGCONT)?;
        }
        Nemesis::KillWorker | Nemesis::PkillWorker | Nemesis::KillWorkerAndFence => {
            let i = injected.target_worker.expect("a worker target");
            cluster.restart_worker(i).await?;
        }
        Nemesis::DiskFull => {
            cluster.free_disk()?;
        }
        Nemesis::SlowDisk => {
            let i = injected.target_head.expect("a head target");
            cluster.slow_disk(i, 0)?;
        }
        _ => {}
    }
    let healing = std::time::Instant::now();
    restart_exited(cluster, &mut healed).await?;
    if let Err((behind, seen)) = cluster.wait_group_whole(RECOVERY).await {
        healed.note.push_str(&format!(
            "{:.1} s after healing: ",
            healing.elapsed().as_secs_f64()
        ));
        // An exit during the wait is a clean death, restarted as a supervisor would.
        restart_exited(cluster, &mut healed).await?;
        if cluster.wait_group_whole(RECOVERY).await.is_err() {
            healed.findings.push(format!(
                "after {}: replica(s) {:?} still running but not back in the group {} s after                  healing (last seen: {seen}); killed and restarted",
                injected.nemesis.name(),
                behind.iter().map(|i| format!("h{}", i + 1)).collect::<Vec<_>>(),
                RECOVERY.as_secs() * 2
            ));
            for i in behind {
                cluster.restart_head(i).await?;
            }
            cluster
                .wait_group_whole(RECOVERY)
                .await
                .map_err(|(b, seen)| anyhow::anyhow!("the group is not whole ({b:?}): {seen}"))?;
        }
    }
    if let Some(i) = injected.target_worker {
        let name = cluster.worker_name(i).to_string();
        let deadline = tokio::time::Instant::now() + RECOVERY;
        while cluster.node_of(&name).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                healed.findings.push(format!(
                    "after {}: worker {name} was not a live node again {} s after healing",
                    injected.nemesis.name(),
                    RECOVERY.as_secs()
                ));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }
    Ok(healed)
}

/// Restarts the replicas whose process exited, noting each.
async fn restart_exited(cluster: &mut NetCluster, healed: &mut Healed) -> anyhow::Result<()> {
    for i in 0..cluster.head_hosts().len() {
        if let Some(status) = cluster.head_exited(i) {
            healed.note.push_str(&format!(
                "replica h{} had exited ({status}); restarted. ",
                i + 1
            ));
            cluster.restart_head(i).await?;
        }
    }
    Ok(())
}
