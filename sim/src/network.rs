//! [`Network`]: the simulated links between replicas and clients. Each message is dropped,
//! delivered once or delivered twice, after its own random delay (so messages overtake one
//! another); a partition cuts the replicas into two sides that hear nothing from each other.

use std::collections::BTreeSet;

use rand::Rng;
use rand::rngs::StdRng;

/// How the links behave. Probabilities are per mille.
#[derive(Debug, Clone)]
pub struct Network {
    /// One side of the current partition (the rest is the other side); `None` when whole.
    partition: Option<BTreeSet<u64>>,
    /// Messages lost, per mille.
    pub drop: u32,
    /// Messages delivered twice, per mille.
    pub duplicate: u32,
    /// The shortest delay, in simulated milliseconds.
    pub min_delay: u64,
    /// The longest delay.
    pub max_delay: u64,
}

impl Network {
    /// A network whose fault rates are drawn from `rng` (each seed gets its own weather).
    pub fn random(rng: &mut StdRng) -> Network {
        Network {
            partition: None,
            drop: rng.random_range(0..120),
            duplicate: rng.random_range(0..60),
            min_delay: rng.random_range(0..3),
            max_delay: rng.random_range(3..60),
        }
    }

    /// Cuts the group: `side` hears only itself, the others only themselves.
    pub fn partition(&mut self, side: BTreeSet<u64>) {
        self.partition = Some(side);
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        self.partition = None;
    }

    /// The current partition's side, if any.
    pub fn side(&self) -> Option<&BTreeSet<u64>> {
        self.partition.as_ref()
    }

    /// Whether replicas `a` and `b` can hear each other now.
    pub fn connected(&self, a: u64, b: u64) -> bool {
        match &self.partition {
            None => true,
            Some(side) => side.contains(&a) == side.contains(&b),
        }
    }

    /// What happens to one message from replica `from` to replica `to`: the delays of its
    /// deliveries (none when it is lost or the link is cut).
    pub fn fate(&self, rng: &mut StdRng, from: u64, to: u64) -> Vec<u64> {
        if !self.connected(from, to) {
            return Vec::new();
        }
        self.weather(rng)
    }

    /// The delays of one message's deliveries on a link no partition cuts (a client's).
    pub fn weather(&self, rng: &mut StdRng) -> Vec<u64> {
        if rng.random_range(0..1000) < self.drop {
            return Vec::new();
        }
        let mut delays = vec![rng.random_range(self.min_delay..=self.max_delay)];
        if rng.random_range(0..1000) < self.duplicate {
            delays.push(rng.random_range(self.min_delay..=self.max_delay * 2));
        }
        delays
    }
}
