"""The quickstart's steps from Python: remote functions, a command task, locality (P1),
signalling (P2), a queue (P3) and the cluster's status, on an embedded cluster."""

import os
import time

import escher

info = escher.init(num_workers=2)
print(f"escher quickstart: head at {info.head_url}, nodes {info.nodes}")


@escher.remote
def square(x):
    return x * x


print("-- 1. plain tasks: 100 remote functions and a command task")
print("   sum of squares:", sum(escher.get([square.remote(i) for i in range(100)])))
echo = escher.submit(["echo", "hello from a command task"])
escher.get(echo)
print("  ", escher.logs(echo).strip())


print("-- 2. P1 locality: a task marks its node, another follows it there")


@escher.remote
def mark_here():
    (node,) = escher.set_resource("marked", "unbounded", escher.Local)
    return node


@escher.remote(resources={"cpu": 1, "marked": 1})
def follower():
    return int(os.environ["ESCHER_NODE_ID"])


marker = mark_here.remote().result()
print(f"   marker ran on node {marker}, follower ran on node {follower.remote().result()}")


print("-- 3. P2 signalling: B runs with A's result once A has succeeded")


@escher.remote
def produce():
    time.sleep(0.2)
    return "data from A"


@escher.remote
def consume(data):
    return f"B got {data!r}"


print("  ", consume.remote(produce.remote()).result())


print("-- 4. P3 queue: 6 tasks wait on a queue of capacity 0, then drain 2 at a time")
first = info.nodes[0]
escher.set_resource("queue", 0, escher.Node(first))
queued = [escher.submit(["sleep", "0.1"], resources={"cpu": 1, "queue": 1}) for _ in range(6)]
time.sleep(0.3)
ready, _ = escher.wait(queued, num_returns=6, timeout=0)
print(f"   finished before the queue opened: {len(ready)}")
escher.set_resource("queue", 2, escher.Node(first))
escher.get(queued)
print("   all 6 finished")

print("-- 5. cluster status")
for node in escher.cluster_status()["nodes"]:
    names = ", ".join(f"{r['name']}={r['total']}" for r in node["resources"])
    print(f"   node {node['id']}: {names}")
escher.shutdown()
print("quickstart: done")
