"""Gang scheduling from Python: a reservation holds two bundles on two different nodes, all or
nothing, and one worker task runs inside each bundle."""

import os

import escher

escher.init(num_workers=2)


@escher.remote
def train(rank):
    return (rank, int(os.environ["ESCHER_NODE_ID"]))


gang = escher.reserve("train", [{"cpu": 2}, {"cpu": 2}], strategy="strict-spread", timeout=60)
print("gang: holders", gang.holders, "resources", gang.resources)
workers = [
    train.options(resources={gang.bundle_resource(rank, "cpu"): 1}).remote(rank)
    for rank in range(2)
]
placed = escher.get(workers)
nodes = {node for _, node in placed}
assert len(nodes) == 2, placed
print("gang: ranks ran on nodes", sorted(nodes))
gang.release()
escher.shutdown()
