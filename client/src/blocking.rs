//! [`BlockingClient`]: the same API for programs without an async runtime.
//!
//! It owns a small tokio runtime (one worker thread, which also keeps the HTTP/2 connection
//! alive between calls) and runs each [`Client`] method to completion on it, as mini-redis'
//! blocking client does. Clones share the runtime and the connection, so a `BlockingClient`
//! can be handed to several threads.
//!
//! Do not create or use one inside an async context: blocking a runtime thread on another
//! runtime panics. Async code should use [`Client`] directly.
//!
//! Objects: [`BlockingClient::put`] opens the client's object session as [`Client::put`]
//! does, and the session owns the client's `put`s and the result objects of the tasks it
//! submits from then on. The background task that renews the session runs on the owned
//! runtime, which ends with the last clone: call [`BlockingClient::close_object_session`]
//! before dropping the client to release them at once (otherwise the head releases them once
//! the session lapses, 30 s by default).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use escher_proto::types::{GangStrategy, ObjectId, SetResourceOutcome};
use escher_proto::{
    ClusterStatus, LogStream, Namespace, NodeId, NodeSpec, ResourceSet, ResourceUpdate, TaskId,
    TaskInfo, TaskResult, TaskState, TaskStatus, TaskSummary,
};
use serde::de::DeserializeOwned;
use tokio::runtime::Runtime;

use crate::args::{IntoCapacity, IntoDelta, IntoResourceName};
use crate::builder::IntoTaskSpec;
use crate::{Client, ClientError, ClosedSession, ObjectRef, Reservation, TaskRef};

/// A blocking connection to an escher head: every [`Client`] method, run to completion.
#[derive(Debug, Clone)]
pub struct BlockingClient {
    inner: Client,
    rt: Arc<Runtime>,
}

fn runtime() -> Result<Arc<Runtime>, ClientError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("escher-client")
        .enable_all()
        .build()
        .map(Arc::new)
        .map_err(|e| ClientError::Usage(format!("cannot start the client's runtime: {e}")))
}

impl BlockingClient {
    /// Connects to the head at `url`; see [`Client::connect`].
    pub fn connect(url: impl AsRef<str>) -> Result<BlockingClient, ClientError> {
        let rt = runtime()?;
        let inner = rt.block_on(Client::connect(url))?;
        Ok(BlockingClient { inner, rt })
    }

    /// Connects to the head named by the environment; see [`Client::from_env`].
    pub fn from_env() -> Result<BlockingClient, ClientError> {
        let rt = runtime()?;
        let inner = rt.block_on(Client::from_env())?;
        Ok(BlockingClient { inner, rt })
    }

    /// A client that connects on its first call; see [`Client::connect_lazy`].
    pub fn connect_lazy(url: impl AsRef<str>) -> Result<BlockingClient, ClientError> {
        let rt = runtime()?;
        let inner = {
            let _guard = rt.enter();
            Client::connect_lazy(url)?
        };
        Ok(BlockingClient { inner, rt })
    }

    /// The same connection in namespace `ns`; see [`Client::with_namespace`].
    pub fn with_namespace(self, ns: Namespace) -> BlockingClient {
        self.map(|c| c.with_namespace(ns))
    }

    /// The same connection speaking for task `id`; see [`Client::with_caller_task`].
    pub fn with_caller_task(self, id: TaskId) -> BlockingClient {
        self.map(|c| c.with_caller_task(id))
    }

    /// The same connection speaking for no task; see [`Client::without_caller_task`].
    pub fn without_caller_task(self) -> BlockingClient {
        self.map(Client::without_caller_task)
    }

    fn map(self, f: impl FnOnce(Client) -> Client) -> BlockingClient {
        BlockingClient {
            inner: f(self.inner),
            rt: self.rt,
        }
    }

    /// The async client underneath.
    pub fn client(&self) -> &Client {
        &self.inner
    }

    fn run<T>(&self, fut: impl Future<Output = T>) -> T {
        self.rt.block_on(fut)
    }

    /// See [`Client::submit`].
    pub fn submit(&self, task: impl IntoTaskSpec) -> Result<TaskRef, ClientError> {
        self.run(self.inner.submit(task))
    }

    /// See [`Client::submit_batch`].
    pub fn submit_batch<I>(&self, tasks: I) -> Result<Vec<TaskRef>, ClientError>
    where
        I: IntoIterator,
        I::Item: IntoTaskSpec,
    {
        self.run(self.inner.submit_batch(tasks))
    }

