//! Node and task identifiers: opaque integers assigned by the head.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::TypeError;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, "-{}"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = TypeError;

            /// Parses `7`, or the same with the kind as a prefix (`node-7`, `task-7`).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let t = s.trim();
                let digits = t.strip_prefix(concat!($what, "-")).unwrap_or(t);
                digits
                    .parse()
                    .map($name)
                    .map_err(|_| TypeError::InvalidId { what: $what, text: s.to_string() })
            }
        }
    };
}

id_type!(
    /// Identifies a node (a registered worker) for the life of the cluster.
    NodeId,
    "node"
);
id_type!(
    /// Identifies a task for the life of the cluster.
    TaskId,
    "task"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        assert_eq!("7".parse::<NodeId>().unwrap(), NodeId(7));
        assert_eq!("task-12".parse::<TaskId>().unwrap(), TaskId(12));
        assert_eq!(TaskId(12).to_string(), "12");
        assert_eq!(format!("{:?}", NodeId(3)), "node-3");
        let err = "x1".parse::<TaskId>().unwrap_err().to_string();
        assert!(err.contains("task id"), "{err}");
        assert!("-1".parse::<NodeId>().is_err());
    }
}
