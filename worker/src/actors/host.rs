//! [`ActorHost`]: the actors a worker hosts now, and the one loop each incarnation runs.
//!
//! An actor task's runner ([`ActorHost::run`]) makes the instance with its class's constructor,
//! then gives it a thread of its own that takes calls from a queue, one at a time, in the order
//! they were queued. The queue is filled by the `Actors` service (`service.rs`), one caller's
//! calls in the order that caller sent them. The incarnation ends when its task is cancelled
//! (`kill`), times out, or a method panics; every call queued or in flight then fails with
//! [`CallOutcome::Died`] and the reason (a method cannot be interrupted: one that runs when
//! its incarnation ends finishes, and its answer is replaced by the reason), and once the
//! instance's thread is done the runner reports the end to the head, which restarts the actor
//! if it may (a restart is its task's retry).
//!
//! The host also keeps this worker's ticket key, set whenever the worker attaches to the head
//! (`attached`): the key that checks the data tickets callers present.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use escher_proto::types::{ActorLoad, ActorSpec, ticket_key};
use escher_proto::{NodeId, TaskId, TaskResult};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::class::{ActorClass, DynamicActor, Kind};
use crate::context::TaskContext;
use crate::functions::BoxFuture;

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallOutcome {
    /// The method returned these bytes.
    Returned(Bytes),
    /// The method failed; the actor lives on.
    Error(String),
    /// The incarnation ended before the call was answered: why.
    Died(String),
    /// The caller cancelled the call before it started, or it was stopped while it ran: why.
    Cancelled(String),
    /// The method returned more than the inline threshold, and its bytes were kept in this
    /// node's store as the object the call named (the `Actors` service does this, `service.rs`).
    Kept {
        /// Its length in bytes.
        size: u64,
        /// Its CRC-32C.
        crc32c: u32,
        /// This node.
        node: u64,
    },
}

/// One queued call.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) method: String,
    pub(crate) args: Bytes,
    pub(crate) reply: oneshot::Sender<CallOutcome>,
    /// Its cancellation (the service cancels it by seq).
    pub(crate) control: Arc<CallControl>,
}

/// What a call that was cancelled before it started is answered.
pub(crate) const CANCELLED_QUEUED: &str = "the call was cancelled before it started";

/// One call's cancellation, shared by the service (which cancels it when its caller asks) and
/// the loop that starts it (which starts it only if it was not cancelled first).
#[derive(Debug, Default)]
pub(crate) struct CallControl {
    /// [`QUEUED`], [`STARTED`] or [`CANCELLED`].
    state: AtomicU8,
    /// Cancelled when the caller asked to cancel the call (queued or running).
    pub(crate) token: CancellationToken,
}

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const CANCELLED: u8 = 2;

impl CallControl {
    /// Marks the call started; false when it was cancelled first (it must not run, and is
    /// answered [`CallOutcome::Cancelled`]).
    pub(crate) fn start(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Cancels the call: true when it had not started (it never will); a started call's
    /// instance is told through the token, and may or may not stop it.
    pub(crate) fn cancel(&self) -> bool {
        let unstarted = self
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.token.cancel();
        unstarted
    }

    /// Whether the call was cancelled before it started.
    pub(crate) fn cancelled_unstarted(&self) -> bool {
        self.state.load(Ordering::Acquire) == CANCELLED
    }
}

/// One live incarnation, as the service reaches it.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    /// Its task's attempt.
    pub(crate) incarnation: u32,
    /// Its task's namespace.
    pub(crate) namespace: Option<String>,
    /// Its queue of calls.
    pub(crate) calls: mpsc::UnboundedSender<Call>,
    /// Cancelled when the incarnation has ended.
    pub(crate) ended: CancellationToken,
    /// Why it ended, once it has.
    pub(crate) why: Arc<Mutex<Option<String>>>,
    /// Calls received and not answered yet (the service counts them: [`Pending`]).
    pub(crate) pending: Arc<AtomicU64>,
    /// The worker's lease: no call starts once it has run out.
    pub(crate) lease: Arc<Lease>,
    /// How many times the lease had run out when this incarnation started: once it has run
    /// out again, renewed or not, the incarnation serves no call ([`Lease::lapses`]).
    pub(crate) lapses: u64,
}

