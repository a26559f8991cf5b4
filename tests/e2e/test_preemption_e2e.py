"""Preemption for slices and whole GPUs through the real kube-scheduler 1.20.2 and `tessera serve` (issue 14, item 5).

kube-scheduler's dry run ignores tessera.dev/gpu-milli, so it nominates the preemptor with no
victims, and 1.20.2 never calls an extender's preempt verb (kubernetes issue #102971, fixed by PR
#103019 and, for the 1.20 branch, #103030). Measured here before Tessera preempted itself: the
pod was nominated in 0.2 ms, no preempt request reached Tessera, and it waited for ever.
`tessera serve` (default `--preemption tessera`) now deletes the fewest lower-priority pods that
make room (extender/kube/preemptor.py) and keeps that room for the preemptor until it binds.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.translate.objects import ASSIGNMENT_ANNOTATION

NS = "default"
TAINT = {"key": "e2e/preempt", "operator": "Exists", "effect": "NoSchedule"}  # keeps other files' pods off the node
MODEL = "L4-preempt"
HIGH = "e2e-high"


def make_pod(api, name, milli=None, priority_class=None, gpus=None, model=MODEL, labels=None):
    gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {"tessera.dev/gpu-milli": str(milli)}
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": {
                "cpu": "1", "memory": "1Gi", **gpu}}}],
            "tolerations": [TAINT], "terminationGracePeriodSeconds": 0,  # no kubelet: a grace period would never end
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [model]}]}]}}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
                                   "spec": spec})


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


def add_node(api, cluster, name, gpus, model=MODEL):
    api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": model, "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}})
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    api.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
    deadline = time.monotonic() + 30
    while not any(n["name"] == name for n in cluster["extender"].inspect()["nodes"]) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="module")
def api(cluster):
    api = cluster["api"]
    try:
        client.SchedulingV1Api(api.api_client).create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": HIGH}, "value": 1000})
    except ApiException as e:
        if e.status != 409:
            raise
    add_node(api, cluster, "pre-0", 2)
    return api


def gone_within(api, name, timeout=15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not exists(api, name):
            return True
        time.sleep(0.1)
    return False


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
    node, gpu = placed(api, "high", timeout=20)
    took = time.monotonic() - start
    print(f"preemptor bound {took:.2f} s after creation")
    assert (node, gpu) == where[alone[0]]
    assert not exists(api, alone[0]) and exists(api, beside[0]) and exists(api, "keeper")
    assert not api.read_namespaced_pod(beside[0], NS).metadata.deletion_timestamp
    said = [ev.message for ev in api.list_namespaced_event(NS, field_selector="involvedObject.name=high").items]
    assert any(f"preempting 1 lower-priority pod on pre-0 ({NS}/{alone[0]})" in m for m in said), said
    assert took <= 10, took


def tessera_preempted(cluster, for_pod: str) -> list[str]:
    """tessera.log's preemption lines for `for_pod`: proof it was Tessera's path, not kube-scheduler's own."""
    log = (cluster["dir"] / "tessera.log").read_text().splitlines()
    return [line for line in log if "tessera: preempting" in line and f"for {NS}/{for_pod} " in line]


def test_the_node_needing_one_victim_is_chosen_over_one_needing_victims_on_two_gpus(api, cluster):
    """pair-a: a 600-milli priority-0 slice on each GPU; pair-b: one on GPU 0, GPU 1 free. A 2-GPU
    priority-1000 pod would need both of pair-a's or pair-b's one: pair-b's goes, pair-a's stay.
    kube-scheduler counts no slice in nvidia.com/gpu, so only Tessera can see that any victim is needed."""
    model = "L4-pair"
    add_node(api, cluster, "pair-a", 2, model)
    for name in ("pa-0", "pa-1"):  # 600 + 600 > 1000: one per GPU
        make_pod(api, name, 600, model=model)
        assert placed(api, name)[0] == "pair-a"
    add_node(api, cluster, "pair-b", 2, model)
    make_pod(api, "pb-0", 600, model=model)
    assert placed(api, "pb-0")[0] == "pair-b"
    make_pod(api, "pair-high", gpus=2, priority_class=HIGH, model=model)
    node, _ = placed(api, "pair-high", timeout=20)
    assert node == "pair-b"
    assert gone_within(api, "pb-0", timeout=1)
    assert all(exists(api, n) and not api.read_namespaced_pod(n, NS).metadata.deletion_timestamp for n in ("pa-0", "pa-1"))
    assert tessera_preempted(cluster, "pair-high"), "bound without Tessera's preemption: the scenario tested nothing"


def test_a_pod_no_preemption_helps_evicts_nothing(api, cluster):
    """lone: one GPU held 500 by a priority-1000 pod and 400 by a priority-0 one. A priority-1000 pod
    asking 600 cannot fit even with the low pod gone: nothing is deleted, and the reason says why."""
    model = "L4-lone"
    add_node(api, cluster, "lone", 1, model)
    make_pod(api, "lone-keeper", 500, HIGH, model=model)
    placed(api, "lone-keeper")
    make_pod(api, "lone-low", 400, model=model)
    placed(api, "lone-low")
    make_pod(api, "lone-high", 600, HIGH, model=model)
    deadline = time.monotonic() + 30
    said: list[str] = []
    while time.monotonic() < deadline and not any("no GPU has 600 milli free" in m for m in said):
        said = [ev.message for ev in api.list_namespaced_event(NS, field_selector="involvedObject.name=lone-high").items]
        time.sleep(0.5)
    assert any("no GPU has 600 milli free" in m for m in said), said
    assert exists(api, "lone-low") and not api.read_namespaced_pod("lone-low", NS).metadata.deletion_timestamp
    assert not api.read_namespaced_pod("lone-high", NS).spec.node_name


def test_a_disruption_budget_steers_preemption_to_the_unprotected_pod(api, cluster):
    """budget-a and budget-b each hold one 600-milli priority-0 slice; budget-a's is covered by a
    PodDisruptionBudget that allows no disruption (policy/v1beta1 on 1.20). Either node needs one
    victim, and without the budget budget-a would go first (the name breaks the tie); with it the
    priority-1000 600-milli pod takes budget-b's."""
    model = "L4-budget"
    add_node(api, cluster, "budget-a", 1, model)
    make_pod(api, "guarded", 600, model=model, labels={"app": "guarded"})
    assert placed(api, "guarded")[0] == "budget-a"
    add_node(api, cluster, "budget-b", 1, model)
    make_pod(api, "unguarded", 600, model=model, labels={"app": "other"})
    assert placed(api, "unguarded")[0] == "budget-b"
    api.api_client.call_api(*api.api_client.param_serialize(
        "POST", "/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", path_params={"namespace": NS},
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body={"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
              "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}},
        auth_settings=["BearerToken"])[:4]).read()
    # no controller-manager here: status.disruptionsAllowed stays unset, which counts as 0 (none allowed)
    make_pod(api, "budget-high", 600, priority_class=HIGH, model=model)
    assert placed(api, "budget-high", timeout=20)[0] == "budget-b"
    assert not exists(api, "unguarded") and exists(api, "guarded")
    assert tessera_preempted(cluster, "budget-high")
