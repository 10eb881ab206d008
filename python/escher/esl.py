"""escher's scheduling libraries (ESLs) from Python: bindings over the Rust ESLs, with the same
semantics (docs: docs/esls.md). Each policy works on the session
``escher.init()`` opened and hands out ``Spec``s, which tasks take with
``f.options(spec=...)`` or ``escher.submit(..., spec=...)``; ``a.and_(b)`` composes two.

    gangs = escher.esl.Gangs()
    gang = gangs.acquire("train", [{"cpu": 2}, {"cpu": 2}], strategy="strict-spread")
    refs = [train.options(spec=gang.member(i)).remote(i) for i in range(len(gang))]
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from . import _escher
from ._api import Resources, _current, _resources_text

Spec = _escher.Spec
Gang = _escher.Gang


class DataLocality:
    """Tasks run where their data is (the thesis' P1): ``register(id, node)`` marks a node,
    ``consumer(id)`` is the spec of a task that reads the data, ``produce(id)`` of one that
    creates it (its node is marked when it succeeds)."""

    def __init__(self) -> None:
        self._inner = _escher.DataLocality(_current())

    def register(self, data_id: str, node: int) -> None:
        self._inner.register(data_id, node)

    def forget(self, data_id: str) -> None:
        self._inner.forget(data_id)

    @staticmethod
    def consumer(data_id: str) -> Spec:
        return _escher.DataLocality.consumer(data_id)

    @staticmethod
    def produce(data_id: str) -> Spec:
        return _escher.DataLocality.produce(data_id)


class Affinity:
    """Co-location: the group's followers run on the node of its leader."""

    def __init__(self, name: str) -> None:
        self._inner = _escher.Affinity(_current(), name)

    def leader(self) -> Spec:
        return self._inner.leader()

    def follower(self) -> Spec:
        return self._inner.follower()

    def dissolve(self) -> None:
        self._inner.dissolve()


class Gangs:
    """Gang scheduling by the head: ``acquire`` places bundles all or nothing and returns a
    ``Gang`` (``holders``, ``member(i)``: the spec of a task in bundle ``i``, ``release()``)."""

    def __init__(self, timeout: Optional[float] = None) -> None:
        self._inner = _escher.Gangs(_current(), timeout)

    def acquire(self, name: str, bundles: Sequence[Resources], strategy: str = "pack") -> Gang:
        texts = [_resources_text(b) or "" for b in bundles]
        return self._inner.acquire(name, texts, strategy.replace("_", "-"))


class FairShare:
    """Hierarchical max-min fair sharing of nodes between weighted users (the Rust ``Hfs``):
    ``create_user(id, weight)`` returns the spec of the user's tasks, ``track(user, refs)``
    counts their demand, ``rebalance()`` applies the shares (nodes per user)."""

    def __init__(self, instance: str, nodes: Optional[List[int]] = None) -> None:
        self._inner = _escher.Hfs(_current(), instance, nodes)

    def create_user(self, user: str, weight: int = 1) -> Spec:
        return self._inner.create_user(user, weight)

    def track(self, user: str, refs) -> None:
        self._inner.track(user, [r.id for r in refs])

    def rebalance(self) -> Dict[str, int]:
        return self._inner.rebalance()


class Queue:
    """A queue (the thesis' P3): its tasks (``spec()``) wait until the application lets them
    through with ``release(k)`` or ``drain_to(k)``; ``close()`` stops admitting."""

    def __init__(self, name: str, nodes: Optional[List[int]] = None) -> None:
        self._inner = _escher.Queue(_current(), name, nodes)

    def spec(self) -> Spec:
        return self._inner.spec()

    def release(self, k: int) -> List[int]:
        return self._inner.release(k)

    def drain_to(self, k: int) -> List[int]:
        return self._inner.drain_to(k)

    def close(self) -> None:
        self._inner.close()

    def capacity(self) -> Dict[int, Optional[str]]:
        return self._inner.capacity()


__all__ = ["Affinity", "DataLocality", "FairShare", "Gang", "Gangs", "Queue", "Spec"]
