"""NodeTable's own rules: taints grouped by set, unhealthy GPUs logged once and with their holders."""

import logging

from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest
from extender.nodes import NodeTable
from extender.translate.objects import GpuInfo, NodeInventory
from extender.translate.taints import Taint

INFRA = (Taint("dedicated", "infra", "NoSchedule"),)
GPU_ONLY = (Taint("tessera.dev/gpu-node", "", "NoSchedule"),)


def inv(name: str, taints=(), bad=()) -> NodeInventory:
    gpus = tuple(GpuInfo(i, f"GPU-{name}-{i}", healthy=i not in bad) for i in range(2))
    return NodeInventory(NodeSpec(name, 8000, 32768, 2, "T4"), gpus, taints)


def test_nodes_that_share_a_taint_set_share_one_group_and_leave_it_when_retainted_or_removed():
    table = NodeTable(Cluster([]))
    for name in ("a", "b", "c"):
        table.upsert(inv(name, INFRA), warn=True)
    assert table.tainted == {INFRA: {"a", "b", "c"}}
    table.upsert(inv("a", GPU_ONLY), warn=True)
    table.upsert(inv("b"), warn=True)  # untainted now
    assert table.tainted == {INFRA: {"c"}, GPU_ONLY: {"a"}} and "b" not in table.taints
    table.remove("c")
    assert table.tainted == {GPU_ONLY: {"a"}}  # an empty group is dropped, or the filter would keep checking it


def test_a_gpu_turning_unhealthy_is_logged_once_with_its_holders_and_not_before_the_first_sync(caplog):
    cluster = Cluster([])
    table = NodeTable(cluster)
    table.upsert(inv("a"), warn=False)
    cluster.place(PodRequest("ml/p", gpu_count=1, gpu_milli=300), "a", (1,))
    with caplog.at_level(logging.WARNING, logger="extender.nodes"):
        table.upsert(inv("a", bad=(0,)), warn=False)  # the first list: holders are not known yet
        assert caplog.records == []
        table.upsert(inv("a", bad=(0, 1)), warn=True)
        table.upsert(inv("a", bad=(0, 1)), warn=True)  # the same report again: nothing new to say
    assert [r.getMessage() for r in caplog.records] == [
        "node a GPU 1 (GPU-a-1) is unhealthy: withdrawn from placement; pods on it: ml/p"]
    assert table.unhealthy_gpus() == [{"node": "a", "gpu": 0, "uuid": "GPU-a-0", "pods": []},
                                      {"node": "a", "gpu": 1, "uuid": "GPU-a-1", "pods": ["ml/p"]}]


def test_a_removed_node_returns_what_was_on_it_and_leaves_nothing_behind():
    cluster = Cluster([])
    table = NodeTable(cluster)
    table.upsert(inv("a", INFRA, bad=(0,)), warn=True)
    held = cluster.place(PodRequest("ml/p", gpu_count=1, gpu_milli=1000), "a", (1,))
    assert table.remove("a") == [held]
    assert (table.gpu_uuids, table.gpu_info, table.taints, table.tainted) == ({}, {}, {}, {})
    assert table.pods_on_gpu("a", 1) == [] and table.unhealthy_gpus() == []
