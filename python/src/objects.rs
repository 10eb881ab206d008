//! Objects from Python (`escher.put`, `escher.get` of an `ObjectRef`): `put_object` and
//! `get_object` over the Rust client's [`Client::put`] and [`Client::get_object`], and
//! [`Object`], the owner's handle, whose drop releases the object (the client's
//! [`ObjectRef`]).
//!
//! The package (`python/escher/_objects.py`) lays a value out (pickle protocol 5, out-of-band
//! buffers after the pickle). For a worker on this machine (`put_place` gives a memfd name)
//! it writes the parts straight into a memfd of that name, seals it, and `put_placed_file`
//! hands it over (each buffer copied once, into the memfd, by the kernel's `write`);
//! otherwise it joins them into one `bytes`, which `put_placed_bytes` (or `put_object`) hands
//! to the client as it is ([`Bytes::from_owner`], no copy). The GIL is released while they
//! move.
//!
//! A `get` (`read_object`) of an object whose holder runs on this machine returns the holder's
//! sealed file, lent (`Objects.Map`, the client's `map.rs`): a descriptor, its size and an
//! [`ObjectLease`] that keeps the object pinned at its holder; the package maps the file
//! read-only as an `mmap` that holds the lease, so a NumPy array read from it is a view of the
//! store's own pages (the limited API of Python 3.9, which this module is built for, cannot
//! lend Python a buffer it does not own, so Python maps the file itself). Otherwise it returns
//! the fetched bytes as one Python `bytes` (one copy, from the client's buffer).

use bytes::Bytes;
use escher_client::{ClientError, ObjectRead, ObjectRef};
use escher_proto::types::ObjectId;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::session::Session;
use crate::{ObjectLostError, error, wait_for};

/// An object this process put: its id, size and checksum; dropping the last Python reference
/// to it releases the object (the worker that holds it deletes its copy).
#[pyclass(module = "escher._escher", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct Object {
    inner: ObjectRef,
    /// Adopted from a task's result ([`adopt_object`]), not put here: its size is not known.
    adopted: bool,
}

impl Object {
    /// The Python handle of the owning reference `inner` (an actor call's kept result).
    pub(crate) fn new(inner: ObjectRef) -> Object {
        Object {
            inner,
            adopted: false,
        }
    }
}

#[pymethods]
impl Object {
    /// The object's id: `(owner, index)`.
    #[getter]
    fn id(&self) -> (u64, u64) {
        let id = self.inner.id();
        (id.owner(), id.index())
    }

    /// Its length in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size()
    }

    /// The CRC-32C of its bytes.
    #[getter]
    fn checksum(&self) -> u32 {
        self.inner.checksum()
    }

    /// Whether this process adopted it from a task's result ([`adopt_object`]) rather than
    /// put it (its `size` and `checksum` then read 0: not known here).
    #[getter]
    fn adopted(&self) -> bool {
        self.adopted
    }

    /// Gives the object up: this handle's last reference dropped no longer releases it (a
    /// task hands a reference it returns over to its caller, whose object session it is in).
    fn disown(&self) {
        self.inner.disown();
    }

    /// Whether its bytes reached the worker's store as a sealed file of this machine (true)
    /// or were streamed over the data plane.
    #[getter]
    fn handed_over(&self) -> bool {
        self.inner.handed_over()
    }
}

/// Puts `data` (a `bytes` object, kept alive and read in place while it moves) into a
/// worker's store and returns the owner's handle.
#[pyfunction]
pub(crate) fn put_object(
    py: Python<'_>,
    session: &Session,
    data: PyBackedBytes,
) -> PyResult<Object> {
    let client = session.client();
    let bytes = Bytes::from_owner(data);
    let inner = wait_for(py, async move { client.put(bytes).await })?.map_err(object_error)?;
    Ok(Object {
        inner,
        adopted: false,
    })
}

/// A put the head has placed, whose bytes are still to come ([`put_placed_file`] or
/// [`put_placed_bytes`], once).
#[pyclass(module = "escher._escher")]
#[derive(Debug)]
pub(crate) struct PlacedPut {
    inner: Option<escher_client::PlacedPut>,
}

impl PlacedPut {
    fn take(&mut self) -> PyResult<escher_client::PlacedPut> {
        self.inner.take().ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err("escher: this placed put was used already")
        })
    }
}

/// Asks the head where an object of `size` bytes goes. Returns the placed put and, when the
/// worker runs on this machine, the name of the memfd to write the object into and hand over
/// (`put_placed_file`); `None` when its bytes are to be streamed (`put_placed_bytes`).
#[pyfunction]
pub(crate) fn put_place(
    py: Python<'_>,
    session: &Session,
    size: u64,
) -> PyResult<(PlacedPut, Option<String>)> {
    let client = session.client();
    let placed =
        wait_for(py, async move { client.place_put(size).await })?.map_err(object_error)?;
    let name = placed.handover_name();
    Ok((
        PlacedPut {
            inner: Some(placed),
        },
        name,
    ))
}

