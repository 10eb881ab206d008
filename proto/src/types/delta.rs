//! Signed changes to a capacity, and the operations `set_resource` can apply.
//!
//! Concurrent updates to one resource must never lose each other (docs/DESIGN.md §3). A [`Delta`]
//! is the commutative form: eight clients each adding one unit always end eight units higher, in
//! any order. An absolute [`CapacityOp::Set`] is turned into a delta at the head's single
//! serialization point, so running tasks keep what they hold.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Amount, Capacity, TypeError};

/// A signed fixed-point change to a capacity, at most [`Amount::MAX`] either way.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Delta(i64);

impl Delta {
    /// An increase by `a`.
    pub fn increase(a: Amount) -> Delta {
        // MAX (10^18 raw) fits in an i64.
        Delta(a.raw() as i64)
    }

    /// A decrease by `a`.
    pub fn decrease(a: Amount) -> Delta {
        Delta(-(a.raw() as i64))
    }

    /// The raw signed count of 1/10,000 units.
    pub const fn raw(self) -> i64 {
        self.0
    }

    /// The size of the change, without its sign.
    pub fn magnitude(self) -> Amount {
        // |raw| <= MAX by construction.
        Amount::from_raw(self.0.unsigned_abs()).unwrap_or(Amount::MAX)
    }

    /// Whether this change lowers the capacity.
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// Applies the change to `total`, failing below zero or above [`Amount::MAX`].
    pub fn apply_to(self, total: Amount) -> Result<Amount, TypeError> {
        if self.is_negative() {
            total
                .checked_sub(self.magnitude())
                .map_err(|_| TypeError::Arithmetic("the change would make the capacity negative"))
        } else {
            total.checked_add(self.magnitude())
        }
    }
}

impl TryFrom<i64> for Delta {
    type Error = TypeError;
    fn try_from(raw: i64) -> Result<Self, Self::Error> {
        Amount::from_raw(raw.unsigned_abs())?;
        Ok(Delta(raw))
    }
}

impl From<Delta> for i64 {
    fn from(d: Delta) -> i64 {
        d.0
    }
}

impl FromStr for Delta {
    type Err = TypeError;

    /// Parses `+2`, `2`, `-0.5`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match t.strip_prefix('-') {
            Some(rest) => rest.parse().map(Delta::decrease),
            None => t
                .strip_prefix('+')
                .unwrap_or(t)
                .parse()
                .map(Delta::increase),
        }
    }
}

impl fmt::Display for Delta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.is_negative() { "-" } else { "+" };
        write!(f, "{sign}{}", self.magnitude())
    }
}

impl fmt::Debug for Delta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a `set_resource` call does to a resource on each node it targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CapacityOp {
    /// Make the capacity exactly this; a finite zero deletes the resource.
    Set(Capacity),
    /// Change the capacity by this much (creating it from zero if absent); reaching zero
    /// deletes it. Has no effect on an unbounded capacity.
    Adjust(Delta),
    /// Delete the resource. Tasks holding it keep it until they finish.
    Delete,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_parse_print_and_apply() {
        let up: Delta = "+2".parse().unwrap();
        let down: Delta = "-0.5".parse().unwrap();
        assert_eq!(up.to_string(), "+2");
        assert_eq!(down.to_string(), "-0.5");
        assert_eq!(
            "3".parse::<Delta>().unwrap(),
            Delta::increase(Amount::units(3).unwrap())
        );
        let one = Amount::ONE;
        assert_eq!(up.apply_to(one).unwrap(), Amount::units(3).unwrap());
        assert!(
            Delta::decrease(Amount::units(2).unwrap())
                .apply_to(one)
                .is_err()
        );
        assert!(Delta::increase(Amount::MAX).apply_to(one).is_err());
        assert!(Delta::try_from(i64::MIN).is_err());
        assert!("-x".parse::<Delta>().is_err());
    }
}
