//! [`Watch`]: the cluster's events as a stream (docs/DESIGN.md §11), and the futures built on it
//! ([`Client::started`], [`Client::finished`]).
//!
//! A watch is served by one head replica; when the stream breaks (a leader change, a restart
//! the failover timeout covers, or this watcher falling so far behind that the head cut it
//! off) the watch subscribes again after the last revision it delivered, so the events come
//! in revision order with none lost and none twice. Only when the head no longer keeps the
//! events after that revision does the stream end, with [`ClientError::HistoryExpired`]: list
//! the state again, then watch from now.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use escher_proto::types::{
    ClusterEvent, TaskState, WatchBatch, WatchEvent, WatchKind, WatchRequest,
};
use escher_proto::{TaskId, wire};
use tokio::sync::mpsc;
use tokio_stream::Stream;

use crate::{Client, ClientError};

/// How many batches of events (one per message from the head, at most 512 events each) a
/// watch holds for its reader before it stops reading from the head (the head then buffers;
/// past its own bound it cuts the stream, and the watch resumes).
const BUFFER: usize = 16;

type Batch = Result<Vec<WatchEvent>, ClientError>;

/// The cluster's events, in revision order. A [`Stream`] of `Result<WatchEvent, ClientError>`;
/// [`Watch::next`] reads it without any stream combinator. Dropping it ends the subscription.
#[derive(Debug)]
pub struct Watch {
    rx: mpsc::Receiver<Batch>,
    ready: std::collections::VecDeque<WatchEvent>,
    delivered: u64,
}

impl Watch {
    /// The next event; `None` once the watch ended (after an error it reported).
    pub async fn next(&mut self) -> Option<Result<WatchEvent, ClientError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                self.delivered = event.revision;
                return Some(Ok(event));
            }
            match self.rx.recv().await? {
                Ok(batch) => self.ready.extend(batch),
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// The revision this watch has delivered everything up to (the last event read, or where
    /// it started): give it to [`WatchRequest::after`] to resume later with nothing lost.
    pub fn revision(&self) -> u64 {
        self.delivered
    }
}

impl Stream for Watch {
    type Item = Result<WatchEvent, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                self.delivered = event.revision;
                return Poll::Ready(Some(Ok(event)));
            }
            match std::task::ready!(self.rx.poll_recv(cx)) {
                Some(Ok(batch)) => self.ready.extend(batch),
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => return Poll::Ready(None),
            }
        }
    }
}

impl Client {
    /// Subscribes to the cluster's events that `request` selects (an application client sees
    /// its own namespace's only). The subscription is in place when this returns: every event
    /// committed from then on is delivered.
    pub async fn watch(&self, request: WatchRequest) -> Result<Watch, ClientError> {
        let mut request = request;
        if request.namespace.is_none() {
            request.namespace = self.namespace().cloned();
        }
        let stream = self.subscribe(&request).await?;
        let start = stream.1;
        let (tx, rx) = mpsc::channel(BUFFER);
        let feed = Feed {
            client: self.clone(),
            request,
            revision: start,
            tx,
        };
        tokio::spawn(feed.run(stream.0));
        Ok(Watch {
            rx,
            ready: std::collections::VecDeque::new(),
            delivered: start,
        })
    }

    /// Opens one watch stream; returns it with the revision it starts after.
    async fn subscribe(
        &self,
        request: &WatchRequest,
    ) -> Result<(tonic::Streaming<wire::WatchResponse>, u64), ClientError> {
        let message = wire::WatchRequest::from(request.clone());
        let mut stream = self
            .call(|mut rpc| {
                let message = message.clone();
                async move { rpc.watch(message).await }
            })
            .await?;
        // The head's first message says where the stream starts.
        let first = stream
            .message()
            .await
            .map_err(|s| ClientError::from_status(s, self.head_url()))?
            .ok_or_else(|| ClientError::Unavailable {
                url: self.head_url().to_string(),
                message: "the watch stream ended before it started".into(),
            })?;
        let first = WatchBatch::try_from(first)?;
        Ok((stream, first.revision))
    }

    /// Waits until an attempt of `task` has been dispatched to a node; returns the node and
    /// the attempt. Returns at once if it already runs (or ran); fails if the task ended
    /// without ever starting (cancelled while pending, or infeasible past its deadline).
    pub async fn started(
        &self,
        task: impl Into<TaskId>,
    ) -> Result<(escher_proto::NodeId, u32), ClientError> {
        let task = task.into();
        let kinds = [WatchKind::Started, WatchKind::Finished];
        let mut watch = self.watch(WatchRequest::tasks([task]).kinds(kinds)).await?;
        // Subscribed first, then looked up: nothing can happen in between unseen.
        let info = self.task_info(task).await?;
        if let Some(node) = info.status.node
            && info.status.attempt > 0
        {
            return Ok((node, info.status.attempt));
        }
        if info.status.state.is_terminal() {
            return Err(never_started(task, &info.status.state, info.status.reason));
        }
        while let Some(event) = watch.next().await {
            match event?.event {
                ClusterEvent::Started { node, attempt, .. } => return Ok((node, attempt)),
                ClusterEvent::Finished { state, reason, .. } => {
                    return Err(never_started(task, &state, reason));
                }
                _ => {}
            }
        }
        Err(ended(self))
    }

