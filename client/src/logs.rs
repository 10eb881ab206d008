//! [`LogReader`]: reads a command task's stdout or stderr from the head, piece by piece.
//!
//! The head serves output in chunks (`TaskLogs`: an offset in, bytes, the next offset and an
//! end-of-stream flag out). A reader keeps the offset, so it can read what is there now
//! ([`LogReader::read_available`]) or follow a running task ([`LogReader::next_chunk`] in a
//! loop, sleeping while nothing is new).

use escher_proto::types::{LogChunk, TaskLogsRequest};
use escher_proto::{LogStream, TaskId, wire};

use crate::{Client, ClientError};

/// Reads one output stream of one task, remembering how far it has read.
#[derive(Debug, Clone)]
pub struct LogReader {
    client: Client,
    task: TaskId,
    stream: LogStream,
    offset: u64,
    eof: bool,
}

impl LogReader {
    pub(crate) fn new(client: Client, task: TaskId, stream: LogStream) -> LogReader {
        LogReader {
            client,
            task,
            stream,
            offset: 0,
            eof: false,
        }
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
