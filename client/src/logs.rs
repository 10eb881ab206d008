//! [`LogReader`]: reads a command task's stdout or stderr from the head, piece by piece.
//!
//! The head serves output in chunks (`TaskLogs`: an offset in, bytes, the next offset and an
//! end-of-stream flag out). A reader keeps the offset, so it can read what is there now
//! ([`LogReader::read_available`]) or follow a running task ([`LogReader::next_chunk`] in a
//! loop, sleeping while nothing is new).
//!
//! A reader reads one attempt: the one given with [`LogReader::attempt`], else the latest when
//! it first reads, and that one from then on, so that a retry starting meanwhile does not
//! splice another attempt's bytes into the stream. When the worker that ran the attempt is
//! gone, the head answers from the tail of the output it kept, and says so
//! ([`LogReader::notice`]).

use escher_proto::types::{LogChunk, TaskLogsRequest};
use escher_proto::{LogStream, TaskId, wire};

use crate::{Client, ClientError};

/// Reads one output stream of one task, remembering how far it has read.
#[derive(Debug, Clone)]
pub struct LogReader {
    client: Client,
    task: TaskId,
    stream: LogStream,
    attempt: Option<u32>,
    offset: u64,
    eof: bool,
    notice: Option<String>,
}

impl LogReader {
    pub(crate) fn new(client: Client, task: TaskId, stream: LogStream) -> LogReader {
        LogReader {
            client,
            task,
            stream,
            attempt: None,
            offset: 0,
            eof: false,
            notice: None,
        }
    }

    /// Reads attempt `attempt` (numbered from 1) instead of the latest.
    pub fn attempt(mut self, attempt: u32) -> LogReader {
        self.attempt = Some(attempt);
        self
    }

    /// The attempt being read: the one asked for, or the latest once the first read found it.
    pub fn current_attempt(&self) -> Option<u32> {
        self.attempt
    }

    /// What the head said about the last piece when it did not come from the worker that ran
    /// the attempt (the worker is gone; only the tail the head kept is left).
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// The byte offset of the next read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the stream is complete and everything has been read.
    pub fn is_eof(&self) -> bool {
        self.eof
    }

    /// The next piece of output: `None` once the stream is complete and fully read, an empty
    /// piece when the task is still running and has written nothing new.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        if self.eof {
            return Ok(None);
        }
        let request = TaskLogsRequest {
            task_id: self.task,
            stream: self.stream,
            offset: self.offset,
            max_bytes: 0,
            attempt: self.attempt,
        };
        let request = wire::TaskLogsRequest::from(request);
        let reply = self
            .client
            .call(|mut rpc| async move { rpc.task_logs(request).await })
            .await?;
        let chunk = LogChunk::from(reply);
        // Never move backwards, whatever the head says.
        self.offset = chunk.next_offset.max(self.offset + chunk.data.len() as u64);
        self.eof = chunk.eof;
        self.notice = chunk.notice;
        if chunk.attempt != 0 {
            self.attempt.get_or_insert(chunk.attempt);
        }
        Ok(Some(chunk.data))
    }

    /// Everything written so far: reads until the end of the stream, or until the head has
    /// nothing new for a task that is still running.
    pub async fn read_available(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.next_chunk().await? {
            if chunk.is_empty() && !self.eof {
                break;
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}
