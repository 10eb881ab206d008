"""Calls whose arguments are not ready yet: ``.remote()`` returns at once, and the call is sent
when its arguments are (Ray's dependency resolution, done by the caller).

A remote function's task whose argument is an actor call's ref (answered by the actor, not
recorded by the head, so no task can wait for it), or another such task not sent yet, is a
``DeferredTaskRef``: a thread of the caller's waits for those arguments and then submits the
task (the arguments that are tasks go on as task dataflow; an actor call's result kept in
its actor's node's store goes on as a reference to that object, which the task's worker reads
from there). An actor call, or an actor's
creation, whose arguments include refs is an entry of its handle's ``_Sequencer``: one thread
per handle sends the entries in the order they were made, each once its arguments are ready,
and a later call without such arguments waits behind them, so that a handle's calls still
start in the order they were made.

Each of these waits in a ``_Later`` until it is sent, fails (an argument failed: that failure
is its own) or is cancelled (then it is never sent).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from . import _api, _escher
from ._api import GetTimeoutError, TaskRef


class _Later:
    """What a deferred call became: ``waiting`` for its arguments, ``sending``, ``sent`` (with
    its task id or native call in ``value``), ``failed`` or ``cancelled`` (with ``error``)."""

    def __init__(self, what: str):
        self._cond = threading.Condition()
        self.what = what
        self.state = "waiting"
        self.value: Any = None
        self.error: Optional[BaseException] = None
        # The argument it waits for now (for the error of a get that timed out).
        self.waiting_for = ""
        self._cancel_asked = False

    def settled(self) -> bool:
        return self.state in ("sent", "failed", "cancelled")

    def wait(self, timeout: Optional[float]) -> Any:
        """Its task id or native call once sent; raises its failure, its cancellation, or
        ``GetTimeoutError`` when ``timeout`` passes first."""
        with self._cond:
            if not self._cond.wait_for(self.settled, timeout):
                waits = f": it waits for {self.waiting_for}" if self.waiting_for else ""
                raise GetTimeoutError(
                    f"{self.what} was not sent within {timeout} s, its arguments not being "
                    f"ready{waits}")
            if self.state == "sent":
                return self.value
            assert self.error is not None
            raise self.error

    def begin(self) -> bool:
        """Marks it as being sent; False when it was cancelled (then it is never sent)."""
        with self._cond:
            if self.state != "waiting":
                return False
            self.state = "sending"
            return True

    def sent(self, value: Any) -> bool:
        """Records what it was sent as; True when a cancel came while it was being sent (the
        caller then cancels what was sent)."""
        with self._cond:
            self.state, self.value = "sent", value
            self._cond.notify_all()
            return self._cancel_asked

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self.state in ("waiting", "sending"):
                self.state, self.error = "failed", error
                self._cond.notify_all()

    def cancel(self, error: BaseException) -> Tuple[str, Any]:
        """Cancels it if not sent yet (``("cancelled", None)``: it never will be); else its
        state and, once sent, what it was sent as (which the caller cancels)."""
        with self._cond:
            if self.state == "waiting":
                self.state, self.error = "cancelled", error
                self._cond.notify_all()
                return "cancelled", None
            if self.state == "sending":
                self._cancel_asked = True
                self._cond.wait_for(lambda: self.state != "sending")
            return self.state, self.value


def unsent(value: Any) -> bool:
    """Whether ``value`` is a deferred task's ref not sent yet."""
    later = getattr(value, "_later", None)
    return later is not None and later.state != "sent"


def blocks(value: Any) -> bool:
    """Whether a remote function's argument makes its task wait in the caller: an actor
    call's ref, or a deferred task's not sent yet."""
    return isinstance(value, TaskRef) and (value._kind == "actor-call" or unsent(value))


