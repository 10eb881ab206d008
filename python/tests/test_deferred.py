"""Refs as arguments never block the caller: a task or an actor call whose arguments include an
actor call's ref (or a task's, for an actor) is returned at once and sent when they are ready,
in the order the caller made its calls; a failed argument fails it; a cancel before it is sent
means it never is. And escher.cancel's force= and recursive=.

Each "slow" call waits for a file the test writes only after ``.remote()`` returned: a caller
that blocked in ``.remote()`` would never write it, and the call would answer "never opened"
(after a bound, so that such a test fails rather than hangs)."""

import os
import pathlib
import time

import pytest

import escher

# How long a gate waits for its file before it answers that it was never opened.
GATE_BOUND = 90.0


@escher.remote
class Gate:
    def pass_when(self, path, value="opened"):
        deadline = time.monotonic() + GATE_BOUND
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                return "never opened"
            time.sleep(0.02)
        return value

    def fail(self, path, text):
        deadline = time.monotonic() + GATE_BOUND
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ValueError(text)


@escher.remote
class Log:
    def __init__(self, first="born"):
        self.seen = [first]

    def note(self, item):
        self.seen.append(item)
        return len(self.seen)

    def notes(self):
        return list(self.seen)


@escher.remote
def echo(value):
    return ("echo", value)


@escher.remote
def mark(path, value):
    pathlib.Path(path).write_text(str(value))
    return value


def _open(gate_file):
    gate_file.write_text("open")


def test_a_slow_actor_calls_ref_passed_to_a_task_returns_before_the_call_ends(cluster, tmp_path):
    gate_file = tmp_path / "gate"
    gate = Gate.remote()
    slow = gate.pass_when.remote(str(gate_file))
    ref = echo.remote(slow)  # returns at once: the call has not ended (its gate is shut)
    assert repr(ref) == "TaskRef(deferred, waiting)"
    later = echo.remote(ref)  # a deferred task passed on is deferred too
    _open(gate_file)
    assert escher.get(ref, timeout=120) == ("echo", "opened")
    assert escher.get(later, timeout=120) == ("echo", ("echo", "opened"))
    assert isinstance(ref.id, int) and ref.id > 0
    assert escher.get([ref, later], timeout=60) == [("echo", "opened"),
                                                     ("echo", ("echo", "opened"))]
    ready, not_ready = escher.wait([ref, later], num_returns=2, timeout=60)
    assert len(ready) == 2 and not not_ready


def test_wait_and_await_see_a_deferred_task_before_and_after_it_is_submitted(cluster, tmp_path):
    import asyncio

    gate_file = tmp_path / "gate"
    gate = Gate.remote()
    ref = echo.remote(gate.pass_when.remote(str(gate_file)))
    ready, not_ready = escher.wait([ref], num_returns=1, timeout=0)
    assert ready == [] and not_ready == [ref]
    with pytest.raises(escher.GetTimeoutError, match="its arguments"):
        escher.get(ref, timeout=0.01)
    _open(gate_file)

    async def main():
        return await ref

    assert asyncio.run(main()) == ("echo", "opened")


def test_one_callers_calls_keep_their_order_when_one_waits_for_an_argument(cluster, tmp_path):
    gate_file = tmp_path / "gate"
    gate = Gate.remote()
    log = Log.remote()
    first = log.note.remote(gate.pass_when.remote(str(gate_file), "a"))  # waits for the gate
    second = log.note.remote("b")  # no argument to wait for: still after the first
    third = log.note.remote(echo.remote("c"))  # a task's ref: its value, after the second
    _open(gate_file)
    assert escher.get([first, second, third], timeout=120) == [2, 3, 4]
    assert escher.get(log.notes.remote(), timeout=60) == ["born", "a", "b", ("echo", "c")]
    # The queue drained: calls go straight to the actor again, still in order.
    assert escher.get([log.note.remote(i) for i in range(20)], timeout=60) == \
        list(range(5, 25))


def test_an_actors_creation_waits_for_its_constructors_ref_and_its_calls_wait_behind_it(
        cluster, tmp_path):
    gate_file = tmp_path / "gate"
    gate = Gate.remote()
    log = Log.remote(gate.pass_when.remote(str(gate_file), "first"))  # returns at once
    assert "not created yet" in repr(log)
    call = log.note.remote("x")
    _open(gate_file)
    assert escher.get(call, timeout=120) == 2
    assert escher.get(log.notes.remote(), timeout=60) == ["first", "x"]
    assert log.actor_id > 0
    escher.kill(log)


