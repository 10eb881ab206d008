"""What a Ray user types first: ``num_cpus``, ``num_gpus`` and ``max_retries`` (accepted,
meaning what they mean in Ray), Ray's other keywords (refused with escher's spelling), a class
given to ``@escher.remote`` (an actor class, never a task), ``async def`` functions (awaited on the worker), generators (refused at decoration)
and ``get`` with a timeout on a task no node can hold (it says why it waits)."""

import asyncio

import pytest

import escher


def test_rays_resource_and_retry_keywords_mean_the_same(cluster):
    @escher.remote(num_cpus=2, max_retries=2)
    def two_cpus():
        import os

        return os.environ["ESCHER_ATTEMPT"]

    assert (two_cpus._resources, two_cpus._retries) == ("cpu=2", 2)
    assert two_cpus.remote().result(timeout=60) == "1"
    # num_gpus alone still takes a cpu, as escher's default does; num_cpus=0 takes none.
    assert escher.remote(num_gpus=1)(lambda: 0)._resources == "cpu=1,gpu=1"
    assert escher.remote(num_cpus=0)(lambda: 0)._resources == ""
    free = escher.remote(num_cpus=0)(lambda: "ran without a cpu")
    assert free.remote().result(timeout=60) == "ran without a cpu"
    # options() takes them too, beside resources of escher's own.
    more = two_cpus.options(num_cpus=1, resources={"memory": 10}, max_retries=0)
    assert (more._resources, more._retries) == ("memory=10,cpu=1", 0)


def test_rays_keywords_escher_spells_differently_are_refused_with_its_spelling():
    for keywords, says in [
        ({"memory": 2 * 1024**3}, "resources={'memory': 2048}"),
        ({"num_returns": 2}, "return a tuple"),
        ({"scheduling_strategy": "SPREAD"}, "escher.reserve"),
        ({"max_retries": -1}, "retries=N"),
        ({"num_cpus": 1, "resources": {"cpu": 2}}, "give it once"),
        ({"max_retries": 1, "retries": 2}, "retries= only"),
        ({"num_gpus": "one"}, "number of gpus"),
    ]:
        with pytest.raises(escher.InvalidArgumentError, match=".*") as refused:
            escher.remote(**keywords)
        assert says in str(refused.value), (keywords, str(refused.value))
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_cpu'.*num_cpus="):
        escher.remote(num_cpu=1)


def test_a_class_is_an_actor_never_a_task():
    class Counter:
        def __init__(self):
            self.n = 0

    for made in (escher.remote(Counter), escher.remote(num_cpus=1)(Counter)):
        assert isinstance(made, escher.ActorClass), made
        with pytest.raises(escher.EscherError, match="cannot be instantiated directly"):
            made()
    assert escher.remote(num_cpus=2)(Counter)._actor_resources() == "cpu=2,shared/python=1"
    with pytest.raises(escher.InvalidArgumentError, match="max_restarts"):
        escher.remote(max_retries=1)(Counter)
    with pytest.raises(escher.InvalidArgumentError, match="timeout=.*a remote function.s"):
        escher.remote(timeout=5)(Counter)


async def _sleepy_double(x):
    await asyncio.sleep(0.01)
    return 2 * x


def test_an_async_function_is_awaited_on_the_worker(cluster):
    double = escher.remote(_sleepy_double)
    assert escher.get([double.remote(i) for i in range(3)]) == [0, 2, 4]

    @escher.remote
    async def raises():
        await asyncio.sleep(0)
        raise KeyError("inside the coroutine")

    with pytest.raises(KeyError, match="inside the coroutine"):
        raises.remote().result(timeout=60)


def test_generators_are_refused_at_decoration():
    def numbers():
        yield 1

    async def stream():
        yield 1

    with pytest.raises(TypeError, match="a generator function.*return a list"):
        escher.remote(numbers)
    with pytest.raises(TypeError, match="an async generator function"):
        escher.remote(stream)


def test_get_with_a_timeout_on_a_task_no_node_can_hold_says_why_it_waits(cluster):
    @escher.remote(resources={"cpu": 1, "no-such-device": 1})
    def never_placed():
        return 0

    ref = never_placed.remote()
    try:
        with pytest.raises(escher.GetTimeoutError) as waited:
            escher.get(ref, timeout=1)
        text = str(waited.value)
        assert "did not finish" in text and "still pending" in text, text
        assert "no-such-device" in text, text
        # A list says it of the first task that has not finished.
        done = escher.remote(lambda: 1).remote()
        with pytest.raises(escher.GetTimeoutError, match="no-such-device") as waited:
            escher.get([done, ref], timeout=1)
    finally:
        escher.cancel(ref)
