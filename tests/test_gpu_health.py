"""The extender's side of the node agent: out-of-band memory and ill health withhold GPU milli."""

import json

import pytest

from extender.core.model import NodeSpec, RequestError
from extender.http.inspect import cluster_map
from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod


def gpus(n=2, memory=16000, **per_gpu):
    """Inventory entries; per_gpu maps index -> extra fields."""
    return [{"index": i, "uuid": f"GPU-{i}", "model": "T4", "memory_mib": memory, **per_gpu.get(f"g{i}", {})}
            for i in range(n)]


def test_out_of_band_memory_becomes_reserved_milli_rounded_up():
    inv = node_inventory(k8s_node("a", gpus=2, inventory=gpus(g0={"oob_memory_mib": 11200}, g1={"oob_memory_mib": 1})))
    assert inv.spec.gpu_reserved == (700, 1)  # 11200/16000 = 0.7; any memory at all withholds at least 1 milli
    assert [g.oob_memory_mib for g in inv.gpus] == [11200, 1]


def test_an_unhealthy_gpu_is_withheld_whole_and_a_healthy_node_withholds_nothing():
    inv = node_inventory(k8s_node("a", gpus=2, inventory=gpus(g1={"healthy": False, "oob_memory_mib": 10})))
    assert inv.spec.gpu_reserved == (0, 1000)
    assert node_inventory(k8s_node("a", gpus=2, inventory=gpus())).spec.gpu_reserved == ()


def test_more_out_of_band_memory_than_the_gpu_has_withholds_the_whole_gpu():
    inv = node_inventory(k8s_node("a", gpus=1, inventory=gpus(1, g0={"oob_memory_mib": 99999})))
    assert inv.spec.gpu_reserved == (1000,)


@pytest.mark.parametrize("bad", [{"oob_memory_mib": -5}, {"oob_memory_mib": "lots"}, {"healthy": "false"}])
def test_unreadable_health_fields_are_refused_in_words(bad):
    with pytest.raises(RequestError, match="gpu-inventory"):
        node_inventory(k8s_node("a", gpus=1, inventory=gpus(1, g0=bad)))


def test_node_spec_refuses_reserved_milli_out_of_range():
    with pytest.raises(RequestError, match="gpu_reserved"):
        NodeSpec("a", 1000, 1000, gpu_count=1, gpu_reserved=(1001,))
    with pytest.raises(RequestError, match="gpu_reserved"):
        NodeSpec("a", 1000, 1000, gpu_count=1, gpu_reserved=(0, 0))


def synced(*nodes):
    e = Extender()
    for n in nodes:
        e.upsert_node(node_inventory(n))
    e.mark_synced()
    return e


def test_a_gpu_70_percent_full_out_of_band_cannot_take_a_500_milli_slice():
    e = synced(k8s_node("a", gpus=1, inventory=gpus(1, g0={"oob_memory_mib": 11200})))
    out = e.filter(pod_info(k8s_pod("half", milli=500)), ["a"])
    assert out.passed == [] and "no GPU has 500 milli free (largest free share 300)" in out.unresolvable["a"]
    assert e.filter(pod_info(k8s_pod("small", milli=300)), ["a"]).passed == ["a"]


def test_placement_moves_off_a_gpu_when_out_of_band_memory_appears():
    e = synced(k8s_node("a", gpus=2, inventory=gpus()))
    first = pod_info(k8s_pod("p1", milli=600))
    e.upsert_pod(first)  # the watch saw it created
    e.filter(first, ["a"])
    a1, _ = e.reserve(first.uid, first.key, "a")
    other = 1 - a1.gpus[0]
    second = pod_info(k8s_pod("p2", milli=500))
    assert e.filter(second, ["a"]).passed == ["a"]  # the other GPU is empty
    # the agent now reports 60% of the other GPU held by a process Kubernetes does not know
    e.upsert_node(node_inventory(k8s_node("a", gpus=2, inventory=gpus(**{f"g{other}": {"oob_memory_mib": 9600}}))))
    assert e.cluster.by_name["a"].gpu_free[other] == 400
    assert e.filter(second, ["a"]).passed == []  # 400 left beside p1, 400 beside the out-of-band use


def test_an_unhealthy_gpu_gets_no_new_pods_and_its_pods_are_named(caplog):
    e = synced(k8s_node("a", gpus=2, inventory=gpus()))
    held = pod_info(k8s_pod("held", milli=300, node="a", assignment={"node": "a", "gpus": [0], "milli": 300, "uuids": ["GPU-0"]}))
    e.upsert_pod(held)
    e.upsert_node(node_inventory(k8s_node("a", gpus=2, inventory=gpus(g0={"healthy": False}))))
    assert "GPU 0 (GPU-0) is unhealthy" in caplog.text and "ml/held" in caplog.text
    assert e.cluster.assignments["ml/held"].gpus == (0,)  # it keeps its slice until it leaves
    for i in range(3):
        p = pod_info(k8s_pod(f"new{i}", milli=300))
        e.upsert_pod(p)
        e.filter(p, ["a"])
        assert e.reserve(p.uid, p.key, "a")[0].gpus == (1,)
    p = pod_info(k8s_pod("more", milli=300))
    assert e.filter(p, ["a"]).passed == []
    shown = cluster_map(e)
    assert shown["unhealthy_gpus"] == [{"node": "a", "gpu": 0, "uuid": "GPU-0", "pods": ["ml/held"]}]
    assert shown["nodes"][0]["gpus"][0]["healthy"] is False


