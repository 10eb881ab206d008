//! The watch hub (docs/DESIGN.md §11): the recent history of events and the watchers subscribed to
//! it.
//!
//! The owner publishes every applied command's events here, on every replica (a follower keeps
//! the same history, numbered the same way, so a watcher resumes on whichever replica leads
//! next). History is bounded (`--watch-history` events): a watcher that asks to resume from a
//! revision older than what is kept is told to list the current state again, like Kubernetes'
//! "resource version too old". Each watcher has a bounded buffer; the owner never waits for
//! one: a watcher whose buffer is full is cut off (told how far it got), so a stalled client
//! costs the head one comparison, never a slower submit.
//!
//! The owner publishes once per turn, so a watcher gets one batch per turn (a thousand
//! submitted tasks are one channel message, not a thousand), and each event is encoded once,
//! whoever watches.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use escher_proto::types::{SHARED_NAMESPACE, TaskId, WatchBatch, WatchKind, WatchRequest};
use escher_proto::wire;
use prost::bytes::Bytes;
use rustc_hash::FxHashSet;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::auth::Caller;
use crate::state::Recorded;

/// What one watcher asked for, and who it is.
#[derive(Debug)]
pub(crate) struct Filter {
    caller: Caller,
    request: WatchRequest,
    tasks: FxHashSet<TaskId>,
}

impl Filter {
    /// The filter of `request` for `caller` (whose namespace rules were checked already).
    pub(crate) fn new(request: WatchRequest, caller: Caller) -> Filter {
        let tasks = request.tasks.iter().copied().collect();
        Filter {
            caller,
            request,
            tasks,
        }
    }

    /// Whether the watcher wants `recorded`, and may see it.
    pub(crate) fn matches(&self, recorded: &Recorded) -> bool {
        let event = &recorded.event.event;
        let kind = event.kind();
        let kinds = &self.request.kinds;
        if !kinds.is_empty() && !kinds.contains(&kind) {
            return false;
        }
        if kind.is_task() {
            let ns = event.task_namespace();
            if !self.caller.sees(ns.map(|n| n.as_str())) {
                return false;
            }
            if self.request.namespace.is_some() && self.request.namespace.as_ref() != ns {
                return false;
            }
            if !self.tasks.is_empty() && !event.task().is_some_and(|t| self.tasks.contains(&t)) {
                return false;
            }
            return self.request.labels.iter().all(|(key, value)| {
                match (recorded.labels.get(key), value) {
                    (Some(have), Some(want)) => have == want,
                    (Some(_), None) => true,
                    (None, _) => false,
                }
            });
        }
        if self.request.tasks_only() {
            return false;
        }
        // Nodes are everyone's; a resource is its namespace's (physical and shared ones are
        // everyone's), like in a cluster status.
        let Some(qualifier) = event.resource().and_then(|n| n.namespace()) else {
            return self.request.namespace.is_none() || kind == WatchKind::Node;
        };
        if let Some(scope) = self.caller.status_scope()
            && qualifier != scope.as_str()
            && qualifier != SHARED_NAMESPACE
        {
            return false;
        }
        self.request
            .namespace
            .as_ref()
            .is_none_or(|want| want.as_str() == qualifier)
    }
}

/// An event as the hub keeps it: what the state recorded, and its encoding, made once by the
/// first watcher that sends it (every other watcher sends the same bytes).
#[derive(Debug)]
pub(crate) struct Item {
    recorded: Recorded,
    encoded: OnceLock<Bytes>,
}

impl Item {
    fn revision(&self) -> u64 {
        self.recorded.event.revision
    }

    fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| {
                let event = wire::WatchEvent::from(self.recorded.event.clone());
                wire::WatchResponse::encode_event(&event)
            })
            .clone()
    }
}

/// What a new watcher gets: where it starts, what it missed, and the live feed.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// The revision the stream starts after.
    pub(crate) revision: u64,
    /// The events after `revision` already recorded, that the filter matches.
    pub(crate) backlog: Vec<Arc<Item>>,
    /// The events recorded from now on that the filter matches, a batch per owner turn.
    pub(crate) live: mpsc::UnboundedReceiver<Vec<Arc<Item>>>,
    /// How many events wait in `live` (the hub cuts the watcher off past its buffer).
    pub(crate) queued: Arc<AtomicUsize>,
    /// Why the hub stopped feeding `live`, when it did.
    pub(crate) ended: oneshot::Receiver<Status>,
}

