//! Conversions of the resource vocabulary: capacities, resource sets, labels, capacity
//! operations, node specs and resource updates.

use std::collections::BTreeMap;

use super::{
    At, ConvertError, MAX_LABELS, MAX_RESOURCES, Problem, check_count, convert_required,
    key_segment, required,
};
use crate::types::{
    Amount, Capacity, CapacityOp, Delta, Labels, NodeId, NodeSpec, ResourceName, ResourceSet,
    ResourceUpdate, TypeError,
};
use crate::wire;
use crate::wire::{capacity, capacity_op, node_spec};

impl From<Capacity> for wire::Capacity {
    fn from(c: Capacity) -> Self {
        let kind = match c {
            Capacity::Finite(a) => capacity::Kind::Finite(a.raw()),
            Capacity::Unbounded => capacity::Kind::Unbounded(wire::Unbounded {}),
        };
        wire::Capacity { kind: Some(kind) }
    }
}

impl TryFrom<wire::Capacity> for Capacity {
    type Error = ConvertError;
    fn try_from(w: wire::Capacity) -> Result<Self, ConvertError> {
        Ok(match required(w.kind, "kind")? {
            capacity::Kind::Finite(raw) => Capacity::Finite(Amount::from_raw(raw).at("finite")?),
            capacity::Kind::Unbounded(wire::Unbounded {}) => Capacity::Unbounded,
        })
    }
}

impl From<&ResourceSet> for Vec<wire::ResourceAmount> {
    fn from(set: &ResourceSet) -> Self {
        set.iter()
            .map(|(name, amount)| wire::ResourceAmount {
                name: name.as_str().to_owned(),
                amount: amount.raw(),
            })
            .collect()
    }
}

impl From<ResourceSet> for Vec<wire::ResourceAmount> {
    fn from(set: ResourceSet) -> Self {
        Self::from(&set)
    }
}

impl TryFrom<Vec<wire::ResourceAmount>> for ResourceSet {
    type Error = ConvertError;

    /// Validates every name and amount; a name may appear once. Errors are at `["name"]`.
    fn try_from(items: Vec<wire::ResourceAmount>) -> Result<Self, ConvertError> {
        check_count("", items.len(), MAX_RESOURCES)?;
        let mut pairs = Vec::with_capacity(items.len());
        for wire::ResourceAmount { name, amount } in &items {
            // The error path is built only on error: this runs for every requested resource.
            let bad = |e: TypeError| ConvertError::new(key_segment(name), Problem::Invalid(e));
            let parsed = ResourceName::new(name).map_err(bad)?;
            let amount = Amount::from_raw(*amount).map_err(bad)?;
            pairs.push((parsed, amount));
        }
        // A name may appear once, even with a zero amount (which the set does not keep).
        let mut names: Vec<&str> = pairs.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            let mut seen = std::collections::HashSet::new();
            let repeated = items
                .iter()
                .find(|item| !seen.insert(item.name.as_str()))
                .map(|item| item.name.clone())
                .unwrap_or_default();
            let why = TypeError::Duplicate(repeated.clone());
            return Err(ConvertError::new(
                key_segment(&repeated),
                Problem::Invalid(why),
            ));
        }
        ResourceSet::from_pairs(pairs).map_err(|e| ConvertError::new("", Problem::Invalid(e)))
    }
}

