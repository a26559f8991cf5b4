"""Preemption for slices through the real kube-scheduler 1.20.2 and `tessera serve` (issue 14, item 5).

kube-scheduler's dry run ignores tessera.dev/gpu-milli, so it offers the node with no victims; the
preempt verb answers the one lower-priority pod whose eviction frees a GPU, and kube-scheduler
deletes it and binds the high-priority pod there.

Not on 1.20.2: its frameworks are built without the extenders (kubernetes issue #102971, fixed by
PR #103019 and, for the 1.20 branch, #103030), so DefaultPreemption never calls the preempt verb.
Measured here: the preemptor is nominated to the node with no victims in 0.2 ms (no HTTP call),
Tessera logs no preempt request, and the pod waits ("no GPU has 600 milli free"). The test is a
strict xfail: it turns into a failure, asking for the mark to go, on a kube-scheduler with the fix.
While the pod waits, its TesseraWaiting Event must name the one pod preemption would take.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.kube.contract import ASSIGNMENT_ANNOTATION

NS = "default"
TAINT = {"key": "e2e/preempt", "operator": "Exists", "effect": "NoSchedule"}  # keeps other files' pods off the node
MODEL = "L4-preempt"
HIGH = "e2e-high"


class NotPreempted(AssertionError):
    """The preemptor stayed pending: the one failure the xfail below expects (any other is a real failure)."""


def make_pod(api, name, milli, priority_class=None):
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": {
                "cpu": "1", "memory": "1Gi", "tessera.dev/gpu-milli": str(milli)}}}],
            "tolerations": [TAINT], "terminationGracePeriodSeconds": 0,  # no kubelet: a grace period would never end
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [MODEL]}]}]}}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def placed(api, name, timeout=60.0):
    """(node, GPU) of the pod once bound with its assignment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = api.read_namespaced_pod(name, NS)
        if pod.spec.node_name:
            a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
            return a["node"], a["gpus"][0]
        time.sleep(0.1)
    events = api.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
    raise AssertionError(f"pod {name} not bound within {timeout}s (nominated: {pod.status.nominated_node_name!r}): "
                         f"{[e.message for e in events]}")


def exists(api, name) -> bool:
    try:
        api.read_namespaced_pod(name, NS)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


@pytest.fixture(scope="module")
def api(cluster):
    api = cluster["api"]
    try:
        client.SchedulingV1Api(api.api_client).create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": HIGH}, "value": 1000})
    except ApiException as e:
        if e.status != 409:
            raise
    name = "pre-0"
    api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": MODEL, "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}})
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "2"}
    api.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
    deadline = time.monotonic() + 30
    while not any(n["name"] == name for n in cluster["extender"].inspect()["nodes"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return api


@pytest.mark.xfail(strict=True, raises=NotPreempted,
                   reason="kube-scheduler 1.20.2 never calls an extender's preempt verb (kubernetes #102971)")
def test_one_low_priority_slice_is_evicted_and_the_600_milli_pod_binds(api, cluster):
    """GPU 0: a priority-1000 keeper (500) + low-0 (500); GPU 1: low-1 (500). The 600-milli
    priority-1000 pod fits nowhere; evicting low-0 would not help (the keeper stays), evicting low-1
    frees GPU 1: exactly low-1 goes, low-0 stays, and the pod binds to GPU 1."""
    make_pod(api, "keeper", 500, HIGH)
    keeper = placed(api, "keeper")
    make_pod(api, "low-0", 500)
    make_pod(api, "low-1", 500)
    where = {n: placed(api, n) for n in ("low-0", "low-1")}
    beside = [n for n, at in where.items() if at == keeper]
    alone = [n for n, at in where.items() if at != keeper]
    assert len(beside) == 1 and len(alone) == 1, f"layout not as the scenario needs: keeper {keeper}, {where}"
    start = time.monotonic()
    make_pod(api, "high", 600, HIGH)
    try:
        node, gpu = placed(api, "high", timeout=15)
    except AssertionError as e:
        # still pending: its TesseraWaiting reason names the one pod preemption would take (a real failure if not)
        said = [ev.message for ev in api.list_namespaced_event(NS, field_selector="involvedObject.name=high").items]
        assert any(f"preempting 1 lower-priority pod on pre-0 ({NS}/{alone[0]}) would make room" in m for m in said), said
        log = (cluster["dir"] / "tessera.log").read_text().splitlines()
        raise NotPreempted(f"{e}; tessera.log: {[line for line in log if 'preempt' in line]}") from None
    took = time.monotonic() - start
    print(f"preemptor bound {took:.2f} s after creation")
    assert (node, gpu) == where[alone[0]]
    assert not exists(api, alone[0]) and exists(api, beside[0]) and exists(api, "keeper")
    assert not api.read_namespaced_pod(beside[0], NS).metadata.deletion_timestamp
    assert took <= 10, took
