//! Sharing slots among queues: weighted fair queueing and strict priority, as pure functions
//! from weights and backlogs to per-queue capacities, and the objects that apply them.
//!
//! [`weighted_fair_shares`] is weighted max-min fairness (water-filling): every queue with
//! work gets slots in proportion to its weight, a queue that needs less than its proportion
//! gets what it needs, and what it leaves is split among the others by the same rule. Integer
//! slots are rounded by largest remainder (ties to the earlier queue), so the result is
//! deterministic, never exceeds the total, and leaves no slot idle that a queue could use.

use escher_client::Task;
use escher_proto::types::{ResourceUpdate, TaskId};

use super::Queue;
use crate::{ClusterApi, EslError};

/// Splits `total` slots among queues with these `weights` and `backlogs` (tasks that want a
/// slot). A queue with no backlog, or weight 0, gets nothing; the others get their weighted
/// max-min fair share, capped at their backlog. The shares add up to
/// `min(total, sum of the backlogs of queues with a weight)`.
pub fn weighted_fair_shares(total: u64, weights: &[u64], backlogs: &[u64]) -> Vec<u64> {
    assert_eq!(weights.len(), backlogs.len(), "one weight per backlog");
    let mut shares = vec![0u64; weights.len()];
    let mut active: Vec<usize> = (0..weights.len())
        .filter(|i| weights[*i] > 0 && backlogs[*i] > 0)
        .collect();
    let mut remaining = total;
    while remaining > 0 && !active.is_empty() {
        let weight: u128 = active.iter().map(|i| u128::from(weights[*i])).sum();
        // Queues whose whole need fits in their proportion take it and leave the round.
        let (sated, hungry): (Vec<usize>, Vec<usize>) = active.iter().partition(|i| {
            u128::from(backlogs[**i]) * weight <= u128::from(remaining) * u128::from(weights[**i])
        });
        if !sated.is_empty() {
            for i in sated {
                shares[i] = backlogs[i];
                remaining -= backlogs[i];
            }
            active = hungry;
            continue;
        }
        // Nobody is sated: split what remains by largest remainder.
        let mut given = 0u64;
        let mut remainders = Vec::with_capacity(active.len());
        for &i in &active {
            let scaled = u128::from(remaining) * u128::from(weights[i]);
            let floor = u64::try_from(scaled / weight).unwrap_or(u64::MAX);
            shares[i] = floor;
            given += floor;
            remainders.push((scaled % weight, i));
        }
        // Largest remainder first; ties to the earlier queue.
        remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in remainders.into_iter().take((remaining - given) as usize) {
            shares[i] += 1;
        }
        break;
    }
    shares
}

/// Strict priority: the first queue (highest priority) with a backlog gets all `total` slots,
/// every other queue none.
pub fn strict_priority(total: u64, backlogs: &[u64]) -> Vec<u64> {
    let mut shares = vec![0; backlogs.len()];
    if let Some(first) = backlogs.iter().position(|b| *b > 0) {
        shares[first] = total;
    }
    shares
}

/// Sets every queue to its new capacity, all decreases (in one batch) before any increase
/// (in a second), so that the total is never exceeded in between.
async fn apply<C: ClusterApi>(queues: &[&Queue<C>], shares: &[u64]) -> Result<(), EslError> {
    let Some(first) = queues.first() else {
        return Ok(());
    };
    let (mut lower, mut raise): (Vec<ResourceUpdate>, Vec<ResourceUpdate>) = (vec![], vec![]);
    for (queue, share) in queues.iter().zip(shares) {
        let (l, r) = queue.retarget(*share).await?;
        lower.extend(l);
        raise.extend(r);
    }
    for batch in [lower, raise] {
        if !batch.is_empty() {
            first.cluster.set_resources(batch).await?;
        }
    }
    Ok(())
}

/// Queues sharing slots by weight.
#[derive(Debug)]
pub struct FairQueues<C> {
    queues: Vec<Queue<C>>,
    weights: Vec<u64>,
}

impl<C: ClusterApi> FairQueues<C> {
    /// Queues with their weights (each at least 1).
    pub fn new(queues: Vec<(Queue<C>, u64)>) -> Result<FairQueues<C>, EslError> {
        if let Some((q, _)) = queues.iter().find(|(_, w)| *w == 0) {
            return Err(EslError::Unsatisfiable(format!(
                "queue {} has weight 0; weights are at least 1",
                q.resource()
            )));
        }
        let (queues, weights) = queues.into_iter().unzip();
        Ok(FairQueues { queues, weights })
    }

    /// Queue `i`, e.g. to submit to it.
    pub fn queue(&mut self, i: usize) -> &mut Queue<C> {
        &mut self.queues[i]
    }

