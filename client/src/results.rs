//! Results: a client's `get` calls wait on one long-lived `WaitStream` to the head, which
//! pushes each task's final status as the task finishes, instead of a `Wait` call per task.
//!
//! One background task per client (started on first use, like the submitter) owns the stream.
//! A `get` hands it the task's id; ids handed over while it was busy travel together in one
//! request, and a task several `get`s wait for is asked for once. The head pushes each final
//! status when it comes, and every `get` of that task receives it. Each `get` keeps its own
//! timeout. So:
//!
//! - a request the head refuses as a whole (a task the caller may not see): a lone task's `get`
//!   fails with the refusal; the `get`s of a request of several are told to wait on their own,
//!   so that each learns its own answer;
//! - when the stream cannot serve (it broke, the replica does not lead or is shutting down),
//!   every `get` it held is told to wait on its own: with `Wait` calls, which follow the leader
//!   and retry ([`Client::call`]). The next `get` opens a new stream; a replica that would not
//!   open one is asked again after [`REOPEN_AFTER`](crate::heads::REOPEN_AFTER) (never, if it does not serve the call:
//!   UNIMPLEMENTED). Waiting is a read, so nothing needs a key to be asked twice;
//! - a client with stale reads on, or whose `get` timed out, waits with `Wait` calls (a last
//!   `Wait` tells a task that finished meanwhile from one that did not).
//!
//! The background task holds a client without a waiter of its own, so it ends when the last
//! client that uses it is dropped, and with it the stream.

use std::collections::HashMap;

use escher_proto::types::{TaskId, TaskStatus};
use escher_proto::wire::{WaitStreamReply, WaitStreamRequest};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::heads::{Answer, StreamRefusal, answer};
use crate::{Client, ClientError};

/// The most new ids one request carries.
pub(crate) const MAX_IDS: usize = 10_000;
/// How many tasks may be waited for before the waits whose callers gave up are forgotten.
const PRUNE_FROM: usize = 4_096;

/// A `get` for one task, and where its outcome goes.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) id: TaskId,
    pub(crate) reply: oneshot::Sender<Pushed>,
}

/// What the background tells a `get`.
#[derive(Debug)]
pub(crate) enum Pushed {
    /// The task's final status.
    Finished(TaskStatus),
    /// The head refused to wait for it (and only it).
    Refused(ClientError),
    /// The stream cannot serve it: wait with `Wait` calls.
    Elsewhere,
}

/// The open stream.
struct Stream {
    requests: mpsc::UnboundedSender<WaitStreamRequest>,
    replies: Streaming<WaitStreamReply>,
}

/// The `get`s waiting, by task.
type Waiting = HashMap<TaskId, Vec<oneshot::Sender<Pushed>>>;

/// Starts the background waiter for `client` (which must not have one itself).
pub(crate) fn start(client: Client) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, rx));
    tx
}

async fn run(client: Client, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut stream: Option<Stream> = None;
    let mut waiting = Waiting::new();
    let mut refused = StreamRefusal::default();
    let mut prune_at = PRUNE_FROM;
    loop {
        tokio::select! {
            biased;
            reply = next_reply(&mut stream), if stream.is_some() => {
                let serving = reply.is_some_and(|reply| pushed(&client, reply, &mut waiting));
                if !serving {
                    stream = None;
                    for (_, gets) in waiting.drain() {
                        tell(gets, || Pushed::Elsewhere);
                    }
                }
            }
            job = jobs.recv() => {
                let Some(job) = job else { break };
                let mut ids = Vec::new();
                add(job, &mut waiting, &mut ids);
                while ids.len() < MAX_IDS {
                    match jobs.try_recv() {
                        Ok(job) => add(job, &mut waiting, &mut ids),
                        Err(_) => break,
                    }
                }
                if waiting.len() >= prune_at {
                    waiting.retain(|_, gets| {
                        gets.retain(|g| !g.is_closed());
                        !gets.is_empty()
                    });
                    prune_at = (waiting.len() * 2).max(PRUNE_FROM);
                }
                if ids.is_empty() {
                    continue;
                }
                let request = WaitStreamRequest {
                    task_ids: ids.iter().map(|id| id.0).collect(),
                };
                let sent = match &stream {
                    Some(open) => open.requests.send(request).is_ok(),
                    None => match open(&client, &mut refused, request).await {
                        Some(opened) => {
                            stream = Some(opened);
                            true
                        }
                        None => false,
                    },
                };
                if !sent {
                    for id in ids {
                        tell(waiting.remove(&id).unwrap_or_default(), || Pushed::Elsewhere);
                    }
                }
            }
        }
    }
}

