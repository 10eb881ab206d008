//! The head-group methods of [`Client`]: every replica and how it is doing, membership
//! changes (an operator replacing a machine), and a login ticket for a replica's dashboard.

use escher_proto::types::{HeadChange, HeadsReply};
use escher_proto::wire;

use crate::{Client, ClientError};

/// A single-use login ticket for the web dashboard of the replica that answered
/// ([`Client::dashboard_ticket`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardTicket {
    /// `HOST:PORT` where that replica serves its dashboard (its `--dashboard`).
    pub address: String,
    /// The ticket: the page trades it once, at that address, for a session.
    pub ticket: String,
    /// How long it may be traded.
    pub expires_in: std::time::Duration,
}

impl DashboardTicket {
    /// The address to open in a browser: the dashboard with the ticket in the fragment (which
    /// a browser never sends to a server), and `view` to show first.
    pub fn url(&self, view: Option<&str>) -> String {
        let mut url = format!("http://{}/#ticket={}", self.address, self.ticket);
        if let Some(view) = view {
            url.push_str("&view=");
            url.push_str(view);
        }
        url
    }
}

impl Client {
    /// A login ticket for the dashboard of the replica that answers, valid once and for a
    /// short while: what `escher dashboard` gives the browser instead of this client's token,
    /// which stays in the head. Fails with `FailedPrecondition` where that replica serves no
    /// dashboard.
    pub async fn dashboard_ticket(&self) -> Result<DashboardTicket, ClientError> {
        let reply =
            self.call(|mut rpc| async move {
                rpc.dashboard_ticket(wire::DashboardTicketRequest {}).await
            })
            .await?;
        Ok(DashboardTicket {
            address: reply.address,
            ticket: reply.ticket,
            expires_in: std::time::Duration::from_millis(reply.expires_in_ms),
        })
    }

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

    /// Sends `change` to the leader. A leader that has a membership change in its log not yet
    /// applied answers ABORTED ("try again"): it cannot tell yet who the members are, and raft
    /// takes one change at a time. That answer is retried, every 200 ms, within the failover
    /// timeout; after it, the last answer is returned.
    ///
    /// A change is a write without an idempotency key (raft's membership change is not a
    /// command of the state machine, whose table of keys would answer a repeat): a call that
    /// gives up after an attempt that may have been applied (cut after it went out, answered
    /// "may still commit") ends with [`ClientError::UnknownOutcome`], as a keyed write does,
    /// never with a plain failure; and a change made twice is refused by the group ("already a
    /// member", "not a member"), which says that it took effect.
    async fn change_heads(&self, change: HeadChange) -> Result<HeadsReply, ClientError> {
        let call = match change {
            HeadChange::Add { .. } => "heads add",
            HeadChange::Remove { .. } => "heads remove",
        };
        let request = wire::ChangeHeadsRequest::from(change);
        let deadline = tokio::time::Instant::now() + self.failover_timeout();
        loop {
            let answer = self
                .call_write(call, None, false, |mut rpc| {
                    let request = request.clone();
                    async move { rpc.change_heads(request).await }
                })
                .await;
            match answer {
                Ok(reply) => return Ok(HeadsReply::try_from(reply)?),
                Err(ClientError::Rpc(status))
                    if status.code() == tonic::Code::Aborted
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(message = status.message(), "membership change: again");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
