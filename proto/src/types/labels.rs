//! Node and task labels: small validated `key=value` maps.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::TypeError;

/// The most labels on one task or node.
pub const MAX_LABELS: usize = 256;

/// The task label that names a task's application namespace. The head sets it on every task
/// submitted in a namespace, so that the task's own resource calls (a function's
/// `TaskContext`, the `escher` CLI in a command task through `ESCHER_NAMESPACE`) qualify names
/// the way the head qualified the task's requests.
pub const NAMESPACE_LABEL: &str = "escher.namespace";

/// The task label that names the reservation a head-native bundle holder belongs to (`escher
/// tasks --label escher.reservation=NAME` lists a reservation's holders).
pub const RESERVATION_LABEL: &str = "escher.reservation";

/// The task label that gives a reservation holder its reservation's strategy (`pack`,
/// `strict-spread`, ...), so that a reservation that loses a node is placed again as it was.
pub const STRATEGY_LABEL: &str = "escher.strategy";

/// The node label that says whether the node's command tasks are kept apart by user: `uid`
/// (each namespace's tasks run as a user of their own) or `none` (every task runs as the
/// worker's user: tenants on this node are not isolated). The worker sets it; `--labels`
/// cannot.
pub const ISOLATION_LABEL: &str = "escher.isolation";

/// The node label that lists the limits the node holds its command tasks to, in their
/// cgroups: `cpu+memory+pids`, fewer, or `none`. The worker sets it; `--labels` cannot.
pub const LIMITS_LABEL: &str = "escher.limits";

/// The node label, present only when some are missing, that lists the limits the node cannot
/// hold its command tasks to (`cpu+memory`, ...): a task there can use more than it asked for
/// of those. The worker sets it; `--labels` cannot.
pub const LIMITS_MISSING_LABEL: &str = "escher.limits.missing";

/// The node label that says where the node's command tasks find `/tmp`, `/var/tmp` and
/// `/dev/shm`: `private` (each task's own scratch, bound over them in a mount namespace of its
/// own) or `host` (the host's, which every task there may write and read). The worker sets it;
/// `--labels` cannot.
pub const TMP_LABEL: &str = "escher.tmp";

/// The node label with the most processes and threads one task may run at once there (its
/// `--task-pids-max`), set where the node holds that limit. The worker sets it; `--labels`
/// cannot.
pub const LIMITS_PIDS_LABEL: &str = "escher.limits.pids-max";

/// The prefix of the labels that escher itself sets (the isolation and limits labels, a walltime's
/// end, the data-plane address): `--labels` and `escher node label` refuse keys that start with
/// it, so that no operator's label can be taken for escher's own word.
pub const RESERVED_PREFIX: &str = "escher.";

/// The node label of a worker started with a walltime (`--walltime`, or a Slurm allocation's end):
/// when the node ends, in milliseconds since the Unix epoch. The worker sets it.
pub const ENDS_AT_LABEL: &str = "escher.ends-at";

/// The node label of a worker started with a walltime: when the head drains the node and marks it
/// [`ENDING_SOON_LABEL`], in milliseconds since the Unix epoch (the end less the worker's
/// `--walltime-margin`). The worker sets it.
pub const DRAIN_AT_LABEL: &str = "escher.drain-at";

/// The node label the head sets (`true`) when a node's walltime is about to end: from then on the
/// node admits nothing new and its running tasks finish.
pub const ENDING_SOON_LABEL: &str = "escher.ending-soon";

/// The node label the head sets (`true`) while the node's worker says its disk is under its
/// reserve (`--disk-reserve`; its heartbeats' `disk_under_reserve`), and removes when space
/// returns: meanwhile the scheduler places nothing new there (an assignment would only wait,
/// unstarted, on that node), its running tasks go on, and a task that could run nowhere else
/// waits for it. Data format 10 on: a group writing an older one does not set it.
pub const DISK_UNDER_RESERVE_LABEL: &str = "escher.disk.under-reserve";

/// Whether labels `labels` hold a node out of placement for want of disk space
/// ([`DISK_UNDER_RESERVE_LABEL`]).
pub fn under_disk_reserve(labels: &Labels) -> bool {
    labels.get(DISK_UNDER_RESERVE_LABEL).is_some()
}

/// Whether `key` is one of escher's own labels ([`RESERVED_PREFIX`]).
pub fn is_reserved_label(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// Labels: keys are 1 to 63 bytes of letters, digits, `-`, `_`, `.`, `/`; values are at most
/// 256 printable ASCII bytes without `,` or `=`.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    /// No labels.
    pub fn new() -> Labels {
        Labels::default()
    }

    /// Adds or replaces one label after validating it.
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), TypeError> {
        check_key(key)?;
        check_value(value)?;
        self.0.insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// Removes one label; whether it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        self.0.remove(key).is_some()
    }

    /// Checks a label key as [`insert`](Self::insert) would, without inserting anything.
    pub fn check_key(key: &str) -> Result<(), TypeError> {
        check_key(key)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `(key, value)` pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The labels as a map, without copying them (for the wire form).
    #[cfg(feature = "grpc")]
    pub(crate) fn into_map(self) -> BTreeMap<String, String> {
        self.0
    }
}

fn check_key(key: &str) -> Result<(), TypeError> {
    let bad = |why| TypeError::InvalidLabel {
        text: key.to_string(),
        why,
    };
    if key.is_empty() || key.len() > 63 {
        return Err(bad("a label key is 1 to 63 bytes"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
    {
        return Err(bad(
            "a label key uses letters, digits, '-', '_', '.' and '/'",
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), TypeError> {
    let bad = |why| TypeError::InvalidLabel {
        text: value.to_string(),
        why,
    };
    if value.len() > 256 {
        return Err(bad("a label value is at most 256 bytes"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b',' && b != b'=')
    {
        return Err(bad(
            "a label value is printable ASCII without spaces, ',' or '='",
        ));
    }
    Ok(())
}

impl FromStr for Labels {
    type Err = TypeError;

    /// Parses `k=v,k2=v2`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut labels = Labels::new();
        if s.trim().is_empty() {
            return Ok(labels);
        }
        for item in s.split(',') {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| TypeError::InvalidLabel {
                    text: item.to_string(),
                    why: "expected KEY=VALUE",
                })?;
            labels.insert(k.trim(), v.trim())?;
        }
        Ok(labels)
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_validate() {
        let l: Labels = "zone=a, gpu.model=H100".parse().unwrap();
        assert_eq!(l.get("zone"), Some("a"));
        assert_eq!(l.to_string(), "gpu.model=H100,zone=a");
        assert!("zone".parse::<Labels>().is_err());
        assert!("k=a b".parse::<Labels>().is_err());
        assert!(Labels::new().insert("", "x").is_err());
    }
}
