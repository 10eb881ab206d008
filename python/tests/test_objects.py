"""Objects from Python: ``escher.put`` and ``escher.get`` of values of 0 B to 100 MiB
(checksums compared), the out-of-band layout (protocol 5: the buffers of ``bytes``,
``bytearray``, ``memoryview`` and NumPy arrays beside the pickle, read back as views where the
type allows), references as arguments of remote functions and actor methods (resolved by the
worker; inside a list they stay references), through a chain of tasks, and the errors: a
freed object, an unknown one, another namespace's, an unpicklable value. Then, against real
``escher-head`` and ``escher-worker`` processes (each store in a folder of its own under
``/dev/shm``): a 100 MiB object read by tasks on both workers, a released object's bytes
leaving its store, ``ObjectLostError`` once the only holder is SIGKILLed, a value larger
than the store, a NumPy array argument mapped from the store's file by the task (no fetch,
no copy: the task's private memory stays far below the array's size), and one a driver on
the holder's machine reads (the store's file lent and mapped, not fetched); a task's large return
value kept on its worker, rebuilt by lineage or lost with it; a driver's objects (its puts and
its tasks' large results) released when it calls ``escher.shutdown()`` and when its interpreter
exits, the store back to where it started."""

import gc
import hashlib
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tempfile

import numpy
import pytest

import escher
from escher import _objects

from conftest import run_python
from test_processes import binary, others_can_run, wait_until

MIB = 1 << 20


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


@escher.remote
def digest(value):
    return type(value).__name__, hashlib.sha256(value).hexdigest()


@escher.remote
def digest_inside(box):
    # A reference inside a list stays a reference: read here.
    kind = type(box[0]).__name__
    return kind, hashlib.sha256(escher.get(box[0])).hexdigest()


@escher.remote
def chain(box, depth):
    """Passes the (borrowed) reference on through ``depth`` more tasks, the last reads it."""
    if depth == 0:
        return hashlib.sha256(escher.get(box[0])).hexdigest(), depth
    return escher.get(chain.remote(box, depth - 1))


@escher.remote
def read_inside(box):
    """Reads the reference inside ``box`` (not an argument: the task's own ``escher.get``);
    the error it raised, by name, when it cannot."""
    try:
        return "read", hashlib.sha256(escher.get(box[0])).hexdigest()
    except escher.EscherError as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("size", [0, 1024, MIB, 100 * MIB])
def test_put_and_get_keep_every_byte(cluster, size):
    value = os.urandom(size)
    ref = escher.put(value)
    assert isinstance(ref, escher.ObjectRef)
    back = escher.get(ref)
    assert type(back) is bytes and len(back) == size and sha(back) == sha(value)
    assert sha(ref.get()) == sha(value)
    # The object holds the pickle and the buffer beside it, not a pickled copy of it.
    assert ref.size < size + 4096


@pytest.mark.parametrize("size", [0, 1024, MIB, 100 * MIB])
def test_a_put_to_a_worker_on_this_machine_is_handed_over_as_a_sealed_file(cluster, size):
    raw = os.urandom(size)
    array = numpy.frombuffer(raw, dtype=numpy.uint8).copy()
    ref = escher.put({"array": array, "raw": raw})
    # The worker took the memfd the parts were written into; nothing was streamed.
    assert ref._owned.handed_over
    back = escher.get(ref)
    assert sha(back["raw"]) == sha(raw) and sha(back["array"].tobytes()) == sha(raw)
    # The head recorded the checksum of the bytes the worker sealed.
    info_size, crc, holders = escher._escher.object_info(escher._api._current(), *ref._id)
    assert info_size == ref.size and len(holders) == 1
    assert crc == ref._owned.checksum
    # A handed-over object is an argument as any other.
    plain = escher.put(raw)
    assert plain._owned.handed_over
    assert escher.get(digest.remote(plain)) == ("bytes", sha(raw))


def test_with_handing_over_off_a_put_is_streamed_and_arrives_whole(cluster, monkeypatch):
    monkeypatch.setenv("ESCHER_PUT_HANDOVER", "off")
    for size in (0, 1024, 3 * MIB):
        value = os.urandom(size)
        ref = escher.put(value)
        assert not ref._owned.handed_over
        assert sha(escher.get(ref)) == sha(value)
    monkeypatch.setenv("ESCHER_PUT_HANDOVER", "on")
    ref = escher.put(b"again")
    assert ref._owned.handed_over and escher.get(ref) == b"again"


