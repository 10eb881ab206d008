//! [`NodeObjects`]: this node's object store and the namespace of each object in it, shared by
//! the data plane's `Objects` service (`service.rs`), the fetcher (`fetch.rs`) and the runner.
//!
//! The store knows nothing of namespaces; the data plane does: a copy sealed by a push or a
//! fetch records the namespace its ticket named, and a fetch whose ticket names another
//! namespace is refused. A copy with no record (one the worker stored itself, as a task's
//! result, before recording it) is served to any valid ticket for it, the head's signature
//! being the authority.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{ObjectError, ObjectId, ObjectStore};

/// This node's objects: cheap to clone, one store shared.
#[derive(Debug, Clone)]
pub struct NodeObjects {
    store: ObjectStore,
    namespaces: Arc<Mutex<HashMap<ObjectId, Option<String>>>>,
}

impl NodeObjects {
    /// The objects of `store`, none of them in a namespace yet.
    pub fn new(store: ObjectStore) -> NodeObjects {
        NodeObjects {
            store,
            namespaces: Arc::default(),
        }
    }

    /// The store.
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Records that object `id` belongs to `namespace` (`None`: an admin's).
    pub fn record(&self, id: ObjectId, namespace: Option<String>) {
        self.lock().insert(id, namespace);
    }

    /// The namespace recorded for object `id`: `None` when none was, `Some(None)` for an
    /// admin's object.
    pub fn namespace(&self, id: ObjectId) -> Option<Option<String>> {
        self.lock().get(&id).cloned()
    }

    /// Deletes object `id` from the store and forgets its namespace.
    pub fn delete(&self, id: ObjectId) -> Result<(), ObjectError> {
        self.lock().remove(&id);
        self.store.delete(id)
    }

    /// Deletes object `id`'s copy `copy` ([`ObjectStore::delete_copy`]), forgetting its
    /// namespace when it goes; whether it went.
    pub fn delete_copy(&self, id: ObjectId, copy: u64) -> Result<bool, ObjectError> {
        let mut namespaces = self.lock();
        let gone = self.store.delete_copy(id, copy)?;
        if gone {
            namespaces.remove(&id);
        }
        Ok(gone)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectId, Option<String>>> {
        self.namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
