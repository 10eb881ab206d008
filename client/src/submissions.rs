//! Submissions: a client's `submit` and `submit_batch` calls travel over one long-lived
//! `SubmitStream` to the head, several requests in flight at once.
//!
//! One background task per client (per namespace and caller; started on first use) owns the
//! stream. Concurrent [`Client::submit`] calls are coalesced: a request carries every `submit`
//! queued when it leaves, up to [`MAX_BATCH`] tasks and [`MAX_BATCH_BYTES`], under one
//! idempotency key; a [`Client::submit_batch`] is a request of its own. Up to
//! [`MAX_IN_FLIGHT`] requests wait for their answers at once, and the head answers them in
//! order, each as a unary `Submit` call would have been (all or none). A message on the open
//! stream costs less than a call (no headers, no new HTTP/2 stream): a lone submit-then-get
//! was 9–23% faster than over unary calls (W2, BENCHMARKS.md). So:
//!
//! - a coalesced request the head refuses (nothing was applied: a bad task, or a quota the
//!   request as a whole exceeds) is split: each task is sent again alone, and a bad task fails
//!   only its own caller, never its neighbours;
//! - a request whose outcome is unknown (the stream broke, the replica does not lead, the
//!   head is shutting down) is sent again as a unary `Submit` under the same key, through
//!   [`Client::call`], which follows the leader and retries; a head that already applied it
//!   answers with the recorded reply, so no task is submitted twice. If that fails too, every
//!   caller of the request learns why. Each request holds its key's ticket until answered, so
//!   the head keeps its reply for such a retry; the next request opens a new stream;
//! - a replica that will not open a stream is sent unary calls, and asked again after
//!   [`REOPEN_AFTER`](crate::heads::REOPEN_AFTER) (never, if it does not serve the call: UNIMPLEMENTED).
//!
//! The background task holds a client without a submitter of its own, so it ends when the
//! last client that uses it is dropped.

use std::collections::VecDeque;

use escher_proto::types::Ticket;
use escher_proto::types::{SubmitReply, SubmitRequest};
use escher_proto::wire::{self, SubmitStreamReply};
use escher_proto::{ConvertError, Namespace, TaskId, TaskSpec, convert::Problem};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::heads::{Answer, ClusterRpc, STREAM_OPEN_TIMEOUT, StreamRefusal, answer};
use crate::{Client, ClientError};

/// The most tasks one coalesced request carries.
pub(crate) const MAX_BATCH: usize = 1_000;
/// The most bytes of tasks one coalesced request carries (a task larger than this goes alone).
pub(crate) const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// How many requests wait for their answers at once.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// What the submitter is asked to send.
#[derive(Debug)]
pub(crate) enum Job {
    /// One `submit`, coalesced with its neighbours.
    Task {
        spec: TaskSpec,
        reply: oneshot::Sender<Result<TaskId, ClientError>>,
    },
    /// A `submit_batch`: one request of its own, with its key.
    Batch {
        request: wire::SubmitRequest,
        ticket: Ticket,
        reply: oneshot::Sender<Result<Vec<TaskId>, ClientError>>,
    },
}

/// Who waits for a request's answer.
#[derive(Debug)]
enum Waiting {
    /// The callers of the coalesced `submit`s, one per task in request order.
    Tasks(Vec<oneshot::Sender<Result<TaskId, ClientError>>>),
    /// The caller of a `submit_batch`.
    Batch(oneshot::Sender<Result<Vec<TaskId>, ClientError>>),
}

/// A request and who waits for it.
#[derive(Debug)]
struct Request {
    wire: wire::SubmitRequest,
    /// Its key, held until it is answered (the head keeps the reply while any write of the
    /// client at or after it is open).
    _ticket: Ticket,
    waiting: Waiting,
}

/// The open stream: where requests go and where their answers come from.
struct Stream {
    requests: mpsc::Sender<wire::SubmitRequest>,
    replies: Streaming<SubmitStreamReply>,
}

/// Starts the background submitter for `client` (which must not have one itself).
pub(crate) fn start(client: Client) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, rx));
    tx
}

