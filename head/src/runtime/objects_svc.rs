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

use escher_proto::convert::{object_id, object_ids};
use escher_proto::types::{Namespace, NodeId, ObjectId, ObjectOwner, SealedCopy, TICKET_MILLIS};
use escher_proto::wire;
use tonic::{Request, Response, Status};

use super::cluster_svc::ClusterService;
use super::handle::{to_status, wants_stale};
use super::owner::Msg;
use super::owner::now_ms;
use crate::state::{Command, Reply};

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
        let expiry = now_ms().saturating_add(TICKET_MILLIS);
        let view = self
            .owner
            .read(stale, move |s| {
                s.locate_object(id, namespace.as_ref(), everything, Some(expiry))
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

    pub(crate) async fn do_renew_object_session(
        &self,
        request: Request<wire::ObjectSessionRequest>,
    ) -> Result<Response<wire::RenewObjectSessionReply>, Status> {
        let caller = crate::auth::caller(&request)?;
        let request = request.into_inner();
        let namespace = caller.namespace(requested(&request.namespace)?)?;
        let session = request.session;
        let sees_everything = caller.sees_everything();
        let lapse = self
            .owner
            .ask(|reply| Msg::RenewObjectSession {
                session,
                namespace,
                sees_everything,
                reply,
            })
            .await??;
        Ok(Response::new(wire::RenewObjectSessionReply {
            lapse_ms: u64::try_from(lapse.as_millis()).unwrap_or(u64::MAX),
        }))
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
