//! Fetching a piece of a task's output: from the worker that ran the attempt when it is
//! connected, else from the tail the head kept (`runtime/logs.rs`).

use escher_proto::types::{HeadMessage, MAX_ATTEMPTS_KEPT, TaskLogsRequest};

use super::Owner;
use crate::replication::LogStore;
use crate::runtime::logs::{LogReply, PendingFetch, TailRead};

impl<S: LogStore> Owner<S> {
    pub(super) fn fetch_logs(&mut self, request: TaskLogsRequest, reply: LogReply) {
        if !self.leading {
            let _ = reply.send(Err(self.not_leader().message().to_string()));
            return;
        }
        let task = request.task_id;
        let Some(rec) = self.replica.state().task(task) else {
            let _ = reply.send(Err(format!("unknown task {task}")));
            return;
        };
        let attempt = request.attempt.unwrap_or(rec.attempt);
        let found = match (attempt, rec.attempt_record(attempt)) {
            (0, _) => Err(format!("task {task} has not run yet, so it has no logs")),
            (n, _) if n > rec.attempt => Err(format!(
                "task {task} has had {} attempt(s); there is no attempt {n} yet",
                rec.attempt
            )),
            (n, None) => Err(format!(
                "the head no longer remembers attempt {n} of task {task} (it keeps the last \
                 {MAX_ATTEMPTS_KEPT})"
            )),
            (_, Some(a)) => Ok(TailRead {
                task,
                attempt,
                node: a.node,
                stream: request.stream,
                offset: request.offset,
                max_bytes: request.max_bytes,
                tail: a.output.as_deref().cloned(),
            }),
        };
        let read = match found {
            Ok(read) => read,
            Err(why) => {
                let _ = reply.send(Err(why));
                return;
            }
        };
        let request_id = self.next_log;
        let msg = HeadMessage::FetchLogs {
            request_id,
            task_id: task,
            stream: request.stream,
            offset: request.offset,
            max_bytes: request.max_bytes,
            attempt,
        };
        if !self.workers.send_now(read.node, msg) {
            let why = format!(
                "attempt {attempt} ran on node {}, which is not connected now",
                read.node
            );
            let _ = reply.send(read.read_kept(&why));
            return;
        }
        self.next_log += 1;
        self.logs.insert(request_id, PendingFetch { reply, read });
    }
}
