//! What the policies of this crate share with the ESLs of `escher-esl` without reaching into
//! its private modules: checked resource names, and the unit tests' instrumented cluster.

use escher_esl::EslError;
use escher_proto::types::ResourceName;

/// A resource name built from a policy prefix and user-given parts (`astraea-<service>-<i>`),
/// checked.
pub(crate) fn er_name(parts: &[&str]) -> Result<ResourceName, EslError> {
    Ok(ResourceName::new(&parts.join("-"))?)
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the unit tests that drive policies through the cluster API: a cluster that
    //! counts status reads and reports simulated GPUs, and a task builder.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use escher_client::Task;
    use escher_esl::{ClusterApi, EslError, InMemoryCluster, ResourceSpec};
    use escher_proto::types::{NodeGpus, TaskId, TaskSpec, TaskStatus};

    /// An [`InMemoryCluster`] that counts the status reads made through it (how a test tells
    /// waiting on events from polling) and reports these GPUs instead of the in-memory
    /// cluster's (which has none).
    #[derive(Debug, Clone)]
    pub(crate) struct Counting {
        pub(crate) inner: InMemoryCluster,
        statuses: Arc<AtomicUsize>,
        gpus: Vec<NodeGpus>,
    }

    impl Counting {
        /// `inner`, reporting `gpus` as the cluster's GPUs.
        pub(crate) fn new(inner: InMemoryCluster, gpus: Vec<NodeGpus>) -> Counting {
            Counting {
                inner,
                statuses: Arc::default(),
                gpus,
            }
        }

        /// Status reads so far.
        pub(crate) fn statuses(&self) -> usize {
            self.statuses.load(Ordering::SeqCst)
        }
    }

    impl ClusterApi for Counting {
        fn inner(&self) -> &impl ClusterApi {
            &self.inner
        }

        async fn status(&self, task: TaskId) -> Result<TaskStatus, EslError> {
            self.statuses.fetch_add(1, Ordering::SeqCst);
            self.inner.status(task).await
        }

        async fn gpus(&self) -> Result<Vec<NodeGpus>, EslError> {
            Ok(self.gpus.clone())
        }
    }

    /// A function task with these physical resources and this policy spec.
    pub(crate) fn task(resources: &str, spec: &ResourceSpec) -> TaskSpec {
        spec.apply(Task::function("work", Vec::new()).resources_str(resources))
            .build()
            .expect("a valid test task")
    }
}
