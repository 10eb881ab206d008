//! Task telemetry: a running task reports samples of its own progress; policies read them.
//!
//! Inside a task, a client made from the environment carries the task's credential
//! (`ESCHER_TASK_TOKEN`), and [`Client::report`] sends samples as that task's current attempt;
//! `escher report KEY=VALUE...` does the same from a command task. Anyone who may see a task
//! reads its samples with [`Client::telemetry`] (`escher telemetry TASK...`). The head that
//! received them keeps them in memory, the latest 256 per task: they are measurements, not
//! state, and are not replicated.
//!
//! Policies report too: an ESL says where each of its tenants stands with
//! [`Client::report_policy`] (fair-time's usage, factor and holdings), and `escher status`,
//! the dashboard and `/metrics` show the latest report of each policy ([`Client::policies`]).
//! Kept in memory like task samples: a policy reports again every round.

use escher_proto::types::{PolicyReport, PolicyRow, Sample, TaskId, TaskTelemetry};
use escher_proto::wire;

use crate::{Client, ClientError};

impl Client {
    /// Reports samples (`("mem_used_gb", 3.2)`) as the running task whose credential this
    /// client carries; how many samples the head now keeps for it. Refused for any other
    /// credential, and with a clear error for a bad key or a value that is not finite.
    pub async fn report(&self, samples: &[(&str, f64)]) -> Result<usize, ClientError> {
        let samples = samples
            .iter()
            .map(|(k, v)| Sample::new(k, *v).map(wire::TelemetrySample::from))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ClientError::Usage(e.to_string()))?;
        let request = wire::ReportTelemetryRequest { samples };
        let reply = self
            .call(|mut rpc| {
                let request = request.clone();
                async move { rpc.report_telemetry(request).await }
            })
            .await?;
        Ok(reply.kept as usize)
    }

    /// The samples `tasks` reported, oldest first, for the tasks that reported any; with
    /// `after_ms`, only those the head received after that time (ms since the epoch), so that
    /// a policy polling each round reads only what is new.
    pub async fn telemetry<I>(
        &self,
        tasks: I,
        after_ms: Option<u64>,
    ) -> Result<Vec<TaskTelemetry>, ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        let request = wire::TelemetryRequest {
            tasks: tasks.into_iter().map(|t| t.into().0).collect(),
            after_ms: after_ms.unwrap_or(0),
        };
        let reply = self
            .call(|mut rpc| {
                let request = request.clone();
                async move { rpc.telemetry(request).await }
            })
            .await?;
        Ok(reply
            .tasks
            .into_iter()
            .map(TaskTelemetry::try_from)
            .collect::<Result<_, _>>()?)
    }

    /// Reports where the rows of `policy` stand (its tenants and their measures), replacing
    /// its previous report in this client's namespace. Checked here and by the head: names
    /// label-like, at most 1,024 rows of at most 16 finite measures.
    pub async fn report_policy(&self, policy: &str, rows: &[PolicyRow]) -> Result<(), ClientError> {
        escher_proto::types::check_policy_rows(policy, rows)
            .map_err(ClientError::InvalidArgument)?;
        let request = wire::ReportPolicyRequest {
            policy: policy.to_string(),
            rows: rows.iter().cloned().map(Into::into).collect(),
        };
        self.call(|mut rpc| {
            let request = request.clone();
            async move { rpc.report_policy(request).await }
        })
        .await?;
        Ok(())
    }

    /// The latest report of each policy this client may see (its namespace's, or all for an
    /// admin or a reader), by namespace and policy.
    pub async fn policies(&self) -> Result<Vec<PolicyReport>, ClientError> {
        let reply = self
            .call(|mut rpc| async move { rpc.policies(wire::PoliciesRequest {}).await })
            .await?;
        Ok(reply.reports.into_iter().map(Into::into).collect())
    }
}
