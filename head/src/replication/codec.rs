//! How replicated things are encoded: log entries (a batch of [`Entry`]s per raft entry,
//! bincode), snapshots (the whole [`ClusterState`] and the group's addresses, bincode), and the
//! address a membership change carries (UTF-8, in the conf-change entry's context).
//!
//! bincode's standard configuration (variable-length integers, little endian) is used for both;
//! it is fixed here, once, so that every replica and every restart reads what was written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::state::{ClusterState, Entry, StateConfig};

/// A replicated value could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// Encoding failed (a bug: every value here is encodable).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What.
        what: &'static str,
        /// Why.
        source: bincode::error::EncodeError,
    },
    /// The bytes are not what this version writes (corruption, or another version).
    #[error("cannot decode {what}: {source}")]
    Decode {
        /// What.
        what: &'static str,
        /// Why.
        source: bincode::error::DecodeError,
    },
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes the entries of one raft log entry.
pub(crate) fn encode_batch(entries: &[Entry]) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(entries, config()).map_err(|source| CodecError::Encode {
        what: "a log entry",
        source,
    })
}

/// Decodes the entries of one raft log entry.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Vec<Entry>, CodecError> {
    bincode::serde::decode_from_slice(bytes, config())
        .map(|(entries, _)| entries)
        .map_err(|source| CodecError::Decode {
            what: "a log entry",
            source,
        })
}

/// What a snapshot holds, as written.
#[derive(Serialize)]
struct ImageRef<'a> {
    state: &'a ClusterState,
    members: &'a BTreeMap<u64, String>,
}

/// What a snapshot holds, as read.
#[derive(Deserialize)]
struct Image {
    state: ClusterState,
    members: BTreeMap<u64, String>,
}

/// Encodes a snapshot of `state` and the group's replica addresses.
pub(crate) fn encode_image(
    state: &ClusterState,
    members: &BTreeMap<u64, String>,
) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(ImageRef { state, members }, config()).map_err(|source| {
        CodecError::Encode {
            what: "a snapshot",
            source,
        }
    })
}

/// Decodes a snapshot into a state that applies `config`, and the replica addresses.
pub(crate) fn decode_image(
    bytes: &[u8],
    config_: StateConfig,
) -> Result<(ClusterState, BTreeMap<u64, String>), CodecError> {
    let (image, _): (Image, usize) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(|source| {
            CodecError::Decode {
                what: "a snapshot",
                source,
            }
        })?;
    Ok((image.state.restore(config_), image.members))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    #[test]
    fn entries_and_images_round_trip() {
        let batch = vec![Entry::new(42, Command::Tick), Entry::new(42, Command::Tick)];
        assert_eq!(decode_batch(&encode_batch(&batch).unwrap()).unwrap(), batch);
        assert!(decode_batch(&[0xff, 0xff, 0xff]).is_err());
        let state = ClusterState::new(StateConfig::default());
        let members = BTreeMap::from([(1, "127.0.0.1:7600".to_string())]);
        let bytes = encode_image(&state, &members).unwrap();
        let (back, m) = decode_image(&bytes, StateConfig::default()).unwrap();
        assert_eq!(m, members);
        assert_eq!(encode_image(&back, &m).unwrap(), bytes);
    }
}
