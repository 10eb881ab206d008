//! Batching a link's messages without a timer.
//!
//! [`Batches`] turns a stream of protobuf messages into a stream of batches. A batch holds the
//! next message and every further one that is ready at that moment, up to [`MAX_MESSAGES`]
//! messages or [`MAX_BYTES`] encoded bytes (a single larger message goes alone). It never
//! waits for more: when little happens, a message goes out alone as soon as the transport asks
//! for it; under load the transport's own pace (it asks for the next batch once the previous
//! one is written) makes the batches large. The worker link sends `WorkerBatch` and
//! `HeadBatch` this way in both directions.
//!
//! A batch ends where the inner stream says Pending, and a tokio channel also says so after
//! 128 messages in one poll (tokio's cooperative budget, so that one busy task does not starve
//! the others): from a tokio channel a batch holds at most 128 messages.

use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use tokio_stream::Stream;

/// The most messages in one batch.
pub const MAX_MESSAGES: usize = 1024;

/// The most encoded bytes in one batch of more than one message: well under the links'
/// 64 MiB message limit, so that batching never makes a message too large to receive.
pub const MAX_BYTES: usize = 1 << 20;

/// A stream of batches of the messages of `S`. See the [module documentation](self).
#[derive(Debug)]
pub struct Batches<S: Stream> {
    inner: S,
    /// A message that did not fit the last batch: the first of the next.
    carry: Option<S::Item>,
    ended: bool,
}

impl<S: Stream> Batches<S> {
    /// Batches the messages of `inner`.
    pub fn new(inner: S) -> Self {
        Batches {
            inner,
            carry: None,
            ended: false,
        }
    }
}

impl<S> Stream for Batches<S>
where
    S: Stream + Unpin,
    S::Item: prost::Message + Unpin,
{
    type Item = Vec<S::Item>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut batch = Vec::new();
        let mut bytes = 0;
        if let Some(first) = this.carry.take() {
            bytes += first.encoded_len();
            batch.push(first);
        }
        while !this.ended && batch.len() < MAX_MESSAGES {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(msg)) => {
                    let len = msg.encoded_len();
                    if !batch.is_empty() && bytes + len > MAX_BYTES {
                        this.carry = Some(msg);
                        break;
                    }
                    bytes += len;
                    batch.push(msg);
                }
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => break,
            }
        }
        match (batch.is_empty(), this.ended) {
            (false, _) => Poll::Ready(Some(batch)),
            (true, true) => Poll::Ready(None),
            // `inner` returned Pending and will wake this task.
            (true, false) => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use tokio_stream::StreamExt;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;
    use crate::wire;

    fn heartbeat(metrics: usize) -> wire::WorkerMessage {
        let metric = wire::Metric {
            name: "x".repeat(64),
            value: 1.0,
        };
        wire::WorkerMessage {
            body: Some(wire::worker_message::Body::Heartbeat(wire::Heartbeat {
                seq: 1,
                metrics: vec![metric; metrics],
                fence: String::new(),
                actors: Vec::new(),
            })),
        }
    }

    #[tokio::test]
    async fn what_is_ready_goes_in_one_batch_and_nothing_waits_for_more() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut batches = Batches::new(UnboundedReceiverStream::new(rx));
        for _ in 0..3 {
            tx.send(heartbeat(1)).unwrap();
        }
        assert_eq!(batches.next().await.unwrap().len(), 3);
        // One message alone is sent alone, at once.
        tx.send(heartbeat(1)).unwrap();
        assert_eq!(batches.next().await.unwrap().len(), 1);
        // Nothing ready: the stream waits (and is woken by the next message).
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), batches.next());
        assert!(waiting.await.is_err());
        tx.send(heartbeat(1)).unwrap();
        assert_eq!(batches.next().await.unwrap().len(), 1);
        drop(tx);
        assert!(batches.next().await.is_none());
    }

    /// A stream that always has its next message ready (no cooperative budget).
    struct Ready(std::collections::VecDeque<wire::WorkerMessage>);

    impl Stream for Ready {
        type Item = wire::WorkerMessage;
        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.get_mut().0.pop_front())
        }
    }

    #[tokio::test]
    async fn batches_are_bounded_in_messages_and_bytes_and_keep_the_order() {
        let ready = Ready((0..MAX_MESSAGES + 5).map(|_| heartbeat(1)).collect());
        let sizes: Vec<usize> = Batches::new(ready).map(|b| b.len()).collect().await;
        assert_eq!(sizes, vec![MAX_MESSAGES, 5]);

        // From a tokio channel, the cooperative budget (128 today) may end a batch sooner.
        let (tx, rx) = mpsc::unbounded_channel();
        let mut batches = Batches::new(UnboundedReceiverStream::new(rx));
        for _ in 0..200 {
            tx.send(heartbeat(1)).unwrap();
        }
        let first = batches.next().await.unwrap().len();
        assert!((2..=200).contains(&first), "{first}");
        let mut seen = first;
        while seen < 200 {
            seen += batches.next().await.unwrap().len();
        }
        assert_eq!(seen, 200);

        // Messages of about 300 KiB: three fit under MAX_BYTES, the fourth starts the next
        // batch; one message over the limit still goes, alone.
        let big = heartbeat(4_000);
        let len = prost::Message::encoded_len(&big);
        assert!(len > MAX_BYTES / 4 && len < MAX_BYTES / 3);
        let huge = heartbeat(20_000);
        assert!(prost::Message::encoded_len(&huge) > MAX_BYTES);
        for _ in 0..4 {
            tx.send(big.clone()).unwrap();
        }
        tx.send(huge.clone()).unwrap();
        tx.send(heartbeat(1)).unwrap();
        drop(tx);
        let sizes: Vec<usize> = batches.map(|b| b.len()).collect().await;
        assert_eq!(sizes, vec![3, 1, 1, 1]);
    }

    #[tokio::test]
    async fn messages_keep_their_order_across_batches() {
        let (tx, rx) = mpsc::unbounded_channel();
        let batches = Batches::new(UnboundedReceiverStream::new(rx));
        for i in 0..3_000 {
            tx.send(heartbeat(i % 3)).unwrap();
        }
        drop(tx);
        let batches: Vec<Vec<wire::WorkerMessage>> = batches.collect().await;
        let all: Vec<wire::WorkerMessage> = batches.into_iter().flatten().collect();
        let expected: Vec<_> = (0..3_000).map(|i| heartbeat(i % 3)).collect();
        assert_eq!(all, expected);
    }
}
