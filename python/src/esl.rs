//! Bindings over the Rust ESLs (`escher-esl`), not reimplementations: data locality and
//! affinity, the head's native gangs, hierarchical fair share and queues. Each policy runs on
//! the session's client (`ClusterApi` is implemented for it) and hands Python a [`Spec`], the
//! requirements and hooks a task takes (`f.options(spec=...)`, `escher.submit(..., spec=...)`).

use std::sync::Arc;
use std::time::Duration;

use escher_client::Client;
use escher_esl::fair_share::Hfs as RustHfs;
use escher_esl::gang::{Gang as RustGang, GangRequest, GangScheduler, NativeGangs};
use escher_esl::locality::{Affinity as RustAffinity, DataLocality as RustDataLocality};
use escher_esl::queue::Queue as RustQueue;
use escher_esl::{Domain, EslError, ResourceSpec};
use escher_proto::types::{Capacity, GangStrategy, NodeId, ResourceSet, TaskId};
use pyo3::prelude::*;
use std::str::FromStr;

use crate::session::Session;
use crate::{EscherError, InvalidArgumentError, seconds, wait_for};

fn esl_error(e: EslError) -> PyErr {
    EscherError::new_err(e.to_string())
}

fn domain(nodes: Option<Vec<u64>>) -> Domain {
    match nodes {
        Some(nodes) => Domain::Nodes(nodes.into_iter().map(NodeId).collect()),
        None => Domain::All,
    }
}

/// What a policy asks of a task: resources to request, and resource updates on its start and
/// success. Specs of several policies compose with `and_`.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) inner: ResourceSpec,
}

#[pymethods]
impl Spec {
    /// Both specs on one task.
    fn and_(&self, other: &Spec) -> PyResult<Spec> {
        let inner = self.inner.clone().and(&other.inner).map_err(esl_error)?;
        Ok(Spec { inner })
    }

    /// The resources it requests, as `name=amount,...`.
    #[getter]
    fn resources(&self) -> String {
        self.inner.resources.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "Spec(resources={:?}, on_start={}, on_success={})",
            self.inner.resources.to_string(),
            self.inner.on_start.len(),
            self.inner.on_success.len()
        )
    }
}

fn spec(inner: ResourceSpec) -> Spec {
    Spec { inner }
}

/// Tasks run where their data is (P1): `register` marks a node, `consumer(id)` is the spec of
/// a task that reads the data, `produce(id)` of one that creates it (its node is marked when it
/// succeeds).
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct DataLocality {
    inner: Arc<RustDataLocality<Client>>,
}

#[pymethods]
impl DataLocality {
    #[new]
    fn new(session: &Session) -> DataLocality {
        DataLocality {
            inner: Arc::new(RustDataLocality::new(session.client())),
        }
    }

    /// Marks `node` as holding `data_id`.
    fn register(&self, py: Python<'_>, data_id: String, node: u64) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        wait_for(
            py,
            async move { inner.register(&data_id, NodeId(node)).await },
        )?
        .map_err(esl_error)
    }

    /// Forgets where `data_id` is.
    fn forget(&self, py: Python<'_>, data_id: String) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        wait_for(py, async move { inner.forget(&data_id).await })?.map_err(esl_error)
    }

    /// The spec of a task that reads `data_id`.
    #[staticmethod]
    fn consumer(data_id: &str) -> PyResult<Spec> {
        RustDataLocality::<Client>::consumer(data_id)
            .map(spec)
            .map_err(esl_error)
    }

    /// The spec of a task that produces `data_id` (its node is marked when it succeeds).
    #[staticmethod]
    fn produce(data_id: &str) -> PyResult<Spec> {
        RustDataLocality::<Client>::produce(data_id)
            .map(spec)
            .map_err(esl_error)
    }
}

/// Co-location of a group's tasks with its first one (the leader marks its node).
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Affinity {
    inner: Arc<RustAffinity<Client>>,
}

