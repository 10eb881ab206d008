"""Objects, escher beside Ray, each from one Python driver on this machine, in the same run:

- tasks given a 1 MiB argument put once (``escher.put`` / ``ray.put``) and passed by
  reference to every task (tasks/s);
- one 100 MiB NumPy array put by the driver and read by a task on another worker (node) than
  the one that holds it: the task times its own ``get`` (MB/s);
- one 1 GiB NumPy array put by the driver and given, as the argument itself, to a task on the
  worker that holds it: the seconds from the call to its result (the task reads one byte of
  every page) and the task's private memory (``RssAnon``) at its end, MiB. With no copy of the
  buffer the task's private memory stays that of an idle interpreter; a copy adds 1 GiB.
- WordCount on real objects (the thesis' E1 with its data made real): 4 chunks of 32 MiB of
  words, one per map slot (as in the thesis, one chunk per slot), each made by a task on a
  given worker (two on each, in a seeded random order) and left there as an object; then one map task per chunk counts
  its words (``bytes.split`` and a ``Counter``), given the chunk's task as its argument (the
  locality rule: placed where the chunk is when that worker has room) or inside a list, read
  with ``get`` in the task (the same job without the locality rule: placed where there is
  room, the chunk fetched when it is elsewhere). The
  makespan (first map submitted to last count received), the maps that ran where their chunk
  was, and the word total checked; each placement three times, alternating, chunks made anew
  before each job (a job's fetched copies would otherwise make every chunk local).

Each system runs in a process of its own on two workers of 2 CPUs each: escher
``escher.init(num_workers=2)``, the reading task placed on the worker that does not hold the
object (``escher`` asks the head where the copy is); Ray a ``ray.cluster_utils.Cluster`` of
two raylets (each with its own object store), the reading task placed on the second, the
object put by the driver on the first. One JSON line per system.

    python python/bench/objects.py [--tasks 200] [--systems escher,ray]

``escher-bench objects`` runs it (``--one`` per system) in the harness' own virtual
environment, beside one loopback TCP stream measured by the harness in the same run.
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

MIB = 1 << 20
BIG = 100 * MIB
SAME_NODE = 1024 * MIB


def rss_anon() -> int:
    """This process's private resident memory (bytes)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("RssAnon:"))


WC_CHUNKS = 4
WC_CHUNK = 32 * MIB
WC_VOCABULARY = 400
WC_REPS = 3