/// When the worker's lease with the leading head runs out (the runtime sets it at each
/// renewal). The runtime ends every incarnation when it does (`Runtime::lease_ran_out`); this
/// is the check each call passes before it starts, so that no call starts in between: a worker
/// that resumes after a SIGSTOP may read calls before its runtime's timer fires.
///
/// A renewal may also come first: the runtime may hear the head (a re-registration after the
/// head counted the node lost, a renewal of a heartbeat sent after the resume) before the
/// service reads the queued call, and the fence it then runs reaches only the incarnations
/// its own bookkeeping still lists. So the lease also counts how many times it ran out before
/// it was renewed, and an incarnation started before the last such lapse serves nothing
/// (found by `tests/e2e_actor_faults.rs` in CI: a call queued while the worker was stopped was
/// answered by incarnation 1 after incarnation 2 had started elsewhere).
#[derive(Debug)]
pub(crate) struct Lease {
    epoch: std::time::Instant,
    /// Milliseconds since `epoch` when the lease runs out; 0 until the first registration.
    until_ms: AtomicU64,
    /// Renewals that came after the lease had run out.
    lapses: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            epoch: std::time::Instant::now(),
            until_ms: AtomicU64::new(0),
            lapses: AtomicU64::new(0),
        }
    }
}

impl Lease {
    /// The lease runs until `until`. A lease that had run out before this renewal counts a
    /// lapse first, so that whoever reads the new end also sees the lapse.
    pub(crate) fn set(&self, until: std::time::Instant) {
        let ms = until.saturating_duration_since(self.epoch).as_millis();
        if self.overdue().is_some() {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        self.until_ms.store(
            u64::try_from(ms).unwrap_or(u64::MAX).max(1),
            Ordering::SeqCst,
        );
    }

    /// How many times the lease ran out before it was renewed.
    pub(crate) fn lapses(&self) -> u64 {
        self.lapses.load(Ordering::SeqCst)
    }

    /// How long ago the lease ran out, if it has.
    pub(crate) fn overdue(&self) -> Option<std::time::Duration> {
        let until = self.until_ms.load(Ordering::SeqCst);
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        (until > 0 && now > until).then(|| std::time::Duration::from_millis(now - until))
    }

    /// Why no call may start now, if the lease has run out.
    pub(crate) fn lapsed(&self) -> Option<String> {
        self.overdue().map(|ago| {
            format!(
                "fenced: this worker's lease ran out {:.1}s ago (it was stopped or cut off from \
                 the leading head, which restarts the actor elsewhere if it may)",
                ago.as_secs_f64()
            )
        })
    }
}

/// One call received and not answered yet: counted in its incarnation's `pending` while this
/// lives.
#[derive(Debug)]
pub(crate) struct Pending(Arc<AtomicU64>);

impl Pending {
    pub(crate) fn new(live: &Live) -> Pending {
        live.pending.fetch_add(1, Ordering::Relaxed);
        Pending(Arc::clone(&live.pending))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Live {
    /// Why it ended ("ended" until the reason is known).
    pub(crate) fn why(&self) -> String {
        lock(&self.why)
            .clone()
            .unwrap_or_else(|| "the actor ended".to_string())
    }

    fn end(&self, why: String) {
        lock(&self.why).get_or_insert(why);
        self.ended.cancel();
    }

    /// Ends the incarnation because the worker's lease has run out, if it has: a call reached
    /// it (or finished in it) before the runtime's own fence did (`Runtime::fence`), which
    /// then finds it ended already. Said in the worker's log either way.
    fn fence_if_lapsed(&self) -> bool {
        let why = match self.lease.lapsed() {
            Some(why) => why,
            None if self.lease.lapses() != self.lapses => "fenced: this worker's lease ran out \
                 while this incarnation lived (the worker was stopped or cut off from the \
                 leading head, which restarts the actor elsewhere if it may); renewed since, \
                 it serves no call"
                .to_string(),
            None => return false,
        };
        if !self.ended.is_cancelled() {
            tracing::warn!(
                incarnation = self.incarnation,
                %why,
                "ending an actor this worker hosts: the worker's lease ran out"
            );
        }
        self.end(why);
        true
    }
}

/// The classes a worker can host, the incarnations it hosts now, and its ticket key.
#[derive(Debug, Default)]
pub struct ActorHost {
    classes: BTreeMap<String, ActorClass>,
    live: Mutex<HashMap<TaskId, Live>>,
    key: RwLock<Option<(NodeId, [u8; 32])>>,
    lease: Arc<Lease>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ActorHost {
    /// A host of `classes`.
    pub(crate) fn new(classes: BTreeMap<String, ActorClass>) -> ActorHost {
        ActorHost {
            classes,
            ..ActorHost::default()
        }
    }

    /// The worker attached as node `node` with `secret`: tickets are checked with the key
    /// derived from them from now on.
    pub(crate) fn attached(&self, node: NodeId, secret: &str) {
        let hash: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        *self.key.write().unwrap_or_else(|e| e.into_inner()) = Some((node, ticket_key(&hash)));
    }

    /// This node's id and ticket key, once attached.
    pub(crate) fn key(&self) -> Option<(NodeId, [u8; 32])> {
        *self.key.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The live incarnation of `actor`, if this worker hosts one.
    pub(crate) fn live(&self, actor: TaskId) -> Option<Live> {
        lock(&self.live).get(&actor).cloned()
    }

    /// How long ago the worker's lease ran out, if it has (a function task stopped then was
    /// fenced, not cancelled: `runner.rs` says so in its error).
    pub(crate) fn lease_overdue(&self) -> Option<std::time::Duration> {
        self.lease.overdue()
    }

    /// The worker's lease runs until `until` (renewed by the leading head).
    pub(crate) fn lease_until(&self, until: std::time::Instant) {
        self.lease.set(until);
    }

    /// Ends every incarnation this worker hosts, with `why` (the worker's lease ran out: see
    /// the runtime's `lease_ran_out`). Each stops taking calls at once; the calls queued or
    /// in flight fail with `why`; its runner reports the end once nothing of it runs.
    pub(crate) fn fence(&self, why: &str) {
        for live in lock(&self.live).values() {
            live.end(why.to_string());
        }
    }

    /// The incarnations this worker hosts and how many calls wait at each (its heartbeats
    /// carry them to the leader: `escher actors` shows them).
    pub(crate) fn loads(&self) -> Vec<ActorLoad> {
        let mut loads: Vec<ActorLoad> = lock(&self.live)
            .iter()
            .map(|(actor, live)| ActorLoad {
                actor: *actor,
                incarnation: live.incarnation,
                pending: live.pending.load(Ordering::Relaxed),
            })
            .collect();
        loads.sort_by_key(|l| l.actor);
        loads
    }

    /// Whether a class is registered (the worker offers actors of that class).
    pub fn has_class(&self, class: &str) -> bool {
        self.classes.contains_key(class)
    }

    /// Runs one incarnation of an actor to its end: construction, then calls until it is
    /// cancelled, times out or a method panics. `ready` is called once the constructor returned
    /// and the incarnation takes calls (never for one whose constructor failed). The result a
    /// runner reports.
    pub(crate) async fn run(
        &self,
        ctx: TaskContext,
        spec: &ActorSpec,
        worker: &str,
        timeout: Option<Duration>,
        cancel: CancellationToken,
        ready: impl FnOnce(),
    ) -> (Result<TaskResult, String>, bool) {
        let Some(class) = self.classes.get(&spec.class).cloned() else {
            let known: Vec<&str> = self.classes.keys().map(String::as_str).collect();
            return (
                Err(format!(
                    "no actor class {:?} is registered on worker {worker}; registered: {}",
                    spec.class,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )),
                false,
            );
        };
        let (actor, incarnation) = (ctx.task_id(), ctx.attempt());
        let namespace = ctx.namespace().map(|ns| ns.as_str().to_owned());
        let (tx, rx) = mpsc::unbounded_channel();
        let live = Live {
            incarnation,
            namespace,
            calls: tx,
            ended: CancellationToken::new(),
            why: Arc::default(),
            pending: Arc::default(),
            lease: Arc::clone(&self.lease),
            lapses: self.lease.lapses(),
        };
        let args = spec.args.to_vec();
        // Made, and its calls served until `live` ends: `done` resolves once nothing of the
        // instance runs any more.
        let done: BoxFuture<()> = match &class.kind {
            Kind::Typed { construct, .. } => {
                if spec.max_concurrency != 1 {
                    return (
                        Err(format!(
                            "actor class {:?} is a Rust type whose methods take &mut self: it \
                             runs one call at a time, so max_concurrency must be 1, not {}",
                            spec.class, spec.max_concurrency
                        )),
                        false,
                    );
                }
                let made = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return (Err("killed while its constructor ran".into()), false),
                    made = construct(ctx, args) => made,
                };
                let instance = match made {
                    Ok(instance) => instance,
                    Err(why) => return (constructor_failed(&spec.class, &why), false),
                };
                match serve_on_thread(actor, class.clone(), instance, rx, live.clone()) {
                    Ok(done) => done,
                    Err(e) => return (Err(format!("cannot start the actor's thread: {e}")), false),
                }
            }
            Kind::Dynamic(construct) => {
                let made = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return (Err("killed while its constructor ran".into()), false),
                    made = construct(ctx, args, spec.max_concurrency) => made,
                };
                let instance = match made {
                    Ok(instance) => instance,
                    Err(why) => return (constructor_failed(&spec.class, &why), false),
                };
                serve_dynamic(instance, spec.max_concurrency, rx, live.clone())
            }
        };
        lock(&self.live).insert(actor, live.clone());
        ready();
        let (outcome, timed_out) = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                // Killed, unless it was fenced first (the fence ends it, then cancels it).
                live.end("the actor was killed".to_string());
                (Err(live.why()), false)
            }
            () = live.ended.cancelled() => (Err(live.why()), false),
            () = sleep_or_forever(timeout) => {
                let why = format!("the actor's task timed out after {:?}", timeout.unwrap_or_default());
                live.end(why.clone());
                (Err(why), true)
            }
        };
        {
            let mut hosted = lock(&self.live);
            if hosted
                .get(&actor)
                .is_some_and(|l| l.incarnation == incarnation)
            {
                hosted.remove(&actor);
            }
        }
        // The end is reported only once nothing of the instance runs (a Rust method that runs is
        // not interrupted; the actor holds its resources until it returns; a dynamic instance
        // is stopped first), so that the next incarnation never runs beside this one.
        done.await;
        (outcome, timed_out)
    }
}

fn constructor_failed(class: &str, why: &str) -> Result<TaskResult, String> {
    Err(format!(
        "the constructor of actor class {class:?} failed: {why}"
    ))
}

/// Serves a Rust instance's calls on a thread of its own; the future resolves when the thread
/// is done.
fn serve_on_thread(
    actor: TaskId,
    class: ActorClass,
    instance: super::class::Instance,
    rx: mpsc::UnboundedReceiver<Call>,
    live: Live,
) -> std::io::Result<BoxFuture<()>> {
    let runtime = tokio::runtime::Handle::current();
    let (exited_tx, exited) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("actor-{actor}"))
        .spawn(move || {
            serve(runtime, class, instance, rx, live);
            let _ = exited_tx.send(());
        })?;
    Ok(Box::pin(async move {
        let _ = exited.await;
    }))
}