def test_buffers_travel_beside_the_pickle_and_come_back_as_views(cluster):
    raw = os.urandom(MIB)
    array = numpy.frombuffer(raw, dtype=numpy.float64).reshape(256, 512).copy()
    value = {"bytes": raw, "bytearray": bytearray(raw), "view": memoryview(raw).cast("d"),
             "array": array, "small": b"x" * 10}
    data = _objects.serialize(value)
    _magic, nbuf, _pad, plen = _objects._HEAD.unpack_from(data, 0)
    assert nbuf == 4 and plen < 4096, (nbuf, plen)
    back = _objects.deserialize(data)
    assert type(back["bytes"]) is bytes and back["bytes"] == raw
    assert type(back["bytearray"]) is bytearray and back["bytearray"] == raw
    assert type(back["view"]) is memoryview and back["view"].format == "d"
    assert back["view"].tobytes() == raw and back["view"].readonly
    assert back["array"].tobytes() == array.tobytes() and back["array"].shape == (256, 512)
    # The array is a view of the object's bytes (no copy), read-only as they are.
    assert not back["array"].flags.owndata and not back["array"].flags.writeable
    assert numpy.shares_memory(back["array"], numpy.frombuffer(data, dtype=numpy.uint8))
    # Through a worker's store: the same values.
    got = escher.get(escher.put(value))
    assert got["bytes"] == raw and got["array"].tobytes() == raw and got["small"] == b"x" * 10


def test_a_reference_argument_is_read_by_the_worker_one_inside_a_list_stays_one(cluster):
    value = os.urandom(MIB)
    ref = escher.put(value)
    assert escher.get(digest.remote(ref)) == ("bytes", sha(value))
    assert escher.get(digest_inside.remote([ref])) == ("ObjectRef", sha(value))
    # Put once, passed to many.
    assert escher.get([digest.remote(ref) for _ in range(8)]) == [("bytes", sha(value))] * 8
    assert escher.get(digest.remote(value=ref)) == ("bytes", sha(value))


def test_a_reference_passes_through_a_chain_of_tasks(cluster):
    value = os.urandom(MIB)
    ref = escher.put(value)
    assert escher.get(chain.remote([ref], 3)) == (sha(value), 0)


@escher.remote
class Holder:
    def __init__(self, first):
        self.first = first

    def first_digest(self):
        return sha(self.first)

    def digest(self, value):
        return type(value).__name__, sha(value)

    def digest_inside(self, box):
        return type(box[0]).__name__, sha(escher.get(box[0]))


def test_references_reach_an_actor(cluster):
    one, two = os.urandom(MIB), os.urandom(2 * MIB)
    a, b = escher.put(one), escher.put(two)
    holder = Holder.remote(a)
    assert escher.get(holder.first_digest.remote()) == sha(one)
    assert escher.get(holder.digest.remote(b)) == ("bytes", sha(two))
    assert escher.get(holder.digest_inside.remote([b])) == ("ObjectRef", sha(two))
    escher.kill(holder)


def test_a_freed_object_and_an_unknown_one_are_refused_by_name(cluster):
    ref = escher.put(b"soon gone" * 1000)
    owner, index = ref.id
    # Read by tasks first (their interpreters keep what they read, and must refuse it once
    # freed all the same).
    expected = ("bytes", sha(b"soon gone" * 1000))
    assert escher.get([digest.remote(ref) for _ in range(4)]) == [expected] * 4
    del ref
    gc.collect()
    borrowed = escher.ObjectRef(owner, index)

    def freed():
        try:
            escher.get(borrowed)
        except escher.NotFoundError as e:
            return str(e)
        return None

    text = wait_until(freed, "the object to be released")
    assert f"{owner}.{index}" in text and "freed" in text, text
    with pytest.raises(escher.NotFoundError, match="unknown|no object"):
        escher.get(escher.ObjectRef(owner + 1000, 0))
    # A task given the freed reference fails with the same error, named.
    with pytest.raises(escher.NotFoundError, match="freed"):
        escher.get(digest.remote(borrowed))
    # A task that reads it itself (its worker asked for it) gets that error too.
    kind, text = escher.get(read_inside.remote([borrowed]))
    assert kind == "NotFoundError" and f"{owner}.{index}" in text and "freed" in text, text


