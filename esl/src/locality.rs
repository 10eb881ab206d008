//! Locality (primitive P1): co-location of tasks with a task, and of tasks with data.
//!
//! **Policy.** [`Affinity`]: every task of a group runs on the node where the group's first
//! task (its *leader*) runs. [`DataLocality`]: a task that reads a data item runs on a node
//! that holds the item.
//!
//! **Construction (thesis §4.4.1 P1; Table 4.2, "task–task affinity" and "data locality";
//! §4.6.1, WordCount's two lines).** "The target task for co-location creates a local
//! ephemeral resource `E_r` with unbounded capacity when the task starts or the data to be
//! co-located with is created. The constrained task then requests 1 unit of `E_r`."
//! - Affinity: the leader's spec carries an `on_start` hook `set_resource("aff-<group>",
//!   unbounded, Local)`; followers require `aff-<group>: 1`. A follower submitted before the
//!   leader starts waits (pending, with the reason "no node has `aff-<group>`") and runs as soon
//!   as the marker appears.
//! - Data locality: [`DataLocality::register`] sets `data-<id>` (unbounded) on the node that
//!   holds the item; [`DataLocality::produce`] is the spec of a task that *generates* the item,
//!   whose `on_success` hook sets the marker where it ran (P1 and P2 at once: consumers start
//!   after the data is complete, where it is). Consumers require `data-<id>: 1`.
//!
//! - Real objects need no marker: every worker holding a copy of an object publishes its
//!   location resource, `object.<id>` (docs/ARCHITECTURE.md, "Objects"), and
//!   [`DataLocality::object_consumer`] requires it (hard locality, where the cluster's own rule
//!   for an object argument is a soft preference).
//!
//! **Needs from the cluster.** Only `set_resource` (and hooks, which are `set_resource` calls
//! made by the head for a task); never `get_cluster_status`.
//!
//! **Limits.** Markers are unbounded, so they co-locate but do not limit: the followers'
//! physical requirements must fit the leader's node, else they wait there (a hard
//! constraint; relax it with soft constraints). A leader that fails and is retried elsewhere
//! marks its second node too, and followers may then go to either. Markers outlive their
//! tasks until [`Affinity::dissolve`] / [`DataLocality::forget`]; a node that dies takes its
//! markers with it and followers wait until a marker reappears (re-`register` the data, or
//! use the fault-tolerance ESL's replay log).

use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeId, NodeSpec, ObjectId, ResourceName, ResourceUpdate,
};

use crate::policy::{Policy, er_name, every_node};
use crate::{ClusterApi, EslError, ResourceSpec};

/// The hook that creates an unbounded marker on the task's own node.
fn mark_here(marker: &ResourceName) -> ResourceUpdate {
    ResourceUpdate {
        name: marker.clone(),
        op: CapacityOp::Set(Capacity::Unbounded),
        target: NodeSpec::Local,
    }
}

/// Co-location of a group of tasks with its first task (P1).
#[derive(Debug, Clone)]
pub struct Affinity<C> {
    cluster: C,
    marker: ResourceName,
    led: bool,
}

impl<C: ClusterApi> Affinity<C> {
    /// A group whose marker is `aff-<name>`.
    pub fn group(cluster: C, name: &str) -> Result<Affinity<C>, EslError> {
        Ok(Affinity {
            cluster,
            marker: er_name(&["aff", name])?,
            led: false,
        })
    }

    /// The group's marker resource.
    pub fn marker(&self) -> &ResourceName {
        &self.marker
    }

    /// The leader's spec: marks the node it starts on.
    pub fn leader(&self) -> ResourceSpec {
        ResourceSpec::new().on_start(mark_here(&self.marker))
    }

    /// A follower's spec: runs where the leader runs (or ran).
    pub fn follower(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.marker.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// The leader's spec the first time, a follower's afterwards.
    pub fn next_spec(&mut self) -> ResourceSpec {
        if std::mem::replace(&mut self.led, true) {
            self.follower()
        } else {
            self.leader()
        }
    }

    /// Removes the marker from every node (tasks holding it keep it until they end); later
    /// followers wait until a new leader starts.
    pub async fn dissolve(&self) -> Result<(), EslError> {
        self.cluster
            .delete_resource(self.marker.clone(), every_node())
            .await?;
        Ok(())
    }
}

impl<C: ClusterApi> Policy for Affinity<C> {
    type Key = ();