    /// Enqueues a task on queue `i`.
    pub async fn submit(&mut self, i: usize, task: Task) -> Result<TaskId, EslError> {
        self.queues[i].submit(task).await
    }

    /// Recomputes the shares of `total` slots (per node of each queue's domain) from the
    /// backlogs now, and applies them; the shares.
    pub async fn rebalance(&mut self, total: u64) -> Result<Vec<u64>, EslError> {
        let mut backlogs = Vec::with_capacity(self.queues.len());
        for q in &mut self.queues {
            backlogs.push(q.backlog().await?.demand());
        }
        let shares = weighted_fair_shares(total, &self.weights, &backlogs);
        let queues: Vec<&Queue<C>> = self.queues.iter().collect();
        apply(&queues, &shares).await?;
        Ok(shares)
    }
}

/// Queues in strict priority order, highest first.
#[derive(Debug)]
pub struct PriorityQueues<C> {
    queues: Vec<Queue<C>>,
}

impl<C: ClusterApi> PriorityQueues<C> {
    /// Queues, the highest priority first.
    pub fn new(queues: Vec<Queue<C>>) -> PriorityQueues<C> {
        PriorityQueues { queues }
    }

    /// Queue `i` (0 is the highest).
    pub fn queue(&mut self, i: usize) -> &mut Queue<C> {
        &mut self.queues[i]
    }

    /// Enqueues a task on queue `i`.
    pub async fn submit(&mut self, i: usize, task: Task) -> Result<TaskId, EslError> {
        self.queues[i].submit(task).await
    }

