//! [`Session`]: a connected client, and the embedded cluster it owns when `escher.init()` was
//! called with no address. One method per client call; the package's Python code gives them
//! their Python shape (`TaskRef`, `Local`, `Node`, `Match`, exceptions with remote
//! tracebacks).

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use escher::LocalCluster;
use escher_client::{Client, ClientError, Credentials, Task};
use escher_proto::Namespace;
use escher_proto::types::{
    Capacity, GangStrategy, Grant, LogStream, NodeId, NodeSpec, ResourceSet, Role, TaskId,
    TaskResult, TaskState, TaskStatus, WatchRequest,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::actors::Actor;
use crate::esl::Spec;
use crate::watch::{EventStream, LogTail};
use crate::{InvalidArgumentError, error, seconds, wait_for};

/// A task's final (or current) status, as Python gets it: `(id, state, value, reason,
/// exit_code, node, attempt)`; `value` is what a function returned.
type StatusTuple = (
    u64,
    String,
    Option<Py<PyBytes>>,
    Option<String>,
    Option<i32>,
    Option<u64>,
    u32,
);

/// What [`Session::get_many`] returns: the ids and statuses of the items it got to, and the
/// exception that stopped it, if one did.
type Gotten = (Vec<u64>, Vec<StatusTuple>, Option<Py<PyAny>>);

/// A connected client of an escher cluster.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Session {
    client: Client,
    cluster: Mutex<Option<LocalCluster>>,
    nodes: Vec<u64>,
}

fn parse_set(text: &str, what: &str) -> PyResult<ResourceSet> {
    ResourceSet::from_str(text).map_err(|e| {
        InvalidArgumentError::new_err(format!(
            "{what} {text:?}: {e} (write it as name=amount,...)"
        ))
    })
}

/// Starts an embedded cluster (a head, or a raft group of `heads` replicas, and `workers`
/// workers in this process) and connects.
#[pyfunction]
#[pyo3(signature = (workers=1, resources=None, heads=1))]
pub(crate) fn start_local(
    py: Python<'_>,
    workers: usize,
    resources: Option<String>,
    heads: usize,
) -> PyResult<Session> {
    if heads == 0 {
        return Err(InvalidArgumentError::new_err(
            "an embedded cluster needs at least one head replica (num_heads=1 or more)",
        ));
    }
    if workers == 0 {
        return Err(InvalidArgumentError::new_err(
            "an embedded cluster needs at least one worker (num_workers=1 or more)",
        ));
    }
    let set = match resources.as_deref() {
        Some(text) if !text.trim().is_empty() => parse_set(text, "worker resources")?,
        _ => ResourceSet::new(),
    };
    let started = wait_for(py, async move {
        let mut builder = LocalCluster::builder().heads(heads).no_workers();
        for _ in 0..workers {
            builder = builder.worker(set.clone());
        }
        let cluster = builder
            .start()
            .await
            .map_err(|e| format!("cannot start the embedded cluster: {e}"))?;
        let client = cluster.client().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((cluster, client))
    })?;
    let (cluster, client) = started.map_err(crate::EscherError::new_err)?;
    let nodes = cluster.nodes().iter().map(|n| n.0).collect();
    Ok(Session {
        client,
        cluster: Mutex::new(Some(cluster)),
        nodes,
    })
}

/// Connects to a running cluster at `address` (else `ESCHER_HEAD`, else the default), with
/// `token` (else the task credential, `ESCHER_TOKEN` or the access file), in `namespace`, and
/// checks the token with one call.
#[pyfunction]
#[pyo3(signature = (address=None, token=None, namespace=None))]
pub(crate) fn connect(
    py: Python<'_>,
    address: Option<String>,
    token: Option<String>,
    namespace: Option<String>,
) -> PyResult<Session> {
    let url = address
        .filter(|a| !a.trim().is_empty())
        .or_else(|| {
            std::env::var("ESCHER_HEAD")
                .ok()
                .filter(|a| !a.trim().is_empty())
        })
        .unwrap_or_else(|| escher_client::DEFAULT_HEAD_URL.to_string());
    let namespace = match namespace.or_else(|| std::env::var("ESCHER_NAMESPACE").ok()) {
        Some(ns) if !ns.trim().is_empty() => Some(
            Namespace::new(ns.trim()).map_err(|e| InvalidArgumentError::new_err(e.to_string()))?,
        ),
        _ => None,
    };
    let client = wait_for(py, async move {
        let client = match token {
            Some(token) => {
                let urls: Vec<String> = url.split(',').map(|u| u.trim().to_string()).collect();
                let credentials =
                    Credentials::discover(&urls).with_token(token, "escher.init(token=...)");
                Client::connect_with(&url, credentials).await?
            }
            None => Client::connect(&url).await?,
        };
        let client = match namespace {
            Some(ns) => client.with_namespace(ns),
            None => client,
        };
        client.cluster_status().await?;
        Ok::<_, ClientError>(client)
    })?
    .map_err(error)?;
    Ok(Session {
        client,
        cluster: Mutex::new(None),
        nodes: Vec::new(),
    })
}

