//! [`ResourceUpdateExt`]: short constructors for [`ResourceUpdate`], the body of
//! `set_resource` calls and of task hooks.
//!
//! ```
//! use escher_client::ResourceUpdateExt;
//! use escher_proto::{NodeSpec, ResourceUpdate};
//!
//! // The thesis' task signalling (P2): when t1 succeeds, its node gets `done-t1`.
//! let done = ResourceUpdate::set("done-t1", 1, NodeSpec::Local)?;
//! let slot = ResourceUpdate::adjust("slots", -1, NodeSpec::Local)?;
//! let gone = ResourceUpdate::delete("lock", NodeSpec::Local)?;
//! # Ok::<(), escher_client::ClientError>(())
//! ```

use escher_proto::{CapacityOp, NodeSpec, ResourceUpdate};

use crate::ClientError;
use crate::args::{IntoCapacity, IntoDelta, IntoResourceName};

/// Constructors for [`ResourceUpdate`] that take plain names and numbers.
///
/// Bring the trait into scope and call them as `ResourceUpdate::set(..)`. Each checks its
/// arguments and fails with [`ClientError::Invalid`] saying what was wrong.
pub trait ResourceUpdateExt: Sized {
    /// Make the capacity of `name` exactly `capacity` on `target` (creating it if absent; a
    /// capacity of 0 deletes it).
    fn set(
        name: impl IntoResourceName,
        capacity: impl IntoCapacity,
        target: NodeSpec,
    ) -> Result<Self, ClientError>;

    /// Change the capacity of `name` by `delta` on `target` (creating it from zero if absent;
    /// reaching zero deletes it). Concurrent adjustments never lose each other.
    fn adjust(
        name: impl IntoResourceName,
        delta: impl IntoDelta,
        target: NodeSpec,
    ) -> Result<Self, ClientError>;

    /// Delete `name` on `target`. Tasks holding it keep it until they finish.
    fn delete(name: impl IntoResourceName, target: NodeSpec) -> Result<Self, ClientError>;
}

impl ResourceUpdateExt for ResourceUpdate {
    fn set(
        name: impl IntoResourceName,
        capacity: impl IntoCapacity,
        target: NodeSpec,
    ) -> Result<Self, ClientError> {
        Ok(ResourceUpdate {
            name: name.into_resource_name()?,
            op: CapacityOp::Set(capacity.into_capacity()?),
            target,
        })
    }

    fn adjust(
        name: impl IntoResourceName,
        delta: impl IntoDelta,
        target: NodeSpec,
    ) -> Result<Self, ClientError> {
        Ok(ResourceUpdate {
            name: name.into_resource_name()?,
            op: CapacityOp::Adjust(delta.into_delta()?),
            target,
        })
    }

    fn delete(name: impl IntoResourceName, target: NodeSpec) -> Result<Self, ClientError> {
        Ok(ResourceUpdate {
            name: name.into_resource_name()?,
            op: CapacityOp::Delete,
            target,
        })
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::{Amount, Capacity, NodeId};

    use super::*;

    #[test]
    fn builds_each_operation() {
        let u = ResourceUpdate::set("done-t1", 1, NodeSpec::Local).unwrap();
        assert_eq!(u.name.as_str(), "done-t1");
        assert_eq!(u.op, CapacityOp::Set(Capacity::Finite(Amount::ONE)));
        let u = ResourceUpdate::set("loc", "unbounded", NodeSpec::Node(NodeId(3))).unwrap();
        assert_eq!(u.op, CapacityOp::Set(Capacity::Unbounded));
        let u = ResourceUpdate::adjust("slots", -2, NodeSpec::Local).unwrap();
        assert_eq!(u.op, CapacityOp::Adjust("-2".parse().unwrap()));
        let u = ResourceUpdate::delete("lock", NodeSpec::Local).unwrap();
        assert_eq!(u.op, CapacityOp::Delete);
        let err = ResourceUpdate::set("b@d", 1, NodeSpec::Local).unwrap_err();
        assert!(matches!(err, ClientError::Invalid(_)), "{err}");
        assert!(ResourceUpdate::set("x", "-1", NodeSpec::Local).is_err());
    }
}
