"""Objects: ``escher.put(value)`` returns an ``ObjectRef``; ``escher.get(ref)`` (or
``ref.get()``) reads the value back, from the worker whose store holds it.

A value travels as one object laid out so that its large buffers are not pickled:

```text
"ESOB" version:u8=1 pad:[u8;3] nbuf:u32 pad:u32 plen:u64 (offset:u64 len:u64) x nbuf
pickle:[u8;plen] (protocol 5) then each buffer at its offset (64-byte aligned from the start)
```

The pickle is made with protocol 5 and a ``buffer_callback``: NumPy arrays (where NumPy is
installed) give their data out of band by themselves, and ``bytes``, ``bytearray`` and
``memoryview`` values of 1 KiB or more are given out of band here. Reading hands
``pickle.loads`` views of the object's bytes as those buffers: a NumPy array comes back as a
read-only array over them and a ``memoryview`` as a read-only view, with no copy; a ``bytes``
or ``bytearray`` is copied once more, since Python's own types must own their memory.

A put to a worker on this machine (the embedded cluster's, a local cluster's) writes those
parts straight into a memfd the head's placement named (``os.write`` of each buffer: one copy,
by the kernel), seals it against writes and size changes, and hands it to the worker, which
checks it and copies it into its store (``Objects.Handover``). A put to a worker elsewhere, or
one that cannot take the file, gets the parts joined into one ``bytes`` and streamed.

A reference given to a remote function as an argument itself is mapped, not fetched: the
call names it to the head (the task's ``escher.objects`` label, so the task is placed where a
copy is when that node has room), the worker brings a copy into its own store if it has none
and hands the task's interpreter a descriptor of the sealed file, which the interpreter maps
read-only (``task_mapped``): a NumPy array argument is then the store's own pages.

Inside a task (a function's warm interpreter, or an actor's), ``escher.get`` of a reference
the task was not given as an argument takes the same way: the interpreter asks its worker,
mid-task, over the channel it already has to it (a request on its answer pipe; the worker
answers on the control socket with the sealed file's descriptor, ``SCM_RIGHTS``), and the
worker brings a copy into the node's store exactly as for an argument (worker to worker, from
a holder the head names, checked against the head's length and CRC-32C, the next holder asked
when one fails, waiting for a copy being rebuilt; the new copy reported to the head, so that
locality sees it, and counted in the store as an argument's, spilling included), then the
interpreter maps it read-only: a 100 MiB NumPy array is read with no copy in the task's memory.
An object already in the node's store is mapped with no fetch. The head is asked where the
object is on every such ``get``, so a freed object or another namespace's raises
``NotFoundError`` and a lost one ``ObjectLostError``, naming it, as a client's read does.

A driver (outside a task) reads an object with escher's client. When a worker on this
machine holds it, the worker lends the object's sealed file (``Objects.Map``, with the read
ticket a fetch would take) and the driver maps it read-only (``_read``): a NumPy array comes
back as a read-only view of the store's own pages, with no copy, and the object stays pinned
in that worker's store while the mapping lives (the ``_Mapping`` holds the lease). Otherwise
it is fetched into a ``bytes``. So does a
task whose interpreter has no channel to its worker (a Python script a command task runs):
that interpreter keeps the last objects its tasks read (``get_object``'s ``_kept``), so that
a reference read by many tasks is fetched once per interpreter. Where the worker serves the
read, the node's store is that cache.

References are counted by their owner: the ``ObjectRef`` that ``put`` returned, and every
copy of it in this process, keep the object; when the last goes, the object is released and
its worker deletes it. A reference sent to a task (as an argument, or inside one) is a
borrowed one: it reads the object but does not keep it; the caller keeps it for the task
while the call's ``TaskRef`` (or the actor call's ref) lives.

A reference a function task returns (alone or inside its value) is the caller's: the task's
``put``s go into its caller's object session (``ESCHER_OBJECT_SESSION``, the call's label), the
worker's runner pickles the return value with ``returning()`` (each reference then unpickles as
``_returned``) and ``hand_over`` disowns the task's own among them, and the driver that reads
the result adopts each reference of its session: one owner's handle per object in the process
(``_owners``, shared with its ``put``s'), kept by the references and the result's ``TaskRef``.
"""

import contextvars
import fcntl
import io
import itertools
import mmap
import os
import pickle
import struct
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Any, List, Optional, Tuple

from . import _escher

ObjectLostError = _escher.ObjectLostError

