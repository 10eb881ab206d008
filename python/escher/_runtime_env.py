"""Runtime environments (``runtime_env=``): environment variables and a working directory that
a remote function's calls, or an actor, run with, shipped with the function or the class.

The driver packs the working directory once (a zip made the same way every time, so its
SHA-256 names its content) and wraps the function in a :class:`_WithEnv` that holds the archive;
the pair travels as the function does (cloudpickled; over 8 KiB, once per content hash in a task
of its own whose result the workers fetch and keep), and each warm interpreter loads it once.
This module is pickled by value (``cloudpickle.register_pickle_by_value``): a worker needs no
escher package, only cloudpickle. On the worker, each interpreter checks the archive against its
SHA-256 and unpacks it once, into a new folder of its own under the task user's home (or the
temporary directory), removed once the interpreter has ended: a folder found on disk is never
taken for the archive's content, so another task of the namespace cannot plant one under a hash. Each
call runs with the variables set, in the directory and with it first on ``sys.path``; all three
are put back when the call ends, so the next task of the interpreter starts as it would have. Modules imported from a working directory
stay imported in that interpreter (interpreters are never shared between namespaces).

An actor's class travels as an :class:`_ActorWithEnv`: its interpreter is the actor's own,
never reused (worker/src/python/actor.rs), so the environment is set once, before the class is
unpickled (a class whose module imports a module of the working directory loads), and holds for
the actor's life, its constructor and every method call, on every thread.

Imports nothing of escher's.
"""

import hashlib
import io
import os
import sys
import zipfile

# The most bytes of a working directory's archive: more belongs in a package on the workers.
MAX_ARCHIVE = 64 * 1024 * 1024
# What is never packed.
_SKIPPED = {".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".venv", "venv"}


def pack(path):
    """The working directory ``path`` as zip bytes that are the same for the same content (sorted
    names, fixed times), and their SHA-256 hex; refuses one larger than ``MAX_ARCHIVE``."""
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED)
            for name in sorted(files):
                full = os.path.join(folder, name)
                if not os.path.isfile(full):
                    continue
                total += os.path.getsize(full)
                if total > MAX_ARCHIVE:
                    raise ValueError(
                        f"working_dir {path!r} holds more than {MAX_ARCHIVE // (1024 * 1024)} MiB; "
                        f"ship less (data belongs in storage the workers read, packages "
                        f"installed on the workers)"
                    )
                info = zipfile.ZipInfo(os.path.relpath(full, path), date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (os.stat(full).st_mode & 0o777 | 0o400) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with open(full, "rb") as f:
                    archive.writestr(info, f.read())
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def _unpacked(archive, digest):
    """A new folder holding ``archive`` unpacked, named ``DIGEST.RANDOM`` under the task user's
    home or the temporary directory; refuses an archive whose SHA-256 is not ``digest``.

    The folder lives as long as this interpreter: beside it, ``DIGEST.RANDOM.lock`` stays
    locked (``flock``) by this process until it ends, however it ends, and each unpacking first
    removes the folders whose lock no process holds any more (their interpreters are gone)."""
    import fcntl
    import tempfile

    actual = hashlib.sha256(archive).hexdigest()
    if actual != digest:
        raise ValueError(
            f"the working directory's archive has SHA-256 {actual}, not the {digest} it was "
            f"sent under: refused"
        )
    base = os.environ.get("HOME") or tempfile.gettempdir()
    root = os.path.join(base, ".escher", "working-dirs")
    os.makedirs(root, mode=0o700, exist_ok=True)
    _sweep(root)
    while True:
        fd, lock = tempfile.mkstemp(prefix=digest + ".", suffix=".lock", dir=root)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if same:
            break
        # A sweep took the file between its making and its locking: another name.
        os.close(fd)
    # The descriptor stays open, and so locked, for the interpreter's life.
    folder = lock[: -len(".lock")]
    os.mkdir(folder, 0o700)
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        z.extractall(folder)
    return folder


def _sweep(root):
    """Removes the unpacked folders under ``root`` whose lock no process holds."""
    import fcntl
    import shutil

    for name in os.listdir(root):
        if not name.endswith(".lock"):
            continue
        lock = os.path.join(root, name)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # its interpreter lives
            continue
        shutil.rmtree(lock[: -len(".lock")], ignore_errors=True)
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


class _WithEnv:
    """A function and the runtime environment its calls run with."""

    def __init__(self, fn, env_vars, archive, digest):
        self.fn = fn
        self.env_vars = dict(env_vars)
        self.archive = archive
        self.digest = digest

    def __getstate__(self):
        # The folder is the unpacking interpreter's own: it never travels.
        state = dict(self.__dict__)
        state.pop("_unpacked_to", None)
        return state

    def _folder(self):
        """The folder this interpreter unpacked the archive into, unpacked at the first call."""
        folder = self.__dict__.get("_unpacked_to")
        if folder is None or not os.path.isdir(folder):
            folder = _unpacked(self.archive, self.digest)
            self._unpacked_to = folder
        return folder

    def __call__(self, *args, **kwargs):
        saved = {k: os.environ.get(k) for k in self.env_vars}
        cwd = os.getcwd()
        folder = None
        try:
            os.environ.update(self.env_vars)
            if self.archive is not None:
                folder = self._folder()
                os.chdir(folder)
                sys.path.insert(0, folder)
            value = self.fn(*args, **kwargs)
            if hasattr(value, "__await__"):
                # Awaited here, while the environment holds.
                import asyncio

                async def wait():
                    return await value

                value = asyncio.run(wait())
            return value
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if folder is not None:
                os.chdir(cwd)
                if folder in sys.path:
                    sys.path.remove(folder)


class _ActorWithEnv:
    """An actor's class (cloudpickled bytes) and the runtime environment it lives in. The
    worker's runner calls it as it calls a class: ``wrapper(*args, **kwargs)`` sets the
    environment, loads the class and returns the instance; it then looks at its members for
    ``async def`` methods, which are the class's (``__dir__`` and ``__getattr__``; the
    wrapper's own attributes have names no class of the application uses)."""

    def __init__(self, class_bytes, env_vars, archive, digest):
        self._escher_class_bytes = class_bytes
        self._escher_env_vars = dict(env_vars)
        self._escher_archive = archive
        self._escher_digest = digest

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_escher_cls", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __call__(self, *args, **kwargs):
        import pickle

        os.environ.update(self._escher_env_vars)
        if self._escher_archive is not None:
            folder = _unpacked(self._escher_archive, self._escher_digest)
            os.chdir(folder)
            sys.path.insert(0, folder)
        cls = pickle.loads(self._escher_class_bytes)
        self._escher_cls = cls
        return cls(*args, **kwargs)

    def __dir__(self):
        cls = self.__dict__.get("_escher_cls")
        return dir(cls) if cls is not None else list(self.__dict__)

    def __getattr__(self, name):
        cls = self.__dict__.get("_escher_cls")
        if cls is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls, name)
