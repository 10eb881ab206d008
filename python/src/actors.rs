//! Python actors over the Rust client's ([`escher_client::ActorHandle`]): [`Actor`], a
//! handle that makes calls, and [`Call`], one call's answer once it comes. The package's
//! `ActorHandle` and `ActorCallRef` (`python/escher/_actors.py`) give them their Python shape;
//! the actor's class and the calls' arguments are pickled there (worker/src/python/actor.rs
//! says how they travel).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use escher_client::{ActorHandle, CallCanceller, CallResult, ClientError};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::{mpsc, oneshot};

use crate::{GetTimeoutError, error, error_ref, seconds, wait_for};

/// A handle to an actor. Dropping the handle that created an owned actor (the last Python
/// reference to it) kills the actor once its calls are answered, as the Rust handle's last
/// clone does.
#[pyclass(module = "escher._escher", frozen)]
pub(crate) struct Actor {
    id: u64,
    handle: Mutex<Option<ActorHandle>>,
    /// The calls to make, in order, to the one task that makes them ([`dispatch`]).
    calls: Mutex<Option<mpsc::UnboundedSender<Job>>>,
}

/// One call to make: the method, the pickled arguments, where its answer goes, and its
/// canceller.
type Job = (
    String,
    Bytes,
    oneshot::Sender<Result<CallResult, ClientError>>,
    CallCanceller,
);

impl Actor {
    pub(crate) fn new(handle: ActorHandle) -> Actor {
        let (tx, rx) = mpsc::unbounded_channel();
        crate::runtime().spawn(dispatch(handle.clone(), rx));
        Actor {
            id: handle.id().0,
            handle: Mutex::new(Some(handle)),
            calls: Mutex::new(Some(tx)),
        }
    }

    fn handle(&self) -> PyResult<ActorHandle> {
        self.handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| crate::EscherError::new_err("the actor handle was closed"))
    }
}

/// Makes the calls of one Python handle, all on this one task: each call is first polled (and
/// so numbered and queued by the client) in the order it was made, which keeps the order the
/// actor starts them in.
async fn dispatch(handle: ActorHandle, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut running = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            job = jobs.recv() => match job {
                Some((method, args, reply, cancel)) => {
                    let handle = handle.clone();
                    running.push(async move {
                        // A result above 100 KiB stays in the actor's node's store: the
                        // caller gets the object (the package's ActorCallRef reads it, or
                        // passes it on by reference).
                        let _ = reply.send(handle.call_object_with(&method, args, &cancel).await);
                    });
                }
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    while running.next().await.is_some() {}
}

impl Drop for Actor {
    fn drop(&mut self) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Dropped on the runtime: the Rust handle kills an owned actor from there.
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            crate::runtime().spawn(async move { drop(handle) });
        }
    }
}

#[pymethods]
impl Actor {
    /// The actor's id (its task's id).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Sends a call of `method` with the pickled `(args, kwargs)`; its answer comes in the
    /// [`Call`]. Calls made on one handle start in the order they were made.
    fn call(&self, method: String, args: &[u8]) -> PyResult<Call> {
        let (tx, rx) = oneshot::channel();
        let canceller = CallCanceller::new();
        let sent = self
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|calls| {
                calls
                    .send((method, Bytes::copy_from_slice(args), tx, canceller.clone()))
                    .is_ok()
            });
        if !sent {
            return Err(crate::EscherError::new_err("the actor handle was closed"));
        }
        Ok(Call {
            state: Arc::new(tokio::sync::Mutex::new(CallState::Sent(rx))),
            canceller,
        })
    }

    /// Ends the actor (`no_restart`: for good; else its incarnation is stopped and restarted);
    /// its state afterwards.
    fn kill(&self, py: Python<'_>, no_restart: bool) -> PyResult<String> {
        let handle = self.handle()?;
        let state = wait_for(py, async move { handle.kill(no_restart).await })?.map_err(error)?;
        Ok(state.to_string())
    }

    /// Where the actor is now: `(state, incarnation, node, reason)`.
    fn describe(&self, py: Python<'_>) -> PyResult<(String, u32, Option<u64>, Option<String>)> {
        let handle = self.handle()?;
        let view = wait_for(py, async move { handle.describe().await })?.map_err(error)?;
        Ok((
            view.state.to_string(),
            view.incarnation,
            view.node.map(|n| n.0),
            view.reason,
        ))
    }
}