class DeferredTaskRef(TaskRef):
    """A remote function's task that waits in the caller for its arguments (an actor call's
    result, or another deferred task's submission): ``get``, ``wait``, ``cancel``, ``await``
    and passing it on work on it before and after it is submitted; its id is known once it is
    submitted (reading ``id`` waits for that). Cancelled before it is submitted, it never is;
    if an argument fails, it is never submitted and its ``get`` raises that failure. Equal only
    to itself."""

    __slots__ = ("_later",)

    def __init__(self, later: _Later):
        super().__init__(None, (), "python")
        self._later = later

    @property
    def id(self) -> int:
        if self._id is None:
            self._id = int(self._later.wait(None))
        return self._id

    def _settle(self, timeout: Optional[float]) -> None:
        """Waits until it is submitted (raising its failure or cancellation)."""
        if self._id is None:
            self._id = int(self._later.wait(timeout))

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        if self._id is None and self._later.state != "sent":
            return f"TaskRef(deferred, {self._later.state})"
        return f"TaskRef({self.id})"


def later_task(fn: Any, session: Any, args: Sequence[Any],
               kwargs: Dict[str, Any]) -> DeferredTaskRef:
    """``fn.remote(*args, **kwargs)`` for a call whose arguments are not all ready: checked
    here, submitted by a thread of its own once they are."""
    for a in args:
        if isinstance(a, TaskRef) and a._kind not in ("python", "actor-call"):
            raise _api.InvalidArgumentError(
                f"{a!r} is not a remote function's task: only those can be passed as "
                f"arguments (get its result with escher.get first)"
            )
    for k, v in kwargs.items():
        if isinstance(v, TaskRef) and v._kind != "actor-call":
            raise _api.InvalidArgumentError(
                f"TaskRef argument {k}= must be passed by position to wait for it"
            )
    fn._function_bytes()  # a function that cannot be pickled fails here, not later
    later = _Later(f"task of {fn._name}")
    ref = DeferredTaskRef(later)
    keep = (list(args), dict(kwargs))

    def run() -> None:
        try:
            ready = [_ready(a, later, True) for a in keep[0]]
            named = {k: _ready(v, later, True) for k, v in keep[1].items()}
        except BaseException as e:  # an argument failed: that failure is this task's
            later.fail(e)
            return
        later.waiting_for = ""
        if not later.begin():
            return
        try:
            call = fn._prepare(session, ready, named)
            if call[2]:
                tid = session.submit_python(call[0], call[1], fn._retries, fn._timeout,
                                            fn._name, fn._spec, call[5],
                                            [d.id for d in call[3]])
                done = fn._submitted(session, tid, call)
            else:
                tid = session.submit_python(call[0], call[1], fn._retries, fn._timeout,
                                            fn._name, fn._spec, call[5])
                done = TaskRef(tid, (), "python", None, call[4])
        except BaseException as e:
            later.fail(e)
            return
        ref._deps, ref._keep = done._deps, done._keep
        if later.sent(tid):
            session.cancel([tid])

    threading.Thread(target=run, name="escher-deferred-task", daemon=True).start()
    return ref


def _ready(value: Any, later: _Later, task: bool) -> Any:
    """An argument once ready: an actor call's value (raising its failure); a deferred task,
    once submitted (for a task: then an argument task as any other), else its value; for an
    actor (``task`` False), any ref's value."""
    if not isinstance(value, TaskRef):
        return value
    later.waiting_for = repr(value)
    if value._kind == "actor-call":
        # A result kept in the actor's node's store goes on by reference: the task or actor
        # reads it from its own node's store, not through this caller.
        kept = value._object()  # type: ignore[attr-defined]
        if kept is not None:
            return kept
    else:
        if isinstance(value, DeferredTaskRef):
            value._settle(None)
        if task:
            return value
        if value._kind == "python":
            by_ref = _result_object(value)
            if by_ref is not None:
                return by_ref
    return _api.get(value)


def _result_object(ref: TaskRef) -> Any:
    """A reference to the result object of the remote function's task ``ref`` once it has
    succeeded, for an actor's argument: the actor's interpreter reads it from its node's
    store; ``None`` when its result is small (inline in its status) or it did not succeed
    (then its ``get`` gives the value or raises the failure)."""
    from ._objects import ResultRef

    session = _api._current()
    if ref._deps:
        # An argument task that failed cancels it: get raises that failure.
        return None
    ready, _ = session.wait([ref.id], 1, None)
    if not ready or ready[0][1] != "succeeded" or ready[0][2] is not None:
        return None
    try:
        _escher.object_info(session, ref.id, 0)
    except _api.EscherError:
        return None
    return ResultRef(ref.id, 0)


