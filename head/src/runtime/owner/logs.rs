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

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;
    use escher_proto::types::{LogStream, ReplicaRole, TaskId};

    fn request(task: u64) -> TaskLogsRequest {
        TaskLogsRequest {
            task_id: TaskId(task),
            stream: LogStream::Stdout,
            offset: 0,
            max_bytes: 0,
            attempt: None,
        }
    }

    #[test]
    fn logs_are_fetched_by_the_leader_for_a_known_task() {
        let mut owner = test_owner();
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.fetch_logs(request(5), reply);
        let why = rx.try_recv().unwrap().unwrap_err();
        assert!(why.contains("not the leader"), "{why}");
        owner.on_role(ReplicaRole::Leader, Some(1));
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.fetch_logs(request(5), reply);
        assert_eq!(rx.try_recv().unwrap().unwrap_err(), "unknown task 5");
        assert!(owner.logs.is_empty());
    }
}