def wc_chunk(seed: int, size: int) -> bytes:
    """``size`` bytes of words ``w000``..``w399`` (five bytes each, with the space), drawn
    from ``seed``."""
    import numpy
    words = numpy.array([b"w%03d " % i for i in range(WC_VOCABULARY)], dtype="S5")
    return words[numpy.random.default_rng(seed).integers(0, WC_VOCABULARY, size // 5)].tobytes()


def wc_count(data) -> dict:
    """The word count of one chunk."""
    from collections import Counter
    return dict(Counter(bytes(data).split()))


def wordcount(place_gen, made, count, count_boxed, nodes, get) -> dict:
    """Runs the WordCount jobs (see the module's doc): ``place_gen(k, seed)`` makes a chunk
    on worker ``k`` (whose node is ``nodes[k]``), ``made(refs)`` waits for them without
    reading them, ``count(ref)`` and ``count_boxed([ref])`` count one (each returns its node
    and its counts)."""
    out = {}
    runs = {"locality": [], "unaware": []}
    local = {"locality": [], "unaware": []}
    for rep in range(WC_REPS):
        for placement in ("unaware", "locality") if rep % 2 == 0 else ("locality", "unaware"):
            # Two chunks on each worker, in an order drawn from the run (the thesis places
            # its chunks by a random permutation), the same for both placements of a run.
            layout = [c % 2 for c in range(WC_CHUNKS)]
            random.Random(rep).shuffle(layout)
            chunks = [place_gen(layout[c], 1000 * rep + c) for c in range(WC_CHUNKS)]
            made(chunks)  # not timed
            start = time.perf_counter()
            if placement == "locality":
                results = get([count(ref) for ref in chunks])
            else:
                results = get([count_boxed([ref]) for ref in chunks])
            runs[placement].append(time.perf_counter() - start)
            total = sum(sum(counts.values()) for _node, counts in results)
            assert total == WC_CHUNKS * (WC_CHUNK // 5), (total, placement)
            local[placement].append(sum(node == nodes[layout[c]]
                                        for c, (node, _counts) in enumerate(results)))
            del chunks, results
    for placement in runs:
        out[f"wordcount_{placement}_makespan_s"] = sorted(runs[placement])[WC_REPS // 2]
        out[f"wordcount_{placement}_makespans_s"] = runs[placement]
        out[f"wordcount_{placement}_local_maps"] = local[placement]
    out["wordcount_maps"] = WC_CHUNKS
    out["wordcount_chunk_bytes"] = WC_CHUNK
    return out


# What `measure` started that must stop when it ends, last first: Ray's cluster of raylets
# outlives its driver otherwise, and the next Ray benchmark of the same harness run then finds
# it ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
_TEARDOWN: list = []


def measure(system: str, tasks: int, big: int = BIG, same: int = SAME_NODE) -> dict:
    import numpy

    if system == "ray":
        import ray
        from ray.cluster_utils import Cluster

        store = 400 * MIB
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"w0": 1},
            "object_store_memory": max(store, same + 256 * MIB)})
        cluster.add_node(num_cpus=2, resources={"w1": 1}, object_store_memory=store)
        _TEARDOWN.append(cluster.shutdown)
        ray.init(address=cluster.address, log_to_driver=False)
        _TEARDOWN.append(ray.shutdown)
        cluster.wait_for_nodes()

        @ray.remote
        def size(data):
            return len(data)

        @ray.remote
        def read(box):
            import numpy  # noqa: F401 (the read is timed, not the import of NumPy)
            start = time.perf_counter()
            array = ray.get(box[0])
            took = time.perf_counter() - start
            return took, int(array.nbytes), int(array[::4096].sum())

        @ray.remote
        def touch(array):
            return int(array[::4096].sum()), rss_anon()

        put, get = ray.put, ray.get

        def on_other(ref):
            return read.options(resources={"w1": 1}).remote([ref])

        def on_holder(ref):
            # The driver's ray.put stores on the head node's raylet (w0).
            return touch.options(resources={"w0": 1}).remote(ref)

        def warm():
            get([size.remote(b"") for _ in range(20)])
            get([size.options(resources={w: 1}).remote(b"") for w in ("w0", "w1")])

        @ray.remote
        def wc_gen(seed):
            return wc_chunk(seed, WC_CHUNK)

        @ray.remote
        def wc_map(data):
            return ray.get_runtime_context().get_node_id(), wc_count(data)

        @ray.remote
        def wc_map_boxed(box):
            return ray.get_runtime_context().get_node_id(), wc_count(ray.get(box[0]))

        @ray.remote
        def wc_where():
            return ray.get_runtime_context().get_node_id()

        def wc():
            # Waited for where they are: a get would pull every chunk into the driver's node.
            def made(refs):
                ray.wait(refs, num_returns=len(refs), fetch_local=False)

            nodes = [get(wc_where.options(resources={f"w{k}": 0.01}).remote()) for k in range(2)]
            return wordcount(
                lambda k, seed: wc_gen.options(resources={f"w{k}": 0.01}).remote(seed), made,
                wc_map.remote, wc_map_boxed.remote, nodes, get)
    else:
        import escher
        from escher import _objects

        escher.init(num_workers=2, resources={"cpu": 2})

        @escher.remote
        def size(data):
            return len(data)

        @escher.remote
        def read(box):
            import numpy  # noqa: F401 (the read is timed, not the import of NumPy)
            start = time.perf_counter()
            array = escher.get(box[0])
            took = time.perf_counter() - start
            return took, int(array.nbytes), int(array[::4096].sum())

        nodes = escher.nodes()
        for i, node in enumerate(nodes):
            escher.set_resource(f"bench-w{i}", 1, escher.Node(node))
        put, get = escher.put, escher.get

        @escher.remote
        def touch(array):
            return int(array[::4096].sum()), rss_anon()

        def on_other(ref):
            holder = _objects.holders(ref)[0]
            other = next(i for i, n in enumerate(nodes) if n != holder)
            return read.options(resources={"cpu": 1, f"bench-w{other}": 1}).remote([ref])

        def on_holder(ref):
            at = nodes.index(_objects.holders(ref)[0])
            return touch.options(resources={"cpu": 1, f"bench-w{at}": 1}).remote(ref)

        def warm():
            get([size.remote(b"") for _ in range(20)])
            get([size.options(resources={"cpu": 1, f"bench-w{i}": 1}).remote(b"")
                 for i in range(len(nodes))])

        @escher.remote
        def wc_gen(seed):
            return wc_chunk(seed, WC_CHUNK)

        @escher.remote
        def wc_map(data):
            return int(os.environ["ESCHER_NODE_ID"]), wc_count(data)

        @escher.remote
        def wc_map_boxed(box):
            return int(os.environ["ESCHER_NODE_ID"]), wc_count(escher.get(box[0]))

        def wc():
            def made(refs):
                escher.wait(refs, num_returns=len(refs))

            return wordcount(
                lambda k, seed: wc_gen.options(
                    resources={"cpu": 1, f"bench-w{k}": 1}).remote(seed), made,
                wc_map.remote, wc_map_boxed.remote, nodes, get)

    warm()
    out = {"system": system}

    blob = put(b"x" * MIB)
    get([size.remote(blob) for _ in range(10)])
    start = time.perf_counter()
    assert get([size.remote(blob) for _ in range(tasks)]) == [MIB] * tasks
    out["one_mib_ref_tasks_per_s"] = tasks / (time.perf_counter() - start)

    array = numpy.random.default_rng(7).integers(0, 255, big, dtype=numpy.uint8)
    expect = int(array[::4096].sum())
    ref = put(array)
    took, nbytes, check = get(on_other(ref))
    assert nbytes == big and check == expect, (nbytes, check, expect)
    out["fetch_100mib_mb_per_s"] = big / MIB / took
    out["fetch_100mib_s"] = took
    del array, ref

    # A warm interpreter on each worker first (its import of NumPy is not the read's).
    small = numpy.zeros(1 << 16, dtype=numpy.uint8)
    get(on_holder(put(small)))
    array = numpy.random.default_rng(8).integers(0, 255, same, dtype=numpy.uint8)
    expect = int(array[::4096].sum())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    ref = put(array)
    out["same_node_1gib_put_s"] = time.perf_counter() - start
    # Peak resident memory is already the array's; a copy made by put while the array lives
    # raises it by the copy's size (ru_maxrss is in KiB on Linux).
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    out["same_node_1gib_put_driver_peak_rss_growth_mib"] = grown / 1024
    del array
    start = time.perf_counter()
    check, anon = get(on_holder(ref))
    out["same_node_1gib_read_s"] = time.perf_counter() - start
    assert check == expect, (check, expect)
    out["same_node_1gib_task_rss_anon_mib"] = anon / MIB
    out["same_node_bytes"] = same
    del ref
    out.update(wc())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--systems", default="escher,ray")
    parser.add_argument("--big-mib", type=int, default=BIG // MIB,
                        help="the size of the object fetched between workers (MiB)")
    parser.add_argument("--same-node-mib", type=int, default=SAME_NODE // MIB,
                        help="the size of the array read by a task on its own node (MiB)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        try:
            print(json.dumps(measure(args.one, args.tasks, args.big_mib * MIB,
                                     args.same_node_mib * MIB)), flush=True)
        finally:
            while _TEARDOWN:
                _TEARDOWN.pop()()
        return
    for system in args.systems.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", system, "--tasks",
                               str(args.tasks), "--big-mib", str(args.big_mib),
                               "--same-node-mib", str(args.same_node_mib)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{system} failed:\n{done.stderr}")
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
