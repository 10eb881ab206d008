//! A task's result kept as an object (docs/ARCHITECTURE.md "Objects"): a function that returns
//! more than 100 KiB leaves its bytes in the store of the worker that ran it, and its status
//! carries [`TaskResult::Object`] (size and CRC-32C) instead of the bytes. The object is
//! `(task id, 0)` ([`ObjectId::task_result`]).
//!
//! - [`Client::get_bytes`](crate::Client::get_bytes) and [`Client::result_object_bytes`]
//!   fetch it from its holder (`LocateObject`, then the holder's data plane), never through
//!   the head.
//! - **Lineage**: when every holder is lost and the task may run again, the head runs it again
//!   under the same object id; a reader that finds no copy waits for that run and reads the
//!   rebuilt object. When nothing can rebuild it, the read fails with
//!   [`ClientError::ObjectLost`] naming the object, its last node and why.
//! - [`Client::result_ref`] makes an [`ObjectRef`] that owns the object: passed to
//!   [`Task::object_arg`](crate::Task::object_arg) the next task reads it worker to worker, and
//!   dropping its last clone releases the object (its copies are deleted).

use std::time::Duration;

use bytes::Bytes;
use escher_proto::types::{ObjectId, TaskId, TaskResult, TaskStatus};
use tokio::time::Instant;

use super::ObjectRef;
use crate::tasks::succeeded;
use crate::{Client, ClientError};

/// How long a read of a result object waits for its rebuild when the caller gave no timeout.
pub const REBUILD_PATIENCE: Duration = Duration::from_secs(120);

/// The first and the longest pause between reads of a result object that has no copy yet.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

impl Client {
    /// The bytes of task `task`'s result object, fetched from a worker that holds it and
    /// checked whole. A result whose holder was lost is waited for while its task runs again
    /// (lineage), within `timeout` (`None`: [`REBUILD_PATIENCE`]); a lost one that nothing
    /// rebuilds fails with [`ClientError::ObjectLost`].
    pub async fn result_object_bytes(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<Bytes, ClientError> {
        let task = task.into();
        let id = ObjectId::task_result(task);
        let deadline = Instant::now() + timeout.unwrap_or(REBUILD_PATIENCE);
        let mut pause = PAUSE.0;
        loop {
            match self.get_object(id).await {
                Ok(bytes) => return Ok(bytes),
                // No copy answered: its holder may be gone, and its task running again.
                Err(ClientError::ObjectUnavailable(why)) if Instant::now() < deadline => {
                    tracing::debug!(object = %id, %why, "result object not readable yet");
                    let left = deadline.saturating_duration_since(Instant::now());
                    succeeded(self.get(task, Some(left)).await?)?;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(PAUSE.1);
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// `status` with a result object's bytes in place of its reference
    /// ([`TaskResult::Object`] becomes [`TaskResult::Returned`]), read as
    /// [`Client::result_object_bytes`] reads them; any other status as it is.
    pub async fn with_result_bytes(
        &self,
        mut status: TaskStatus,
        timeout: Option<Duration>,
    ) -> Result<TaskStatus, ClientError> {
        if let Some(TaskResult::Object { .. }) = status.result {
            let bytes = self.result_object_bytes(status.id, timeout).await?;
            status.result = Some(TaskResult::Returned(bytes));
        }
        Ok(status)
    }

    /// Waits for function task `task` (at most `timeout`) and, when its result is an object,
    /// returns a reference that owns it: pass it to the next task with
    /// [`Task::object_arg`](crate::Task::object_arg) (read worker to worker), read it with
    /// [`ObjectRef::get`], and drop its last clone to release it. `None` for a result small
    /// enough to travel inline (read it with [`Client::get_bytes`]). Each call makes a new
    /// owner: keep one and clone it.
    pub async fn result_ref(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<Option<ObjectRef>, ClientError> {
        let task = task.into();
        match succeeded(self.get(task, timeout).await?)? {
            TaskResult::Object { size, checksum } => Ok(Some(ObjectRef::owning(
                self,
                ObjectId::task_result(task),
                size,
                checksum,
            ))),
            _ => Ok(None),
        }
    }
}
