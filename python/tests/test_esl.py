"""The Rust ESLs bound in Python: locality, affinity, native gangs, hierarchical fair share and
queues, with the semantics they have in Rust."""

import os
import time

import pytest

import escher
from escher import esl


@escher.remote
def node_id(*_):
    return int(os.environ["ESCHER_NODE_ID"])


def test_data_locality_runs_readers_where_the_data_is(cluster):
    where = esl.DataLocality()
    target = cluster.nodes[-1]
    where.register("py-ds1", target)
    readers = [node_id.options(spec=esl.DataLocality.consumer("py-ds1")).remote(i)
               for i in range(4)]
    assert set(escher.get(readers, timeout=60)) == {target}
    produced = node_id.options(spec=esl.DataLocality.produce("py-ds2")).remote()
    home = produced.result(timeout=60)
    follower = node_id.options(spec=esl.DataLocality.consumer("py-ds2")).remote()
    assert follower.result(timeout=60) == home
    where.forget("py-ds1")
    where.forget("py-ds2")


def test_affinity_puts_followers_with_their_leader(cluster):
    group = esl.Affinity("py-group")
    leader = node_id.options(spec=group.leader()).remote().result(timeout=60)
    followers = [node_id.options(spec=group.follower()).remote(i) for i in range(3)]
    assert set(escher.get(followers, timeout=60)) == {leader}
    group.dissolve()


def test_a_native_gang_holds_its_bundles_on_different_nodes(cluster):
    gang = esl.Gangs(timeout=60).acquire("py-train", [{"cpu": 1}, {"cpu": 1}],
                                         strategy="strict-spread")
    assert len(gang) == 2 and len(gang.holders) == 2
    ranks = [node_id.options(spec=gang.member(i)).remote(i) for i in range(2)]
    assert len(set(escher.get(ranks, timeout=60))) == 2
    with pytest.raises(escher.InvalidArgumentError, match="no bundle 5"):
        gang.member(5)
    gang.release()
    with pytest.raises(escher.EscherError, match="released"):
        gang.member(0)


def test_fair_share_divides_the_nodes_between_weighted_users(cluster):
    hfs = esl.FairShare("pyhfs")
    alice = hfs.create_user("alice", 1)
    bob = hfs.create_user("bob", 1)
    refs = {u: [escher.submit(["sleep", "0.2"], spec=s) for _ in range(2)]
            for u, s in (("alice", alice), ("bob", bob))}
    for user, user_refs in refs.items():
        hfs.track(user, user_refs)
    shares = hfs.rebalance()
    assert shares == {"alice": 1, "bob": 1}, shares
    for user_refs in refs.values():
        assert escher.get(user_refs, timeout=60) == [0, 0]


def test_a_queue_holds_its_tasks_until_released(cluster):
    queue = esl.Queue("py-queue", nodes=[cluster.nodes[0]])
    refs = [escher.submit(["true"], spec=queue.spec()) for _ in range(3)]
    time.sleep(0.3)
    ready, _ = escher.wait(refs, num_returns=3, timeout=0)
    assert ready == []
    queue.release(3)
    assert escher.get(refs, timeout=60) == [0, 0, 0]
    assert queue.capacity() == {cluster.nodes[0]: "3"}
    queue.close()
    assert queue.capacity() == {}


def test_specs_compose(cluster):
    both = esl.DataLocality.consumer("py-a").and_(esl.DataLocality.consumer("py-b"))
    assert "py-a" in both.resources and "py-b" in both.resources