def test_a_failed_argument_fails_its_task_and_its_call_and_later_calls_still_run(
        cluster, tmp_path):
    gate_file = tmp_path / "gate"
    gate = Gate.remote()
    bad = gate.fail.remote(str(gate_file), "the argument broke")
    task = echo.remote(bad)
    chained = echo.remote(task)
    log = Log.remote()
    call = log.note.remote(bad)
    after = log.note.remote("after")
    _open(gate_file)
    for ref in (task, chained, call):
        with pytest.raises(ValueError, match="the argument broke"):
            escher.get(ref, timeout=120)
    assert escher.get(after, timeout=60) == 2
    assert escher.get(log.notes.remote(), timeout=60) == ["born", "after"]
    ready, _ = escher.wait([task, chained], num_returns=2, timeout=60)
    assert len(ready) == 2
    with pytest.raises(ValueError, match="the argument broke"):
        task.id


def test_a_deferred_task_or_call_cancelled_before_it_is_sent_never_is(cluster, tmp_path):
    gate_file = tmp_path / "gate"
    marker = tmp_path / "ran"
    gate = Gate.remote()
    slow = gate.pass_when.remote(str(gate_file))
    task = mark.remote(str(marker), slow)
    log = Log.remote()
    call = log.note.remote(slow)
    assert escher.cancel([task, call]) == ["cancelled", "cancelled"]
    after = log.note.remote("after")
    # A task given the same argument after the cancel runs: once it has, the cancelled one
    # has had its chance to run, and did not.
    witness = echo.remote(slow)
    _open(gate_file)
    assert escher.get(witness, timeout=120) == ("echo", "opened")
    assert escher.get(after, timeout=60) == 2
    with pytest.raises(escher.TaskCancelledError):
        escher.get(task, timeout=60)
    with pytest.raises(escher.TaskCancelledError):
        escher.get(call, timeout=60)
    assert not marker.exists()
    assert escher.get(log.notes.remote(), timeout=60) == ["born", "after"]
    # Cancelled after it was submitted: the task's own cancel.
    submitted = echo.remote(slow)
    assert escher.get(submitted, timeout=60) == ("echo", "opened")
    assert escher.cancel(submitted) == ["succeeded"]


@escher.remote
def nap(path):
    pathlib.Path(path).write_text("started")
    time.sleep(600)


def test_cancel_takes_force_and_recursive_as_ray_does_where_escher_can(cluster, tmp_path):
    log = Log.remote()
    call = log.notes.remote()
    with pytest.raises(escher.InvalidArgumentError, match="not supported for actor calls"):
        escher.cancel(call, force=True)
    command = escher.submit(["sleep", "600"])
    # A command task may be forced (SIGKILL, no grace): test_cancel_tree.py shows what it does.
    assert escher.cancel(command, force=True) in (["pending"], ["running"], ["cancelled"])
    with pytest.raises(escher.InvalidArgumentError, match="True or False"):
        escher.cancel(command, force="yes")
    started = tmp_path / "started"
    running = nap.remote(str(started))
    while not started.exists():
        time.sleep(0.05)
    # Stopped by its worker (its interpreter SIGKILLed): the head answers before that.
    assert escher.cancel(running, force=True, recursive=False) in (["running"], ["cancelled"])
    with pytest.raises(escher.TaskCancelledError):
        escher.get(running, timeout=60)
    assert escher.get(call, timeout=60) == ["born"]


@escher.remote
def big(n):
    return bytes(range(256)) * (n // 256)


@escher.remote
class Digest:
    def sha(self, data):
        import hashlib

        return hashlib.sha256(data).hexdigest(), len(data)


def test_a_tasks_large_result_reaches_an_actor_by_reference_not_through_the_caller(
        cluster, monkeypatch):
    import hashlib

    size = 4 << 20
    ref = big.remote(size)
    digest = Digest.remote()
    real_get = escher._api.get
    pulled = []

    def watching(refs, **kwargs):
        if refs is ref:
            pulled.append(refs)
        return real_get(refs, **kwargs)

    # The caller's thread reads an argument's value with escher._api.get: it must not here.
    monkeypatch.setattr(escher._api, "get", watching)
    want = hashlib.sha256(bytes(range(256)) * (size // 256)).hexdigest()
    assert escher.get(digest.sha.remote(ref), timeout=120) == (want, size)
    assert pulled == []
    # A small result travels by value, as before.
    assert escher.get(digest.sha.remote(big.remote(1024)), timeout=120)[1] == 1024
