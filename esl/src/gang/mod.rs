//! Gang scheduling: every bundle of a group is held at once, or none is (thesis §4.4.2), in
//! the three designs the thesis compares (§4.6.2, Fig. 4.8), behind one small trait.
//!
//! - AppSpace, [`ghosts`]: each application submits one ghost task per bundle; if they are
//!   not all running within a timeout it rolls back (cancels them all) and retries after a
//!   seeded, jittered exponential back-off, which breaks live-lock.
//! - LibSpace, [`coordinator`]: a shared service takes gang requests from many applications
//!   and places them one at a time with ghosts, so no two gangs ever hold parts at once: no
//!   deadlock, hence no timeout and no live-lock, at the price of queueing.
//! - FrameSpace, [`native`]: the head places every bundle atomically
//!   ([`ClusterApi::reserve`](crate::ClusterApi::reserve)); no ghost, no worker involved.
//!
//! Whatever the design, a granted [`Gang`] looks the same: while bundle `I` of gang `NAME`
//! is held, its node has `NAME.RES` (summed over the gang's bundles there) and `NAME-I.RES`
//! for every resource `RES` of the bundle, the very names the head's reservations use. Member
//! tasks request those instead of the physical resources ([`Gang::member`] for "run in bundle
//! `I`", [`Gang::resource`] to share units of any bundle, as the thesis' 8 tasks each taking
//! one `gang-sched` unit of an 8-CPU ghost), so an application switches design without
//! touching its tasks. Releasing cancels the holders; members still running keep what they
//! hold until they end.
//!
//! # Layout
//!
//! - this file: [`GangRequest`], [`Gang`], the [`GangScheduler`] trait;
//! - `hold`: what the two ghost-based designs share (ghost specs, waiting for every ghost to
//!   run, rolling back);
//! - [`ghosts`], [`coordinator`], [`native`]: one design each.

use std::future::Future;

use escher_proto::types::{GangStrategy, ResourceName, ResourceSet, TaskId, TypeError};

use crate::{EslError, ResourceSpec};

pub mod coordinator;
pub mod ghosts;
mod hold;
pub mod native;

pub use coordinator::{CoordinatorConfig, GangCoordinator};
pub use ghosts::{GhostConfig, GhostGangs};
pub use native::NativeGangs;

/// A design of gang scheduling: acquire a gang's bundles all or none, and release them.
pub trait GangScheduler: Send + Sync {
    /// Returns once every bundle of `gang` is held, never with only some of them held.
    fn acquire(&self, gang: &GangRequest) -> impl Future<Output = Result<Gang, EslError>> + Send;

    /// Gives every bundle back, and returns once they are free.
    fn release(&self, gang: Gang) -> impl Future<Output = Result<(), EslError>> + Send;
}

/// What a gang needs: a name for its resources, its bundles, and how they may share nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangRequest {
    name: ResourceName,
    bundles: Vec<ResourceSet>,
    strategy: GangStrategy,
}

impl GangRequest {
    /// A gang named `name` (an application resource name, unique among the gangs held at one
    /// time) of `bundles`, placed with [`GangStrategy::Pack`]. Every resource name the gang
    /// will create (`NAME.RES`, `NAME-I.RES`, `NAME-spread`) is checked here.
    pub fn new(name: &str, bundles: Vec<ResourceSet>) -> Result<GangRequest, EslError> {
        let name = ResourceName::new(name)?;
        if name.is_physical() {
            return Err(TypeError::InvalidName {
                name: name.to_string(),
                why: "a gang is named like an application resource, not a physical one",
            }
            .into());
        }
        if bundles.is_empty() {
            return Err(EslError::Unsatisfiable(format!(
                "gang {name} has no bundle; give it at least one"
            )));
        }
        if let Some(i) = bundles.iter().position(ResourceSet::is_empty) {
            return Err(EslError::Unsatisfiable(format!(
                "bundle {i} of gang {name} is empty; give it resources such as cpu=1"
            )));
        }
        let request = GangRequest {
            name,
            bundles,
            strategy: GangStrategy::Pack,
        };
        request.spread_resource()?;
        for (i, bundle) in request.bundles.iter().enumerate() {
            for res in bundle.names() {
                request.gang_resource(None, res)?;
                request.gang_resource(Some(i), res)?;
            }
        }
        Ok(request)
    }

    /// The same gang placed with `strategy`. The ghost designs honour the strict strategies
    /// (one ghost for a strict pack, an anti-affinity resource for a strict spread) and treat
    /// pack and spread as no constraint; the native design honours all four.
    pub fn strategy(mut self, strategy: GangStrategy) -> GangRequest {
        self.strategy = strategy;
        self
    }

