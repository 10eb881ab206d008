//! `WaitStream`: one stream on which a client asks for many tasks' ends and is pushed each
//! final status as the task finishes, instead of a `Wait` call per task.
//!
//! Each id asked for becomes a wait for that one task at the owner (the same waiters a `Wait`
//! call registers, docs/DESIGN.md §7: soft state of the leader). The stream's own task merges the
//! requests coming in with the waits completing, and pushes the statuses that are ready
//! together in one reply. A request is checked as a `Wait` call would be (the caller may see
//! each task; a task credential still acts for a running attempt) and refused as a whole with
//! the same status; a wait that fails (the replica stops leading, the head shuts down) is
//! pushed as failed with why, and the client waits for it another way.

use escher_proto::types::{TaskId, TaskStatus, WaitReply};
use escher_proto::wire;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

use super::cluster_svc::{ClusterService, check_visible};
use super::owner::Msg;
use crate::auth::{Caller, check_attempt};

/// The most tasks one stream waits for at once; a request beyond it is refused.
pub(crate) const MAX_STREAM_WAITS: usize = 100_000;
/// How many replies wait to be sent before the stream's task waits for the client.
const REPLIES_QUEUED: usize = 16;

/// What one wait ends with: the task's final status, or why it failed.
type Ended = (TaskId, Result<TaskStatus, Status>);
/// Where the owner answers a wait.
type Answer = oneshot::Receiver<Result<WaitReply, Status>>;

impl ClusterService {
    /// Serves one result stream for `caller`: the replies, as a stream.
    pub(crate) fn wait_stream_for(
        &self,
        caller: Caller,
        inbound: Streaming<wire::WaitStreamRequest>,
    ) -> mpsc::Receiver<Result<wire::WaitStreamReply, Status>> {
        let (out, replies) = mpsc::channel(REPLIES_QUEUED);
        tokio::spawn(self.clone().serve_waits(caller, inbound, out));
        replies
    }

    async fn serve_waits(
        self,
        caller: Caller,
        mut inbound: Streaming<wire::WaitStreamRequest>,
        out: mpsc::Sender<Result<wire::WaitStreamReply, Status>>,
    ) {
        let mut waits = FuturesUnordered::new();
        loop {
            let replies = tokio::select! {
                next = inbound.next() => {
                    // The client closed its side or the stream broke: nobody reads the rest.
                    let Some(Ok(request)) = next else { break };
                    let ids: Vec<TaskId> = request.task_ids.into_iter().map(TaskId).collect();
                    match self.start_waits(&caller, &ids, waits.len()).await {
                        Ok(started) => {
                            waits.extend(started.into_iter().map(|(id, rx)| ended(id, rx)));
                            continue;
                        }
                        Err(status) => vec![failed(ids, &status)],
                    }
                }
                Some(first) = waits.next(), if !waits.is_empty() => {
                    // Everything else already ended travels in the same reply.
                    let mut ended = vec![first];
                    while let Some(Some(more)) = waits.next().now_or_never() {
                        ended.push(more);
                    }
                    pushed(ended)
                }
                () = out.closed() => break,
            };
            for reply in replies {
                if out.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Checks a request as `Wait` would and registers a wait for each of its tasks.
    async fn start_waits(
        &self,
        caller: &Caller,
        ids: &[TaskId],
        waiting: usize,
    ) -> Result<Vec<(TaskId, Answer)>, Status> {
        if waiting + ids.len() > MAX_STREAM_WAITS {
            return Err(Status::resource_exhausted(format!(
                "one result stream waits for at most {MAX_STREAM_WAITS} tasks at once \
                 ({waiting} now, {} more asked); wait on another stream or call Wait",
                ids.len()
            )));
        }
        check_attempt(&self.owner, caller).await?;
        check_visible(&self.owner, caller, ids).await?;
        let mut started = Vec::with_capacity(ids.len());
        for &id in ids {
            let (reply, rx) = oneshot::channel();
            let wait = Msg::Wait {
                ids: vec![id],
                num_returns: 1,
                reply,
            };
            self.owner.tell(wait).await?;
            started.push((id, rx));
        }
        Ok(started)
    }
}

/// The end of the wait for `id`, whose answer comes on `answer`.
async fn ended(id: TaskId, answer: Answer) -> Ended {
    let status = match answer.await {
        Ok(Ok(mut answer)) => answer
            .ready
            .pop()
            .ok_or_else(|| Status::internal("a wait for one task ended without it")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(Status::unavailable("the head is shutting down")),
    };
    (id, status)
}

/// The replies for waits that ended: one with every final status, one per failure.
fn pushed(ended: Vec<Ended>) -> Vec<wire::WaitStreamReply> {
    let mut finished = Vec::new();
    let mut replies = Vec::new();
    for (id, outcome) in ended {
        match outcome {
            Ok(status) => finished.push(status.into()),
            Err(status) => replies.push(failed(vec![id], &status)),
        }
    }
    if !finished.is_empty() {
        replies.insert(
            0,
            wire::WaitStreamReply {
                finished,
                failed: Vec::new(),
                error: None,
            },
        );
    }
    replies
}

/// The reply saying that the waits for `ids` failed with `status`.
fn failed(ids: Vec<TaskId>, status: &Status) -> wire::WaitStreamReply {
    wire::WaitStreamReply {
        finished: Vec::new(),
        failed: ids.into_iter().map(|id| id.0).collect(),
        error: Some(wire::CallError::from(status)),
    }
}
