//! The admin methods of [`Client`]: tokens (docs/DESIGN.md §10), draining nodes and labelling
//! them at run time. They need an `admin` token; any other is answered
//! [`ClientError::PermissionDenied`].

use escher_proto::NodeId;
use escher_proto::types::{CreateTokenRequest, CreatedToken, Grant, Labels, TokenInfo};
use escher_proto::wire;

use crate::{Client, ClientError};

impl Client {
    /// Creates a token with `grant` (an `app` grant names its namespace); `description` says
    /// who it is for. The reply holds the token itself: it is shown this once.
    pub async fn create_token(
        &self,
        grant: Grant,
        description: impl Into<String>,
    ) -> Result<CreatedToken, ClientError> {
        let ticket = self.ticket();
        let mut request = wire::CreateTokenRequest::from(CreateTokenRequest {
            grant,
            description: description.into(),
        });
        request.key = Some(ticket.key().into());
        let reply = self
            .call_write("create_token", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.create_token(request).await }
            })
            .await?;
        Ok(CreatedToken::try_from(reply)?)
    }

    /// A backup of the head group's whole replicated state, as of a linearizable read: every
    /// write acknowledged before the call is in it. Write it with
    /// [`escher_proto::backup::write_backup`] (`escher admin snapshot save FILE`); `escher-head
    /// --restore FILE` starts a new group from it.
    pub async fn backup(&self) -> Result<Backup, ClientError> {
        let mut stream = self
            .call(|mut rpc| async move { rpc.backup(wire::BackupRequest {}).await })
            .await?;
        let mut backup = Backup::default();
        let mut first = true;
        while let Some(chunk) = stream.message().await.map_err(|s| self.error_from(s))? {
            if std::mem::take(&mut first) {
                backup.data_format = chunk.data_format;
                backup.cluster_id = chunk.cluster_id;
                backup.revision = chunk.revision;
                backup
                    .image
                    .reserve(usize::try_from(chunk.total_bytes).unwrap_or(0));
                backup.total_bytes = chunk.total_bytes;
            }
            backup.image.extend_from_slice(&chunk.data);
        }
        if first || backup.image.len() as u64 != backup.total_bytes {
            return Err(ClientError::Unavailable {
                url: self.leader_url(),
                message: format!(
                    "the backup ended after {} of its {} bytes",
                    backup.image.len(),
                    backup.total_bytes
                ),
            });
        }
        Ok(backup)
    }

    /// Every token: the access file's bootstrap tokens, then those created, revoked ones
    /// included.
    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        let reply = self
            .call(|mut rpc| async move { rpc.list_tokens(wire::ListTokensRequest {}).await })
            .await?;
        Ok(escher_proto::convert::tokens_from_wire(reply)?)
    }

    /// Revokes the token with id `id` (as [`Client::list_tokens`] shows it): every call with it
    /// is refused from then on.
    pub async fn revoke_token(&self, id: impl Into<String>) -> Result<TokenInfo, ClientError> {
        let ticket = self.ticket();
        let request = wire::RevokeTokenRequest {
            id: id.into(),
            key: Some(ticket.key().into()),
        };
        let reply = self
            .call_write("revoke_token", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.revoke_token(request).await }
            })
            .await?;
        Ok(TokenInfo::try_from(reply)?)
    }

    /// Drains `node`: nothing new is admitted there, running tasks finish. The node admits
    /// tasks again once its worker restarts.
    pub async fn drain(&self, node: NodeId) -> Result<(), ClientError> {
        let ticket = self.ticket();
        let request = wire::DrainRequest {
            node: node.0,
            key: Some(ticket.key().into()),
        };
        self.call_write("drain", Some(ticket.key()), false, |mut rpc| async move {
            rpc.drain(request).await
        })
        .await?;
        Ok(())
    }

    /// Sets `set` and removes the keys in `remove` on live node `node`, all or none, through
    /// the raft log (an admin's write, retried under one idempotency key, so a stale retry
    /// never overwrites a newer label); answers the node's labels after. Labels set this way
    /// outlive the worker's reconnections; escher's own (`escher.`) are refused.
    pub async fn label_node(
        &self,
        node: NodeId,
        set: &Labels,
        remove: &[String],
    ) -> Result<Labels, ClientError> {
        let ticket = self.ticket();
        let request = wire::LabelNodeRequest {
            node: node.0,
            set: set.iter().map(|(k, v)| (k.into(), v.into())).collect(),
            remove: remove.to_vec(),
            key: Some(ticket.key().into()),
        };
        let reply = self
            .call_write("label_node", Some(ticket.key()), false, |mut rpc| {
                let request = request.clone();
                async move { rpc.label_node(request).await }
            })
            .await?;
        Ok(Labels::try_from(reply.labels)?)
    }

    /// Records a decision of a client that acts on the cluster (an autoscaler: `source` is
    /// `autoscaler/GROUP`, `action` one word such as `launch`, `drain`, `stop` or `hold`) and
    /// why, through the raft log (an admin's write, under one idempotency key): watchers see it
    /// as a [`ClusterEvent::Decision`](escher_proto::types::ClusterEvent::Decision).
    pub async fn record_decision(
        &self,
        source: &str,
        action: &str,
        reason: &str,
    ) -> Result<(), ClientError> {
        let ticket = self.ticket();
        let request = wire::RecordDecisionRequest {
            source: source.to_string(),
            action: action.to_string(),
            reason: reason.to_string(),
            key: Some(ticket.key().into()),
        };
        self.call_write("record_decision", Some(ticket.key()), false, |mut rpc| {
            let request = request.clone();
            async move { rpc.record_decision(request).await }
        })
        .await?;
        Ok(())
    }
}

/// A backup of the head group's state ([`Client::backup`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backup {
    /// The state, encoded as a snapshot image in data format `data_format`.
    pub image: Vec<u8>,
    /// The data format of the image.
    pub data_format: u32,
    /// The cluster it belongs to.
    pub cluster_id: String,
    /// Its event revision: every change up to it is in it.
    pub revision: u64,
    /// The image's length, as the head announced it.
    pub total_bytes: u64,
}
