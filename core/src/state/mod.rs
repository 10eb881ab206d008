//! The head's replicated state: nodes, the resource table, tasks and results.
//!
//! Everything here changes only through [`ClusterState::apply`], which takes a serializable
//! [`Entry`] (a [`Command`] stamped with the time it was accepted) and is deterministic: the
//! same entries in the same order give the same state, replies and [`Effect`]s on every replica.
//! That is the seam where raft replicates the head (docs/DESIGN.md §7). Soft state (which worker
//! connection is open, when each last sent a heartbeat, who waits for which task) lives in the
//! runtime, not here.
//!
//! ```text
//!   runtime ──Entry{now, Command}──▶ apply ──▶ Reply (to the caller)
//!                                      │
//!                                      ├──▶ scheduler core (events in, decisions out)
//!                                      └──▶ Effects: Assign / Cancel / ReconfigureMig to
//!                                           workers, Terminal
//! ```
//!
//! Retention (`retention.rs`): finished tasks are kept by a policy and then reduced to
//! tombstones, dead nodes are reclaimed after a grace period, so memory stays flat under an
//! endless stream of tasks.
//!
//! Tokens (`tokens.rs`): the hashes of the tokens `escher token create` made, and the key that
//! signs task credentials (docs/DESIGN.md §10).
//!
//! Events (`events.rs`): every change a watcher may care about (a task submitted, started,
//! finished or blocked, a resource resized, a node joined or lost, a reservation placed) is
//! recorded with the next revision of the replicated counter, for the watch API.
//!
//! Incarnations (`incarnation.rs`): a state restored from a backup begins a new life of its
//! cluster at its first entry: ids given out after the backup are skipped, and returning
//! workers are reconciled strictly.
//!
//! Objects (`objects.rs`): every object's size, checksum, owner and the nodes that hold a
//! copy, each copy published as the location resource `NS/object.O` on its node; what a
//! returning worker's store holds is judged against it (`reconcile.rs`).
//!
//! Registration numbers (`registrations.rs`): a node's removal names the registration its
//! leader judged, and changes nothing when the node has registered again since.
//!
//! Lineage (`lineage.rs`): the task that submitted each task from inside it, so that a
//! recursive cancel ends a task's descendants with it.
//!
//! GPUs (`gpus.rs`): the GPU inventory of each node, the devices each running task was given,
//! and MIG reconfiguration as a state change (validated, slices retired, then rebuilt).

mod actors;
mod apply;
mod command;
mod error;
mod events;
mod gpus;
mod incarnation;
mod lineage;
mod nodes;
mod objects;
mod queries;
mod reconcile;
mod record;
mod registrations;
mod requeue;
mod resources;
mod retention;
mod sessions;
mod tasks;
mod tokens;

pub use actors::ActorSelector;
pub use apply::{ClusterState, StateConfig};
pub use command::{Command, Effect, Entry, Reply};
pub use error::ApplyError;
pub use events::Recorded;
pub use gpus::PendingMig;
pub use incarnation::{
    CLOCK_MARGIN_MS, Incarnation, MAX_SKIPS_KEPT, NODE_IDS_PER_SECOND, TASK_IDS_PER_SECOND,
    ids_to_skip,
};
pub use lineage::Lineage;
pub use nodes::{Joining, Returning, SecretHash};
pub use objects::{FIRST_SESSION, MAX_FREED_KEPT, ObjectRecord, ObjectTable, location_resource};
pub use reconcile::{HeldVerdict, owner_of};
pub use record::{AttemptRecord, MAX_TAILS_KEPT, NodeRecord, TaskRecord};
pub use registrations::Registrations;
pub use retention::{NodeTombstone, RetentionPolicy};
pub use sessions::{MAX_REPLIES_PER_CLIENT, MAX_SESSIONS, SESSION_IDLE_MS};
pub use tokens::{MAX_TOKENS, TokenHash, TokenRecord, Tokens};
