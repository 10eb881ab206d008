//! Light simulated workers for W8: a tokio task per node that speaks the real `WorkerLink`
//! protocol over a shared tonic channel (`Register`, then `Attach` with `Hello` first, then
//! heartbeats; batches both ways, as a real worker), and answers every `Assign` with
//! `TaskStarted` and `TaskFinished` (an empty function result). Nothing runs: this measures the
//! head, not task execution.
//!
//! A **gate** holds tasks: while it is closed a node reports `TaskStarted` and keeps the task
//! running; opening it finishes the held tasks and every later one at once. With 1-CPU nodes
//! and the gate closed, a head holds one running task per node and queues the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::types::{Labels, ResourceSet, TaskId, TaskResult};
use escher_proto::batch::Batches;
use escher_proto::convert::LinkDecoder;
use escher_proto::types::{
    HeadMessage, RegisterReply, RegisterRequest, TaskFinished, WorkerMessage,
};
use escher_proto::wire::{self, worker_link_client::WorkerLinkClient};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// Counters shared by every simulated node.
#[derive(Debug, Default)]
pub struct Counters {
    /// Nodes registered and attached.
    pub attached: AtomicU64,
    /// Assignments received.
    pub assigned: AtomicU64,
    /// Tasks reported finished.
    pub finished: AtomicU64,
    /// Encoded bytes of the batches received from the head (protobuf, before HTTP/2 framing).
    pub head_bytes: AtomicU64,
    /// Encoded bytes of the batches sent to the head.
    pub node_bytes: AtomicU64,
}

/// A set of simulated nodes.
#[derive(Debug)]
pub struct SimCluster {
    counters: Arc<Counters>,
    gate: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    nodes: JoinSet<anyhow::Result<()>>,
}

