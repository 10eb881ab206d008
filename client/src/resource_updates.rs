//! Resource updates: concurrent `set_resource`, `adjust_resource` and `delete_resource` calls
//! on one client travel together in shared `SetResources` calls.
//!
//! One background task per client (per namespace and caller, like the submitter; started on
//! first use) sends the first update queued at once, and while [`MAX_IN_FLIGHT`] calls are out,
//! gathers every update queued meanwhile into the next call, up to [`MAX_BATCH`] updates under
//! one idempotency key. An application that creates many resources from many futures (the
//! thesis' Fig. 4.9a, W4) so pays about one call per batch instead of one per resource, and a
//! lone update costs what it did. The head applies a call's updates in order, all or none
//! (docs/DESIGN.md §3), so:
//!
//! - a call the head applied answers each caller with its own update's nodes;
//! - a call of several updates that the head refused (nothing was applied: a bad name, an
//!   unknown node, a capacity that would go below zero, a quota that the call as a whole
//!   exceeds) is split: each update is sent again alone, in order, so a bad update fails only
//!   its own caller;
//! - any other failure leaves the outcome unknown after [`Client::call`]'s retries under the
//!   same key, and is every caller's.
//!
//! Updates of concurrent callers have no order among themselves; the updates one caller awaits
//! in turn keep theirs (each is answered before the next is queued). The background task holds
//! a client without an updater of its own, so it ends when the last client that uses it is
//! dropped.

use escher_proto::convert::Problem;
use escher_proto::types::{SetResourceOutcome, SetResourcesRequest};
use escher_proto::{ConvertError, NodeId, ResourceUpdate, wire};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::{Client, ClientError};

/// The most updates one shared call carries.
pub(crate) const MAX_BATCH: usize = 1_000;
/// How many shared calls are out at once.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// One update and who waits for the nodes it changed.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) update: ResourceUpdate,
    pub(crate) reply: oneshot::Sender<Result<Vec<NodeId>, ClientError>>,
}

/// Starts the background updater for `client` (which must not have one itself).
pub(crate) fn start(client: Client) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, rx));
    tx
}

async fn run(client: Client, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut calls = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
            job = jobs.recv(), if calls.len() < MAX_IN_FLIGHT => {
                let Some(first) = job else { break };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                calls.spawn(send(client.clone(), batch));
            }
        }
    }
    while calls.join_next().await.is_some() {}
}

/// Sends `jobs` in one call and hands each caller its outcome.
async fn send(client: Client, jobs: Vec<Job>) {
    let (updates, replies): (Vec<_>, Vec<_>) = jobs
        .into_iter()
        .map(|job| (wire::ResourceUpdate::from(job.update), job.reply))
        .unzip();
    let mut request = request(&client, updates);
    match client.send_set_resources(&mut request).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome.nodes));
            }
        }
        Err(err) if replies.len() > 1 && err.refused_as_a_whole() => {
            for (update, reply) in request.updates.into_iter().zip(replies) {
                let mut alone = self::request(&client, vec![update]);
                let outcome = client.send_set_resources(&mut alone).await;
                let _ = reply.send(outcome.map(nodes_of_one));
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.again()));
            }
        }
    }
}

/// A request for `updates` in the client's namespace (its key is set when it is sent).
fn request(client: &Client, updates: Vec<wire::ResourceUpdate>) -> wire::SetResourcesRequest {
    let mut request = wire::SetResourcesRequest::from(SetResourcesRequest {
        updates: Vec::new(),
        namespace: client.namespace().cloned(),
        caller_task: client.caller_task(),
    });
    request.updates = updates;
    request
}

/// The nodes the one update of a call changed.
pub(crate) fn nodes_of_one(mut outcomes: Vec<SetResourceOutcome>) -> Vec<NodeId> {
    outcomes.pop().map(|o| o.nodes).unwrap_or_default()
}

/// The error of an update whose answer never came (the updater stopped with its runtime).
pub(crate) fn updater_gone() -> ClientError {
    ClientError::Protocol(ConvertError::new("outcomes", Problem::Empty))
}
