//! How replicated things are encoded: log entries (a batch of [`Entry`]s per raft entry,
//! bincode), snapshots (the whole [`ClusterState`] and the group's addresses, bincode), and the
//! address a membership change carries (UTF-8, in the conf-change entry's context).
//!
//! bincode's standard configuration (variable-length integers, little endian) is used for both;
//! it is fixed here, once, so that every replica and every restart reads what was written.
//!
//! # Data formats (DESIGN §14)
//!
//! The encoded layout of entries and snapshots is the **data format**, numbered. Format 1 is
//! the bincode of today's types, with no prefix (as every release so far wrote it). A later
//! format is written behind an envelope, `[0xFF, b'E', version (u16, little endian)]`, which
//! no format-1 value can start with (bincode's first byte of a format-1 entry batch or image is
//! a sequence length, and `0xFF` is none). This build reads every format up to
//! [`DATA_FORMAT`] and refuses a newer one naming both versions ([`CodecError::Newer`]), so a
//! replica is never wrong about what it cannot read.
//!
//! It writes the lowest format its group can read: format 1, unprefixed, as long as the layout
//! is unchanged. A build that changes an encoded type adds format 2, keeps decoding format 1
//! (fixtures of format 1 are in `tests/fixtures/data-format-1/` and a test opens them), and
//! writes format 2 only once every replica of its group reads it: so a group upgraded one
//! replica at a time keeps replicating throughout.

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
    #[error(
        "cannot decode {what}: {source}; it is damaged, or was not written by an escher-head \
         (every data format a release wrote is read by the later ones)"
    )]
    Decode {
        /// What.
        what: &'static str,
        /// Why.
        source: bincode::error::DecodeError,
    },
    /// Written in a data format newer than this build reads.
    #[error(
        "{what} is in data format {found}, newer than this escher-head reads (formats 1 to \
         {supported}): it was written by a later release; run that release (or a later one) on \
         this replica"
    )]
    Newer {
        /// What.
        what: &'static str,
        /// The format of the bytes.
        found: u16,
        /// The newest format this build reads.
        supported: u16,
    },
}

/// The newest data format this build reads (and, while its group reads no newer one, the one it
/// writes; see the module documentation).
pub const DATA_FORMAT: u16 = 1;

/// The start of a data-format envelope (formats from 2 on).
const ENVELOPE: [u8; 2] = [0xFF, b'E'];

/// The data format of `bytes` and the encoded value after its envelope, if it has one.
fn unwrap<'a>(bytes: &'a [u8], what: &'static str) -> Result<(u16, &'a [u8]), CodecError> {
    match bytes {
        [a, b, lo, hi, rest @ ..] if [*a, *b] == ENVELOPE => {
            let found = u16::from_le_bytes([*lo, *hi]);
            if found > DATA_FORMAT {
                return Err(CodecError::Newer {
                    what,
                    found,
                    supported: DATA_FORMAT,
                });
            }
            Ok((found, rest))
        }
        _ => Ok((1, bytes)),
    }
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

/// Decodes the entries of one raft log entry, of any data format this build reads.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Vec<Entry>, CodecError> {
    // Format 1 is the only layout so far: every version decodes alike.
    let (_format, bytes) = unwrap(bytes, "a log entry")?;
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

/// Encodes a backup of `state`: a snapshot image with no replica addresses (the group that is
/// restored from it names its own).
pub fn encode_backup(state: &ClusterState) -> Result<Vec<u8>, CodecError> {
    encode_image(state, &BTreeMap::new())
}

/// Decodes a backup image (see [`encode_backup`]) into a state that applies `config`.
pub fn decode_backup(bytes: &[u8], config_: StateConfig) -> Result<ClusterState, CodecError> {
    decode_image(bytes, config_).map(|(state, _)| state)
}

/// Decodes a snapshot into a state that applies `config`, and the replica addresses.
pub(crate) fn decode_image(
    bytes: &[u8],
    config_: StateConfig,
) -> Result<(ClusterState, BTreeMap<u64, String>), CodecError> {
    let (_format, bytes) = unwrap(bytes, "a snapshot")?;
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

    #[test]
    fn format_one_is_written_bare_read_in_an_envelope_too_and_a_newer_one_is_refused() {
        let batch = vec![Entry::new(7, Command::Tick)];
        let bare = encode_batch(&batch).unwrap();
        assert_ne!(bare[0], 0xFF, "format 1 is written without an envelope");
        let mut wrapped = vec![0xFF, b'E', 1, 0];
        wrapped.extend_from_slice(&bare);
        assert_eq!(decode_batch(&wrapped).unwrap(), batch);

        let mut newer = vec![0xFF, b'E', 2, 0];
        newer.extend_from_slice(&bare);
        let err = decode_batch(&newer).unwrap_err();
        assert!(matches!(
            err,
            CodecError::Newer {
                found: 2,
                supported: DATA_FORMAT,
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("data format 2") && text.contains("formats 1 to 1"),
            "{text}"
        );
        let state = ClusterState::new(StateConfig::default());
        let mut image = vec![0xFF, b'E', 9, 0];
        image.extend(encode_image(&state, &BTreeMap::new()).unwrap());
        let err = decode_image(&image, StateConfig::default()).unwrap_err();
        assert!(err.to_string().contains("data format 9"), "{err}");
    }
}
