"""Ray side of escher-bench (W1, W2, W3 and placement groups for W7).

Written for the harness; run by it with its own virtualenv (`.venv-bench/`, ray pinned). It
mirrors escher's workloads and the shapes of Ray's own `ray microbenchmark`
(python/ray/_private/ray_perf.py): a no-op remote function returning b"ok", one CPU per task,
on a local `ray.init(num_cpus=...)`. Prints progress on stderr and one last line on stdout:

    RESULT {"values": {key: figure, ...}, "info": {...}}

with keys and units matching escher's figures:
    w1.<n>        tasks/s, n tasks submitted with f.remote() in a loop, then one ray.get
    w2.p50/.p99   ms, sequential ray.get(f.remote()) round trips
    w3            tasks/s, K submitter actors each submitting N tasks at once
    pg.rate       placement groups of one bundle created, waited ready and removed per second
                  (ray_perf's placement_group_create/removal: 100 at a time, {"custom": 0.001})
    gang.p50/.p95/.max/.min/.rate  ms and gangs/s: placement groups of G one-slot bundles,
                  created, waited ready and removed by C threads at once
    actors.round_trip.p50        ms, sequential ray.get(a.noop.remote()) to one actor
    actors.pipelined             calls/s, ray.get([a.noop.remote() for _ in range(P)])
    actors.create_to_first_call.p50  ms, A.remote() then ray.get(a.noop.remote()), then kill
"""

import argparse
import json
import statistics
import sys
import threading
import time


def log(*args):
    print("ray_driver:", *args, file=sys.stderr, flush=True)


