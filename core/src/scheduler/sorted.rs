//! Snapshots of the core are canonical: its hash maps are written in key order, so that two
//! cores in the same state (one restored from a snapshot, one never restored) write the same
//! bytes, although their maps' iteration orders differ.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use serde::{Serialize, Serializer};

/// Serializes a hash map as its entries in key order (`#[serde(serialize_with)]`).
pub(crate) fn sorted<S, K, V, H>(map: &HashMap<K, V, H>, serializer: S) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    K: Ord + Serialize,
    V: Serialize,
    H: BuildHasher,
{
    let ordered: BTreeMap<&K, &V> = map.iter().collect();
    ordered.serialize(serializer)
}
