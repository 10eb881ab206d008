//! [`ActorHandle`]: calling an actor's methods (docs/DESIGN.md §17, docs/ARCHITECTURE.md
//! "Actors and objects").
//!
//! ```no_run
//! use escher_client::{Client, Task};
//!
//! # async fn demo() -> Result<(), escher_client::ClientError> {
//! let client = Client::from_env().await?;
//! // A worker registered the class "Counter" (escher_worker::ActorClass).
//! let counter = client.actor(Task::actor_typed("Counter", &10u64).max_restarts(1)).await?;
//! let n: u64 = counter.call("add", &5u64).await?;
//! assert_eq!(n, 15);
//! # Ok(()) }
//! ```
//!
//! The head is asked once per incarnation (`ResolveActor`: where the actor runs, and a data
//! ticket); calls then go straight to the hosting worker on one stream, numbered in the order
//! they are made, and are answered by the actor. Many calls may be in flight at once
//! (pipelining); one handle's calls start in the order they were made.
//!
//! When the incarnation serving the calls ends (killed, its process or node lost, a method
//! panicked), each call in flight fails with [`ClientError::ActorDied`] and the reason, unless
//! the actor's `max_task_retries` lets it go again to the next incarnation (then it may run
//! twice: calls are not durable). A call made with a [`CallCanceller`]
//! ([`ActorHandle::call_with`], [`ActorHandle::call_raw_with`]) can be cancelled: one not yet
//! started is removed from the actor's queue (the calls after it keep their order) and fails
//! with [`ClientError::ActorCallCancelled`]; one that runs is stopped only where the actor can
//! stop it (an async Python actor's coroutine), else it runs on and its answer is the call's. A call made while the actor is being placed or restarted
//! waits for it. An actor whose lifetime is owned is killed when the last clone of the handle
//! that created it is dropped; a detached one, or one found by id or name, is not.
//!
//! A call made with [`ActorHandle::call_object`] (or [`ActorHandle::call_object_with`]) names an
//! object id of this client's object session for its result: a result above the inline
//! threshold (100 KiB, [`INLINE_RESULT_BYTES`](escher_proto::types::INLINE_RESULT_BYTES), as a
//! task's) then stays in the actor's node's store as that object, sealed before the call is
//! answered, and the call returns [`CallResult::Object`], this client's owning [`ObjectRef`]
//! (recorded by the head, `ObjectsSealed`, as a put's copy is; released when its last clone is
//! dropped). Its bytes travel only when read ([`ObjectRef::get`]: mapped from the store by a
//! reader on the actor's machine, fetched worker to client otherwise) or when a task reads it,
//! worker to worker. A smaller result comes back inline, in the call's answer, with no extra
//! round trip. The call itself stays what it was, not durable; the object's record is
//! committed like a put's.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use escher_proto::batch::Batches;
use escher_proto::types::{ActorView, Lifetime, ObjectId};
use escher_proto::wire::{self, actor_reply, actors_client::ActorsClient};
use escher_proto::{TaskId, TaskKind, TaskState, codec};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::builder::IntoTaskSpec;
use crate::{Client, ClientError, ObjectRef};

/// How long to wait between looks at an actor that is being placed, restarted or constructed:
/// from the first to the last, doubling.
const LOOK_AGAIN: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(200));

/// How long a call waits for an actor whose worker cannot be reached while the head still
/// says it runs there (a lost worker's lease lapses well within it; then the actor restarts
/// or ends), before it fails naming the worker.
const UNREACHABLE_LIMIT: Duration = Duration::from_secs(120);

/// The largest message on the data plane, as the worker takes it.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

impl Client {
    /// Creates an actor (built with [`Task::actor`](crate::Task::actor) or
    /// [`Task::actor_typed`](crate::Task::actor_typed)) and returns its handle at once; calls
    /// wait until it is placed and constructed. The creation is durable when this returns.
    pub async fn actor(&self, task: impl IntoTaskSpec) -> Result<ActorHandle, ClientError> {
        let spec = task.into_task_spec_with(self.default_resources())?;
        let owned = match &spec.kind {
            TaskKind::Actor(actor) => actor.lifetime == Lifetime::Owned,
            _ => {
                return Err(ClientError::Usage(
                    "Client::actor creates actors: build the task with Task::actor".into(),
                ));
            }
        };
        let id = self.submit(spec).await?.id();
        Ok(ActorHandle::new(self.clone(), id, owned))
    }

