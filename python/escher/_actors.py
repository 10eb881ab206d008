"""Actors: ``@escher.remote`` on a class, ``ActorHandle``, ``ActorCallRef``, ``get_actor`` and
``kill``.

An actor is a task of its own kind (docs/python.md, "Actors"): ``Cls.remote(...)`` creates it
through the Rust client (``Client::actor``), a worker with Python starts an interpreter of the
actor's own that constructs the object, and ``handle.method.remote(...)`` sends a call straight
to that worker (``ActorHandle::call_raw``), which relays it to the interpreter
(worker/src/python/actor.rs). This file gives the native handle its Python shape.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _api, _deferred, _escher
from ._api import EscherError, InvalidArgumentError, Resources, TaskRef
from ._objects import ResultRef, collecting, get_object

ActorDiedError = _escher.ActorDiedError

# The most calls an actor runs at once (proto/src/types/actor.rs), and the default of a class
# with async def methods (Ray's): its coroutines share one event loop.
_MAX_CONCURRENCY = 1024
_ASYNC_CONCURRENCY = 1000
# The store tasks that hold large classes, by session and content hash.
_STORED: Dict[Any, int] = {}
# Guards the making of a handle's sequencer.
_SEQ_LOCK = threading.Lock()


def _methods(cls: type) -> List[str]:
    """The methods a handle may call: the class's callables, but for dunder methods."""
    return sorted(name for name, member in inspect.getmembers(cls)
                  if callable(member) and not (name.startswith("__") and name.endswith("__")))


def _is_async(cls: type) -> bool:
    return any(inspect.iscoroutinefunction(m) for _, m in inspect.getmembers(cls))