def test_a_restart_still_counts_pods_on_a_gpu_that_out_of_band_use_filled_later():
    e = synced(k8s_node("a", gpus=1, inventory=gpus(1, g0={"oob_memory_mib": 12000})))
    held = pod_info(k8s_pod("held", milli=500, node="a", assignment={"node": "a", "gpus": [0], "milli": 500, "uuids": ["GPU-0"]}))
    e.upsert_pod(held)
    assert "ml/held" in e.cluster.assignments and not e.rejected
    assert e.cluster.by_name["a"].gpu_free == [-250]  # takes nothing new until it frees up


def test_recovery_gives_the_gpu_back():
    e = synced(k8s_node("a", gpus=1, inventory=gpus(1, g0={"healthy": False})))
    p = pod_info(k8s_pod("p", milli=100))
    assert e.filter(p, ["a"]).passed == []
    e.upsert_node(node_inventory(k8s_node("a", gpus=1, inventory=gpus(1))))
    assert e.filter(p, ["a"]).passed == ["a"]
    assert json.loads(json.dumps(cluster_map(e)))["unhealthy_gpus"] == []


def test_tessera_inspect_renders_unhealthy_gpus_and_out_of_band_memory():
    from extender.cli.inspect import render_inspect

    e = synced(k8s_node("a", gpus=2, inventory=gpus(g0={"healthy": False}, g1={"oob_memory_mib": 1600})))
    text = render_inspect(cluster_map(e))
    assert "GPU 0: free    0  -  UNHEALTHY" in text and "GPU 1: free  900  -  out-of-band 1600 MiB" in text
    assert "unhealthy: a GPU 0 GPU-0: pods to move: none" in text


def held_pair():
    """Two pods on GPU 0 of node a, which then turns unhealthy under them."""
    e = synced(k8s_node("a", gpus=2, inventory=gpus()))
    for name, milli in (("p1", 600), ("p2", 400)):
        e.upsert_pod(pod_info(k8s_pod(name, milli=milli, node="a", phase="Running",
                                      assignment={"node": "a", "gpus": [0], "milli": milli, "uuids": ["GPU-0"]})))
    e.upsert_node(node_inventory(k8s_node("a", gpus=2, inventory=gpus(g0={"healthy": False}))))
    return e


def test_a_gpu_that_turns_unhealthy_under_pods_shows_free_0_and_fragmentation_stays_in_range():
    """Before: free -1000 milli in /inspect, and the fragmentation metrics went negative (the dashboard plots them)."""
    from extender.core.fragmentation import FragmentationIndex, FragmentationMeasure
    from extender.http.app import create_app
    from testing.ports import both

    e = held_pair()
    gpu0 = cluster_map(e)["nodes"][0]["gpus"][0]
    assert gpu0["free_milli"] == 0 and gpu0["healthy"] is False
    assert [h["pod"] for h in gpu0["holders"]] == ["ml/p1", "ml/p2"]
    assert cluster_map(e)["unhealthy_gpus"][0]["pods"] == ["ml/p1", "ml/p2"]
    assert e.cluster.gpu_free_milli == 1000  # GPU 1 only (was 0: -1000 + 1000)
    index = FragmentationIndex(e.cluster, FragmentationMeasure(e.policy.ctx.workload))
    assert index.total >= 0 and 0 <= index.amount_pct() <= 100 and 0 <= index.rate_pct() <= 100
    measure = FragmentationMeasure(e.policy.ctx.workload)
    assert measure.node(32000, [-500], "T4") == 0.0  # one GPU, unhealthy under a 500 milli pod: was -500 * p
    metrics = both(create_app(e, binder=None)).test_client().get("/metrics").data.decode()
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith(("tessera_fragmentation_milli ", "tessera_fragmentation_ratio "))}
    assert values and 0 <= values["tessera_fragmentation_milli"] <= 2000 and 0 <= values["tessera_fragmentation_ratio"] <= 1


def test_the_start_up_log_names_the_pods_on_an_unhealthy_gpu(caplog):
    """Before: the first list gives nodes before pods, so the line said 'pods on it: none' when two were there."""
    e = Extender()
    e.upsert_node(node_inventory(k8s_node("a", gpus=2, inventory=gpus(g0={"healthy": False}))))  # as the relist does
    for name in ("p1", "p2"):
        e.upsert_pod(pod_info(k8s_pod(name, milli=300, node="a", phase="Running",
                                      assignment={"node": "a", "gpus": [0], "milli": 300, "uuids": ["GPU-0"]})))
    e.mark_synced()
    e.mark_synced()  # a later relist says nothing again
    lines = [r.getMessage() for r in caplog.records if "is unhealthy" in r.getMessage()]
    assert lines == ["at start-up: node a GPU 0 (GPU-0) is unhealthy: withdrawn from placement; pods on it: ml/p1, ml/p2"]