/// Hands the object over as the memfd `fd` of this process (named as `put_place` said, holding
/// the object's bytes, sealed against writes and size changes); where the worker cannot take
/// it, its bytes are streamed. `fd` stays the caller's (to close once this returns).
#[pyfunction]
pub(crate) fn put_placed_file(
    py: Python<'_>,
    session: &Session,
    mut placed: PyRefMut<'_, PlacedPut>,
    fd: i32,
) -> PyResult<Object> {
    let placed = placed.take()?;
    #[cfg(target_os = "linux")]
    {
        // A descriptor of our own on the same file (the caller's stays the caller's), which
        // the worker opens as this process's.
        let file = std::fs::File::open(format!("/proc/self/fd/{fd}")).map_err(|e| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "escher: cannot open descriptor {fd} of the put: {e}"
            ))
        })?;
        let client = session.client();
        let inner = wait_for(py, async move {
            client.put_placed_file(placed, &file, None).await
        })?
        .map_err(object_error)?;
        Ok(Object {
            inner,
            adopted: false,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (py, session, fd, placed);
        Err(pyo3::exceptions::PyValueError::new_err(
            "escher: a put is handed over as a file on Linux only",
        ))
    }
}

/// Streams `data` (a `bytes` object of the placed size, read in place) as the placed object.
#[pyfunction]
pub(crate) fn put_placed_bytes(
    py: Python<'_>,
    session: &Session,
    mut placed: PyRefMut<'_, PlacedPut>,
    data: PyBackedBytes,
) -> PyResult<Object> {
    let placed = placed.take()?;
    let client = session.client();
    let bytes = Bytes::from_owner(data);
    let inner = wait_for(py, async move { client.put_placed(placed, bytes).await })?
        .map_err(object_error)?;
    Ok(Object {
        inner,
        adopted: false,
    })
}

/// A new owner's handle for object `(owner, index)`, which a task returned (inside its result)
/// into this client's object session: dropping its last Python reference releases the object.
/// The package adopts an id once per process and shares the handle (`_objects._adopt`).
#[pyfunction]
pub(crate) fn adopt_object(session: &Session, owner: u64, index: u64) -> Object {
    Object {
        inner: session.client().adopt_object(ObjectId(owner, index)),
        adopted: true,
    }
}

/// The bytes of object `(owner, index)`, fetched from a worker that holds it, checked whole.
#[pyfunction]
pub(crate) fn get_object<'py>(
    py: Python<'py>,
    session: &Session,
    owner: u64,
    index: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let client = session.client();
    let id = ObjectId(owner, index);
    let bytes = wait_for(py, async move { client.get_object(id).await })?.map_err(object_error)?;
    Ok(PyBytes::new(py, &bytes))
}

/// What keeps an object pinned at its holder on this machine while Python maps its file
/// (the client's lease: an open `Objects.Map` call); [`ObjectLease::release`] or the last
/// reference dropped ends it.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct ObjectLease {
    inner: std::sync::Mutex<Option<escher_client::ObjectLease>>,
}

#[pymethods]
impl ObjectLease {
    /// Ends the lease now (the holder may then spill or delete the object).
    fn release(&self) {
        let lease = self.inner.lock().map(|mut l| l.take()).unwrap_or(None);
        drop(lease);
    }
}

/// Object `(owner, index)`: `(fd, size, lease)` when its holder on this machine lent its
/// sealed file (the caller maps the descriptor read-only, closes it, and keeps the lease as
/// long as the mapping), else its bytes, fetched and checked whole.
#[pyfunction]
pub(crate) fn read_object<'py>(
    py: Python<'py>,
    session: &Session,
    owner: u64,
    index: u64,
) -> PyResult<Bound<'py, PyAny>> {
    use std::os::fd::IntoRawFd as _;
    let client = session.client();
    let id = ObjectId(owner, index);
    let read = wait_for(py, async move { client.read_object(id).await })?.map_err(object_error)?;
    match read {
        ObjectRead::Fetched(bytes) => Ok(PyBytes::new(py, &bytes).into_any()),
        ObjectRead::Lent(lent) => {
            let lent = *lent;
            let lease = ObjectLease {
                inner: std::sync::Mutex::new(Some(lent.lease)),
            };
            let fd = lent.file.into_raw_fd();
            (fd, lent.size, lease)
                .into_pyobject(py)
                .map(|t| t.into_any())
        }
    }
}

/// The Python exception for an object call: an object the head says is lost, or one no holder
/// gave whole, is `ObjectLostError` (the text names the object, its node and why); the rest
/// as any client error (a freed or unknown object, another namespace's: `NotFoundError`).
fn object_error(e: ClientError) -> PyErr {
    match &e {
        ClientError::ObjectUnavailable(_) => ObjectLostError::new_err(e.to_string()),
        // The head refuses a lost object's locate with FAILED_PRECONDITION, which the client
        // reads as a refused argument; its text is the state's `ObjectLost` error.
        ClientError::InvalidArgument(text) if text.contains(" is lost: ") => {
            ObjectLostError::new_err(e.to_string())
        }
        _ => error(e),
    }
}

/// What the head knows of object `(owner, index)`: `(size, crc32c, holder nodes)`.
#[pyfunction]
pub(crate) fn object_info(
    py: Python<'_>,
    session: &Session,
    owner: u64,
    index: u64,
) -> PyResult<(u64, u32, Vec<u64>)> {
    let client = session.client();
    let id = ObjectId(owner, index);
    let view =
        wait_for(py, async move { client.locate_object(id).await })?.map_err(object_error)?;
    let holders = view.holders.iter().map(|h| h.node.0).collect();
    Ok((view.size, view.checksum, holders))
}