impl SimCluster {
    /// Starts `n` nodes with `resources` against the head at `url`, `per_channel` nodes
    /// sharing each HTTP/2 connection, and waits until all are attached (at most `limit`).
    pub async fn start(
        url: &str,
        n: usize,
        resources: ResourceSet,
        per_channel: usize,
        limit: Duration,
    ) -> anyhow::Result<SimCluster> {
        let counters = Arc::new(Counters::default());
        let (gate, gate_rx) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let mut nodes = JoinSet::new();
        let mut channel = None;
        for i in 0..n {
            if i % per_channel.max(1) == 0 {
                channel = Some(connect(url).await?);
            }
            let token = escher::worker::join_token(url).unwrap_or_default();
            let client = WorkerLinkClient::with_interceptor(
                channel.clone().context("no channel")?,
                escher_proto::access::Bearer::new(&token),
            )
            .max_decoding_message_size(64 * 1024 * 1024);
            let node = SimNode {
                name: format!("sim-{i}"),
                resources: resources.clone(),
                counters: Arc::clone(&counters),
                gate: gate_rx.clone(),
                stop: stop_rx.clone(),
            };
            nodes.spawn(node.run(client));
        }
        let sim = SimCluster {
            counters,
            gate,
            stop,
            nodes,
        };
        let start = Instant::now();
        while sim.counters.attached.load(Ordering::Relaxed) < n as u64 {
            if start.elapsed() > limit {
                bail!(
                    "only {} of {n} simulated nodes attached within {limit:?}",
                    sim.counters.attached.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(sim)
    }

    /// The shared counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Opens the gate: held tasks finish now, later ones at once.
    pub fn open_gate(&self) {
        let _ = self.gate.send(true);
    }

    /// Stops every node and waits for them; returns the first error a node met.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let mut first = Ok(());
        while let Some(done) = self.nodes.join_next().await {
            if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

async fn connect(url: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(url.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// One simulated node.
struct SimNode {
    name: String,
    resources: ResourceSet,
    counters: Arc<Counters>,
    gate: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
}

impl SimNode {
    async fn run(
        mut self,
        mut client: WorkerLinkClient<escher::worker::Authed>,
    ) -> anyhow::Result<()> {
        let request = RegisterRequest {
            gpus: Vec::new(),
            name: self.name.clone(),
            address: "simulated".into(),
            resources: self.resources.clone(),
            labels: Labels::new(),
            running: Vec::new(),
            finished: Vec::new(),
            identity: None,
            boot_id: 1,
        };
        let reply = client
            .register(wire::RegisterRequest::from(request))
            .await?
            .into_inner();
        let reply = RegisterReply::try_from(reply)?;
        let (tx, rx) = mpsc::unbounded_channel::<wire::WorkerMessage>();
        let send = |msg: WorkerMessage| tx.send(msg.into()).is_ok();
        send(WorkerMessage::Hello {
            node_id: reply.node_id,
            secret: reply.secret.clone().unwrap_or_default(),
            interned_names: true,
        });
        let counters = Arc::clone(&self.counters);
        let outbound = Batches::new(UnboundedReceiverStream::new(rx)).map(move |messages| {
            let batch = wire::WorkerBatch { messages };
            let len = prost::Message::encoded_len(&batch) as u64;
            counters.node_bytes.fetch_add(len, Ordering::Relaxed);
            batch
        });
        let mut inbound = client.attach(outbound).await?.into_inner();
        self.counters.attached.fetch_add(1, Ordering::Relaxed);
        let mut heartbeat = tokio::time::interval(reply.heartbeat_interval);
        let mut held: Vec<(TaskId, u32)> = Vec::new();
        let mut names = LinkDecoder::new();
        let mut open = *self.gate.borrow();
        let mut gate_alive = true;
        loop {
            tokio::select! {
                _ = self.stop.changed() => break,
                changed = self.gate.changed(), if gate_alive => {
                    if changed.is_err() {
                        gate_alive = false;
                        continue;
                    }
                    open = *self.gate.borrow_and_update();
                    if open {
                        for (task, attempt) in held.drain(..) {
                            send(finished(task, attempt));
                            self.counters.finished.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                batch = inbound.message() => {
                    let Some(batch) = batch? else { break };
                    let len = prost::Message::encoded_len(&batch) as u64;
                    self.counters.head_bytes.fetch_add(len, Ordering::Relaxed);
                    for msg in batch.messages {
                    match names.decode(msg)? {
                        HeadMessage::Assign(a) => {
                            self.counters.assigned.fetch_add(1, Ordering::Relaxed);
                            send(WorkerMessage::TaskStarted { task_id: a.task_id, attempt: a.attempt });
                            if open {
                                send(finished(a.task_id, a.attempt));
                                self.counters.finished.fetch_add(1, Ordering::Relaxed);
                            } else {
                                held.push((a.task_id, a.attempt));
                            }
                        }
                        HeadMessage::Shutdown { .. } => return Ok(()),
                        HeadMessage::CancelTask { task_id, attempt, .. } => {
                            held.retain(|&(t, a)| (t, a) != (task_id, attempt));
                            send(WorkerMessage::TaskFinished(TaskFinished {
                                task_id,
                                attempt,
                                outcome: Err("cancelled".into()),
                                timed_out: false,
                                output: None,
                            }));
                        }
                        // Simulated nodes keep no reports to acknowledge.
                        HeadMessage::FetchLogs { .. }
                        | HeadMessage::ReportsAcked(_)
                        | HeadMessage::LeaseRenewed { .. } => {}
                        // Simulated nodes report no GPUs and hold no objects.
                        HeadMessage::ReconfigureMig { .. }
                        | HeadMessage::DeleteObjects(_)
                        | HeadMessage::DropCopies(_) => {}
                    }
                    }
                }
                _ = heartbeat.tick() => {
                    send(WorkerMessage::Heartbeat {
                        metrics: Vec::new(),
                        seq: 0,
                        fence: None,
                        actors: Vec::new(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn finished(task_id: TaskId, attempt: u32) -> WorkerMessage {
    WorkerMessage::TaskFinished(TaskFinished {
        task_id,
        attempt,
        outcome: Ok(TaskResult::Returned(Default::default())),
        timed_out: false,
        output: None,
    })
}