    /// A handle to the actor `id`; dropping it never kills the actor.
    pub fn actor_by_id(&self, id: impl Into<TaskId>) -> ActorHandle {
        ActorHandle::new(self.clone(), id.into(), false)
    }

    /// A handle to the live actor named `name` in this client's namespace; dropping it never
    /// kills the actor.
    pub async fn actor_named(&self, name: &str) -> Result<ActorHandle, ClientError> {
        let view = self
            .resolve(wire::resolve_actor_request::Actor::Name(name.to_string()))
            .await?;
        Ok(self.actor_by_id(view.id))
    }

    /// Where the actor `id` is now: its state, incarnation, node and why it waits or ended.
    pub async fn describe_actor(&self, id: impl Into<TaskId>) -> Result<ActorView, ClientError> {
        let id = id.into();
        self.resolve(wire::resolve_actor_request::Actor::Id(id.0))
            .await
    }

    /// Ends an actor, and returns once its incarnation has ended. With `no_restart` it is
    /// cancelled: it ends for good, its name and resources freed. Without, its current
    /// incarnation is stopped and the actor starts again (its constructor re-run, its state
    /// lost) as its task's next attempt; calls in flight fail or go to it as
    /// `max_task_retries` says.
    pub async fn kill_actor(
        &self,
        id: impl Into<TaskId>,
        no_restart: bool,
    ) -> Result<TaskState, ClientError> {
        let id = id.into();
        let info = self.task_info(id).await?;
        if !matches!(info.spec.kind, TaskKind::Actor(_)) {
            return Err(ClientError::InvalidArgument(format!(
                "task {id} is not an actor"
            )));
        }
        if no_restart {
            self.cancel([id]).await?;
            // A running actor ends once its worker confirms: the name and the resources are
            // free when this returns.
            return Ok(self.get(id, None).await?.state);
        }
        let before = info.status.attempt;
        let status = self.requeue(id, info.spec.resources.clone()).await?;
        if status.state.is_terminal() {
            return Ok(status.state);
        }
        // Back once the stopped incarnation has ended (the actor then waits or runs again).
        let mut pause = LOOK_AGAIN.0;
        loop {
            let view = self.describe_actor(id).await?;
            if view.state != TaskState::Running || view.incarnation > before {
                return Ok(view.state);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LOOK_AGAIN.1);
        }
    }

    async fn resolve(
        &self,
        actor: wire::resolve_actor_request::Actor,
    ) -> Result<ActorView, ClientError> {
        let request = wire::ResolveActorRequest {
            actor: Some(actor),
            namespace: self
                .namespace()
                .map(|ns| ns.as_str().to_string())
                .unwrap_or_default(),
        };
        let reply = self
            .call(|mut rpc| {
                let request = self.read(request.clone());
                async move { rpc.resolve_actor(request).await }
            })
            .await?;
        Ok(ActorView::try_from(reply)?)
    }
}

/// A handle to an actor: its method calls. Cheap to clone; clones share one stream to the
/// actor. How calls travel, and what a caller sees when an incarnation ends, is in the module
/// documentation of `client/src/actors.rs`.
#[derive(Clone)]
pub struct ActorHandle {
    owner: Arc<Owner>,
    shared: Arc<Shared>,
}

/// Dropped with the last clone of a handle: closes the handle's stream and, for the creator's
/// handle of an owned actor, kills the actor. (The stream's reader holds only [`Shared`], so
/// that an open stream does not keep the handle alive.)
struct Owner {
    shared: Arc<Shared>,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ActorHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorHandle")
            .field("id", &self.shared.id)
            .field("owned", &self.shared.owned)
            .finish_non_exhaustive()
    }
}