def test_another_namespaces_reference_is_unknown(cluster):
    ref = escher.put(b"ours" * 1000)
    owner, index = ref.id
    token = escher.create_token("app", "objects-elsewhere")
    done = run_python(
        "import escher\n"
        f"escher.init({cluster.head_url!r}, token={token!r})\n"
        "try:\n"
        f"    escher.get(escher.ObjectRef({owner}, {index}))\n"
        "except escher.NotFoundError as e:\n"
        "    print('refused:', e)\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused:" in done.stdout and f"{owner}.{index}" in done.stdout, done.stdout
    assert escher.get(ref) == b"ours" * 1000


def test_bad_puts_are_refused(cluster):
    import threading

    with pytest.raises(escher.InvalidArgumentError, match="cannot pickle"):
        escher.put(threading.Lock())
    ref = escher.put(1)
    with pytest.raises(escher.InvalidArgumentError, match="ObjectRef"):
        escher.put(ref)
    # A reference pickled here is a borrowed one: its copy never releases the object.
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref and copy.size is None
    del copy
    gc.collect()
    assert escher.get(ref) == 1


# ------------------------------------------------------------------------------------------
# Real processes


def store_bytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def object_cluster(tmp_path):
    """``start(stores, head_args=())``: a head (with ``head_args`` more) and one worker per
    entry of ``stores`` (its ``--object-store-memory``), each with its store in a folder of its
    own under ``/dev/shm`` and a resource of its name (``w0=1``, ...); killed and removed at the
    end."""
    shm = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-objects-", dir="/dev/shm"))
    shm.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, ESCHER_HOME=str(home), ESCHER_PYTHON=sys.executable,
               ESCHER_PYTHON_SLOTS="2")
    for key in ("ESCHER_HEAD", "ESCHER_TOKEN", "ESCHER_TASK_TOKEN", "ESCHER_NAMESPACE"):
        env.pop(key, None)
    started = []

    def start_proc(args, name):
        log = open(tmp_path / f"{name}.log", "wb")
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        started.append(proc)
        return proc

    def start(stores, head_args=()):
        address = tmp_path / "head-url"
        start_proc([binary("escher-head"), "--listen", "127.0.0.1:0", "--address-file",
                    str(address), "--heartbeat-interval-ms", "500",
                    "--heartbeat-timeout-ms", "8000", *head_args], "head")
        url = wait_until(lambda: address.exists() and address.read_text().strip(), "the head")
        users = [] if others_can_run(sys.executable) else ["--task-uids", "off"]
        workers = {}
        for i, capacity in enumerate(stores):
            folder = shm / f"w{i}"
            folder.mkdir()
            workers[f"w{i}"] = (start_proc(
                [binary("escher-worker"), "--head", url, "--name", f"w{i}", "--resources",
                 f"cpu=2,w{i}=1", "--object-store-memory", str(capacity),
                 "--object-store-dir", str(folder), *users], f"w{i}"), folder)
        return {"url": url, "workers": workers, "env": dict(env, ESCHER_HEAD=url),
                "logs": tmp_path}

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    subprocess.run(["rm", "-rf", str(shm)], check=False)


PROLOGUE = r'''
import hashlib, os, pathlib, sys, time
import escher
escher.init()
deadline = time.time() + 60
while len(escher.nodes()) < int(sys.argv[1] if len(sys.argv) > 1 else 2):
    assert time.time() < deadline, "the workers never joined"
    time.sleep(0.1)
'''