    /// See [`Client::get`].
    pub fn get(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<TaskStatus, ClientError> {
        self.run(self.inner.get(task, timeout))
    }

    /// See [`Client::get_result`].
    pub fn get_result(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<TaskResult, ClientError> {
        self.run(self.inner.get_result(task, timeout))
    }

    /// See [`Client::get_bytes`].
    pub fn get_bytes(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, ClientError> {
        self.run(self.inner.get_bytes(task, timeout))
    }

    /// See [`Client::get_typed`].
    pub fn get_typed<R: DeserializeOwned>(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<R, ClientError> {
        self.run(self.inner.get_typed(task, timeout))
    }

    /// See [`Client::wait`].
    pub fn wait<I>(
        &self,
        tasks: I,
        num_returns: usize,
        timeout: Option<Duration>,
    ) -> Result<(Vec<TaskStatus>, Vec<TaskId>), ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        self.run(self.inner.wait(tasks, num_returns, timeout))
    }

    /// See [`Client::cancel`].
    pub fn cancel<I>(&self, tasks: I) -> Result<Vec<TaskStatus>, ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        self.run(self.inner.cancel(tasks))
    }

    /// See [`Client::cancel_with`].
    pub fn cancel_with<I>(
        &self,
        tasks: I,
        options: crate::CancelOptions,
    ) -> Result<Vec<TaskStatus>, ClientError>
    where
        I: IntoIterator,
        I::Item: Into<TaskId>,
    {
        self.run(self.inner.cancel_with(tasks, options))
    }

    /// See [`Client::requeue`].
    pub fn requeue(
        &self,
        task: impl Into<TaskId>,
        resources: ResourceSet,
    ) -> Result<TaskStatus, ClientError> {
        self.run(self.inner.requeue(task, resources))
    }

    /// See [`Client::task_info`].
    pub fn task_info(&self, task: impl Into<TaskId>) -> Result<TaskInfo, ClientError> {
        self.run(self.inner.task_info(task))
    }

    /// See [`Client::list_tasks`].
    pub fn list_tasks(
        &self,
        state: Option<TaskState>,
        limit: Option<usize>,
    ) -> Result<Vec<TaskSummary>, ClientError> {
        self.run(self.inner.list_tasks(state, limit))
    }

    /// See [`Client::logs`].
    pub fn logs(&self, task: impl Into<TaskId>, stream: LogStream) -> Result<Vec<u8>, ClientError> {
        self.run(self.inner.logs(task, stream))
    }

    /// See [`Client::set_resource`].
    pub fn set_resource(
        &self,
        name: impl IntoResourceName,
        capacity: impl IntoCapacity,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.run(self.inner.set_resource(name, capacity, target))
    }

    /// See [`Client::adjust_resource`].
    pub fn adjust_resource(
        &self,
        name: impl IntoResourceName,
        delta: impl IntoDelta,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.run(self.inner.adjust_resource(name, delta, target))
    }

    /// See [`Client::delete_resource`].
    pub fn delete_resource(
        &self,
        name: impl IntoResourceName,
        target: NodeSpec,
    ) -> Result<Vec<NodeId>, ClientError> {
        self.run(self.inner.delete_resource(name, target))
    }

    /// See [`Client::set_resources`].
    pub fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<SetResourceOutcome>, ClientError> {
        self.run(self.inner.set_resources(updates))
    }

    /// See [`Client::cluster_status`].
    pub fn cluster_status(&self) -> Result<ClusterStatus, ClientError> {
        self.run(self.inner.cluster_status())
    }

    /// See [`Client::gpus`].
    pub fn gpus(&self) -> Result<Vec<escher_proto::types::NodeGpus>, ClientError> {
        self.run(self.inner.gpus())
    }

    /// See [`Client::apply_mig_layout`].
    pub fn apply_mig_layout(
        &self,
        node: escher_proto::NodeId,
        gpu: u32,
        layout: impl Into<String>,
        drain: bool,
    ) -> Result<escher_proto::types::MigPlan, ClientError> {
        self.run(self.inner.apply_mig_layout(node, gpu, layout, drain))
    }

    /// See [`Client::wait_mig_layout`].
    pub fn wait_mig_layout(
        &self,
        node: escher_proto::NodeId,
        gpu: u32,
        timeout: Option<std::time::Duration>,
    ) -> Result<escher_proto::types::GpuStatus, ClientError> {
        self.run(self.inner.wait_mig_layout(node, gpu, timeout))
    }

    /// See [`Client::reserve`].
    pub fn reserve(
        &self,
        name: impl IntoResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> Result<Reservation, ClientError> {
        self.run(self.inner.reserve(name, bundles, strategy, timeout))
    }

    /// See [`Reservation::ready`].
    pub fn reservation_ready(
        &self,
        reservation: &Reservation,
        timeout: Option<Duration>,
    ) -> Result<(), ClientError> {
        self.run(reservation.ready(&self.inner, timeout))
    }

    /// See [`Client::put`]: the first `put` opens the client's object session.
    pub fn put(&self, bytes: impl Into<Bytes>) -> Result<ObjectRef, ClientError> {
        self.run(self.inner.put(bytes))
    }

    /// See [`Client::get_object`].
    pub fn get_object(&self, id: ObjectId) -> Result<Bytes, ClientError> {
        self.run(self.inner.get_object(id))
    }

    /// See [`Client::result_ref`].
    pub fn result_ref(
        &self,
        task: impl Into<TaskId>,
        timeout: Option<Duration>,
    ) -> Result<Option<ObjectRef>, ClientError> {
        self.run(self.inner.result_ref(task, timeout))
    }

    /// Ends this client's object session now; see [`Client::close_object_session`]. Every
    /// object it put, and every result object of a task it submitted while the session was
    /// open, is released at once (its copies deleted), whatever references remain, except
    /// what a pending or running task takes as an argument, released once that task ends. A
    /// client that never put has nothing to close (the answer's `session` is 0). Call it
    /// before dropping the client: the owned runtime ends with the last clone, and with it the
    /// background task that would close the session (the head then closes it when it lapses).
    pub fn close_object_session(&self) -> Result<ClosedSession, ClientError> {
        self.run(self.inner.close_object_session())
    }

    /// See [`Reservation::release`].
    pub fn release_reservation(
        &self,
        reservation: &Reservation,
    ) -> Result<Vec<TaskStatus>, ClientError> {
        self.run(reservation.release(&self.inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_calls_run_on_the_owned_runtime() {
        let client = BlockingClient::connect_lazy("127.0.0.1:1")
            .unwrap()
            .without_caller_task();
        let err = client.set_resource("q", 1, NodeSpec::Local).unwrap_err();
        assert!(err.to_string().contains("ESCHER_TASK_ID"), "{err}");
        let err = BlockingClient::connect("http://127.0.0.1:1").unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
        assert!(
            client
                .wait(Vec::<TaskId>::new(), 0, None)
                .unwrap()
                .0
                .is_empty()
        );
    }
}