/// Serves a dynamic instance: calls are started in their queue's order with at most
/// `max_concurrency` unanswered; when the incarnation ends (or the instance ends by itself)
/// the instance is stopped and every call left is answered with why. The future resolves once
/// the instance has stopped.
fn serve_dynamic(
    instance: Arc<dyn DynamicActor>,
    max_concurrency: u32,
    mut calls: mpsc::UnboundedReceiver<Call>,
    live: Live,
) -> BoxFuture<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_concurrency.max(1) as usize));
    let watcher = {
        let (instance, live) = (Arc::clone(&instance), live.clone());
        tokio::spawn(async move {
            tokio::select! {
                why = instance.ended() => live.end(why),
                () = live.ended.cancelled() => {}
            }
        })
    };
    let dispatch = tokio::spawn(async move {
        loop {
            let call = tokio::select! {
                biased;
                () = live.ended.cancelled() => break,
                call = calls.recv() => match call { Some(call) => call, None => break },
            };
            let slot = tokio::select! {
                biased;
                () = live.ended.cancelled() => {
                    let _ = call.reply.send(CallOutcome::Died(live.why()));
                    break;
                }
                slot = Arc::clone(&slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
            };
            if live.fence_if_lapsed() {
                let _ = call.reply.send(CallOutcome::Died(live.why()));
                break;
            }
            if !call.control.start() {
                // Cancelled while it waited: it never runs, and its slot is free again.
                let _ = call
                    .reply
                    .send(CallOutcome::Cancelled(CANCELLED_QUEUED.into()));
                continue;
            }
            let token = call.control.token.clone();
            let answer = instance.call_cancellable(call.method, call.args, token.clone());
            let live = live.clone();
            tokio::spawn(async move {
                let outcome = match answer.await {
                    _ if live.ended.is_cancelled() => CallOutcome::Died(live.why()),
                    // It ended after the lease ran out (the worker was stopped while it ran):
                    // not the answer of a live actor, whose next incarnation may serve now.
                    _ if live.fence_if_lapsed() => CallOutcome::Died(live.why()),
                    Ok(bytes) => CallOutcome::Returned(bytes.into()),
                    // Failed after its caller cancelled it: the instance stopped it.
                    Err(why) if token.is_cancelled() => CallOutcome::Cancelled(format!(
                        "the call was cancelled while it ran: {why}"
                    )),
                    Err(why) => CallOutcome::Error(why),
                };
                drop(slot);
                let _ = call.reply.send(outcome);
            });
        }
        live.ended.cancelled().await;
        instance.stop().await;
        let why = live.why();
        calls.close();
        while let Ok(call) = calls.try_recv() {
            let _ = call.reply.send(CallOutcome::Died(why.clone()));
        }
        watcher.abort();
    });
    Box::pin(async move {
        let _ = dispatch.await;
    })
}