impl From<&Labels> for BTreeMap<String, String> {
    fn from(labels: &Labels) -> Self {
        labels
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

impl From<Labels> for BTreeMap<String, String> {
    /// Moves the labels: a spec sent to a worker or a head is converted by value, once per
    /// task.
    fn from(labels: Labels) -> Self {
        labels.into_map()
    }
}

impl TryFrom<BTreeMap<String, String>> for Labels {
    type Error = ConvertError;

    /// Validates every key and value. Errors are at `["key"]`.
    fn try_from(map: BTreeMap<String, String>) -> Result<Self, ConvertError> {
        check_count("", map.len(), MAX_LABELS)?;
        let mut labels = Labels::new();
        for (k, v) in &map {
            labels.insert(k, v).at(&key_segment(k))?;
        }
        Ok(labels)
    }
}

impl From<CapacityOp> for wire::CapacityOp {
    fn from(op: CapacityOp) -> Self {
        let op = match op {
            CapacityOp::Set(c) => capacity_op::Op::Set(c.into()),
            CapacityOp::Adjust(d) => capacity_op::Op::Adjust(d.raw()),
            CapacityOp::Delete => capacity_op::Op::Delete(wire::Delete {}),
        };
        wire::CapacityOp { op: Some(op) }
    }
}

impl TryFrom<wire::CapacityOp> for CapacityOp {
    type Error = ConvertError;
    fn try_from(w: wire::CapacityOp) -> Result<Self, ConvertError> {
        Ok(match required(w.op, "op")? {
            capacity_op::Op::Set(c) => CapacityOp::Set(Capacity::try_from(c).at("set")?),
            capacity_op::Op::Adjust(raw) => CapacityOp::Adjust(Delta::try_from(raw).at("adjust")?),
            capacity_op::Op::Delete(wire::Delete {}) => CapacityOp::Delete,
        })
    }
}

impl From<NodeSpec> for wire::NodeSpec {
    fn from(spec: NodeSpec) -> Self {
        let target = match spec {
            NodeSpec::Local => node_spec::Target::Local(wire::Local {}),
            NodeSpec::Node(id) => node_spec::Target::Node(id.0),
            NodeSpec::Match {
                resources,
                num_nodes,
            } => node_spec::Target::Match(wire::Match {
                resources: resources.into(),
                num_nodes,
            }),
        };
        wire::NodeSpec {
            target: Some(target),
        }
    }
}

impl TryFrom<wire::NodeSpec> for NodeSpec {
    type Error = ConvertError;
    fn try_from(w: wire::NodeSpec) -> Result<Self, ConvertError> {
        Ok(match required(w.target, "target")? {
            node_spec::Target::Local(wire::Local {}) => NodeSpec::Local,
            node_spec::Target::Node(id) => NodeSpec::Node(NodeId(id)),
            node_spec::Target::Match(m) => {
                let resources = ResourceSet::try_from(m.resources).at("match.resources")?;
                if m.num_nodes == Some(0) {
                    return Err(ConvertError::new(
                        "match.num_nodes",
                        Problem::Rule("must be at least 1; leave it out to select every match"),
                    ));
                }
                NodeSpec::Match {
                    resources,
                    num_nodes: m.num_nodes,
                }
            }
        })
    }
}

impl From<ResourceUpdate> for wire::ResourceUpdate {
    fn from(u: ResourceUpdate) -> Self {
        wire::ResourceUpdate {
            name: u.name.into(),
            op: Some(u.op.into()),
            target: Some(u.target.into()),
        }
    }
}

impl TryFrom<wire::ResourceUpdate> for ResourceUpdate {
    type Error = ConvertError;
    fn try_from(w: wire::ResourceUpdate) -> Result<Self, ConvertError> {
        Ok(ResourceUpdate {
            name: ResourceName::new(&w.name).at("name")?,
            op: convert_required(w.op, "op")?,
            target: convert_required(w.target, "target")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::{amount, name, round_trip, set};

    #[test]
    fn a_name_listed_twice_is_refused_even_with_a_zero_amount() {
        let item = |name: &str, amount| wire::ResourceAmount {
            name: name.into(),
            amount,
        };
        for items in [
            vec![item("x", 0), item("x", 10_000)],
            vec![item("x", 10_000), item("x", 0)],
        ] {
            let err = ResourceSet::try_from(items).unwrap_err().to_string();
            assert!(err.contains("twice"), "{err}");
        }
    }

    #[test]
    fn capacities_round_trip() {
        for c in [
            Capacity::Unbounded,
            Capacity::Finite(Amount::ZERO),
            Capacity::Finite(Amount::MAX),
        ] {
            round_trip::<_, wire::Capacity>(c);
        }
    }

    #[test]
    fn capacity_errors_name_the_field() {
        let e = Capacity::try_from(wire::Capacity { kind: None }).unwrap_err();
        assert_eq!(e.to_string(), "missing field kind");
        let too_big = wire::Capacity {
            kind: Some(capacity::Kind::Finite(Amount::MAX.raw() + 1)),
        };
        let e = Capacity::try_from(too_big).unwrap_err();
        assert_eq!(e.path(), "finite");
        assert!(e.to_string().contains("maximum"), "{e}");
    }

    #[test]
    fn resource_sets_and_labels_round_trip() {
        let s = set("cpu=2,gpu=0.5,team/queue=1");
        let w: Vec<wire::ResourceAmount> = (&s).into();
        assert_eq!(w.len(), 3);
        assert_eq!(
            w[1],
            wire::ResourceAmount {
                name: "gpu".into(),
                amount: 5_000
            }
        );
        assert_eq!(ResourceSet::try_from(w).unwrap(), s);
        let labels: Labels = "zone=a,gpu.model=H100".parse().unwrap();
        let w: BTreeMap<String, String> = labels.clone().into();
        assert_eq!(Labels::try_from(w).unwrap(), labels);
    }

    #[test]
    fn resource_set_errors_name_the_entry() {
        let ra = |n: &str, a: u64| wire::ResourceAmount {
            name: n.into(),
            amount: a,
        };
        let e = ResourceSet::try_from(vec![ra("cpu", 1), ra("b@d", 1)]).unwrap_err();
        assert_eq!(e.path(), r#"["b@d"]"#);
        assert!(e.to_string().contains("invalid resource name"), "{e}");
        let e = ResourceSet::try_from(vec![ra("x", u64::MAX)]).unwrap_err();
        assert_eq!(e.path(), r#"["x"]"#);
        assert!(e.to_string().contains("maximum"), "{e}");
        let e = ResourceSet::try_from(vec![ra("x", 1), ra("x", 2)]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let many: Vec<_> = (0..=MAX_RESOURCES)
            .map(|i| ra(&format!("r{i}"), 1))
            .collect();
        let e = ResourceSet::try_from(many).unwrap_err();
        assert!(matches!(e.problem(), Problem::TooMany { .. }), "{e}");
        let bad: BTreeMap<String, String> = [("k".to_string(), "a b".to_string())].into();
        assert_eq!(Labels::try_from(bad).unwrap_err().path(), r#"["k"]"#);
    }

    #[test]
    fn capacity_ops_round_trip() {
        for op in [
            CapacityOp::Set(Capacity::Unbounded),
            CapacityOp::Set(Capacity::Finite(amount("2.5"))),
            CapacityOp::Adjust(Delta::decrease(Amount::MAX)),
            CapacityOp::Adjust(Delta::increase(amount("0.0001"))),
            CapacityOp::Delete,
        ] {
            round_trip::<_, wire::CapacityOp>(op);
        }
    }

    #[test]
    fn capacity_op_errors() {
        let e = CapacityOp::try_from(wire::CapacityOp { op: None }).unwrap_err();
        assert_eq!(e.to_string(), "missing field op");
        let w = wire::CapacityOp {
            op: Some(capacity_op::Op::Adjust(i64::MIN)),
        };
        let e = CapacityOp::try_from(w).unwrap_err();
        assert_eq!(e.path(), "adjust");
        assert!(e.to_string().contains("maximum"), "{e}");
        let w = wire::CapacityOp {
            op: Some(capacity_op::Op::Set(wire::Capacity { kind: None })),
        };
        assert_eq!(
            CapacityOp::try_from(w).unwrap_err().to_string(),
            "missing field set.kind"
        );
    }

    #[test]
    fn node_specs_round_trip() {
        for spec in [
            NodeSpec::Local,
            NodeSpec::Node(NodeId(u64::MAX)),
            NodeSpec::Match {
                resources: ResourceSet::new(),
                num_nodes: None,
            },
            NodeSpec::Match {
                resources: set("gpu=1,zone-a=1"),
                num_nodes: Some(3),
            },
        ] {
            round_trip::<_, wire::NodeSpec>(spec);
        }
    }

    #[test]
    fn node_spec_errors() {
        let e = NodeSpec::try_from(wire::NodeSpec { target: None }).unwrap_err();
        assert_eq!(e.to_string(), "missing field target");
        let m = |resources, num_nodes| wire::NodeSpec {
            target: Some(node_spec::Target::Match(wire::Match {
                resources,
                num_nodes,
            })),
        };
        let e = NodeSpec::try_from(m(vec![], Some(0))).unwrap_err();
        assert_eq!(e.path(), "match.num_nodes");
        let bad = vec![wire::ResourceAmount {
            name: "".into(),
            amount: 1,
        }];
        let e = NodeSpec::try_from(m(bad, None)).unwrap_err();
        assert_eq!(e.path(), r#"match.resources[""]"#);
    }

    #[test]
    fn resource_updates_round_trip_and_validate() {
        let u = ResourceUpdate {
            name: name("app/slot"),
            op: CapacityOp::Set(Capacity::Finite(amount("4"))),
            target: NodeSpec::Local,
        };
        let w = round_trip::<_, wire::ResourceUpdate>(u);
        let e = ResourceUpdate::try_from(wire::ResourceUpdate {
            op: None,
            ..w.clone()
        });
        assert_eq!(e.unwrap_err().to_string(), "missing field op");
        let e = ResourceUpdate::try_from(wire::ResourceUpdate {
            target: None,
            ..w.clone()
        });
        assert_eq!(e.unwrap_err().to_string(), "missing field target");
        let e = ResourceUpdate::try_from(wire::ResourceUpdate {
            name: "a/b/c".into(),
            ..w
        });
        let e = e.unwrap_err();
        assert_eq!(e.path(), "name");
        assert!(
            e.to_string().starts_with("name: invalid resource name"),
            "{e}"
        );
    }
}
