//! A task credential acts for its task only while the attempt it was signed for runs: the
//! check every call carrying one passes ([`check_attempt`]), in the auth layer for every
//! method, and again for each request of a long-lived stream.
//!
//! Whether an attempt runs is the state's to say, and the state belongs to the runtime's owner
//! task, above this module: the runtime hands the layer a [`RunningAttempts`] that asks it.

use std::future::Future;
use std::pin::Pin;

use escher_proto::types::TaskId;
use tonic::Status;

use super::Caller;
use crate::state::ApplyError;

/// What [`RunningAttempts::running`] answers: `Err` when the head cannot tell now (it is
/// shutting down); otherwise whether the attempt runs, and if not, why not.
pub type Running = Pin<Box<dyn Future<Output = Result<Result<(), ApplyError>, Status>> + Send>>;

/// Where the auth layer learns whether a task's attempt still runs (implemented by the
/// runtime, which reaches the state).
pub trait RunningAttempts: Send + Sync + std::fmt::Debug {
    /// Whether attempt `attempt` of `task` runs now (this replica's state as applied: an
    /// attempt that ended cannot come back, so a stale answer refuses nothing it should
    /// admit for long).
    fn running(&self, task: TaskId, attempt: u32) -> Running;
}

/// Refuses `caller` if it is a task credential whose attempt no longer runs; admits every
/// other caller at once.
pub async fn check_attempt(attempts: &dyn RunningAttempts, caller: &Caller) -> Result<(), Status> {
    let Some((task, attempt)) = caller.task() else {
        return Ok(());
    };
    attempts
        .running(task, attempt)
        .await?
        .map_err(|err| ended(task, attempt, err))
}

/// The status of a call by the credential of `task`'s attempt `attempt`, which `err` says no
/// longer runs.
fn ended(task: TaskId, attempt: u32, err: ApplyError) -> Status {
    let now = match err {
        ApplyError::CallerNotRunning { state, .. } => format!("the task is {state}"),
        ApplyError::AttemptEnded { current, .. } => format!("the task is on attempt {current}"),
        other => other.to_string(),
    };
    Status::unauthenticated(format!(
        "this call carries the credential of task {task} attempt {attempt}, which acts for the \
         task only while that attempt runs, and {now}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher_proto::types::TaskState;

    /// Attempt 2 of task 7 runs; task 8 succeeded.
    #[derive(Debug)]
    struct Fixed;

    impl RunningAttempts for Fixed {
        fn running(&self, task: TaskId, attempt: u32) -> Running {
            let answer = match (task.0, attempt) {
                (7, 2) => Ok(()),
                (7, _) => Err(ApplyError::AttemptEnded {
                    task,
                    attempt,
                    current: 2,
                }),
                _ => Err(ApplyError::CallerNotRunning {
                    task,
                    state: TaskState::Succeeded,
                }),
            };
            Box::pin(std::future::ready(Ok(answer)))
        }
    }

    fn task(task: u64, attempt: u32) -> Caller {
        Caller::Task {
            task: TaskId(task),
            attempt,
            namespace: None,
        }
    }

    #[tokio::test]
    async fn only_a_running_attempt_acts_for_its_task() {
        check_attempt(&Fixed, &task(7, 2)).await.unwrap();
        check_attempt(&Fixed, &Caller::Admin).await.unwrap();
        let ended = check_attempt(&Fixed, &task(7, 1)).await.unwrap_err();
        assert_eq!(ended.code(), tonic::Code::Unauthenticated);
        assert!(
            ended.message().contains("on attempt 2"),
            "{}",
            ended.message()
        );
        let finished = check_attempt(&Fixed, &task(8, 1)).await.unwrap_err();
        assert!(
            finished.message().contains("only while that attempt runs"),
            "{}",
            finished.message()
        );
    }
}