async fn sleep_or_forever(limit: Option<Duration>) {
    match limit {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The instance's thread: one call at a time until the incarnation ends; then every call left
/// in the queue is answered with why it ended.
fn serve(
    runtime: tokio::runtime::Handle,
    class: ActorClass,
    mut instance: super::class::Instance,
    mut calls: mpsc::UnboundedReceiver<Call>,
    live: Live,
) {
    loop {
        let next = runtime.block_on(async {
            tokio::select! {
                biased;
                () = live.ended.cancelled() => None,
                call = calls.recv() => call,
            }
        });
        let Some(call) = next else { break };
        if live.fence_if_lapsed() {
            let _ = call.reply.send(CallOutcome::Died(live.why()));
            break;
        }
        if !call.control.start() {
            // Cancelled while it was queued: removed, and the next call starts.
            let _ = call
                .reply
                .send(CallOutcome::Cancelled(CANCELLED_QUEUED.into()));
            continue;
        }
        let Some(method) = class.method_named(&call.method) else {
            let _ = call
                .reply
                .send(CallOutcome::Error(class.unknown_method(&call.method)));
            continue;
        };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            method(&mut instance, &call.args)
        }));
        if live.ended.is_cancelled() && ran.is_ok() {
            // The incarnation ended while the method ran (a method cannot be interrupted): its
            // answer is not the answer of a live actor.
            let _ = call.reply.send(CallOutcome::Died(live.why()));
            break;
        }
        if ran.is_ok() && live.fence_if_lapsed() {
            // The lease ran out while the method ran (the worker was stopped in it) and the
            // fence has not ended the incarnation yet: its answer is not a live actor's
            // either, and the head may have started the next incarnation.
            let _ = call.reply.send(CallOutcome::Died(live.why()));
            break;
        }
        match ran {
            Ok(Ok(bytes)) => {
                let _ = call.reply.send(CallOutcome::Returned(bytes.into()));
            }
            Ok(Err(why)) => {
                let _ = call.reply.send(CallOutcome::Error(why));
            }
            Err(payload) => {
                let why = format!(
                    "method {}.{} panicked: {}",
                    class.name(),
                    call.method,
                    panic_text(payload.as_ref())
                );
                live.end(why.clone());
                let _ = call.reply.send(CallOutcome::Died(why));
                break;
            }
        }
    }
    let why = live.why();
    calls.close();
    while let Ok(call) = calls.try_recv() {
        let _ = call.reply.send(CallOutcome::Died(why.clone()));
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::Lease;
    use std::time::{Duration, Instant};

    #[test]
    fn a_renewal_after_the_lease_ran_out_counts_a_lapse_that_the_new_end_does_not_hide() {
        let lease = Lease {
            epoch: Instant::now() - Duration::from_secs(10),
            ..Lease::default()
        };
        lease.set(Instant::now() + Duration::from_secs(60));
        lease.set(Instant::now() + Duration::from_secs(60));
        assert_eq!(lease.lapses(), 0, "renewed in time: no lapse");
        lease.set(Instant::now() - Duration::from_secs(1));
        assert!(lease.overdue().is_some());
        // The worker resumes and hears a renewal before anything checked the lease.
        lease.set(Instant::now() + Duration::from_secs(60));
        assert_eq!(lease.overdue(), None);
        assert_eq!(lease.lapses(), 1, "the lapse is remembered");
    }
}
