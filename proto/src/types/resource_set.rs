//! A set of resource amounts (`name -> amount`) and its compact text syntax.
//!
//! # Text syntax
//!
//! ```text
//! set  = "" | item *( "," item )
//! item = name "=" amount          ; whitespace around items, names and amounts is ignored
//! ```
//!
//! For example `cpu=2,gpu=0.5,my-res=1`. A name may appear once. Errors give the 1-based
//! column of the bad item and say what was wrong with it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Amount, ResourceName, TypeError};

/// Resource amounts by name, ordered by name. Zero amounts are not stored: asking for zero of
/// something is asking for nothing.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceSet(BTreeMap<ResourceName, Amount>);

impl ResourceSet {
    /// The empty set.
    pub fn new() -> ResourceSet {
        ResourceSet::default()
    }

    /// Builds a set from pairs, rejecting a name that appears twice.
    pub fn from_pairs(
        pairs: impl IntoIterator<Item = (ResourceName, Amount)>,
    ) -> Result<ResourceSet, TypeError> {
        let mut set = ResourceSet::new();
        for (name, amount) in pairs {
            if set.0.contains_key(&name) {
                return Err(TypeError::Duplicate(name.to_string()));
            }
            set.insert(name, amount);
        }
        Ok(set)
    }

    /// Sets `name` to `amount` (removing it if `amount` is zero); returns the previous amount.
    pub fn insert(&mut self, name: ResourceName, amount: Amount) -> Option<Amount> {
        if amount.is_zero() {
            self.0.remove(&name)
        } else {
            self.0.insert(name, amount)
        }
    }

    /// The amount of `name`, zero if absent.
    pub fn get(&self, name: &str) -> Amount {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// Whether `name` is present with a non-zero amount.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Number of resources in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `(name, amount)` pairs in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&ResourceName, Amount)> + '_ {
        self.0.iter().map(|(n, a)| (n, *a))
    }

    /// Names in order.
    pub fn names(&self) -> impl Iterator<Item = &ResourceName> + '_ {
        self.0.keys()
    }

    /// Adds `other` into `self` (the AND of two requirement sets), with checked arithmetic.
    pub fn merge(&mut self, other: &ResourceSet) -> Result<(), TypeError> {
        for (name, amount) in other.iter() {
            let sum = self.get(name.as_str()).checked_add(amount)?;
            self.insert(name.clone(), sum);
        }
        Ok(())
    }
}

impl FromStr for ResourceSet {
    type Err = TypeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut set = ResourceSet::new();
        if text.trim().is_empty() {
            return Ok(set);
        }
        let mut column = 1;
        for item in text.split(',') {
            let at = |why: String| TypeError::Syntax {
                column: column + (item.len() - item.trim_start().len()),
                fragment: item.trim().to_string(),
                why,
            };
            let Some((name, amount)) = item.split_once('=') else {
                let why = if item.trim().is_empty() {
                    "empty item; remove the extra ','".to_string()
                } else {
                    "expected NAME=AMOUNT, e.g. cpu=2".to_string()
                };
                return Err(at(why));
            };
            let name = ResourceName::new(name.trim()).map_err(|e| at(e.to_string()))?;
            let amount: Amount = amount.parse().map_err(|e: TypeError| at(e.to_string()))?;
            if set.0.contains_key(&name) {
                return Err(at(format!("resource {name:?} is listed twice")));
            }
            set.insert(name, amount);
            column += item.len() + 1;
        }
        Ok(set)
    }
}

impl fmt::Display for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, amount)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}={amount}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

impl<'a> IntoIterator for &'a ResourceSet {
    type Item = (&'a ResourceName, &'a Amount);
    type IntoIter = std::collections::btree_map::Iter<'a, ResourceName, Amount>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_compact_syntax() {
        let set: ResourceSet = "cpu=2, gpu=0.5,my-res=1".parse().unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.get("gpu").raw(), 5_000);
        assert_eq!(set.to_string(), "cpu=2,gpu=0.5,my-res=1");
        assert!("".parse::<ResourceSet>().unwrap().is_empty());
        assert!(
            "x=0".parse::<ResourceSet>().unwrap().is_empty(),
            "zero means nothing"
        );
    }

    #[test]
    fn errors_point_at_the_bad_part() {
        let cases = [
            ("cpu=2,gpu", 7, "NAME=AMOUNT"),
            ("cpu=2,,x=1", 7, "empty item"),
            ("cpu=2, b@d=1", 8, "only letters"),
            ("cpu=-1", 1, "negative"),
            ("cpu=1,cpu=2", 7, "twice"),
            ("a=1,b=0.00001", 5, "precision"),
        ];
        for (text, col, why) in cases {
            match text.parse::<ResourceSet>() {
                Err(TypeError::Syntax { column, why: w, .. }) => {
                    assert_eq!(column, col, "{text}: {w}");
                    assert!(w.contains(why), "{text}: {w}");
                }
                other => panic!("{text}: expected a syntax error, got {other:?}"),
            }
        }
    }

    #[test]
    fn merge_adds_amounts() {
        let mut a: ResourceSet = "cpu=1,x=2".parse().unwrap();
        a.merge(&"x=1,y=0.5".parse().unwrap()).unwrap();
        assert_eq!(a.to_string(), "cpu=1,x=3,y=0.5");
        assert!(
            ResourceSet::from_pairs([
                (ResourceName::cpu(), Amount::ONE),
                (ResourceName::cpu(), Amount::ONE)
            ])
            .is_err()
        );
    }
}
