"""Control-plane mode with Tessera stopped (every replica): the shipped kube-scheduler configuration
(manifests/scheduler/kube-scheduler-config.v1beta1.yaml, through testing/local_cluster.py) keeps the cluster
scheduling. CPU-only pods, Tessera's own replacement included, are placed by kube-scheduler alone
(the advice-only entry is ignorable); GPU pods wait (the binding entry is not) and are placed, with
Tessera's signed assignment, once it is back; no GPU is double-booked across the outage."""

from __future__ import annotations

import json
import time

from kubernetes.client.exceptions import ApiException

from extender.translate.objects import ASSIGNMENT_ANNOTATION

from .test_kube_e2e import events, make_node

NS = "default"
OUTAGE = {"key": "e2e/outage", "operator": "Exists", "effect": "NoSchedule"}


def outage_node(api, name, gpus):
    make_node(api, name, gpus, "A30")
    api.patch_node(name, {"spec": {"taints": [{"key": OUTAGE["key"], "effect": OUTAGE["effect"]}]}})


def outage_pod(api, name, limits, namespace=NS):
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": limits}}], "tolerations": [OUTAGE],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                       "values": ["outage-0", "outage-1"]}]}]}}}}
    api.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def node_of(api, name, namespace=NS):
    return api.read_namespaced_pod(name, namespace).spec.node_name


def wait_bound(api, name, timeout, namespace=NS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node_of(api, name, namespace):
            return api.read_namespaced_pod(name, namespace)
        time.sleep(0.3)
    raise AssertionError(f"{namespace}/{name} not bound within {timeout}s: {events(api, name)}")


def test_with_every_tessera_replica_stopped_cpu_pods_schedule_and_gpu_pods_wait(cluster):
    api, ext = cluster["api"], cluster["extender"]
    outage_node(api, "outage-0", 1)
    outage_node(api, "outage-1", 2)
    try:
        api.create_namespace({"metadata": {"name": "tessera-system"}})
    except ApiException as e:
        if e.status != 409:
            raise
    deadline = time.monotonic() + 30
    while not {"outage-0", "outage-1"} <= {n["name"] for n in ext.inspect()["nodes"]} and time.monotonic() < deadline:
        time.sleep(0.2)
    outage_pod(api, "before-slice", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "600"})
    before = json.loads(wait_bound(api, "before-slice", 60).metadata.annotations[ASSIGNMENT_ANNOTATION])

    ext.kill()  # kill -9, the only replica: no Tessera answers at all
    try:
        outage_pod(api, "down-cpu", {"cpu": "1", "memory": "1Gi"})
        # the extender Deployment's replacement pod: CPU only, system-cluster-critical, no GPU
        outage_pod(api, "tessera-extender-replacement", {"cpu": "500m", "memory": "512Mi"}, namespace="tessera-system")
        outage_pod(api, "down-slice", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "600"})
        outage_pod(api, "down-whole", {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"})
        assert wait_bound(api, "down-cpu", 30).spec.node_name in ("outage-0", "outage-1")
        assert wait_bound(api, "tessera-extender-replacement", 30, namespace="tessera-system").spec.node_name
        time.sleep(5)
        assert not node_of(api, "down-slice") and not node_of(api, "down-whole")  # GPU pods wait
        assert ASSIGNMENT_ANNOTATION not in (api.read_namespaced_pod("down-cpu", NS).metadata.annotations or {})
    finally:
        ext.start()

    slice_pod = wait_bound(api, "down-slice", 120)  # kube-scheduler retries once Tessera answers
    whole_pod = wait_bound(api, "down-whole", 120)
    s = json.loads(slice_pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
    w = json.loads(whole_pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
    # three GPUs: 600 + 600 cannot share one and the whole GPU needs one of its own
    held = {(before["node"], before["gpus"][0]): 600}
    for a in (s, w):
        key = (a["node"], a["gpus"][0])
        held[key] = held.get(key, 0) + a["milli"]
    assert max(held.values()) <= 1000, held
    seen = ext.inspect()
    assert not seen["not_counted"]
    for n in seen["nodes"]:
        for g in n["gpus"]:
            assert sum(h["milli"] for h in g["holders"]) <= 1000, (n["name"], g)
    for name, ns in (("before-slice", NS), ("down-cpu", NS), ("down-slice", NS), ("down-whole", NS),
                     ("tessera-extender-replacement", "tessera-system")):
        api.delete_namespaced_pod(name, ns, grace_period_seconds=0)