    async fn spec_for(&mut self, _key: &()) -> Result<ResourceSpec, EslError> {
        Ok(self.next_spec())
    }
}

/// Tasks that read a data item run where the item is (P1).
#[derive(Debug, Clone)]
pub struct DataLocality<C> {
    cluster: C,
}

impl<C: ClusterApi> DataLocality<C> {
    /// Data locality over this cluster.
    pub fn new(cluster: C) -> DataLocality<C> {
        DataLocality { cluster }
    }

    /// The marker of a data item: `data-<id>`.
    pub fn marker(data_id: &str) -> Result<ResourceName, EslError> {
        er_name(&["data", data_id])
    }

    /// Records that `node` holds the item (call once per replica).
    pub async fn register(&self, data_id: &str, node: NodeId) -> Result<(), EslError> {
        self.cluster
            .set_resource(
                Self::marker(data_id)?,
                Capacity::Unbounded,
                NodeSpec::Node(node),
            )
            .await?;
        Ok(())
    }

    /// The spec of a task that reads the item: it runs on a node holding it.
    pub fn consumer(data_id: &str) -> Result<ResourceSpec, EslError> {
        ResourceSpec::new().require(Self::marker(data_id)?, Amount::ONE)
    }

    /// The spec of a task that reads a real object of the cluster's store only where a copy
    /// is (hard locality): it requires the object's location resource, `object.<id>`, which
    /// every worker holding a copy publishes (and withdraws when the copy goes), so no marker
    /// of this library's is needed. Without it, a task given the object as its argument is
    /// placed on a holder only when one has room (the cluster's soft rule); with it, the task
    /// waits for a holder.
    pub fn object_consumer(object: ObjectId) -> Result<ResourceSpec, EslError> {
        let name = ResourceName::new(&object.location_name())?;
        ResourceSpec::new().require(name, Amount::ONE)
    }

    /// The spec of a task that generates the item: when it succeeds, its node holds the item.
    pub fn produce(data_id: &str) -> Result<ResourceSpec, EslError> {
        Ok(ResourceSpec::new().on_success(mark_here(&Self::marker(data_id)?)))
    }

    /// Like [`produce`](Self::produce), but marks the node when the task *starts*, for
    /// consumers that stream the data while it is generated.
    pub fn produce_on_start(data_id: &str) -> Result<ResourceSpec, EslError> {
        Ok(ResourceSpec::new().on_start(mark_here(&Self::marker(data_id)?)))
    }

    /// Forgets the item on every node; later consumers wait until it is registered again.
    pub async fn forget(&self, data_id: &str) -> Result<(), EslError> {
        self.cluster
            .delete_resource(Self::marker(data_id)?, every_node())
            .await?;
        Ok(())
    }
}

impl<C: ClusterApi> Policy for DataLocality<C> {
    type Key = str;

    async fn spec_for(&mut self, data_id: &str) -> Result<ResourceSpec, EslError> {
        Self::consumer(data_id)
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::TaskState;

    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    #[tokio::test]
    async fn an_objects_consumer_runs_only_where_its_location_resource_is() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let (holder, other) = (cluster.add_node("cpu=4"), cluster.add_node("cpu=4"));
        let object = ObjectId(41, 0);
        let spec = DataLocality::<InMemoryCluster>::object_consumer(object).unwrap();
        let ids = cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap();
        // No copy anywhere yet: it waits rather than running on either node.
        assert_eq!(
            cluster.status(ids[0]).await.unwrap().state,
            TaskState::Pending
        );
        // What a worker holding a copy publishes.
        let location = ResourceName::new(&object.location_name()).unwrap();
        cluster
            .set_resource(location, Capacity::Unbounded, NodeSpec::Node(holder))
            .await
            .unwrap();
        assert_eq!(cluster.node_of(ids[0]), Some(holder));
        assert_ne!(holder, other);
    }

