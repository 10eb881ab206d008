//! The seam between scheduling libraries and a cluster: the ephemeral-resource API
//! (`set_resource`, `get_cluster_status`), plus submitting, cancelling and watching tasks, and
//! reading what running tasks report of their progress (task telemetry).
//!
//! ESLs are generic over [`ClusterApi`], implemented by the real [`escher_client::Client`]
//! (feature `grpc`, on by default) and by [`InMemoryCluster`](crate::InMemoryCluster) for unit
//! tests (feature `in-memory`). Nothing else of the cluster is
//! reachable from a policy: that is the thesis' claim, that every policy fits through this
//! narrow API.

use std::future::Future;
use std::time::Duration;

#[cfg(feature = "grpc")]
use escher_client::{Client, ClientError, Watch};
use escher_proto::types::{
    Capacity, CapacityOp, ClusterEvent, ClusterStatus, Delta, GangStrategy, MigChange, MigPlan,
    NodeGpus, NodeId, NodeSpec, PolicyRow, ReserveReply, ResourceName, ResourceSet, ResourceUpdate,
    TaskId, TaskSpec, TaskState, TaskStatus, TaskTelemetry, WatchEvent, WatchKind, WatchRequest,
};
use tokio::sync::mpsc;

use crate::EslError;

/// What an ESL may ask of a cluster.
///
/// Two kinds of types implement it:
///
/// - **a cluster** ([`Client`], [`InMemoryCluster`](crate::InMemoryCluster)) implements the
///   *primitives*, the methods from `set_resources` to `change_mig` (the in-memory cluster
///   runs no actors, so it leaves `call_actor` refused);
/// - **a decorator** (a `ClusterApi` in front of another one: [`Journal`](crate::Journal),
///   a test's recorder, a call counter) implements [`inner`](ClusterApi::inner), the cluster
///   it decorates, and only the primitives it changes: every other one goes to `inner`.
///
/// The conveniences (`set_resource`, `adjust_resource`, `delete_resource`, `update`,
/// `apply_mig_layout`) are built on the primitives *of the type itself*, so a decorator that
/// overrides `set_resources` sees them too.
///
/// ```
/// use escher_esl::{ClusterApi, EslError};
/// use escher_proto::types::{TaskId, TaskSpec};
///
/// /// Refuses tasks without a name, passes everything else through.
/// #[derive(Clone)]
/// struct Named<C>(C);
///
/// impl<C: ClusterApi> ClusterApi for Named<C> {
///     fn inner(&self) -> &impl ClusterApi {
///         &self.0
///     }
///
///     async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
///         if tasks.iter().any(|t| t.name.is_empty()) {
///             return Err(EslError::Refused("every task needs a name".into()));
///         }
///         self.0.submit(tasks).await
///     }
/// }
/// ```
///
/// A primitive that neither the type nor anything it decorates implements answers
/// [`EslError::Refused`] naming it (the default `inner` is [`Unsupported`]): a test fake may
/// implement only what its policy calls.
pub trait ClusterApi: Clone + Send + Sync + 'static {
    /// The cluster this one decorates: where the primitives it does not implement go. A
    /// cluster of its own implements every primitive and leaves this as it is
    /// ([`Unsupported`]). Policies call the methods, never this.
    fn inner(&self) -> &impl ClusterApi {
        &Unsupported
    }

    /// Applies resource changes, all or none; for each, the nodes it changed.
    fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> impl Future<Output = Result<Vec<Vec<NodeId>>, EslError>> + Send {
        self.inner().set_resources(updates)
    }

    /// Every node with its resources' totals and use.
    fn cluster_status(&self) -> impl Future<Output = Result<ClusterStatus, EslError>> + Send {
        self.inner().cluster_status()
    }

    /// Submits tasks; their ids in order.
    fn submit(
        &self,
        tasks: Vec<TaskSpec>,
    ) -> impl Future<Output = Result<Vec<TaskId>, EslError>> + Send {
        self.inner().submit(tasks)
    }

    /// Cancels tasks; their statuses afterwards.
    fn cancel(
        &self,
        tasks: Vec<TaskId>,
    ) -> impl Future<Output = Result<Vec<TaskStatus>, EslError>> + Send {
        self.inner().cancel(tasks)
    }

    /// A task's status now.
    fn status(&self, task: TaskId) -> impl Future<Output = Result<TaskStatus, EslError>> + Send {
        self.inner().status(task)
    }

    /// Waits until `num` of `tasks` are terminal, or `timeout`; the statuses of all of them.
    fn wait(
        &self,
        tasks: Vec<TaskId>,
        num: usize,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<TaskStatus>, EslError>> + Send {
        self.inner().wait(tasks, num, timeout)
    }

    /// Subscribes to the cluster's events that `request` selects, from now on (docs/DESIGN.md §11):
    /// how a policy learns that a task started or ended without polling its status.
    fn watch(
        &self,
        request: WatchRequest,
    ) -> impl Future<Output = Result<Events, EslError>> + Send {
        self.inner().watch(request)
    }

    /// Reserves `bundles` all or nothing under `name` (head-native gang scheduling): one
    /// holder task per bundle, and whether all were placed at once. While bundle `i` is held
    /// the head creates `name.RES` and `name-i.RES` on its node for each resource `RES` of the
    /// bundle; cancelling the holders releases it. With a `timeout` the head cancels the
    /// holders if they are not all placed in time.
    fn reserve(
        &self,
        name: ResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<ReserveReply, EslError>> + Send {
        self.inner().reserve(name, bundles, strategy, timeout)
    }

    /// The samples `tasks` reported as task telemetry (memory used, iterations, performance),
    /// oldest first, for the tasks that reported any; with `after_ms`, only those received
    /// after that time (ms since the epoch), so that a policy polling each round reads only
    /// what is new.
    fn telemetry(
        &self,
        tasks: Vec<TaskId>,
        after_ms: Option<u64>,
    ) -> impl Future<Output = Result<Vec<TaskTelemetry>, EslError>> + Send {
        self.inner().telemetry(tasks, after_ms)
    }

    /// Says where this policy's rows (its tenants, its queues) stand: `policy`'s latest report,
    /// which `escher status`, the dashboard and `/metrics` show (see
    /// [`Client::report_policy`]). Kept in memory by the head: report again every round.
    fn report_policy(
        &self,
        policy: String,
        rows: Vec<PolicyRow>,
    ) -> impl Future<Output = Result<(), EslError>> + Send {
        self.inner().report_policy(policy, rows)
    }

    /// Runs a pending, running or failed task again under its id with `resources` (see
    /// [`Client::requeue`]): how a GPU policy moves a job to a larger slice, keeping its
    /// identity.
    fn requeue(
        &self,
        task: TaskId,
        resources: ResourceSet,
    ) -> impl Future<Output = Result<TaskStatus, EslError>> + Send {
        self.inner().requeue(task, resources)
    }

    /// Calls method `method` of actor `actor` (an actor is a task: see
    /// [`escher_proto::types::ActorSpec`]) with `args` encoded as its class decodes them, and
    /// returns the answer's bytes: how a policy talks to the actors it placed (a GPU policy's
    /// serving replicas). Calls are not durable (as in Ray): a call to an incarnation that
    /// ends fails, and the policy hears of the end from the task's status.
    fn call_actor(
        &self,
        actor: TaskId,
        method: String,
        args: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, EslError>> + Send {
        self.inner().call_actor(actor, method, args)
    }

    /// Every node's GPUs: MIG slices with their placements and UUIDs, who holds each device,
    /// and the reconfiguration under way.
    fn gpus(&self) -> impl Future<Output = Result<Vec<NodeGpus>, EslError>> + Send {
        self.inner().gpus()
    }

    /// Asks for one change of one GPU's MIG instances (see [`Client::change_mig`]): a whole
    /// layout, one instance created or destroyed, or the steps toward a layout that leave busy
    /// instances alone. The change goes on in the background and shows in
    /// [`ClusterApi::gpus`], with what each phase took once it is done. A refusal says why as
    /// a type ([`EslError::mig_refusal`]).
    fn change_mig(
        &self,
        node: NodeId,
        gpu: u32,
        change: MigChange,
        drain: bool,
    ) -> impl Future<Output = Result<MigPlan, EslError>> + Send {
        self.inner().change_mig(node, gpu, change, drain)
    }

    /// Asks for one GPU's whole MIG layout, atomically ([`ClusterApi::change_mig`] with
    /// [`MigChange::Layout`]).
    fn apply_mig_layout(
        &self,
        node: NodeId,
        gpu: u32,
        layout: String,
        drain: bool,
    ) -> impl Future<Output = Result<MigPlan, EslError>> + Send {
        self.change_mig(node, gpu, MigChange::Layout(layout), drain)
    }

    /// Applies one resource change; the nodes it changed.
    fn update(
        &self,
        update: ResourceUpdate,
    ) -> impl Future<Output = Result<Vec<NodeId>, EslError>> + Send {
        async move {
            Ok(self
                .set_resources(vec![update])
                .await?
                .pop()
                .unwrap_or_default())
        }
    }

    /// Sets one resource.
    fn set_resource(
        &self,
        name: ResourceName,
        capacity: Capacity,
        target: NodeSpec,
    ) -> impl Future<Output = Result<Vec<NodeId>, EslError>> + Send {
        self.update(ResourceUpdate {
            name,
            op: CapacityOp::Set(capacity),
            target,
        })
    }

    /// Changes one resource by a delta.
    fn adjust_resource(
        &self,
        name: ResourceName,
        delta: Delta,
        target: NodeSpec,
    ) -> impl Future<Output = Result<Vec<NodeId>, EslError>> + Send {
        self.update(ResourceUpdate {
            name,
            op: CapacityOp::Adjust(delta),
            target,
        })
    }

    /// Deletes one resource.
    fn delete_resource(
        &self,
        name: ResourceName,
        target: NodeSpec,
    ) -> impl Future<Output = Result<Vec<NodeId>, EslError>> + Send {
        self.update(ResourceUpdate {
            name,
            op: CapacityOp::Delete,
            target,
        })
    }
}

/// The network client: a real cluster (feature `grpc`, on by default).
#[cfg(feature = "grpc")]
impl ClusterApi for Client {
    async fn report_policy(&self, policy: String, rows: Vec<PolicyRow>) -> Result<(), EslError> {
        Ok(Client::report_policy(self, &policy, &rows).await?)
    }

    async fn requeue(&self, task: TaskId, resources: ResourceSet) -> Result<TaskStatus, EslError> {
        Ok(Client::requeue(self, task, resources).await?)
    }

    async fn gpus(&self) -> Result<Vec<NodeGpus>, EslError> {
        Ok(Client::gpus(self).await?)
    }

    async fn call_actor(
        &self,
        actor: TaskId,
        method: String,
        args: Vec<u8>,
    ) -> Result<Vec<u8>, EslError> {
        let answer = self
            .actor_by_id(actor)
            .call_raw(&method, args.into())
            .await?;
        Ok(answer.to_vec())
    }

    async fn change_mig(
        &self,
        node: NodeId,
        gpu: u32,
        change: MigChange,
        drain: bool,
    ) -> Result<MigPlan, EslError> {
        Ok(Client::change_mig(self, node, gpu, change, drain).await?)
    }

    async fn telemetry(
        &self,
        tasks: Vec<TaskId>,
        after_ms: Option<u64>,
    ) -> Result<Vec<TaskTelemetry>, EslError> {
        Ok(Client::telemetry(self, tasks, after_ms).await?)
    }

    async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<Vec<NodeId>>, EslError> {
        let outcomes = Client::set_resources(self, updates).await?;
        Ok(outcomes.into_iter().map(|o| o.nodes).collect())
    }

    async fn cluster_status(&self) -> Result<ClusterStatus, EslError> {
        Ok(Client::cluster_status(self).await?)
    }

    async fn reserve(
        &self,
        name: ResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> Result<ReserveReply, EslError> {
        let r = Client::reserve(self, name, bundles, strategy, timeout).await?;
        Ok(ReserveReply {
            task_ids: r.tasks().to_vec(),
            placed: r.placed(),
        })
    }

    async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        let refs = self.submit_batch(tasks).await?;
        Ok(refs.iter().map(|r| r.id()).collect())
    }

    async fn cancel(&self, tasks: Vec<TaskId>) -> Result<Vec<TaskStatus>, EslError> {
        Ok(Client::cancel(self, tasks).await?)
    }

    async fn watch(&self, request: WatchRequest) -> Result<Events, EslError> {
        Ok(Events(Feed::Remote(Client::watch(self, request).await?)))
    }

    async fn status(&self, task: TaskId) -> Result<TaskStatus, EslError> {
        Ok(self.task_info(task).await?.status)
    }

    async fn wait(
        &self,
        tasks: Vec<TaskId>,
        num: usize,
        timeout: Duration,
    ) -> Result<Vec<TaskStatus>, EslError> {
        let num = num.min(tasks.len());
        let (mut ready, not_ready) =
            match Client::wait(self, tasks.clone(), num, Some(timeout)).await {
                Ok(answer) => answer,
                Err(ClientError::Timeout { .. }) => (Vec::new(), tasks.clone()),
                Err(e) => return Err(e.into()),
            };
        for id in not_ready {
            ready.push(self.task_info(id).await?.status);
        }
        Ok(ready)
    }
}

/// The cluster underneath a cluster of its own (the default [`ClusterApi::inner`]): it has
/// nothing, and answers every primitive with [`EslError::Refused`] naming it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsupported;

impl Unsupported {
    fn refuse<T>(what: &str) -> Result<T, EslError> {
        Err(EslError::Refused(format!(
            "this cluster does not implement ClusterApi::{what}"
        )))
    }
}

impl ClusterApi for Unsupported {
    async fn set_resources(&self, _: Vec<ResourceUpdate>) -> Result<Vec<Vec<NodeId>>, EslError> {
        Unsupported::refuse("set_resources")
    }

    async fn cluster_status(&self) -> Result<ClusterStatus, EslError> {
        Unsupported::refuse("cluster_status")
    }

    async fn submit(&self, _: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        Unsupported::refuse("submit")
    }

    async fn cancel(&self, _: Vec<TaskId>) -> Result<Vec<TaskStatus>, EslError> {
        Unsupported::refuse("cancel")
    }

    async fn status(&self, _: TaskId) -> Result<TaskStatus, EslError> {
        Unsupported::refuse("status")
    }

    async fn wait(
        &self,
        _: Vec<TaskId>,
        _: usize,
        _: Duration,
    ) -> Result<Vec<TaskStatus>, EslError> {
        Unsupported::refuse("wait")
    }

    async fn watch(&self, _: WatchRequest) -> Result<Events, EslError> {
        Unsupported::refuse("watch")
    }

    async fn reserve(
        &self,
        _: ResourceName,
        _: Vec<ResourceSet>,
        _: GangStrategy,
        _: Option<Duration>,
    ) -> Result<ReserveReply, EslError> {
        Unsupported::refuse("reserve")
    }

    async fn telemetry(
        &self,
        _: Vec<TaskId>,
        _: Option<u64>,
    ) -> Result<Vec<TaskTelemetry>, EslError> {
        Unsupported::refuse("telemetry")
    }

    async fn requeue(&self, _: TaskId, _: ResourceSet) -> Result<TaskStatus, EslError> {
        Unsupported::refuse("requeue")
    }

    async fn report_policy(&self, _: String, _: Vec<PolicyRow>) -> Result<(), EslError> {
        Unsupported::refuse("report_policy")
    }

    async fn gpus(&self) -> Result<Vec<NodeGpus>, EslError> {
        Unsupported::refuse("gpus")
    }

    async fn call_actor(&self, _: TaskId, _: String, _: Vec<u8>) -> Result<Vec<u8>, EslError> {
        Unsupported::refuse("call_actor")
    }

    async fn change_mig(
        &self,
        _: NodeId,
        _: u32,
        _: MigChange,
        _: bool,
    ) -> Result<MigPlan, EslError> {
        Unsupported::refuse("change_mig")
    }
}

/// A policy's feed of cluster events ([`ClusterApi::watch`]), in revision order.
#[derive(Debug)]
pub struct Events(Feed);

#[derive(Debug)]
enum Feed {
    #[cfg(feature = "grpc")]
    Remote(Watch),
    Local(mpsc::UnboundedReceiver<WatchEvent>),
}

impl Events {
    /// Events a test or an in-process cluster feeds through `rx`.
    pub fn local(rx: mpsc::UnboundedReceiver<WatchEvent>) -> Events {
        Events(Feed::Local(rx))
    }

    /// The next event; `None` once the feed ended.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, EslError>> {
        match &mut self.0 {
            #[cfg(feature = "grpc")]
            Feed::Remote(watch) => watch.next().await.map(|e| e.map_err(EslError::from)),
            Feed::Local(rx) => rx.recv().await.map(Ok),
        }
    }
}

/// How waiting for tasks to start ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Started {
    /// Every task left `Pending` (was dispatched).
    All,
    /// One of them ended (before starting, or after); its status.
    Ended(TaskStatus),
    /// The deadline passed with these still pending.
    TimedOut(Vec<TaskId>),
}

