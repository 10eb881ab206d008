//! Coalescing: concurrent [`Client::submit`] calls of one client travel together.
//!
//! An application that submits many tasks at once from many futures (Ray's `f.remote()` in a
//! loop) would otherwise pay one gRPC round trip per task. Each client (per namespace and
//! caller) lazily starts one background task that takes every `submit` queued meanwhile, up to
//! [`MAX_BATCH`] tasks, and sends them in one `Submit` call. A batch is all or none at the head,
//! so when the head refuses a coalesced call (nothing was applied), each task is sent again on
//! its own: a bad task fails only its own caller, never its neighbours. A call whose outcome is
//! unknown (the head unreachable, the reply lost, a leader change) is never split: it was
//! already retried as the same batch under the same idempotency key (`Client::call`), so if it
//! still failed, every caller of the batch gets that error, and no task is submitted twice. The
//! background task holds a client without a coalescer, so it ends when the last client that
//! uses it is dropped.

use escher_proto::{TaskId, TaskSpec};
use tokio::sync::{mpsc, oneshot};

use crate::{Client, ClientError};

/// The most tasks one coalesced `Submit` call carries.
pub(crate) const MAX_BATCH: usize = 1_000;

/// One `submit` waiting to be sent.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) spec: TaskSpec,
    pub(crate) reply: oneshot::Sender<Result<TaskId, ClientError>>,
}

/// Starts the background sender for `client` (which must not coalesce itself).
pub(crate) fn start(client: Client) -> mpsc::UnboundedSender<Pending> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, rx));
    tx
}

async fn run(client: Client, mut rx: mpsc::UnboundedReceiver<Pending>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        if batch.len() == 1 {
            let Pending { spec, reply } = batch.pop().expect("one pending submit");
            let _ = reply.send(submit_one(&client, spec).await);
            continue;
        }
        let specs: Vec<TaskSpec> = batch.iter().map(|p| p.spec.clone()).collect();
        match client.submit_batch(specs).await {
            Ok(refs) => {
                for (pending, r) in batch.into_iter().zip(refs) {
                    let _ = pending.reply.send(Ok(r.id()));
                }
            }
            Err(err) if err.is_refusal() => {
                // Someone's task was refused, so nothing was applied: let each learn its own
                // fate.
                for Pending { spec, reply } in batch {
                    let _ = reply.send(submit_one(&client, spec).await);
                }
            }
            Err(err) => {
                // The outcome is unknown: sending the tasks again one by one could run them
                // twice. Every caller learns what happened.
                for pending in batch {
                    let _ = pending.reply.send(Err(err.again()));
                }
            }
        }
    }
}

async fn submit_one(client: &Client, spec: TaskSpec) -> Result<TaskId, ClientError> {
    let mut refs = client.submit_batch([spec]).await?;
    refs.pop().map(|r| r.id()).ok_or_else(|| {
        let why = escher_proto::convert::Problem::Empty;
        ClientError::Protocol(escher_proto::ConvertError::new("task_ids", why))
    })
}