struct Shared {
    client: Client,
    id: TaskId,
    /// Whether dropping the last handle kills the actor (the creator's handle of an owned
    /// actor).
    owned: bool,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// The newest incarnation this handle saw die (its worker said so on the stream; 0: none):
    /// later calls go to a newer one, even while the head still names that one (its end not
    /// yet recorded).
    died: AtomicU32,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let shared = &self.shared;
        if let Ok(mut slot) = shared.conn.try_lock()
            && let Some(conn) = slot.take()
        {
            // The stream ends once what was sent is answered.
            lock(&conn.tx).take();
        }
        if !shared.owned {
            return;
        }
        let (client, id) = (shared.client.clone(), shared.id);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = client.cancel([id]).await {
                        tracing::warn!(actor = %id, error = %e, "the last handle of an owned actor was dropped, but the actor could not be killed");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(actor = %id, "the last handle of an owned actor was dropped outside a runtime: the actor is not killed; kill it with kill_actor")
            }
        }
    }
}

/// What an actor call returned ([`ActorHandle::call_object`]): its result bytes, inline, or the
/// object the actor's worker kept them as.
#[derive(Debug, Clone)]
pub enum CallResult {
    /// The result's bytes (at most the inline threshold, or the call named no object).
    Bytes(Bytes),
    /// The result, above the inline threshold, kept in the actor's node's store: this client
    /// owns it ([`ObjectRef::get`] reads it; dropping the last clone releases it).
    Object(ObjectRef),
}

impl CallResult {
    /// The result's bytes: those that came inline, or the object's, read from its holder.
    pub async fn bytes(&self) -> Result<Bytes, ClientError> {
        match self {
            CallResult::Bytes(bytes) => Ok(bytes.clone()),
            CallResult::Object(object) => object.get().await,
        }
    }
}

/// One call waiting for its answer.
struct Pending {
    method: String,
    args: Bytes,
    /// The object of this client's session its result is kept as when large; `None`: inline.
    result_object: Option<ObjectId>,
    /// How many times it was sent to an incarnation that then died.
    tries: u32,
    reply: oneshot::Sender<Result<CallResult, ClientError>>,
    /// Its canceller, if it was made with one.
    cancel: Option<CallCanceller>,
}

/// Cancels one actor call made with [`ActorHandle::call_with`] or
/// [`ActorHandle::call_raw_with`]. Cheap to clone; clones cancel the same call.
///
/// A cancel that reaches the worker before the call started removes it from the actor's queue
/// (the calls after it keep their order) and the call fails with
/// [`ClientError::ActorCallCancelled`]. A call that already runs is stopped only where the
/// actor can stop it (an async Python actor's coroutine is cancelled, and the call fails the
/// same way); otherwise it runs on and is answered as usual. Cancelling an answered call does
/// nothing.
#[derive(Clone, Debug, Default)]
pub struct CallCanceller(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
struct CancelState {
    requested: bool,
    /// Where the call was sent: its stream and its number there.
    at: Option<(Weak<Conn>, u64)>,
}

impl CallCanceller {
    /// A canceller for one call.
    pub fn new() -> CallCanceller {
        CallCanceller::default()
    }

    /// Cancels the call (see the type's documentation); returns at once, without waiting for
    /// the worker.
    pub fn cancel(&self) {
        let mut state = lock(&self.0);
        state.requested = true;
        if let Some((conn, seq)) = &state.at
            && let Some(conn) = conn.upgrade()
            && let Some(tx) = lock(&conn.tx).as_ref()
        {
            let _ = tx.send(wire::ActorCallBatch {
                open: None,
                calls: Vec::new(),
                cancel: vec![*seq],
            });
        }
    }

    /// Whether [`CallCanceller::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        lock(&self.0).requested
    }
}