_MAGIC = b"ESOB\x01\x00\x00\x00"
_HEAD = struct.Struct("<8sIIQ")
_SLOT = struct.Struct("<QQ")
_ALIGN = 64
# Buffers smaller than this are pickled in band: a view costs more than the bytes.
_OUT_OF_BAND_MIN = 1024

# The refs an argument pickle met (``_collect``): kept by the call for its lifetime.
_met: "contextvars.ContextVar[Optional[List[ObjectRef]]]" = contextvars.ContextVar(
    "escher_objects_met", default=None)
# Set while a task's return value is pickled (``returning``): its refs are pickled as ones the
# caller adopts (``_returned``).
_returning: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "escher_objects_returning", default=False)
# The owner's handles a result's unpickling adopted (``adopting``), for its TaskRef to keep.
_adopted: "contextvars.ContextVar[Optional[List[Any]]]" = contextvars.ContextVar(
    "escher_objects_adopted", default=None)
# Every owner's handle of this process by object id (a put's, or one adopted from a result):
# a reference a task returns shares the handle of this process's own, so the object goes
# only when the last reference to it here does.
_owners: "weakref.WeakValueDictionary[Tuple[int, int], Any]" = weakref.WeakValueDictionary()
_owners_lock = threading.Lock()


class ObjectRef:
    """A reference to an object (what ``escher.put`` returns): ``escher.get(ref)`` or
    ``ref.get()`` reads its value. Passed to a remote function or an actor method as an
    argument, the function receives the value (fetched by its worker); inside a list, dict or
    other value it stays a reference, which the function reads with ``escher.get`` (Ray's
    rule)."""

    __slots__ = ("_id", "_owned", "__weakref__")

    # Marks the type for the worker's runner, which resolves references given as arguments.
    _escher_object_ref = True

    def __init__(self, owner: int, index: int, owned: Any = None):
        self._id = (int(owner), int(index))
        self._owned = owned

    @property
    def id(self) -> Tuple[int, int]:
        """The object's id, ``(owner, index)``."""
        return self._id

    @property
    def size(self) -> Optional[int]:
        """The object's length in bytes, where this process put it (else ``None``)."""
        owned = self._owned
        return None if owned is None or owned.adopted else int(owned.size)

    def get(self) -> Any:
        """The object's value (``escher.get(ref)``)."""
        return get_object(self)

    def __repr__(self) -> str:
        return f"ObjectRef({self._id[0]}.{self._id[1]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __reduce__(self):
        met = _met.get()
        if met is not None:
            met.append(self)
        if _returning.get():
            # In a task's return value: the caller that reads it owns it (``_returned``).
            return (_returned, self._id)
        # Elsewhere it is a borrowed reference: it reads the object, never releases it.
        return (ObjectRef, self._id)


def _returned(owner: int, index: int) -> ObjectRef:
    """A reference read from a task's return value. In the driver whose object session it is
    in (a put the task made, which went into its caller's session, or a reference the driver
    gave the task) it owns the object, sharing the handle of any other reference to it here
    (``_adopt``): the object stays while the driver holds it (or the ``TaskRef`` whose result
    it came in), and goes when the last goes. Elsewhere (in a task, another driver) it is
    borrowed, as a reference given to a task is."""
    ref = ObjectRef(owner, index)
    from . import _api

    session = _api._session
    if session is not None and owner == _api._object_session:
        ref._owned = _adopt(session, owner, index)
        adopted = _adopted.get()
        if adopted is not None:
            adopted.append(ref._owned)
    return ref


def _adopt(session: Any, owner: int, index: int) -> Any:
    """The owner's handle of object ``(owner, index)`` in this process: the one a reference
    here holds already, else a new one (``_escher.adopt_object``)."""
    with _owners_lock:
        owned = _owners.get((owner, index))
        if owned is None:
            owned = _escher.adopt_object(session, owner, index)
            _owners[(owner, index)] = owned
        return owned


class _Returning:
    """Within it, the refs pickled are pickled as ones the caller adopts, and each is appended
    to ``met``."""

    def __init__(self) -> None:
        self.met: List[ObjectRef] = []

    def __enter__(self) -> List[ObjectRef]:
        self._tokens = (_met.set(self.met), _returning.set(True))
        return self.met

    def __exit__(self, *exc: Any) -> None:
        _returning.reset(self._tokens[1])
        _met.reset(self._tokens[0])


