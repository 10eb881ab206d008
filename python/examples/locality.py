"""Data locality from Python (the thesis' P1): a task that loads a dataset marks its node with
an ephemeral resource, and the tasks that read the dataset request it, so they run where the
data is. The mark goes when the data does."""

import os

import escher

escher.init(num_workers=2)


@escher.remote
def load(dataset):
    (node,) = escher.set_resource(f"data-{dataset}", "unbounded", escher.Local)
    return node


@escher.remote
def read(dataset):
    return int(os.environ["ESCHER_NODE_ID"])


home = load.remote("7").result()
readers = [read.options(resources={"cpu": 1, "data-7": 1}).remote("7") for _ in range(4)]
ran_on = set(escher.get(readers))
assert ran_on == {home}, (home, ran_on)
print(f"locality: dataset 7 on node {home}; its 4 readers ran on {sorted(ran_on)}")
escher.delete_resource("data-7", escher.Node(home))
escher.shutdown()
