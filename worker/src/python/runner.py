# The Python side of a worker's warm interpreter (worker/src/python/mod.rs explains the frames),
# and of an actor's interpreter (worker/src/python/actor.rs: a task frame whose header has an
# "actor" entry makes this interpreter serve that one object's calls until it exits).
# Started as `python -u -c <this file>`; reads one task frame at a time on stdin, answers on
# stdout. Its stderr is a socket on which the worker sends each task's two log files before
# the task's frame; the function's own prints (stdout and stderr) go to those files, so they
# never mix with the answers and are the task's output, not the worker's. Mid-task, the
# task's own escher.get asks the worker for an object on the answer pipe, and the reply comes
# on that socket (_ObjectChannel; worker/src/python/objects.rs).
import json
import os
import pickle
import socket
import struct
import sys
import threading
import time
import traceback

MAX_MESSAGE = 16 * 1024

# Every write on the answer pipe: a task's answer, an actor's replies, object requests.
_OUT_LOCK = threading.Lock()
# The status of an object request on the answer pipe (worker/src/python/objects.rs).
_GET = 3


def _watch_parent(parent):
    # A worker killed outright cannot kill its interpreters: they leave when it does.
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.5)


def _read_exact(stream, n):
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _loads(data, what):
    try:
        return pickle.loads(data)
    except ModuleNotFoundError as e:
        raise _LoadError(
            f"cannot load the {what} on this worker: module {e.name!r} is missing here "
            f"({sys.executable}); install it on the worker (pip install {e.name}) or define "
            f"the code in the calling script, which is shipped by value"
        ) from None
    except Exception as e:
        raise _LoadError(f"cannot load the {what} on this worker: {type(e).__name__}: {e}") from None


class _LoadError(Exception):
    pass


class _ObjectError(Exception):
    """An argument's object could not be read: the text is the task's failure."""


def _is_object_ref(value):
    return getattr(type(value), "_escher_object_ref", False)


# At most this many object descriptors come with a task (its label holds about ten).
_MAX_OBJECT_FDS = 64


def _map_objects(entries, fds):
    """{(owner, index): buffer} of the object arguments the worker handed over with the task:
    each sealed file of its store mapped read-only here, with no fetch and no copy. Closes the
    descriptors (a mapping keeps its own). Anything amiss (a count or size that does not match)
    maps nothing: those arguments are then fetched as any reference is."""
    import mmap

    mapped = {}
    try:
        if len(entries) != len(fds):
            return {}
        for (owner, index, size), fd in zip(entries, fds):
            if os.fstat(fd).st_size != size:
                return {}
            mapped[(owner, index)] = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
    except (OSError, ValueError, TypeError):
        return {}
    finally:
        for fd in fds:
            os.close(fd)
    return mapped


def _result_bytes(tid, data, mapped):
    """The pickled result of argument task ``tid``: in the frame (``data``), or, where the
    frame has none (a pickle is never empty), the task's result object of this node's store,
    which the worker handed over with the task and was mapped here (no copy through the pipe)."""
    if data:
        return data
    view = mapped.get((tid, 0))
    if view is None:
        raise _LoadError(
            f"the result of task {tid} is an object of this node's store that could not be "
            f"mapped here (the worker's descriptors did not match its list)"
        )
    return view


def _resolve_objects(args, kwargs, mapped=None):
    """The arguments with each escher.ObjectRef given as an argument itself replaced by its
    object's value: mapped from this node's store where the worker handed its file over
    (``mapped``), else fetched (with the task's own credential) from a worker that holds it. A
    reference inside a list, dict or other value stays a reference (Ray's rule)."""
    if not any(_is_object_ref(v) for v in args) and not any(
        _is_object_ref(v) for v in kwargs.values()
    ):
        return args, kwargs
    import escher
    from escher._objects import resolve, task_mapped

    task_mapped(mapped or {})

    def one(value):
        try:
            return resolve(value)
        except Exception as e:
            name = type(e).__name__
            where = "escher" if getattr(escher, name, None) is type(e) else type(e).__module__
            raise _ObjectError(
                f"python exception {where}.{name}: cannot read the argument {value!r}: {e}"
            ) from None

    return [one(v) for v in args], {k: one(v) for k, v in kwargs.items()}