def returning() -> _Returning:
    """``with returning() as met:`` a task's return value pickled inside records its refs in
    ``met`` and marks them for the caller to adopt (the worker's runner pickles results so,
    then calls ``hand_over(met)``)."""
    return _Returning()


def hand_over(met: List[ObjectRef]) -> None:
    """The refs of a task's return value that the task put into its caller's object session
    (``ESCHER_OBJECT_SESSION``) are given up here: the caller owns them once it reads the
    result, and its session keeps them until then (its end releases them if nobody did)."""
    caller = os.environ.get("ESCHER_OBJECT_SESSION")
    if not caller:
        return
    for ref in met:
        owned = ref._owned
        if owned is not None and str(ref._id[0]) == caller:
            owned.disown()


class _Adopting:
    """Within it, the owner's handles a result's unpickling adopts are appended to ``got``."""

    def __init__(self) -> None:
        self.got: List[Any] = []

    def __enter__(self) -> List[Any]:
        self._token = _adopted.set(self.got)
        return self.got

    def __exit__(self, *exc: Any) -> None:
        _adopted.reset(self._token)


def adopting() -> _Adopting:
    """``with adopting() as got:`` the references a result unpickled inside adopted."""
    return _Adopting()


class ResultRef(ObjectRef):
    """A task's result object (its return value pickled, not ``put``'s layout) given to an
    actor's call or constructor by reference: the actor's interpreter reads it from its node's
    store, as an ``ObjectRef`` argument, rather than the value travelling through the caller.
    Borrowed: the caller's object session keeps it, as it keeps its tasks' results. An actor
    call's result kept in its actor's node's store travels as one too, given to a remote
    function or an actor; the caller's reference then keeps the object (``_owned``) for the
    call it is given to, as a ``put``'s does."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ResultRef({self._id[0]}.{self._id[1]})"

    def __reduce__(self):
        met = _met.get()
        if met is not None and self._owned is not None:
            met.append(self)
        return (ResultRef, self._id)


def _decode(ref: ObjectRef, data: Any) -> Any:
    """An object's value: a task's result is a plain pickle, a put object ``serialize``'s
    layout."""
    if isinstance(ref, ResultRef):
        return pickle.loads(data)
    return deserialize(data)


def _view_from(buffer: Any, fmt: str, shape: Tuple[int, ...]) -> memoryview:
    view: Any = memoryview(buffer)
    if fmt != "B" or len(shape) != 1:
        view = view.cast("B").cast(fmt, shape)
    return view


_picklers: List[Any] = []


def _has_large_bytes(value: Any, depth: int = 3) -> bool:
    """Whether ``value`` is a ``bytes`` or ``bytearray`` of 1 KiB or more, or holds one in its
    lists, tuples, sets and dicts (three levels down, the first 10,000 items of each)."""
    kind = type(value)
    if kind is bytes or kind is bytearray:
        return len(value) >= _OUT_OF_BAND_MIN
    if depth == 0:
        return False
    if kind in (list, tuple, set, frozenset):
        items = value
    elif kind is dict:
        items = value.values()
    else:
        return False
    return any(_has_large_bytes(v, depth - 1) for v in itertools.islice(items, 10_000))


def _pickler(large_bytes: bool) -> Any:
    """A cloudpickle pickler that gives ``memoryview`` values out of band (NumPy arrays do so
    themselves) and, with ``large_bytes``, ``bytes`` and ``bytearray`` values of 1 KiB or more
    too. The C pickler calls ``reducer_override`` for neither of those two, so they are caught
    by ``persistent_id``, which it calls for every object (a cost, so only where
    ``_has_large_bytes`` found one)."""
    if not _picklers:
        import cloudpickle  # type: ignore[import-untyped]

        base = cloudpickle.Pickler

        class Pickler(base):  # type: ignore[misc, valid-type]
            def reducer_override(self, obj: Any) -> Any:
                if type(obj) is memoryview:
                    view: Any = obj
                    if not view.c_contiguous:
                        view = memoryview(view.tobytes()).cast(view.format, view.shape)
                    return _view_from, (pickle.PickleBuffer(view), view.format,
                                        tuple(view.shape))
                parent = getattr(super(), "reducer_override", None)
                return NotImplemented if parent is None else parent(obj)

        class BytesPickler(Pickler):
            def persistent_id(self, obj: Any) -> Any:
                kind = type(obj)
                if (kind is bytes or kind is bytearray) and len(obj) >= _OUT_OF_BAND_MIN:
                    return (kind.__name__, pickle.PickleBuffer(obj))
                return None

        _picklers.extend([Pickler, BytesPickler])
    return _picklers[1 if large_bytes else 0]


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "bytes":
            return bytes(pid[1])
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "bytearray":
            return bytearray(pid[1])
        raise pickle.UnpicklingError(f"unknown persistent id in an escher object: {pid!r}")


def _layout(value: Any) -> Tuple[List[Any], int]:
    """``value`` laid out as one object (the module's layout), as its parts in order (the
    header, the slots, the pickle, then each buffer after its padding, none of them copied)
    and their total length."""
    buffers: List[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        pickler = _pickler(_has_large_bytes(value))
        pickler(out, protocol=5, buffer_callback=buffers.append).dump(value)
    except Exception as e:
        raise _escher.InvalidArgumentError(
            f"cannot pickle the value to put ({type(value).__name__}): {type(e).__name__}: {e}"
        ) from None
    data = out.getbuffer()
    views = [b.raw() for b in buffers]
    start = _HEAD.size + _SLOT.size * len(views)
    at = start + len(data)
    slots = []
    parts: List[Any] = [b"", b"", data]
    for view in views:
        pad = -at % _ALIGN
        at += pad
        slots.append(_SLOT.pack(at, view.nbytes))
        parts.append(bytes(pad))
        parts.append(view)
        at += view.nbytes
    parts[0] = _HEAD.pack(_MAGIC, len(views), 0, len(data))
    parts[1] = b"".join(slots)
    return parts, at


def serialize(value: Any) -> bytes:
    """``value`` laid out as one object (the module's layout): the pickle, then its
    out-of-band buffers, in one ``bytes`` (each buffer copied once, into it)."""
    parts, _size = _layout(value)
    return b"".join(parts)


# The seals a memfd handed to the worker carries: its bytes and its size never change again.
_SEALS = (
    getattr(fcntl, "F_SEAL_WRITE", 0x8)
    | getattr(fcntl, "F_SEAL_GROW", 0x4)
    | getattr(fcntl, "F_SEAL_SHRINK", 0x2)
    | getattr(fcntl, "F_SEAL_SEAL", 0x1)
)


def _sealed_memfd(name: str, parts: List[Any]) -> Optional[int]:
    """A memfd named ``name`` holding ``parts`` one after the other, sealed; ``None`` where
    this Python or system has no memfd (the put is then streamed). Each part is copied once,
    by the kernel, into the memfd's pages."""
    create = getattr(os, "memfd_create", None)
    add_seals = getattr(fcntl, "F_ADD_SEALS", None)
    if create is None or add_seals is None:
        return None
    try:
        fd = create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        for part in parts:
            view = memoryview(part).cast("B")
            while view.nbytes:
                written = os.write(fd, view)
                view = view[written:]
        fcntl.fcntl(fd, add_seals, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def deserialize(data: Any) -> Any:
    """The value of an object's bytes (``serialize``'s layout); buffers are views of ``data``."""
    view = memoryview(data)
    if len(view) < _HEAD.size or bytes(view[:8]) != _MAGIC:
        raise _escher.EscherError(
            "this object was not put by escher's Python package (no ESOB header): read it "
            "from Rust with Client::get_object"
        )
    _magic, nbuf, _pad, plen = _HEAD.unpack_from(view, 0)
    at = _HEAD.size
    buffers = []
    for _ in range(nbuf):
        offset, size = _SLOT.unpack_from(view, at)
        at += _SLOT.size
        buffers.append(view[offset:offset + size])
    return _Unpickler(io.BytesIO(view[at:at + plen]), buffers=buffers).load()


def put_object(session: Any, value: Any) -> ObjectRef:
    if isinstance(value, ObjectRef):
        raise _escher.InvalidArgumentError(
            f"escher.put of an ObjectRef ({value!r}): pass the reference itself, it is one already"
        )
    parts, size = _layout(value)
    placed, name = _escher.put_place(session, size)
    fd = _sealed_memfd(name, parts) if name is not None else None
    if fd is not None:
        # The worker runs on this machine: it takes the sealed memfd as its copy.
        try:
            owned = _escher.put_placed_file(session, placed, fd)
        finally:
            os.close(fd)
    else:
        owned = _escher.put_placed_bytes(session, placed, b"".join(parts))
    owner, index = owned.id
    with _owners_lock:
        _owners[(owner, index)] = owned
    return ObjectRef(owner, index, owned)


# What a worker's interpreter keeps of the objects its tasks read, by id: the last ones, up to
# _KEPT_BYTES, each at most _KEPT_ONE. Ids are never reused and objects never change, so a kept
# copy is the object's as long as the head still knows it: each read asks (one small call,
# which also refuses a freed object, another namespace's or a lost one, as a fetch would).
_KEPT_BYTES = 128 * 1024 * 1024
_KEPT_ONE = 32 * 1024 * 1024
_kept: "OrderedDict[Tuple[int, int], bytes]" = OrderedDict()
_kept_lock = threading.Lock()


# The object arguments of the task this interpreter runs now that its worker handed over
# (``worker/src/python/runner.py``): each the sealed file of the worker's store, mapped here
# read-only. The worker found each in the head's table with the task's own credential (so in
# the task's namespace) and keeps it pinned until the task answers.
_mapped: "dict[Tuple[int, int], Any]" = {}


def task_mapped(mapped: "dict[Tuple[int, int], Any]") -> None:
    """Sets the mapped object arguments of the task that starts (``{}`` once it ended)."""
    global _mapped
    _mapped = mapped


def _worker_channel() -> Any:
    """The worker's object channel of this interpreter (``worker/src/python/runner.py``'s
    ``_ObjectChannel``) when it is a worker's task interpreter, else ``None``."""
    main = sys.modules.get("__main__")
    return getattr(main, "_escher_object_channel", None)


class _Mapping(mmap.mmap):
    """A holder's sealed file mapped read-only, with the lease that keeps the object pinned at
    its holder for as long as this mapping (and every view of it) lives."""

    _lease: Any = None


def _read(session: Any, owner: int, index: int) -> Any:
    """Object ``(owner, index)``'s bytes: its holder's file mapped (a holder on this machine
    lends it), else fetched into a ``bytes``."""
    got = _escher.read_object(session, owner, index)
    if isinstance(got, bytes):
        return got
    fd, size, lease = got
    try:
        mapping = _Mapping(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    mapping._lease = lease
    return mapping


def get_object(ref: ObjectRef) -> Any:
    mapped = _mapped.get(ref._id)
    if mapped is not None:
        # On this node: the store's own pages, no fetch and no copy.
        return _decode(ref, mapped)
    from ._api import _current

    owner, index = ref._id
    if not os.environ.get("ESCHER_TASK_TOKEN"):
        return _decode(ref, _read(_current(), owner, index))
    channel = _worker_channel()
    if channel is not None:
        # Brought into this node's store by the worker (or found there) and mapped: no copy.
        return _decode(ref, channel.get(owner, index))
    session = _current()
    with _kept_lock:
        data = _kept.get(ref._id)
    if data is not None:
        size, _checksum, _holders = _escher.object_info(session, owner, index)
        if size == len(data):
            with _kept_lock:
                if ref._id in _kept:
                    _kept.move_to_end(ref._id)
            return _decode(ref, data)
    data = _read(session, owner, index)
    if isinstance(data, bytes) and len(data) <= _KEPT_ONE:
        with _kept_lock:
            _kept[ref._id] = data
            total = sum(len(d) for d in _kept.values())
            while total > _KEPT_BYTES:
                _, gone = _kept.popitem(last=False)
                total -= len(gone)
    return _decode(ref, data)


def holders(ref: ObjectRef) -> List[int]:
    """The nodes that hold a copy of ``ref``'s object, as the head knows them."""
    from ._api import _current

    owner, index = ref._id
    return list(_escher.object_info(_current(), owner, index)[2])


class _Collect:
    """Within it, every ``ObjectRef`` pickled is appended to ``met``."""

    def __init__(self) -> None:
        self.met: List[ObjectRef] = []

    def __enter__(self) -> List[ObjectRef]:
        self._token = _met.set(self.met)
        return self.met

    def __exit__(self, *exc: Any) -> None:
        _met.reset(self._token)


def collecting() -> _Collect:
    """``with collecting() as met:`` pickles inside record the refs they met (those a call
    keeps for its task)."""
    return _Collect()


def resolve(value: Any) -> Any:
    """The value of an argument: an ``ObjectRef`` given as the argument itself is read;
    anything else (a reference inside a list or dict too) is left as it is."""
    if getattr(type(value), "_escher_object_ref", False):
        return get_object(value)
    return value

