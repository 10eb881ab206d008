//! The scheduler core: a pure state machine that matches tasks to nodes.
//!
//! It does no I/O, takes no locks, reads no clock and spawns nothing. Callers feed it
//! [`Event`]s with the current time and it pushes [`Decision`]s into a buffer they drain:
//!
//! ```text
//!            events (with `now`)                       decisions
//!   NodeAdded / NodeRemoved        ──┐           ┌──▶ Dispatch { task, node }
//!   ResourceChanged (set/adjust/del) ├─▶ handle ─┼──▶ Infeasible { task, reason }
//!   TaskSubmitted / Finished /       │  (one     ├──▶ Feasible { task }
//!     Cancelled                      │  round)   ├──▶ DeadlinePassed { task }
//!   Tick                           ──┘           └──▶ Lost { task, node }
//! ```
//!
//! # How it stays cheap
//!
//! - Resource names are interned to integer ids, reference-counted and freed (their ids
//!   reused) once no node holds them and no pending or running task requests them, so the
//!   table follows the names in use, not every name ever seen. Each node keeps its resources
//!   in a hash map, and an index maps every resource to the set of nodes that hold it.
//! - Pending tasks are grouped into **shapes**: tasks with identical requirement vectors share
//!   one FIFO queue. An index maps every resource to the shapes that request it.
//! - An event **wakes** only the shapes that request a changed resource, and only at the node
//!   where it changed. A round then examines the woken shapes, oldest waiting task first.
//!   Nothing else is looked at, so the cost of a decision does not grow with the number of
//!   unrelated resources, shapes or nodes.
//!
//! # Guarantees
//!
//! - **Safety**: a task is dispatched only to a node whose available amount of every resource it
//!   requests covers the request. Capacities may be lowered below what running tasks hold; then
//!   nothing new is admitted until use falls below the new capacity.
//! - **Liveness**: after every event, no pending task fits any live node. Shapes never block one
//!   another; within a shape tasks are dispatched in submission order.
//! - **Reported infeasibility**: a pending task that no live node could hold even when idle is
//!   reported with a reason (which resource, how much, which nodes came closest), and reported
//!   feasible again when a change makes it so.
//! - **Determinism**: the same events in the same order give the same decisions, and so does
//!   a core restored from a snapshot (serde; the head's raft snapshots hold it). Audit for
//!   the restore: the core's hash maps (`FxHashMap`, whose iteration order depends on
//!   insertion history, which a deserialized map does not reproduce) are only ever looked up,
//!   summed, or iterated to fill sets and flags whose result does not depend on order
//!   (`add_node`'s and `remove_node`'s walks over a node's slots wake shapes and gangs into
//!   ordered sets); every decision iterates `BTreeMap`s, `BTreeSet`s, `Vec`s (kept in their
//!   serialized order) or sorted copies. Snapshots write hash maps in key order, so equal
//!   cores write equal bytes. The property test `state_snapshots` checks all of this.
//!
//! # Node choice
//!
//! A task goes to the first node that fits in **round-robin order over the nodes that hold its
//! scarcest requested resource** (the one held by the fewest live nodes; ties go to the lower
//! resource id), starting after the node last chosen for that resource. Identical tasks
//! therefore spread across nodes. A task that requests nothing round-robins over all live
//! nodes. When resources are released on a node, the tasks waiting for them go to that node.
//!
//! **Soft locality** ([`Scheduler::prefer`]): a task with preferred resources (the head sets
//! the location resources of its argument objects) first tries the nodes that hold them, in
//! the order given, and takes the first where it fits now; with none, it is placed as above.
//! A preference orders the nodes that fit; it never makes a task wait.

mod core;
mod error;
mod event;
mod gang;
mod interner;
mod node;
mod placement;
mod sanity;
mod shape;
mod sorted;
mod walltime;

pub(crate) use self::core::new_total;
pub use self::core::{NodeView, ResourceView, Scheduler};
pub use error::CoreError;
pub use event::{Decision, Event, InfeasibleReason, Millis};
pub use gang::GANG_PATIENCE;
pub use walltime::WALLTIME_REASON;