/// The node target of a resource call: `("local",)`, `("node", id)` or `("match", "cpu=1",
/// num_nodes)`, flattened.
fn target(
    kind: &str,
    node: Option<u64>,
    resources: Option<&str>,
    num_nodes: Option<u32>,
) -> PyResult<NodeSpec> {
    match kind {
        "local" => Ok(NodeSpec::Local),
        "node" => node
            .map(|n| NodeSpec::Node(NodeId(n)))
            .ok_or_else(|| InvalidArgumentError::new_err("Node(...) needs a node id")),
        "match" => Ok(NodeSpec::Match {
            resources: match resources {
                Some(text) if !text.trim().is_empty() => parse_set(text, "Match resources")?,
                _ => ResourceSet::new(),
            },
            num_nodes,
        }),
        other => Err(InvalidArgumentError::new_err(format!(
            "a node target is escher.Local, escher.Node(id) or escher.Match(...), not {other:?}"
        ))),
    }
}

fn state_text(status: &TaskStatus) -> String {
    status.state.to_string()
}

fn to_tuple(py: Python<'_>, status: TaskStatus) -> StatusTuple {
    let (value, code) = match &status.result {
        Some(TaskResult::Returned(bytes)) => (Some(PyBytes::new(py, bytes).unbind()), None),
        Some(TaskResult::Exited { code }) => (None, Some(*code)),
        _ => (None, None),
    };
    let reason = match (&status.reason, &status.result) {
        (Some(r), _) => Some(r.clone()),
        (
            None,
            Some(TaskResult::OutOfMemory {
                used_mib,
                limit_mib,
            }),
        ) => Some(format!(
            "out of memory: used {used_mib} MiB of {limit_mib} MiB"
        )),
        _ => None,
    };
    (
        status.id.0,
        state_text(&status),
        value,
        reason,
        code,
        status.node.map(|n| n.0),
        status.attempt,
    )
}

/// What both kinds of task share: resources, an ESL's spec, retries, timeout and name.
fn common(
    mut task: Task,
    resources: Option<&str>,
    spec: Option<&Spec>,
    retries: u32,
    timeout: Option<f64>,
    name: Option<String>,
) -> PyResult<Task> {
    if let Some(text) = resources {
        task = task.resources(parse_set(text, "resources")?);
    }
    if let Some(spec) = spec {
        task = spec.inner.apply(task);
    }
    task = task.max_retries(retries);
    if let Some(limit) = seconds(timeout, "timeout")? {
        task = task.timeout(limit);
    }
    if let Some(name) = name {
        task = task.name(name);
    }
    Ok(task)
}

/// `task` naming `objects` (references given to the call as arguments themselves) in its
/// `escher.objects` label: the head checks them at submission and places the task where a copy
/// is, and the worker hands the interpreter the store's files. Those past what the label holds
/// (256 bytes, about ten) are left out: the task reads them through the head as before.
fn object_args(mut task: Task, objects: &[(u64, u64)]) -> Task {
    use escher_proto::types::{ObjectId, format_object_args};
    let mut named = Vec::new();
    for &(owner, index) in objects {
        named.push(ObjectId(owner, index));
        if format_object_args(&named).len() > OBJECT_LABEL_BYTES {
            break;
        }
        task = task.object_arg_id(ObjectId(owner, index));
    }
    task
}

/// Names the tasks whose results a call reads (its `TaskRef` arguments), as many as one label
/// holds: the head then prefers the nodes holding those results (`Task::result_arg`).
fn result_args(mut task: Task, results: &[u64]) -> Task {
    use escher_proto::types::{TaskId, format_result_args};
    let mut named = Vec::new();
    for &id in results {
        named.push(TaskId(id));
        if format_result_args(&named).len() > OBJECT_LABEL_BYTES {
            break;
        }
        task = task.result_arg(TaskId(id));
    }
    task
}

/// The most bytes a label's value holds (`escher_proto::types::OBJECTS_LABEL`).
const OBJECT_LABEL_BYTES: usize = 256;

