"""A small policy written in Python on set_resource and cluster_status alone, as the thesis'
ESLs are: weighted fair sharing of the cluster's CPUs between two users. Each user's tasks
request one unit of the user's share resource; the policy sizes the shares from the CPUs that
cluster_status reports, in proportion to the weights."""

import time

import escher

info = escher.init(num_workers=2)
weights = {"alice": 3, "bob": 1}


def rebalance():
    """Gives every node's CPUs to the users in proportion to their weights."""
    total_weight = sum(weights.values())
    for node in escher.cluster_status()["nodes"]:
        cpus = next(float(r["total"]) for r in node["resources"] if r["name"] == "cpu")
        for user, weight in weights.items():
            share = max(1, int(cpus * weight / total_weight))
            escher.set_resource(f"share-{user}", share, escher.Node(node["id"]))


@escher.remote
def work(user):
    time.sleep(0.3)
    return user


rebalance()
shares = {u: escher.cluster_resources()[f"share-{u}"] for u in weights}
print("fair share: shares of the cluster", shares)
assert shares["alice"] == 3 * shares["bob"]
# Both users flood the cluster; at any moment alice holds about three times bob's slots.
refs = [work.options(resources={"cpu": 1, f"share-{u}": 1}).remote(u)
        for u in weights for _ in range(8)]
time.sleep(0.15)
status = escher.cluster_status()
used = {u: sum(float(r["used"]) for n in status["nodes"] for r in n["resources"]
               if r["name"] == f"share-{u}") for u in weights}
print("fair share: slots in use", used)
assert used["alice"] <= shares["alice"] and used["bob"] <= shares["bob"]
escher.get(refs)
print("fair share: done")
escher.shutdown()
