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

use std::fmt;
use std::str::FromStr;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Amount, ResourceName, TypeError};

/// Resource amounts by name, ordered by name. Zero amounts are not stored: asking for zero of
/// something is asking for nothing.
///
/// Held as a vector sorted by name: a task's set is a handful of entries, kept by every queued
/// task, and a vector of one entry is 24 bytes where a B-tree allocates a node for eleven.
/// Lookups are binary searches. It is encoded as a map (name to amount), as it always was.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ResourceSet(Vec<(ResourceName, Amount)>);

impl ResourceSet {
    /// The empty set.
    pub fn new() -> ResourceSet {
        ResourceSet::default()
    }

    /// Builds a set from pairs, rejecting a name that appears twice (as [`insert`](Self::insert)
    /// one pair after another would: a zero amount adds nothing, so a name may follow its own
    /// zero).
    pub fn from_pairs(
        pairs: impl IntoIterator<Item = (ResourceName, Amount)>,
    ) -> Result<ResourceSet, TypeError> {
        let mut pairs: Vec<(ResourceName, Amount)> = pairs.into_iter().collect();
        // Stable: the pairs of one name keep their order.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut set = Vec::with_capacity(pairs.len());
        let mut run: Option<&(ResourceName, Amount)> = None;
        for pair in &pairs {
            match run {
                Some(held) if held.0 == pair.0 => {
                    if !held.1.is_zero() {
                        return Err(TypeError::Duplicate(pair.0.to_string()));
                    }
                    run = Some(pair);
                }
                _ => {
                    if let Some(last) = run.filter(|p| !p.1.is_zero()) {
                        set.push(last.clone());
                    }
                    run = Some(pair);
                }
            }
        }
        if let Some(last) = run.filter(|p| !p.1.is_zero()) {
            set.push(last.clone());
        }
        Ok(ResourceSet(set))
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// Sets `name` to `amount` (removing it if `amount` is zero); returns the previous amount.
    pub fn insert(&mut self, name: ResourceName, amount: Amount) -> Option<Amount> {
        match (self.find(name.as_str()), amount.is_zero()) {
            (Ok(i), true) => Some(self.0.remove(i).1),
            (Ok(i), false) => Some(std::mem::replace(&mut self.0[i].1, amount)),
            (Err(_), true) => None,
            (Err(i), false) => {
                self.0.insert(i, (name, amount));
                None
            }
        }
    }

    /// The amount of `name`, zero if absent.
    pub fn get(&self, name: &str) -> Amount {
        self.find(name)
            .map_or_else(|_| Amount::default(), |i| self.0[i].1)
    }

    /// Whether `name` is present with a non-zero amount.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Pairs in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&ResourceName, Amount)> + '_ {
        self.0.iter().map(|(n, a)| (n, *a))
    }

    /// Names in order.
    pub fn names(&self) -> impl Iterator<Item = &ResourceName> + '_ {
        self.0.iter().map(|(n, _)| n)
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

impl Serialize for ResourceSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The pairs as a map, inside the newtype the derived encoding had.
        struct AsMap<'a>(&'a [(ResourceName, Amount)]);
        impl Serialize for AsMap<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(self.0.iter().map(|(n, a)| (n, a)))
            }
        }
        serializer.serialize_newtype_struct("ResourceSet", &AsMap(&self.0))
    }
}

impl<'de> Deserialize<'de> for ResourceSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SetVisitor;
        impl<'de> Visitor<'de> for SetVisitor {
            type Value = ResourceSet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of resource names to amounts")
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(
                self,
                deserializer: D,
            ) -> Result<ResourceSet, D::Error> {
                deserializer.deserialize_map(self)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ResourceSet, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1024));
                while let Some(pair) = map.next_entry::<ResourceName, Amount>()? {
                    pairs.push(pair);
                }
                ResourceSet::from_pairs(pairs).map_err(serde::de::Error::custom)
            }
        }
        deserializer.deserialize_newtype_struct("ResourceSet", SetVisitor)
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
            if set.contains(name.as_str()) {
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
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (ResourceName, Amount)>,
        fn(&'a (ResourceName, Amount)) -> (&'a ResourceName, &'a Amount),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, a)| (n, a))
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

    fn set(text: &str) -> ResourceSet {
        text.parse().unwrap()
    }

    fn name(text: &str) -> ResourceName {
        ResourceName::new(text).unwrap()
    }

    #[test]
    fn insertions_keep_the_names_in_order_and_zero_removes() {
        let mut s = ResourceSet::new();
        for (n, a) in [("m", 1), ("b", 2), ("z", 3), ("a", 4), ("m", 5)] {
            s.insert(name(n), Amount::units(a).unwrap());
        }
        assert_eq!(s.to_string(), "a=4,b=2,m=5,z=3");
        assert_eq!(
            s.insert(name("b"), Amount::ZERO),
            Some(Amount::units(2).unwrap())
        );
        assert_eq!(s.insert(name("q"), Amount::ZERO), None);
        assert_eq!(s.to_string(), "a=4,m=5,z=3");
        assert!(s.contains("m") && !s.contains("b") && s.get("b").is_zero());
        let names: Vec<&str> = s.names().map(ResourceName::as_str).collect();
        assert_eq!(names, ["a", "m", "z"]);
        let pairs: Vec<(&ResourceName, &Amount)> = (&s).into_iter().collect();
        assert_eq!(pairs.len(), 3);
    }

    #[test]
    fn from_pairs_is_one_insert_after_another() {
        let one = |n: &str, a: u64| (name(n), Amount::units(a).unwrap());
        let s = ResourceSet::from_pairs([one("y", 1), one("x", 0), one("x", 2), one("w", 0)]);
        assert_eq!(
            s.unwrap().to_string(),
            "x=2,y=1",
            "a name may follow its own zero"
        );
        let twice = ResourceSet::from_pairs([one("x", 1), one("y", 1), one("x", 0)]);
        assert!(matches!(twice, Err(TypeError::Duplicate(n)) if n == "x"));
    }

    #[test]
    fn the_encoding_is_the_map_it_always_was() {
        // What the derived encoding of `ResourceSet(BTreeMap<ResourceName, Amount>)` wrote, in
        // raft logs and snapshots: the new set reads it, and writes the same bytes.
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        #[serde(rename = "ResourceSet")]
        struct Before(std::collections::BTreeMap<ResourceName, Amount>);
        let s = set("cpu=2,gpu=0.5,my-res=1");
        let before = Before(s.iter().map(|(n, a)| (n.clone(), a)).collect());
        let config = bincode::config::standard();
        let old_bytes = bincode::serde::encode_to_vec(&before, config).unwrap();
        let (back, _): (ResourceSet, _) =
            bincode::serde::decode_from_slice(&old_bytes, config).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            bincode::serde::encode_to_vec(&s, config).unwrap(),
            old_bytes
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, serde_json::to_string(&before).unwrap());
        assert_eq!(serde_json::from_str::<ResourceSet>(&json).unwrap(), s);
        // A repeated name is refused, not silently overwritten.
        let repeated = serde_json::from_str::<ResourceSet>(r#"{"x":"1","x":"2"}"#);
        let why = repeated.unwrap_err().to_string();
        assert!(why.contains(r#"resource "x" is listed twice"#), "{why}");
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