#[pymethods]
impl Session {
    /// The head's URL(s).
    #[getter]
    fn head_url(&self) -> String {
        self.client.head_url().to_string()
    }

    /// The embedded cluster's nodes (empty when connected to a running cluster).
    #[getter]
    fn nodes(&self) -> Vec<u64> {
        self.nodes.clone()
    }

    /// The admin token of the embedded cluster, if this session owns one.
    #[getter]
    fn admin_token(&self) -> Option<String> {
        let cluster = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        cluster.as_ref().map(|c| c.admin_token().to_string())
    }

    /// The namespace this session acts in.
    #[getter]
    fn namespace(&self) -> Option<String> {
        self.client.namespace().map(|n| n.to_string())
    }

    /// The same connection, speaking as running task `task` with its credential `token`, in
    /// `namespace` (none: this session's): what a warm interpreter's next task calls with,
    /// without a new connection to the head per task.
    #[pyo3(signature = (token, task, namespace=None))]
    fn for_task(&self, token: String, task: u64, namespace: Option<String>) -> PyResult<Session> {
        let client = self
            .client_in(namespace)?
            .with_token_from(token, "ESCHER_TASK_TOKEN")
            .with_caller_task(TaskId(task));
        Ok(Session {
            client,
            cluster: Mutex::new(None),
            nodes: Vec::new(),
        })
    }

    /// The same session, for attempt `attempt` of task `task` whose caller submitted it under
    /// object session `object_session` (its `escher.object-session` label): the task's `put`s
    /// go into that session and its tasks carry it (`Client::within_object_session`), so a
    /// reference the task returns outlives it, owned by the caller once it reads the result.
    fn in_object_session(&self, object_session: u64, task: u64, attempt: u32) -> Session {
        Session {
            client: self.client.clone().within_object_session(
                object_session,
                TaskId(task),
                attempt,
            ),
            cluster: Mutex::new(None),
            nodes: Vec::new(),
        }
    }

