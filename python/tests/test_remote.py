"""Remote functions: values, dataflow through TaskRef arguments, remote exceptions, retries,
timeouts, cancellation, asyncio and warm interpreters."""

import asyncio
import os
import threading
import time

import pytest

import escher


@escher.remote
def square(x):
    return x * x


@escher.remote
def add(a, b, scale=1):
    return (a + b) * scale


@escher.remote
def fail(message):
    raise ValueError(message)


@escher.remote
def pid():
    return os.getpid()


def test_remote_functions_return_their_values(cluster):
    refs = [square.remote(i) for i in range(20)]
    assert escher.get(refs) == [i * i for i in range(20)]
    assert refs[3].result() == 9
    assert add.remote(1, 2, scale=10).result() == 30


def test_taskref_arguments_wait_for_their_tasks_and_pass_their_results(cluster):
    a, b = square.remote(3), square.remote(4)
    total = add.remote(a, b)
    assert escher.get(total) == 25
    chain = square.remote(add.remote(total, 0))
    assert chain.result(timeout=60) == 625
    # The signals that ordered them are gone once their tasks are done: nothing is left per task.
    deadline = time.time() + 30
    while any(name.startswith("escher-py-") for name in escher.cluster_resources()):
        assert time.time() < deadline, escher.cluster_resources()
        time.sleep(0.05)


def test_a_task_whose_argument_failed_is_cancelled_and_raises_that_failure(cluster):
    bad = fail.remote("upstream broke")
    downstream = square.remote(bad)
    with pytest.raises(ValueError, match="upstream broke"):
        escher.get(downstream, timeout=60)
    # It never ran: the client cancelled it when its argument failed.
    assert escher.cancel(downstream) == ["cancelled"]


def test_remote_exceptions_come_back_with_their_type_and_traceback(cluster):
    ref = fail.remote("bad input 7")
    with pytest.raises(ValueError) as caught:
        escher.get(ref)
    err = caught.value
    assert isinstance(err, escher.TaskError)
    assert err.task_id == ref.id
    assert "bad input 7" in str(err)
    assert "Remote traceback" in str(err)
    assert "in fail" in err.remote_traceback
    assert "_run" not in err.remote_traceback, "the runner's own frame is left out"


class CustomError(Exception):
    pass


@escher.remote
def fail_custom():
    raise CustomError("custom")


def test_an_exception_of_the_applications_own_type_is_re_raised_as_that_type(cluster):
    with pytest.raises(CustomError, match="custom"):
        fail_custom.remote().result()


def test_retries_run_a_failed_function_again(cluster, tmp_path):
    counter = tmp_path / "attempts"

    @escher.remote(retries=2)
    def flaky(path):
        with open(path, "a") as f:
            f.write("x")
        if len(open(path).read()) < 2:
            raise RuntimeError("first attempt fails")
        return "ok"

    assert flaky.remote(str(counter)).result(timeout=60) == "ok"
    assert counter.read_text() == "xx"

    once = tmp_path / "once"
    with pytest.raises(RuntimeError, match="first attempt fails"):
        flaky.options(retries=0).remote(str(once)).result(timeout=60)
    assert once.read_text() == "x"


def _gone(process_id: int) -> bool:
    try:
        os.kill(process_id, 0)
    except ProcessLookupError:
        return True
    return False


def test_cancelling_a_running_function_kills_its_interpreter(cluster, tmp_path):
    started = tmp_path / "pid"

    @escher.remote
    def sleeper(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)

    ref = sleeper.remote(str(started))
    deadline = time.time() + 60
    while not started.exists() or not started.read_text():
        assert time.time() < deadline, "the function never started"
        time.sleep(0.05)
    interpreter = int(started.read_text())
    escher.cancel(ref)
    with pytest.raises(escher.TaskCancelledError):
        escher.get(ref, timeout=60)
    deadline = time.time() + 30
    while not _gone(interpreter):
        assert time.time() < deadline, "the cancelled task's interpreter still runs"
        time.sleep(0.05)
    # The next call gets a fresh interpreter.
    assert square.remote(5).result(timeout=60) == 25


def test_a_function_past_its_timeout_fails(cluster):
    @escher.remote(timeout=0.5)
    def slow():
        time.sleep(60)

    with pytest.raises(escher.TaskError, match="timed out"):
        slow.remote().result(timeout=60)


def test_get_with_a_timeout_raises_get_timeout_error(cluster):
    @escher.remote
    def slow():
        time.sleep(5)

    ref = slow.remote()
    with pytest.raises(escher.GetTimeoutError):
        escher.get(ref, timeout=0.2)
    escher.cancel(ref)


def test_get_of_a_list_keeps_its_order_whatever_the_refs_are(cluster):
    """One call waits for the whole list: refs sent without waiting (whose ids are not known
    yet), refs whose ids are known (``map``, a ref read before), and the same ref twice."""
    sent = [square.remote(i) for i in range(30)]
    mapped = square.map(range(30, 40))
    known = square.remote(7)
    assert known.id > 0
    refs = [known] + sent + mapped + [sent[0]]
    assert escher.get(refs) == [49] + [i * i for i in range(40)] + [0]
    assert all(r.id > 0 for r in refs)


def test_get_of_a_list_raises_the_first_failure_without_waiting_for_the_rest(cluster):
    @escher.remote
    def slow():
        time.sleep(60)

    tail = slow.remote()
    start = time.time()
    with pytest.raises(ValueError, match="second of three"):
        escher.get([square.remote(2), fail.remote("second of three"), tail], timeout=30)
    assert time.time() - start < 20
    escher.cancel(tail)


