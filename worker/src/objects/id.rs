//! [`ObjectId`], the name of an object: defined in `escher-proto` (every side of a transfer
//! names objects the same way) and re-exported here for the store's users.

pub use escher_proto::types::{ObjectId, ParseObjectIdError};