#[derive(Debug)]
struct Watcher {
    filter: Filter,
    tx: mpsc::UnboundedSender<Vec<Arc<Item>>>,
    queued: Arc<AtomicUsize>,
    end: Option<oneshot::Sender<Status>>,
}

impl Watcher {
    fn end(&mut self, status: Status) {
        if let Some(end) = self.end.take() {
            let _ = end.send(status);
        }
    }
}

/// The history and the watchers.
#[derive(Debug)]
pub(crate) struct Hub {
    history: VecDeque<Arc<Item>>,
    capacity: usize,
    /// How many events one watcher may have waiting before it is cut off.
    buffer: usize,
    /// Every event after this revision is in `history`.
    base: u64,
    /// The revision of the last event published.
    current: u64,
    watchers: Vec<Watcher>,
}

impl Hub {
    /// A hub keeping the last `capacity` events, starting after `revision`, letting each
    /// watcher have `buffer` events waiting.
    pub(crate) fn new(capacity: usize, buffer: usize, revision: u64) -> Hub {
        Hub {
            history: VecDeque::new(),
            capacity,
            buffer: buffer.max(1),
            base: revision,
            current: revision,
            watchers: Vec::new(),
        }
    }

    /// Records `events` (in revision order) and hands each watcher, in one batch, those it
    /// wants.
    pub(crate) fn publish(&mut self, events: Vec<Recorded>) {
        let Some(last) = events.last() else {
            return;
        };
        self.current = last.event.revision;
        let items: Vec<Arc<Item>> = events
            .into_iter()
            .map(|recorded| {
                Arc::new(Item {
                    recorded,
                    encoded: OnceLock::new(),
                })
            })
            .collect();
        if !self.watchers.is_empty() {
            self.deliver(&items);
        }
        if self.capacity == 0 {
            self.base = self.current;
            return;
        }
        for item in items {
            if self.history.len() == self.capacity
                && let Some(oldest) = self.history.pop_front()
            {
                self.base = oldest.revision();
            }
            self.history.push_back(item);
        }
    }

    fn deliver(&mut self, items: &[Arc<Item>]) {
        let buffer = self.buffer;
        self.watchers.retain_mut(|w| {
            let batch: Vec<Arc<Item>> = items
                .iter()
                .filter(|i| w.filter.matches(&i.recorded))
                .cloned()
                .collect();
            let Some(first) = batch.first() else {
                return !w.tx.is_closed();
            };
            let waiting = w.queued.load(Ordering::Acquire);
            if waiting + batch.len() > buffer {
                w.end(Status::resource_exhausted(format!(
                    "this watcher fell {buffer} events behind and was cut off before revision \
                     {} (the head never waits for a watcher): watch again after the last \
                     revision you saw, or list the current state and watch from now",
                    first.revision()
                )));
                return false;
            }
            w.queued.fetch_add(batch.len(), Ordering::AcqRel);
            w.tx.send(batch).is_ok()
        });
    }

    /// Subscribes a watcher: the events after `after` (or none, from now), then every new one
    /// the filter matches.
    pub(crate) fn subscribe(
        &mut self,
        filter: Filter,
        after: Option<u64>,
    ) -> Result<Subscription, Status> {
        let after = after.unwrap_or(self.current);
        if after > self.current {
            return Err(Status::unavailable(format!(
                "this head replica has recorded events up to revision {} only, not yet {after}: \
                 try again in a moment",
                self.current
            )));
        }
        if after < self.base {
            return Err(Status::out_of_range(format!(
                "revision {after} is older than the oldest event this head keeps (revision {}; \
                 it keeps the last {} events, escher-head --watch-history): list the current \
                 state, then watch from now",
                self.base + 1,
                self.capacity
            )));
        }
        let skip = (after - self.base) as usize;
        let backlog = self
            .history
            .iter()
            .skip(skip)
            .filter(|i| filter.matches(&i.recorded))
            .cloned()
            .collect();
        let (tx, live) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let (end, ended) = oneshot::channel();
        self.watchers.push(Watcher {
            filter,
            tx,
            queued: Arc::clone(&queued),
            end: Some(end),
        });
        Ok(Subscription {
            revision: after,
            backlog,
            live,
            queued,
            ended,
        })
    }

    /// A snapshot replaced the state: the history no longer leads up to it.
    pub(crate) fn restart(&mut self, revision: u64) {
        self.history.clear();
        self.base = revision;
        self.current = revision;
        self.end_all(|| {
            Status::aborted(
                "this head replica's state was replaced by a snapshot: watch again after the \
                 last revision you saw",
            )
        });
    }