/// One stream to one incarnation.
struct Conn {
    incarnation: u32,
    max_task_retries: u32,
    seq: AtomicU64,
    /// The outgoing half (each message one call or one cancel); taken when the last handle
    /// goes, which ends the stream.
    tx: Mutex<Option<mpsc::UnboundedSender<wire::ActorCallBatch>>>,
    pending: Mutex<BTreeMap<u64, Pending>>,
    /// Cancelled once the stream has ended: no call is added after.
    broken: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ActorHandle {
    fn new(client: Client, id: TaskId, owned: bool) -> ActorHandle {
        let shared = Arc::new(Shared {
            client,
            id,
            owned,
            conn: tokio::sync::Mutex::new(None),
            died: AtomicU32::new(0),
        });
        ActorHandle {
            owner: Arc::new(Owner {
                shared: Arc::clone(&shared),
            }),
            shared,
        }
    }

    /// The actor's id (its task's id: `escher info`, `escher logs` and `cancel` take it).
    pub fn id(&self) -> TaskId {
        self.owner.shared.id
    }

    /// Calls `method` with `args` encoded by [`escher_proto::codec`] and decodes its result.
    pub async fn call<A, R>(&self, method: &str, args: &A) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let args = codec::encode(args)
            .map_err(|e| ClientError::Usage(format!("the arguments of {method}: {e}")))?;
        let bytes = self.call_raw(method, args.into()).await?;
        codec::decode(&bytes).map_err(|source| ClientError::Decode {
            id: self.shared.id,
            source,
        })
    }

    /// [`ActorHandle::call`], cancellable with `cancel` (see [`CallCanceller`]).
    pub async fn call_with<A, R>(
        &self,
        method: &str,
        args: &A,
        cancel: &CallCanceller,
    ) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let args = codec::encode(args)
            .map_err(|e| ClientError::Usage(format!("the arguments of {method}: {e}")))?;
        let bytes = self.call_raw_with(method, args.into(), cancel).await?;
        codec::decode(&bytes).map_err(|source| ClientError::Decode {
            id: self.shared.id,
            source,
        })
    }

    /// Calls `method` with argument bytes; returns the result bytes.
    pub async fn call_raw(&self, method: &str, args: Bytes) -> Result<Bytes, ClientError> {
        self.call_raw_inner(method, args, None).await
    }

    /// [`ActorHandle::call_raw`], cancellable with `cancel` (see [`CallCanceller`]).
    pub async fn call_raw_with(
        &self,
        method: &str,
        args: Bytes,
        cancel: &CallCanceller,
    ) -> Result<Bytes, ClientError> {
        self.call_raw_inner(method, args, Some(cancel.clone()))
            .await
    }

    /// Calls `method` with argument bytes; a result above 100 KiB
    /// ([`INLINE_RESULT_BYTES`](escher_proto::types::INLINE_RESULT_BYTES)) stays in the
    /// actor's node's store and comes back as this client's [`ObjectRef`] (module
    /// documentation), a smaller one as its bytes. Opens this client's object session first
    /// if it has none.
    pub async fn call_object(&self, method: &str, args: Bytes) -> Result<CallResult, ClientError> {
        self.call_object_inner(method, args, None).await
    }

    /// [`ActorHandle::call_object`], cancellable with `cancel` (see [`CallCanceller`]).
    pub async fn call_object_with(
        &self,
        method: &str,
        args: Bytes,
        cancel: &CallCanceller,
    ) -> Result<CallResult, ClientError> {
        self.call_object_inner(method, args, Some(cancel.clone()))
            .await
    }

    async fn call_object_inner(
        &self,
        method: &str,
        args: Bytes,
        cancel: Option<CallCanceller>,
    ) -> Result<CallResult, ClientError> {
        let id = self.shared.client.new_session_object().await?;
        self.send_call(method, args, cancel, Some(id)).await
    }

    async fn call_raw_inner(
        &self,
        method: &str,
        args: Bytes,
        cancel: Option<CallCanceller>,
    ) -> Result<Bytes, ClientError> {
        match self.send_call(method, args, cancel, None).await? {
            CallResult::Bytes(bytes) => Ok(bytes),
            // Not asked for; read should a worker keep one anyway.
            CallResult::Object(object) => object.get().await,
        }
    }

    async fn send_call(
        &self,
        method: &str,
        args: Bytes,
        cancel: Option<CallCanceller>,
        result_object: Option<ObjectId>,
    ) -> Result<CallResult, ClientError> {
        let (reply, answer) = oneshot::channel();
        let call = Pending {
            method: method.to_string(),
            args,
            result_object,
            tries: 0,
            reply,
            cancel,
        };
        self.shared.clone().send(call).await;
        answer.await.unwrap_or_else(|_| {
            Err(ClientError::ActorDied {
                actor: self.shared.id,
                reason: "the call was dropped (the client is shutting down)".into(),
            })
        })
    }

    /// Ends the actor; see [`Client::kill_actor`]. This handle's later calls go to the next
    /// incarnation (or fail, when there is none).
    pub async fn kill(&self, no_restart: bool) -> Result<TaskState, ClientError> {
        let state = self
            .shared
            .client
            .kill_actor(self.shared.id, no_restart)
            .await?;
        // The stream to the ended incarnation may not have seen its end yet.
        if let Some(conn) = self.shared.conn.lock().await.take() {
            lock(&conn.tx).take();
        }
        Ok(state)
    }

    /// Where the actor is now; see [`Client::describe_actor`].
    pub async fn describe(&self) -> Result<ActorView, ClientError> {
        self.shared.client.describe_actor(self.shared.id).await
    }
}

