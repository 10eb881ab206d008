//! Resource names interned to dense integer ids, so the core compares and hashes integers.

use escher_proto::types::ResourceName;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// A resource name's id inside one [`Scheduler`](super::Scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct ResourceId(pub(crate) u32);

/// Two-way map between names and ids. Ids are handed out in first-seen order, so the same
/// events give the same ids. Names are never forgotten: the table grows with the number of
/// distinct names ever used, a few dozen bytes each.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Interner {
    #[serde(serialize_with = "super::sorted::sorted")]
    ids: FxHashMap<ResourceName, ResourceId>,
    names: Vec<ResourceName>,
}

impl Interner {
    /// The id of `name`, creating one if it is new.
    pub(crate) fn intern(&mut self, name: &ResourceName) -> ResourceId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = ResourceId(self.names.len() as u32);
        self.names.push(name.clone());
        self.ids.insert(name.clone(), id);
        id
    }

    /// The id of `name` if it has one.
    pub(crate) fn get(&self, name: &str) -> Option<ResourceId> {
        self.ids.get(name).copied()
    }

    /// The name behind `id`.
    pub(crate) fn name(&self, id: ResourceId) -> &ResourceName {
        &self.names[id.0 as usize]
    }
}
