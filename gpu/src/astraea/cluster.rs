//! Astraea's shares on an escher cluster: every GPU's MPS resources as ephemeral resources, and
//! a deployment's instances as tasks that hold them.
//!
//! **Construction.** For each GPU the cluster reports ([`ClusterApi::gpus`]: the worker's real
//! or simulated GPUs), four finite resources on its node: `ast-<inst>-<node>-<idx>-sm` (100,
//! its SMs in percent), `…-mps` (48, MPS client connections per device), `…-mem` (its memory,
//! GB) and `…-bw` (its memory bandwidth, GB/s). An instance is a task that requests its SM%,
//! one MPS client and its memory on the GPU it was placed on, and, where the policy accounts
//! memory bandwidth (Astraea does, FIRM and Laius do not), its bandwidth; so the core places it
//! on that GPU's node and admission-controls the GPU: a 49th client, or SMs or memory past the
//! GPU's, waits instead of running. The task's environment names its GPU
//! (`CUDA_VISIBLE_DEVICES`) and its MPS quota (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), which is
//! how MPS enforces an SM share on a real GPU; a simulated GPU enforces nothing, and the shares
//! are the core's accounting. The requests are served by the simulation ([`super::sim`]) on the
//! instances whose tasks run.
//!
//! **Needs from the cluster.** `gpus`, `set_resources`, `submit`, `watch`, `status`, `cancel`.

use escher_client::Task;
use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeGpus, NodeId, NodeSpec, ResourceName, ResourceUpdate, TaskId,
};

use super::place::{Gpu, Instance, Topology};
use super::service::{Device, MPS_CLIENTS, Service};
use crate::support::er_name;
use escher_esl::api::{Started, await_started};
use escher_esl::{ClusterApi, EslError, ResourceSpec};

/// One GPU's resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsGpu {
    /// Its node.
    pub node: NodeId,
    /// Its index on the node.
    pub index: u32,
    /// Its UUID.
    pub uuid: String,
    /// SMs, percent.
    pub sm: ResourceName,
    /// MPS clients.
    pub clients: ResourceName,
    /// Memory, GB.
    pub mem: ResourceName,
    /// Memory bandwidth, GB/s.
    pub bw: ResourceName,
}

/// The GPUs of one Astraea instance as ephemeral resources.
#[derive(Debug, Clone)]
pub struct MpsGpus<C> {
    cluster: C,
    gpus: Vec<MpsGpu>,
}

fn amount(x: f64) -> Result<Amount, EslError> {
    let raw = (x.max(0.0) * Amount::ONE.raw() as f64).round() as u64;
    Ok(Amount::from_raw(raw)?)
}

/// What [`MpsGpus::deploy`] got: the instances whose tasks run, those refused, and where the
/// core put them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Deployed {
    /// Every instance's task, in the order of the instances given.
    pub tasks: Vec<TaskId>,
    /// The instances whose tasks run.
    pub running: Vec<Instance>,
    /// The instances whose tasks did not start by the deadline (cancelled).
    pub refused: Vec<Instance>,
    /// Running instances the core placed on another node than their GPU's (never expected:
    /// their resources exist only there).
    pub misplaced: usize,
}

impl<C: ClusterApi> MpsGpus<C> {
    /// Creates the resources of every live GPU of `inventory` in one all-or-none batch, and the
    /// topology Astraea plans on (GPUs by node, in the inventory's order; each an A100's
    /// bandwidth and compute with the memory its worker reports: assumed, see
    /// [`Device::a100_with_memory`]).
    pub async fn create(
        cluster: C,
        instance: &str,
        inventory: &[NodeGpus],
    ) -> Result<(MpsGpus<C>, Topology), EslError> {
        let mut gpus = Vec::new();
        let mut topo = Vec::new();
        let mut updates = Vec::new();
        for (n, node) in inventory.iter().filter(|n| n.alive).enumerate() {
            for g in &node.gpus {
                let id = node.node.0.to_string();
                let idx = g.info.index.to_string();
                let name = |what: &str| er_name(&["ast", instance, &id, &idx, what]);
                let device = Device::a100_with_memory(g.info.memory_mib);
                let r = MpsGpu {
                    node: node.node,
                    index: g.info.index,
                    uuid: g.info.uuid.clone(),
                    sm: name("sm")?,
                    clients: name("mps")?,
                    mem: name("mem")?,
                    bw: name("bw")?,
                };
                for (res, cap) in [
                    (&r.sm, 100.0),
                    (&r.clients, f64::from(MPS_CLIENTS)),
                    (&r.mem, device.mem_gb),
                    (&r.bw, device.bw_gbs),
                ] {
                    updates.push(ResourceUpdate {
                        name: res.clone(),
                        op: CapacityOp::Set(Capacity::Finite(amount(cap)?)),
                        target: NodeSpec::Node(node.node),
                    });
                }
                gpus.push(r);
                topo.push(Gpu { node: n, device });
            }
        }
        if gpus.is_empty() {
            return Err(EslError::Unsatisfiable(
                "the cluster has no live GPU".into(),
            ));
        }
        cluster.set_resources(updates).await?;
        Ok((MpsGpus { cluster, gpus }, Topology { gpus: topo }))
    }

