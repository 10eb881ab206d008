//! `WatchResponse` as it travels, written by hand rather than generated: its events are kept
//! encoded, so that a head sending one event to many watchers encodes it once (each message
//! then only copies bytes). On the wire it is exactly the `WatchResponse` of `escher.proto`
//! (`repeated WatchEvent events = 1; uint64 revision = 2;`): an embedded message and a `bytes`
//! field are both length-delimited, so any protobuf client reads it as declared there.

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use super::wire::WatchEvent;

/// A batch of watch events, each an encoded [`WatchEvent`].
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct WatchResponse {
    /// The events, each the encoding of one [`WatchEvent`] message.
    pub events: Vec<Bytes>,
    /// The revision the watcher has seen everything up to.
    pub revision: u64,
}

impl WatchResponse {
    /// Encodes one event for [`WatchResponse::events`].
    pub fn encode_event(event: &WatchEvent) -> Bytes {
        Bytes::from(event.encode_to_vec())
    }

    /// Decodes the events.
    pub fn decode_events(&self) -> Result<Vec<WatchEvent>, DecodeError> {
        self.events
            .iter()
            .map(|bytes| WatchEvent::decode(bytes.clone()))
            .collect()
    }
}

impl Message for WatchResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for event in &self.events {
            encoding::bytes::encode(1, event, buf);
        }
        if self.revision != 0 {
            encoding::uint64::encode(2, &self.revision, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => encoding::bytes::merge_repeated(wire_type, &mut self.events, buf, ctx),
            2 => encoding::uint64::merge(wire_type, &mut self.revision, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let revision = if self.revision != 0 {
            encoding::uint64::encoded_len(2, &self.revision)
        } else {
            0
        };
        encoding::bytes::encoded_len_repeated(1, &self.events) + revision
    }

    fn clear(&mut self) {
        self.events.clear();
        self.revision = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message as `escher.proto` declares it, generated the usual way.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Declared {
        #[prost(message, repeated, tag = "1")]
        events: Vec<WatchEvent>,
        #[prost(uint64, tag = "2")]
        revision: u64,
    }

    fn event(revision: u64) -> WatchEvent {
        WatchEvent {
            revision,
            at_ms: 7,
            event: Some(super::super::wire::watch_event::Event::Started(
                super::super::wire::TaskStartedEvent {
                    task_id: 3,
                    node: 1,
                    attempt: 1,
                    namespace: String::new(),
                },
            )),
        }
    }

    #[test]
    fn reads_and_writes_the_declared_message() {
        let declared = Declared {
            events: vec![event(1), event(2)],
            revision: 2,
        };
        let ours = WatchResponse {
            events: declared
                .events
                .iter()
                .map(WatchResponse::encode_event)
                .collect(),
            revision: 2,
        };
        assert_eq!(ours.encode_to_vec(), declared.encode_to_vec());
        assert_eq!(ours.encoded_len(), declared.encoded_len());
        let back = WatchResponse::decode(&declared.encode_to_vec()[..]).unwrap();
        assert_eq!(back.decode_events().unwrap(), declared.events);
        assert_eq!(back.revision, 2);
        let empty = WatchResponse::decode(&[][..]).unwrap();
        assert_eq!(empty, WatchResponse::default());
    }
}
