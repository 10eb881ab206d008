//! The GPU calls of [`Client`]: each node's GPUs and MIG slices with who holds which device
//! ([`Client::gpus`]), and changing a GPU's MIG layout ([`Client::apply_mig_layout`],
//! [`Client::wait_mig_layout`]).
//!
//! A layout change returns at once with its plan; the worker carries it out once the slices it
//! destroys are free, and the change is done when the GPU no longer shows `reconfiguring`.

use std::time::Duration;

use escher_proto::types::{ApplyMigLayoutRequest, GpuStatus, GpusReply, MigPlan, NodeGpus};
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
    /// optionally at a start). The head checks the layout against the GPU's model and refuses
    /// while a slice it destroys is in use, unless `drain` is set: then nothing new is placed
    /// on those slices and the change happens once they are free. Returns the plan at once;
    /// see [`Client::wait_mig_layout`].
    pub async fn apply_mig_layout(
        &self,
        node: NodeId,
        gpu: u32,
        layout: impl Into<String>,
        drain: bool,
    ) -> Result<MigPlan, ClientError> {
        let request = ApplyMigLayoutRequest {
            node,
            gpu,
            layout: layout.into(),
            drain,
        };
        let ticket = self.ticket();
        let mut request = wire::ApplyMigLayoutRequest::from(request);
        request.key = Some(ticket.key().into());
        let reply = self
            .call(|mut rpc| {
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