    /// Ends every watcher with `status` (this replica stopped leading, or is stopping).
    pub(crate) fn end_all(&mut self, status: impl Fn() -> Status) {
        for mut w in self.watchers.drain(..) {
            w.end(status());
        }
    }

    /// Forgets watchers whose client went away.
    pub(crate) fn prune(&mut self) {
        self.watchers.retain(|w| !w.tx.is_closed());
    }

    /// How many watchers are subscribed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.watchers.len()
    }
}

/// The most events one message of a watch stream carries.
const BATCH: usize = 512;
/// How many times a watcher's stream yields to let more events gather before it sends.
const COALESCE_YIELDS: usize = 16;

/// Streams a subscription to its client: a first message with the revision the stream starts
/// after, the backlog, then live events, batched as they come. Ends when the client goes away,
/// or with the status the hub gave when it stopped feeding this watcher.
pub(crate) async fn forward(
    subscription: Subscription,
    out: mpsc::Sender<Result<wire::WatchResponse, Status>>,
) {
    let Subscription {
        revision,
        backlog,
        mut live,
        queued,
        ended,
    } = subscription;
    let first = WatchBatch {
        events: Vec::new(),
        revision,
    };
    if out.send(Ok(first.into())).await.is_err() {
        return;
    }
    for chunk in backlog.chunks(BATCH) {
        if out.send(Ok(response(chunk))).await.is_err() {
            return;
        }
    }
    let mut pending: Vec<Arc<Item>> = Vec::with_capacity(BATCH);
    loop {
        let got = tokio::select! {
            () = out.closed() => return,
            got = live.recv() => got,
        };
        let Some(batch) = got else {
            break;
        };
        pending.extend(batch);
        // Under load more arrives while this task waits its turn: a few yields (no timer, so
        // nothing waits when the head is idle) turn many small messages into a few large ones,
        // which is most of what a watcher costs.
        for _ in 0..COALESCE_YIELDS {
            while pending.len() < BATCH
                && let Ok(more) = live.try_recv()
            {
                pending.extend(more);
            }
            if pending.len() >= BATCH {
                break;
            }
            tokio::task::yield_now().await;
        }
        while pending.len() < BATCH
            && let Ok(more) = live.try_recv()
        {
            pending.extend(more);
        }
        queued.fetch_sub(pending.len(), Ordering::AcqRel);
        for chunk in pending.chunks(BATCH) {
            if out.send(Ok(response(chunk))).await.is_err() {
                return;
            }
        }
        pending.clear();
    }
    let status = ended
        .await
        .unwrap_or_else(|_| Status::unavailable("the head is shutting down"));
    let _ = out.send(Err(status)).await;
}

