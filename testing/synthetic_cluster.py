"""A synthetic cluster for the page's browser test and bench/page_load.py: N nodes of three GPU
models, some GPUs partly held, pods pending for different causes, and a gang that waits."""

from __future__ import annotations

from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod

MODELS = ("A100", "V100", "T4")


def synthetic_extender(nodes: int = 1000, pending: int = 60) -> Extender:
    e = Extender()
    for i in range(nodes):
        e.upsert_node(node_inventory(k8s_node(f"node-{i:05d}", gpus=8, model=MODELS[i % 3])))
    e.mark_synced()
    for i in range(0, nodes, 2):  # every other node: GPU 0 holds a 300-milli slice, GPU 1 a whole GPU
        node = f"node-{i:05d}"
        e.upsert_pod(pod_info(k8s_pod(f"slice-{i}", milli=300, node=node, phase="Running",
                                      assignment={"node": node, "gpus": [0], "milli": 300})))
        e.upsert_pod(pod_info(k8s_pod(f"whole-{i}", gpus=1, node=node, phase="Running",
                                      assignment={"node": node, "gpus": [1], "milli": 1000})))
    for i in range(pending):
        if i % 3 == 0:
            e.upsert_pod(pod_info(k8s_pod(f"huge-{i}", gpus=16)))  # no node has 16 GPUs
        elif i % 3 == 1:
            e.upsert_pod(pod_info(k8s_pod(f"cpu-hog-{i}", cpu="64")))  # no node has 64 CPUs
        else:
            e.upsert_pod(pod_info(k8s_pod(f"fits-{i}", milli=500)))  # fits, not bound yet
    for m in range(2):  # a gang of 4 with 2 members seen: it waits for the rest
        e.upsert_pod(pod_info(k8s_pod(f"gang-{m}", gpus=2, ann={"tessera.dev/gang-name": "train",
                                                                "tessera.dev/gang-size": "4"})))
    return e
