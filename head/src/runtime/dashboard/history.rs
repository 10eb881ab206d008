//! The dashboard's utilisation history: a bounded ring of samples of the cluster (CPU, memory
//! and GPU used and total over the live nodes, running and pending tasks), one every
//! [`SAMPLE_EVERY`], kept in the head's memory and served by `GET /api/history` for the
//! Overview's charts.
//!
//! [`History`] is plain data (a sample in, the oldest out once full); [`sample`] is the loop
//! that feeds it from the head's own `ClusterStatus`, read as this replica applied it, for as
//! long as the dashboard serves. Each replica that serves a dashboard keeps its own history,
//! from when it started; nothing of it is replicated or written to disk.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use escher_proto::types::{Capacity, ClusterStatus};
use escher_proto::wire::{self, cluster_server::Cluster};

use super::super::cluster_svc::ClusterService;
use super::super::handle::{READ_METADATA, STALE};
use crate::auth::Caller;

/// How often the cluster is sampled.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// How many samples are kept: an hour at one every [`SAMPLE_EVERY`].
pub(super) const SAMPLES_KEPT: usize = 1800;

/// The cluster at one moment. Amounts are in the resource's units (cores, MiB, GPUs), as
/// numbers for the page's charts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Sample {
    /// When it was taken, milliseconds since the Unix epoch (the serving replica's clock).
    pub at_ms: u64,
    /// CPU cores held by running tasks, on live nodes.
    pub cpu_used: f64,
    /// CPU cores of the live nodes.
    pub cpu_total: f64,
    /// Memory (MiB) held by running tasks, on live nodes.
    pub memory_used: f64,
    /// Memory (MiB) of the live nodes.
    pub memory_total: f64,
    /// Whole or fractional GPUs held (the `gpu` resource), on live nodes.
    pub gpu_used: f64,
    /// GPUs not in MIG mode of the live nodes (the `gpu` resource).
    pub gpu_total: f64,
    /// Tasks running.
    pub running: u64,
    /// Tasks pending.
    pub pending: u64,
    /// Live nodes.
    pub nodes: u64,
}

impl Sample {
    /// The figures of `status`, taken at `at_ms`. An unbounded capacity counts as nothing
    /// (none of the three is unbounded on a worker that reports it).
    pub fn of(status: &ClusterStatus, at_ms: u64) -> Sample {
        let sum = |name: &str| {
            let (mut used, mut total) = (0.0, 0.0);
            for node in status.nodes.iter().filter(|n| n.alive) {
                if let Some(r) = node.resource(name) {
                    used += r.used.as_f64();
                    if let Capacity::Finite(t) = r.total {
                        total += t.as_f64();
                    }
                }
            }
            (used, total)
        };
        let (cpu_used, cpu_total) = sum("cpu");
        let (memory_used, memory_total) = sum("memory");
        let (gpu_used, gpu_total) = sum("gpu");
        Sample {
            at_ms,
            cpu_used,
            cpu_total,
            memory_used,
            memory_total,
            gpu_used,
            gpu_total,
            running: status.running_tasks,
            pending: status.pending_tasks,
            nodes: status.nodes.iter().filter(|n| n.alive).count() as u64,
        }
    }
}

/// The last [`SAMPLES_KEPT`] samples, oldest first.
#[derive(Debug)]
pub(super) struct History {
    samples: VecDeque<Sample>,
    keep: usize,
}

impl History {
    /// An empty history keeping at most `keep` samples.
    pub fn new(keep: usize) -> History {
        History {
            samples: VecDeque::with_capacity(keep.min(SAMPLES_KEPT)),
            keep: keep.max(1),
        }
    }

    /// Adds `sample`, dropping the oldest when full.
    pub fn record(&mut self, sample: Sample) {
        if self.samples.len() == self.keep {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.iter().cloned().collect()
    }
}

/// The history as `GET /api/history` answers it.
#[derive(Debug, Serialize)]
pub(super) struct HistoryReply {
    /// Milliseconds between samples.
    pub interval_ms: u64,
    /// How many samples are kept at most.
    pub capacity: usize,
    /// The samples, oldest first.
    pub samples: Vec<Sample>,
}

/// Samples the cluster into `history` every [`SAMPLE_EVERY`] until `stop` is cancelled. A
/// status this replica cannot read (it is still catching up) is skipped, not recorded.
pub(super) async fn sample(
    svc: ClusterService,
    history: Arc<Mutex<History>>,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        // The head's own read: as an admin, of this replica's applied state.
        let mut request = Request::new(wire::ClusterStatusRequest { task_counts: false });
        request.extensions_mut().insert(Caller::Admin);
        request.metadata_mut().insert(
            READ_METADATA,
            tonic::metadata::MetadataValue::from_static(STALE),
        );
        let status = match svc.cluster_status(request).await {
            Ok(reply) => ClusterStatus::try_from(reply.into_inner()),
            Err(status) => {
                tracing::debug!(%status, "no utilisation sample this time");
                continue;
            }
        };
        match status {
            Ok(status) => {
                let sample = Sample::of(&status, now_ms());
                history.lock().expect("history lock").record(sample);
            }
            Err(err) => tracing::warn!(%err, "a cluster status the history cannot read"),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher_proto::types::{Labels, NodeId, NodeStatus, ResourceName, ResourceStatus};

    fn node(id: u64, alive: bool, resources: &[(&str, &str, &str)]) -> NodeStatus {
        NodeStatus {
            id: NodeId(id),
            name: format!("w{id}"),
            address: String::new(),
            alive,
            labels: Labels::new(),
            resources: resources
                .iter()
                .map(|(name, total, used)| ResourceStatus {
                    name: ResourceName::new(name).unwrap(),
                    total: total.parse().unwrap(),
                    used: used.parse().unwrap(),
                })
                .collect(),
            left_at_ms: None,
            left_because: None,
            fence: None,
            waiting_for_stream: false,
        }
    }

    #[test]
    fn a_sample_sums_the_live_nodes_and_fractions() {
        let status = ClusterStatus {
            nodes: vec![
                node(
                    1,
                    true,
                    &[
                        ("cpu", "4", "1.5"),
                        ("memory", "1024", "256"),
                        ("gpu", "1", "0.5"),
                    ],
                ),
                node(2, true, &[("cpu", "2", "2"), ("memory", "512", "0")]),
                node(3, false, &[("cpu", "64", "0"), ("gpu", "8", "0")]),
            ],
            pending_tasks: 3,
            running_tasks: 2,
            namespaces: Vec::new(),
            pending_actor_calls: None,
        };
        let s = Sample::of(&status, 42);
        assert_eq!(s.at_ms, 42);
        assert_eq!((s.cpu_used, s.cpu_total), (3.5, 6.0));
        assert_eq!((s.memory_used, s.memory_total), (256.0, 1536.0));
        assert_eq!((s.gpu_used, s.gpu_total), (0.5, 1.0));
        assert_eq!((s.running, s.pending, s.nodes), (2, 3, 2));
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order() {
        let mut history = History::new(3);
        for at in 0..5 {
            history.record(Sample::of(&ClusterStatus::default(), at));
        }
        let kept: Vec<u64> = history.samples().iter().map(|s| s.at_ms).collect();
        assert_eq!(kept, [2, 3, 4]);
    }
}