class _ObjectChannel:
    """``escher.get`` inside a task, served by the worker (worker/src/python/objects.rs): a
    request on the answer pipe, the reply on the control socket with the descriptor of the
    sealed file of the node's store that now holds a copy, mapped here read-only (no copy).
    ``escher._objects`` finds it as ``__main__._escher_object_channel``. One request is open at
    a time (threads of a task, an actor's concurrent calls, take turns)."""

    def __init__(self, ctl, proto_out):
        self.ctl, self.proto_out = ctl, proto_out
        self.actor = False
        self.lock = threading.Lock()

    def get(self, owner, index):
        """The object's bytes, mapped from this node's store; raises the error escher's client
        would raise (``NotFoundError``, ``ObjectLostError``, ...), which names the object."""
        import mmap

        body = struct.pack(">QQ", owner, index)
        if self.actor:
            frame = struct.pack(">IBQ", len(body) + 9, _GET, 0) + body
        else:
            frame = struct.pack(">IB", len(body) + 1, _GET) + body
        with self.lock:
            with _OUT_LOCK:
                self.proto_out.write(frame)
            status, body, fds = self._reply()
        from escher import _escher

        if status != 0:
            for fd in fds:
                os.close(fd)
            name, _, text = body.decode(errors="replace").partition("\n")
            raise getattr(_escher, name, _escher.EscherError)(text)
        try:
            (size,) = struct.unpack(">Q", body)
            if len(fds) != 1 or os.fstat(fds[0]).st_size != size:
                raise _escher.EscherError(
                    f"object {owner}.{index}: the worker handed over no file of {size} bytes")
            return mmap.mmap(fds[0], size, prot=mmap.PROT_READ) if size else b""
        finally:
            for fd in fds:
                os.close(fd)

    def _reply(self):
        data, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 4)
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">I", data)[0]:
            more = self.ctl.recv(1 << 16)
            if not more:
                raise SystemExit("the worker closed the control socket")
            data += more
        (length,) = struct.unpack_from(">I", data)
        if length == 0:
            raise SystemExit("the worker sent an empty object reply")
        return data[4], data[5:4 + length], fds


_escher_object_channel = None


class _BecomeActor(Exception):
    """The frame creates an actor: this interpreter serves it from now on."""

    def __init__(self, options, class_bytes, args_bytes):
        super().__init__("actor")
        self.options, self.class_bytes, self.args_bytes = options, class_bytes, args_bytes


# Values that pickle the same way with pickle as with cloudpickle, which is slower to start.
_PLAIN = (type(None), bool, int, float, str, bytes)


def _dumps(value):
    if type(value) in _PLAIN:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    # Where escher._objects is loaded, the value may hold references: each is pickled as one
    # the caller adopts, and the task's own puts among them are handed over (``returning``).
    objects = sys.modules.get("escher._objects")
    if objects is None:
        return _pickle_value(value)
    with objects.returning() as met:
        data = _pickle_value(value)
    objects.hand_over(met)
    return data


def _pickle_value(value):
    try:
        import cloudpickle

        return cloudpickle.dumps(value)
    except ImportError:
        return pickle.dumps(value)


def _exception_text(exc):
    kind = type(exc)
    # Without the runner's own frame: the traceback starts in the function.
    frames = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    tb = "".join(traceback.format_exception(kind, exc, frames))
    text = f"python exception {kind.__module__}.{kind.__qualname__}: {exc}\n\nRemote traceback:\n{tb}"
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE // 2] + "\n...\n" + text[-MAX_MESSAGE // 2 :]
    return text


def _await(awaitable):
    import asyncio

    async def wait():
        return await awaitable

    return asyncio.run(wait())


def _set_task_env(header):
    env = {
        "ESCHER_HEAD": header["head"],
        "ESCHER_TASK_ID": str(header["task_id"]),
        "ESCHER_ATTEMPT": str(header["attempt"]),
        "ESCHER_NODE_ID": str(header["node_id"]),
        "ESCHER_TASK_TOKEN": header["token"],
    }
    os.environ.update(env)
    # The caller's object session: the task's puts go into it (``escher._api``).
    if header.get("object_session"):
        os.environ["ESCHER_OBJECT_SESSION"] = str(header["object_session"])
    else:
        os.environ.pop("ESCHER_OBJECT_SESSION", None)
    if header.get("namespace"):
        os.environ["ESCHER_NAMESPACE"] = header["namespace"]
    else:
        os.environ.pop("ESCHER_NAMESPACE", None)
    # A task calling an https:// head trusts what its worker trusts, as a command task does.
    for key, var in (("tls_ca", "ESCHER_TLS_CA"), ("tls_name", "ESCHER_TLS_NAME")):
        if header.get(key):
            os.environ[var] = header[key]
        else:
            os.environ.pop(var, None)


