"""Python actors on the embedded cluster: state and order, async and threaded actors, names,
lifetimes, handles passed to tasks, kill, restarts after the interpreter is SIGKILLed, and bad
input. Each test kills what it created that would outlive it (named and detached actors)."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import escher

from conftest import run_python


@escher.remote
class Counter:
    def __init__(self, start=0):
        self.n = start
        self.seen = []
        self.born = time.time_ns()

    def add(self, by=1):
        self.n += by
        self.seen.append(by)
        return self.n

    def get(self):
        return self.n

    def order(self):
        return list(self.seen)

    def identity(self):
        return os.getpid(), self.born

    def fail(self, text):
        raise ValueError(text)

    def chatty(self):
        for i in range(2000):
            print("noise", i, "x" * 50)
        return "quiet"

    def sleep(self, seconds):
        time.sleep(seconds)
        return "slept"


def test_a_counter_keeps_state_and_runs_one_callers_calls_in_order(cluster):
    c = Counter.remote(10)
    refs = [c.add.remote(i) for i in range(200)]
    values = escher.get(refs, timeout=60)
    expected, n = [], 10
    for i in range(200):
        n += i
        expected.append(n)
    assert values == expected
    assert escher.get(c.order.remote()) == list(range(200))
    assert escher.get(c.get.remote()) == 10 + sum(range(200))


@escher.remote
class Log:
    def __init__(self):
        self.seen = []

    def note(self, who, i):
        self.seen.append((who, i))
        return len(self.seen)

    def notes(self):
        return list(self.seen)


def test_each_callers_calls_run_in_its_order_while_others_call_at_once(cluster):
    """Four threads of this driver (one handle) and another driver (a handle from
    ``get_actor``) call one actor at once, each without waiting: every caller's calls ran in
    the order it made them, and none was lost or run twice."""
    log = Log.options(name="ordered-log").remote()
    try:
        escher.get(log.notes.remote(), timeout=60)
        other = subprocess.Popen(
            [sys.executable, "-c",
             "import escher\n"
             f"escher.init(address={cluster.head_url!r}, token={cluster.admin_token!r})\n"
             "h = escher.get_actor('ordered-log')\n"
             "print('calling', flush=True)\n"
             "escher.get([h.note.remote('driver', i) for i in range(200)], timeout=120)\n"],
            env={k: v for k, v in os.environ.items() if not k.startswith("ESCHER_")},
            stdout=subprocess.PIPE, text=True)
        # This driver's callers start once the other one is about to call.
        assert other.stdout.readline().strip() == "calling"

        def caller(who):
            escher.get([log.note.remote(who, i) for i in range(200)], timeout=120)

        threads = [threading.Thread(target=caller, args=(f"thread-{t}",)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert other.wait(timeout=120) == 0
        seen = escher.get(log.notes.remote(), timeout=60)
        callers = {who for who, _ in seen}
        assert callers == {"driver"} | {f"thread-{t}" for t in range(4)}, callers
        for who in callers:
            assert [i for w, i in seen if w == who] == list(range(200)), who
        assert len(seen) == 1000
    finally:
        escher.kill(log)


def test_a_method_that_raises_fails_its_call_only(cluster):
    c = Counter.remote()
    with pytest.raises(ValueError, match="boom") as err:
        escher.get(c.fail.remote("boom"), timeout=60)
    assert "Remote traceback" in str(err.value) and "Counter.fail" in str(err.value)
    assert escher.get(c.add.remote(2), timeout=60) == 2


def test_prints_do_not_corrupt_the_replies(cluster):
    c = Counter.remote()
    assert escher.get(c.chatty.remote(), timeout=60) == "quiet"
    assert escher.get(c.add.remote(1), timeout=60) == 1


def test_calls_are_awaitable_and_waitable(cluster):
    c = Counter.remote()
    slow, fast = c.sleep.remote(0.5), c.get.remote()
    ready, not_ready = escher.wait([slow, fast], num_returns=2, timeout=60)
    assert ready == [slow, fast] and not_ready == []

    async def main():
        return await c.add.remote(3)

    assert asyncio.run(main()) == 3


def _wait_for_file(path, limit=60.0):
    """Waits until ``path`` exists (a call of the actor made it), failing after ``limit``."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@escher.remote
