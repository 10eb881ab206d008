//! The object calls of the `Cluster` service (docs/ARCHITECTURE.md "Objects"): where a `put`
//! goes (`PlaceObject`), recording sealed copies (`ObjectsSealed`), releasing objects
//! (`ReleaseObjects`), where an object is (`LocateObject`, `ListObjects`), and a client's
//! object session kept (`RenewObjectSession`, the leader's clock in `object_sessions.rs`) or
//! ended with every object it owns (`CloseObjectSession`).
//!
//! The bytes never come here: a client pushes them to the worker `PlaceObject` names, with the
//! write ticket it signs, and a reader fetches them from a holder `LocateObject` names, with a
//! read ticket. The head keeps the table (`escher_core::state` `objects.rs`) and signs tickets
//! with each node's ticket key. Every refusal names the object.
//!
//! [`locate`] is the one answer to "where is this object, and how may I read it": `LocateObject`
//! gives it to a caller, and the leader puts it into a task's `Assign` for each of the task's
//! object arguments ([`task_objects`]), so that the worker fetches with no call first.

use escher_proto::convert::{MAX_ASSIGNED_OBJECTS, object_id, object_ids};
use escher_proto::types::{
    Labels, NAMESPACE_LABEL, Namespace, NodeId, OBJECTS_LABEL, ObjectId, ObjectOwner, ObjectView,
    SealedCopy, TICKET_MILLIS, parse_object_args,
};
use escher_proto::wire;
use tonic::{Request, Response, Status};

use super::cluster_svc::ClusterService;
use super::handle::{to_status, wants_stale};
use super::owner::Msg;
use super::owner::now_ms;
use crate::state::{ApplyError, ClusterState, Command, Reply};

/// Object `id` as a caller acting in namespace `ns` may read it now (`everything`: an admin,
/// or a task of no namespace, sees every namespace's): its size, CRC-32C and copies, each
/// holder's data address and a read ticket valid for [`TICKET_MILLIS`]. Unknown, freed and lost
/// objects are refused, naming the object.
pub(crate) fn locate(
    state: &ClusterState,
    id: ObjectId,
    ns: Option<&Namespace>,
    everything: bool,
) -> Result<ObjectView, ApplyError> {
    let expiry = now_ms().saturating_add(TICKET_MILLIS);
    state.locate_object(id, ns, everything, Some(expiry))
}

/// The object arguments of a task whose spec has `labels` ([`OBJECTS_LABEL`]), each as
/// [`locate`] answers the task's own credential (which acts in the task's namespace, or sees
/// every namespace when it has none), in the label's order. One that cannot be located now
/// (freed or lost since the task was accepted) is left out, as is every one of a label that
/// does not parse: the worker asks the head for what is missing, and the refusal it gets
/// names the object.
pub(crate) fn task_objects(state: &ClusterState, labels: &Labels) -> Vec<ObjectView> {
    let Some(ids) = labels
        .get(OBJECTS_LABEL)
        .and_then(|value| parse_object_args(value).ok())
    else {
        return Vec::new();
    };
    let namespace = match labels.get(NAMESPACE_LABEL).map(Namespace::new) {
        None => None,
        Some(Ok(ns)) => Some(ns),
        Some(Err(_)) => return Vec::new(),
    };
    let everything = namespace.is_none();
    ids.into_iter()
        .filter_map(|id| locate(state, id, namespace.as_ref(), everything).ok())
        .take(MAX_ASSIGNED_OBJECTS)
        .collect()
}

/// The namespace a request names (empty: none).
fn requested(text: &str) -> Result<Option<Namespace>, Status> {
    match text {
        "" => Ok(None),
        ns => Namespace::new(ns)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("namespace {ns:?}: {e}"))),
    }
}

fn unexpected(reply: Reply) -> Status {
    Status::internal(format!(
        "unexpected reply from the state machine: {reply:?}"
    ))
}

fn to_status_convert(e: escher_proto::convert::ConvertError) -> Status {
    Status::invalid_argument(e.to_string())
}

