//! Conversions of the head's object messages: an object's id, what the head knows of an object
//! (`LocateObject`, `ListObjects`) and the ids a release or a delete names.

use super::cluster::{namespace, namespace_to_wire};
use super::{ConvertError, check_count, required};
use crate::types::{NodeId, ObjectHolder, ObjectId, ObjectLoss, ObjectOwner, ObjectView, TaskId};
use crate::wire;

/// The most object ids one message names (a release batch, a delete, a listing).
pub const MAX_OBJECT_IDS: usize = 100_000;

impl From<ObjectId> for wire::ObjectKey {
    fn from(id: ObjectId) -> Self {
        wire::ObjectKey {
            owner: id.owner(),
            index: id.index(),
        }
    }
}

impl From<wire::ObjectKey> for ObjectId {
    fn from(k: wire::ObjectKey) -> Self {
        ObjectId(k.owner, k.index)
    }
}

/// A required object id.
pub fn object_id(key: Option<wire::ObjectKey>, field: &str) -> Result<ObjectId, ConvertError> {
    required(key, field).map(ObjectId::from)
}

/// Refuses more than [`MAX_OBJECT_IDS`] items in `field`.
pub fn check_object_count(field: &str, len: usize) -> Result<(), ConvertError> {
    check_count(field, len, MAX_OBJECT_IDS)
}

/// A list of object ids, bounded by [`MAX_OBJECT_IDS`].
pub fn object_ids(keys: Vec<wire::ObjectKey>, field: &str) -> Result<Vec<ObjectId>, ConvertError> {
    check_count(field, keys.len(), MAX_OBJECT_IDS)?;
    Ok(keys.into_iter().map(ObjectId::from).collect())
}

impl From<ObjectView> for wire::ObjectInfo {
    fn from(v: ObjectView) -> Self {
        let owner = match v.owner {
            ObjectOwner::Session(s) => wire::object_info::Owner::Session(s),
            ObjectOwner::Task(t) => wire::object_info::Owner::Task(t.0),
        };
        wire::ObjectInfo {
            id: Some(v.id.into()),
            namespace: namespace_to_wire(v.namespace),
            size: v.size,
            crc32c: v.checksum,
            owner: Some(owner),
            sealed_at_ms: v.sealed_at_ms,
            holders: v
                .holders
                .into_iter()
                .map(|h| wire::ObjectHolder {
                    node: h.node.0,
                    address: h.address,
                    ticket: h.ticket,
                })
                .collect(),
            lost_node: v.lost.as_ref().map(|l| l.node.0),
            lost_reason: v.lost.map(|l| l.reason),
        }
    }
}

impl TryFrom<wire::ObjectInfo> for ObjectView {
    type Error = ConvertError;
    fn try_from(w: wire::ObjectInfo) -> Result<Self, ConvertError> {
        let owner = match required(w.owner, "owner")? {
            wire::object_info::Owner::Session(s) => ObjectOwner::Session(s),
            wire::object_info::Owner::Task(t) => ObjectOwner::Task(TaskId(t)),
        };
        check_count("holders", w.holders.len(), MAX_OBJECT_IDS)?;
        let lost = match (w.lost_node, w.lost_reason) {
            (Some(node), reason) => Some(ObjectLoss {
                node: NodeId(node),
                reason: reason.unwrap_or_default(),
            }),
            (None, _) => None,
        };
        Ok(ObjectView {
            id: object_id(w.id, "id")?,
            namespace: namespace(w.namespace)?,
            size: w.size,
            checksum: w.crc32c,
            owner,
            sealed_at_ms: w.sealed_at_ms,
            holders: w
                .holders
                .into_iter()
                .map(|h| ObjectHolder {
                    node: NodeId(h.node),
                    address: h.address,
                    ticket: h.ticket,
                })
                .collect(),
            lost,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Namespace;

    #[test]
    fn an_object_view_round_trips_and_a_missing_id_is_named() {
        let view = ObjectView {
            id: ObjectId(1 << 63, 4),
            namespace: Some(Namespace::new("team-a").unwrap()),
            size: 1 << 20,
            checksum: 0xfeed_f00d,
            owner: ObjectOwner::Session(1 << 63),
            sealed_at_ms: 1_700_000_000_000,
            holders: vec![ObjectHolder {
                node: NodeId(3),
                address: Some("10.0.0.3:7700".into()),
                ticket: Some("o1.x".into()),
            }],
            lost: Some(ObjectLoss {
                node: NodeId(2),
                reason: "heartbeat timeout".into(),
            }),
        };
        let wire: wire::ObjectInfo = view.clone().into();
        assert_eq!(ObjectView::try_from(wire.clone()).unwrap(), view);
        let mut missing = wire;
        missing.id = None;
        let err = ObjectView::try_from(missing).unwrap_err();
        assert!(err.to_string().contains("id"), "{err}");
        let too_many = vec![wire::ObjectKey::default(); MAX_OBJECT_IDS + 1];
        assert!(object_ids(too_many, "ids").is_err());
    }
}