/// Waits until every task of `tasks` has been dispatched, one of them ends, or `deadline`
/// passes (`None`: no deadline), from the cluster's events: one subscription and at most two
/// status reads per task, however long the wait, where polling read every status every few
/// milliseconds.
pub async fn await_started<C: ClusterApi>(
    cluster: &C,
    tasks: &[TaskId],
    deadline: Option<tokio::time::Instant>,
) -> Result<Started, EslError> {
    let request =
        WatchRequest::tasks(tasks.iter().copied()).kinds([WatchKind::Started, WatchKind::Finished]);
    // Subscribing and reading the statuses at once answers a task that started already in
    // one round trip; for those still pending, a second read after the subscription is in
    // place closes the gap in which a start could go unseen.
    let (events, first) = tokio::join!(cluster.watch(request), pending(cluster, tasks));
    let mut events = events?;
    let mut waiting = match first? {
        Ok(waiting) => waiting,
        Err(ended) => return Ok(Started::Ended(ended)),
    };
    if !waiting.is_empty() {
        let again: Vec<TaskId> = waiting.iter().copied().collect();
        waiting = match pending(cluster, &again).await? {
            Ok(waiting) => waiting,
            Err(ended) => return Ok(Started::Ended(ended)),
        };
    }
    while !waiting.is_empty() {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, events.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(Started::TimedOut(waiting.into_iter().collect())),
            },
            None => events.next().await,
        };
        let Some(event) = next else {
            return Err(EslError::Refused("the cluster's event feed ended".into()));
        };
        match event?.event {
            ClusterEvent::Started { task, .. } => {
                waiting.remove(&task);
            }
            ClusterEvent::Finished { task, .. } => {
                return Ok(Started::Ended(cluster.status(task).await?));
            }
            _ => {}
        }
    }
    Ok(Started::All)
}