impl ClusterService {
    pub(crate) async fn do_place_object(
        &self,
        request: Request<wire::PlaceObjectRequest>,
    ) -> Result<Response<wire::PlaceObjectReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let session = match request.session {
            0 => match self.owner.apply(Command::OpenObjectSession, None).await? {
                Reply::ObjectSession(s) => s,
                other => return Err(unexpected(other)),
            },
            s => s,
        };
        let id = ObjectId(session, request.index);
        let expiry = now_ms().saturating_add(TICKET_MILLIS);
        let ns = namespace.clone();
        let size = request.size;
        let (placed, known, quota) = self
            .owner
            .read(false, move |s| {
                let known = s.objects().get(id).is_some() || s.objects().was_freed(id);
                let quota = s.check_object_bytes(ns.as_ref(), size);
                (s.place_object(id, &ns, expiry), known, quota)
            })
            .await?;
        // Refused before any byte moves; `ObjectsSealed` checks again, authoritatively.
        quota.map_err(to_status)?;
        if known {
            return Err(Status::already_exists(format!(
                "object {id} exists already (or was freed): each id is put once; count the \
                 session's indexes up"
            )));
        }
        let Some((node, address, ticket)) = placed else {
            return Err(Status::unavailable(format!(
                "no live worker with a data plane can take object {id} ({} bytes) now; start \
                 a worker, or try again when one has joined",
                request.size
            )));
        };
        Ok(Response::new(wire::PlaceObjectReply {
            session,
            node: node.0,
            address,
            ticket,
        }))
    }

    pub(crate) async fn do_objects_sealed(
        &self,
        request: Request<wire::ObjectsSealedRequest>,
    ) -> Result<Response<wire::ObjectsSealedReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        escher_proto::convert::check_object_count("copies", request.copies.len())
            .map_err(to_status_convert)?;
        let mut copies = Vec::with_capacity(request.copies.len());
        for (i, c) in request.copies.into_iter().enumerate() {
            let id = object_id(c.id, &format!("copies[{i}].id")).map_err(to_status_convert)?;
            copies.push(SealedCopy {
                id,
                size: c.size,
                checksum: c.crc32c,
                // A client reports the objects of its own sessions (ids from FIRST_SESSION up);
                // a worker the copies it fetched, a task's result object's among them (an id
                // below: the task's).
                owner: if id.owner() >= crate::state::FIRST_SESSION {
                    ObjectOwner::Session(id.owner())
                } else {
                    ObjectOwner::Task(escher_proto::types::TaskId(id.owner()))
                },
                namespace: namespace.clone(),
                node: NodeId(c.node),
            });
        }
        match self
            .owner
            .apply(Command::ObjectsSealed { copies }, None)
            .await?
        {
            Reply::ObjectsSealed(dropped) => Ok(Response::new(wire::ObjectsSealedReply {
                dropped: dropped
                    .into_iter()
                    .map(|(id, reason)| wire::DroppedCopy {
                        id: Some(id.into()),
                        reason,
                    })
                    .collect(),
            })),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn do_release_objects(
        &self,
        request: Request<wire::ReleaseObjectsRequest>,
    ) -> Result<Response<wire::ReleaseObjectsReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let ids = object_ids(request.ids, "ids").map_err(to_status_convert)?;
        let command = Command::ObjectsReleased {
            ids,
            namespace,
            sees_everything: caller.sees_everything(),
        };
        match self.owner.apply(command, None).await? {
            Reply::ObjectsReleased(unknown) => Ok(Response::new(wire::ReleaseObjectsReply {
                unknown: unknown.into_iter().map(Into::into).collect(),
            })),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn do_locate_object(
        &self,
        request: Request<wire::LocateObjectRequest>,
    ) -> Result<Response<wire::ObjectInfo>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let id = object_id(request.id, "id").map_err(to_status_convert)?;
        let everything = caller.sees_everything();
        let view = self
            .owner
            .read(stale, move |s| {
                locate(s, id, namespace.as_ref(), everything)
            })
            .await?;
        Ok(Response::new(view.map_err(to_status)?.into()))
    }

    pub(crate) async fn do_list_objects(
        &self,
        request: Request<wire::ListObjectsRequest>,
    ) -> Result<Response<wire::ListObjectsReply>, Status> {
        let stale = wants_stale(&request);
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let asked = requested(&request.namespace)?;
        // An admin who names no namespace sees every namespace's objects.
        let everything = caller.sees_everything() && asked.is_none();
        let namespace = caller.namespace(asked)?;
        let views = self
            .owner
            .read(stale, move |s| {
                s.list_objects(namespace.as_ref(), everything)
            })
            .await?;
        Ok(Response::new(wire::ListObjectsReply {
            objects: views.into_iter().map(Into::into).collect(),
        }))
    }

    /// A new session for a client that has put nothing yet (a driver at its start): proposed
    /// as `PlaceObject` proposes one for a first put, then renewed here at once, so that the
    /// leader counts its lapse from now.
    pub(crate) async fn do_open_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::OpenObjectSessionReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        if request.session != 0 {
            return Err(Status::invalid_argument(format!(
                "session {}: a session is opened with 0 (the head gives its number); renew an \
                 open one with RenewObjectSession",
                request.session
            )));
        }
        let session = match self.owner.apply(Command::OpenObjectSession, None).await? {
            Reply::ObjectSession(s) => s,
            other => return Err(unexpected(other)),
        };
        let lapse = self
            .renew_session(session, namespace, caller.sees_everything())
            .await?;
        Ok(Response::new(wire::OpenObjectSessionReply {
            session,
            lapse_ms: u64::try_from(lapse.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    pub(crate) async fn do_renew_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::RenewObjectSessionReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let lapse = self
            .renew_session(request.session, namespace, caller.sees_everything())
            .await?;
        Ok(Response::new(wire::RenewObjectSessionReply {
            lapse_ms: u64::try_from(lapse.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    /// Tells the leader that `session`'s client lives; returns the session's lapse time.
    async fn renew_session(
        &self,
        session: u64,
        namespace: Option<escher_proto::types::Namespace>,
        sees_everything: bool,
    ) -> Result<std::time::Duration, Status> {
        self.owner
            .ask(|reply| Msg::RenewObjectSession {
                session,
                namespace,
                sees_everything,
                reply,
            })
            .await?
    }

    pub(crate) async fn do_close_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::CloseObjectSessionReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let command = Command::CloseObjectSession {
            session: request.session,
            namespace,
            sees_everything: caller.sees_everything(),
        };
        match self.owner.apply(command, None).await? {
            Reply::ObjectSessionClosed { released, pinned } => {
                Ok(Response::new(wire::CloseObjectSessionReply {
                    released: released.into_iter().map(Into::into).collect(),
                    pinned: pinned.into_iter().map(Into::into).collect(),
                }))
            }
            other => Err(unexpected(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{
        DATA_ADDRESS_LABEL, ObjectAccess, ObjectTicket, format_object_args, ticket_key,
    };

    use super::*;
    use crate::state::{Entry, FIRST_SESSION, Joining, SecretHash, StateConfig};

    fn apply(state: &mut ClusterState, now: u64, command: Command) -> Reply {
        state
            .apply(Entry {
                now,
                command,
                key: None,
            })
            .expect("the command applies")
    }

    /// A task's labels: object arguments `ids`, namespace `ns`.
    fn task_labels(ids: &[ObjectId], ns: Option<&str>) -> Labels {
        let mut labels = Labels::new();
        labels
            .insert(OBJECTS_LABEL, &format_object_args(ids))
            .unwrap();
        if let Some(ns) = ns {
            labels.insert(NAMESPACE_LABEL, ns).unwrap();
        }
        labels
    }

    #[test]
    fn a_tasks_object_arguments_are_located_as_its_credential_locates_them() {
        let mut state = ClusterState::new(StateConfig::default());
        let mut labels = Labels::new();
        labels.insert(DATA_ADDRESS_LABEL, "127.0.0.1:7700").unwrap();
        let worker = Joining {
            name: "w".into(),
            address: "w:1".into(),
            resources: "cpu=8".parse().unwrap(),
            labels,
            gpus: Vec::new(),
            boot: 1,
        };
        let secret = SecretHash::of("secret of w");
        let Reply::Registered(node) =
            apply(&mut state, 1, Command::RegisterNode { worker, secret })
        else {
            panic!("the node registers");
        };
        let id = |index| ObjectId(FIRST_SESSION, index);
        let (team, other, unknown) = (id(0), id(1), id(9));
        let copy = |id, ns: &str| SealedCopy {
            id,
            size: 1024,
            checksum: 0xdead_beef,
            owner: ObjectOwner::Session(FIRST_SESSION),
            namespace: Some(Namespace::new(ns).unwrap()),
            node,
        };
        let copies = vec![copy(team, "team"), copy(other, "other")];
        apply(&mut state, 2, Command::ObjectsSealed { copies });

        // The team's task: its own object, located with a read ticket for it on the holder;
        // the unknown one and another namespace's left out (the worker asks, and is refused).
        let got = task_objects(&state, &task_labels(&[unknown, other, team], Some("team")));
        assert_eq!(got.len(), 1, "{got:?}");
        let (view, asked) = (
            &got[0],
            locate(&state, team, Some(&"team".parse().unwrap()), false),
        );
        let asked = asked.expect("LocateObject answers the team");
        assert_eq!(
            (view.id, view.size, view.checksum),
            (team, 1024, 0xdead_beef)
        );
        assert_eq!(view.holders.len(), 1);
        let holder = &view.holders[0];
        assert_eq!(holder.node, node);
        assert_eq!(holder.address.as_deref(), Some("127.0.0.1:7700"));
        assert_eq!(asked.holders[0].address, holder.address);
        let ticket = holder.ticket.as_deref().expect("a read ticket");
        let ticket = ObjectTicket::verify(ticket, &ticket_key(&secret.0)).expect("signed for w");
        assert_eq!(
            (ticket.node, ticket.access, ticket.objects, ticket.namespace),
            (
                node,
                ObjectAccess::Read,
                vec![team],
                Some("team".to_string())
            )
        );
        assert!(ticket.expiry_ms > now_ms(), "valid for a while");

        // A task of no namespace sees every namespace's objects, as its credential does.
        let got = task_objects(&state, &task_labels(&[other, team], None));
        let ids: Vec<ObjectId> = got.iter().map(|v| v.id).collect();
        assert_eq!(ids, [other, team]);
        // No label, or one that does not parse: nothing located.
        assert!(task_objects(&state, &Labels::new()).is_empty());
        let mut bad = Labels::new();
        bad.insert(OBJECTS_LABEL, "7.0+x").unwrap();
        assert!(task_objects(&state, &bad).is_empty());
    }
}
