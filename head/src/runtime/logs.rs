//! Serving a task's output: from the worker that ran the attempt, or from the tail the head
//! kept when that worker is gone.
//!
//! The owner resolves a `TaskLogs` request to one attempt (the one asked for, or the latest)
//! and the node it ran on, and asks that node's worker (`FetchLogs`, which names the attempt).
//! The worker has the whole file; the head has only the last
//! [`OUTPUT_TAIL_BYTES`](escher_proto::types::OUTPUT_TAIL_BYTES) of each stream, from the
//! attempt's `TaskFinished`. When the worker is not connected, or answers that it no longer
//! has the file (its retention removed it, or it is a new machine under the old name), the
//! head serves the tail instead, and the reply's `notice` says so and what was lost.

use escher_proto::types::{LogChunk, LogStream, NodeId, OutputTail, TaskId};
use tokio::sync::oneshot;

/// Where the owner's answer to a `TaskLogs` request goes.
pub(crate) type LogReply = oneshot::Sender<Result<LogChunk, String>>;

/// A `FetchLogs` sent to a worker, waiting for its answer.
#[derive(Debug)]
pub(crate) struct PendingFetch {
    pub(crate) reply: LogReply,
    pub(crate) read: TailRead,
}

/// What to read from a kept tail, and what to say about it.
#[derive(Debug, Clone)]
pub(crate) struct TailRead {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    pub(crate) node: NodeId,
    pub(crate) stream: LogStream,
    pub(crate) offset: u64,
    pub(crate) max_bytes: u32,
    /// The tail the head kept of this attempt, if any.
    pub(crate) tail: Option<OutputTail>,
}

impl PendingFetch {
    /// Answers with what the worker sent, or with the kept tail if the worker could not.
    pub(crate) fn answer(self, from_worker: Result<LogChunk, String>) {
        let answer = match from_worker {
            Ok(chunk) => Ok(LogChunk {
                attempt: self.read.attempt,
                ..chunk
            }),
            Err(why) => {
                let node = self.read.node;
                self.read
                    .read_kept(&format!("node {node} could not read it ({why})"))
            }
        };
        let _ = self.reply.send(answer);
    }
}

impl TailRead {
    /// The chunk of the kept tail at the requested offset, with a notice that starts with
    /// `why` the worker's copy was not used; an error when the head kept no tail.
    pub(crate) fn read_kept(&self, why: &str) -> Result<LogChunk, String> {
        let TailRead {
            task,
            attempt,
            stream,
            ..
        } = *self;
        let Some(tail) = &self.tail else {
            return Err(format!(
                "{why}, and the head kept no output of attempt {attempt} of task {task} (it \
                 keeps the end of a command's output once the attempt ends)"
            ));
        };
        let (kept, len) = tail.stream(stream);
        let start = len - kept.len() as u64;
        let from = self.offset.clamp(start, len);
        // `start <= from <= len`, so the skip lies inside what was kept.
        let rest = &kept[usize::try_from(from - start).unwrap_or(kept.len())..];
        let room = match self.max_bytes {
            0 => rest.len(),
            n => rest.len().min(n as usize),
        };
        let data = rest[..room].to_vec();
        let next_offset = from + data.len() as u64;
        let lost = if self.offset < start {
            format!("; bytes {}..{start} of its {len} are lost", self.offset)
        } else {
            String::new()
        };
        let notice = format!(
            "{why}: read from the last {} bytes of attempt {attempt}'s {stream} that the head \
             kept{lost}",
            kept.len()
        );
        Ok(LogChunk {
            data,
            next_offset,
            eof: next_offset >= len,
            attempt,
            notice: Some(notice),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, max_bytes: u32, tail: Option<OutputTail>) -> TailRead {
        TailRead {
            task: TaskId(7),
            attempt: 2,
            node: NodeId(3),
            stream: LogStream::Stdout,
            offset,
            max_bytes,
            tail,
        }
    }

    fn tail() -> OutputTail {
        // A 10-byte stream of which the last 4 were kept.
        OutputTail {
            stdout: b"6789".to_vec(),
            stdout_len: 10,
            ..OutputTail::default()
        }
    }

    #[test]
    fn a_read_before_the_tail_starts_at_the_tail_and_says_what_was_lost() {
        let chunk = read(0, 0, Some(tail()))
            .read_kept("node 3 is gone")
            .unwrap();
        assert_eq!(chunk.data, b"6789");
        assert_eq!((chunk.next_offset, chunk.eof, chunk.attempt), (10, true, 2));
        let notice = chunk.notice.unwrap();
        assert!(notice.starts_with("node 3 is gone: read from the last 4 bytes"));
        assert!(notice.contains("bytes 0..6 of its 10 are lost"), "{notice}");
    }

    #[test]
    fn reads_inside_the_tail_page_and_end() {
        let first = read(7, 2, Some(tail())).read_kept("gone").unwrap();
        assert_eq!(first.data, b"78");
        assert_eq!((first.next_offset, first.eof), (9, false));
        assert!(!first.notice.unwrap().contains("lost"));
        let rest = read(9, 2, Some(tail())).read_kept("gone").unwrap();
        assert_eq!((rest.data.as_slice(), rest.eof), (&b"9"[..], true));
        let past = read(50, 2, Some(tail())).read_kept("gone").unwrap();
        assert_eq!((past.data.len(), past.next_offset, past.eof), (0, 10, true));
    }

    #[test]
    fn an_empty_stream_reads_as_empty_and_no_tail_is_an_error() {
        let empty = OutputTail::default();
        let chunk = read(0, 0, Some(empty)).read_kept("gone").unwrap();
        assert!(chunk.data.is_empty() && chunk.eof);
        let err = read(0, 0, None)
            .read_kept("node 3 is not connected")
            .unwrap_err();
        assert!(
            err.starts_with(
                "node 3 is not connected, and the head kept no output of \
             attempt 2 of task 7"
            ),
            "{err}"
        );
    }
}
