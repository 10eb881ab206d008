//! Asking the other replicas of the group how they are, for `escher heads`: one `Raft.Status`
//! call to each, with the access the [`Transport`](super::Transport) uses for raft messages.
//! An answer that does not come says why instead.

use std::collections::BTreeMap;
use std::time::Duration;

use escher_proto::types::HeadReplica;
use escher_proto::wire::{self, raft_client::RaftClient};

use super::PeerAccess;

/// How long a status waits for each other replica.
pub(crate) const PEER_STATUS_TIMEOUT: Duration = Duration::from_millis(1500);

/// `me`, with the status of every other member of `members` (by id: address) in `group`,
/// asked at once; sorted by id.
pub(crate) async fn group_status(
    me: HeadReplica,
    members: &BTreeMap<u64, String>,
    group: &str,
    access: &PeerAccess,
) -> Vec<HeadReplica> {
    let mut asks = tokio::task::JoinSet::new();
    for (id, address) in members.iter().filter(|(id, _)| **id != me.id) {
        asks.spawn(peer_status(
            *id,
            address.clone(),
            group.to_string(),
            access.clone(),
        ));
    }
    let mut replicas = vec![me];
    while let Some(answer) = asks.join_next().await {
        if let Ok(status) = answer {
            replicas.push(status);
        }
    }
    replicas.sort_by_key(|r| r.id);
    replicas
}

/// What is known of replica `id` at `address` that did not answer, and why.
fn unreachable(id: u64, address: String, error: String) -> HeadReplica {
    HeadReplica {
        id,
        address,
        role: None,
        term: 0,
        commit_index: 0,
        applied_index: 0,
        reachable: false,
        error: Some(error),
        leader: None,
        in_memory: false,
        data_format: None,
        writes_data_format: None,
        stalled: None,
    }
}

/// Asks replica `id` at `address` how it is; an answer that does not come says why.
async fn peer_status(id: u64, address: String, group: String, access: PeerAccess) -> HeadReplica {
    let PeerAccess { bearer, tls } = access;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("{scheme}://{address}")) {
        Ok(e) => e.connect_timeout(PEER_STATUS_TIMEOUT),
        Err(e) => return unreachable(id, address, e.to_string()),
    };
    let endpoint = match tls {
        Some(tls) => match endpoint.tls_config(tls) {
            Ok(e) => e,
            Err(e) => return unreachable(id, address, e.to_string()),
        },
        None => endpoint,
    };
    let ask = async {
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        let request = wire::ReplicaStatusRequest { group };
        let reply = RaftClient::with_interceptor(channel, bearer)
            .status(request)
            .await
            .map_err(|s| s.message().to_string())?;
        HeadReplica::try_from(reply.into_inner()).map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PEER_STATUS_TIMEOUT, ask).await {
        Ok(Ok(status)) => status,
        Ok(Err(why)) => unreachable(id, address, why),
        Err(_) => unreachable(
            id,
            address,
            format!("no answer within {PEER_STATUS_TIMEOUT:?}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use escher_proto::access::Bearer;

    fn me() -> HeadReplica {
        HeadReplica {
            reachable: true,
            error: None,
            ..unreachable(2, "127.0.0.1:1".into(), String::new())
        }
    }

    #[tokio::test]
    async fn a_member_that_cannot_be_reached_says_why_and_the_list_is_by_id() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let members = BTreeMap::from([
            (1, "127.0.0.1:1".to_string()),
            (2, "127.0.0.1:1".to_string()),
            (3, "not an address".to_string()),
        ]);
        let access = PeerAccess {
            bearer: Bearer::new("t"),
            tls: None,
        };
        let replicas = group_status(me(), &members, "g", &access).await;
        let ids: Vec<u64> = replicas.iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert!(replicas[1].reachable, "this replica answers for itself");
        for other in [&replicas[0], &replicas[2]] {
            assert!(!other.reachable && other.error.is_some(), "{other:?}");
        }
    }
}
