//! Domain types: what a resource is called, how much of it there is, where it lives.
//!
//! These types are the contract between applications, the head and the workers. Each one
//! validates on construction, so a value of the type is always well-formed.

mod amount;
mod delta;
mod error;
mod ids;
mod labels;
mod name;
mod node_spec;
mod resource_set;
mod task;

pub use amount::{Amount, Capacity};
pub use delta::{CapacityOp, Delta};
pub use error::TypeError;
pub use ids::{NodeId, TaskId};
pub use labels::Labels;
pub use name::{Namespace, ResourceKind, ResourceName};
pub use node_spec::NodeSpec;
pub use resource_set::ResourceSet;
pub use task::{ResourceUpdate, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus};
