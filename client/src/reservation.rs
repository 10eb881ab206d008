//! Head-native reservations: [`Client::reserve`] and the [`Reservation`] handle.
//!
//! A reservation is gang scheduling done by the head itself (the thesis' *FrameSpace* design,
//! §4.6.2): its bundles are placed all or nothing, each held by a native holder task that no
//! worker runs. While bundle `I` of reservation `NAME` holds `{cpu: 2}` on its node, the head
//! creates `NAME.cpu` (summed over the bundles on that node) and `NAME-I.cpu` there; the gang's
//! tasks request those instead of `cpu`, so they run inside the reservation
//! ([`Reservation::resource`], [`Reservation::bundle_resource`]). Releasing cancels the
//! holders, which frees the bundles at once; tasks already running inside keep what they hold
//! until they end.
//!
//! ```no_run
//! # async fn demo(client: escher_client::Client) -> Result<(), escher_client::ClientError> {
//! use escher_client::Task;
//! use escher_proto::types::GangStrategy;
//!
//! let bundles = vec!["cpu=2".parse()?, "cpu=2".parse()?];
//! let gang = client.reserve("train", bundles, GangStrategy::StrictSpread, None).await?;
//! gang.ready(&client, None).await?; // every bundle is held
//! let workers = (0..2).map(|i| {
//!     Task::command(["./train.sh"]).resource(gang.bundle_resource(i, "cpu").unwrap(), 2)
//! });
//! let refs = client.submit_batch(workers).await?;
//! client.wait(&refs, refs.len(), None).await?;
//! gang.release(&client).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use escher_proto::convert::Problem;
use escher_proto::types::{
    ClusterEvent, GangStrategy, ReserveReply, ReserveRequest, WatchKind, WatchRequest,
};
use escher_proto::{ConvertError, ResourceName, ResourceSet, TaskId, TaskState, TaskStatus, wire};
use tokio::time::Instant;

use crate::args::IntoResourceName;
use crate::tasks::failure_reason;
use crate::{Client, ClientError};

/// A head-native reservation: its name, its bundles and their holder tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    name: ResourceName,
    bundles: Vec<ResourceSet>,
    tasks: Vec<TaskId>,
    placed: bool,
}

impl Client {
    /// Reserves `bundles` all or nothing, placed as `strategy` says, under `name` (an
    /// application resource name; the client's namespace qualifies it). With a `timeout`, the
    /// head cancels the whole reservation if it is not placed in time; without, it waits.
    ///
    /// Returns at once, placed or not: see [`Reservation::placed`] and
    /// [`Reservation::ready`].
    pub async fn reserve(
        &self,
        name: impl IntoResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> Result<Reservation, ClientError> {
        let name = name.into_resource_name()?;
        if bundles.is_empty() {
            return Err(ClientError::Usage(format!(
                "reservation {name} needs at least one bundle"
            )));
        }
        if let Some(i) = bundles.iter().position(ResourceSet::is_empty) {
            return Err(ClientError::Usage(format!(
                "bundle {i} of reservation {name} is empty; give it resources such as cpu=1"
            )));
        }
        let request = ReserveRequest {
            name: name.clone(),
            bundles: bundles.clone(),
            strategy,
            timeout,
            namespace: self.namespace().cloned(),
        };
        let ticket = self.ticket();
        let mut request = wire::ReserveRequest::from(request);
        request.key = Some(ticket.key().into());
        self.check_size("reserve", &request)?;
        let reply = self
            .call_write("reserve", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.reserve(request).await }
            })
            .await?;
        let reply = ReserveReply::from(reply);
        if reply.task_ids.len() != bundles.len() {
            let why = Problem::Rule("does not hold one holder task per bundle");
            return Err(ConvertError::new("task_ids", why).into());
        }
        Ok(Reservation {
            name,
            bundles,
            tasks: reply.task_ids,
            placed: reply.placed,
        })
    }
}

impl Reservation {
    /// The reservation's name, as given (unqualified names are qualified by the head).
    pub fn name(&self) -> &ResourceName {
        &self.name
    }

    /// The holder tasks, one per bundle, in bundle order. Cancelling them releases the
    /// reservation (`escher cancel ID...` does the same).
    pub fn tasks(&self) -> &[TaskId] {
        &self.tasks
    }

    /// What each bundle holds, in order.
    pub fn bundles(&self) -> &[ResourceSet] {
        &self.bundles
    }

    /// Whether every bundle was placed when the head answered `reserve`.
    pub fn placed(&self) -> bool {
        self.placed
    }

    /// `NAME.RES`: the resource a task requests to run on any bundle that holds `res`.
    pub fn resource(&self, res: impl IntoResourceName) -> Result<ResourceName, ClientError> {
        let res = res.into_resource_name()?;
        Ok(ResourceName::new(&format!(
            "{}.{}",
            self.name,
            res.local_part()
        ))?)
    }

    /// `NAME-I.RES`: the resource a task requests to run on bundle `i`.
    pub fn bundle_resource(
        &self,
        i: usize,
        res: impl IntoResourceName,
    ) -> Result<ResourceName, ClientError> {
        let res = res.into_resource_name()?;
        Ok(ResourceName::new(&format!(
            "{}-{i}.{}",
            self.name,
            res.local_part()
        ))?)
    }

