//! Policy reports: where each tenant of a policy (an ESL) stands, as the policy says it, for
//! people (`escher status`, the dashboard) and for monitoring (`/metrics`).
//!
//! A report is a measurement, not state: the head keeps each policy's latest report in memory
//! and never replicates it (a policy reports again every round). Bounded so that a report can
//! neither flood the head nor `/metrics`: names are label-like, at most [`MAX_POLICY_ROWS`] rows
//! of at most [`MAX_POLICY_MEASURES`] finite measures.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most rows in one report.
pub const MAX_POLICY_ROWS: usize = 1024;
/// The most measures in one row.
pub const MAX_POLICY_MEASURES: usize = 16;
/// The longest policy, row or measure name, in bytes.
pub const MAX_POLICY_NAME: usize = 63;

/// One row of a report: what it is about (a tenant, a queue) and its measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRow {
    /// What the row is about.
    pub row: String,
    /// Measures by name.
    pub measures: BTreeMap<String, f64>,
}

/// A policy's latest report, as the head keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyReport {
    /// The policy's name.
    pub policy: String,
    /// The namespace of the caller that reported it; `None` for an admin's.
    pub namespace: Option<String>,
    /// When the head received it, in milliseconds since the Unix epoch.
    pub reported_at_ms: u64,
    /// Its rows, in the order reported.
    pub rows: Vec<PolicyRow>,
}

/// Checks a policy, row or measure name: 1 to [`MAX_POLICY_NAME`] bytes of letters, digits,
/// `-`, `_`, `.` and `/`.
pub fn check_policy_name(what: &str, name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?}: 1 to {MAX_POLICY_NAME} bytes of letters, digits, '-', '_', '.' and '/'"
        ))
    }
}

/// Checks a report's policy name and rows against the bounds; the first problem found.
pub fn check_policy_rows(policy: &str, rows: &[PolicyRow]) -> Result<(), String> {
    check_policy_name("policy", policy)?;
    if rows.len() > MAX_POLICY_ROWS {
        return Err(format!(
            "{} rows; a report holds at most {MAX_POLICY_ROWS}",
            rows.len()
        ));
    }
    for row in rows {
        check_policy_name("row", &row.row)?;
        if row.measures.len() > MAX_POLICY_MEASURES {
            return Err(format!(
                "row {:?} has {} measures; a row holds at most {MAX_POLICY_MEASURES}",
                row.row,
                row.measures.len()
            ));
        }
        for (name, value) in &row.measures {
            check_policy_name("measure", name)?;
            if !value.is_finite() {
                return Err(format!(
                    "measure {name:?} of row {:?} is {value}; measures are finite numbers",
                    row.row
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, measures: &[(&str, f64)]) -> PolicyRow {
        PolicyRow {
            row: name.to_string(),
            measures: measures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn reports_within_the_bounds_pass_and_others_say_what_is_wrong() {
        let good = [row("team-a", &[("usage", 12.5), ("factor", 0.7)])];
        assert_eq!(check_policy_rows("fair-time", &good), Ok(()));
        let cases: [(&str, Vec<PolicyRow>, &str); 5] = [
            ("", good.to_vec(), "policy \"\""),
            ("p", vec![row("a b", &[])], "row \"a b\""),
            ("p", vec![row("a", &[("x", f64::NAN)])], "finite"),
            (
                "p",
                vec![row(
                    "a",
                    &(0..17)
                        .map(|i| {
                            (
                                [
                                    "m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9",
                                    "ma", "mb", "mc", "md", "me", "mf", "mg",
                                ][i],
                                1.0,
                            )
                        })
                        .collect::<Vec<_>>(),
                )],
                "at most 16",
            ),
            (
                "p",
                vec![row("a", &[]); MAX_POLICY_ROWS + 1],
                "at most 1024",
            ),
        ];
        for (policy, rows, expect) in cases {
            let err = check_policy_rows(policy, &rows).unwrap_err();
            assert!(err.contains(expect), "{err}");
        }
    }
}