def percentile(sorted_values, p):
    """Nearest-rank percentile, as escher-bench computes it."""
    import math

    rank = max(1, min(len(sorted_values), math.ceil(p * len(sorted_values))))
    return sorted_values[rank - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-cpus", type=int, default=8)
    ap.add_argument("--w1", default="", help="comma-separated task counts")
    ap.add_argument("--w2", type=int, default=0, help="round trips")
    ap.add_argument("--w3", default="", help="CLIENTSxTASKS")
    ap.add_argument("--pg", type=int, default=0, help="one-bundle placement groups")
    ap.add_argument("--gang", default="", help="CLIENTSxGANGSxBUNDLES")
    ap.add_argument("--gang-slots", type=int, default=256)
    ap.add_argument("--actors", default="", help="ROUNDTRIPSxPIPELINEDxCREATIONS")
    args = ap.parse_args()

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    values = {}
    ray.init(
        num_cpus=args.num_cpus,
        # "custom" is ray_perf's resource for its placement-group microbenchmark; "slot" stands
        # for the CPUs of escher's W7 cluster (32 nodes x 8) on this one Ray node.
        resources={"custom": 100, "slot": args.gang_slots},
        include_dashboard=False,
        log_to_driver=False,
    )
    info = {"ray": ray.__version__, "num_cpus": args.num_cpus, "python": sys.version.split()[0]}

    @ray.remote
    def noop():
        return b"ok"

    log("warm-up")
    for _ in range(3):
        ray.get([noop.remote() for _ in range(1000)])

    for n in [int(x) for x in args.w1.split(",") if x]:
        start = time.perf_counter()
        refs = [noop.remote() for _ in range(n)]
        ray.get(refs)
        wall = time.perf_counter() - start
        values[f"w1.{n}"] = n / wall
        log(f"w1 {n}: {n / wall:.0f} tasks/s")

    if args.w2:
        for _ in range(50):
            ray.get(noop.remote())
        samples = []
        for _ in range(args.w2):
            start = time.perf_counter()
            ray.get(noop.remote())
            samples.append((time.perf_counter() - start) * 1e3)
        samples.sort()
        values["w2.p50"] = percentile(samples, 0.50)
        values["w2.p99"] = percentile(samples, 0.99)
        log(f"w2: p50 {values['w2.p50']:.3f} ms p99 {values['w2.p99']:.3f} ms")

    if args.actors:
        round_trips, pipelined, creations = (int(x) for x in args.actors.split("x"))

        @ray.remote(num_cpus=0)
        class BenchActor:
            def noop(self):
                return None

        @ray.remote(num_cpus=1)
        class Fresh:
            def noop(self):
                return None

        a = BenchActor.remote()
        for _ in range(100):
            ray.get(a.noop.remote())
        samples = []
        for _ in range(round_trips):
            start = time.perf_counter()
            ray.get(a.noop.remote())
            samples.append((time.perf_counter() - start) * 1e3)
        samples.sort()
        values["actors.round_trip.p50"] = percentile(samples, 0.50)
        start = time.perf_counter()
        ray.get([a.noop.remote() for _ in range(pipelined)])
        values["actors.pipelined"] = pipelined / (time.perf_counter() - start)
        ray.kill(a)
        created = []
        for _ in range(creations):
            start = time.perf_counter()
            f = Fresh.remote()
            ray.get(f.noop.remote())
            created.append((time.perf_counter() - start) * 1e3)
            ray.kill(f)
        created.sort()
        values["actors.create_to_first_call.p50"] = percentile(created, 0.50)
        log(
            f"actors: round trip p50 {values['actors.round_trip.p50']:.3f} ms, "
            f"pipelined {values['actors.pipelined']:.0f} calls/s, creation to first call "
            f"p50 {values['actors.create_to_first_call.p50']:.1f} ms"
        )

    if args.w3:
        clients, each = (int(x) for x in args.w3.split("x"))

        @ray.remote(num_cpus=0)
        class Submitter:
            def run(self, n):
                ray.get([noop.remote() for _ in range(n)])
                return n

        actors = [Submitter.remote() for _ in range(clients)]
        ray.get([a.run.remote(100) for a in actors])
        start = time.perf_counter()
        ray.get([a.run.remote(each) for a in actors])
        wall = time.perf_counter() - start
        values["w3"] = clients * each / wall
        log(f"w3 {clients}x{each}: {values['w3']:.0f} tasks/s")
        for a in actors:
            ray.kill(a)

    if args.pg:
        # ray_perf: create 100 one-bundle groups, wait for each, remove them all; repeated.
        def pg_round(k):
            pgs = [placement_group(bundles=[{"custom": 0.001}]) for _ in range(k)]
            for pg in pgs:
                pg.wait(timeout_seconds=30)
            for pg in pgs:
                remove_placement_group(pg)

        pg_round(min(100, args.pg))
        done = 0
        start = time.perf_counter()
        while done < args.pg:
            k = min(100, args.pg - done)
            pg_round(k)
            done += k
        wall = time.perf_counter() - start
        values["pg.rate"] = args.pg / wall
        log(f"pg: {values['pg.rate']:.0f} create+ready+remove/s")

    if args.gang:
        clients, gangs, bundles = (int(x) for x in args.gang.split("x"))
        latencies = []
        lock = threading.Lock()
        errors = []

        def client():
            try:
                for _ in range(gangs):
                    start = time.perf_counter()
                    pg = placement_group(bundles=[{"slot": 1}] * bundles, strategy="PACK")
                    if not pg.wait(timeout_seconds=60):
                        raise RuntimeError("placement group not ready within 60 s")
                    elapsed = (time.perf_counter() - start) * 1e3
                    remove_placement_group(pg)
                    with lock:
                        latencies.append(elapsed)
            except Exception as e:  # reported, not hidden
                errors.append(repr(e))

        threads = [threading.Thread(target=client) for _ in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        if errors:
            raise RuntimeError("gang clients failed: " + "; ".join(errors))
        latencies.sort()
        values["gang.min"] = latencies[0]
        values["gang.p50"] = percentile(latencies, 0.50)
        values["gang.p95"] = percentile(latencies, 0.95)
        values["gang.max"] = latencies[-1]
        values["gang.mean"] = statistics.fmean(latencies)
        values["gang.rate"] = clients * gangs / wall
        log(f"gang: p50 {values['gang.p50']:.2f} ms, {values['gang.rate']:.0f} gangs/s")

    ray.shutdown()
    print("RESULT " + json.dumps({"values": values, "info": info}), flush=True)


if __name__ == "__main__":
    main()