async fn run(client: Client, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut stream: Option<Stream> = None;
    // Requests on the stream, in the order their answers come.
    let mut in_flight: VecDeque<Request> = VecDeque::new();
    // Requests sent as unary calls.
    let mut unary = JoinSet::new();
    // A `submit_batch` met while coalescing `submit`s: sent next.
    let mut held: Option<Job> = None;
    let mut refused = StreamRefusal::default();
    loop {
        let reading = !in_flight.is_empty() && stream.is_some();
        let room = in_flight.len() + unary.len() < MAX_IN_FLIGHT;
        tokio::select! {
            biased;
            reply = next_reply(&mut stream), if reading => {
                let keep = match reply {
                    Some(reply) => {
                        let request = in_flight.pop_front().expect("a request per answer");
                        answered(&client, request, reply, &mut unary)
                    }
                    // The stream broke: what it carried has an unknown outcome.
                    None => false,
                };
                if !keep {
                    // Broken, or the replica does not lead (the rest of the stream is answered
                    // the same way): the next request opens a stream to the leader that the
                    // unary calls find.
                    stream = None;
                    for request in in_flight.drain(..) {
                        unary.spawn(send_unary(client.clone(), request, true));
                    }
                }
            }
            Some(_) = unary.join_next(), if !unary.is_empty() => {}
            job = next_job(&mut held, &mut jobs), if room => {
                let Some(job) = job else { break };
                let Some(request) = gather(&client, job, &mut jobs, &mut held) else {
                    continue;
                };
                if stream.is_none() {
                    let (rpc, url) = client.rpc();
                    if refused.may_ask(&url) {
                        match open(&client, rpc).await {
                            Ok(opened) => {
                                stream = Some(opened);
                                refused.opened();
                            }
                            Err(status) => {
                                // Not the leader, unreachable, refused, ...: this request goes
                                // through the unary path, which finds the leader or says why.
                                tracing::debug!(%url, %status, "no submission stream: unary calls");
                                refused.refused(url, &status);
                            }
                        }
                    }
                }
                match &stream {
                    Some(open) if open.requests.try_send(request.wire.clone()).is_ok() => {
                        in_flight.push_back(request);
                    }
                    _ => {
                        unary.spawn(send_unary(client.clone(), request, false));
                    }
                }
            }
        }
    }
}

/// The next job: the held one first.
async fn next_job(held: &mut Option<Job>, jobs: &mut mpsc::UnboundedReceiver<Job>) -> Option<Job> {
    match held.take() {
        Some(job) => Some(job),
        None => jobs.recv().await,
    }
}

/// The next answer on the stream; `None` when it broke or ended.
async fn next_reply(stream: &mut Option<Stream>) -> Option<SubmitStreamReply> {
    let open = stream.as_mut()?;
    match open.replies.message().await {
        Ok(Some(reply)) => Some(reply),
        Ok(None) => None,
        Err(status) => {
            tracing::debug!(%status, "the submission stream broke");
            None
        }
    }
}

/// Opens a stream with `rpc`; a replica that does not open it in time is left for the next.
async fn open(client: &Client, mut rpc: ClusterRpc) -> Result<Stream, tonic::Status> {
    let (requests, rx) = mpsc::channel(MAX_IN_FLIGHT);
    let opening = rpc.submit_stream(ReceiverStream::new(rx));
    let replies = match tokio::time::timeout(STREAM_OPEN_TIMEOUT, opening).await {
        Ok(opened) => opened?.into_inner(),
        Err(_) => {
            client.rotate();
            return Err(tonic::Status::unavailable(format!(
                "the replica did not open a submission stream within {STREAM_OPEN_TIMEOUT:?}"
            )));
        }
    };
    Ok(Stream { requests, replies })
}

/// The request `job` starts: a `submit_batch` as it is, a `submit` with every `submit` queued
/// behind it (a `submit_batch` met meanwhile is held for the next request). `None` when the
/// job was answered here (a task too large to send).
fn gather(
    client: &Client,
    job: Job,
    jobs: &mut mpsc::UnboundedReceiver<Job>,
    held: &mut Option<Job>,
) -> Option<Request> {
    let (spec, reply) = match job {
        Job::Batch {
            request,
            ticket,
            reply,
        } => {
            let waiting = Waiting::Batch(reply);
            return Some(Request {
                wire: request,
                _ticket: ticket,
                waiting,
            });
        }
        Job::Task { spec, reply } => (spec, reply),
    };
    let first = wire::TaskSpec::from(spec);
    let mut bytes = first.encoded_len();
    let mut tasks = vec![first];
    let mut waiting = vec![reply];
    while tasks.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
        match jobs.try_recv() {
            Ok(Job::Task { spec, reply }) => {
                let task = wire::TaskSpec::from(spec);
                bytes += task.encoded_len();
                tasks.push(task);
                waiting.push(reply);
            }
            Ok(batch) => {
                *held = Some(batch);
                break;
            }
            Err(_) => break,
        }
    }
    let (wire, ticket) = keyed(client, tasks, client.namespace().cloned());
    if let Err(err) = client.check_size("submit", &wire) {
        // Only a lone task can be this large: coalescing stops short of the limit.
        deliver_tasks(client, wire, waiting, Err(err));
        return None;
    }
    Some(Request {
        wire,
        _ticket: ticket,
        waiting: Waiting::Tasks(waiting),
    })
}

