"""The session: ``init``, ``shutdown``, remote functions, ``TaskRef`` and the calls on tasks.

Everything here goes through the private native module ``escher._escher`` (the Rust client);
this file gives it the shape Ray users know.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import hashlib
import importlib
import itertools
import os
import pickle
import struct
import sys
import threading
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _escher
from ._escher import (
    AuthError,
    ConnectError,
    EscherError,
    GetTimeoutError,
    InvalidArgumentError,
    NotFoundError,
)
from . import _objects
from ._objects import ObjectRef, collecting, put_object

Resources = Union[Dict[str, Union[int, float, str]], str, None]

# The resource of a worker's Python slots (worker/src/python/mod.rs).
_PYTHON_SLOT = _escher.PYTHON_RESOURCE
_lock = threading.RLock()
_session: Optional[_escher.Session] = None
# The driver's object session (``init`` opens it): references a task returns in it are adopted
# by this process when it reads the result (``_objects._returned``).
_object_session: Optional[int] = None
# The session of the task running in this interpreter (by its credential), if any.
_task_session: Optional[Tuple[str, _escher.Session]] = None
# The connection of this interpreter's first task, by head: later tasks call on it.
_task_base: Optional[Tuple[Optional[str], _escher.Session]] = None
_signal_prefix = "escher-py-" + uuid.uuid4().hex[:12]
# Counts the sessions init() opened, so that what one session stored is never used in another.
_generation = 0
_signal_seq = itertools.count(1)
# The runtime environment init() gave: what remote functions without their own run with.
_session_runtime_env: Optional[Dict[str, Any]] = None


class NotInitializedError(EscherError):
    """A call that needs a cluster came before ``escher.init()``."""


class TaskError(EscherError):
    """A task failed, was cancelled, or raised an exception on its worker.

    ``task_id`` names the task, ``state`` its final state (``failed``, ``cancelled``) and
    ``remote_traceback`` the traceback of the exception raised remotely, if any.
    """

    def __init__(self, message: str, task_id: int = 0, state: str = "failed",
                 remote_traceback: Optional[str] = None):
        super().__init__(message)
        self.task_id = task_id
        self.state = state
        self.remote_traceback = remote_traceback


class TaskCancelledError(TaskError):
    """The task was cancelled."""


# ------------------------------------------------------------------------------------------
# Connecting


def init(address: Optional[str] = None, *, token: Optional[str] = None,
         namespace: Optional[str] = None, num_workers: int = 1,
         resources: Resources = None, num_heads: int = 1,
         ignore_reinit_error: bool = False,
         runtime_env: Optional[Dict[str, Any]] = None) -> "ClusterInfo":
    """Starts an embedded cluster, or connects to a running one.

    With no ``address`` (and no ``ESCHER_HEAD``), starts a head (a raft group of
    ``num_heads`` replicas, whose leader the client follows) and ``num_workers`` workers in
    this process (each with ``resources``, default ``cpu=4,memory=4096``, and Python slots
    that run remote functions in warm interpreters of this Python) and stops them at exit.
    With an ``address`` (``http://HOST:7600``, or several, comma-separated, for a replicated
    head) or ``ESCHER_HEAD``, connects to that cluster with ``token``, else ``ESCHER_TOKEN``,
    else the access file the head wrote (``~/.escher/access.json``). ``runtime_env``
    (``{"env_vars": {...}, "working_dir": "path", "pip": [...]}``) is what every remote
    function's calls run with, unless the function has one of its own; its ``pip`` reaches
    actors without one of their own too.
    """
    global _session, _generation, _session_runtime_env, _object_session
    with _lock:
        if _session is not None:
            if ignore_reinit_error:
                return ClusterInfo(_session)
            raise EscherError(
                "escher.init() was already called in this process; call escher.shutdown() "
                "first, or pass ignore_reinit_error=True"
            )
        address = address or os.environ.get("ESCHER_HEAD") or None
        _session_runtime_env = _check_runtime_env(runtime_env)
        _generation += 1
        if address is None:
            if token is not None:
                raise InvalidArgumentError(
                    "a token is for connecting to a running cluster: pass address= too (an "
                    "embedded cluster needs none)"
                )
            # The workers of the embedded cluster run Python tasks with this very interpreter.
            os.environ.setdefault("ESCHER_PYTHON", sys.executable)
            _session = _escher.start_local(num_workers, _resources_text(resources), num_heads)
        else:
            _session = _escher.connect(address, token, namespace)
        # The driver's object session, opened now rather than at its first put: the result
        # objects of every task it submits are then its own, released when it shuts down or
        # dies (its session lapsing at the head), never left behind.
        _object_session = _session.open_object_session()
        return ClusterInfo(_session)


def is_initialized() -> bool:
    """Whether ``init`` was called (and ``shutdown`` not since)."""
    return _session is not None


def shutdown() -> None:
    """Disconnects, and stops the embedded cluster if ``init`` started one."""
    global _session, _session_runtime_env, _object_session
    with _lock:
        session, _session = _session, None
        _session_runtime_env = None
        _object_session = None
    if session is not None:
        session.shutdown()


atexit.register(shutdown)


class ClusterInfo:
    """What ``init`` connected to."""

    def __init__(self, session: _escher.Session):
        self.head_url: str = session.head_url
        self.nodes: List[int] = list(session.nodes)
        self.admin_token: Optional[str] = session.admin_token
        self.namespace: Optional[str] = session.namespace

    def __repr__(self) -> str:
        return f"ClusterInfo(head_url={self.head_url!r}, nodes={self.nodes!r})"


def _in_task_session() -> Optional[_escher.Session]:
    """The session of the task running in this interpreter (a warm interpreter of a worker
    runs one task at a time; each has its own credential)."""
    global _task_session, _task_base
    token = os.environ.get("ESCHER_TASK_TOKEN")
    if not token:
        return None
    with _lock:
        if _task_session is None or _task_session[0] != token:
            head = os.environ.get("ESCHER_HEAD")
            task = os.environ.get("ESCHER_TASK_ID")
            if _task_base is None or _task_base[0] != head or not task:
                # The first task of this interpreter connects; the next ones speak on the same
                # connection with their own credential.
                _task_base = (head, _escher.connect(head, token, None))
                session = _task_base[1]
            else:
                session = _task_base[1].for_task(token, int(task),
                                                 os.environ.get("ESCHER_NAMESPACE") or None)
            caller = os.environ.get("ESCHER_OBJECT_SESSION")
            if caller and task:
                # The task's puts go into its caller's object session, so that a reference
                # it returns outlives it (the caller adopts it when it reads the result).
                session = session.in_object_session(
                    int(caller), int(task), int(os.environ.get("ESCHER_ATTEMPT") or 0))
            _task_session = (token, session)
        return _task_session[1]


def _current() -> _escher.Session:
    session = _session
    if session is not None:
        return session
    task = _in_task_session()
    if task is not None:
        return task
    raise NotInitializedError(
        "escher is not initialized: call escher.init() first (no argument starts a cluster in "
        "this process; escher.init(address=...) connects to a running one)"
    )


# ------------------------------------------------------------------------------------------
# Resources and node targets


class _Target:
    kind = ""

    def _args(self) -> Tuple[str, Optional[int], Optional[str], Optional[int]]:
        raise NotImplementedError


class _Local(_Target):
    """The node of the calling task (inside a task only)."""

    kind = "local"

    def _args(self):
        return ("local", None, None, None)

    def __repr__(self) -> str:
        return "Local"


Local = _Local()


class Node(_Target):
    """Exactly this node."""

    kind = "node"

    def __init__(self, node_id: int):
        self.node_id = int(node_id)

    def _args(self):
        return ("node", self.node_id, None, None)

    def __repr__(self) -> str:
        return f"Node({self.node_id})"


class Match(_Target):
    """Every live node whose available resources contain ``resources`` (all live nodes when
    empty), or at most ``num_nodes`` of them."""

    kind = "match"

    def __init__(self, resources: Resources = None, num_nodes: Optional[int] = None):
        self.resources = _resources_text(resources)
        self.num_nodes = num_nodes

    def _args(self):
        return ("match", None, self.resources, self.num_nodes)

    def __repr__(self) -> str:
        return f"Match({self.resources!r}, num_nodes={self.num_nodes!r})"


def _target(node: Any) -> Tuple[str, Optional[int], Optional[str], Optional[int]]:
    if isinstance(node, _Target):
        return node._args()
    if isinstance(node, int) and not isinstance(node, bool):
        return ("node", node, None, None)
    raise InvalidArgumentError(
        f"a node target is escher.Local, escher.Node(id), escher.Match(...) or a node id, "
        f"not {node!r}"
    )


def _resources_text(resources: Resources) -> Optional[str]:
    if resources is None:
        return None
    if isinstance(resources, str):
        return resources
    if isinstance(resources, dict):
        return ",".join(f"{k}={v}" for k, v in resources.items())
    raise InvalidArgumentError(
        f"resources are a dict such as {{'cpu': 1}} or a text such as 'cpu=1', not {resources!r}"
    )


def set_resource(name: str, capacity: Union[int, float, str], node: Any) -> List[int]:
    """Creates or resizes resource ``name`` with ``capacity`` (a number or ``"unbounded"``;
    0 deletes it) on the nodes ``node`` selects; returns the nodes changed."""
    return _current().set_resource(name, str(capacity), *_target(node))


def adjust_resource(name: str, delta: Union[int, float, str], node: Any) -> List[int]:
    """Changes resource ``name`` by ``delta`` (``2``, ``-1``, ``"+0.5"``) on the nodes
    ``node`` selects; concurrent adjustments never lose each other."""
    text = str(delta)
    if not text.startswith(("+", "-")):
        text = "+" + text
    return _current().adjust_resource(name, text, *_target(node))


def delete_resource(name: str, node: Any) -> List[int]:
    """Deletes resource ``name`` on the nodes ``node`` selects."""
    return _current().delete_resource(name, *_target(node))


def cluster_status() -> Dict[str, Any]:
    """Every node (id, name, liveness, labels, and each resource's total and available
    amounts), and how many tasks are pending and running."""
    import json

    return json.loads(_current().cluster_status())


def heads() -> Dict[str, Any]:
    """The head's replicas (``group`` and ``replicas``: each one's ``id``, ``address``,
    ``role`` (``Leader``, ``Follower``, ...; ``None`` when it did not answer), ``term`` and
    ``reachable``); one replica for a lone head."""
    import json

    return json.loads(_current().heads())


def available_resources() -> Dict[str, float]:
    """The available amount of each resource, summed over the live nodes."""
    return _sum_resources("available")


def cluster_resources() -> Dict[str, float]:
    """The total amount of each resource, summed over the live nodes."""
    return _sum_resources("total")


def _amount(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float("inf") if value.lower() == "unbounded" else float(value)
    return float("inf")


def _sum_resources(field: str) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for node in cluster_status()["nodes"]:
        if not node.get("alive"):
            continue
        for res in node.get("resources", []):
            total = _amount(res.get("total"))
            value = total if field == "total" else max(total - _amount(res.get("used", 0)), 0.0)
            out[res["name"]] = out.get(res["name"], 0.0) + value
    return out


# ------------------------------------------------------------------------------------------
# Tasks


class TaskRef:
    """A submitted task: ``escher.get(ref)``, ``ref.result()``, ``await ref``, or pass it as
    an argument to another remote function, which then waits for its success and receives
    its result."""

    __slots__ = ("_id", "_pending", "_deps", "_kind", "_keep")

    def __init__(self, task_id: Optional[int], deps: Sequence["TaskRef"] = (),
                 kind: str = "python", pending: Any = None, keep: Sequence[ObjectRef] = ()):
        self._id = None if task_id is None else int(task_id)
        self._pending = pending
        self._deps = tuple(deps)
        self._kind = kind
        # The objects its arguments refer to: kept (not released) while this ref lives.
        self._keep = tuple(keep)

    @property
    def id(self) -> int:
        """The task's id (for a call sent without waiting, known once the head answered: the
        first read waits for it, and raises if the head refused the task)."""
        if self._id is None:
            self._id = int(self._pending.id())
            self._pending = None
        return self._id

    def result(self, timeout: Optional[float] = None) -> Any:
        """Waits for the task and returns its value (a command task: its exit code); raises
        the remote exception (or ``TaskError``) if it failed."""
        return get(self, timeout=timeout)

    def cancel(self, *, force: bool = False, recursive: bool = True) -> None:
        """Cancels the task (``escher.cancel``)."""
        cancel(self, force=force, recursive=recursive)

    def _cancel_call(self) -> None:
        # An actor call's ref (`ActorCallRef`) sends its cancel to the actor; a task has none.
        raise InvalidArgumentError(f"{self!r} is not an actor call")

    def __await__(self):
        return _async_get(self).__await__()

    def __repr__(self) -> str:
        return f"TaskRef({self.id})"


    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskRef) and other._kind != "actor-call" and \
            getattr(other, "_later", None) is None and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __reduce__(self):
        return (TaskRef, (self.id, (), self._kind))


def _status_value(status: tuple, kind: str, ref: Optional["TaskRef"] = None) -> Any:
    task_id, state, value, reason, code, _node, _attempt = status
    if state == "succeeded":
        if kind == "command":
            return code
        if value is None:
            return None
        with _objects.adopting() as adopted:
            out = pickle.loads(value)
        if adopted and ref is not None:
            # The references the result holds stay while its TaskRef does too.
            ref._keep = ref._keep + tuple(o for o in adopted
                                          if not any(o is k for k in ref._keep))
        return out
    raise _failure(task_id, state, reason or "")


_PY_EXC = "python exception "


def _failure(task_id: int, state: str, reason: str, subject: Optional[str] = None) -> TaskError:
    """The exception for a task (or, named by ``subject``, an actor call) that failed: the
    remote exception's own type where it can be found here (an instance of both it and
    ``TaskError``), else ``TaskError``."""
    subject = subject or f"task {task_id}"
    if state == "cancelled":
        return TaskCancelledError(f"{subject} was cancelled: {reason}", task_id, state)
    idx = reason.find(_PY_EXC)
    if idx < 0:
        return TaskError(f"{subject} {state}: {reason}", task_id, state)
    text = reason[idx + len(_PY_EXC):]
    head, _, rest = text.partition(": ")
    message, _, tb = rest.partition("\n\nRemote traceback:\n")
    module, _, qualname = head.rpartition(".")
    full = f"{subject} raised {head}: {message}\n\nRemote traceback:\n{tb}"
    cls = _find_exception(module, qualname)
    if cls is None:
        return TaskError(full, task_id, state, tb)
    try:
        derived = type(cls.__name__, (TaskError, cls), {
            "__init__": lambda self, *a: BaseException.__init__(self, *a),
            "__str__": lambda self: full,
        })
        err = derived(full)
        err.task_id, err.state, err.remote_traceback = task_id, state, tb
        err.cause = message
        return err
    except TypeError:
        return TaskError(full, task_id, state, tb)


def _find_exception(module: str, qualname: str):
    try:
        obj: Any = builtins if module == "builtins" else importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


def _ids(refs: Iterable[TaskRef]) -> List[int]:
    out = []
    for r in refs:
        if not isinstance(r, TaskRef):
            raise InvalidArgumentError(f"expected a TaskRef (what f.remote() returns), not {r!r}")
        out.append(r.id)
    return out


def get(refs: Union[TaskRef, ObjectRef, Sequence[Union[TaskRef, ObjectRef]]], *,
        timeout: Optional[float] = None) -> Any:
    """Waits for one task or a list of tasks and returns their values, in order. Raises the
    remote exception (or ``TaskError``) of the first that failed, and ``GetTimeoutError``
    if they are not all done within ``timeout`` seconds. A task whose argument task failed
    is cancelled, and its ``get`` raises that failure. An ``ObjectRef`` (``escher.put``)
    reads its object: ``ObjectLostError`` if no copy of it is left, ``NotFoundError`` if it
    was freed or is not of this namespace."""
    if isinstance(refs, TaskRef):
        return _get_one(refs, timeout)
    if isinstance(refs, ObjectRef):
        return refs.get()
    if not isinstance(refs, (list, tuple)):
        raise InvalidArgumentError(
            f"escher.get takes a TaskRef, an ObjectRef or a list of them, not {refs!r}")
    if any(isinstance(r, ObjectRef) for r in refs):
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        return [r.get() if isinstance(r, ObjectRef) else
                _get_one(r, None if deadline is None else max(deadline - time.monotonic(), 0))
                for r in refs]
    if any(isinstance(r, TaskRef) and (r._kind == "actor-call" or
                                       getattr(r, "_later", None) is not None) for r in refs):
        # Actor calls are answered by their actors, and deferred tasks are sent once their
        # arguments are ready: each waited for in turn, within one timeout for all.
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        return [_get_one(r, None if deadline is None else max(deadline - time.monotonic(), 0))
                for r in refs]
    if not all(isinstance(r, TaskRef) and not r._deps for r in refs):
        return [_get_one(r, timeout) for r in refs]
    # Refs without argument tasks: waited for in one call (one trip through the runtime, not
    # two per task), in order, within one timeout for all.
    ids, statuses, stopped = _current().get_many(
        [r._id if r._id is not None else r._pending for r in refs], timeout)
    for ref, tid in zip(refs, ids):
        if ref._id is None:
            ref._id, ref._pending = tid, None
    values = [_status_value(status, ref._kind, ref) for ref, status in zip(refs, statuses)]
    if stopped is not None:
        if isinstance(stopped, GetTimeoutError):
            # The first ref without a status is the one that timed out.
            raise _why_waiting(stopped, [r.id for r in refs[len(statuses):len(statuses) + 1]])
        raise stopped
    return values


def _why_waiting(error: GetTimeoutError, ids: Sequence[int]) -> GetTimeoutError:
    """``error`` with why the first of ``ids`` that has not finished still waits: the reason
    the head gives a pending task (a resource no live node has, which one and how much), or
    the node a running one runs on."""
    for task_id in ids:
        try:
            state, reason, node, _attempt = _current().task_info(task_id)
        except EscherError:
            continue
        if state == "pending":
            why = f"task {task_id} is still pending: {reason}" if reason else \
                f"task {task_id} is still pending (waiting for a node with room for it)"
        elif state == "running":
            why = f"task {task_id} is still running on node {node}"
        else:
            continue
        return GetTimeoutError(f"{error}; {why}")
    return error


def _get_one(ref: TaskRef, timeout: Optional[float]) -> Any:
    if not isinstance(ref, TaskRef):
        raise InvalidArgumentError(f"expected a TaskRef (what f.remote() returns), not {ref!r}")
    if ref._kind == "actor-call":
        return ref._value(timeout)  # type: ignore[attr-defined]
    if getattr(ref, "_later", None) is not None:
        # A deferred task: submitted once its arguments are ready (its failure, or its
        # cancellation before then, is raised here).
        import time

        start = time.monotonic()
        ref._settle(timeout)  # type: ignore[attr-defined]
        if timeout is not None:
            timeout = max(timeout - (time.monotonic() - start), 0.0)
    session = _current()
    try:
        if ref._deps:
            _check_deps(session, ref, timeout)
        status = session.get(ref.id, timeout)
    except GetTimeoutError as e:
        raise _why_waiting(e, [ref.id]) from None
    return _status_value(status, ref._kind, ref)


def _check_deps(session: _escher.Session, ref: TaskRef, timeout: Optional[float]) -> None:
    """Waits until ``ref`` or one of its argument tasks ends; if an argument task failed,
    ``ref`` never starts (the client cancels it): that failure is raised."""
    deps = {d.id: d for d in _all_deps(ref)}
    pending = [ref.id] + list(deps)
    while True:
        ready, _not_ready = session.wait(pending, 1, timeout)
        if not ready:
            raise GetTimeoutError(f"task {ref.id} did not finish within {timeout} s")
        ended = {s[0]: s for s in ready}
        if ref.id in ended and ended[ref.id][1] == "cancelled":
            # Cancelled because an argument failed? Then that failure is the answer.
            done, _ = session.wait(list(deps), len(deps), 0)
            ended.update({s[0]: s for s in done})
        for status in ended.values():
            if status[0] != ref.id and status[1] != "succeeded":
                session.cancel([ref.id])
                raise _failure(status[0], status[1], status[3] or "")
        if ref.id in ended:
            return
        pending = [i for i in pending if i not in ended]


def _all_deps(ref: TaskRef) -> List[TaskRef]:
    seen: Dict[int, TaskRef] = {}
    stack = list(ref._deps)
    while stack:
        d = stack.pop()
        if d.id not in seen:
            seen[d.id] = d
            stack.extend(d._deps)
    return list(seen.values())


async def _async_get(ref: TaskRef, timeout: Optional[float] = None) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: _get_one(ref, timeout))


def task_info(ref: TaskRef) -> Dict[str, Any]:
    """A task's state now: ``{"state", "reason", "node", "attempt"}``; ``reason`` says why a
    pending task waits (a resource no live node has, which one and how much) or why a
    finished one failed."""
    state, reason, node, attempt = _current().task_info(_ids([ref])[0])
    return {"state": state, "reason": reason, "node": node, "attempt": attempt}


def wait(refs: Sequence[TaskRef], *, num_returns: int = 1,
         timeout: Optional[float] = None) -> Tuple[List[TaskRef], List[TaskRef]]:
    """Ray's ``wait``: returns ``(ready, not_ready)`` once ``num_returns`` of ``refs`` have
    finished (succeeded or not), or when ``timeout`` seconds have passed."""
    refs = list(refs)
    from . import _deferred

    if any(isinstance(r, TaskRef) and (r._kind == "actor-call" or _deferred.unsent(r))
           for r in refs):
        from . import _actors

        return _actors.wait_calls(refs, num_returns, timeout)
    ids = _ids(refs)
    if not ids:
        return [], []
    ready, not_ready = _current().wait(ids, num_returns, timeout)
    done = {s[0] for s in ready}
    by_id = {r.id: r for r in refs}
    return [by_id[i] for i in ids if i in done], [by_id[i] for i in not_ready]


def cancel(refs: Union[TaskRef, Sequence[TaskRef]], *, force: bool = False,
           recursive: bool = True) -> List[str]:
    """Cancels tasks (a pending one at once, a running one is stopped); their states.

    ``recursive`` (Ray's, default ``True``): every task a cancelled task submitted from inside
    itself (its ``f.remote()`` calls, or ``escher submit`` in a command task: the head records
    the parent from the running task's credential), and the tasks those submitted, is
    cancelled with it if it has not ended, in the same committed change. ``recursive=False``
    cancels only ``refs``: their children run on.

    A running Python task's interpreter is killed at once (SIGKILL to its process group),
    which is what Ray's ``force=True`` does, so ``force`` changes nothing for one; a running
    command task gets SIGTERM, then SIGKILL after the worker's ``--grace``, and with
    ``force=True`` SIGKILL at once (no grace). A deferred task (one waiting in this process
    for an argument: an actor call's result) cancelled before it was submitted is never
    submitted (``"cancelled"``).

    An actor call's ref is cancelled too (its state reads ``"cancel-requested"``: the actor
    answers): one queued behind other calls is removed from the actor's queue and its ``get``
    raises ``TaskCancelledError``; a running call of an async actor has its coroutine
    cancelled (the same error); a running call of a sync or threaded actor is not interrupted
    and is answered as usual. ``force=True`` is refused for actor calls, as Ray refuses it:
    killing the call's process would kill the actor (use ``escher.kill``). A deferred call
    cancelled before it was sent is never sent (``"cancelled"``).

    A recursive or forced cancel needs every head replica to read data format 11: before
    that, a recursive cancel cancels only ``refs`` (no parent was recorded) and a forced one
    is refused, saying so."""
    if isinstance(refs, TaskRef):
        refs = [refs]
    refs = list(refs)
    for flag, value in (("force", force), ("recursive", recursive)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"escher.cancel's {flag} is True or False, not {value!r}")
    for r in refs:
        if not isinstance(r, TaskRef):
            raise InvalidArgumentError(f"expected a TaskRef (what f.remote() returns), not {r!r}")
        if force and r._kind == "actor-call":
            raise InvalidArgumentError(
                f"force=True is not supported for actor calls ({r!r}): the call runs in the "
                f"actor's process, and killing it would kill the actor; cancel without force, "
                f"or end the actor with escher.kill(handle)"
            )
    states: Dict[int, str] = {}
    tasks: List[int] = []
    for i, r in enumerate(refs):
        later = getattr(r, "_later", None)
        if r._kind == "actor-call":
            r._cancel_call()
            done = getattr(r._call, "_later", None)  # type: ignore[attr-defined]
            states[i] = "cancelled" if done is not None and done.state == "cancelled" \
                else "cancel-requested"
        elif later is not None and r._id is None:
            state, tid = later.cancel(TaskCancelledError(
                f"{later.what} was cancelled before it was submitted (its arguments were not "
                f"ready): it never will be", 0, "cancelled"))
            if state == "sent":
                r._id = int(tid)
                tasks.append(i)
            else:
                states[i] = state
        else:
            tasks.append(i)
    if tasks:
        done_states = _current().cancel([refs[i].id for i in tasks], recursive, force)
        for i, status in zip(tasks, done_states):
            states[i] = status[1]
    return [states[i] for i in range(len(refs))]


# ------------------------------------------------------------------------------------------
# Remote functions


def _pickler():
    try:
        import cloudpickle  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - a dependency of the package
        raise EscherError(
            "escher needs cloudpickle to ship functions: pip install cloudpickle"
        ) from None
    return cloudpickle


def _by_value(fn: Callable) -> None:
    """Functions of the application's own modules travel by value (a worker cannot import
    them); those of installed packages by reference."""
    cloudpickle = _pickler()
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None or module.__name__ == "__main__":
        return
    path = getattr(module, "__file__", None) or ""
    if "site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix):
        return
    top = module.__name__.split(".")[0]
    if top == "escher":
        return
    try:
        cloudpickle.register_pickle_by_value(sys.modules[top])
    except Exception:
        pass


def _dumps(value: Any, what: str) -> bytes:
    cloudpickle = _pickler()
    try:
        return cloudpickle.dumps(value)
    except Exception as e:
        raise InvalidArgumentError(
            f"cannot pickle {what}: {type(e).__name__}: {e}. Pass values cloudpickle can "
            f"serialize (open files, sockets, locks and generators cannot be), or create them "
            f"inside the remote function"
        ) from None


_VERSIONS: Optional[bytes] = None


def _versions() -> bytes:
    """This driver's Python and cloudpickle, as a call's envelope carries them (``len:u8`` then
    ``"3.11.7 3.1.1"``): the worker refuses a call whose versions its interpreter cannot load,
    naming both."""
    global _VERSIONS
    if _VERSIONS is None:
        v = sys.version_info
        text = f"{v[0]}.{v[1]}.{v[2]} {getattr(_pickler(), '__version__', '?')}".encode()
        _VERSIONS = bytes([len(text)]) + text
    return _VERSIONS


class RemoteFunction:
    """A function that runs on the cluster: ``f.remote(*args)`` returns a ``TaskRef``."""

    def __init__(self, fn: Callable, resources: Resources = None, retries: int = 0,
                 timeout: Optional[float] = None, name: Optional[str] = None,
                 spec: Optional[Any] = None, runtime_env: Optional[Dict[str, Any]] = None):
        _check_remotable(fn)
        self._runtime_env = _check_runtime_env(runtime_env)
        self._fn = fn
        self._resources = resources
        self._retries = int(retries)
        self._timeout = timeout
        self._name = name or getattr(fn, "__qualname__", None) or "python"
        self._spec = spec
        # The function's bytes and their hash, for the runtime environment they were made with.
        self._pickled: Optional[Tuple[Any, bytes, bytes]] = None
        # The task that stores the function, per session and hash (shipped once per hash).
        self._stored: Dict[Tuple[int, str, Optional[str], bytes], int] = {}
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = getattr(fn, "__name__", "remote")
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        raise EscherError(
            f"remote function {self._name} cannot be called directly: use "
            f"{self.__name__}.remote(...), which returns a TaskRef"
        )

    def options(self, *, resources: Resources = None, retries: Optional[int] = None,
                timeout: Optional[float] = None, name: Optional[str] = None,
                spec: Optional[Any] = None, runtime_env: Optional[Dict[str, Any]] = None,
                **ray: Any) -> "RemoteFunction":
        """The same function with other options; ``spec`` is what a scheduling library
        (``escher.esl``) asks of the task, added to its resources. Ray's ``num_cpus``,
        ``num_gpus`` and ``max_retries`` are accepted as in ``escher.remote``; a
        ``runtime_env`` replaces the function's."""
        if ray:
            resources, retries = _ray_keywords(ray, resources, retries, "options")
        other = RemoteFunction(
            self._fn,
            resources if resources is not None else self._resources,
            self._retries if retries is None else retries,
            self._timeout if timeout is None else timeout,
            name or self._name,
            spec if spec is not None else self._spec,
            runtime_env if runtime_env is not None else self._runtime_env,
        )
        other._pickled = self._pickled
        other._stored = self._stored
        return other

    def _function_bytes(self) -> Tuple[bytes, bytes]:
        """The function as it travels (wrapped with its runtime environment, if any: its own,
        else the one ``init`` gave), and its SHA-256; made again when that environment
        changed."""
        env = self._env()
        key = repr(env)
        if self._pickled is None or self._pickled[0] != key:
            _by_value(self._fn)
            shipped = self._fn
            if env is not None and ("env_vars" in env or "working_dir" in env):
                shipped = _with_env(self._fn, env, self._name)
            data = _dumps(shipped, f"function {self._name}")
            self._pickled = (key, data, hashlib.sha256(data).digest())
        return self._pickled[1], self._pickled[2]

    def _env(self) -> Optional[Dict[str, Any]]:
        """The runtime environment of the calls: the function's own, else the one ``init``
        gave."""
        return self._runtime_env if self._runtime_env is not None else _session_runtime_env

    def _task_resources(self, extra: Sequence[str]) -> str:
        base = _resources_text(self._resources)
        parts = [base if base is not None else "cpu=1"]
        if _PYTHON_SLOT not in (base or ""):
            parts.append(f"{_PYTHON_SLOT}=1")
        parts.extend(f"{s}=1" for s in extra)
        return ",".join(p for p in parts if p)

    def _store(self, session: _escher.Session, data: bytes, digest: bytes) -> int:
        """The task whose result holds the function: submitted and waited for at the first
        call in this session, then named by every call."""
        key = (_generation, session.head_url, os.environ.get("ESCHER_TASK_TOKEN"), digest)
        stored = self._stored.get(key)
        if stored is None:
            envelope = b"ESPY\x02\x02" + data
            stored = session.submit_python(envelope, f"{_PYTHON_SLOT}=1", 0, None,
                                           f"{self._name} (function)")
            _status_value(session.get(stored, None), "python")
            self._stored[key] = stored
        return stored

    def remote(self, *args, **kwargs) -> TaskRef:
        """Submits one call; returns its ``TaskRef`` at once. A call whose arguments include
        an actor call's ref (or a task that itself waits for one) returns at once too: a
        thread of this process submits it when they are ready (``DeferredTaskRef``)."""
        session = _current()
        from . import _deferred

        if any(_deferred.blocks(a) for a in args) or \
                any(_deferred.blocks(v) for v in kwargs.values()):
            return _deferred.later_task(self, session, args, kwargs)
        call = self._prepare(session, args, kwargs)
        if call[2]:
            # Its argument tasks' signals are raised for its id: wait for it.
            tid = session.submit_python(call[0], call[1], self._retries, self._timeout,
                                        self._name, self._spec, call[5],
                                        [d.id for d in call[3]])
            return self._submitted(session, tid, call)
        # Sent without waiting for the head's answer: a loop of .remote() calls shares
        # requests; the id is known when first needed.
        pending = session.submit_python_nowait(call[0], call[1], self._retries, self._timeout,
                                               self._name, self._spec, call[5])
        return TaskRef(None, (), "python", pending, call[4])

    def map(self, calls: Iterable[Any]) -> List[TaskRef]:
        """Submits many calls in one request (much faster than as many ``remote`` calls): each
        item is the argument of one call, or a tuple of its arguments."""
        session = _current()
        from . import _deferred

        items = [item if isinstance(item, tuple) else (item,) for item in calls]
        if any(_deferred.blocks(a) for args in items for a in args):
            # Some wait for an argument: each call on its own, in order.
            return [self.remote(*args) for args in items]
        prepared = []
        for args in items:
            prepared.append(self._prepare(session, args, {}))
        if not prepared:
            return []
        ids = session.submit_python_batch([c[0] for c in prepared], [c[1] for c in prepared],
                                          self._retries, self._timeout, self._name, self._spec,
                                          [c[5] for c in prepared],
                                          [[d.id for d in c[3]] for c in prepared])
        return [self._submitted(session, tid, call) for tid, call in zip(ids, prepared)]

    def _prepare(self, session: _escher.Session, args: Sequence[Any],
                 kwargs: Dict[str, Any]) -> Tuple[bytes, str, List[Tuple[int, str]],
                                                  List[TaskRef], List[ObjectRef],
                                                  List[Tuple[int, int]]]:
        """One call's envelope (worker/src/python/mod.rs), its resources, the signals of its
        argument tasks and those tasks. Nothing is submitted here but, the first time, a large
        function's store task."""
        data, digest = self._function_bytes()
        deps: List[TaskRef] = []
        spec = []
        # An actor call's ref never comes here: a call given one is deferred (``remote``), and
        # its value is what reaches this (a result kept as an object: its ``ResultRef``).
        for a in args:
            if isinstance(a, TaskRef):
                if a._kind != "python":
                    raise InvalidArgumentError(
                        f"{a!r} is not a remote function's task: only those can be passed as "
                        f"arguments (get its result with escher.get first)"
                    )
                deps.append(a)
                spec.append(("ref", a.id))
            else:
                spec.append(("val", a))
        for k, v in kwargs.items():
            if isinstance(v, TaskRef):
                raise InvalidArgumentError(
                    f"TaskRef argument {k}= must be passed by position to wait for it"
                )
        # ObjectRefs travel as borrowed references (the worker's runner reads those given as
        # arguments themselves); the call keeps the objects they name.
        with collecting() as met:
            payload = _dumps((spec, kwargs), f"the arguments of {self._name}")
        # A large function travels once, in a task of its own, and is fetched by the workers;
        # a small one travels with each call.
        if len(data) > 8 * 1024:
            blob, inline = self._store(session, data, digest), b""
        else:
            blob, inline = 0, data
        # Each argument task raises a signal of this call's own once it has succeeded.
        signals = [(d.id, _new_signal()) for d in deps]
        envelope = b"".join([
            *_head_with_pip((self._env() or {}).get("pip")),
            digest,
            struct.pack("<Q", blob),
            struct.pack("<I", len(inline)),
            inline,
            struct.pack("<I", len(deps)),
            b"".join(struct.pack("<Q", d.id) for d in deps),
            payload,
        ])
        # References given as arguments themselves are named to the head (the task's
        # escher.objects label): the task is placed where a copy is when that node has room,
        # and its worker maps the object from its store rather than the task fetching it.
        direct = [a.id for a in args if isinstance(a, ObjectRef)]
        direct += [v.id for v in kwargs.values() if isinstance(v, ObjectRef)]
        return (envelope, self._task_resources([sig for _, sig in signals]), signals, deps,
                met, list(dict.fromkeys(direct)))

    def _submitted(self, session: _escher.Session, tid: int,
                   call: Tuple[bytes, str, List[Tuple[int, str]], List[TaskRef],
                               List[ObjectRef], List[Tuple[int, int]]]) -> TaskRef:
        for dep, signal in call[2]:
            session.raise_after(dep, signal, [tid])
        return TaskRef(tid, call[3], keep=call[4])


def _head_with_pip(pip: Optional[List[str]]) -> List[bytes]:
    """The start of a call's envelope: format 2, or format 3 with runtime_env's pip
    requirements (one a line, sorted), which the worker installs in an environment of their
    own (worker/src/python/pip_env.rs)."""
    if not pip:
        return [b"ESPY\x02\x01", _versions()]
    text = "\n".join(pip).encode()
    return [b"ESPY\x03\x01", _versions(), struct.pack("<I", len(text)), text]


def _new_signal() -> str:
    return f"{_signal_prefix}-{next(_signal_seq)}"


def remote(*args, resources: Resources = None, retries: int = 0,
           timeout: Optional[float] = None, name: Optional[str] = None,
           spec: Optional[Any] = None, runtime_env: Optional[Dict[str, Any]] = None,
           **ray: Any):
    """Makes a function remote: ``@escher.remote`` or ``@escher.remote(resources={"cpu": 2},
    retries=3, timeout=60)``. Its calls request ``cpu=1`` unless ``resources`` say otherwise,
    and one Python slot. Ray's ``num_cpus=N``, ``num_gpus=N`` and ``max_retries=N`` mean the
    same here (``cpu=N``, ``gpu=N`` and ``retries=N``); Ray's keywords that escher spells
    differently are refused with escher's spelling. An ``async def`` function is awaited on
    the worker. ``runtime_env`` (``{"env_vars": {...}, "working_dir": "path", "pip":
    ["requests==2.32.3"]}``: the workers install the requirements once per set, in a virtual
    environment the calls run in) is what its calls run with, instead of the one ``init``
    gave.

    On a class, makes an actor class (``escher.ActorClass``; docs/python.md, "Actors"):
    ``@escher.remote(resources=..., num_cpus=..., max_restarts=..., max_task_retries=...,
    max_concurrency=..., spec=..., runtime_env={"pip": [...]})``. An actor holds its resources (and one Python slot) from
    start to exit; with none given it holds only the Python slot."""
    actor = {k: ray.pop(k) for k in list(ray) if k in _ACTOR_OPTIONS}
    if len(args) == 1 and isinstance(args[0], type):
        return _actor_class(args[0], resources, retries, timeout, name, spec, runtime_env,
                            actor, ray)
    if len(args) == 1 and callable(args[0]) and resources is None and not retries \
            and timeout is None and name is None and spec is None and runtime_env is None \
            and not ray and not actor:
        return RemoteFunction(args[0])
    if args:
        raise InvalidArgumentError(
            "use @escher.remote or @escher.remote(resources=..., retries=..., timeout=...)"
        )

    def wrap(fn: Callable) -> Any:
        if isinstance(fn, type):
            return _actor_class(fn, resources, retries, timeout, name, spec, runtime_env,
                                actor, dict(ray))
        if actor:
            raise InvalidArgumentError(
                f"{', '.join(sorted(actor))} apply to actors (@escher.remote on a class), not "
                f"to the function {getattr(fn, '__qualname__', fn)}"
            )
        folded_resources, folded = resources, retries
        if ray:
            folded_resources, again = _ray_keywords(dict(ray), resources, retries, "remote")
            folded = again or 0
        return RemoteFunction(fn, folded_resources, folded, timeout, name, spec, runtime_env)

    if not actor:
        # Checked at decoration, as before: a bad keyword fails where it is written.
        if ray:
            _ray_keywords(dict(ray), resources, retries, "remote")
        _check_runtime_env(runtime_env)
    return wrap


# The options of an actor (@escher.remote on a class).
_ACTOR_OPTIONS = ("max_restarts", "max_task_retries", "max_concurrency")


def _actor_class(cls: type, resources: Resources, retries: int, timeout: Optional[float],
                 name: Optional[str], spec: Optional[Any], runtime_env: Optional[Dict[str, Any]],
                 actor: Dict[str, Any], ray: Dict[str, Any]) -> Any:
    """``@escher.remote`` on a class: its actor class, or why these options are not an
    actor's."""
    from . import _actors

    if retries or timeout is not None or name is not None:
        raise InvalidArgumentError(
            f"actor class {cls.__qualname__}: an actor takes resources=, num_cpus=, num_gpus=, "
            f"max_restarts=, max_task_retries=, max_concurrency=, spec= and runtime_env= (a "
            f"name through .options(name=...)); retries=, timeout= and name= are a remote "
            f"function's"
        )
    if ray:
        resources = _actors._actor_ray_keywords(ray, resources, "remote")
    return _actors.ActorClass(cls, resources, spec=spec, runtime_env=runtime_env, **actor)


# Ray's keywords that escher spells differently, and how it spells them.
_RAY_ELSEWHERE = {
    "num_returns": "an escher task has one result: return a tuple and index it after get",
    "scheduling_strategy": "reserve resources with escher.reserve(...) and request "
                           "reservation.resource('cpu'), or use a scheduling library "
                           "(spec=escher.esl...)",
    "placement_group": "use escher.reserve(...) and request reservation.resource('cpu')",
    "retry_exceptions": "retries=N retries a task whatever made it fail",
    "max_calls": "escher keeps its interpreters warm; a function that leaks should clean up",
    "accelerator_type": "request the device's own resource (a MIG slice's name, say) in "
                        "resources=",
}


def _ray_keywords(ray: Dict[str, Any], resources: Resources, retries: Optional[int],
                  where: str) -> Tuple[Resources, Optional[int]]:
    """Ray's ``num_cpus``, ``num_gpus``, ``max_retries`` (and ``memory``, refused: Ray counts
    bytes, escher MiB) folded into escher's ``resources`` and ``retries``."""
    text = _resources_text(resources)
    parts = [p for p in (text or "").split(",") if p.strip()] if text is not None else None
    named = {p.split("=", 1)[0].strip() for p in parts or []}
    for key, value in ray.items():
        if key in ("num_cpus", "num_gpus"):
            resource = "cpu" if key == "num_cpus" else "gpu"
            if resource in named:
                raise InvalidArgumentError(
                    f"{key}={value!r} and resources={text!r} both ask for {resource}: give it "
                    f"once (escher spells it resources={{'{resource}': {value!r}}})"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"{key} is a number of {resource}s, not {value!r}")
            if parts is None:
                # Ray's num_gpus alone still takes one cpu, as escher's default does.
                parts = ["cpu=1"] if resource == "gpu" and "num_cpus" not in ray else []
                named = {p.split("=", 1)[0] for p in parts}
            if value:
                parts.append(f"{resource}={value:g}")
                named.add(resource)
        elif key == "max_retries":
            if retries:
                raise InvalidArgumentError(
                    f"max_retries={value!r} and retries={retries!r} say the same thing: give "
                    f"escher's retries= only"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"max_retries is how many times a failed task runs again (0 or more; "
                    f"escher has no unlimited retries, Ray's -1), not {value!r}: write "
                    f"retries=N"
                )
            retries = value
        elif key == "memory":
            mib = -(-int(value) // (1024 * 1024)) if isinstance(value, (int, float)) else "MIB"
            raise InvalidArgumentError(
                f"memory= is Ray's, in bytes; escher's memory is a resource counted in MiB: "
                f"write resources={{'memory': {mib}}}"
            )
        elif key in _RAY_ELSEWHERE:
            raise InvalidArgumentError(
                f"escher.{where}() has no {key}= (a Ray keyword): {_RAY_ELSEWHERE[key]}"
            )
        else:
            raise TypeError(
                f"escher.{where}() got an unexpected keyword argument {key!r} (escher's are "
                f"resources=, retries=, timeout=, name=, spec=; Ray's num_cpus=, num_gpus=, "
                f"max_retries= are accepted too)"
            )
    return (",".join(parts) if parts is not None else resources), retries


def _check_runtime_env(env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """``env`` checked (``env_vars``: names to texts; ``working_dir``: a directory here;
    ``pip``: requirements), as a plain dict; what escher does not do yet (``conda``,
    ``py_modules``, ...) is refused saying what to do instead."""
    if env is None:
        return None
    if not isinstance(env, dict):
        raise InvalidArgumentError(
            f"runtime_env is a dict such as {{'env_vars': {{'K': 'v'}}, 'working_dir': '.'}}, "
            f"not {env!r}"
        )
    out: Dict[str, Any] = {}
    for key, value in env.items():
        if key == "env_vars":
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise InvalidArgumentError(
                    f"runtime_env's env_vars maps names to texts, such as {{'OMP_NUM_THREADS': "
                    f"'1'}}, not {value!r}"
                )
            for name in value:
                if not name or "=" in name or "\0" in name or name.startswith("ESCHER_"):
                    raise InvalidArgumentError(
                        f"runtime_env's env_vars cannot set {name!r}: names are non-empty, "
                        f"without '=', and ESCHER_* are the task's own"
                    )
            out["env_vars"] = dict(value)
        elif key == "working_dir":
            if not isinstance(value, (str, os.PathLike)) or not os.path.isdir(value):
                raise InvalidArgumentError(
                    f"runtime_env's working_dir is a directory on this machine, and {value!r} "
                    f"is not one"
                )
            out["working_dir"] = os.path.abspath(value)
        elif key == "pip":
            out["pip"] = _check_pip(value)
        elif key in ("conda", "uv", "py_modules", "container", "image_uri"):
            raise InvalidArgumentError(
                f"runtime_env's {key} is not supported yet: install what the function needs "
                f"on the workers (in the interpreter their escher.python label names), or ship "
                f"your own modules in working_dir"
            )
        else:
            raise InvalidArgumentError(
                f"runtime_env has no {key!r}; it takes env_vars, working_dir and pip"
            )
    return out


# The most requirements one runtime_env may name (the worker's limit too).
_MAX_PIP = 256


def _check_pip(value: Any) -> List[str]:
    """runtime_env's ``pip`` as Ray writes it (a list of requirements, ``{"packages": [...]}``,
    or the path of a requirements file here), as the sorted set of requirements the worker
    installs; pip's options are refused (where pip finds packages is the workers' pip
    configuration)."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"packages"})
        if unknown:
            raise InvalidArgumentError(
                f"runtime_env's pip takes {{'packages': [...]}} only, not {unknown}: the "
                f"workers' pip configuration says where and how pip installs"
            )
        value = value.get("packages", [])
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value) as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except OSError as e:
            raise InvalidArgumentError(
                f"runtime_env's pip is a list of requirements or the path of a requirements "
                f"file, and {value!r} cannot be read: {e}"
            ) from None
        value = [line for line in lines if line]
    if not isinstance(value, (list, tuple)) or not all(isinstance(r, str) for r in value):
        raise InvalidArgumentError(
            f"runtime_env's pip is a list of requirements such as ['requests==2.32.3'], not "
            f"{value!r}"
        )
    out = sorted({r.strip() for r in value})
    if len(out) > _MAX_PIP:
        raise InvalidArgumentError(
            f"runtime_env's pip names {len(out)} requirements; at most {_MAX_PIP} are allowed"
        )
    for r in out:
        if not r or any(c in r for c in "\r\n\0") or len(r) > 1024:
            raise InvalidArgumentError(
                f"runtime_env's pip requirement {r!r} is not one requirement on one line"
            )
        if r.startswith("-"):
            raise InvalidArgumentError(
                f"runtime_env's pip requirement {r!r} is an option of pip: name packages only; "
                f"where pip finds them (an index, --find-links) is the workers' pip "
                f"configuration (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS)"
            )
    return out


def _with_env(fn: Callable, env: Dict[str, Any], name: str) -> Any:
    """``fn`` wrapped with what its calls run with (``_runtime_env.py``), that module pickled
    by value so that a worker needs only cloudpickle."""
    from . import _runtime_env

    archive, digest = None, None
    if "working_dir" in env:
        try:
            archive, digest = _runtime_env.pack(env["working_dir"])
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(f"cannot ship the working_dir of {name}: {e}") from None
    _pickler().register_pickle_by_value(_runtime_env)
    return _runtime_env._WithEnv(fn, env.get("env_vars", {}), archive, digest)


def _check_remotable(fn: Any) -> None:
    """Refuses at decoration what cannot run as a remote function, saying why."""
    import inspect

    if isinstance(fn, type):
        raise TypeError(
            f"escher.remote was given the class {fn.__qualname__} as a function: a class is an "
            f"actor (escher.remote(cls) returns an ActorClass), never a task"
        )
    if not callable(fn):
        raise InvalidArgumentError(f"escher.remote needs a function, not {fn!r}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "a generator"
        raise TypeError(
            f"escher.remote was given {kind} function, {getattr(fn, '__qualname__', fn)}: a "
            f"remote function returns one value, and a generator cannot be sent back; return a "
            f"list instead"
        )


# ------------------------------------------------------------------------------------------
# Command tasks, reservations, logs, telemetry, events, tokens


def submit(argv: Sequence[str], *, resources: Resources = None, env: Optional[Dict[str, str]] = None,
           cwd: Optional[str] = None, retries: int = 0, timeout: Optional[float] = None,
           name: Optional[str] = None, spec: Optional[Any] = None) -> TaskRef:
    """Submits a command task (a child process on a worker); ``get`` returns its exit code
    when it succeeded (exit code 0), and raises ``TaskError`` otherwise."""
    if isinstance(argv, str):
        raise InvalidArgumentError(
            f"argv is a list of strings such as ['echo', 'hello'], not the string {argv!r}"
        )
    session = _current()
    text = _resources_text(resources)
    if text is None and spec is not None:
        text = "cpu=1"  # the default, which a spec's requirements add to
    tid = session.submit_command([str(a) for a in argv], sorted((env or {}).items()), cwd,
                                 text, retries, timeout, name, spec)
    return TaskRef(tid, (), "command")


def logs(ref: TaskRef, stream: str = "stdout", *, follow: bool = False):
    """What a command task wrote to ``stream`` (``stdout`` or ``stderr``) so far; with
    ``follow=True``, an iterator of what it writes, piece by piece, as it runs, that ends once
    the task has finished (``escher logs -f``)."""
    task = _ids([ref])[0]
    if follow:
        session = _current()
        return _follow(session, task, session.follow_logs(task, stream))
    return _current().logs(task, stream).decode("utf-8", errors="replace")


def _follow(session: _escher.Session, task: int, tail: Any):
    import codecs
    import time

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    unready_until = time.time() + 30
    while True:
        try:
            chunk = tail.next_chunk()
        except InvalidArgumentError:
            # Not started yet, or started a moment ago and its log not created yet: wait for
            # it (for a pending task, as long as it waits).
            state = session.task_info(task)[0]
            if state == "pending" or (state == "running" and time.time() < unready_until):
                time.sleep(0.1)
                continue
            raise
        if chunk is None:
            rest = decoder.decode(b"", final=True)
            if rest:
                yield rest
            return
        if chunk:
            text = decoder.decode(chunk)
            if text:
                yield text
        else:
            time.sleep(0.1)


def put(value: Any) -> ObjectRef:
    """Stores ``value`` as an object in a worker's store and returns its ``ObjectRef``: read
    it with ``escher.get(ref)``, or pass the ref to remote functions and actor methods (each
    receives the value, fetched by its worker; put once, passed to many). Pickled with
    protocol 5: NumPy arrays, ``bytes``, ``bytearray`` and ``memoryview`` values travel beside
    the pickle, not in it. The object lives while a reference to it does in this process (and
    while a task that was given it, through its ``TaskRef``, does). A value larger than the
    store (``--object-store-memory``) is refused, naming the object."""
    return put_object(_current(), value)


def report(**samples: float) -> int:
    """Inside a task: reports samples of its progress (``escher.report(loss=0.3, step=40)``);
    whoever may see the task reads them with ``escher.telemetry``."""
    session = _in_task_session()
    if session is None:
        raise EscherError(
            "escher.report() reports as the running task, so it works only inside a task (no "
            "ESCHER_TASK_TOKEN is set here)"
        )
    return session.report([(k, float(v)) for k, v in samples.items()])


def telemetry(refs: Union[TaskRef, Sequence[TaskRef]], after_ms: Optional[int] = None) -> Dict[int, List[Dict[str, Any]]]:
    """The samples tasks reported, oldest first: ``{task_id: [{"key": ..., "value": ...,
    ...}, ...]}``."""
    import json

    if isinstance(refs, TaskRef):
        refs = [refs]
    found = json.loads(_current().telemetry(_ids(refs), after_ms))
    out: Dict[int, List[Dict[str, Any]]] = {}
    for entry in found:
        task = entry.get("task")
        out[int(task if not isinstance(task, dict) else list(task.values())[0])] = entry.get("samples", [])
    return out


class Reservation:
    """Bundles of resources held all or nothing (the placement-group analogue); tasks run
    inside with the reservation's resources (``NAME.cpu``, or ``NAME-I.cpu`` for bundle I)."""

    def __init__(self, name: str, holders: List[int], resources: List[str]):
        self.name = name
        self.holders = holders
        self.resources = resources

    def bundle_resource(self, index: int, resource: str) -> str:
        """The resource a task requests to run in bundle ``index``: ``NAME-I.resource``."""
        return f"{self.name}-{index}.{resource}"

    def resource(self, resource: str) -> str:
        """The resource a task requests to run in any bundle: ``NAME.resource``."""
        return f"{self.name}.{resource}"

    def release(self) -> None:
        """Frees the bundles (tasks running inside keep what they hold until they end)."""
        _current().cancel(self.holders)

    def __repr__(self) -> str:
        return f"Reservation({self.name!r}, holders={self.holders!r})"


def reserve(name: str, bundles: Sequence[Resources], *, strategy: str = "pack",
            timeout: Optional[float] = None) -> Reservation:
    """Reserves ``bundles`` all or nothing (``strategy``: ``pack``, ``spread``,
    ``strict-pack``, ``strict-spread``) and waits until every bundle is held."""
    texts = [_resources_text(b) or "" for b in bundles]
    holders, resources = _current().reserve(name, texts, strategy.replace("_", "-"), timeout)
    return Reservation(name, holders, resources)


class Events:
    """Task events as they happen: an iterator (``for event in escher.watch(): ...``) and an
    async iterator (``async for event in escher.watch(): ...``). Each event is a dict."""

    def __init__(self, stream: _escher.EventStream, timeout: Optional[float]):
        self._stream = stream
        self._timeout = timeout

    def next(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next event, or ``None`` after ``timeout`` seconds without one."""
        import json

        text = self._stream.next_event(timeout)
        return None if text is None else json.loads(text)

    def __iter__(self):
        return self

    def __next__(self) -> Dict[str, Any]:
        event = self.next(self._timeout)
        if event is None:
            raise StopIteration
        return event

    def __aiter__(self):
        return self

    async def __anext__(self) -> Dict[str, Any]:
        loop = asyncio.get_running_loop()
        event = await loop.run_in_executor(None, lambda: self.next(self._timeout))
        if event is None:
            raise StopAsyncIteration
        return event


def watch(refs: Optional[Sequence[TaskRef]] = None, *, timeout: Optional[float] = None) -> Events:
    """Watches the events of ``refs`` (or of every task this session may see). Iteration
    ends after ``timeout`` seconds without an event (``None``: never)."""
    return Events(_current().watch(_ids(refs or [])), timeout)


def create_token(role: str, namespace: Optional[str] = None, description: str = "") -> str:
    """Creates a token (``role``: ``admin``, ``app``, ``reader``, ``worker``; an ``app`` token
    is bound to ``namespace``); needs an admin session. The token is shown this once."""
    return _current().create_token(role, namespace, description)