def _run(frame, functions, object_fds=()):
    (hlen,) = struct.unpack_from(">I", frame, 0)
    at = 4
    header = json.loads(frame[at : at + hlen])
    at += hlen
    (flen,) = struct.unpack_from(">I", frame, at)
    at += 4
    fn_bytes = frame[at : at + flen]
    at += flen
    (ndeps,) = struct.unpack_from(">I", frame, at)
    at += 4
    deps = []
    for _ in range(ndeps):
        (dlen,) = struct.unpack_from(">I", frame, at)
        at += 4
        deps.append(frame[at : at + dlen])
        at += dlen
    args_bytes = frame[at:]
    mapped = _map_objects(header.get("objects", []), list(object_fds))
    _set_task_env(header)
    if "actor" in header:
        raise _BecomeActor(header["actor"], fn_bytes, args_bytes)
    try:
        key = header["hash"]
        if flen:
            functions[key] = _loads(fn_bytes, "function")
        fn = functions.get(key)
        if fn is None:
            return 2, b"the worker sent no function and this interpreter holds none with its hash"
        results = {tid: _loads(_result_bytes(tid, data, mapped), f"result of task {tid}")
                   for tid, data in zip(header["deps"], deps)}
        spec, kwargs = _loads(args_bytes, "arguments")
        args = [results[value] if kind == "ref" else value for kind, value in spec]
    except _LoadError as e:
        return 2, str(e).encode()
    try:
        try:
            args, kwargs = _resolve_objects(args, kwargs, mapped)
        except _ObjectError as e:
            return 1, str(e).encode()
        try:
            value = fn(*args, **kwargs)
            if hasattr(value, "__await__"):
                # An `async def` function: awaited here, on an event loop of its own.
                value = _await(value)
        except BaseException as e:  # the task reports whatever the function raised, SystemExit too
            return 1, _exception_text(e).encode()
    finally:
        # Values still in use keep their mappings; later tasks read through the head. Only
        # where escher._objects was loaded (an ObjectRef argument): the worker's interpreter
        # needs no escher package for a task whose TaskRef arguments were mapped here.
        objects = sys.modules.get("escher._objects") if mapped else None
        if objects is not None:
            objects.task_mapped({})
    try:
        return 0, _dumps(value)
    except Exception as e:
        return 1, (
            f"python exception {type(e).__module__}.{type(e).__qualname__}: the value the function "
            f"returned ({type(value).__name__}) cannot be pickled: {e}"
        ).encode()


def _is_async(cls):
    import inspect

    return any(inspect.iscoroutinefunction(member) for _, member in inspect.getmembers(cls))


def _actor_call(instance, method, args_bytes):
    """Runs one call up to the point of its value: (status, body), or a coroutine to await."""
    try:
        fn = getattr(instance, method)
        args, kwargs = _loads(args_bytes, f"arguments of {method}")
        args, kwargs = _resolve_objects(args, kwargs)
    except (_LoadError, _ObjectError) as e:
        return _Failed(f"{e}")
    except AttributeError:
        return _Failed(
            f"python exception builtins.AttributeError: actor class "
            f"{type(instance).__qualname__} has no method {method!r}"
        )
    try:
        return fn(*args, **kwargs)
    except BaseException as e:
        return _Raised(e)


class _Raised:
    """A call's method raised this."""

    def __init__(self, exc):
        self.exc = exc


class _Failed:
    """A call failed before its method ran: why."""

    def __init__(self, text):
        self.text = text


def _answer(method, value):
    if isinstance(value, _Raised):
        return 1, _exception_text(value.exc).encode()
    if isinstance(value, _Failed):
        return 1, value.text.encode()
    try:
        return 0, _dumps(value)
    except Exception as e:
        return 1, (
            f"python exception {type(e).__module__}.{type(e).__qualname__}: the value {method} "
            f"returned ({type(value).__name__}) cannot be pickled: {e}"
        ).encode()


