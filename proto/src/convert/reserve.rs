//! Conversions of the `Reserve` call: head-native, all-or-nothing reservations of bundles, and
//! the gang strategies that say how bundles may share nodes.

use super::cluster::{namespace, namespace_to_wire};
use super::{At, ConvertError, MAX_BUNDLES, Problem, convert_list, duration_to_ms, ms_to_duration};
use crate::types::{GangStrategy, ReserveReply, ReserveRequest, ResourceName, ResourceSet, TaskId};
use crate::wire;

impl From<GangStrategy> for wire::GangStrategy {
    fn from(s: GangStrategy) -> Self {
        match s {
            GangStrategy::Pack => wire::GangStrategy::Pack,
            GangStrategy::Spread => wire::GangStrategy::Spread,
            GangStrategy::StrictPack => wire::GangStrategy::StrictPack,
            GangStrategy::StrictSpread => wire::GangStrategy::StrictSpread,
        }
    }
}

/// Reads an enum field holding a `GangStrategy`; `UNSPECIFIED` and unknown values are errors
/// at `field`.
pub(crate) fn gang_strategy(value: i32, field: &str) -> Result<GangStrategy, ConvertError> {
    let unknown = || {
        let expected = "PACK, SPREAD, STRICT_PACK, STRICT_SPREAD";
        ConvertError::new(field, Problem::UnknownEnum { value, expected })
    };
    Ok(
        match wire::GangStrategy::try_from(value).map_err(|_| unknown())? {
            wire::GangStrategy::Unspecified => return Err(unknown()),
            wire::GangStrategy::Pack => GangStrategy::Pack,
            wire::GangStrategy::Spread => GangStrategy::Spread,
            wire::GangStrategy::StrictPack => GangStrategy::StrictPack,
            wire::GangStrategy::StrictSpread => GangStrategy::StrictSpread,
        },
    )
}

impl From<ReserveRequest> for wire::ReserveRequest {
    fn from(r: ReserveRequest) -> Self {
        let bundle = |set: ResourceSet| wire::Bundle {
            resources: set.into(),
        };
        wire::ReserveRequest {
            name: r.name.into(),
            bundles: r.bundles.into_iter().map(bundle).collect(),
            strategy: wire::GangStrategy::from(r.strategy).into(),
            timeout_ms: r.timeout.map(duration_to_ms),
            namespace: namespace_to_wire(r.namespace),
            key: None,
        }
    }
}

impl TryFrom<wire::ReserveRequest> for ReserveRequest {
    type Error = ConvertError;

    /// Checks the name, every bundle (not empty, valid names and amounts), and the strategy.
    fn try_from(w: wire::ReserveRequest) -> Result<Self, ConvertError> {
        let name = ResourceName::new(&w.name).at("name")?;
        if w.bundles.is_empty() {
            return Err(ConvertError::new("bundles", Problem::Empty));
        }
        let bundles = convert_list(w.bundles, "bundles", MAX_BUNDLES, |b| {
            let set = ResourceSet::try_from(b.resources).at("resources")?;
            if set.is_empty() {
                return Err(ConvertError::new("resources", Problem::Empty));
            }
            Ok(set)
        })?;
        Ok(ReserveRequest {
            name,
            bundles,
            strategy: gang_strategy(w.strategy, "strategy")?,
            timeout: w.timeout_ms.map(ms_to_duration),
            namespace: namespace(w.namespace)?,
        })
    }
}

impl From<ReserveReply> for wire::ReserveReply {
    fn from(r: ReserveReply) -> Self {
        wire::ReserveReply {
            task_ids: r.task_ids.into_iter().map(|t| t.0).collect(),
            placed: r.placed,
        }
    }
}

impl From<wire::ReserveReply> for ReserveReply {
    fn from(w: wire::ReserveReply) -> Self {
        ReserveReply {
            task_ids: w.task_ids.into_iter().map(TaskId).collect(),
            placed: w.placed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::convert::testutil::{name, round_trip, set};

    fn request() -> ReserveRequest {
        ReserveRequest {
            name: name("train"),
            bundles: vec![set("cpu=2"), set("cpu=2,gpu=1,slot=0.5")],
            strategy: GangStrategy::StrictSpread,
            timeout: Some(Duration::from_millis(1500)),
            namespace: Some("app".parse().unwrap()),
        }
    }

    #[test]
    fn reserve_round_trips_with_every_strategy() {
        for strategy in [
            GangStrategy::Pack,
            GangStrategy::Spread,
            GangStrategy::StrictPack,
            GangStrategy::StrictSpread,
        ] {
            round_trip::<_, wire::ReserveRequest>(ReserveRequest {
                strategy,
                ..request()
            });
        }
        round_trip::<_, wire::ReserveRequest>(ReserveRequest {
            timeout: None,
            namespace: None,
            ..request()
        });
        let reply = ReserveReply {
            task_ids: vec![TaskId(4), TaskId(5)],
            placed: true,
        };
        assert_eq!(
            ReserveReply::from(wire::ReserveReply::from(reply.clone())),
            reply
        );
    }

    #[test]
    fn bad_reservations_name_the_field() {
        let good = wire::ReserveRequest::from(request());
        let err = |w: wire::ReserveRequest| ReserveRequest::try_from(w).unwrap_err();

        let e = err(wire::ReserveRequest {
            strategy: 0,
            ..good.clone()
        });
        assert_eq!(
            e.to_string(),
            "strategy: unknown value 0; expected one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"
        );
        assert_eq!(
            err(wire::ReserveRequest {
                strategy: 9,
                ..good.clone()
            })
            .path(),
            "strategy"
        );
        let e = err(wire::ReserveRequest {
            bundles: vec![],
            ..good.clone()
        });
        assert_eq!(e.to_string(), "bundles: must not be empty");
        let mut bad = good.clone();
        bad.bundles[1].resources.clear();
        assert_eq!(
            err(bad).to_string(),
            "bundles[1].resources: must not be empty"
        );
        let mut bad = good.clone();
        bad.bundles[0].resources.push(wire::ResourceAmount {
            name: "b@d".into(),
            amount: 1,
        });
        let e = err(bad).to_string();
        assert!(
            e.starts_with(r#"bundles[0].resources["b@d"]: invalid resource name"#),
            "{e}"
        );
        let e = err(wire::ReserveRequest {
            name: String::new(),
            ..good.clone()
        });
        assert_eq!(e.path(), "name");
        let e = err(wire::ReserveRequest {
            namespace: "a/b".into(),
            ..good
        });
        assert_eq!(e.path(), "namespace");
    }
}
