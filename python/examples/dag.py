"""A DAG of remote functions: each TaskRef passed as an argument is a dependency (escher's
task signalling, P2), so the whole diamond is submitted at once and runs in order."""

import escher

escher.init()


@escher.remote
def load(name):
    return list(range(10)) if name == "numbers" else [1] * 10


@escher.remote
def scale(values, factor):
    return [v * factor for v in values]


@escher.remote
def combine(a, b):
    return sum(a) + sum(b)


#        load
#       /    \
#   scale x2  scale x3
#       \    /
#      combine
data = load.remote("numbers")
total = combine.remote(scale.remote(data, 2), scale.remote(data, 3))
result = escher.get(total)
assert result == 5 * sum(range(10)), result
print("dag: combine =", result)
escher.shutdown()
