//! The admin methods of [`Client`]: tokens (docs/DESIGN.md §10) and draining nodes. They need an
//! `admin` token; any other is answered [`ClientError::PermissionDenied`].

use escher_proto::NodeId;
use escher_proto::types::{CreateTokenRequest, CreatedToken, Grant, TokenInfo};
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
            .call(|mut rpc| {
                let request = request.clone();
                async move { rpc.create_token(request).await }
            })
            .await?;
        Ok(CreatedToken::try_from(reply)?)
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
            .call(|mut rpc| {
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
        self.call(|mut rpc| async move { rpc.drain(request).await })
            .await?;
        Ok(())
    }
}
