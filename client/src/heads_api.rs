//! The head-group methods of [`Client`]: every replica and how it is doing, and membership
//! changes (an operator replacing a machine).

use escher_proto::types::{HeadChange, HeadsReply};
use escher_proto::wire;

use crate::{Client, ClientError};

impl Client {
    /// Every replica of the head group: its address, role, term, commit and applied index,
    /// and whether it answered. Any replica answers this, leader or not, so it works while
    /// the group has no leader.
    pub async fn heads(&self) -> Result<HeadsReply, ClientError> {
        let reply = self
            .call(|mut rpc| async move { rpc.heads(wire::HeadsRequest {}).await })
            .await?;
        Ok(HeadsReply::try_from(reply)?)
    }

    /// Adds replica `id` at `address` (`HOST:PORT`) to the head group (a raft membership
    /// change); start it first with `escher-head --id ID --join --group GROUP`. Answers once
    /// the change is committed, with the group as it is then.
    pub async fn add_head(
        &self,
        id: u64,
        address: impl Into<String>,
    ) -> Result<HeadsReply, ClientError> {
        self.change_heads(HeadChange::Add {
            id,
            address: address.into(),
        })
        .await
    }

    /// Removes replica `id` from the head group.
    pub async fn remove_head(&self, id: u64) -> Result<HeadsReply, ClientError> {
        self.change_heads(HeadChange::Remove { id }).await
    }

    async fn change_heads(&self, change: HeadChange) -> Result<HeadsReply, ClientError> {
        let request = wire::ChangeHeadsRequest::from(change);
        let reply = self
            .call(|mut rpc| {
                let request = request.clone();
                async move { rpc.change_heads(request).await }
            })
            .await?;
        Ok(HeadsReply::try_from(reply)?)
    }
}