impl Shared {
    /// Sends `call` on the stream to the serving incarnation (opening one when there is none),
    /// or answers it with why it cannot be.
    async fn send(self: Arc<Self>, call: Pending) {
        loop {
            let conn = match self.connect(None).await {
                Ok(conn) => conn,
                Err(e) => {
                    let _ = call.reply.send(Err(e));
                    return;
                }
            };
            let mut pending = lock(&conn.pending);
            if conn.broken.is_cancelled() {
                drop(pending);
                continue;
            }
            // A cancelled call is not sent; one sent is cancelled by its number on this stream
            // (its canceller's state is held until the call is on the stream, so that a cancel
            // never goes before its call).
            let canceller = call.cancel.clone();
            let mut cancel_state = canceller.as_ref().map(|c| lock(&c.0));
            if cancel_state.as_ref().is_some_and(|c| c.requested) {
                drop(cancel_state);
                drop(pending);
                let _ = call.reply.send(Err(ClientError::ActorCallCancelled {
                    actor: self.id,
                    reason: "the call was cancelled before it was sent".into(),
                    method: call.method,
                }));
                return;
            }
            // Numbered and sent under the lock, so that calls enter the stream in the order
            // of their numbers.
            let seq = conn.seq.fetch_add(1, Ordering::Relaxed);
            if let Some(state) = cancel_state.as_mut() {
                state.at = Some((Arc::downgrade(&conn), seq));
            }
            let message = wire::ActorCallBatch {
                open: None,
                calls: vec![wire::ActorCall {
                    seq,
                    method: call.method.clone(),
                    args: call.args.clone(),
                    result_object: call.result_object.map(Into::into),
                }],
                cancel: Vec::new(),
            };
            pending.insert(seq, call);
            match lock(&conn.tx).as_ref() {
                // A stream that is gone: its reader ends the pending calls, this one too.
                Some(tx) => {
                    let _ = tx.send(message);
                }
                None => {
                    if let Some(call) = pending.remove(&seq) {
                        let _ = call.reply.send(Err(ClientError::Usage(
                            "the actor handle was dropped".into(),
                        )));
                    }
                }
            }
            return;
        }
    }