    /// Submits a Python function task (its argument bytes made by the package).
    #[pyo3(signature = (args, resources, retries=0, timeout=None, name=None, spec=None, objects=Vec::new(), results=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn submit_python(
        &self,
        py: Python<'_>,
        args: &[u8],
        resources: &str,
        retries: u32,
        timeout: Option<f64>,
        name: Option<String>,
        spec: Option<PyRef<'_, Spec>>,
        objects: Vec<(u64, u64)>,
        results: Vec<u64>,
    ) -> PyResult<u64> {
        let task = Task::function(escher::worker::PYTHON_FUNCTION, args.to_vec());
        let task = common(
            task,
            Some(resources),
            spec.as_deref(),
            retries,
            timeout,
            name,
        )?;
        self.submit(py, result_args(object_args(task, &objects), &results))
    }

    /// Submits a Python function task without waiting for the head's answer: the task is
    /// checked here (a bad spec raises at once), sent on the module's runtime (concurrent
    /// submissions share requests), and its id is known when [`Pending::id`] is first asked.
    #[pyo3(signature = (args, resources, retries=0, timeout=None, name=None, spec=None, objects=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn submit_python_nowait(
        &self,
        args: &[u8],
        resources: &str,
        retries: u32,
        timeout: Option<f64>,
        name: Option<String>,
        spec: Option<PyRef<'_, Spec>>,
        objects: Vec<(u64, u64)>,
    ) -> PyResult<Pending> {
        let task = Task::function(escher::worker::PYTHON_FUNCTION, args.to_vec());
        let task = common(
            task,
            Some(resources),
            spec.as_deref(),
            retries,
            timeout,
            name,
        )?;
        let task = object_args(task, &objects).build().map_err(error)?;
        let client = self.client.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        crate::runtime().spawn(async move {
            let _ = tx.send(client.submit(task).await.map(|r| r.id().0));
        });
        Ok(Pending {
            state: Arc::new(tokio::sync::Mutex::new(Submission::Sent(rx))),
        })
    }

    /// Submits many Python function tasks in one request; `args[i]` requests `resources[i]`.
    #[pyo3(signature = (args, resources, retries=0, timeout=None, name=None, spec=None, objects=Vec::new(), results=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn submit_python_batch(
        &self,
        py: Python<'_>,
        args: Vec<Vec<u8>>,
        resources: Vec<String>,
        retries: u32,
        timeout: Option<f64>,
        name: Option<String>,
        spec: Option<PyRef<'_, Spec>>,
        objects: Vec<Vec<(u64, u64)>>,
        results: Vec<Vec<u64>>,
    ) -> PyResult<Vec<u64>> {
        if !results.is_empty() && results.len() != args.len() {
            return Err(InvalidArgumentError::new_err(format!(
                "{} calls and {} lists of argument tasks",
                args.len(),
                results.len()
            )));
        }
        if !objects.is_empty() && objects.len() != args.len() {
            return Err(InvalidArgumentError::new_err(format!(
                "{} calls and {} lists of object arguments",
                args.len(),
                objects.len()
            )));
        }
        if args.len() != resources.len() {
            return Err(InvalidArgumentError::new_err(format!(
                "{} calls and {} resource sets",
                args.len(),
                resources.len()
            )));
        }
        let tasks = args
            .into_iter()
            .zip(&resources)
            .enumerate()
            .map(|(i, (bytes, res))| {
                let task = Task::function(escher::worker::PYTHON_FUNCTION, bytes);
                let task = common(
                    task,
                    Some(res),
                    spec.as_deref(),
                    retries,
                    timeout,
                    name.clone(),
                )?;
                let objects = objects.get(i).map(Vec::as_slice).unwrap_or_default();
                let results = results.get(i).map(Vec::as_slice).unwrap_or_default();
                result_args(object_args(task, objects), results)
                    .build()
                    .map_err(error)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let client = self.client.clone();
        let refs = wait_for(py, async move { client.submit_batch(tasks).await })?.map_err(error)?;
        Ok(refs.into_iter().map(|r| r.id().0).collect())
    }

    /// Submits a command task.
    #[pyo3(signature = (argv, env=Vec::new(), cwd=None, resources=None, retries=0, timeout=None, name=None, spec=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit_command(
        &self,
        py: Python<'_>,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        resources: Option<&str>,
        retries: u32,
        timeout: Option<f64>,
        name: Option<String>,
        spec: Option<PyRef<'_, Spec>>,
    ) -> PyResult<u64> {
        if argv.is_empty() {
            return Err(InvalidArgumentError::new_err(
                "a command task needs a program: argv is empty",
            ));
        }
        let mut task = Task::command(argv);
        for (k, v) in env {
            task = task.env(k, v);
        }
        if let Some(cwd) = cwd {
            task = task.cwd(cwd);
        }
        let task = common(task, resources, spec.as_deref(), retries, timeout, name)?;
        self.submit(py, task)
    }

    /// Dataflow (P2, raised by this client): once task `dep` has succeeded, creates the signal
    /// `signal` (unbounded, on every live node) that `dependents` request, and deletes it when
    /// they have all finished; if `dep` fails or is cancelled, cancels them (they could never
    /// start). Returns at once; the rest happens on the module's runtime.
    fn raise_after(&self, dep: u64, signal: String, dependents: Vec<u64>) {
        let client = self.client.clone();
        crate::runtime().spawn(async move {
            let every = || NodeSpec::Match {
                resources: ResourceSet::new(),
                num_nodes: None,
            };
            let ids: Vec<TaskId> = dependents.into_iter().map(TaskId).collect();
            match client.get(TaskId(dep), None).await {
                Ok(status) if status.state == TaskState::Succeeded => {
                    let raised = client
                        .set_resource(signal.as_str(), Capacity::Unbounded, every())
                        .await;
                    if raised.is_ok() {
                        let _ = client.wait(ids.clone(), ids.len(), None).await;
                        let _ = client.delete_resource(signal.as_str(), every()).await;
                    }
                }
                Ok(_) => {
                    let _ = client.cancel(ids).await;
                }
                // The session ended, or the head is gone: nothing left to do.
                Err(_) => {}
            }
        });
    }

    /// Waits for one task to finish (at most `timeout` seconds) and returns its status.
    #[pyo3(signature = (id, timeout=None))]
    fn get(&self, py: Python<'_>, id: u64, timeout: Option<f64>) -> PyResult<StatusTuple> {
        let timeout = seconds(timeout, "timeout")?;
        let client = self.client.clone();
        // A result kept as an object is read from its holder (`Client::with_result_bytes`).
        let status = wait_for(py, async move {
            let status = client.get(TaskId(id), timeout).await?;
            client.with_result_bytes(status, timeout).await
        })?
        .map_err(error)?;
        Ok(to_tuple(py, status))
    }

    /// Waits for several tasks in order, in one call (within `timeout` seconds for all): each
    /// item is a task id or a [`Pending`] submission. Returns the ids and statuses of the items
    /// it got to, up to and including the first task that did not succeed (what follows it is
    /// not waited for, as with one `get` per task), and the error that stopped it at the next
    /// item (a refused submission, the timeout), if any.
    #[pyo3(signature = (items, timeout=None))]
    fn get_many(
        &self,
        py: Python<'_>,
        items: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Gotten> {
        let timeout = seconds(timeout, "timeout")?;
        let items = items
            .iter()
            .map(|item| match item.cast::<Pending>() {
                Ok(pending) => Ok(Item::Pending(Arc::clone(&pending.get().state))),
                Err(_) => item.extract::<u64>().map(Item::Id).map_err(|_| {
                    InvalidArgumentError::new_err(format!(
                        "expected a task id or a pending submission, not {item}"
                    ))
                }),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let client = self.client.clone();
        let (statuses, stopped) = wait_for(py, async move {
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            let mut statuses = Vec::with_capacity(items.len());
            for item in items {
                let id = match item {
                    Item::Id(id) => id,
                    Item::Pending(state) => match answer(&state).await {
                        Ok(id) => id,
                        Err(e) => return (statuses, Some(Stop::Refused(e))),
                    },
                };
                let left =
                    deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
                match client.get(TaskId(id), left).await {
                    // The first task that did not succeed is the answer: what follows it is
                    // not waited for.
                    Ok(status) if status.state != TaskState::Succeeded => {
                        statuses.push(status);
                        return (statuses, None);
                    }
                    Ok(status) => match client.with_result_bytes(status, left).await {
                        Ok(status) => statuses.push(status),
                        Err(e) => return (statuses, Some(Stop::Client(e))),
                    },
                    Err(e) => return (statuses, Some(Stop::Client(e))),
                }
            }
            (statuses, None)
        })?;
        let ids = statuses.iter().map(|s| s.id.0).collect();
        let statuses = statuses.into_iter().map(|s| to_tuple(py, s)).collect();
        let stopped = stopped.map(|stop| {
            let err = match stop {
                Stop::Refused(e) => crate::error_ref(&e),
                Stop::Client(e) => error(e),
            };
            err.into_value(py).into_any()
        });
        Ok((ids, statuses, stopped))
    }

    /// A task's state now: `(state, reason, node, attempt)`, where `reason` says why a
    /// pending task waits (or why a finished one failed).
    fn task_info(
        &self,
        py: Python<'_>,
        id: u64,
    ) -> PyResult<(String, Option<String>, Option<u64>, u32)> {
        let client = self.client.clone();
        let info =
            wait_for(py, async move { client.task_info(TaskId(id)).await })?.map_err(error)?;
        let reason = info
            .pending_reason
            .as_ref()
            .map(ToString::to_string)
            .or(info.status.reason.clone());
        Ok((
            state_text(&info.status),
            reason,
            info.status.node.map(|n| n.0),
            info.status.attempt,
        ))
    }

    /// Ray's `wait`: the statuses of the finished tasks and the ids of the others.
    #[pyo3(signature = (ids, num_returns, timeout=None))]
    fn wait(
        &self,
        py: Python<'_>,
        ids: Vec<u64>,
        num_returns: usize,
        timeout: Option<f64>,
    ) -> PyResult<(Vec<StatusTuple>, Vec<u64>)> {
        let timeout = seconds(timeout, "timeout")?;
        let client = self.client.clone();
        let tasks: Vec<TaskId> = ids.into_iter().map(TaskId).collect();
        let (ready, not_ready) =
            wait_for(
                py,
                async move { client.wait(tasks, num_returns, timeout).await },
            )?
            .map_err(error)?;
        let ready = ready.into_iter().map(|s| to_tuple(py, s)).collect();
        Ok((ready, not_ready.into_iter().map(|t| t.0).collect()))
    }

    /// Cancels tasks (with `recursive`, their descendants too; with `force`, a running
    /// command is killed without its grace); their states afterwards.
    #[pyo3(signature = (ids, recursive=false, force=false))]
    fn cancel(
        &self,
        py: Python<'_>,
        ids: Vec<u64>,
        recursive: bool,
        force: bool,
    ) -> PyResult<Vec<StatusTuple>> {
        let client = self.client.clone();
        let tasks: Vec<TaskId> = ids.into_iter().map(TaskId).collect();
        let options = escher_client::CancelOptions { recursive, force };
        let statuses = wait_for(py, async move { client.cancel_with(tasks, options).await })?
            .map_err(error)?;
        Ok(statuses.into_iter().map(|s| to_tuple(py, s)).collect())
    }

    /// Creates or resizes a resource (`capacity`: a number or `unbounded`); the nodes changed.
    #[pyo3(signature = (name, capacity, kind, node=None, resources=None, num_nodes=None))]
    #[allow(clippy::too_many_arguments)]
    fn set_resource(
        &self,
        py: Python<'_>,
        name: String,
        capacity: String,
        kind: &str,
        node: Option<u64>,
        resources: Option<&str>,
        num_nodes: Option<u32>,
    ) -> PyResult<Vec<u64>> {
        let spec = target(kind, node, resources, num_nodes)?;
        let client = self.client.clone();
        let nodes = wait_for(py, async move {
            client
                .set_resource(name.as_str(), capacity.as_str(), spec)
                .await
        })?
        .map_err(error)?;
        Ok(nodes.into_iter().map(|n| n.0).collect())
    }

    /// Changes a resource by `delta` (`"+2"`, `"-1"`); the nodes changed.
    #[pyo3(signature = (name, delta, kind, node=None, resources=None, num_nodes=None))]
    #[allow(clippy::too_many_arguments)]
    fn adjust_resource(
        &self,
        py: Python<'_>,
        name: String,
        delta: String,
        kind: &str,
        node: Option<u64>,
        resources: Option<&str>,
        num_nodes: Option<u32>,
    ) -> PyResult<Vec<u64>> {
        let spec = target(kind, node, resources, num_nodes)?;
        let client = self.client.clone();
        let nodes = wait_for(py, async move {
            client
                .adjust_resource(name.as_str(), delta.as_str(), spec)
                .await
        })?
        .map_err(error)?;
        Ok(nodes.into_iter().map(|n| n.0).collect())
    }

    /// Deletes a resource; the nodes changed.
    #[pyo3(signature = (name, kind, node=None, resources=None, num_nodes=None))]
    fn delete_resource(
        &self,
        py: Python<'_>,
        name: String,
        kind: &str,
        node: Option<u64>,
        resources: Option<&str>,
        num_nodes: Option<u32>,
    ) -> PyResult<Vec<u64>> {
        let spec = target(kind, node, resources, num_nodes)?;
        let client = self.client.clone();
        let nodes = wait_for(py, async move {
            client.delete_resource(name.as_str(), spec).await
        })?
        .map_err(error)?;
        Ok(nodes.into_iter().map(|n| n.0).collect())
    }

    /// Every node with its resources, as JSON.
    fn cluster_status(&self, py: Python<'_>) -> PyResult<String> {
        let client = self.client.clone();
        let status = wait_for(py, async move { client.cluster_status().await })?.map_err(error)?;
        serde_json::to_string(&status).map_err(|e| crate::EscherError::new_err(e.to_string()))
    }

    /// The replicas of the head group (one for a lone head), each with its role, term and
    /// whether it answered, as JSON.
    fn heads(&self, py: Python<'_>) -> PyResult<String> {
        let client = self.client.clone();
        let heads = wait_for(py, async move { client.heads().await })?.map_err(error)?;
        serde_json::to_string(&heads).map_err(|e| crate::EscherError::new_err(e.to_string()))
    }

    /// What a command task wrote to `stream` (`stdout` or `stderr`) so far.
    fn logs<'py>(&self, py: Python<'py>, id: u64, stream: &str) -> PyResult<Bound<'py, PyBytes>> {
        let stream = match stream {
            "stdout" => LogStream::Stdout,
            "stderr" => LogStream::Stderr,
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "a log stream is \"stdout\" or \"stderr\", not {other:?}"
                )));
            }
        };
        let client = self.client.clone();
        let bytes =
            wait_for(py, async move { client.logs(TaskId(id), stream).await })?.map_err(error)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// A reader of what a command task writes to `stream`, piece by piece.
    fn follow_logs(&self, id: u64, stream: &str) -> PyResult<LogTail> {
        let stream = match stream {
            "stdout" => LogStream::Stdout,
            "stderr" => LogStream::Stderr,
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "a log stream is \"stdout\" or \"stderr\", not {other:?}"
                )));
            }
        };
        Ok(LogTail::new(self.client.log_reader(TaskId(id), stream)))
    }

    /// Reports samples of the calling task's progress (inside a task only).
    fn report(&self, py: Python<'_>, samples: Vec<(String, f64)>) -> PyResult<usize> {
        let client = self.client.clone();
        wait_for(py, async move {
            let pairs: Vec<(&str, f64)> = samples.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            client.report(&pairs).await
        })?
        .map_err(error)
    }

    /// The samples the tasks reported, as JSON.
    #[pyo3(signature = (ids, after_ms=None))]
    fn telemetry(&self, py: Python<'_>, ids: Vec<u64>, after_ms: Option<u64>) -> PyResult<String> {
        let client = self.client.clone();
        let found = wait_for(py, async move {
            client
                .telemetry(ids.into_iter().map(TaskId), after_ms)
                .await
        })?
        .map_err(error)?;
        serde_json::to_string(&found).map_err(|e| crate::EscherError::new_err(e.to_string()))
    }

    /// Watches task events (of `tasks`, or of everything this session may see).
    #[pyo3(signature = (tasks=Vec::new()))]
    fn watch(&self, py: Python<'_>, tasks: Vec<u64>) -> PyResult<EventStream> {
        let request = if tasks.is_empty() {
            WatchRequest::all()
        } else {
            WatchRequest::tasks(tasks.into_iter().map(TaskId))
        };
        let client = self.client.clone();
        let watch = wait_for(py, async move { client.watch(request).await })?.map_err(error)?;
        Ok(EventStream::new(watch))
    }

    /// Reserves bundles all or nothing (`strategy`: pack, spread, strict-pack, strict-spread);
    /// `(holder task ids, resource names)`.
    #[pyo3(signature = (name, bundles, strategy="pack", timeout=None))]
    fn reserve(
        &self,
        py: Python<'_>,
        name: String,
        bundles: Vec<String>,
        strategy: &str,
        timeout: Option<f64>,
    ) -> PyResult<(Vec<u64>, Vec<String>)> {
        let strategy = GangStrategy::from_str(strategy)
            .map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
        let bundles = bundles
            .iter()
            .map(|b| parse_set(b, "bundle"))
            .collect::<PyResult<Vec<_>>>()?;
        let timeout = seconds(timeout, "timeout")?;
        let client = self.client.clone();
        let reservation = wait_for(py, async move {
            let r = client
                .reserve(name.as_str(), bundles, strategy, None)
                .await?;
            r.ready(&client, timeout).await?;
            Ok::<_, ClientError>(r)
        })?
        .map_err(error)?;
        Ok((
            reservation.tasks().iter().map(|t| t.0).collect(),
            reservation
                .resources()
                .iter()
                .map(|r| r.to_string())
                .collect(),
        ))
    }

    /// Creates a token (`role`: admin, app, reader, worker); an app token needs a namespace.
    #[pyo3(signature = (role, namespace=None, description=String::new()))]
    fn create_token(
        &self,
        py: Python<'_>,
        role: &str,
        namespace: Option<String>,
        description: String,
    ) -> PyResult<String> {
        let role =
            Role::from_str(role).map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
        let namespace = namespace
            .map(|ns| Namespace::new(&ns))
            .transpose()
            .map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
        let grant = Grant::new(role, namespace)
            .map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
        let client = self.client.clone();
        let created = wait_for(
            py,
            async move { client.create_token(grant, description).await },
        )?
        .map_err(error)?;
        Ok(created.token)
    }

    /// Creates a Python actor (its constructor's envelope made by the package:
    /// worker/src/python/actor.rs) and returns its handle at once; the creation is durable
    /// when this returns. `namespace` creates it in another namespace than the session's (an
    /// admin's session may).
    #[pyo3(signature = (args, resources, max_restarts=0, max_task_retries=0, max_concurrency=1, name=None, detached=false, namespace=None, spec=None))]
    #[allow(clippy::too_many_arguments)]
    fn create_actor(
        &self,
        py: Python<'_>,
        args: &[u8],
        resources: &str,
        max_restarts: u32,
        max_task_retries: u32,
        max_concurrency: u32,
        name: Option<String>,
        detached: bool,
        namespace: Option<String>,
        spec: Option<PyRef<'_, Spec>>,
    ) -> PyResult<Actor> {
        let label = name.clone();
        let mut task = Task::actor(escher::worker::PYTHON_ACTOR_CLASS, args.to_vec())
            .max_concurrency(max_concurrency)
            .max_task_retries(max_task_retries);
        if let Some(name) = name {
            task = task.actor_name(name);
        }
        if detached {
            task = task.detached();
        }
        let task = common(task, Some(resources), spec.as_deref(), 0, None, label)?
            .max_restarts(max_restarts)
            .build()
            .map_err(error)?;
        let client = self.client_in(namespace)?;
        let handle = wait_for(py, async move { client.actor(task).await })?.map_err(error)?;
        Ok(Actor::new(handle))
    }

    /// A handle to the actor `id` (dropping it never kills the actor).
    fn actor_by_id(&self, id: u64) -> Actor {
        let client = self.client.clone();
        // Made on the runtime: a handle's clean-up runs there.
        let handle = crate::runtime().block_on(async move { client.actor_by_id(TaskId(id)) });
        Actor::new(handle)
    }

    /// A handle to the live actor named `name` in the namespace of the session's token (the
    /// head resolves names there).
    #[pyo3(signature = (name, namespace=None))]
    fn actor_named(
        &self,
        py: Python<'_>,
        name: String,
        namespace: Option<String>,
    ) -> PyResult<Actor> {
        let client = self.client_in(namespace)?;
        let handle =
            wait_for(py, async move { client.actor_named(&name).await })?.map_err(error)?;
        Ok(Actor::new(handle))
    }

    /// Opens the client's object session now (`escher.init` does, for a driver), so that the
    /// result objects of the tasks it submits go when it shuts down or dies, as its `put`s go.
    /// `None` for a token that may not write (a reader, who submits nothing).
    fn open_object_session(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let client = self.client.clone();
        match wait_for(py, async move { client.open_object_session().await })? {
            Ok(session) => Ok(Some(session)),
            Err(ClientError::PermissionDenied(_)) => Ok(None),
            Err(e) => Err(error(e)),
        }
    }

    /// Closes the client's object session (every object it put is released at once), then
    /// stops the embedded cluster, if this session owns one. A head that cannot be reached to
    /// close is not an error here: the session lapses on its own.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.client.clone();
        // Unreachable, the session lapses instead: nothing to tell the caller.
        let _ = wait_for(py, async move { client.close_object_session().await })?;
        let cluster = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(cluster) = cluster {
            wait_for(py, cluster.shutdown())?;
        }
        Ok(())
    }
}

