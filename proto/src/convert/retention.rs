//! The [`Evicted`] answer at the gRPC edge: a `NOT_FOUND` status whose message says what
//! happened and whose `escher-evicted-bin` metadata carries the encoded [`wire::Evicted`], so a
//! client tells "evicted by retention" from "unknown task" without reading the text.

use prost::Message;

use super::task::{task_state, task_state_to_wire};
use super::{ConvertError, Problem};
use crate::types::{Evicted, TaskId, Tombstone};
use crate::wire;

/// The binary metadata key that carries an [`Evicted`] on a status.
pub const EVICTED_METADATA: &str = "escher-evicted-bin";

impl From<Evicted> for wire::Evicted {
    fn from(e: Evicted) -> Self {
        wire::Evicted {
            id: e.id.0,
            state: e.tombstone.map_or(0, |t| task_state_to_wire(t.state)),
            finished_at_ms: e.tombstone.map(|t| t.finished_at_ms),
        }
    }
}

impl TryFrom<wire::Evicted> for Evicted {
    type Error = ConvertError;
    fn try_from(w: wire::Evicted) -> Result<Self, ConvertError> {
        let tombstone = match (w.state, w.finished_at_ms) {
            (0, None) => None,
            (state, Some(finished_at_ms)) => {
                let state = task_state(state, "state")?;
                if !state.is_terminal() {
                    let why = Problem::Rule("an evicted task's state is a final one");
                    return Err(ConvertError::new("state", why));
                }
                Some(Tombstone {
                    state,
                    finished_at_ms,
                })
            }
            (_, None) => return Err(ConvertError::missing("finished_at_ms")),
        };
        Ok(Evicted {
            id: TaskId(w.id),
            tombstone,
        })
    }
}

impl Evicted {
    /// The status that answers a call about this task: `NOT_FOUND`, the sentence, and the
    /// typed answer in the `escher-evicted-bin` metadata.
    pub fn into_status(self) -> tonic::Status {
        let mut status = tonic::Status::not_found(self.to_string());
        let bytes = wire::Evicted::from(self).encode_to_vec();
        status.metadata_mut().insert_bin(
            EVICTED_METADATA,
            tonic::metadata::MetadataValue::from_bytes(&bytes),
        );
        status
    }

    /// The eviction a status carries, if it is one (see [`Evicted::into_status`]).
    pub fn from_status(status: &tonic::Status) -> Option<Evicted> {
        if status.code() != tonic::Code::NotFound {
            return None;
        }
        let bytes = status
            .metadata()
            .get_bin(EVICTED_METADATA)?
            .to_bytes()
            .ok()?;
        let message = wire::Evicted::decode(bytes.as_ref()).ok()?;
        Evicted::try_from(message).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::round_trip;
    use crate::types::TaskState;

    fn samples() -> [Evicted; 2] {
        [
            Evicted {
                id: TaskId(9),
                tombstone: Some(Tombstone {
                    state: TaskState::Cancelled,
                    finished_at_ms: 1_700_000_000_123,
                }),
            },
            Evicted {
                id: TaskId(10),
                tombstone: None,
            },
        ]
    }

    #[test]
    fn evictions_round_trip_through_the_wire_and_a_status() {
        for e in samples() {
            round_trip::<_, wire::Evicted>(e);
            let status = e.into_status();
            assert_eq!(status.code(), tonic::Code::NotFound);
            assert_eq!(status.message(), e.to_string());
            assert_eq!(Evicted::from_status(&status), Some(e));
        }
    }

    #[test]
    fn other_statuses_are_not_evictions() {
        assert_eq!(
            Evicted::from_status(&tonic::Status::not_found("unknown task 3")),
            None
        );
        let mut other = samples()[0].into_status();
        *other.metadata_mut() = tonic::metadata::MetadataMap::new();
        assert_eq!(Evicted::from_status(&other), None);
    }

    #[test]
    fn a_tombstone_needs_a_final_state_and_a_time() {
        let running = wire::Evicted {
            id: 1,
            state: wire::TaskState::Running as i32,
            finished_at_ms: Some(5),
        };
        assert!(Evicted::try_from(running).is_err());
        let timeless = wire::Evicted {
            id: 1,
            state: wire::TaskState::Failed as i32,
            finished_at_ms: None,
        };
        assert_eq!(
            Evicted::try_from(timeless).unwrap_err().to_string(),
            "missing field finished_at_ms"
        );
    }
}