/// One message of events (in revision order).
fn response(items: &[Arc<Item>]) -> wire::WatchResponse {
    wire::WatchResponse {
        events: items.iter().map(|i| i.encoded()).collect(),
        revision: items.last().map_or(0, |i| i.revision()),
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{
        ClusterEvent, Labels, Namespace, NodeChange, NodeId, ResourceName, WatchEvent,
    };

    use super::*;

    fn task_event(revision: u64, task: u64, ns: Option<&str>) -> Recorded {
        let mut labels = Labels::new();
        labels
            .insert(
                "stage",
                if task.is_multiple_of(2) {
                    "map"
                } else {
                    "reduce"
                },
            )
            .unwrap();
        Recorded {
            event: WatchEvent {
                revision,
                at_ms: 0,
                event: ClusterEvent::Submitted {
                    task: TaskId(task),
                    name: String::new(),
                    namespace: ns.map(|n| Namespace::new(n).unwrap()),
                },
            },
            labels,
        }
    }

    fn node_event(revision: u64) -> Recorded {
        Recorded {
            event: WatchEvent {
                revision,
                at_ms: 0,
                event: ClusterEvent::Node {
                    node: NodeId(1),
                    name: "n".into(),
                    change: NodeChange::Joined,
                    reason: None,
                },
            },
            labels: Labels::new(),
        }
    }

    fn resource_event(revision: u64, name: &str) -> Recorded {
        Recorded {
            event: WatchEvent {
                revision,
                at_ms: 0,
                event: ClusterEvent::Resource {
                    node: NodeId(1),
                    name: ResourceName::new(name).unwrap(),
                    capacity: None,
                },
            },
            labels: Labels::new(),
        }
    }

    fn revisions(backlog: &[Arc<Item>]) -> Vec<u64> {
        backlog.iter().map(|i| i.revision()).collect()
    }

    #[test]
    fn resumes_from_history_and_refuses_what_it_no_longer_keeps() {
        let mut hub = Hub::new(4, 8, 0);
        hub.publish((1..=6).map(|r| task_event(r, r, None)).collect());
        let all = || Filter::new(WatchRequest::all(), Caller::Admin);
        let sub = hub.subscribe(all(), Some(3)).unwrap();
        assert_eq!(revisions(&sub.backlog), vec![4, 5, 6]);
        assert_eq!(sub.revision, 3);
        let now = hub.subscribe(all(), None).unwrap();
        assert!(now.backlog.is_empty());
        assert_eq!(now.revision, 6);
        let err = hub.subscribe(all(), Some(1)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        assert!(
            err.message()
                .contains("oldest event this head keeps (revision 3")
        );
        // The oldest kept is the last one that may be resumed from.
        assert_eq!(
            revisions(&hub.subscribe(all(), Some(2)).unwrap().backlog).len(),
            4
        );
        let ahead = hub.subscribe(all(), Some(9)).unwrap_err();
        assert_eq!(ahead.code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn a_full_watcher_is_cut_off_and_the_others_go_on() {
        let mut hub = Hub::new(10, 64, 0);
        let mut stalled = hub
            .subscribe(Filter::new(WatchRequest::all(), Caller::Admin), None)
            .unwrap();
        let mut reading = hub
            .subscribe(Filter::new(WatchRequest::all(), Caller::Admin), None)
            .unwrap();
        let total = 64 + 10;
        for r in 1..=total {
            hub.publish(vec![node_event(r)]);
            // One watcher keeps up; the other reads nothing.
            let batch = reading.live.try_recv().unwrap();
            reading.queued.fetch_sub(batch.len(), Ordering::AcqRel);
            assert_eq!(revisions(&batch), vec![r]);
        }
        assert_eq!(hub.len(), 1);
        let why = stalled.ended.try_recv().unwrap();
        assert_eq!(why.code(), tonic::Code::ResourceExhausted);
        let mut got = 0;
        while let Ok(batch) = stalled.live.try_recv() {
            got += batch.len();
        }
        assert_eq!(got, 64);
        // One publish is one batch per watcher, filtered.
        let mut batched = hub
            .subscribe(Filter::new(WatchRequest::all(), Caller::Admin), None)
            .unwrap();
        hub.publish((total + 1..=total + 5).map(node_event).collect());
        assert_eq!(batched.live.try_recv().unwrap().len(), 5);
        assert!(batched.live.try_recv().is_err());
    }

    #[test]
    fn filters_by_namespace_task_label_and_kind_and_hide_other_namespaces() {
        let mut hub = Hub::new(100, 8, 0);
        hub.publish(vec![
            task_event(1, 1, Some("team-a")),
            task_event(2, 2, Some("team-b")),
            task_event(3, 4, None),
            node_event(4),
            resource_event(5, "team-a/data"),
            resource_event(6, "team-b/data"),
            resource_event(7, "cpu"),
        ]);
        let ns = |n: &str| Namespace::new(n).unwrap();
        let mut see = |request: WatchRequest, caller: Caller| {
            revisions(
                &hub.subscribe(Filter::new(request, caller), Some(0))
                    .unwrap()
                    .backlog,
            )
        };
        assert_eq!(
            see(WatchRequest::all(), Caller::Admin),
            vec![1, 2, 3, 4, 5, 6, 7]
        );
        // An app sees its own tasks and resources, physical ones and nodes.
        assert_eq!(
            see(WatchRequest::all(), Caller::App(ns("team-a"))),
            vec![1, 4, 5, 7]
        );
        // A reader sees no task.
        assert_eq!(see(WatchRequest::all(), Caller::Reader), vec![4, 5, 6, 7]);
        let team_b = WatchRequest {
            namespace: Some(ns("team-b")),
            ..WatchRequest::all()
        };
        assert_eq!(see(team_b, Caller::Admin), vec![2, 4, 6]);
        assert_eq!(
            see(WatchRequest::tasks([TaskId(4)]), Caller::Admin),
            vec![3]
        );
        let maps = WatchRequest {
            labels: vec![("stage".into(), Some("map".into()))],
            ..WatchRequest::all()
        };
        assert_eq!(see(maps, Caller::Admin), vec![2, 3]);
        let nodes = WatchRequest::all().kinds([WatchKind::Node, WatchKind::Resource]);
        assert_eq!(see(nodes, Caller::Admin), vec![4, 5, 6, 7]);
    }
}