/// Where a call stands.
enum CallState {
    Sent(oneshot::Receiver<Result<CallResult, ClientError>>),
    Answered(Result<CallResult, Arc<ClientError>>),
}

/// One actor call's answer.
#[pyclass(module = "escher._escher", frozen)]
pub(crate) struct Call {
    state: Arc<tokio::sync::Mutex<CallState>>,
    canceller: CallCanceller,
}

async fn settle(state: &tokio::sync::Mutex<CallState>) -> Result<CallResult, Arc<ClientError>> {
    let mut state = state.lock().await;
    if let CallState::Sent(rx) = &mut *state {
        let answer = match rx.await {
            Ok(answer) => answer.map_err(Arc::new),
            Err(_) => Err(Arc::new(ClientError::Usage(
                "the call was dropped before it was answered (the session ended)".into(),
            ))),
        };
        *state = CallState::Answered(answer);
    }
    match &*state {
        CallState::Answered(answer) => answer.clone(),
        CallState::Sent(_) => unreachable!("answered above"),
    }
}

/// What Python gets of an answer: `(True, value bytes)`, `(True, Object)` for a result kept
/// in the actor's node's store (the caller's owning handle: dropping the last Python reference
/// to it, and the call, releases it), `(False, the method's error text)`,
/// `(None, why)` for a cancelled call, or the exception of a call that could not be answered
/// (the actor died, the session ended).
type Answer = (Option<bool>, Py<PyAny>);

fn to_answer(py: Python<'_>, answer: Result<CallResult, Arc<ClientError>>) -> PyResult<Answer> {
    match answer {
        Ok(CallResult::Bytes(bytes)) => {
            Ok((Some(true), PyBytes::new(py, &bytes).into_any().unbind()))
        }
        Ok(CallResult::Object(object)) => Ok((
            Some(true),
            Py::new(py, crate::objects::Object::new(object))?.into_any(),
        )),
        Err(e) => match &*e {
            ClientError::ActorCall { message, .. } => Ok((
                Some(false),
                message.clone().into_pyobject(py)?.into_any().unbind(),
            )),
            ClientError::ActorCallCancelled { reason, .. } => {
                Ok((None, reason.clone().into_pyobject(py)?.into_any().unbind()))
            }
            other => Err(error_ref(other)),
        },
    }
}

impl Call {
    /// The answer, if it has come, taken without waiting (`None` also while someone else
    /// waits for it).
    fn ready(&self) -> Option<Result<CallResult, Arc<ClientError>>> {
        let mut state = self.state.try_lock().ok()?;
        if let CallState::Sent(rx) = &mut *state {
            match rx.try_recv() {
                Ok(answer) => *state = CallState::Answered(answer.map_err(Arc::new)),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    *state = CallState::Answered(Err(Arc::new(ClientError::Usage(
                        "the call was dropped before it was answered (the session ended)".into(),
                    ))));
                }
            }
        }
        match &*state {
            CallState::Answered(answer) => Some(answer.clone()),
            CallState::Sent(_) => None,
        }
    }
}

#[pymethods]
impl Call {
    /// Whether the answer has come.
    fn done(&self) -> bool {
        self.ready().is_some()
    }

    /// Cancels the call: one not yet started is removed from the actor's queue and answered
    /// as cancelled; a running one is stopped only in an async actor (its coroutine is
    /// cancelled), else it runs on. Returns at once; an answered call is not changed.
    fn cancel(&self) {
        self.canceller.cancel();
    }

    /// Waits for the answer (at most `timeout` seconds): see [`Answer`]. One that has come
    /// is taken at once, without a trip through the runtime (a loop of calls then one `get`
    /// of them all reads most answers so).
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Answer> {
        if let Some(answer) = self.ready() {
            return to_answer(py, answer);
        }
        let limit = seconds(timeout, "timeout")?;
        let state = Arc::clone(&self.state);
        let answer = wait_for(py, async move {
            match limit {
                Some(limit) => tokio::time::timeout(limit, settle(&state)).await.ok(),
                None => Some(settle(&state).await),
            }
        })?;
        match answer {
            Some(answer) => to_answer(py, answer),
            None => Err(GetTimeoutError::new_err(format!(
                "the actor call was not answered within {} s",
                timeout.unwrap_or_default()
            ))),
        }
    }
}
