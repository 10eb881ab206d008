//! Policy reports (`ReportPolicy`, `Policies`) to and from the wire. A report's rows are
//! checked against the bounds of `types/policy.rs` when they arrive.

use crate::types::{PolicyReport, PolicyRow, check_policy_rows};
use crate::wire;

impl From<PolicyRow> for wire::PolicyRow {
    fn from(row: PolicyRow) -> Self {
        wire::PolicyRow {
            row: row.row,
            measures: row.measures.into_iter().collect(),
        }
    }
}

impl From<wire::PolicyRow> for PolicyRow {
    fn from(row: wire::PolicyRow) -> Self {
        PolicyRow {
            row: row.row,
            measures: row.measures.into_iter().collect(),
        }
    }
}

impl From<PolicyReport> for wire::PolicyReport {
    fn from(report: PolicyReport) -> Self {
        wire::PolicyReport {
            policy: report.policy,
            namespace: report.namespace.unwrap_or_default(),
            reported_at_ms: report.reported_at_ms,
            rows: report.rows.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<wire::PolicyReport> for PolicyReport {
    fn from(report: wire::PolicyReport) -> Self {
        PolicyReport {
            policy: report.policy,
            namespace: Some(report.namespace).filter(|ns| !ns.is_empty()),
            reported_at_ms: report.reported_at_ms,
            rows: report.rows.into_iter().map(Into::into).collect(),
        }
    }
}

/// The policy and rows of a `ReportPolicy` request, checked against the bounds; the first
/// problem, said for the caller.
pub fn policy_report(
    request: wire::ReportPolicyRequest,
) -> Result<(String, Vec<PolicyRow>), String> {
    let rows: Vec<PolicyRow> = request.rows.into_iter().map(Into::into).collect();
    check_policy_rows(&request.policy, &rows)?;
    Ok((request.policy, rows))
}