impl Session {
    /// The session's client, in `namespace` when one is given.
    fn client_in(&self, namespace: Option<String>) -> PyResult<Client> {
        match namespace {
            Some(ns) => {
                let ns = Namespace::new(ns.trim())
                    .map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
                Ok(self.client.clone().with_namespace(ns))
            }
            None => Ok(self.client.clone()),
        }
    }

    /// The session's client (the ESL bindings run their policies on it).
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    fn submit(&self, py: Python<'_>, task: Task) -> PyResult<u64> {
        let client = self.client.clone();
        let task = task.build().map_err(error)?;
        let submitted = wait_for(py, async move { client.submit(task).await })?.map_err(error)?;
        Ok(submitted.id().0)
    }
}

/// A task submitted without waiting: its id once the head has answered.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct Pending {
    state: Arc<tokio::sync::Mutex<Submission>>,
}

/// Where a submission made without waiting stands.
#[derive(Debug)]
enum Submission {
    /// Sent; the head's answer comes on this channel.
    Sent(tokio::sync::oneshot::Receiver<Result<u64, ClientError>>),
    /// Answered: the task's id, or why it was refused.
    Answered(Result<u64, Arc<ClientError>>),
}

#[pymethods]
impl Pending {
    /// The task's id, waiting for the head's answer the first time; the submission's error if
    /// the head refused it.
    fn id(&self, py: Python<'_>) -> PyResult<u64> {
        // Answered already: no trip through the runtime.
        if let Ok(state) = self.state.try_lock()
            && let Submission::Answered(answer) = &*state
        {
            return answer.clone().map_err(|e| crate::error_ref(&e));
        }
        let state = Arc::clone(&self.state);
        let answer = wait_for(py, async move { answer(&state).await })?;
        answer.map_err(|e| crate::error_ref(&e))
    }
}

/// The head's answer to a submission sent without waiting, waiting for it the first time.
async fn answer(state: &tokio::sync::Mutex<Submission>) -> Result<u64, Arc<ClientError>> {
    let mut state = state.lock().await;
    if let Submission::Sent(rx) = &mut *state {
        let answer = match rx.await {
            Ok(answer) => answer.map_err(Arc::new),
            Err(_) => Err(Arc::new(ClientError::Usage(
                "the submission was dropped before the head answered (the session ended)".into(),
            ))),
        };
        *state = Submission::Answered(answer);
    }
    match &*state {
        Submission::Answered(answer) => answer.clone(),
        Submission::Sent(_) => unreachable!("answered above"),
    }
}

/// One item of [`Session::get_many`].
enum Item {
    Id(u64),
    Pending(Arc<tokio::sync::Mutex<Submission>>),
}

/// Why [`Session::get_many`] stopped before the end.
enum Stop {
    Refused(Arc<ClientError>),
    Client(ClientError),
}
