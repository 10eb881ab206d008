"""Objects, escher beside Ray, each from one Python driver on this machine, in the same run:

- tasks given a 1 MiB argument put once (``escher.put`` / ``ray.put``) and passed by
  reference to every task (tasks/s);
- one 100 MiB NumPy array put by the driver and read by a task on another worker (node) than
  the one that holds it: the task times its own ``get`` (MB/s);
- one 1 GiB NumPy array put by the driver and given, as the argument itself, to a task on the
  worker that holds it: the seconds from the call to its result (the task reads one byte of
  every page) and the task's private memory (``RssAnon``) at its end, MiB. With no copy of the
  buffer the task's private memory stays that of an idle interpreter; a copy adds 1 GiB.

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
        ray.init(address=cluster.address, log_to_driver=False)
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
        print(json.dumps(measure(args.one, args.tasks, args.big_mib * MIB,
                                 args.same_node_mib * MIB)), flush=True)
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