    /// Waits until `task` reaches its final state, whatever it is; returns the state and the
    /// reason it failed or was cancelled. Unlike [`Client::get`] it neither fetches the result
    /// nor treats a failure as an error: the hook an ESL needs when a task ends.
    pub async fn finished(
        &self,
        task: impl Into<TaskId>,
    ) -> Result<(TaskState, Option<String>), ClientError> {
        let task = task.into();
        let mut watch = self
            .watch(WatchRequest::tasks([task]).kinds([WatchKind::Finished]))
            .await?;
        let info = self.task_info(task).await?;
        if info.status.state.is_terminal() {
            return Ok((info.status.state, info.status.reason));
        }
        while let Some(event) = watch.next().await {
            if let ClusterEvent::Finished { state, reason, .. } = event?.event {
                return Ok((state, reason));
            }
        }
        Err(ended(self))
    }
}

fn never_started(task: TaskId, state: &TaskState, reason: Option<String>) -> ClientError {
    let why = reason.map(|r| format!(": {r}")).unwrap_or_default();
    ClientError::Usage(format!("task {task} is {state} and never started{why}"))
}

fn ended(client: &Client) -> ClientError {
    ClientError::Unavailable {
        url: client.head_url().to_string(),
        message: "the watch ended".into(),
    }
}

/// Whether subscribing again may work: the head was unreachable, or the connection to a
/// replica that just died was cut mid-call.
fn transient(error: &ClientError) -> bool {
    error.is_retryable()
        || matches!(error, ClientError::Rpc(status)
            if matches!(status.code(), tonic::Code::Cancelled | tonic::Code::Unknown))
}

/// The task that reads a watch's streams and resubscribes when one breaks.
struct Feed {
    client: Client,
    request: WatchRequest,
    /// The last revision handed to the reader.
    revision: u64,
    tx: mpsc::Sender<Batch>,
}

impl Feed {
    async fn run(mut self, mut stream: tonic::Streaming<wire::WatchResponse>) {
        loop {
            let broke = self.drain(&mut stream).await;
            let Some(status) = broke else {
                return; // the reader went away
            };
            match self.resubscribe(status).await {
                Ok(next) => stream = next,
                Err(error) => {
                    let _ = self.tx.send(Err(error)).await;
                    return;
                }
            }
        }
    }

    /// Delivers a stream's events until it breaks (`Some` with why) or the reader is gone.
    async fn drain(
        &mut self,
        stream: &mut tonic::Streaming<wire::WatchResponse>,
    ) -> Option<tonic::Status> {
        loop {
            let message = tokio::select! {
                () = self.tx.closed() => return None,
                message = stream.message() => message,
            };
            let batch = match message {
                Ok(Some(m)) => m,
                Ok(None) => return Some(tonic::Status::unavailable("the watch stream ended")),
                Err(status) => return Some(status),
            };
            let batch = match WatchBatch::try_from(batch) {
                Ok(b) => b,
                Err(e) => {
                    let _ = self.tx.send(Err(e.into())).await;
                    return None;
                }
            };
            // Never twice: a resumed stream starts after the last one delivered.
            let seen = self.revision;
            let mut events = batch.events;
            events.retain(|e| e.revision > seen);
            let Some(last) = events.last().map(|e| e.revision) else {
                continue;
            };
            if self.tx.send(Ok(events)).await.is_err() {
                return None;
            }
            self.revision = last;
        }
    }

    /// Subscribes again after the last revision delivered, while the break is one a retry can
    /// get past (within the client's failover timeout).
    async fn resubscribe(
        &mut self,
        status: tonic::Status,
    ) -> Result<tonic::Streaming<wire::WatchResponse>, ClientError> {
        let resumable = matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Aborted
                | tonic::Code::ResourceExhausted
                | tonic::Code::Cancelled
        ) || !matches!(crate::heads::answer(&status), crate::heads::Answer::Other);
        if !resumable {
            return Err(ClientError::from_status(status, self.client.head_url()));
        }
        tracing::debug!(code = ?status.code(), message = status.message(), "watch stream broke; resuming");
        let deadline = tokio::time::Instant::now() + self.client.failover_timeout();
        let mut pauses = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .without_max_times()
            .build();
        let mut pause = pauses.next().unwrap_or_default();
        loop {
            self.request.after = Some(self.revision);
            match self.client.subscribe(&self.request).await {
                Ok((stream, _)) => return Ok(stream),
                Err(error)
                    if transient(&error) && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = pauses.next().unwrap_or(pause);
                }
                Err(error) => return Err(error),
            }
        }
    }
}
