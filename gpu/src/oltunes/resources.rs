//! OLTunes' placements through escher's ephemeral resources (the digest's "framework
//! capabilities" 2, 5 and 8: device-scoped fractional resources, atomic co-location with a
//! synchronous answer, per-task runtime configuration).
//!
//! **Construction.** Each GPU `(node, idx)` under an instance is two finite resources on its
//! node: `olt-<instance>-<node>-<idx>-mem` (its memory, GB) and `…-sm` (100, its SM%, MPS
//! style). A task the scheduler assigned to that GPU at a tuned record requests the record's
//! memory and SM% of them ([`GpuResources::spec`]), so the core places it on that node and
//! admission-controls the GPU as the simulation does: a task that does not fit waits, which is
//! the refused assignment OLTunes' feedback handles. The SM% is an upper bound the core
//! accounts, not enforced on the device (MPS' active-thread percentage would enforce it; the
//! paper does not say how it enforces it).
//!
//! **Needs from the cluster.** `set_resources`.

use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeId, NodeSpec, ResourceName, ResourceUpdate,
};

use super::task::GpuType;
use crate::support::er_name;
use escher_esl::{ClusterApi, EslError, ResourceSpec};

/// One GPU's pair of resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuResource {
    /// Its node.
    pub node: NodeId,
    /// Its index on the node.
    pub idx: u32,
    /// Its type.
    pub ty: GpuType,
    /// Memory, GB.
    pub mem: ResourceName,
    /// SM%.
    pub sm: ResourceName,
}

/// The GPUs of one OLTunes instance as ephemeral resources.
#[derive(Debug, Clone)]
pub struct GpuResources<C> {
    cluster: C,
    gpus: Vec<GpuResource>,
}

fn amount(x: f64) -> Result<Amount, EslError> {
    let raw = (x.max(0.0) * Amount::ONE.raw() as f64).round() as u64;
    Ok(Amount::from_raw(raw)?)
}

impl<C: ClusterApi> GpuResources<C> {
    /// Creates the resources of `gpus` (node, index, type) in one all-or-none batch.
    pub async fn create(
        cluster: C,
        instance: &str,
        gpus: &[(NodeId, u32, GpuType)],
    ) -> Result<GpuResources<C>, EslError> {
        let mut out = Vec::new();
        let mut updates = Vec::new();
        for &(node, idx, ty) in gpus {
            let n = node.0.to_string();
            let i = idx.to_string();
            let g = GpuResource {
                node,
                idx,
                ty,
                mem: er_name(&["olt", instance, &n, &i, "mem"])?,
                sm: er_name(&["olt", instance, &n, &i, "sm"])?,
            };
            for (name, cap) in [(&g.mem, ty.memory_gb()), (&g.sm, 100.0)] {
                updates.push(ResourceUpdate {
                    name: name.clone(),
                    op: CapacityOp::Set(Capacity::Finite(amount(cap)?)),
                    target: NodeSpec::Node(node),
                });
            }
            out.push(g);
        }
        cluster.set_resources(updates).await?;
        Ok(GpuResources { cluster, gpus: out })
    }

    /// The GPUs, in the order given.
    pub fn gpus(&self) -> &[GpuResource] {
        &self.gpus
    }

    /// The spec of a task assigned to GPU `gpu` (an index into [`GpuResources::gpus`]) holding
    /// `mem_gb` and `sm_pct`.
    pub fn spec(&self, gpu: usize, mem_gb: f64, sm_pct: f64) -> Result<ResourceSpec, EslError> {
        let g = self.gpus.get(gpu).ok_or_else(|| {
            EslError::Unsatisfiable(format!("no GPU {gpu} in this OLTunes instance"))
        })?;
        ResourceSpec::new()
            .require(g.mem.clone(), amount(mem_gb)?)?
            .require(g.sm.clone(), amount(sm_pct.clamp(0.0, 100.0))?)
    }

    /// Removes the resources.
    pub async fn dissolve(self) -> Result<(), EslError> {
        let updates = self
            .gpus
            .iter()
            .flat_map(|g| {
                [&g.mem, &g.sm].map(|name| ResourceUpdate {
                    name: name.clone(),
                    op: CapacityOp::Delete,
                    target: NodeSpec::Node(g.node),
                })
            })
            .collect();
        self.cluster.set_resources(updates).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::testing::task;
    use escher_esl::{InMemoryCluster, Mode};

    #[tokio::test]
    async fn a_gpu_admits_what_fits_its_memory_and_sms() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let a = cluster.add_node("cpu=8");
        let b = cluster.add_node("cpu=8");
        let res = GpuResources::create(
            cluster.clone(),
            "t",
            &[(a, 0, GpuType::A30), (b, 0, GpuType::A100)],
        )
        .await
        .unwrap();
        // Three 10 GB tasks on the A30 (24 GB): two run, the third waits on memory.
        let on_a30 = res.spec(0, 10.0, 30.0).unwrap();
        let ids = cluster
            .submit(vec![task("cpu=1", &on_a30); 3])
            .await
            .unwrap();
        let running: Vec<_> = cluster.running();
        let started: Vec<_> = ids
            .iter()
            .filter(|t| running.iter().any(|(r, _)| r == *t))
            .collect();
        assert_eq!(started.len(), 2, "{running:?}");
        assert!(
            running.iter().all(|(_, n)| *n == a),
            "pinned to the A30's node"
        );
        // SM% binds too: two tasks of 60% on the A100 (40 GB) cannot co-run.
        let big_sm = res.spec(1, 5.0, 60.0).unwrap();
        let ids = cluster
            .submit(vec![task("cpu=1", &big_sm); 2])
            .await
            .unwrap();
        let running = cluster.running();
        let on_b = ids
            .iter()
            .filter(|t| running.iter().any(|(r, _)| r == *t))
            .count();
        assert_eq!(on_b, 1);
        assert!(res.spec(2, 1.0, 1.0).is_err());
        res.dissolve().await.unwrap();
    }
}