    /// The stream to the serving incarnation, opened if there is none (or the last broke);
    /// `after` skips incarnations up to and including it (a retry waits for the next one).
    async fn connect(self: &Arc<Self>, after: Option<u32>) -> Result<Arc<Conn>, ClientError> {
        let died = self.died.load(Ordering::Relaxed);
        let after = match after {
            Some(a) => Some(a.max(died)),
            None => (died > 0).then_some(died),
        };
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref()
            && !conn.broken.is_cancelled()
            && after.is_none_or(|a| conn.incarnation > a)
        {
            return Ok(Arc::clone(conn));
        }
        let mut pause = LOOK_AGAIN.0;
        // Since when the serving incarnation's worker could not be reached.
        let mut unreachable: Option<tokio::time::Instant> = None;
        loop {
            let view = self.client.describe_actor(self.id).await?;
            let fresh = after.is_none_or(|a| view.incarnation > a);
            match (view.state, &view.address, &view.ticket) {
                (TaskState::Running, Some(address), Some(ticket)) if fresh => {
                    match open(self, &view, address, ticket).await {
                        Ok(conn) => {
                            *slot = Some(Arc::clone(&conn));
                            return Ok(conn);
                        }
                        // Not live there yet (its constructor runs) or already gone: look again.
                        Err(status) if status.code() == tonic::Code::NotFound => {}
                        // Its worker cannot be reached: lost (the head says so once its lease
                        // lapses, and restarts the actor) or cut off from this caller only.
                        // Look again, for a while.
                        Err(status)
                            if status.code() == tonic::Code::Unavailable
                                && unreachable
                                    .get_or_insert_with(tokio::time::Instant::now)
                                    .elapsed()
                                    < UNREACHABLE_LIMIT => {}
                        Err(status) => {
                            return Err(ClientError::ActorDied {
                                actor: self.id,
                                reason: format!(
                                    "its worker at {address} refused the call stream: {}",
                                    status.message()
                                ),
                            });
                        }
                    }
                }
                (state, ..) if state.is_terminal() => {
                    return Err(ClientError::ActorDied {
                        actor: self.id,
                        reason: view
                            .reason
                            .unwrap_or_else(|| format!("it {}", state.as_str())),
                    });
                }
                // Being placed, restarted, or its node has not said where it listens yet.
                _ => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LOOK_AGAIN.1);
        }
    }

    /// The calls of a stream that ended before they were answered: each goes again to the
    /// next incarnation while the actor's `max_task_retries` allows, else fails with `why`.
    async fn recover(self: Arc<Self>, conn: &Conn, calls: Vec<Pending>, why: String) {
        let mut again = Vec::new();
        for mut call in calls {
            if call
                .cancel
                .as_ref()
                .is_some_and(CallCanceller::is_cancelled)
            {
                // Cancelled: never sent again.
                let _ = call.reply.send(Err(ClientError::ActorCallCancelled {
                    actor: self.id,
                    reason: format!("the call was cancelled, and its incarnation ended: {why}"),
                    method: call.method,
                }));
                continue;
            }
            if call.tries < conn.max_task_retries {
                call.tries += 1;
                again.push(call);
            } else {
                let _ = call.reply.send(Err(ClientError::ActorDied {
                    actor: self.id,
                    reason: why.clone(),
                }));
            }
        }
        if again.is_empty() {
            return;
        }
        match self.connect(Some(conn.incarnation)).await {
            Ok(_) => {
                for call in again {
                    Arc::clone(&self).send(call).await;
                }
            }
            Err(e) => {
                let reason = match &e {
                    ClientError::ActorDied { reason, .. } => reason.clone(),
                    other => other.to_string(),
                };
                for call in again {
                    let _ = call.reply.send(Err(ClientError::ActorDied {
                        actor: self.id,
                        reason: format!("{why}; then {reason}"),
                    }));
                }
            }
        }
    }
}

/// Opens a call stream to the incarnation `view` describes, and starts reading its answers.
async fn open(
    shared: &Arc<Shared>,
    view: &ActorView,
    address: &str,
    ticket: &str,
) -> Result<Arc<Conn>, tonic::Status> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| tonic::Status::invalid_argument(format!("bad data-plane address: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot reach {address}: {e}")))?;
    let mut rpc = ActorsClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let (tx, rx) = mpsc::unbounded_channel::<wire::ActorCallBatch>();
    let opening = wire::ActorCallBatch {
        open: Some(wire::ActorCallOpen {
            actor: view.id.0,
            incarnation: view.incarnation,
            ticket: ticket.to_string(),
        }),
        calls: Vec::new(),
        cancel: Vec::new(),
    };
    // What is ready goes in one batch: its calls, then its cancels (a cancel always follows
    // its call on the channel, so it never goes before it).
    let calls = Batches::new(UnboundedReceiverStream::new(rx)).map(|messages| {
        let mut batch = wire::ActorCallBatch::default();
        for mut message in messages {
            batch.calls.append(&mut message.calls);
            batch.cancel.append(&mut message.cancel);
        }
        batch
    });
    let outbound = tokio_stream::once(opening).chain(calls);
    let inbound = rpc.calls(outbound).await?.into_inner();
    let conn = Arc::new(Conn {
        incarnation: view.incarnation,
        max_task_retries: view.max_task_retries,
        seq: AtomicU64::new(1),
        tx: Mutex::new(Some(tx)),
        pending: Mutex::new(BTreeMap::new()),
        broken: CancellationToken::new(),
    });
    tokio::spawn(read_answers(Arc::clone(shared), Arc::clone(&conn), inbound));
    Ok(conn)
}