/// A request for `tasks` in `namespace`, under a new key (held by the ticket).
fn keyed(
    client: &Client,
    tasks: Vec<wire::TaskSpec>,
    namespace: Option<Namespace>,
) -> (wire::SubmitRequest, Ticket) {
    let mut request = wire::SubmitRequest::from(SubmitRequest {
        tasks: Vec::new(),
        namespace,
    });
    request.tasks = tasks;
    let ticket = client.ticket();
    request.key = Some(ticket.key().into());
    (request, ticket)
}

/// What the head answered on the stream for `request`; false if the replica does not lead.
fn answered(
    client: &Client,
    request: Request,
    reply: SubmitStreamReply,
    unary: &mut JoinSet<()>,
) -> bool {
    let outcome = match reply.error {
        None => ids(reply.task_ids, request.wire.tasks.len()),
        Some(error) => {
            let status = tonic::Status::from(error);
            let leads = answer(&status) == Answer::Other;
            // A replica that stopped leading after it proposed the request cannot tell whether
            // it commits: as open as an answer that never came.
            let sent = leads || escher_proto::replicas::may_still_commit(&status);
            let error = client.error_from(status);
            if !error.refused_as_a_whole() {
                // Not the leader, shutting down, ...: the outcome is unknown (unless the
                // replica said it does not lead and had not proposed it), and the unary path
                // follows the leader and retries under the same key.
                unary.spawn(send_unary(client.clone(), request, sent));
                return leads;
            }
            Err(error)
        }
    };
    deliver(client, request, outcome);
    true
}

/// Sends `request` as a unary `Submit` (under its key) and hands its callers the outcome;
/// `sent`: it may have been applied already (it went out on a stream that broke).
async fn send_unary(client: Client, request: Request, sent: bool) {
    let outcome = submit_unary(&client, &request.wire, sent).await;
    deliver(&client, request, outcome);
}

/// One unary `Submit` of `request`, following the leader (see [`Client::call`]); a failure
/// that leaves open whether it was applied (`sent`: it may have been, before this call) is
/// [`ClientError::UnknownOutcome`].
pub(crate) async fn submit_unary(
    client: &Client,
    request: &wire::SubmitRequest,
    sent: bool,
) -> Result<Vec<TaskId>, ClientError> {
    let key = request
        .key
        .and_then(|k| escher_proto::types::RequestKey::try_from(k).ok());
    let reply = client
        .call_write("submit", key, sent, |mut rpc| {
            let request = request.clone();
            async move { rpc.submit(request).await }
        })
        .await?;
    ids_checked(SubmitReply::from(reply).task_ids, request.tasks.len())
}

fn ids(raw: Vec<u64>, expected: usize) -> Result<Vec<TaskId>, ClientError> {
    ids_checked(raw.into_iter().map(TaskId).collect(), expected)
}

fn ids_checked(ids: Vec<TaskId>, expected: usize) -> Result<Vec<TaskId>, ClientError> {
    if ids.len() != expected {
        let why = Problem::Rule("does not hold one id per submitted task");
        return Err(ConvertError::new("task_ids", why).into());
    }
    Ok(ids)
}

/// Hands a request's callers its outcome.
fn deliver(client: &Client, request: Request, outcome: Result<Vec<TaskId>, ClientError>) {
    match request.waiting {
        Waiting::Batch(reply) => {
            let _ = reply.send(outcome);
        }
        Waiting::Tasks(waiting) => deliver_tasks(client, request.wire, waiting, outcome),
    }
}

/// Hands each coalesced `submit` its task's outcome. A refused request of several tasks is
/// split, so that each task is refused or accepted on its own; any other failure is every
/// caller's.
fn deliver_tasks(
    client: &Client,
    wire: wire::SubmitRequest,
    waiting: Vec<oneshot::Sender<Result<TaskId, ClientError>>>,
    outcome: Result<Vec<TaskId>, ClientError>,
) {
    match outcome {
        Ok(ids) => {
            for (reply, id) in waiting.into_iter().zip(ids) {
                let _ = reply.send(Ok(id));
            }
        }
        Err(err) if err.refused_as_a_whole() && waiting.len() > 1 => {
            let client = client.clone();
            // The namespace the request was sent in: the client's.
            let namespace = client.namespace().cloned();
            tokio::spawn(async move {
                for (task, reply) in wire.tasks.into_iter().zip(waiting) {
                    let (alone, _ticket) = keyed(&client, vec![task], namespace.clone());
                    let outcome = submit_unary(&client, &alone, false).await;
                    let _ = reply.send(outcome.map(|ids| ids[0]));
                }
            });
        }
        Err(err) => {
            for reply in waiting {
                let _ = reply.send(Err(err.again()));
            }
        }
    }
}