# ------------------------------------------------------------------------------------------
# Actor calls and creations


class LaterCall:
    """An actor call sent by its handle's sequencer once its arguments are ready: the native
    call's ``result``, ``done`` and ``cancel``, or its failure (an argument's) or cancellation
    before it was sent."""

    def __init__(self, later: _Later, cancelled: Callable[[], BaseException]):
        self._later = later
        self._cancelled = cancelled
        # Its refs, which keep what its arguments name once it is sent.
        self._refs: Sequence[Any] = ()

    def result(self, timeout: Optional[float]) -> tuple:
        start = time.monotonic()
        call = self._later.wait(timeout)
        left = None if timeout is None else max(timeout - (time.monotonic() - start), 0.0)
        return call.result(left)

    def done(self) -> bool:
        state = self._later.state
        if state in ("failed", "cancelled"):
            return True
        return state == "sent" and self._later.value.done()

    def cancel(self) -> None:
        state, call = self._later.cancel(self._cancelled())
        if state == "sent":
            call.cancel()


class _Entry:
    """One call (or the creation) a sequencer sends: ``prepare`` waits for its arguments and
    returns what ``send`` sends."""

    def __init__(self, later: _Later, prepare: Callable[[], Any],
                 send: Callable[[Any], Any]):
        self.later = later
        self.prepare = prepare
        self.send = send


class Sequencer:
    """Sends one handle's calls in the order they were made: a call without refs among its
    arguments goes at once when nothing waits before it (``now``); otherwise it is queued
    (``add``) and a thread sends the queue in order, each entry once its arguments are
    ready."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: Deque[_Entry] = collections.deque()
        self._draining = False

    def now(self, send: Callable[[], Any]) -> Tuple[bool, Any]:
        """``(True, send())`` when nothing is queued, else ``(False, None)``."""
        with self._lock:
            if self._queue:
                return False, None
            return True, send()

    def add(self, entry: _Entry) -> None:
        with self._lock:
            self._queue.append(entry)
            if not self._draining:
                self._draining = True
                threading.Thread(target=self._drain, name="escher-actor-calls",
                                 daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                entry = self._queue[0]
            prepared, failed = None, None
            if entry.later.state == "waiting":
                try:
                    prepared = entry.prepare()
                except BaseException as e:  # an argument failed: the call fails with it
                    failed = e
                entry.later.waiting_for = ""
            # Sent under the lock, and taken off the queue in the same hold: a call made
            # meanwhile without refs either queued behind it or goes after it.
            cancel_after = None
            with self._lock:
                if failed is not None:
                    entry.later.fail(failed)
                elif entry.later.begin():
                    try:
                        value = entry.send(prepared)
                    except BaseException as e:
                        entry.later.fail(e)
                    else:
                        if entry.later.sent(value):
                            cancel_after = value
                self._queue.popleft()
            if cancel_after is not None and hasattr(cancel_after, "cancel"):
                cancel_after.cancel()


class LaterActor:
    """The native actor of a handle whose creation waits for its constructor's arguments:
    each use waits for the creation (raising its failure)."""

    def __init__(self, later: _Later):
        self._later = later

    @property
    def id(self) -> int:
        return self._later.wait(None).id

    def call(self, method: str, args: bytes) -> Any:
        return self._later.wait(None).call(method, args)

    def kill(self, no_restart: bool) -> str:
        state, native = self._later.cancel(_escher.ActorDiedError(
            f"{self._later.what} was killed before it was created (its constructor's "
            f"arguments were not ready): it never will be"))
        if state == "sent":
            return native.kill(no_restart)
        return "dead"

    def describe(self) -> Tuple[str, int, Optional[int], Optional[str]]:
        state = self._later.state
        if state in ("waiting", "sending"):
            waits = f": it waits for {self._later.waiting_for}" \
                if self._later.waiting_for else ""
            return ("pending", 0, None,
                    f"its constructor's arguments are not ready yet, so it is not created{waits}")
        if state != "sent":
            return ("dead", 0, None, str(self._later.error))
        return self._later.value.describe()


def resolved(values: Sequence[Any], later: _Later) -> List[Any]:
    """An actor's arguments, each ref replaced by its value once ready (an actor gets values,
    never refs)."""
    return [_ready(v, later, False) for v in values]
