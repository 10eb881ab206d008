//! Task signalling (primitive P2): happens-before between tasks, with no RPC between them.
//!
//! **Primitive (thesis §4.4.1 P2).** "If task T2 has any happens-before dependency on task
//! T1, T1 can create a resource `E_T2` when it completes. T2 a priori requests `E_T2` as a
//! part of its resource requirements when launched, and thus is scheduled as soon as `E_T2`
//! is created by T1." Signals are single-shot: every request is declared at submission, and a
//! task starts when the signals it requests appear. A [`Signal`] is that resource: its
//! *raiser* creates it (unbounded, on every live node, so that the waiter may run anywhere)
//! when it succeeds; its *waiters* request one unit.
//!
//! Built on it:
//! - [`Dag`]: a DAG of tasks; each task waits for one signal per predecessor
//!   (`done-<dag>-<task>`); the plan is validated (unknown tasks, cycles) and comes in a valid
//!   order;
//! - [`Barrier`]: one task (or many) after `n` parties: one unit of each party's signal;
//! - [`Semaphore`]: a counted ER (capacity `k`; a mutex is `k = 1`), held while a task runs.
//!
//! **Needs from the cluster.** `on_success` hooks that target `Match` (every node); for the
//! semaphore, `set_resource` and `get_cluster_status` (its domain).
//!
//! **Limits.** A task that fails (after its retries) never raises its signal: its successors
//! stay pending, with the reason "no node has done-..." shown by the API, until the
//! application cancels them. A signal is raised on the nodes that are live at that moment; a
//! node that joins later lacks it, which only narrows where waiters may run. Signals outlive
//! their DAG until [`Dag::cleanup`] / [`Barrier::reset`], and a new run under the same name
//! would see the old ones: use a fresh name per run.

mod barrier;
mod dag;
mod semaphore;

pub use barrier::{Barrier, Side};
pub use dag::{Dag, DagPlan};
pub use semaphore::Semaphore;

use escher_proto::types::{Amount, Capacity, CapacityOp, ResourceName, ResourceUpdate};

use crate::policy::every_node;
use crate::{ClusterApi, EslError, ResourceSpec};

/// A single-shot signal: a resource that appears on every node when its raiser succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    name: ResourceName,
}

impl Signal {
    /// The signal carried by resource `name`.
    pub fn new(name: ResourceName) -> Signal {
        Signal { name }
    }

    /// Its resource.
    pub fn name(&self) -> &ResourceName {
        &self.name
    }

    /// The update that raises it: unbounded on every live node.
    pub fn raise(&self) -> ResourceUpdate {
        ResourceUpdate {
            name: self.name.clone(),
            op: CapacityOp::Set(Capacity::Unbounded),
            target: every_node(),
        }
    }

    /// The spec of the task that raises it when it succeeds.
    pub fn raiser(&self) -> ResourceSpec {
        ResourceSpec::new().on_success(self.raise())
    }

    /// The spec of a task that starts only after the signal is raised.
    pub fn waiter(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.name.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// The update that withdraws it from every node (tasks holding it keep it).
    pub fn withdraw(&self) -> ResourceUpdate {
        ResourceUpdate {
            name: self.name.clone(),
            op: CapacityOp::Delete,
            target: every_node(),
        }
    }
}

/// Withdraws signals, in one batch.
pub(crate) async fn withdraw_all<C: ClusterApi>(
    cluster: &C,
    signals: impl IntoIterator<Item = &Signal>,
) -> Result<(), EslError> {
    let updates: Vec<ResourceUpdate> = signals.into_iter().map(Signal::withdraw).collect();
    if !updates.is_empty() {
        cluster.set_resources(updates).await?;
    }
    Ok(())
}