class Gate:
    """A sync actor whose ``block`` runs until the test releases it (a file appears)."""

    def __init__(self):
        self.seen = []

    def block(self, started, release):
        open(started, "w").close()
        while not os.path.exists(release):
            time.sleep(0.01)
        return "released"

    def add(self, n):
        self.seen.append(n)
        return list(self.seen)


def test_a_cancelled_queued_call_is_removed_and_the_others_run_in_order(cluster, tmp_path):
    g = Gate.remote()
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    slow = g.block.remote(started, release)
    first, queued, later = g.add.remote(1), g.add.remote(10), g.add.remote(2)
    _wait_for_file(started)
    # The running call of a sync actor is not interrupted; the queued one is removed, and
    # answered at once (the slow call still runs).
    states = escher.cancel([slow, queued])
    assert states == ["cancel-requested", "cancel-requested"]
    with pytest.raises(escher.TaskCancelledError, match="cancelled before it started"):
        escher.get(queued, timeout=60)
    assert not slow._done()
    open(release, "w").close()
    assert escher.get(slow, timeout=60) == "released"
    assert escher.get([first, later], timeout=60) == [[1], [1, 2]]
    # Cancelling an answered call changes nothing.
    escher.cancel(first)
    assert escher.get(first, timeout=60) == [1]
    assert escher.get(g.add.remote(3), timeout=60) == [1, 2, 3]


@escher.remote
class Sleeper:
    """An async actor whose ``hang`` awaits until it is cancelled."""

    def __init__(self):
        self.cancelled = 0

    async def hang(self, started):
        open(started, "w").close()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "woke"

    async def count(self):
        return self.cancelled


def test_an_async_actors_running_call_is_cancelled(cluster, tmp_path):
    s = Sleeper.remote()
    started = str(tmp_path / "started")
    hung = s.hang.remote(started)
    _wait_for_file(started)
    escher.cancel(hung)
    with pytest.raises(escher.TaskCancelledError, match="cancelled while it ran"):
        escher.get(hung, timeout=60)
    # The actor lives on; its coroutine saw the cancellation.
    assert escher.get(s.count.remote(), timeout=60) == 1


@escher.remote
class Pair:
    """Two coroutines that each wait for the other's event: both finish only if they run
    concurrently on the actor's loop."""

    def __init__(self):
        self.events = {}

    def _event(self, name):
        return self.events.setdefault(name, asyncio.Event())

    async def meet(self, mine, theirs):
        self._event(mine).set()
        await asyncio.wait_for(self._event(theirs).wait(), 30)
        return mine


def test_an_async_actor_runs_its_coroutines_concurrently(cluster):
    p = Pair.remote()
    a, b = p.meet.remote("a", "b"), p.meet.remote("b", "a")
    assert escher.get([a, b], timeout=60) == ["a", "b"]


@escher.remote(max_concurrency=2)
class Threads:
    def __init__(self):
        self.barrier = threading.Barrier(2)

    def meet(self, name):
        # Both calls pass only if they run at once, on two threads.
        self.barrier.wait(timeout=30)
        return name


def test_a_threaded_actor_runs_max_concurrency_calls_at_once(cluster):
    t = Threads.remote()
    assert escher.get([t.meet.remote(1), t.meet.remote(2)], timeout=60) == [1, 2]