    /// Every resource the reservation creates while it is held: `NAME.RES` for each resource
    /// of any bundle, then `NAME-I.RES` bundle by bundle.
    pub fn resources(&self) -> Vec<ResourceName> {
        let mut names: Vec<ResourceName> = Vec::new();
        for bundle in &self.bundles {
            for res in bundle.names() {
                if let Ok(name) = self.resource(res)
                    && !names.contains(&name)
                {
                    names.push(name);
                }
            }
        }
        for (i, bundle) in self.bundles.iter().enumerate() {
            names.extend(
                bundle
                    .names()
                    .filter_map(|r| self.bundle_resource(i, r).ok()),
            );
        }
        names
    }

    /// Waits until every bundle is held (each holder is running), from the head's events (a
    /// subscription and at most two status reads per holder, however long the wait). Fails with
    /// [`ClientError::ReservationTimeout`] if `timeout` passes first (`None`: no limit), and
    /// with [`ClientError::TaskFailed`] if a holder ended (the reservation was released, or
    /// its own timeout passed).
    pub async fn ready(
        &self,
        client: &Client,
        timeout: Option<Duration>,
    ) -> Result<(), ClientError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut pending = self.pending_holders(client, &self.tasks).await?;
        if pending.is_empty() {
            return Ok(());
        }
        // Every holder: one that ends while the others are awaited ends the wait.
        let request = WatchRequest::tasks(self.tasks.iter().copied())
            .kinds([WatchKind::Started, WatchKind::Finished]);
        let mut watch = client.watch(request).await?;
        // Read again once subscribed: a holder placed in between is not missed.
        let again: Vec<TaskId> = pending.iter().copied().collect();
        pending = self.pending_holders(client, &again).await?;
        while !pending.is_empty() {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, watch.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        return Err(ClientError::ReservationTimeout {
                            name: self.name.to_string(),
                            pending: pending.len(),
                            bundles: self.tasks.len(),
                            after: timeout.unwrap_or_default(),
                        });
                    }
                },
                None => watch.next().await,
            };
            let Some(event) = next else {
                return Err(ClientError::Unavailable {
                    url: client.head_url().to_string(),
                    message: "the watch of the reservation's holders ended".into(),
                });
            };
            match event?.event {
                ClusterEvent::Started { task, .. } => {
                    pending.remove(&task);
                }
                ClusterEvent::Finished { task, .. } => {
                    let status = client.task_info(task).await?.status;
                    return Err(self.holder_ended(&status));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Which of `holders` are still pending; an error if one ended.
    async fn pending_holders(
        &self,
        client: &Client,
        holders: &[TaskId],
    ) -> Result<BTreeSet<TaskId>, ClientError> {
        let mut pending = BTreeSet::new();
        for &id in holders {
            let status = client.task_info(id).await?.status;
            match status.state {
                TaskState::Running => {}
                TaskState::Pending => {
                    pending.insert(id);
                }
                _ => return Err(self.holder_ended(&status)),
            }
        }
        Ok(pending)
    }

    /// The error for a holder that ended while the reservation was awaited.
    fn holder_ended(&self, status: &TaskStatus) -> ClientError {
        ClientError::TaskFailed {
            id: status.id,
            state: status.state,
            reason: format!(
                "holder of reservation {}: {}",
                self.name,
                failure_reason(status)
            ),
        }
    }

    /// Releases the reservation: cancels every holder, which frees its bundle at once. Returns
    /// the holders' statuses afterwards.
    pub async fn release(&self, client: &Client) -> Result<Vec<TaskStatus>, ClientError> {
        client.cancel(self.tasks.iter().copied()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(name: &str) -> Reservation {
        Reservation {
            name: ResourceName::new(name).unwrap(),
            bundles: vec!["cpu=2".parse().unwrap(), "cpu=1,gpu=1".parse().unwrap()],
            tasks: vec![TaskId(1), TaskId(2)],
            placed: false,
        }
    }

    #[test]
    fn resource_names_follow_the_heads_scheme() {
        let r = reservation("train");
        assert_eq!(r.resource("cpu").unwrap().as_str(), "train.cpu");
        assert_eq!(r.bundle_resource(1, "gpu").unwrap().as_str(), "train-1.gpu");
        let all: Vec<String> = r.resources().iter().map(|n| n.to_string()).collect();
        assert_eq!(
            all,
            [
                "train.cpu",
                "train.gpu",
                "train-0.cpu",
                "train-1.cpu",
                "train-1.gpu"
            ]
        );
        let ns = reservation("app/train");
        assert_eq!(ns.resource("cpu").unwrap().as_str(), "app/train.cpu");
        assert!(r.resource("b@d").is_err());
        assert_eq!((r.tasks().len(), r.placed()), (2, false));
    }

    #[tokio::test]
    async fn bad_reservations_are_refused_before_sending() {
        let client = Client::connect_lazy("http://127.0.0.1:1").unwrap();
        let err = client
            .reserve("g", vec![], GangStrategy::Pack, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at least one bundle"), "{err}");
        let err = client
            .reserve("g", vec![ResourceSet::new()], GangStrategy::Pack, None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("bundle 0"), "{err}");
        let err = client
            .reserve("b@d", vec![ResourceSet::new()], GangStrategy::Pack, None)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Invalid(_)), "{err:?}");
    }
}