/// Which of `tasks` are still pending, or the status of one that ended.
async fn pending<C: ClusterApi>(
    cluster: &C,
    tasks: &[TaskId],
) -> Result<Result<std::collections::BTreeSet<TaskId>, TaskStatus>, EslError> {
    let mut waiting = std::collections::BTreeSet::new();
    for &task in tasks {
        let status = cluster.status(task).await?;
        match status.state {
            TaskState::Pending => {
                waiting.insert(task);
            }
            TaskState::Running => {}
            _ => return Ok(Err(status)),
        }
    }
    Ok(Ok(waiting))
}

#[cfg(all(test, feature = "in-memory"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use escher_proto::types::{Amount, Capacity};

    use super::*;
    use crate::{InMemoryCluster, Mode};

    /// Overrides `set_resources` alone, counting the batches.
    #[derive(Debug, Clone)]
    struct CountingSets {
        inner: InMemoryCluster,
        batches: Arc<AtomicUsize>,
    }

    impl ClusterApi for CountingSets {
        fn inner(&self) -> &impl ClusterApi {
            &self.inner
        }

        async fn set_resources(
            &self,
            updates: Vec<ResourceUpdate>,
        ) -> Result<Vec<Vec<NodeId>>, EslError> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.inner.set_resources(updates).await
        }
    }

    /// Implements one primitive and decorates nothing.
    #[derive(Debug, Clone)]
    struct NoGpus;

    impl ClusterApi for NoGpus {
        async fn gpus(&self) -> Result<Vec<NodeGpus>, EslError> {
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn a_decorator_sees_the_conveniences_and_forwards_what_it_does_not_override() {
        let inner = InMemoryCluster::new(Mode::Manual);
        let node = inner.add_node("cpu=1");
        let decorated = CountingSets {
            inner: inner.clone(),
            batches: Arc::default(),
        };
        let name = ResourceName::new("slots").unwrap();
        let two = Capacity::Finite(Amount::units(2).unwrap());
        decorated
            .set_resource(name.clone(), two, NodeSpec::Node(node))
            .await
            .unwrap();
        decorated
            .delete_resource(name.clone(), NodeSpec::Node(node))
            .await
            .unwrap();
        assert_eq!(decorated.batches.load(Ordering::SeqCst), 2);
        // Forwarded: the status is the inner cluster's.
        let status = decorated.cluster_status().await.unwrap();
        assert_eq!(status.nodes.len(), 1);
        assert!(status.nodes[0].resource("slots").is_none());
    }

    #[tokio::test]
    async fn a_primitive_nothing_implements_is_refused_by_name() {
        assert!(NoGpus.gpus().await.unwrap().is_empty());
        let err = NoGpus.submit(Vec::new()).await.unwrap_err();
        assert!(matches!(err, EslError::Refused(_)), "{err:?}");
        assert!(err.to_string().contains("ClusterApi::submit"), "{err}");
    }
}