/// Notes `job`'s `get`; its id joins `ids` unless the task is asked for already.
fn add(job: Job, waiting: &mut Waiting, ids: &mut Vec<TaskId>) {
    let gets = waiting.entry(job.id).or_default();
    if gets.is_empty() {
        ids.push(job.id);
    }
    gets.push(job.reply);
}

/// Hands each of `gets` the outcome `what` makes.
fn tell(gets: Vec<oneshot::Sender<Pushed>>, what: impl Fn() -> Pushed) {
    for get in gets {
        let _ = get.send(what());
    }
}

/// Opens a stream that starts with `first`, unless the replica to call refused one lately.
async fn open(
    client: &Client,
    refused: &mut StreamRefusal,
    first: WaitStreamRequest,
) -> Option<Stream> {
    let (mut rpc, url) = client.rpc();
    if !refused.may_ask(&url) {
        return None;
    }
    let (requests, rx) = mpsc::unbounded_channel();
    let _ = requests.send(first);
    let opening = rpc.wait_stream(UnboundedReceiverStream::new(rx));
    let opened = match tokio::time::timeout(crate::heads::STREAM_OPEN_TIMEOUT, opening).await {
        Ok(opened) => opened,
        Err(_) => {
            // Frozen, or its connection is: the unary path goes to the next replica.
            client.rotate();
            Err(tonic::Status::unavailable(format!(
                "the replica did not open a result stream within {:?}",
                crate::heads::STREAM_OPEN_TIMEOUT
            )))
        }
    };
    match opened {
        Ok(replies) => {
            refused.opened();
            Some(Stream {
                requests,
                replies: replies.into_inner(),
            })
        }
        Err(status) => {
            tracing::debug!(%url, %status, "no result stream: Wait calls");
            refused.refused(url, &status);
            None
        }
    }
}

/// The next reply on the stream; `None` when it broke or ended.
async fn next_reply(stream: &mut Option<Stream>) -> Option<WaitStreamReply> {
    let open = stream.as_mut()?;
    match open.replies.message().await {
        Ok(reply) => reply,
        Err(status) => {
            tracing::debug!(%status, "the result stream broke");
            None
        }
    }
}

/// Hands out what a reply pushed; false if the stream can no longer serve (the replica does
/// not lead, is shutting down, or failed otherwise).
fn pushed(client: &Client, reply: WaitStreamReply, waiting: &mut Waiting) -> bool {
    for status in reply.finished {
        let id = TaskId(status.id);
        let Some(gets) = waiting.remove(&id) else {
            continue;
        };
        match TaskStatus::try_from(status) {
            Ok(status) => tell(gets, || Pushed::Finished(status.clone())),
            Err(err) => {
                let err = ClientError::from(err);
                tell(gets, || Pushed::Refused(err.again()));
            }
        }
    }
    let Some(error) = reply.error else {
        return true;
    };
    let status = tonic::Status::from(error);
    let leads = answer(&status) == Answer::Other;
    let err = client.error_from(status);
    if !leads || !err.is_refusal() {
        return false;
    }
    let alone = reply.failed.len() == 1;
    for id in reply.failed {
        let gets = waiting.remove(&TaskId(id)).unwrap_or_default();
        if alone {
            tell(gets, || Pushed::Refused(err.again()));
        } else {
            tell(gets, || Pushed::Elsewhere);
        }
    }
    true
}

impl Client {
    /// Task `id`'s final status as the result stream pushes it: `None` when the stream could
    /// not serve it or `deadline` passed first (the caller then asks with a `Wait` call).
    pub(crate) async fn pushed_end(
        &self,
        id: TaskId,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<TaskStatus>, ClientError> {
        if self.stale_reads() {
            return Ok(None);
        }
        let (reply, answer) = oneshot::channel();
        if self.waiter().send(Job { id, reply }).is_err() {
            // The waiter is gone (its runtime stopped).
            return Ok(None);
        }
        let pushed = match deadline {
            None => answer.await,
            Some(d) => match tokio::time::timeout_at(d, answer).await {
                Ok(pushed) => pushed,
                Err(_) => return Ok(None),
            },
        };
        match pushed {
            Ok(Pushed::Finished(status)) => Ok(Some(status)),
            Ok(Pushed::Refused(err)) => Err(err),
            Ok(Pushed::Elsewhere) | Err(_) => Ok(None),
        }
    }
}