#[pymethods]
impl Affinity {
    #[new]
    fn new(session: &Session, name: &str) -> PyResult<Affinity> {
        let inner = RustAffinity::group(session.client(), name).map_err(esl_error)?;
        Ok(Affinity {
            inner: Arc::new(inner),
        })
    }

    /// The leader's spec: it marks its node when it starts.
    fn leader(&self) -> Spec {
        spec(self.inner.leader())
    }

    /// A follower's spec: it runs on the leader's node.
    fn follower(&self) -> Spec {
        spec(self.inner.follower())
    }

    /// Removes the group's marker.
    fn dissolve(&self, py: Python<'_>) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        wait_for(py, async move { inner.dissolve().await })?.map_err(esl_error)
    }
}

/// Gang scheduling by the head (the thesis' FrameSpace design): bundles held all or nothing.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Gangs {
    inner: Arc<NativeGangs<Client>>,
}

/// A gang that holds its bundles.
#[pyclass(module = "escher._escher")]
#[derive(Debug)]
pub(crate) struct Gang {
    inner: Option<RustGang>,
    gangs: Arc<NativeGangs<Client>>,
}

#[pymethods]
impl Gangs {
    #[new]
    #[pyo3(signature = (session, timeout=None))]
    fn new(session: &Session, timeout: Option<f64>) -> PyResult<Gangs> {
        let timeout: Option<Duration> = seconds(timeout, "timeout")?;
        Ok(Gangs {
            inner: Arc::new(NativeGangs::new(session.client(), timeout)),
        })
    }

    /// Places `bundles` (`name=amount,...` each) all or nothing and waits until they are held.
    #[pyo3(signature = (name, bundles, strategy="pack"))]
    fn acquire(
        &self,
        py: Python<'_>,
        name: &str,
        bundles: Vec<String>,
        strategy: &str,
    ) -> PyResult<Gang> {
        let strategy = GangStrategy::from_str(strategy)
            .map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
        let bundles = bundles
            .iter()
            .map(|b| {
                ResourceSet::from_str(b)
                    .map_err(|e| InvalidArgumentError::new_err(format!("bundle {b:?}: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let request = GangRequest::new(name, bundles)
            .map_err(esl_error)?
            .strategy(strategy);
        let gangs = Arc::clone(&self.inner);
        let gang =
            wait_for(py, async move { gangs.acquire(&request).await })?.map_err(esl_error)?;
        Ok(Gang {
            inner: Some(gang),
            gangs: Arc::clone(&self.inner),
        })
    }
}

impl Gang {
    fn held(&self) -> PyResult<&RustGang> {
        self.inner
            .as_ref()
            .ok_or_else(|| EscherError::new_err("this gang was released"))
    }
}

#[pymethods]
impl Gang {
    /// The tasks that hold the bundles.
    #[getter]
    fn holders(&self) -> PyResult<Vec<u64>> {
        Ok(self.held()?.holders().iter().map(|t| t.0).collect())
    }

    /// How many bundles.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.held()?.len())
    }

    /// The spec of a task that runs in bundle `i`.
    fn member(&self, i: usize) -> PyResult<Spec> {
        self.held()?
            .member(i)
            .map(spec)
            .ok_or_else(|| InvalidArgumentError::new_err(format!("the gang has no bundle {i}")))
    }

    /// Frees the bundles.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(gang) = self.inner.take() else {
            return Ok(());
        };
        let gangs = Arc::clone(&self.gangs);
        wait_for(py, async move { gangs.release(gang).await })?.map_err(esl_error)
    }
}

/// Hierarchical max-min fair sharing of nodes between weighted users.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Hfs {
    inner: RustHfs<Client>,
}

#[pymethods]
impl Hfs {
    /// An instance over `nodes` (every live node when `None`).
    #[new]
    #[pyo3(signature = (session, instance, nodes=None))]
    fn new(session: &Session, instance: &str, nodes: Option<Vec<u64>>) -> PyResult<Hfs> {
        let inner = RustHfs::new(session.client(), instance, domain(nodes)).map_err(esl_error)?;
        Ok(Hfs { inner })
    }

