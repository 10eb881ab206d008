//! The GPU calls of [`Client`]: each node's GPUs and MIG slices with who holds which device
//! ([`Client::gpus`]), and changing a GPU's MIG instances: a whole layout atomically
//! ([`Client::apply_mig_layout`]), one instance ([`Client::create_mig_instance`],
//! [`Client::destroy_mig_instance`]), or the steps toward a layout that leave busy instances
//! alone ([`Client::prepare_mig_layout`]); all of them are [`Client::change_mig`].
//!
//! A change returns at once with its plan; the worker carries it out once the slices it
//! destroys are free, and the change is done when the GPU no longer shows `reconfiguring`
//! ([`Client::wait_mig_layout`]). The GPU's `last_reconfiguration` then says what each phase
//! took (destroy, create, library load, model load). A refused change is
//! [`ClientError::MigRefused`], whose
//! [`MigRefusal`](escher_proto::types::MigRefusal) says why (overlap, busy, illegal ...).

use std::time::Duration;

use escher_proto::types::{
    ApplyMigLayoutRequest, GpuStatus, GpusReply, MigChange, MigPlan, NodeGpus,
};
use escher_proto::{NodeId, wire};

use crate::{Client, ClientError};

/// How often [`Client::wait_mig_layout`] asks.
const POLL: Duration = Duration::from_millis(50);

impl Client {
    /// Every node with GPUs: each GPU (model, MIG mode, slices with profile, placement and
    /// UUID), which task holds each device, and any reconfiguration in progress.
    pub async fn gpus(&self) -> Result<Vec<NodeGpus>, ClientError> {
        let reply = self
            .call(|mut rpc| async move { rpc.gpus(self.read(wire::GpusRequest {})).await })
            .await?;
        Ok(GpusReply::try_from(reply)?.nodes)
    }

    /// Changes GPU `gpu` of `node` to the MIG `layout` (`3g.20gb,2g.10gb,1g.5gb@6`: profiles,
    /// optionally at a start), atomically: instances in both layouts are left alone. The head
    /// checks the layout against the GPU's model and refuses while a slice it destroys is in
    /// use, unless `drain` is set: then nothing new is placed on those slices and the change
    /// happens once they are free. Returns the plan at once; see [`Client::wait_mig_layout`].
    pub async fn apply_mig_layout(
        &self,
        node: NodeId,
        gpu: u32,
        layout: impl Into<String>,
        drain: bool,
    ) -> Result<MigPlan, ClientError> {
        self.change_mig(node, gpu, MigChange::Layout(layout.into()), drain)
            .await
    }

    /// Creates one MIG instance on GPU `gpu` of `node`: `profile@start` (`1g.5gb@6`), or
    /// `profile` alone for the start that keeps the most full layouts reachable. Refused with
    /// [`MigRefusal::Overlap`](escher_proto::types::MigRefusal::Overlap) if it overlaps an instance, [`MigRefusal::Illegal`](escher_proto::types::MigRefusal::Illegal) if the
    /// profile, start or room is wrong for the GPU. The other instances are left alone.
    pub async fn create_mig_instance(
        &self,
        node: NodeId,
        gpu: u32,
        instance: impl Into<String>,
    ) -> Result<MigPlan, ClientError> {
        self.change_mig(node, gpu, MigChange::Create(instance.into()), false)
            .await
    }

    /// Destroys one MIG instance of GPU `gpu` of `node`, named `profile@start` or by its UUID.
    /// Refused with [`MigRefusal::NoSuchInstance`](escher_proto::types::MigRefusal::NoSuchInstance) if the GPU has no such instance, and with
    /// [`MigRefusal::Busy`](escher_proto::types::MigRefusal::Busy) while a task may hold it, unless `drain` is set.
    pub async fn destroy_mig_instance(
        &self,
        node: NodeId,
        gpu: u32,
        instance: impl Into<String>,
        drain: bool,
    ) -> Result<MigPlan, ClientError> {
        self.change_mig(node, gpu, MigChange::Destroy(instance.into()), drain)
            .await
    }

    /// Pre-initialization (MIGRator's): does every step toward `layout` that leaves the busy
    /// instances of GPU `gpu` of `node` alone, so that the new instances are created and
    /// initialized while the busy ones go on; applying `layout` later does only what is left.
    /// The plan's `to` is the layout it goes to now.
    pub async fn prepare_mig_layout(
        &self,
        node: NodeId,
        gpu: u32,
        layout: impl Into<String>,
    ) -> Result<MigPlan, ClientError> {
        self.change_mig(node, gpu, MigChange::Prepare(layout.into()), false)
            .await
    }

    /// Changes GPU `gpu` of `node`'s MIG instances as `change` says (see the calls above).
    pub async fn change_mig(
        &self,
        node: NodeId,
        gpu: u32,
        change: MigChange,
        drain: bool,
    ) -> Result<MigPlan, ClientError> {
        let request = ApplyMigLayoutRequest {
            node,
            gpu,
            change,
            drain,
        };
        let ticket = self.ticket();
        let mut request = wire::ApplyMigLayoutRequest::from(request);
        request.key = Some(ticket.key().into());
        let reply = self
            .call_write("apply_mig_layout", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.apply_mig_layout(request).await }
            })
            .await?;
        Ok(MigPlan::try_from(reply)?)
    }

    /// Waits until GPU `gpu` of `node` is not being reconfigured, at most `timeout` (`None`:
    /// no limit), and returns it. A reconfiguration that failed is an error with the worker's
    /// reason.
    pub async fn wait_mig_layout(
        &self,
        node: NodeId,
        gpu: u32,
        timeout: Option<Duration>,
    ) -> Result<GpuStatus, ClientError> {
        self.wait_mig_layout_with(node, gpu, timeout, |_| {}).await
    }

    /// [`Client::wait_mig_layout`], showing each status read to `progress` while the
    /// reconfiguration runs (what it waits for: `reconfiguring.waiting_for`, the slices
    /// retiring), as `escher mig apply --wait` does on a terminal.
    pub async fn wait_mig_layout_with(
        &self,
        node: NodeId,
        gpu: u32,
        timeout: Option<Duration>,
        mut progress: impl FnMut(&GpuStatus),
    ) -> Result<GpuStatus, ClientError> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let nodes = self.gpus().await?;
            let status = nodes
                .into_iter()
                .find(|n| n.node == node)
                .and_then(|n| n.gpus.into_iter().find(|g| g.info.index == gpu))
                .ok_or_else(|| {
                    ClientError::Usage(format!("node {node} has no GPU {gpu} (see `escher gpus`)"))
                })?;
            progress(&status);
            if status.reconfiguring.is_none() {
                return match status.last_error {
                    Some(reason) => Err(ClientError::MigFailed { node, gpu, reason }),
                    None => Ok(status),
                };
            }
            if let (Some(deadline), Some(after)) = (deadline, timeout)
                && tokio::time::Instant::now() >= deadline
            {
                let target = status.reconfiguring.map(|p| p.target).unwrap_or_default();
                return Err(ClientError::MigTimeout {
                    node,
                    gpu,
                    target,
                    after,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
