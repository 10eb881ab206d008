//! [`TaskEnds`]: which tracked tasks have ended, learnt from the cluster's events instead of a
//! status read per task.
//!
//! A feed of every `Finished` event the client may see runs in the background. A task is
//! tracked after it was submitted, so its end may arrive first: the ends of untracked tasks
//! are remembered for a while (the last [`RECENT`]), and tracking one of them reports it ended
//! at once. When the feed breaks (the head cut it off and no longer has the events to resume
//! from), [`TaskEnds::take_ended`] says so, and the caller reads the statuses it needs once
//! after starting a new feed.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use escher_proto::types::{ClusterEvent, TaskId, WatchKind, WatchRequest};

use crate::{ClusterApi, EslError};

/// How many ends of untracked tasks are remembered.
const RECENT: usize = 65_536;

#[derive(Debug, Default)]
struct Ends {
    tracked: HashSet<TaskId>,
    ended: Vec<TaskId>,
    recent: VecDeque<TaskId>,
    recent_set: HashSet<TaskId>,
    broken: bool,
}

impl Ends {
    fn finished(&mut self, task: TaskId) {
        if self.tracked.remove(&task) {
            self.ended.push(task);
            return;
        }
        if self.recent.len() == RECENT
            && let Some(old) = self.recent.pop_front()
        {
            self.recent_set.remove(&old);
        }
        if self.recent_set.insert(task) {
            self.recent.push_back(task);
        }
    }
}

/// The ends of tracked tasks, fed by the cluster's events. Stops its feed when dropped.
#[derive(Debug)]
pub(crate) struct TaskEnds {
    ends: Arc<Mutex<Ends>>,
    feed: tokio::task::JoinHandle<()>,
}

impl Drop for TaskEnds {
    fn drop(&mut self) {
        self.feed.abort();
    }
}

fn lock(ends: &Mutex<Ends>) -> MutexGuard<'_, Ends> {
    ends.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TaskEnds {
    /// Subscribes to the ends of every task the cluster's client may see. Every task that
    /// ends from now on is seen.
    pub(crate) async fn start<C: ClusterApi>(cluster: &C) -> Result<TaskEnds, EslError> {
        let mut events = cluster
            .watch(WatchRequest::all().kinds([WatchKind::Finished]))
            .await?;
        let ends = Arc::new(Mutex::new(Ends::default()));
        let fed = Arc::clone(&ends);
        let feed = tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                if let ClusterEvent::Finished { task, .. } = event.event {
                    lock(&fed).finished(task);
                }
            }
            lock(&fed).broken = true;
        });
        Ok(TaskEnds { ends, feed })
    }

    /// Reports the end of `tasks` once it comes (or now, if it came already).
    pub(crate) fn track(&self, tasks: impl IntoIterator<Item = TaskId>) {
        let mut ends = lock(&self.ends);
        for task in tasks {
            if ends.recent_set.remove(&task) {
                ends.ended.push(task);
            } else {
                ends.tracked.insert(task);
            }
        }
    }

    /// The tracked tasks that ended since the last call; `None` if the feed broke (some ends
    /// may be missing: start a new one and read the statuses).
    pub(crate) fn take_ended(&self) -> Option<Vec<TaskId>> {
        let mut ends = lock(&self.ends);
        if ends.broken {
            return None;
        }
        Some(std::mem::take(&mut ends.ended))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InMemoryCluster, Mode};

    fn task() -> escher_proto::types::TaskSpec {
        escher_client::Task::function("f", Vec::new())
            .resources_str("cpu=1")
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn ends_arrive_whether_tracked_before_or_after() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        cluster.add_node("cpu=4");
        let ends = TaskEnds::start(&cluster).await.unwrap();
        let ids = cluster.submit(vec![task(), task(), task()]).await.unwrap();
        // Ended before it was tracked.
        cluster.finish(ids[0], true);
        ends.track(ids.iter().copied());
        cluster.finish(ids[1], false);
        tokio::task::yield_now().await;
        let mut ended = Vec::new();
        for _ in 0..100 {
            ended.extend(ends.take_ended().unwrap());
            if ended.len() == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        ended.sort();
        assert_eq!(ended, vec![ids[0], ids[1]]);
        assert!(ends.take_ended().unwrap().is_empty());
    }
}
