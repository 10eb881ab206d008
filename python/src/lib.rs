//! `escher._escher`: the private native module of escher's Python package, PyO3 bindings over
//! the Rust client (docs/DESIGN.md §15). The package's Python code (`python/escher/`) is the
//! API people use; this module only moves calls to the Rust client and back.
//!
//! # Layout
//!
//! - this file: the module, its exceptions, and the one tokio runtime every call runs on;
//! - `session.rs`: `Session`, a connected client (and, for `escher.init()` with no
//!   address, the embedded cluster it owns), with one method per client call;
//! - `actors.rs`: `Actor`, a handle that calls a Python actor's methods, and `Call`, one
//!   call's answer;
//! - `watch.rs`: `EventStream`, the events of a watch, one at a time;
//! - `objects.rs`: `put_object`, `get_object` and `Object`, the owner's handle of an object
//!   (`escher.put`, `escher.get` of an `ObjectRef`);
//! - `esl.rs`: bindings over the Rust ESLs (locality, affinity, native gangs, hierarchical
//!   fair share, queues), whose policies hand tasks an `Spec`.
//!
//! Every call that waits releases the GIL (`Python::detach`) and waits in slices, checking for
//! signals between them, so that Ctrl-C interrupts a long `get`. Results that are records
//! (cluster status, events, telemetry) cross as JSON text, which the package decodes.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use escher_client::ClientError;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;

mod actors;
mod esl;
mod objects;
mod session;
mod watch;

pyo3::create_exception!(
    _escher,
    EscherError,
    PyException,
    "Base class of escher's errors."
);
pyo3::create_exception!(
    _escher,
    ConnectError,
    EscherError,
    "The head cannot be reached."
);
pyo3::create_exception!(
    _escher,
    AuthError,
    EscherError,
    "The head refused the token, or the token may not do this."
);
pyo3::create_exception!(
    _escher,
    InvalidArgumentError,
    EscherError,
    "The call's arguments are wrong (a resource name, an amount, a task spec)."
);
pyo3::create_exception!(
    _escher,
    NotFoundError,
    EscherError,
    "No such task (or not one this client may see), node or resource."
);
pyo3::create_exception!(
    _escher,
    GetTimeoutError,
    EscherError,
    "A task did not finish within the timeout."
);

pyo3::create_exception!(
    _escher,
    ActorDiedError,
    EscherError,
    "An actor call could not be answered: the actor died, was killed, or cannot be reached."
);

pyo3::create_exception!(
    _escher,
    ObjectLostError,
    EscherError,
    "An object's bytes cannot be had: its only copies were on a lost node, or no holder gave \
     them whole. The message names the object, the node and why."
);

/// How long one wait lasts between two checks for a signal (Ctrl-C).
const SLICE: Duration = Duration::from_millis(100);

/// The runtime every call of the module runs on (worker threads: the Python thread only
/// blocks on it, with the GIL released).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("escher-py")
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Runs `fut` on the module's runtime and waits for it without the GIL, interruptibly: a
/// signal handler that raises (Ctrl-C) abandons the wait and the future.
pub(crate) fn wait_for<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let rt = runtime();
    let mut handle = rt.spawn(fut);
    loop {
        let done =
            py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, &mut handle).await }));
        match done {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "escher: a call ended abnormally: {e}"
                )));
            }
            Err(_) => {
                if let Err(e) = py.check_signals() {
                    handle.abort();
                    return Err(e);
                }
            }
        }
    }
}

/// The Python exception for a client error.
pub(crate) fn error(e: ClientError) -> PyErr {
    error_ref(&e)
}

/// The Python exception for a client error kept for several callers.
pub(crate) fn error_ref(e: &ClientError) -> PyErr {
    let text = e.to_string();
    match e {
        ClientError::Connect { .. } | ClientError::Unavailable { .. } => {
            ConnectError::new_err(text)
        }
        ClientError::Unauthenticated { .. } | ClientError::PermissionDenied(_) => {
            AuthError::new_err(text)
        }
        ClientError::InvalidArgument(_) | ClientError::Invalid(_) | ClientError::Usage(_) => {
            InvalidArgumentError::new_err(text)
        }
        ClientError::NotFound(_) => NotFoundError::new_err(text),
        ClientError::Timeout { .. } => GetTimeoutError::new_err(text),
        ClientError::ActorDied { .. } => ActorDiedError::new_err(text),
        // A task's result object whose last copy is gone and that nothing rebuilds.
        ClientError::ObjectLost { .. } => ObjectLostError::new_err(text),
        _ => EscherError::new_err(text),
    }
}

/// A duration in seconds from Python, checked.
pub(crate) fn seconds(value: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(InvalidArgumentError::new_err(format!(
            "{what} is a number of seconds, 0 or more, not {s}"
        ))),
    }
}

/// Logs of the embedded cluster and the client (head, workers, fetches) to stderr when the
/// driver's environment sets `ESCHER_LOG` (a `tracing` filter, as the CLI reads it: `info`,
/// `escher_worker=debug`); nothing otherwise, so that a driver's output stays its own. A
/// filter that does not parse is said once on stderr and ignored.
fn log_from_env() {
    let Ok(spec) = std::env::var("ESCHER_LOG") else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_new(&spec) {
        Ok(filter) => {
            // Another library of the same interpreter may have installed one first: its stays.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
        Err(e) => eprintln!("escher: ESCHER_LOG={spec:?} is not a log filter ({e}); no logs"),
    }
}

#[pymodule]
fn _escher(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    log_from_env();
    m.add("EscherError", py.get_type::<EscherError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("GetTimeoutError", py.get_type::<GetTimeoutError>())?;
    m.add("ActorDiedError", py.get_type::<ActorDiedError>())?;
    m.add("ObjectLostError", py.get_type::<ObjectLostError>())?;
    m.add("PYTHON_FUNCTION", escher::worker::PYTHON_FUNCTION)?;
    m.add("PYTHON_RESOURCE", escher::worker::PYTHON_RESOURCE)?;
    m.add("PYTHON_ACTOR_CLASS", escher::worker::PYTHON_ACTOR_CLASS)?;
    m.add_class::<session::Session>()?;
    m.add_class::<session::Pending>()?;
    m.add_class::<actors::Actor>()?;
    m.add_class::<actors::Call>()?;
    m.add_class::<watch::EventStream>()?;
    m.add_class::<watch::LogTail>()?;
    m.add_class::<objects::Object>()?;
    m.add_class::<objects::PlacedPut>()?;
    m.add_class::<objects::ObjectLease>()?;
    m.add_function(wrap_pyfunction!(objects::put_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::put_place, m)?)?;
    m.add_function(wrap_pyfunction!(objects::put_placed_file, m)?)?;
    m.add_function(wrap_pyfunction!(objects::put_placed_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(objects::get_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::adopt_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::read_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::object_info, m)?)?;
    m.add_class::<esl::Spec>()?;
    m.add_class::<esl::DataLocality>()?;
    m.add_class::<esl::Affinity>()?;
    m.add_class::<esl::Gangs>()?;
    m.add_class::<esl::Gang>()?;
    m.add_class::<esl::Hfs>()?;
    m.add_class::<esl::Queue>()?;
    m.add_function(wrap_pyfunction!(session::start_local, m)?)?;
    m.add_function(wrap_pyfunction!(session::connect, m)?)?;
    Ok(())
}