def _serve_actor(actor, proto_in, proto_out):
    """Constructs the actor's object, answers like a task, then serves calls until the worker
    closes the pipe: one at a time, on a thread pool of max_concurrency, or as coroutines on
    one event loop (a class with async def methods), started in the order they arrive."""
    def send(data):
        sys.stdout.flush()
        sys.stderr.flush()
        with _OUT_LOCK:
            proto_out.write(data)

    try:
        cls = _loads(actor.class_bytes, "actor's class")
        args, kwargs = _loads(actor.args_bytes, "constructor's arguments")
    except _LoadError as e:
        send(struct.pack(">IB", len(str(e).encode()) + 1, 2) + str(e).encode())
        return
    try:
        args, kwargs = _resolve_objects(args, kwargs)
    except _ObjectError as e:
        send(struct.pack(">IB", len(str(e).encode()) + 1, 1) + str(e).encode())
        return
    try:
        instance = cls(*args, **kwargs)
    except BaseException as e:
        text = _exception_text(e).encode()
        send(struct.pack(">IB", len(text) + 1, 1) + text)
        return
    send(struct.pack(">IB", 1, 0))
    # The constructor asked for objects as a task does; the calls' requests are numbered.
    if _escher_object_channel is not None:
        _escher_object_channel.actor = True

    def reply(seq, status, body):
        send(struct.pack(">IBQ", len(body) + 9, status, seq) + body)

    def calls():
        while True:
            head = _read_exact(proto_in, 4)
            if head is None:
                return
            (length,) = struct.unpack(">I", head)
            frame = _read_exact(proto_in, length)
            if frame is None:
                return
            seq, mlen = struct.unpack_from(">QI", frame, 0)
            if mlen == 0:
                # A cancel of call `seq`: only an async actor can stop a running call.
                on_cancel(seq)
                continue
            yield seq, frame[12 : 12 + mlen].decode(), frame[12 + mlen :]

    def on_cancel(seq):
        pass

    def run(seq, method, args_bytes):
        reply(seq, *_answer(method, _actor_call(instance, method, args_bytes)))

    concurrency = int(actor.options.get("max_concurrency", 1))
    if _is_async(cls):
        import asyncio

        loop = asyncio.new_event_loop()

        # The running calls' tasks, by seq: what a cancel reaches.
        running = {}

        async def run_async(method, args_bytes):
            value = _actor_call(instance, method, args_bytes)
            if hasattr(value, "__await__"):
                try:
                    value = await value
                except BaseException as e:
                    value = _Raised(e)
            return value

        def finished(seq, method, task):
            running.pop(seq, None)
            if task.cancelled():
                # Cancelled before its coroutine took its first step.
                value = _Raised(asyncio.CancelledError("the call was cancelled"))
            else:
                value = task.result()
            reply(seq, *_answer(method, value))

        def start(seq, method, args_bytes):
            # Tasks created in this order start in this order.
            task = loop.create_task(run_async(method, args_bytes))
            running[seq] = task
            task.add_done_callback(lambda t: finished(seq, method, t))

        def cancel(seq):
            task = running.get(seq)
            if task is not None:
                task.cancel()

        def on_cancel(seq):  # noqa: F811 - an async actor's calls can be cancelled
            loop.call_soon_threadsafe(cancel, seq)

        def feed():
            for call in calls():
                loop.call_soon_threadsafe(start, *call)
            loop.call_soon_threadsafe(loop.stop)

        threading.Thread(target=feed, daemon=True).start()
        loop.run_forever()
    elif concurrency > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for call in calls():
                pool.submit(run, *call)
    else:
        for call in calls():
            run(*call)
    sys.stdout.flush()
    sys.stderr.flush()


def _take_output(ctl):
    # The worker sends each task's two log files (stdout, stderr) before its frame: what the
    # task prints is its own output (`escher logs`), never the worker's.
    # After them, one descriptor per object argument of its store (`_map_objects`): returned.
    _, fds, _, _ = socket.recv_fds(ctl, 1, 2 + _MAX_OBJECT_FDS)
    if len(fds) < 2:
        for fd in fds:
            os.close(fd)
        raise SystemExit("the worker sent no log files with the task")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        os.close(fd)
    return fds[2:]


def _drop_output(null):
    # Between tasks nothing is anyone's output.
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(null, 1)
    os.dup2(null, 2)


def main():
    # Buffered: a frame's length and body come in one read where they fit.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    # Stderr is the socket the worker sends each task's log files on.
    ctl = socket.socket(fileno=os.dup(2))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    null = os.open(os.devnull, os.O_WRONLY)
    _drop_output(null)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    global _escher_object_channel
    _escher_object_channel = _ObjectChannel(ctl, proto_out)
    functions = {}
    while True:
        head = _read_exact(proto_in, 4)
        if head is None:
            return
        (length,) = struct.unpack(">I", head)
        frame = _read_exact(proto_in, length)
        if frame is None:
            return
        object_fds = _take_output(ctl)
        try:
            status, body = _run(frame, functions, object_fds)
        except _BecomeActor as actor:
            _serve_actor(actor, proto_in, proto_out)
            return
        _drop_output(null)
        with _OUT_LOCK:
            proto_out.write(struct.pack(">IB", len(body) + 1, status) + body)


main()