/// Answers the stream's calls as their replies come; when the stream ends, hands the calls
/// still unanswered (and those whose incarnation died) to [`Shared::recover`].
///
/// Boxed as a `Send` future by its signature: reading, recovering and reconnecting call each
/// other, and a named boundary lets the compiler see that the cycle is `Send`.
fn read_answers(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    inbound: tonic::Streaming<wire::ActorReplyBatch>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(read_answers_until_end(shared, conn, inbound))
}

async fn read_answers_until_end(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    mut inbound: tonic::Streaming<wire::ActorReplyBatch>,
) {
    let id = shared.id;
    let mut died: Vec<Pending> = Vec::new();
    let mut why = None;
    loop {
        match inbound.next().await {
            Some(Ok(batch)) => {
                for reply in batch.replies {
                    let Some(call) = lock(&conn.pending).remove(&reply.seq) else {
                        continue;
                    };
                    let answer = match reply.outcome {
                        Some(actor_reply::Outcome::Returned(bytes)) => Ok(CallResult::Bytes(bytes)),
                        Some(actor_reply::Outcome::Kept(kept)) => {
                            // Recorded by the head before the call is answered, off this loop.
                            let client = shared.client.clone();
                            let method = call.method.clone();
                            let Pending {
                                result_object,
                                reply,
                                ..
                            } = call;
                            tokio::spawn(async move {
                                let answer = match result_object {
                                    Some(object) => client
                                        .record_kept(object, kept.size, kept.crc32c, kept.node)
                                        .await
                                        .map(CallResult::Object),
                                    None => Err(ClientError::ActorCall {
                                        actor: id,
                                        method,
                                        message: "the worker kept a result the call named no \
                                                  object for"
                                            .into(),
                                    }),
                                };
                                let _ = reply.send(answer);
                            });
                            continue;
                        }
                        Some(actor_reply::Outcome::Error(message)) => Err(ClientError::ActorCall {
                            actor: id,
                            method: call.method.clone(),
                            message,
                        }),
                        Some(actor_reply::Outcome::Cancelled(reason)) => {
                            Err(ClientError::ActorCallCancelled {
                                actor: id,
                                method: call.method.clone(),
                                reason,
                            })
                        }
                        Some(actor_reply::Outcome::Died(reason)) => {
                            shared.died.fetch_max(conn.incarnation, Ordering::Relaxed);
                            why.get_or_insert(reason);
                            died.push(call);
                            continue;
                        }
                        None => Err(ClientError::ActorCall {
                            actor: id,
                            method: call.method.clone(),
                            message: "the worker's answer held no outcome".into(),
                        }),
                    };
                    let _ = call.reply.send(answer);
                }
                if why.is_some() {
                    break;
                }
            }
            Some(Err(status)) => {
                why.get_or_insert_with(|| format!("its call stream broke: {}", status.message()));
                break;
            }
            None => break,
        }
    }
    let left: Vec<Pending> = {
        let mut pending = lock(&conn.pending);
        conn.broken.cancel();
        std::mem::take(&mut *pending).into_values().collect()
    };
    died.extend(left);
    if died.is_empty() {
        return;
    }
    let why = match why {
        Some(why) => why,
        // The worker ended the stream without a word: ask the head why.
        None => match shared.client.describe_actor(id).await {
            Ok(view) => view
                .reason
                .unwrap_or_else(|| "its incarnation ended".to_string()),
            Err(e) => format!("its incarnation ended ({e})"),
        },
    };
    shared.recover(&conn, died, why).await;
}