def _count(value: Any, what: str, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or \
            (high is not None and value > high):
        bounds = f"{low} to {high}" if high is not None else f"{low} or more"
        raise InvalidArgumentError(f"{what} is a whole number, {bounds}, not {value!r}")
    return value


def _has_refs(args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """Whether an actor's arguments include refs (a task's, or an actor call's), which the
    handle's sequencer replaces by their values once ready: an actor gets values, never
    refs."""
    return any(isinstance(v, TaskRef) for v in args) or \
        any(isinstance(v, TaskRef) for v in kwargs.values())


class ActorClass:
    """A class made remote with ``@escher.remote``: ``Cls.remote(*args)`` creates an actor and
    returns its ``ActorHandle``; ``Cls.options(...)`` gives the same class with other options."""

    def __init__(self, cls: type, resources: Resources = None, max_restarts: int = 0,
                 max_task_retries: int = 0, max_concurrency: Optional[int] = None,
                 name: Optional[str] = None, namespace: Optional[str] = None,
                 lifetime: Optional[str] = None, spec: Optional[Any] = None,
                 runtime_env: Optional[Dict[str, Any]] = None):
        self._cls = cls
        self._runtime_env = _api._check_runtime_env(runtime_env)
        # The class as it travels, for the runtime environment it was made with.
        self._shipped: Optional[tuple] = None
        self._resources = resources
        self._max_restarts = _count(max_restarts, "max_restarts", 0)
        self._max_task_retries = _count(max_task_retries, "max_task_retries", 0)
        if max_concurrency is None:
            max_concurrency = _ASYNC_CONCURRENCY if _is_async(cls) else 1
        self._max_concurrency = _count(max_concurrency, "max_concurrency", 1, _MAX_CONCURRENCY)
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentError(f"an actor's name is a non-empty text, not {name!r}")
        self._name = name
        self._namespace = namespace
        if lifetime not in (None, "owned", "detached"):
            raise InvalidArgumentError(
                f"an actor's lifetime is 'detached' (it lives until escher.kill) or None (it "
                f"ends with its creator's last handle), not {lifetime!r}"
            )
        self._lifetime = lifetime
        self._spec = spec
        self._methods = _methods(cls)
        self.__doc__ = cls.__doc__
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__wrapped__ = cls

    def __call__(self, *args, **kwargs):
        raise EscherError(
            f"actor class {self._cls.__qualname__} cannot be instantiated directly: use "
            f"{self._cls.__name__}.remote(...), which creates the actor and returns its handle"
        )

    def options(self, *, name: Optional[str] = None, namespace: Optional[str] = None,
                lifetime: Optional[str] = None, resources: Resources = None,
                max_concurrency: Optional[int] = None, max_restarts: Optional[int] = None,
                max_task_retries: Optional[int] = None, spec: Optional[Any] = None,
                runtime_env: Optional[Dict[str, Any]] = None, **ray: Any) -> "ActorClass":
        """The same class with other options: ``name`` (found with ``escher.get_actor``,
        unique among the live actors of its namespace), ``namespace``, ``lifetime="detached"``
        (lives until ``escher.kill``), ``resources`` (held from start to exit; Ray's
        ``num_cpus`` and ``num_gpus`` too), ``max_concurrency``, ``max_restarts``,
        ``max_task_retries``, ``spec`` (a scheduling library's) and ``runtime_env`` (its
        ``pip`` requirements)."""
        if ray:
            resources = _actor_ray_keywords(ray, resources, "options")
        return ActorClass(
            self._cls,
            resources if resources is not None else self._resources,
            self._max_restarts if max_restarts is None else max_restarts,
            self._max_task_retries if max_task_retries is None else max_task_retries,
            self._max_concurrency if max_concurrency is None else max_concurrency,
            name if name is not None else self._name,
            namespace if namespace is not None else self._namespace,
            lifetime if lifetime is not None else self._lifetime,
            spec if spec is not None else self._spec,
            runtime_env if runtime_env is not None else self._runtime_env,
        )

    def _store(self, session: Any, data: bytes, digest: bytes) -> int:
        """The task whose result holds the class: submitted and waited for at the first
        creation in this session, then named by every creation."""
        import os

        key = (_api._generation, session.head_url, os.environ.get("ESCHER_TASK_TOKEN"), digest)
        stored = _STORED.get(key)
        if stored is None:
            stored = session.submit_python(b"ESPY\x02\x02" + data, f"{_api._PYTHON_SLOT}=1", 0,
                                           None, f"{self._cls.__qualname__} (actor class)")
            _api._status_value(session.get(stored, None), "python")
            _STORED[key] = stored
        return stored

    def _class_bytes(self, env: Optional[Dict[str, Any]]) -> bytes:
        """The class as it travels: pickled, wrapped with ``env``'s variables and working
        directory when it has them; made again only when ``env`` changed."""
        key = repr(env)
        if self._shipped is None or self._shipped[0] != key:
            _api._by_value(self._cls)
            data = _api._dumps(self._cls, f"actor class {self._cls.__qualname__}")
            if env is not None and ("env_vars" in env or "working_dir" in env):
                data = _api._dumps(_with_env(self._cls, data, env),
                                   f"actor class {self._cls.__qualname__} with its runtime_env")
            self._shipped = (key, data)
        return self._shipped[1]

    def _actor_resources(self) -> str:
        base = _api._resources_text(self._resources) or ""
        parts = [p for p in base.split(",") if p.strip()]
        if _api._PYTHON_SLOT not in base:
            parts.append(f"{_api._PYTHON_SLOT}=1")
        return ",".join(parts)

    def remote(self, *args, **kwargs) -> "ActorHandle":
        """Creates the actor (durably: a worker constructs it as soon as one has room) and
        returns its handle at once; calls wait for the constructor."""
        session = _api._current()
        # Its own runtime_env, else the one init gave. Variables and a working directory
        # travel with the class, which the actor's interpreter loads once they are set.
        env = self._runtime_env if self._runtime_env is not None else _api._session_runtime_env
        data = self._class_bytes(env)
        if _has_refs(args, kwargs):
            return self._later(session, data, env, args, kwargs)
        # ObjectRefs travel borrowed (the actor's interpreter reads those given as arguments);
        # the handle keeps the objects, which a restart constructs the actor from again.
        with collecting() as met:
            payload = _api._dumps((list(args), dict(kwargs)),
                                  f"the constructor's arguments of {self._cls.__qualname__}")
        native = self._create(session, data, env, payload)
        handle = ActorHandle(native, self._cls.__qualname__, self._methods)
        handle._keep = met
        return handle

    def _later(self, session: Any, data: bytes, env: Optional[Dict[str, Any]],
               args: Sequence[Any], kwargs: Dict[str, Any]) -> "ActorHandle":
        """The handle of an actor whose constructor's arguments include refs: returned at once;
        its sequencer creates the actor once they are ready (their values its arguments), and
        its calls wait behind the creation. An argument that fails fails the creation, and
        every call, with that failure."""
        from . import _deferred

        later = _deferred._Later(f"actor {self._cls.__qualname__}")
        handle = ActorHandle(_deferred.LaterActor(later), self._cls.__qualname__, self._methods)
        what = f"the constructor's arguments of {self._cls.__qualname__}"

        def prepare() -> Any:
            values = _deferred.resolved(list(args), later)
            named = dict(zip(kwargs, _deferred.resolved(list(kwargs.values()), later)))
            with collecting() as met:
                payload = _api._dumps((values, named), what)
            handle._keep = met
            # A large class's store task is made here, not while the sequencer sends.
            return payload, self._blob(session, data)

        handle._sequencer().add(_deferred._Entry(
            later, prepare, lambda ready: self._create(session, data, env, *ready)))
        return handle

    def _blob(self, session: Any, data: bytes) -> Tuple[int, bytes]:
        """How the class travels: a large one once per session, in a store task the workers
        fetch and keep by hash (as a large function does); a small one with each creation."""
        if len(data) > 8 * 1024:
            return self._store(session, data, hashlib.sha256(data).digest()), b""
        return 0, data

    def _create(self, session: Any, data: bytes, env: Optional[Dict[str, Any]],
                payload: bytes, blob_inline: Optional[Tuple[int, bytes]] = None) -> Any:
        """Creates the actor (its native handle) from the class's bytes, its runtime
        environment and its constructor's pickled arguments."""
        digest = hashlib.sha256(data).digest()
        blob, inline = blob_inline if blob_inline is not None else self._blob(session, data)
        pip = (env or {}).get("pip")
        head = [b"ESPY\x02\x03", _api._versions()]
        if pip:
            text = "\n".join(pip).encode()
            head = [b"ESPY\x03\x03", _api._versions(), struct.pack("<I", len(text)), text]
        envelope = b"".join([
            *head,
            digest,
            struct.pack("<Q", blob),
            struct.pack("<I", len(inline)),
            inline,
            payload,
        ])
        return session.create_actor(
            envelope, self._actor_resources(), self._max_restarts, self._max_task_retries,
            self._max_concurrency, self._name, self._lifetime == "detached", self._namespace,
            self._spec)


def _with_env(cls: type, data: bytes, env: Dict[str, Any]) -> Any:
    """The class's bytes wrapped with the variables and the working directory its actor lives
    with (``_runtime_env.py``, pickled by value: a worker needs only cloudpickle)."""
    from . import _runtime_env

    archive, digest = None, None
    if "working_dir" in env:
        try:
            archive, digest = _runtime_env.pack(env["working_dir"])
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(
                f"cannot ship the working_dir of actor class {cls.__qualname__}: {e}") from None
    _api._pickler().register_pickle_by_value(_runtime_env)
    return _runtime_env._ActorWithEnv(data, env.get("env_vars", {}), archive, digest)


def _actor_ray_keywords(ray: Dict[str, Any], resources: Resources, where: str) -> Resources:
    if "max_retries" in ray:
        raise InvalidArgumentError(
            "an actor is restarted, not retried: write max_restarts=N (and max_task_retries=N "
            "for the calls in flight when it died)"
        )
    resources, _ = _api._ray_keywords(ray, resources, None, where)
    return resources


class ActorHandle:
    """A handle to an actor: ``handle.method.remote(*args)`` returns an ``ActorCallRef``.
    Calls made through one handle start in the order they were made. A handle can be passed
    to remote functions and other actors (it travels as the actor's id); the handle that
    created an actor without a name's lifetime ends it when it is garbage-collected. A call
    whose arguments include refs is sent once they are ready, and the calls made after it
    through the same handle wait behind it: the order holds."""

    def __init__(self, native: Any, class_name: Optional[str], methods: Optional[List[str]]):
        self._native = native
        self._class_name = class_name
        self._methods = methods
        # The objects its constructor's arguments name (kept while the handle lives).
        self._keep: Sequence[Any] = ()
        # Sends its calls in order when some wait for their arguments (made at the first).
        self._seq: Any = None

    def _sequencer(self) -> Any:
        if self._seq is None:
            from . import _deferred

            with _SEQ_LOCK:
                if self._seq is None:
                    self._seq = _deferred.Sequencer()
        return self._seq

    @property
    def actor_id(self) -> int:
        """The actor's id (its task's id: ``escher info``, ``escher logs`` take it)."""
        return self._native.id

    def __getattr__(self, name: str) -> "ActorMethod":
        if name.startswith("__") or name in ("_native", "_class_name", "_methods", "_keep",
                                             "_seq"):
            raise AttributeError(name)
        if self._methods is not None and name not in self._methods:
            raise AttributeError(
                f"actor class {self._class_name} has no method {name!r}; its methods: "
                f"{', '.join(self._methods) or 'none'}"
            )
        return ActorMethod(self, name)

    def __reduce__(self):
        return (_handle_from_id, (self._native.id, self._class_name, self._methods))

    def __repr__(self) -> str:
        return f"ActorHandle({self._class_name or 'actor'}, id={self._native_id()})"

    def _native_id(self) -> str:
        """The actor's id as text, without waiting: ``not created yet`` while its creation
        waits for its constructor's arguments."""
        later = getattr(self._native, "_later", None)
        if later is not None and later.state != "sent":
            return "not created yet"
        return str(self._native.id)


def _handle_from_id(actor_id: int, class_name: Optional[str],
                    methods: Optional[List[str]]) -> ActorHandle:
    """A handle unpickled (in a task, another actor, another driver): the actor by its id, in
    the session of whoever unpickles it (a task's own credential, in a task)."""
    return ActorHandle(_api._current().actor_by_id(actor_id), class_name, methods)


# Ray's options of an actor method that escher spells differently, and how it spells them.
_METHOD_ELSEWHERE = {
    "max_task_retries": "set it on the actor (Cls.options(max_task_retries=N)): it applies to "
                        "every call in flight when the actor dies",
    "retry_exceptions": "an actor's calls are retried only when the actor dies "
                        "(max_task_retries=N on the actor); catch the exception in the method",
    "concurrency_group": "escher has no concurrency groups: max_concurrency=N on the actor "
                         "says how many calls run at once",
    "scheduling_strategy": "a call runs on its actor's node: place the actor with "
                           "Cls.options(spec=...)",
    "num_cpus": "a call runs on what its actor holds: give the actor resources= "
                "(Cls.options(resources=...))",
    "num_gpus": "a call runs on what its actor holds: give the actor resources= "
                "(Cls.options(resources=...))",
    "resources": "a call runs on what its actor holds: give the actor resources= "
                 "(Cls.options(resources=...))",
    "runtime_env": "a call runs in its actor's interpreter",
}


class ActorMethod:
    """One method of an actor: ``.remote(*args, **kwargs)`` calls it; ``.options(...)`` gives
    it with Ray's method options that mean something in escher (``num_returns``, ``name``)."""

    def __init__(self, handle: ActorHandle, name: str, num_returns: int = 1,
                 label: Optional[str] = None):
        self._handle = handle
        self._name = name
        self._num_returns = num_returns
        self._label = label

    def options(self, *, num_returns: Optional[int] = None, name: Optional[str] = None,
                **ray: Any) -> "ActorMethod":
        """The method with other options, as Ray's ``actor.method.options(...)``:
        ``num_returns=N`` (the method returns a sequence of N values; ``.remote()`` then
        returns N refs, one per value) and ``name`` (the call's name in its refs' ``repr``
        and in the errors of its calls). What a call cannot choose apart from its actor is
        refused with what escher does instead."""
        for key in ray:
            if key in _METHOD_ELSEWHERE:
                raise InvalidArgumentError(
                    f"an actor method's options have no {key}= (a Ray option): "
                    f"{_METHOD_ELSEWHERE[key]}"
                )
            raise TypeError(
                f"{self._name}.options() got an unexpected keyword argument {key!r} (escher's "
                f"are num_returns= and name=)"
            )
        if num_returns is not None:
            if num_returns == "streaming" or num_returns == "dynamic":
                raise InvalidArgumentError(
                    f"num_returns={num_returns!r} (Ray's generators) is not supported: return "
                    f"a list, or call the method once per item"
                )
            _count(num_returns, "num_returns", 1, 1024)
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentError(f"a call's name is a non-empty text, not {name!r}")
        return ActorMethod(self._handle, self._name,
                           self._num_returns if num_returns is None else num_returns,
                           self._label if name is None else name)

    def __call__(self, *args, **kwargs):
        raise EscherError(
            f"actor method {self._name} cannot be called directly: use "
            f"{self._name}.remote(...), which returns an ActorCallRef"
        )

    def remote(self, *args, **kwargs) -> Any:
        """Sends the call; returns its ref at once (``escher.get`` waits for its value), or,
        with ``num_returns=N`` of ``options``, a list of N refs, one per returned value."""
        handle = self._handle
        what = f"{handle._class_name or 'actor'}.{self._name}"
        deferred = _has_refs(args, kwargs)
        met: List[Any] = []
        call: Any = None
        enqueue: Callable[[], None] = lambda: None
        if not deferred:
            with collecting() as met:
                payload = _api._dumps((list(args), dict(kwargs)), f"the arguments of {what}")
            seq = handle._seq
            if seq is None:
                call = handle._native.call(self._name, payload)
            else:
                sent, call = seq.now(lambda: handle._native.call(self._name, payload))
                if not sent:
                    call, enqueue = self._queue(handle, what, lambda: payload)
        else:
            call, enqueue = self._queue(handle, what, None, args, kwargs)
        if self._num_returns == 1:
            refs = [ActorCallRef(call, handle, self._name, self._label)]
        else:
            shared = _SharedCall(call)
            refs = [ActorCallRef(shared, handle, self._name, self._label, (i, self._num_returns))
                    for i in range(self._num_returns)]
        for ref in refs:
            # The objects its arguments name are kept while the call's ref lives.
            ref._keep = tuple(met)
        if isinstance(call, _deferred.LaterCall):
            # Queued once its refs exist: they keep what its arguments name once it is sent.
            call._refs = refs
            enqueue()
        return refs[0] if self._num_returns == 1 else refs

    def _queue(self, handle: ActorHandle, what: str, ready: Any, args: Sequence[Any] = (),
               kwargs: Optional[Dict[str, Any]] = None) -> Tuple[Any, Callable[[], None]]:
        """The call as an entry of its handle's sequencer: sent after the calls made before it,
        once its arguments (``args``, ``kwargs``; or the payload ``ready`` gives) are ready."""
        from . import _deferred

        later = _deferred._Later(f"actor call {what} (actor {handle._native_id()})")
        call = _deferred.LaterCall(later, lambda: _api._failure(
            0, "cancelled", "before it was sent (its arguments were not ready): it never will "
            "be", later.what))
        named = dict(kwargs or {})

        def prepare() -> Any:
            if ready is not None:
                return ready()
            values = _deferred.resolved(list(args), later)
            named_values = dict(zip(named, _deferred.resolved(list(named.values()), later)))
            with collecting() as met:
                payload = _api._dumps((values, named_values), f"the arguments of {what}")
            for ref in getattr(call, "_refs", ()):
                ref._keep = tuple(met)
            return payload

        entry = _deferred._Entry(
            later, prepare, lambda payload: handle._native.call(self._name, payload))
        return call, lambda: handle._sequencer().add(entry)


class _SharedCall:
    """One call whose answer several refs read (``num_returns=N``): the native call's result,
    kept once it came."""

    def __init__(self, call: Any):
        self._call = call
        self._answer: Optional[tuple] = None

    def result(self, timeout: Optional[float]) -> tuple:
        if self._answer is None:
            self._answer = self._call.result(timeout)
        return self._answer

    def done(self) -> bool:
        return self._answer is not None or self._call.done()

    def cancel(self) -> None:
        self._call.cancel()


class ActorCallRef(TaskRef):
    """One actor call: ``escher.get``, ``escher.wait``, ``escher.cancel`` and ``await`` take it
    as a task's ``TaskRef``. A cancelled call that had not started is removed from the actor's
    queue, and its ``get`` raises ``TaskCancelledError``; a running call of an async actor has
    its coroutine cancelled (the same error); a running call of a sync or threaded actor runs
    on and is answered as usual. A call is answered by the actor, not recorded by the head: it
    has no task id.

    A result above 100 KiB (pickled; a task's threshold) stays in the actor's node's store as
    an object of this session: ``escher.get`` reads it from there (mapped on the actor's
    machine, fetched otherwise), and passing the ref to a remote function or another actor
    passes the object by reference (the task reads it from its own node's store, fetched
    worker to worker, and is placed where the copy is when that node has room). The object is
    kept while this ref, or a task or call given it, lives; then it is released. A smaller
    result comes back inline, in the call's answer."""

    __slots__ = ("_call", "_actor", "_method", "_label", "_part")

    def __init__(self, call: Any, actor: ActorHandle, method: str, label: Optional[str] = None,
                 part: Optional[tuple] = None):
        super().__init__(None, (), "actor-call", None)
        self._call = call
        self._actor = actor
        self._method = method
        # The call's name (``options(name=...)``), and which of its N values this ref is.
        self._label = label
        self._part = part

    @property
    def id(self) -> int:
        raise InvalidArgumentError(
            f"{self!r} is an actor call, which has no task id: calls are answered by the actor "
            f"and not recorded by the head"
        )

    def _what(self) -> str:
        label = f" {self._label!r}" if self._label else ""
        part = f", value {self._part[0]} of {self._part[1]}" if self._part else ""
        return f"actor call{label} {self._actor._class_name or 'actor'}.{self._method} (actor " \
               f"{self._actor._native_id()}{part})"

    def _value(self, timeout: Optional[float]) -> Any:
        try:
            ok, body = self._call.result(timeout)
        except _api.GetTimeoutError as e:
            raise self._why_waiting(e) from None
        if ok is None:
            raise _api._failure(self._actor.actor_id, "cancelled", body, self._what())
        if not ok:
            raise _api._failure(self._actor.actor_id, "failed", body, self._what())
        if isinstance(body, bytes):
            value = pickle.loads(body)
        else:
            # Kept in the actor's node's store: read from there (the native object keeps it).
            owner, index = body.id
            value = get_object(ResultRef(owner, index, body))
        if self._part is None:
            return value
        index, count = self._part
        try:
            many = len(value)
        except TypeError:
            many = None
        if many != count:
            raise _api.TaskError(
                f"{self._what()} was made with num_returns={count}, but the method returned "
                f"{'a ' + type(value).__name__ if many is None else f'{many} values'}: return "
                f"a tuple or list of {count}"
            )
        return value[index]

    def _object(self) -> Optional[ResultRef]:
        """The object the call's result was kept as, once answered, as a reference that keeps
        it (what passing the ref to a task or an actor passes); ``None`` when the result came
        inline, the call failed (its ``get`` raises why), or this ref is one of several values
        (``num_returns``)."""
        if self._part is not None:
            return None
        ok, body = self._call.result(None)
        if ok is not True or isinstance(body, bytes):
            return None
        owner, index = body.id
        return ResultRef(owner, index, body)

    def _why_waiting(self, error: Exception) -> Exception:
        """``error`` with why the call waits: the actor is not placed (the reason the head
        gives, as for a task), or where it runs."""
        actor = self._actor._native_id()
        try:
            state, _incarnation, node, reason = self._actor._native.describe()
        except EscherError:
            return error
        if state == "pending":
            why = f"actor {actor} is still pending: {reason}" if reason else \
                f"actor {actor} is still pending (waiting for a node with room for it)"
        elif state == "running":
            why = f"actor {actor} runs on node {node}: the call is queued or running there"
        else:
            why = f"actor {actor} is {state}" + (f": {reason}" if reason else "")
        return _api.GetTimeoutError(f"{error}; {why}")

    def _done(self) -> bool:
        return self._call.done()

    def cancel(self, *, force: bool = False, recursive: bool = True) -> None:
        _api.cancel(self, force=force, recursive=recursive)

    def _cancel_call(self) -> None:
        self._call.cancel()

    def __repr__(self) -> str:
        label = f", name={self._label!r}" if self._label else ""
        part = f", value={self._part[0]}" if self._part else ""
        return f"ActorCallRef({self._actor._class_name or 'actor'}.{self._method}{label}{part})"

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __reduce__(self):
        raise InvalidArgumentError(
            f"{self!r} cannot be passed to a task or an actor: pass its value (escher.get) "
            f"instead"
        )


def wait_calls(refs: List[TaskRef], num_returns: int,
               timeout: Optional[float]) -> tuple:
    """``escher.wait`` over refs that include actor calls: looks at each until enough have
    finished or ``timeout`` passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    session = _api._current()
    while True:
        # A deferred task not submitted yet has finished only if it never will be.
        tasks = [r for r in refs if not isinstance(r, ActorCallRef) and not _deferred.unsent(r)]
        finished_tasks = set()
        if tasks:
            ids = list(dict.fromkeys(r.id for r in tasks))
            ready, _ = session.wait(ids, len(ids), 0)
            finished_tasks = {s[0] for s in ready}

        def finished(r: TaskRef) -> bool:
            if isinstance(r, ActorCallRef):
                return r._done()
            if _deferred.unsent(r):
                return r._later.settled()  # type: ignore[attr-defined]
            return r.id in finished_tasks

        done = [r for r in refs if finished(r)]
        if len(done) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
            ready_set = {id(r) for r in done[:num_returns]}
            return ([r for r in refs if id(r) in ready_set],
                    [r for r in refs if id(r) not in ready_set])
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def get_actor(name: str, namespace: Optional[str] = None) -> ActorHandle:
    """The live actor named ``name`` in this session's namespace, or in ``namespace`` (an app
    token may name only its own; an admin any: another namespace's actors are unknown to an
    app); raises ``NotFoundError`` when there is none."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"an actor's name is a non-empty text, not {name!r}")
    return ActorHandle(_api._current().actor_named(name, namespace), None, None)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> str:
    """Ends an actor and returns once it has ended: for good (``no_restart=True``: its name
    and resources are freed, its calls fail naming why), or, with ``no_restart=False``, its
    incarnation only, restarted as ``max_restarts`` allows (its constructor re-run, its state
    lost). Returns the actor's state afterwards."""
    if not isinstance(actor, ActorHandle):
        raise InvalidArgumentError(
            f"escher.kill takes an actor's handle (what Cls.remote() or escher.get_actor() "
            f"returns), not {actor!r}; cancel a task with escher.cancel"
        )
    return actor._native.kill(bool(no_restart))