def test_a_named_actor_is_found_from_another_driver(cluster):
    c = Counter.options(name="shared-counter").remote(5)
    try:
        assert escher.get(c.add.remote(1), timeout=60) == 6
        out = run_python(
            "import escher\n"
            f"escher.init(address={cluster.head_url!r}, token={cluster.admin_token!r})\n"
            "h = escher.get_actor('shared-counter')\n"
            "print(escher.get(h.add.remote(10), timeout=60))\n"
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "16"
        assert escher.get(c.get.remote(), timeout=60) == 16
    finally:
        escher.kill(c)


def test_a_detached_actor_outlives_its_creator(cluster):
    out = run_python(
        "import escher\n"
        f"escher.init(address={cluster.head_url!r}, token={cluster.admin_token!r})\n"
        "@escher.remote\n"
        "class Box:\n"
        "    def __init__(self, v):\n"
        "        self.v = v\n"
        "    def get(self):\n"
        "        return self.v\n"
        "b = Box.options(name='kept', lifetime='detached').remote('still here')\n"
        "print(escher.get(b.get.remote(), timeout=60))\n"
    )
    assert out.returncode == 0, out.stderr
    h = escher.get_actor("kept")
    try:
        assert escher.get(h.get.remote(), timeout=60) == "still here"
    finally:
        escher.kill(h)
    with pytest.raises(escher.NotFoundError):
        escher.get_actor("kept")


@escher.remote
def bump(handle, by):
    return escher.get(handle.add.remote(by), timeout=60)


def test_a_handle_passed_to_a_remote_function_calls_the_actor(cluster):
    c = Counter.remote(1)
    assert escher.get(bump.remote(c, 41), timeout=60) == 42
    assert escher.get(c.get.remote(), timeout=60) == 42


@escher.remote
def plus_one(x, by=0):
    return x + 1 + by


def test_an_actor_call_given_to_a_remote_function_passes_its_value(cluster):
    c = Counter.remote(5)
    # As a task's ref is: by position, by keyword, in map's batch.
    assert plus_one.remote(c.add.remote(1)).result(timeout=60) == 7
    assert plus_one.remote(1, by=c.get.remote()).result(timeout=60) == 8
    assert escher.get([plus_one.remote(c.add.remote(i)) for i in range(3)], timeout=60) == \
        [7, 8, 10]
    # A call that failed fails the task it was given to (which is never submitted) with its
    # failure; .remote() itself does not wait for it.
    with pytest.raises(ValueError, match="no value"):
        plus_one.remote(c.fail.remote("no value")).result(timeout=60)
    escher.kill(c)


def test_a_killed_actor_says_why(cluster):
    c = Counter.remote()
    assert escher.get(c.add.remote(), timeout=60) == 1
    escher.kill(c)
    with pytest.raises(escher.ActorDiedError, match="died: cancelled"):
        escher.get(c.add.remote(), timeout=60)


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_sigkilled_interpreter_restarts_with_its_constructor_rerun(cluster):
    c = Counter.options(max_restarts=1).remote(100)
    assert escher.get(c.add.remote(1), timeout=60) == 101
    pid, born = escher.get(c.identity.remote(), timeout=60)
    # The actor's interpreter is a child of its worker, which runs in this process.
    assert _parent(pid) == os.getpid()
    in_flight = c.sleep.remote(60)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(escher.ActorDiedError, match="signal 9"):
        escher.get(in_flight, timeout=60)
    # A fresh instance: the constructor ran again, the state is lost.
    assert escher.get(c.get.remote(), timeout=60) == 100
    pid2, born2 = escher.get(c.identity.remote(), timeout=60)
    assert (pid2, born2) != (pid, born)
    escher.kill(c)


def _free_again(before, limit=30.0):
    """Waits until the available resources are ``before`` again; returns what they are."""
    deadline = time.time() + limit
    now = escher.available_resources()
    while now != before and time.time() < deadline:
        time.sleep(0.05)
        now = escher.available_resources()
    return now


def test_an_actor_holds_its_resources_from_start_to_exit(cluster):
    """Cluster status before, during and after: the actor's request (and one Python slot) is
    held while it lives, idle or not, and given back whole once it is killed."""
    before = _free_again(escher.available_resources())
    c = Counter.options(resources={"cpu": 2}).remote()
    assert escher.get(c.get.remote(), timeout=60) == 0
    during = escher.available_resources()
    assert during["cpu"] == before["cpu"] - 2, (before, during)
    held = {k: before[k] - during.get(k, 0.0) for k in before if before[k] != during.get(k)}
    slot = escher._api._PYTHON_SLOT
    assert set(held) == {"cpu", slot} and held[slot] == 1, held
    escher.kill(c)
    assert _free_again(before) == before


def test_bad_actors_and_calls_say_what_is_wrong(cluster):
    before = _free_again(escher.available_resources())
    c = Counter.remote()
    with pytest.raises(AttributeError, match="no method 'nope'"):
        c.nope.remote()
    with pytest.raises(escher.InvalidArgumentError, match="max_concurrency"):
        escher.remote(max_concurrency=0)(Counter.__wrapped__)

    @escher.remote
    class Locked:
        lock = threading.Lock()

        def get(self):
            return 1

    with pytest.raises(escher.InvalidArgumentError, match="cannot pickle actor class"):
        Locked.remote()

    first = Counter.options(name="taken").remote()
    try:
        with pytest.raises(escher.EscherError, match="taken"):
            Counter.options(name="taken").remote()
    finally:
        escher.kill(first)
    escher.kill(c)
    # Nothing half-created holds anything.
    assert _free_again(before) == before


def test_a_constructor_that_raises_ends_the_actor_saying_why(cluster):
    @escher.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("no config")

        def get(self):
            return 1

    b = Broken.remote()
    with pytest.raises(escher.ActorDiedError, match="no config"):
        escher.get(b.get.remote(), timeout=60)


def _state(actor_id):
    return escher.task_info(escher.TaskRef(actor_id))["state"]


def test_an_owned_actor_ends_with_its_creators_last_handle(cluster):
    import gc

    c = Counter.remote()
    assert escher.get(c.add.remote(), timeout=60) == 1
    actor_id = c.actor_id
    del c
    gc.collect()
    deadline = time.time() + 30
    while _state(actor_id) != "cancelled" and time.time() < deadline:
        time.sleep(0.05)
    assert _state(actor_id) == "cancelled"


def test_calls_in_flight_go_to_the_next_incarnation_within_max_task_retries(cluster):
    c = Counter.options(max_restarts=1, max_task_retries=1).remote(7)
    pid, _born = escher.get(c.identity.remote(), timeout=60)
    in_flight = c.sleep.remote(1)
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    # Sent again to the fresh incarnation, where it runs to its end.
    assert escher.get(in_flight, timeout=60) == "slept"
    assert escher.get(c.get.remote(), timeout=60) == 7
    escher.kill(c)


def test_an_actor_in_another_namespace_is_unknown_here(cluster):
    c = Counter.options(name="elsewhere", namespace="team-actors").remote(3)
    try:
        with pytest.raises(escher.NotFoundError):
            escher.get_actor("elsewhere")
        token = escher.create_token("app", "team-actors")
        out = run_python(
            "import escher\n"
            f"escher.init(address={cluster.head_url!r}, token={token!r})\n"
            "h = escher.get_actor('elsewhere')\n"
            "print(escher.get(h.add.remote(1), timeout=60))\n"
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "4"
        # An admin may look a name up in another namespace.
        found = escher.get_actor("elsewhere", namespace="team-actors")
        assert escher.get(found.get.remote(), timeout=60) == 4
    finally:
        escher.kill(c)


def test_a_reader_cannot_call_an_actor(cluster):
    c = Counter.remote(3)
    assert escher.get(c.get.remote(), timeout=60) == 3
    token = escher.create_token("reader")
    out = run_python(
        "import escher, sys\n"
        f"escher.init(address={cluster.head_url!r}, token={token!r})\n"
        f"handle = escher._actors._handle_from_id({c.actor_id}, 'Counter', ['add', 'get'])\n"
        "try:\n"
        "    print('called', escher.get(handle.add.remote(1), timeout=60))\n"
        "except escher.EscherError as e:\n"
        "    print('refused', type(e).__name__, '|', e)\n"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("refused"), out.stdout
    assert "reader" in out.stdout.lower() or "permission" in out.stdout.lower(), out.stdout
    # The call never ran.
    assert escher.get(c.get.remote(), timeout=60) == 3
    escher.kill(c)


@escher.remote
class Relay:
    def bump(self, handle, by):
        # A handle unpickled in an actor reconnects with the actor's own credential.
        return escher.get(handle.add.remote(by), timeout=60)


def test_a_handle_passed_to_another_actor_calls_the_actor(cluster):
    c, relay = Counter.remote(1), Relay.remote()
    assert escher.get(relay.bump.remote(c, 9), timeout=60) == 10
    assert escher.get(c.get.remote(), timeout=60) == 10


def test_kill_without_no_restart_restarts_with_the_constructor_rerun(cluster):
    c = Counter.options(max_restarts=1).remote(5)
    assert escher.get(c.add.remote(2), timeout=60) == 7
    assert escher.kill(c, no_restart=False) in ("pending", "running")
    assert escher.get(c.get.remote(), timeout=60) == 5
    escher.kill(c)


def test_a_large_class_travels_once_by_its_hash(cluster):
    from escher import _actors

    @escher.remote
    class Big:
        TABLE = "x" * 50_000

        def size(self):
            return len(self.TABLE)

    before = len(_actors._STORED)
    first, second = Big.remote(), Big.remote()
    assert escher.get([first.size.remote(), second.size.remote()], timeout=60) == [50_000] * 2
    # One store task for both creations.
    assert len(_actors._STORED) == before + 1


@escher.remote
class Splitter:
    def divmod(self, a, b):
        return a // b, a % b

    def one(self):
        return 7


def test_method_options_take_num_returns_and_a_name_and_refuse_the_rest(cluster):
    s = Splitter.remote()
    quotient, remainder = s.divmod.options(num_returns=2).remote(17, 5)
    assert escher.get([quotient, remainder], timeout=60) == [3, 2]
    assert remainder.result(timeout=60) == 2
    ready, _ = escher.wait([quotient, remainder], num_returns=2, timeout=60)
    assert len(ready) == 2
    named = s.one.options(name="warm-up").remote()
    assert "name='warm-up'" in repr(named) and named.result(timeout=60) == 7
    # The same method without options is untouched.
    assert s.divmod.remote(9, 4).result(timeout=60) == (2, 1)
    # A method whose value is not N values fails each ref saying so.
    wrong = s.one.options(num_returns=2, name="pair").remote()
    with pytest.raises(escher.TaskError, match="'pair'.*num_returns=2.*returned a int"):
        escher.get(wrong[1], timeout=60)
    for options, says in [
        ({"num_returns": 0}, "num_returns is a whole number, 1 to 1024"),
        ({"num_returns": "streaming"}, "generators"),
        ({"name": ""}, "non-empty text"),
        ({"max_task_retries": 2}, "Cls.options(max_task_retries=N)"),
        ({"concurrency_group": "io"}, "max_concurrency"),
        ({"num_cpus": 1}, "give the actor resources="),
    ]:
        with pytest.raises(escher.InvalidArgumentError, match=None) as refused:
            s.one.options(**options)
        assert says in str(refused.value), (options, str(refused.value))
    with pytest.raises(TypeError, match="num_returns= and name="):
        s.one.options(priority=1)
    escher.kill(s)


@escher.remote
class Rank:
    def __init__(self, rank):
        self.rank = rank

    def where(self):
        import os

        return self.rank, int(os.environ["ESCHER_NODE_ID"])


def _used(prefix):
    """The units in use, and the total, of the live nodes' resources whose names start with
    ``prefix``."""
    total = {k: v for k, v in escher.cluster_resources().items() if k.startswith(prefix)}
    free = escher.available_resources()
    return sum(v - free.get(k, 0.0) for k, v in total.items()), sum(total.values())


def test_a_gang_of_actors_is_placed_all_or_nothing_on_its_reserved_capacity(cluster):
    """Ray's placement-group pattern (distributed training): a gang reserves one bundle per
    node, each actor runs in its bundle (on its node, on the gang's capacity: a second actor
    of a full bundle waits), and a gang the cluster cannot hold whole holds nothing."""
    from escher import esl

    gang = esl.Gangs(timeout=60).acquire("py-actor-gang", [{"cpu": 1}, {"cpu": 1}],
                                         strategy="strict-spread")
    ranks = [Rank.options(spec=gang.member(i)).remote(i) for i in range(len(gang))]
    placed = escher.get([r.where.remote() for r in ranks], timeout=60)
    assert [rank for rank, _ in placed] == [0, 1]
    assert len({node for _, node in placed}) == 2, placed
    assert _used("py-actor-gang-") == (2.0, 2.0)
    # Bundle 0 is full: one more actor in it waits for room, on no other capacity.
    extra = Rank.options(spec=gang.member(0)).remote(9)
    with pytest.raises(escher.GetTimeoutError):
        escher.get(extra.where.remote(), timeout=2)
    escher.kill(ranks[0])
    assert escher.get(extra.where.remote(), timeout=60) == (9, placed[0][1])
    for actor in (extra, ranks[1]):
        escher.kill(actor)
    assert _used("py-actor-gang-") == (0.0, 2.0)
    gang.release()
    # Three bundles on different nodes of two: never placed in part.
    with pytest.raises(escher.EscherError):
        esl.Gangs(timeout=3).acquire("py-actor-gang3", [{"cpu": 1}] * 3,
                                     strategy="strict-spread")
    assert _used("py-actor-gang3") == (0.0, 0.0)


def test_an_actor_no_node_can_hold_waits_with_a_tasks_reason_and_holds_nothing(cluster):
    # The twin of the Rust test's case in e2e_actors.rs: created, it waits with the reason a
    # task with the same request gets; a call to it waits, and a get with a timeout says why;
    # killed, it held nothing.
    before = escher.available_resources()

    @escher.remote(resources={"cpu": 64})
    class Huge:
        def get(self):
            return 1

    @escher.remote(resources={"cpu": 64})
    def huge_task():
        return 1

    actor = Huge.remote()
    task = huge_task.remote()
    try:
        call = actor.get.remote()
        with pytest.raises(escher.GetTimeoutError) as waited:
            escher.get(call, timeout=1)
        text = str(waited.value)
        assert f"actor {actor.actor_id} is still pending" in text, text
        with pytest.raises(escher.GetTimeoutError) as task_waited:
            escher.get(task, timeout=1)
        # The same reason as the task's: a resource no live node has enough of, named.
        reason = text.split("is still pending: ", 1)[1]
        assert "cpu" in reason and "64" in reason, reason
        assert reason in str(task_waited.value), (reason, str(task_waited.value))
    finally:
        escher.cancel(task)
        assert escher.kill(actor) in ("cancelled", "dead", "killed"), "killed"
    deadline = time.time() + 30
    while escher.available_resources() != before and time.time() < deadline:
        time.sleep(0.1)
    assert escher.available_resources() == before

def test_an_actor_no_node_can_hold_waits_with_the_reason_a_task_gets(cluster):
    """Created, not placed: pending with the head's reason (the same a task with the same
    request gets), a call to it waits, and killed it held nothing."""
    wants = {"cpu": 1, "no-such-device": 1}
    before = escher.available_resources()
    task = escher.remote(resources=wants)(lambda: 0).remote()
    actor = Counter.options(resources=wants).remote()
    try:
        info = _info_when(lambda: escher.task_info(escher.TaskRef(actor.actor_id)))
        assert info["state"] == "pending", info
        assert info["node"] is None, info
        assert "no-such-device" in info["reason"], info
        assert info["reason"] == _info_when(lambda: escher.task_info(task))["reason"]
        with pytest.raises(escher.GetTimeoutError):
            escher.get(actor.get.remote(), timeout=1)
        assert escher.task_info(escher.TaskRef(actor.actor_id))["state"] == "pending"
    finally:
        escher.kill(actor)
        escher.cancel(task)
    assert _state(actor.actor_id) == "cancelled"
    assert escher.available_resources() == before


def _info_when(read, limit=30.0):
    """``read()`` once it carries a reason (the head gives one at its first placement try)."""
    deadline = time.time() + limit
    info = read()
    while not info["reason"] and time.time() < deadline:
        time.sleep(0.05)
        info = read()
    return info
