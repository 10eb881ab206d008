//! [`Barrier`]: tasks that start only after `n` parties have all succeeded (thesis §4.4.1
//! P2: "barrier synchronization is naturally supported ... T could simply request a single
//! unit of resource created by each of [its predecessors] upon their respective completion").
//!
//! Party `i` raises `bar-<name>-<i>`; a waiter requests one unit of each. Any number of
//! waiters can pass once the barrier is open, since the signals are unbounded.

use super::{Signal, withdraw_all};
use crate::policy::{Policy, er_name};
use crate::{ClusterApi, EslError, ResourceSpec};

/// A barrier for a fixed number of parties.
#[derive(Debug, Clone)]
pub struct Barrier<C> {
    cluster: C,
    name: String,
    signals: Vec<Signal>,
}

/// The two sides of a barrier, the key of its [`Policy`] implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Party `i`, which opens its part of the barrier when it succeeds.
    Party(usize),
    /// A task that waits for every party.
    Waiter,
}

impl<C: ClusterApi> Barrier<C> {
    /// A barrier for `parties` parties, with signals `bar-<name>-<i>`.
    pub fn new(cluster: C, name: &str, parties: usize) -> Result<Barrier<C>, EslError> {
        if parties == 0 {
            return Err(EslError::Unsatisfiable(format!(
                "barrier {name:?} needs at least one party"
            )));
        }
        let signals = (0..parties)
            .map(|i| Ok(Signal::new(er_name(&["bar", name, &i.to_string()])?)))
            .collect::<Result<Vec<_>, EslError>>()?;
        Ok(Barrier {
            cluster,
            name: name.to_string(),
            signals,
        })
    }

    /// Party `i`'s spec.
    pub fn party(&self, i: usize) -> Result<ResourceSpec, EslError> {
        let signal = self.signals.get(i).ok_or_else(|| {
            EslError::Unsatisfiable(format!(
                "barrier {:?} has {} parties (numbered from 0), not {}",
                self.name,
                self.signals.len(),
                i + 1
            ))
        })?;
        Ok(signal.raiser())
    }

    /// A waiter's spec: one unit of every party's signal.
    pub fn waiter(&self) -> Result<ResourceSpec, EslError> {
        self.signals
            .iter()
            .try_fold(ResourceSpec::new(), |spec, s| spec.and(&s.waiter()))
    }

    /// Withdraws the signals, closing the barrier again (waiters already running go on).
    pub async fn reset(&self) -> Result<(), EslError> {
        withdraw_all(&self.cluster, &self.signals).await
    }
}

impl<C: ClusterApi> Policy for Barrier<C> {
    type Key = Side;

    async fn spec_for(&mut self, side: &Side) -> Result<ResourceSpec, EslError> {
        match side {
            Side::Party(i) => self.party(*i),
            Side::Waiter => self.waiter(),
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::TaskState;

    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    #[tokio::test]
    async fn waiters_start_only_after_every_party_succeeded() {
        let mut rng = Rng::new(3);
        for round in 0..30 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            for _ in 0..rng.range(1, 4) {
                cluster.add_node("cpu=32");
            }
            let parties = rng.range(1, 6) as usize;
            let mut barrier = Barrier::new(cluster.clone(), &format!("b{round}"), parties).unwrap();
            let waiter = barrier.spec_for(&Side::Waiter).await.unwrap();
            let waiters = cluster
                .submit(vec![task("cpu=1", &waiter); rng.range(1, 4) as usize])
                .await
                .unwrap();
            let mut party_ids = Vec::new();
            for i in 0..parties {
                let spec = barrier.spec_for(&Side::Party(i)).await.unwrap();
                party_ids.push(cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap()[0]);
            }
            rng.shuffle(&mut party_ids);
            for (k, p) in party_ids.iter().enumerate() {
                for w in &waiters {
                    let state = cluster.status(*w).await.unwrap().state;
                    assert_eq!(
                        state,
                        TaskState::Pending,
                        "round {round}: {k}/{parties} arrived"
                    );
                }
                // A failure on the way is retried by hand here: the party must succeed.
                cluster.finish(*p, true);
            }
            for w in &waiters {
                assert_eq!(cluster.status(*w).await.unwrap().state, TaskState::Running);
            }
            barrier.reset().await.unwrap();
            let late = cluster.submit(vec![task("cpu=1", &waiter)]).await.unwrap()[0];
            assert_eq!(
                cluster.status(late).await.unwrap().state,
                TaskState::Pending
            );
        }
    }

    #[test]
    fn a_barrier_needs_parties_and_valid_indices() {
        let cluster = InMemoryCluster::new(Mode::Instant);
        assert!(Barrier::new(cluster.clone(), "z", 0).is_err());
        let b = Barrier::new(cluster, "two", 2).unwrap();
        assert!(b.party(2).is_err());
        assert_eq!(
            b.waiter().unwrap().resources.to_string(),
            "bar-two-0=1,bar-two-1=1"
        );
    }
}