    /// Adds user `id` with `weight`; the spec of its tasks.
    fn create_user(&self, py: Python<'_>, id: String, weight: u64) -> PyResult<Spec> {
        let hfs = self.inner.clone();
        let user =
            wait_for(py, async move { hfs.create_user(&id, weight).await })?.map_err(esl_error)?;
        Ok(spec(user.spec()))
    }

    /// Tells the policy about tasks of `user` (their demand counts while they are pending or
    /// running).
    fn track(&self, user: &str, tasks: Vec<u64>) -> PyResult<()> {
        let tasks: Vec<TaskId> = tasks.into_iter().map(TaskId).collect();
        self.inner.track(user, &tasks).map_err(esl_error)
    }

    /// Recomputes the shares and applies them; nodes per user.
    fn rebalance(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, u64>> {
        let hfs = self.inner.clone();
        let done = wait_for(py, async move { hfs.rebalance().await })?.map_err(esl_error)?;
        Ok(done.shares)
    }
}

/// A queue (P3): its tasks wait on a resource whose capacity the application raises.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Queue {
    inner: Arc<tokio::sync::Mutex<RustQueue<Client>>>,
    spec: ResourceSpec,
}

#[pymethods]
impl Queue {
    /// A closed queue (capacity 0) on `nodes` (every live node when `None`).
    #[new]
    #[pyo3(signature = (session, name, nodes=None))]
    fn new(
        py: Python<'_>,
        session: &Session,
        name: String,
        nodes: Option<Vec<u64>>,
    ) -> PyResult<Queue> {
        let client = session.client();
        let domain = domain(nodes);
        let queue = wait_for(
            py,
            async move { RustQueue::create(client, &name, domain).await },
        )?
        .map_err(esl_error)?;
        let spec = queue.spec();
        Ok(Queue {
            inner: Arc::new(tokio::sync::Mutex::new(queue)),
            spec,
        })
    }

    /// The spec of a task that waits in the queue.
    fn spec(&self) -> Spec {
        Spec {
            inner: self.spec.clone(),
        }
    }

    /// Lets `k` more tasks through.
    fn release(&self, py: Python<'_>, k: u64) -> PyResult<Vec<u64>> {
        let queue = Arc::clone(&self.inner);
        let nodes =
            wait_for(py, async move { queue.lock().await.release(k).await })?.map_err(esl_error)?;
        Ok(nodes.into_iter().map(|n| n.0).collect())
    }

    /// Sets the queue's capacity to `k` (tasks at once).
    fn drain_to(&self, py: Python<'_>, k: u64) -> PyResult<Vec<u64>> {
        let queue = Arc::clone(&self.inner);
        let nodes = wait_for(py, async move { queue.lock().await.drain_to(k).await })?
            .map_err(esl_error)?;
        Ok(nodes.into_iter().map(|n| n.0).collect())
    }

    /// Closes the queue (capacity 0).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let queue = Arc::clone(&self.inner);
        wait_for(py, async move { queue.lock().await.close().await })?.map_err(esl_error)
    }

    /// The queue's capacity per node (`None`: unbounded).
    fn capacity(
        &self,
        py: Python<'_>,
    ) -> PyResult<std::collections::BTreeMap<u64, Option<String>>> {
        let queue = Arc::clone(&self.inner);
        let caps =
            wait_for(py, async move { queue.lock().await.capacity().await })?.map_err(esl_error)?;
        Ok(caps
            .into_iter()
            .map(|(n, c)| {
                let text = match c {
                    Capacity::Unbounded => None,
                    Capacity::Finite(a) => Some(a.to_string()),
                };
                (n.0, text)
            })
            .collect())
    }
}
