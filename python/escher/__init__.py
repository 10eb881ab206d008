"""escher for Python: Ray-like remote functions, ephemeral resources and scheduling libraries,
over escher's Rust client (the private native module ``escher._escher``).

    import escher

    escher.init()                      # a head and a worker in this process

    @escher.remote
    def square(x):
        return x * x

    refs = [square.remote(i) for i in range(4)]
    print(escher.get(refs))            # [0, 1, 4, 9]
    escher.set_resource("dataset-7", "unbounded", escher.Node(escher.nodes()[0]))

``escher.init(address="http://head:7600", token=...)`` connects to a running cluster instead.
"""

from . import esl
from ._actors import (
    ActorCallRef,
    ActorClass,
    ActorDiedError,
    ActorHandle,
    get_actor,
    kill,
)
from ._objects import ObjectLostError, ObjectRef
from ._api import (
    AuthError,
    ClusterInfo,
    ConnectError,
    EscherError,
    Events,
    GetTimeoutError,
    InvalidArgumentError,
    Local,
    Match,
    Node,
    NotFoundError,
    NotInitializedError,
    RemoteFunction,
    Reservation,
    TaskCancelledError,
    TaskError,
    TaskRef,
    adjust_resource,
    available_resources,
    cancel,
    cluster_resources,
    cluster_status,
    create_token,
    delete_resource,
    get,
    heads,
    init,
    is_initialized,
    logs,
    put,
    remote,
    report,
    reserve,
    set_resource,
    shutdown,
    submit,
    task_info,
    telemetry,
    wait,
    watch,
)


def nodes() -> "list[int]":
    """The ids of the live nodes."""
    return [n["id"] for n in cluster_status()["nodes"] if n.get("alive")]


__all__ = [
    "ActorCallRef",
    "ActorClass",
    "ActorDiedError",
    "ActorHandle",
    "AuthError",
    "ClusterInfo",
    "ConnectError",
    "EscherError",
    "Events",
    "GetTimeoutError",
    "InvalidArgumentError",
    "Local",
    "Match",
    "Node",
    "NotFoundError",
    "NotInitializedError",
    "ObjectLostError",
    "ObjectRef",
    "RemoteFunction",
    "Reservation",
    "TaskCancelledError",
    "TaskError",
    "TaskRef",
    "adjust_resource",
    "available_resources",
    "cancel",
    "cluster_resources",
    "cluster_status",
    "create_token",
    "delete_resource",
    "esl",
    "get",
    "get_actor",
    "heads",
    "init",
    "is_initialized",
    "kill",
    "logs",
    "nodes",
    "put",
    "remote",
    "report",
    "reserve",
    "set_resource",
    "shutdown",
    "submit",
    "task_info",
    "telemetry",
    "wait",
    "watch",
]
