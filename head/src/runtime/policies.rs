//! Policy reports as this replica received them (`ReportPolicy`, `Policies`): where each tenant
//! of a policy (an ESL) stands, as the policy says, for `escher status`, the dashboard and
//! `/metrics`.
//!
//! Reports are measurements, not state, like task telemetry (`telemetry.rs`): kept in memory by
//! the replica that received them, never replicated, lost when the head restarts or leadership
//! moves (a policy reports again every round). Each (namespace, policy) keeps its latest report;
//! at most [`REPORTS`] are kept, the least recently reported going first.

use std::collections::BTreeMap;
use std::sync::Mutex;

use escher_proto::types::{PolicyReport, PolicyRow};

/// Reports kept, one per namespace and policy.
pub(crate) const REPORTS: usize = 256;

/// The reports this replica keeps.
#[derive(Debug, Default)]
pub(crate) struct PolicyReports {
    reports: Mutex<BTreeMap<(Option<String>, String), PolicyReport>>,
}

impl PolicyReports {
    /// Keeps `rows` as the latest report of `policy` in `namespace`, received at `now_ms`.
    pub(crate) fn report(
        &self,
        namespace: Option<String>,
        policy: String,
        rows: Vec<PolicyRow>,
        now_ms: u64,
    ) {
        let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        let report = PolicyReport {
            policy: policy.clone(),
            namespace: namespace.clone(),
            reported_at_ms: now_ms,
            rows,
        };
        reports.insert((namespace, policy), report);
        while reports.len() > REPORTS {
            let oldest = reports
                .iter()
                .min_by_key(|(_, r)| r.reported_at_ms)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(key) => reports.remove(&key),
                None => break,
            };
        }
    }

    /// The reports whose namespace `sees` admits, by namespace and policy.
    pub(crate) fn read(&self, sees: impl Fn(Option<&str>) -> bool) -> Vec<PolicyReport> {
        let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        reports
            .values()
            .filter(|r| sees(r.namespace.as_deref()))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, value: f64) -> PolicyRow {
        PolicyRow {
            row: name.to_string(),
            measures: [("usage".to_string(), value)].into(),
        }
    }

    #[test]
    fn the_latest_report_of_each_namespace_and_policy_is_kept_and_shown_to_who_may_see_it() {
        let store = PolicyReports::default();
        store.report(Some("a".into()), "fair".into(), vec![row("x", 1.0)], 10);
        store.report(Some("a".into()), "fair".into(), vec![row("x", 2.0)], 20);
        store.report(Some("b".into()), "fair".into(), vec![row("y", 3.0)], 30);
        store.report(None, "fair".into(), vec![row("z", 4.0)], 40);
        let all = store.read(|_| true);
        assert_eq!(all.len(), 3);
        let of_a = store.read(|ns| ns == Some("a"));
        assert_eq!(of_a.len(), 1);
        assert_eq!(of_a[0].rows, vec![row("x", 2.0)]);
        assert_eq!(of_a[0].reported_at_ms, 20);
        for i in 0..REPORTS + 10 {
            store.report(None, format!("p{i}"), vec![], 100 + i as u64);
        }
        let kept = store.read(|_| true);
        assert_eq!(kept.len(), REPORTS);
        assert!(
            kept.iter().all(|r| r.reported_at_ms >= 110),
            "the oldest went first"
        );
    }
}