    /// The gang's name.
    pub fn name(&self) -> &ResourceName {
        &self.name
    }

    /// Its bundles, in order.
    pub fn bundles(&self) -> &[ResourceSet] {
        &self.bundles
    }

    /// How its bundles may share nodes.
    pub fn placement(&self) -> GangStrategy {
        self.strategy
    }

    /// `NAME.RES` (`bundle` absent) or `NAME-I.RES`.
    fn gang_resource(
        &self,
        bundle: Option<usize>,
        res: &ResourceName,
    ) -> Result<ResourceName, TypeError> {
        let local = res.local_part();
        match bundle {
            None => ResourceName::new(&format!("{}.{local}", self.name)),
            Some(i) => ResourceName::new(&format!("{}-{i}.{local}", self.name)),
        }
    }

    /// `NAME-spread`: capacity 1 on every node while a ghost design places a strict spread.
    fn spread_resource(&self) -> Result<ResourceName, TypeError> {
        ResourceName::new(&format!("{}-spread", self.name))
    }
}

/// A gang whose every bundle is held: what its member tasks request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    request: GangRequest,
    holders: Vec<TaskId>,
}

impl Gang {
    pub(crate) fn new(request: &GangRequest, holders: Vec<TaskId>) -> Gang {
        Gang {
            request: request.clone(),
            holders,
        }
    }

    /// The gang's name.
    pub fn name(&self) -> &ResourceName {
        &self.request.name
    }

    /// What was asked for.
    pub fn request(&self) -> &GangRequest {
        &self.request
    }

    /// The tasks that hold the bundles (ghosts, or the head's native holders).
    pub fn holders(&self) -> &[TaskId] {
        &self.holders
    }

    /// How many bundles it holds.
    pub fn len(&self) -> usize {
        self.request.bundles.len()
    }

    /// Whether it holds no bundle (never, for a granted gang).
    pub fn is_empty(&self) -> bool {
        self.request.bundles.is_empty()
    }

    /// The spec of the member that runs in bundle `i`: all of `NAME-I.RES` for the bundle's
    /// resources, and no physical resource. `None` past the last bundle.
    pub fn member(&self, i: usize) -> Option<ResourceSpec> {
        let bundle = self.request.bundles.get(i)?;
        let mut spec = ResourceSpec::new();
        for (res, amount) in bundle.iter() {
            let name = self.request.gang_resource(Some(i), res).ok()?;
            spec = spec.require(name, amount).ok()?;
        }
        Some(spec)
    }

    /// One member spec per bundle, in order.
    pub fn members(&self) -> Vec<ResourceSpec> {
        (0..self.len()).filter_map(|i| self.member(i)).collect()
    }

    /// `NAME.RES`: units of `res` held by any bundle of the gang (a task requesting
    /// `NAME.cpu: 1` runs on one CPU of whichever bundle has one free).
    pub fn resource(&self, res: &str) -> Result<ResourceName, EslError> {
        Ok(self.request.gang_resource(None, &ResourceName::new(res)?)?)
    }

    /// `NAME-I.RES`: units of `res` held by bundle `i`.
    pub fn bundle_resource(&self, i: usize, res: &str) -> Result<ResourceName, EslError> {
        Ok(self
            .request
            .gang_resource(Some(i), &ResourceName::new(res)?)?)
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> ResourceSet {
        s.parse().unwrap()
    }

    #[test]
    fn requests_are_checked_and_members_request_the_gangs_resources() {
        let req = GangRequest::new("g", vec![set("cpu=2"), set("cpu=1,gpu=1")]).unwrap();
        let gang = Gang::new(&req, vec![TaskId(7), TaskId(8)]);
        assert_eq!(gang.len(), 2);
        assert_eq!(
            gang.member(1).unwrap().resources.to_string(),
            "g-1.cpu=1,g-1.gpu=1"
        );
        assert_eq!(gang.members().len(), 2);
        assert!(gang.member(2).is_none());
        assert_eq!(gang.resource("cpu").unwrap().as_str(), "g.cpu");
        assert_eq!(gang.bundle_resource(0, "cpu").unwrap().as_str(), "g-0.cpu");

        assert!(GangRequest::new("cpu", vec![set("cpu=1")]).is_err());
        assert!(GangRequest::new("g", vec![]).is_err());
        assert!(GangRequest::new("g", vec![set("cpu=1"), set("")]).is_err());
        assert!(GangRequest::new(&"x".repeat(60), vec![set("cpu=1")]).is_err());
    }
}
