//! Objects from the client's side (docs/ARCHITECTURE.md "Objects"): moving an object's bytes
//! between this process and the worker that holds (or will hold) it, over that worker's data
//! plane, never through the head.
//!
//! - [`fetch_object`] and [`push_object`] (`transfer.rs`): one object's bytes from a holder,
//!   or into a worker's store, given the address and the object ticket the head handed out;
//!   [`ObjectTransferError`] says what went wrong, naming the object.
//! - [`Client::put`](crate::Client::put), [`Client::get_object`](crate::Client::get_object)
//!   and [`ObjectRef`] (`refs.rs`): objects through the head's table, released when their
//!   last reference is dropped; a put to a worker on this machine hands the bytes over as
//!   a sealed memfd (`handover.rs`), and streams them where it cannot; a get from a holder on
//!   this machine maps the holder's sealed file (`map.rs`), and fetches where it cannot.
//! - The client's object session (`session.rs`): the background task that releases, renews
//!   the session while the client lives, and closes it when the client goes
//!   ([`Client::close_object_session`](crate::Client::close_object_session)).
//! - A task's result kept as an object (`results.rs`): read from its holder, rebuilt by
//!   lineage, owned through [`Client::result_ref`](crate::Client::result_ref).

mod handover;
#[cfg(target_os = "linux")]
mod map;
mod refs;
mod results;
mod session;
mod transfer;

pub use handover::HANDOVER_ENV;
#[cfg(target_os = "linux")]
pub use handover::{new_memfd, seal};
#[cfg(target_os = "linux")]
pub use map::{LentObject, MAP_ENV, MAX_LEASES, ObjectLease};
pub use refs::{ObjectRead, ObjectRef, PlacedPut};
pub use results::REBUILD_PATIENCE;
pub(crate) use session::Puts;
pub use session::{CallerSession, ClosedSession};
pub use transfer::{ObjectTransferError, fetch_object, push_object};