def test_get_of_a_list_has_one_timeout_for_all(cluster):
    @escher.remote
    def nap(seconds):
        time.sleep(seconds)

    # Each within 3 s of the one before it, but not all within 3 s of the call.
    naps = [nap.remote(2), nap.remote(4), nap.remote(6)]
    start = time.time()
    with pytest.raises(escher.GetTimeoutError):
        escher.get(naps, timeout=3)
    assert time.time() - start < 5.5
    escher.cancel(naps)


def test_wait_returns_the_ready_and_the_others(cluster):
    @escher.remote
    def nap(seconds):
        time.sleep(seconds)
        return seconds

    fast, slow = nap.remote(0), nap.remote(30)
    ready, not_ready = escher.wait([fast, slow], num_returns=1, timeout=20)
    assert ready == [fast] and not_ready == [slow]
    escher.cancel(slow)


def test_taskrefs_are_awaitable(cluster):
    async def main():
        return await asyncio.gather(square.remote(6), add.remote(1, 1))

    assert asyncio.run(main()) == [36, 2]


def test_interpreters_stay_warm_between_tasks(cluster):
    first = pid.remote().result(timeout=60)
    again = [pid.remote().result(timeout=60) for _ in range(3)]
    assert first in again, "sequential tasks should reuse a warm interpreter"
    assert first != os.getpid()


def test_a_large_function_travels_once_and_runs_every_call(cluster):
    table = list(range(5000))  # about 20 KiB pickled: shipped through a store task

    @escher.remote
    def lookup(i):
        return table[i]

    assert escher.get([lookup.remote(i) for i in (1, 10, 4999)]) == [1, 10, 4999]


def test_an_unpicklable_argument_is_refused_before_anything_is_submitted(cluster):
    before = len(escher.cluster_status()["nodes"])
    with pytest.raises(escher.InvalidArgumentError, match="cannot pickle"):
        square.remote(threading.Lock())
    assert len(escher.cluster_status()["nodes"]) == before


def test_calling_a_remote_function_directly_says_what_to_do(cluster):
    with pytest.raises(escher.EscherError, match=r"square.remote\(...\)"):
        square(3)


@escher.remote
def fan_out(n):
    # Inside a task, escher acts as the task (its credential): it may submit tasks of its own.
    return sum(escher.get([square.remote(i) for i in range(n)]))


def test_a_task_submits_tasks_of_its_own(cluster):
    assert fan_out.remote(4).result(timeout=60) == 0 + 1 + 4 + 9


def test_a_function_whose_module_is_missing_on_the_worker_says_so(cluster, tmp_path):
    import importlib
    import sys

    # A module that seems installed (under site-packages) on the caller only: its functions
    # travel by reference, and the worker's interpreter cannot import it.
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "only_here_mod.py").write_text("def double(x):\n    return 2 * x\n")
    sys.path.insert(0, str(site))
    try:
        mod = importlib.import_module("only_here_mod")
        with pytest.raises(escher.TaskError, match="only_here_mod.*missing"):
            escher.remote(mod.double).remote(2).result(timeout=60)
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("only_here_mod", None)


def test_an_unpicklable_function_and_bad_resources_are_refused_before_submitting(cluster):
    lock = threading.Lock()

    @escher.remote
    def holds_a_lock():
        return lock.locked()

    with pytest.raises(escher.InvalidArgumentError, match="cannot pickle function"):
        holds_a_lock.remote()
    with pytest.raises(escher.InvalidArgumentError, match="resources"):
        square.options(resources={"cpu": "lots"}).remote(1)
    with pytest.raises(escher.InvalidArgumentError, match="TaskRef"):
        escher.get(42)


def test_map_submits_many_calls_at_once(cluster):
    refs = square.map(range(50))
    assert escher.get(refs) == [i * i for i in range(50)]
    assert escher.get(add.map([(1, 2), (square.remote(2), 1)])) == [3, 5]
    assert square.map([]) == []


def test_a_new_session_ships_a_large_function_again():
    from conftest import run_python

    done = run_python(
        "import escher\n"
        "table = list(range(5000))\n"
        "@escher.remote\n"
        "def lookup(i):\n"
        "    return table[i]\n"
        "for _ in range(2):\n"
        "    escher.init()\n"
        "    print(lookup.remote(4999).result(timeout=60))\n"
        "    escher.shutdown()\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["4999", "4999"]


def test_a_function_that_ends_its_interpreter_fails_saying_so(cluster):
    @escher.remote
    def leave():
        os._exit(3)

    with pytest.raises(escher.TaskError, match="ended before answering"):
        leave.remote().result(timeout=60)
    # The next call gets a fresh interpreter.
    assert square.remote(3).result(timeout=60) == 9


def test_ctrl_c_interrupts_a_get_that_waits():
    from conftest import run_python

    # A process started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt for it: the script puts Python's
    # own handler back, as an interactive driver has it.
    done = run_python(
        "import _thread, signal, threading, time, escher\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "escher.init()\n"
        "@escher.remote\n"
        "def forever():\n"
        "    time.sleep(600)\n"
        "ref = forever.remote()\n"
        "threading.Timer(1.0, _thread.interrupt_main).start()\n"
        "try:\n"
        "    escher.get(ref)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "    escher.cancel(ref)\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupted" in done.stdout


def test_an_embedded_replicated_head_runs_remote_functions():
    from conftest import run_python

    done = run_python(
        "import escher\n"
        "info = escher.init(num_heads=3, num_workers=1)\n"
        "print(len(info.head_url.split(',')))\n"
        "@escher.remote\n"
        "def double(x):\n"
        "    return 2 * x\n"
        "print(escher.get([double.remote(i) for i in range(3)]))\n"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["3", "[0, 2, 4]"], done.stdout