    #[tokio::test]
    async fn followers_share_the_leaders_node_whatever_the_order() {
        let mut rng = Rng::new(7);
        for round in 0..30 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let nodes: Vec<NodeId> = (0..rng.range(2, 6))
                .map(|_| cluster.add_node("cpu=16"))
                .collect();
            // Unrelated load, so that the leader does not always go to the first node.
            for _ in 0..rng.range(0, 5) {
                let filler = task("cpu=1", &ResourceSpec::new());
                cluster.submit(vec![filler]).await.unwrap();
            }
            let mut group = Affinity::group(cluster.clone(), &format!("g{round}")).unwrap();
            let mut specs: Vec<_> = (0..rng.range(2, 7))
                .map(|_| task("cpu=1", &group.next_spec()))
                .collect();
            let leader = specs.remove(0);
            // Followers before the leader, all of them, or interleaved.
            let before = rng.below(specs.len() + 1);
            let mut ids = cluster.submit(specs[..before].to_vec()).await.unwrap();
            for id in &ids {
                assert_eq!(cluster.status(*id).await.unwrap().state, TaskState::Pending);
            }
            let leader = cluster.submit(vec![leader]).await.unwrap()[0];
            ids.extend(cluster.submit(specs[before..].to_vec()).await.unwrap());
            let home = cluster.node_of(leader).expect("the leader runs");
            assert!(nodes.contains(&home));
            for id in ids {
                assert_eq!(cluster.node_of(id), Some(home), "round {round}");
            }
        }
    }

    #[tokio::test]
    async fn dissolving_the_group_stops_new_followers() {
        let cluster = InMemoryCluster::new(Mode::Instant);
        cluster.add_node("cpu=2");
        let mut group = Affinity::group(cluster.clone(), "x").unwrap();
        let leader = task("cpu=1", &group.next_spec());
        cluster.submit(vec![leader]).await.unwrap();
        group.dissolve().await.unwrap();
        let follower = cluster
            .submit(vec![task("cpu=1", &group.next_spec())])
            .await
            .unwrap()[0];
        let status = cluster.status(follower).await.unwrap();
        assert_eq!(status.state, TaskState::Pending);
        assert!(status.reason.unwrap().contains("aff-x"));
    }

    #[tokio::test]
    async fn readers_run_where_the_data_is() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let nodes: Vec<NodeId> = (0..4).map(|_| cluster.add_node("cpu=4")).collect();
        let mut data = DataLocality::new(cluster.clone());
        data.register("chunk-0", nodes[2]).await.unwrap();
        data.register("chunk-1", nodes[0]).await.unwrap();
        data.register("chunk-1", nodes[3]).await.unwrap(); // a replica
        for _ in 0..3 {
            let s0 = data.spec_for("chunk-0").await.unwrap();
            let s1 = data.spec_for("chunk-1").await.unwrap();
            let ids = cluster
                .submit(vec![task("cpu=1", &s0), task("cpu=1", &s1)])
                .await
                .unwrap();
            assert_eq!(cluster.node_of(ids[0]), Some(nodes[2]));
            let replica = cluster.node_of(ids[1]).unwrap();
            assert!(replica == nodes[0] || replica == nodes[3]);
        }
        data.forget("chunk-0").await.unwrap();
        let late = task(
            "cpu=1",
            &DataLocality::<InMemoryCluster>::consumer("chunk-0").unwrap(),
        );
        let late = cluster.submit(vec![late]).await.unwrap()[0];
        assert_eq!(
            cluster.status(late).await.unwrap().state,
            TaskState::Pending
        );
    }

    #[tokio::test]
    async fn consumers_of_produced_data_follow_the_producer_after_it_succeeds() {
        type Data = DataLocality<InMemoryCluster>;
        let cluster = InMemoryCluster::new(Mode::Manual);
        for _ in 0..3 {
            cluster.add_node("cpu=4");
        }
        let producer = task("cpu=1", &Data::produce("out").unwrap());
        let consumers = vec![task("cpu=1", &Data::consumer("out").unwrap()); 3];
        let ids = cluster.submit(consumers).await.unwrap();
        let producer = cluster.submit(vec![producer]).await.unwrap()[0];
        let home = cluster.node_of(producer).unwrap();
        assert!(
            ids.iter().all(|id| cluster.node_of(*id).is_none()),
            "not before success"
        );
        cluster.finish(producer, true);
        for id in ids {
            assert_eq!(cluster.node_of(id), Some(home));
        }
        // `produce_on_start` marks at once.
        let early = task("cpu=1", &Data::produce_on_start("live").unwrap());
        let early = cluster.submit(vec![early]).await.unwrap()[0];
        let reader = task("cpu=1", &Data::consumer("live").unwrap());
        let reader = cluster.submit(vec![reader]).await.unwrap()[0];
        assert_eq!(cluster.node_of(reader), cluster.node_of(early));
    }

    #[test]
    fn bad_names_are_refused() {
        let cluster = InMemoryCluster::new(Mode::Instant);
        assert!(Affinity::group(cluster, "no spaces").is_err());
        assert!(DataLocality::<InMemoryCluster>::marker("a/b/c").is_err());
    }
}
