//! How the bundles of an atomic reservation (a gang) may be spread over nodes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Placement strategy of an all-or-nothing reservation, as Ray's placement groups offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum GangStrategy {
    /// As few nodes as possible (nodes already used by the gang first).
    #[default]
    Pack,
    /// As many nodes as possible (unused nodes first), sharing nodes when it must.
    Spread,
    /// Every bundle on one node, or nothing.
    StrictPack,
    /// Every bundle on a different node, or nothing.
    StrictSpread,
}

impl GangStrategy {
    /// The name used by the CLI and the wire (`pack`, `spread`, `strict-pack`, `strict-spread`).
    pub fn as_str(self) -> &'static str {
        match self {
            GangStrategy::Pack => "pack",
            GangStrategy::Spread => "spread",
            GangStrategy::StrictPack => "strict-pack",
            GangStrategy::StrictSpread => "strict-spread",
        }
    }
}

impl FromStr for GangStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(
            match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
                "pack" => GangStrategy::Pack,
                "spread" => GangStrategy::Spread,
                "strict-pack" => GangStrategy::StrictPack,
                "strict-spread" => GangStrategy::StrictSpread,
                other => {
                    return Err(format!(
                        "unknown gang strategy {other:?}: expected pack, spread, strict-pack or \
                     strict-spread"
                    ));
                }
            },
        )
    }
}

impl fmt::Display for GangStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