def test_objects_between_worker_processes(object_cluster):
    cluster = object_cluster([512 * MIB, 512 * MIB])
    stores = {name: folder for name, (_proc, folder) in cluster["workers"].items()}
    signals = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-objects-signals-"))
    code = PROLOGUE + r'''
signals = pathlib.Path(os.environ["SIGNALS"])

@escher.remote
def digest(value):
    return int(os.environ["ESCHER_NODE_ID"]), hashlib.sha256(value).hexdigest()

value = os.urandom(100 << 20)
ref = escher.put(value)
# Read by a task on each worker: on one of them the object is another worker's.
pinned = [digest.options(resources={"cpu": 1, w: 1}).remote(ref) for w in ("w0", "w1")]
got = escher.get(pinned, timeout=240)
assert len({node for node, _ in got}) == 2, got
assert all(d == hashlib.sha256(value).hexdigest() for _, d in got), got
print("both workers read it", flush=True)
# The calls' refs keep the object too: gone with them.
del ref, value, pinned
(signals / "released").write_text("1")
while not (signals / "counted").exists():
    time.sleep(0.05)

lost = escher.put(b"only copy" * 100000)
print("lost id %d.%d" % lost.id, flush=True)
(signals / "put").write_text("1")
while not (signals / "killed").exists():
    time.sleep(0.05)
deadline = time.time() + 60
while True:
    try:
        escher.get(lost)
    except escher.ObjectLostError as e:
        print("lost:", e, flush=True)
        break
    assert time.time() < deadline, "the object was never reported lost"
    time.sleep(0.2)

@escher.remote
def read_inside(box):
    try:
        return "read", len(escher.get(box[0]))
    except escher.EscherError as e:
        return type(e).__name__, str(e)

# A task on the worker left reads it itself: its worker is told the same, and so is the task.
survivor = "w1" if (signals / "killed").read_text() == "w0" else "w0"
kind, text = escher.get(
    read_inside.options(resources={"cpu": 1, survivor: 1}).remote([lost]), timeout=120)
print("in a task:", kind, text, flush=True)
'''
    env = dict(cluster["env"], SIGNALS=str(signals))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (signals / "released").exists() or proc.poll() is not None,
                   "the driver's first part", 300)
        assert proc.poll() is None, proc.communicate()
        # The 100 MiB object's copy leaves its store once the driver dropped its reference
        # (the tasks that read it held it in their interpreters' memory, not in a store).
        wait_until(lambda: all(store_bytes(f) < MIB for f in stores.values()),
                   "the stores to be emptied", 60)
        (signals / "counted").write_text("1")
        wait_until(lambda: (signals / "put").exists() or proc.poll() is not None,
                   "the put of the only copy", 120)
        holder = wait_until(
            lambda: next((n for n, f in stores.items() if store_bytes(f) > 0), None),
            "the copy in a store")
        victim = cluster["workers"][holder][0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        (signals / "killed").write_text(holder)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run(["rm", "-rf", str(signals)], check=False)
    assert proc.returncode == 0, out + err
    assert "both workers read it" in out, out + err
    assert "lost:" in out and "node" in out, out
    lost = out.split("lost id ")[1].split()[0]
    assert f"in a task: ObjectLostError object {lost} " in out, out


def test_a_value_larger_than_the_store_is_refused_by_name(object_cluster):
    cluster = object_cluster([4 * MIB])
    code = PROLOGUE + r'''
try:
    escher.put(os.urandom(8 << 20))
except escher.EscherError as e:
    print(type(e).__name__, e)
ref = escher.put(b"fits" * 1000)
print("then", escher.get(ref) == b"fits" * 1000)
'''
    done = subprocess.run([sys.executable, "-c", code, "1"], env=cluster["env"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "object-store-memory" in done.stdout and "object" in done.stdout, done.stdout
    assert "then True" in done.stdout, done.stdout


def test_a_large_return_value_stays_on_its_worker_and_is_rebuilt_or_lost_with_it(object_cluster):
    """A task's 1 MiB return value stays in its worker's store (the file ``TASK.0.*``); its
    holder SIGKILLed, a task with a retry left runs again and ``get`` returns the same bytes
    (then passed to another task, worker to worker), one with none raises ObjectLostError."""
    cluster = object_cluster([64 * MIB, 64 * MIB, 64 * MIB])
    stores = {name: folder for name, (_proc, folder) in cluster["workers"].items()}
    signals = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-results-signals-"))
    code = PROLOGUE + r'''
signals = pathlib.Path(os.environ["SIGNALS"])

def value(n, seed):
    return bytes((i * 31 + seed) % 256 for i in range(n))

@escher.remote
def make(n, seed):
    return value(n, seed)

@escher.remote
def digest(v):
    return hashlib.sha256(v).hexdigest()

keep = make.options(max_retries=1).remote(1 << 20, 3)
once = make.options(max_retries=0).remote(1 << 20, 4)
ready, _ = escher.wait([keep, once], num_returns=2, timeout=120)
assert len(ready) == 2, ready
(signals / "made").write_text(f"{keep.id} {once.id}")
while not (signals / "killed").exists():
    time.sleep(0.05)
want = hashlib.sha256(value(1 << 20, 3)).hexdigest()
assert hashlib.sha256(escher.get(keep, timeout=120)).hexdigest() == want
print("rebuilt", flush=True)
assert escher.get(digest.remote(keep), timeout=120) == want
print("passed on", flush=True)
try:
    escher.get(once, timeout=120)
except escher.ObjectLostError as e:
    print("lost:", e, flush=True)
'''
    env = dict(cluster["env"], SIGNALS=str(signals))
    proc = subprocess.Popen([sys.executable, "-c", code, "3"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (signals / "made").exists() or proc.poll() is not None,
                   "the two results", 240)
        assert proc.poll() is None, proc.communicate()
        keep, once = (signals / "made").read_text().split()

        def holder(task):
            return next((n for n, f in stores.items() if any(f.glob(f"**/{task}.0.*"))), None)

        holders = {holder(keep), holder(once)}
        assert None not in holders, holders
        # The head never carried the bytes: they are in exactly those stores.
        for name in holders:
            victim = cluster["workers"][name][0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        (signals / "killed").write_text("1")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run(["rm", "-rf", str(signals)], check=False)
    assert proc.returncode == 0, out + err
    assert "rebuilt" in out and "passed on" in out, out + err
    assert "lost:" in out and f"{once}.0" in out and "no retry left" in out, out + err


OWNER = PROLOGUE + r'''
signals = pathlib.Path(os.environ["SIGNALS"])
how = sys.argv[2]

@escher.remote
def make(n, seed):
    return bytes([seed]) * n

held = [escher.put(os.urandom(2 << 20))]
# Their results belong to the driver's session, which escher.init() opened.
held += [make.remote(1 << 20, seed) for seed in (1, 2)]
ready, _ = escher.wait(held[1:], num_returns=2, timeout=120)
assert len(ready) == 2, ready
(signals / f"held-{how}").write_text("1")
while not (signals / f"seen-{how}").exists():
    time.sleep(0.05)
if how == "shutdown":
    escher.shutdown()
    (signals / "closed").write_text("1")
    while not (signals / "counted").exists():
        time.sleep(0.05)
    print("still holding", len(held), flush=True)
# else: the interpreter exits, holding them.
'''


def test_a_drivers_objects_and_task_results_go_at_shutdown_and_at_exit(object_cluster):
    """A driver that put a value and holds two tasks' 1 MiB results (kept in the worker's
    store) releases all three when it calls ``escher.shutdown()``, while it still holds their
    references; a driver that just ends (the interpreter's exit) releases them too. The head's
    lapse is ten minutes, so it is the close that releases them, not the lapse."""
    cluster = object_cluster([64 * MIB], head_args=("--object-session-lapse", "10m"))
    (_proc, store), = cluster["workers"].values()
    start = store_bytes(store)
    signals = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-shutdown-signals-"))
    env = dict(cluster["env"], SIGNALS=str(signals))

    def driver(how, then):
        proc = subprocess.Popen([sys.executable, "-c", OWNER, "1", how], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: (signals / f"held-{how}").exists() or proc.poll() is not None,
                       "the driver's objects", 240)
            assert proc.poll() is None, proc.communicate()
            # The put and both results are in the store.
            assert store_bytes(store) >= start + (4 << 20), store_bytes(store)
            (signals / f"seen-{how}").write_text("1")
            then(proc)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, out + err
        return out

    def while_it_lives(proc):
        # escher.shutdown(): released while the driver still lives and holds the references.
        wait_until(lambda: (signals / "closed").exists() or proc.poll() is not None,
                   "the driver's shutdown", 120)
        assert proc.poll() is None, proc.communicate()
        wait_until(lambda: store_bytes(store) <= start, "the store to return to its start", 60)
        (signals / "counted").write_text("1")

    try:
        out = driver("shutdown", while_it_lives)
        assert "still holding 3" in out, out
        # The interpreter's exit, no shutdown called: the same.
        driver("exit", lambda proc: proc.wait(timeout=120))
        wait_until(lambda: store_bytes(store) <= start, "the store to return to its start", 60)
    finally:
        subprocess.run(["rm", "-rf", str(signals)], check=False)


RETURNED = PROLOGUE + r'''
import gc
signals = pathlib.Path(os.environ["SIGNALS"])
MIB = 1 << 20

def sha(data):
    return hashlib.sha256(data).hexdigest()

@escher.remote
def make(n):
    # A put the task drops (its own copy releases it) and one it returns (the caller's).
    scratch = escher.put(os.urandom(n))
    del scratch
    data = os.urandom(n)
    return escher.put(data), sha(data)

@escher.remote
def make_many(k, n):
    made = [os.urandom(n) for _ in range(k)]
    return [(escher.put(data), sha(data)) for data in made]

@escher.remote
def pass_back(box):
    # A reference the task was given (inside a list: not read) and returns.
    return box[0]

@escher.remote
def through(n):
    # A task's task puts and returns a reference; this task returns it on.
    return escher.get(make.remote(n))

@escher.remote
def busy(i):
    return i

one, one_sha = escher.get(make.remote(MIB), timeout=120)
many = escher.get(make_many.remote(3, MIB), timeout=120)
mine_data = os.urandom(MIB)
mine = escher.put(mine_data)
back = escher.get(pass_back.remote([mine]), timeout=120)
del mine  # the returned reference alone keeps it now
deep, deep_sha = escher.get(through.remote(MIB), timeout=120)
kept_by = make.remote(MIB)
first, kept_sha = escher.get(kept_by, timeout=120)
del first  # its TaskRef keeps the result's references
gc.collect()
# The workers' interpreters move on to other tasks (each task's session to the head ends).
assert escher.get([busy.remote(i) for i in range(40)], timeout=120) == list(range(40))
assert sha(escher.get(one)) == one_sha
assert [sha(escher.get(ref)) for ref, _ in many] == [digest for _, digest in many]
assert sha(escher.get(back)) == sha(mine_data)
assert sha(escher.get(deep)) == deep_sha
again, _ = escher.get(kept_by, timeout=120)
assert sha(escher.get(again)) == kept_sha
print("read", 6, flush=True)
(signals / "held").write_text("1")
while not (signals / "seen").exists():
    time.sleep(0.05)
del one, many, back, deep, again, kept_by
gc.collect()
(signals / "dropped").write_text("1")
while not (signals / "counted").exists():
    time.sleep(0.05)
print("done", flush=True)
'''


def test_references_a_task_puts_or_borrows_and_returns_outlive_it(object_cluster):
    """Ray's borrowing: a reference a task puts and returns (alone, in a list, or through a
    task of its own), or was given and returns, reads back whole in the driver after the
    task's worker ran 40 other tasks, and after the driver dropped its own reference (the
    returned one keeps it), and while the TaskRef lives the result's references stay; once
    the driver drops every reference the worker's store returns to its start while the
    driver still runs (released by reference count, not by its session's end: the lapse is
    ten minutes)."""
    cluster = object_cluster([256 * MIB], head_args=("--object-session-lapse", "10m"))
    (_proc, store), = cluster["workers"].values()
    start = store_bytes(store)
    signals = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-returned-signals-"))
    env = dict(cluster["env"], SIGNALS=str(signals))
    proc = subprocess.Popen([sys.executable, "-c", RETURNED, "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (signals / "held").exists() or proc.poll() is not None,
                   "the driver's reads", 300)
        assert proc.poll() is None, proc.communicate()
        # one, three in a list, the driver's own, one through a task, one kept by a TaskRef.
        assert store_bytes(store) >= start + 7 * MIB, store_bytes(store)
        (signals / "seen").write_text("1")
        wait_until(lambda: (signals / "dropped").exists() or proc.poll() is not None,
                   "the driver to drop its references", 120)
        assert proc.poll() is None, proc.communicate()
        wait_until(lambda: store_bytes(store) <= start, "the store to return to its start", 60)
        (signals / "counted").write_text("1")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run(["rm", "-rf", str(signals)], check=False)
    assert proc.returncode == 0, out + err
    assert "read 6" in out and "done" in out, out + err


KILLED = PROLOGUE + r'''
signals = pathlib.Path(os.environ["SIGNALS"])

@escher.remote
def make(n, seed):
    return bytes([seed]) * n

# No put: escher.init() opened the driver's session, so the results belong to it.
held = [make.remote(1 << 20, seed) for seed in (1, 2)]
ready, _ = escher.wait(held, num_returns=2, timeout=120)
assert len(ready) == 2, ready
(signals / "held").write_text("1")
while True:
    time.sleep(1)
'''


def test_a_killed_driver_that_never_put_leaves_no_task_result_behind(object_cluster):
    """A driver that never put, holding two tasks' 1 MiB results (kept in the worker's store),
    is SIGKILLed: it closes nothing, yet once its session lapses at the head (2 s here) the
    results leave the store, because ``escher.init()`` opened the session they belong to."""
    cluster = object_cluster([64 * MIB], head_args=("--object-session-lapse", "2s"))
    (_proc, store), = cluster["workers"].values()
    start = store_bytes(store)
    signals = pathlib.Path(tempfile.mkdtemp(prefix="escher-py-killed-signals-"))
    env = dict(cluster["env"], SIGNALS=str(signals))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (signals / "held").exists() or proc.poll() is not None,
                   "the driver's results", 240)
        assert proc.poll() is None, proc.communicate()
        assert store_bytes(store) >= start + (2 << 20), store_bytes(store)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        wait_until(lambda: store_bytes(store) <= start, "the store to return to its start", 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        subprocess.run(["rm", "-rf", str(signals)], check=False)


INSPECT = r"""
import numpy

@escher.remote
def inspect(array):
    # Which file the array's pages are a mapping of, from this process's own map.
    address = array.__array_interface__["data"][0]
    mapped = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi and len(parts) >= 6:
                mapped = parts[5]
    digest = hashlib.sha256(array).hexdigest()  # reads every page
    with open("/proc/self/status") as status:
        anon = next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon:"))
    return (int(os.environ["ESCHER_NODE_ID"]), mapped, digest, anon,
            bool(array.flags.owndata), bool(array.flags.writeable))
"""

SAME_NODE = r"""
import json
size = int(os.environ["SIZE"])
array = numpy.random.default_rng(7).integers(0, 255, size=size, dtype=numpy.uint8)
want = hashlib.sha256(array).hexdigest()
ref = escher.put(array)
del array
first, = escher._objects.holders(ref)
# A task on each worker: one holds the copy, the other's worker brings one into its own store.
got = escher.get([inspect.options(resources={"cpu": 1, w: 1}).remote(ref)
                  for w in ("w0", "w1")], timeout=240)
print(json.dumps({"want": want, "first": first, "got": got,
                  "holders": sorted(escher._objects.holders(ref))}), flush=True)
"""


def test_a_numpy_argument_is_mapped_from_its_nodes_store_with_no_copy(object_cluster):
    import json

    size = 256 * MIB
    cluster = object_cluster([size + 64 * MIB, size + 64 * MIB])
    stores = {name: str(folder) for name, (_proc, folder) in cluster["workers"].items()}
    env = dict(cluster["env"], SIZE=str(size))
    done = subprocess.run([sys.executable, "-c", PROLOGUE + INSPECT + SAME_NODE], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    nodes = set()
    for worker, (node, mapped, digest, anon, owndata, writeable) in zip(("w0", "w1"), out["got"]):
        nodes.add(node)
        assert digest == out["want"], (worker, digest)
        # The array is the worker's store's sealed file, mapped: not a copy in the task's memory.
        assert mapped is not None and mapped.startswith(stores[worker] + "/"), (worker, mapped)
        assert not owndata and not writeable, (worker, owndata, writeable)
        assert anon < size // 2, f"{worker}: {anon} private bytes for a {size}-byte array"
    assert len(nodes) == 2 and out["first"] in nodes, out
    # The worker that had no copy fetched one into its store, and the head knows it.
    assert sorted(out["holders"]) == sorted(nodes), out


DRIVER_GET = r"""
import json
import numpy
size = int(os.environ["SIZE"])
array = numpy.random.default_rng(5).integers(0, 255, size=size, dtype=numpy.uint8)
want = hashlib.sha256(array).hexdigest()
ref = escher.put(array)
del array

def anon():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon:"))

before = anon()
back = escher.get(ref)
address = back.__array_interface__["data"][0]
mapped = None
with open("/proc/self/maps") as maps:
    for line in maps:
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi and len(parts) >= 6:
            mapped = parts[5]
digest = hashlib.sha256(back).hexdigest()  # reads every page
print(json.dumps({"want": want, "digest": digest, "mapped": mapped, "grown": anon() - before,
                  "owndata": bool(back.flags.owndata), "writeable": bool(back.flags.writeable),
                  "size": int(back.nbytes)}), flush=True)
"""


def test_a_drivers_get_on_the_holders_machine_maps_its_store_file_with_no_copy(object_cluster):
    """A driver on the holder's machine reads a 128 MiB NumPy array with ``escher.get``: the
    worker lends the object's sealed file and the driver maps it, so the array is a read-only
    view of the store's own pages (not owning its data), and the driver's private memory does
    not grow by the array's size even once every byte was read."""
    import json

    size = 128 * MIB
    cluster = object_cluster([size + 64 * MIB])
    (_proc, folder), = cluster["workers"].values()
    env = dict(cluster["env"], SIZE=str(size))
    done = subprocess.run([sys.executable, "-c", PROLOGUE + DRIVER_GET, "1"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["digest"] == out["want"] and out["size"] == size, out
    assert out["mapped"] is not None and out["mapped"].startswith(str(folder) + "/"), out
    assert not out["owndata"] and not out["writeable"], out
    assert out["grown"] < size // 4, f"{out['grown']} private bytes for a {size}-byte array"


INSPECT_INSIDE = r"""
import numpy

@escher.remote
def inspect_inside(box):
    # The task's own escher.get: the reference is inside a list, not an argument.
    with open("/proc/self/status") as status:
        before = next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon:"))
    array = escher.get(box[0])
    address = array.__array_interface__["data"][0]
    mapped = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi and len(parts) >= 6:
                mapped = parts[5]
    digest = hashlib.sha256(array).hexdigest()  # reads every page
    with open("/proc/self/status") as status:
        after = next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon:"))
    return (int(os.environ["ESCHER_NODE_ID"]), mapped, digest, after - before,
            bool(array.flags.writeable))

@escher.remote
def where():
    return int(os.environ["ESCHER_NODE_ID"])
"""

OTHER_NODE = r"""
import json
size = int(os.environ["SIZE"])
array = numpy.random.default_rng(11).integers(0, 255, size=size, dtype=numpy.uint8)
want = hashlib.sha256(array).hexdigest()
ref = escher.put(array)
del array
first, = escher._objects.holders(ref)
nodes = {w: escher.get(where.options(resources={"cpu": 1, w: 1}).remote()) for w in ("w0", "w1")}
other = next(w for w, node in nodes.items() if node != first)
# Twice on the node with no copy: the first task's worker brings one, the second maps it.
got = [escher.get(inspect_inside.options(resources={"cpu": 1, other: 1}).remote([ref]),
                  timeout=240) for _ in range(2)]
print(json.dumps({"want": want, "first": first, "other": other, "node": nodes[other],
                  "got": got, "holders": sorted(escher._objects.holders(ref))}), flush=True)
"""


def test_a_tasks_own_get_maps_a_copy_its_worker_brought_into_its_nodes_store(object_cluster):
    """A task on the node without a copy reads a 100 MiB NumPy array with ``escher.get`` of
    a reference inside a list (not an argument): its worker brings a copy into its own store
    (the head then names that node a holder) and the task maps it, its private memory not
    grown by the array; a second task there maps the same file, with no fetch."""
    import json

    size = 100 * MIB
    cluster = object_cluster([size + 64 * MIB, size + 64 * MIB])
    stores = {name: str(folder) for name, (_proc, folder) in cluster["workers"].items()}
    env = dict(cluster["env"], SIZE=str(size))
    done = subprocess.run([sys.executable, "-c", PROLOGUE + INSPECT_INSIDE + OTHER_NODE],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    files = set()
    for node, mapped, digest, grown, writeable in out["got"]:
        assert node == out["node"], out
        assert digest == out["want"], digest
        # The array is the sealed file of that node's store, mapped: not a copy in the task.
        assert mapped is not None and mapped.startswith(stores[out["other"]] + "/"), mapped
        assert not writeable
        assert grown < size // 4, f"{grown} private bytes grown for a {size}-byte array"
        files.add(mapped)
    # The second task mapped the copy the first one's get brought: the same file.
    assert len(files) == 1, files
    assert sorted(out["holders"]) == sorted([out["first"], out["node"]]), out


def test_a_tasks_large_result_is_read_where_it_was_made_from_the_store():
    """A task given another's TaskRef (dataflow) whose result is kept as an object (above
    100 KiB) is placed on the worker that made it, and reads it from that node's store (the
    worker hands the interpreter the sealed file, not the bytes through its pipe): the values
    arrive whole, bytes and a NumPy array."""
    done = run_python(r'''
import hashlib, os
import numpy
import escher
escher.init(num_workers=2, resources={"cpu": 2})
nodes = escher.nodes()
for i, node in enumerate(nodes):
    escher.set_resource(f"at-{i}", 1, escher.Node(node))

def value(seed):
    return bytes((i * 7 + seed) % 256 for i in range(1 << 20))

@escher.remote
def make(seed):
    return int(os.environ["ESCHER_NODE_ID"]), value(seed), numpy.arange(1 << 18) * seed

@escher.remote
def read(made):
    made_on, data, array = made
    return (made_on, int(os.environ["ESCHER_NODE_ID"]), hashlib.sha256(data).hexdigest(),
            int(array.sum()))

for k in range(2):
    for _ in range(2):
        made = make.options(resources={"cpu": 1, f"at-{k}": 1}).remote(k + 1)
        made_on, read_on, digest, total = escher.get(read.remote(made), timeout=120)
        assert made_on == nodes[k], (made_on, nodes)
        assert read_on == made_on, ("not placed where its argument's result is", read_on, made_on)
        assert digest == hashlib.sha256(value(k + 1)).hexdigest()
        assert total == (k + 1) * sum(range(1 << 18)), total
print("read where made")
''')
    assert done.returncode == 0, done.stdout + done.stderr
    assert "read where made" in done.stdout, done.stdout + done.stderr


ACTOR_RESULTS = PROLOGUE + r'''
import gc, json, subprocess
import numpy

store = pathlib.Path(os.environ["STORE_W0"])

def value(n, seed):
    return numpy.random.default_rng(seed).bytes(n)

@escher.remote
class Maker:
    def where(self):
        return int(os.environ["ESCHER_NODE_ID"])

    def big(self, n, seed):
        return value(n, seed)

    def array(self, n):
        return numpy.arange(n, dtype=numpy.uint32)

    def small(self):
        return b"s" * 1000

@escher.remote
def digest(v):
    return int(os.environ["ESCHER_NODE_ID"]), hashlib.sha256(v).hexdigest()

def listed():
    out = subprocess.run([os.environ["ESCHER_CLI"], "objects", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return {row["id"]: row for row in json.loads(out)}

def files(object_id):
    return list(store.glob("**/%d.%d.*" % object_id))

maker = Maker.options(resources={"w0": 1}).remote()
node = escher.get(maker.where.remote(), timeout=120)
want = hashlib.sha256(value(4 << 20, 3)).hexdigest()

ref = maker.big.remote(4 << 20, 3)
assert hashlib.sha256(escher.get(ref, timeout=120)).hexdigest() == want
kept = ref._object()
assert kept is not None, "a 4 MiB result came back inline"
row = listed()["%d.%d" % kept.id]
assert row["holders"] == [node] and row["size"] > 4 << 20, row
assert row["owner"].startswith("session"), row
assert files(kept.id), "not in the actor's node's store"
print("kept on the actor's node", flush=True)

# Passed to a task on the other worker: read there, worker to worker, not through this driver.
ran, got = escher.get(digest.options(resources={"cpu": 1, "w1": 1}).remote(ref), timeout=120)
assert ran != node and got == want, (ran, node, got, want)
assert node in escher._objects.holders(kept) and ran in escher._objects.holders(kept)
print("read by a task on the other worker", flush=True)

@escher.remote
class Reader:
    def digest(self, v):
        return int(os.environ["ESCHER_NODE_ID"]), hashlib.sha256(v).hexdigest()

# And to another actor, whose interpreter reads it from its own node's store.
reader = Reader.options(resources={"w1": 1}).remote()
ran, got = escher.get(reader.digest.remote(ref), timeout=120)
assert ran != node and got == want, (ran, node, got, want)
print("read by an actor on the other worker", flush=True)

array = maker.array.remote(1 << 20)
back = escher.get(array, timeout=120)
assert hashlib.sha256(back).hexdigest() == \
    hashlib.sha256(numpy.arange(1 << 20, dtype=numpy.uint32)).hexdigest()
assert array._object() is not None
print("numpy array", flush=True)

before = set(listed())
small = maker.small.remote()
assert escher.get(small, timeout=120) == b"s" * 1000
assert small._object() is None and set(listed()) == before
print("small inline", flush=True)

object_id = kept.id
del ref, kept, array, back
gc.collect()
deadline = time.time() + 60
while "%d.%d" % object_id in listed() or files(object_id):
    assert time.time() < deadline, "the dropped result was never freed"
    time.sleep(0.1)
print("freed", flush=True)
'''


def test_an_actor_calls_large_result_stays_on_the_actors_node(object_cluster):
    """An actor method's 4 MiB result stays in the store of the actor's worker: ``get`` returns
    it whole (bytes, and a NumPy array), ``escher objects`` lists it held by the actor's node
    and owned by the driver's session, a task on the other worker given the call's ref reads
    it there (its node then holds a copy too), and so does an actor there given it, a small
    result comes back inline (no object),
    and dropping the ref frees the object (gone from the table and the store)."""
    cluster = object_cluster([64 * MIB, 64 * MIB])
    env = dict(cluster["env"], STORE_W0=str(cluster["workers"]["w0"][1]),
               ESCHER_CLI=binary("escher"))
    done = subprocess.run([sys.executable, "-c", ACTOR_RESULTS], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("kept on the actor's node", "read by a task on the other worker",
                 "read by an actor on the other worker", "numpy array", "small inline",
                 "freed"):
        assert step in done.stdout, done.stdout + done.stderr