    /// The GPUs, in the topology's order.
    pub fn gpus(&self) -> &[MpsGpu] {
        &self.gpus
    }

    /// The spec of an instance on GPU `gpu` with SM share `share`, `mem_gb` of memory and, if
    /// the policy accounts it, `bw_gbs` of bandwidth.
    pub fn spec(
        &self,
        gpu: usize,
        share: f64,
        mem_gb: f64,
        bw_gbs: Option<f64>,
    ) -> Result<ResourceSpec, EslError> {
        let g = self.gpus.get(gpu).ok_or_else(|| {
            EslError::Unsatisfiable(format!("no GPU {gpu} in this Astraea instance"))
        })?;
        let mut spec = ResourceSpec::new()
            .require(g.sm.clone(), amount((share * 100.0).clamp(0.0, 100.0))?)?
            .require(g.clients.clone(), Amount::ONE)?
            .require(g.mem.clone(), amount(mem_gb)?)?;
        if let Some(bw) = bw_gbs {
            spec = spec.require(g.bw.clone(), amount(bw)?)?;
        }
        Ok(spec)
    }

    /// Submits one task per instance (`argv`, with the instance's resources and MPS
    /// environment), waits until they run or `deadline` passes, cancels those still waiting,
    /// and reads where the core put the others.
    pub async fn deploy(
        &self,
        service: &Service,
        instances: &[Instance],
        account_bandwidth: bool,
        argv: &[&str],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Deployed, EslError> {
        let mut specs = Vec::new();
        for i in instances {
            let s = &service.stages[i.stage];
            let spec = self.spec(
                i.gpu,
                i.share,
                s.mem_gb,
                account_bandwidth.then(|| s.bandwidth(i.share)),
            )?;
            let g = &self.gpus[i.gpu];
            let task = Task::command(argv.iter().copied())
                .name(format!("astraea-{}-{}", i.stage, i.gpu))
                .env("CUDA_VISIBLE_DEVICES", g.uuid.clone())
                .env(
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    format!("{}", (i.share * 100.0).round()),
                )
                .max_retries(0);
            let built = spec
                .apply(task)
                .build()
                .map_err(|e| EslError::Refused(e.to_string()))?;
            specs.push(built);
        }
        let tasks = self.cluster.submit(specs).await?;
        let waiting = match await_started(&self.cluster, &tasks, deadline).await? {
            Started::All => Vec::new(),
            Started::TimedOut(waiting) => waiting,
            Started::Ended(status) => {
                return Err(EslError::Refused(format!(
                    "instance task {} ended before serving: {:?}",
                    status.id, status.state
                )));
            }
        };
        if !waiting.is_empty() {
            self.cluster.cancel(waiting.clone()).await?;
        }
        let mut out = Deployed {
            tasks: tasks.clone(),
            ..Deployed::default()
        };
        for (task, inst) in tasks.iter().zip(instances) {
            if waiting.contains(task) {
                out.refused.push(*inst);
                continue;
            }
            let status = self.cluster.status(*task).await?;
            if status.node != Some(self.gpus[inst.gpu].node) {
                out.misplaced += 1;
            }
            out.running.push(*inst);
        }
        Ok(out)
    }

    /// Cancels a deployment's tasks.
    pub async fn undeploy(&self, deployed: &Deployed) -> Result<(), EslError> {
        self.cluster.cancel(deployed.tasks.clone()).await?;
        Ok(())
    }

    /// Removes the resources.
    pub async fn dissolve(self) -> Result<(), EslError> {
        let updates = self
            .gpus
            .iter()
            .flat_map(|g| {
                [&g.sm, &g.clients, &g.mem, &g.bw].map(|name| ResourceUpdate {
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