    /// Gives all `total` slots to the highest queue with a backlog; the shares.
    pub async fn rebalance(&mut self, total: u64) -> Result<Vec<u64>, EslError> {
        let mut backlogs = Vec::with_capacity(self.queues.len());
        for q in &mut self.queues {
            backlogs.push(q.backlog().await?.demand());
        }
        let shares = strict_priority(total, &backlogs);
        let queues: Vec<&Queue<C>> = self.queues.iter().collect();
        apply(&queues, &shares).await?;
        Ok(shares)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use escher_proto::types::NodeId;

    use super::*;
    use crate::policy::testing::Rng;
    use crate::{Domain, InMemoryCluster, Mode};

    #[test]
    fn shares_follow_weights_and_needs() {
        assert_eq!(
            weighted_fair_shares(60, &[1, 2, 3], &[100, 100, 100]),
            [10, 20, 30]
        );
        // The first queue needs only 5; the rest is split 1:1 (25 -> 13 + 12, tie to the
        // earlier queue).
        assert_eq!(
            weighted_fair_shares(30, &[1, 1, 1], &[5, 100, 100]),
            [5, 13, 12]
        );
        // An empty queue gets nothing: recomputed when a queue empties.
        assert_eq!(weighted_fair_shares(12, &[1, 2, 3], &[4, 9, 0]), [4, 8, 0]);
        assert_eq!(weighted_fair_shares(12, &[1, 2, 3], &[0, 0, 0]), [0, 0, 0]);
        assert_eq!(weighted_fair_shares(0, &[1], &[3]), [0]);
        assert_eq!(weighted_fair_shares(10, &[0, 1], &[5, 5]), [0, 5]);
        // Cascading: 3 is sated at 2, then 2 at 3, the first takes the rest.
        assert_eq!(
            weighted_fair_shares(20, &[1, 1, 1], &[50, 3, 2]),
            [15, 3, 2]
        );
    }

    #[test]
    fn shares_are_weighted_max_min_fair() {
        let mut rng = Rng::new(77);
        for _ in 0..2000 {
            let n = rng.range(1, 6) as usize;
            let weights: Vec<u64> = (0..n).map(|_| rng.range(0, 5)).collect();
            let backlogs: Vec<u64> = (0..n).map(|_| rng.range(0, 30)).collect();
            let total = rng.range(0, 60);
            let shares = weighted_fair_shares(total, &weights, &backlogs);
            let wanted: u64 = (0..n)
                .filter(|i| weights[*i] > 0)
                .map(|i| backlogs[i])
                .sum();
            assert_eq!(
                shares.iter().sum::<u64>(),
                total.min(wanted),
                "{weights:?} {backlogs:?} {total}"
            );
            for i in 0..n {
                assert!(shares[i] <= backlogs[i]);
                if weights[i] == 0 {
                    assert_eq!(shares[i], 0);
                }
                // A queue that got less than it wanted is not behind any other queue by more
                // than rounding, in proportion to weight.
                if shares[i] < backlogs[i] && weights[i] > 0 {
                    for j in 0..n {
                        if shares[j] > 0 {
                            assert!(
                                (shares[j] - 1) * weights[i] < (shares[i] + 1) * weights[j],
                                "{weights:?} {backlogs:?} {total}: {shares:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn priority_goes_to_the_highest_queue_with_work() {
        assert_eq!(strict_priority(8, &[0, 3, 5]), [0, 8, 0]);
        assert_eq!(strict_priority(8, &[2, 3, 5]), [8, 0, 0]);
        assert_eq!(strict_priority(8, &[0, 0]), [0, 0]);
    }

    fn work() -> Task {
        Task::function("work", Vec::new())
    }

    fn running_per_queue(cluster: &InMemoryCluster, queues: &[Vec<TaskId>]) -> Vec<usize> {
        let running: BTreeMap<TaskId, NodeId> = cluster.running().into_iter().collect();
        queues
            .iter()
            .map(|ids| ids.iter().filter(|t| running.contains_key(t)).count())
            .collect()
    }

    #[tokio::test]
    async fn fair_queues_run_in_proportion_to_weights() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=64");
        let mut queues = Vec::new();
        for (name, w) in [("a", 1), ("b", 2), ("c", 3)] {
            let q = Queue::create(cluster.clone(), name, Domain::node(node))
                .await
                .unwrap();
            queues.push((q, w));
        }
        let mut fair = FairQueues::new(queues).unwrap();
        let mut ids = vec![Vec::new(); 3];
        for (i, ids) in ids.iter_mut().enumerate() {
            for _ in 0..20 {
                ids.push(fair.submit(i, work()).await.unwrap());
            }
        }
        assert_eq!(fair.rebalance(12).await.unwrap(), [2, 4, 6]);
        assert_eq!(running_per_queue(&cluster, &ids), [2, 4, 6]);
        // Queue c empties: its share goes to a and b, 1:2.
        for t in &ids[2] {
            if cluster.node_of(*t).is_some() {
                cluster.finish(*t, true);
            }
        }
        cluster.cancel(ids[2].clone()).await.unwrap();
        assert_eq!(fair.rebalance(12).await.unwrap(), [4, 8, 0]);
        assert_eq!(running_per_queue(&cluster, &ids), [4, 8, 0]);
        // Shrinking below what runs preempts nothing but admits nothing either.
        assert_eq!(fair.rebalance(6).await.unwrap(), [2, 4, 0]);
        let a_running: Vec<TaskId> = ids[0]
            .iter()
            .copied()
            .filter(|t| cluster.running().iter().any(|(r, _)| r == t))
            .collect();
        cluster.finish(a_running[0], true);
        assert_eq!(running_per_queue(&cluster, &ids), [3, 8, 0]);
        assert!(
            FairQueues::new(vec![(
                Queue::create(cluster.clone(), "z", Domain::All)
                    .await
                    .unwrap(),
                0
            )])
            .is_err()
        );
    }

    #[tokio::test]
    async fn only_the_highest_queue_with_work_runs() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        cluster.add_node("cpu=64");
        cluster.add_node("cpu=64");
        let mut queues = Vec::new();
        for name in ["high", "mid", "low"] {
            queues.push(
                Queue::create(cluster.clone(), name, Domain::All)
                    .await
                    .unwrap(),
            );
        }
        let mut prio = PriorityQueues::new(queues);
        let mut ids = vec![Vec::new(); 3];
        for i in [2, 1] {
            for _ in 0..6 {
                ids[i].push(prio.submit(i, work()).await.unwrap());
            }
        }
        assert_eq!(prio.rebalance(2).await.unwrap(), [0, 2, 0]);
        assert_eq!(
            running_per_queue(&cluster, &ids),
            [0, 4, 0],
            "2 per node, 2 nodes"
        );
        ids[0].push(prio.submit(0, work()).await.unwrap());
        assert_eq!(prio.rebalance(2).await.unwrap(), [2, 0, 0]);
        let running = running_per_queue(&cluster, &ids);
        assert_eq!(running[0], 1, "high runs at once");
        assert_eq!(running[2], 0, "low never ran");
        for (t, _) in cluster.running() {
            cluster.finish(t, true);
        }
        assert_eq!(prio.rebalance(2).await.unwrap(), [0, 2, 0]);
        assert_eq!(running_per_queue(&cluster, &ids), [0, 2, 0]);
        for _ in 0..2 {
            for (t, _) in cluster.running() {
                cluster.finish(t, true);
            }
        }
        assert_eq!(prio.rebalance(2).await.unwrap(), [0, 0, 2]);
        assert_eq!(running_per_queue(&cluster, &ids), [0, 0, 4]);
    }
}
