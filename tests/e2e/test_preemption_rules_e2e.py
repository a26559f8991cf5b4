"""Issue 35, items 1 and 2, on the real control plane: kube-apiserver and kube-scheduler 1.20.2, `tessera serve`.

1. A pod whose PriorityClass says `preemptionPolicy: Never` (the apiserver's Priority admission copies it into the
   pod) at priority 1000, beside priority-0 pods of another namespace it could displace: nothing is evicted (before,
   Tessera's preemptor deleted one). The same pod with the default PreemptLowerPriority evicts exactly the one it needs.
2. Six namespaces flood the preemptor for a minute with priority-1000 pods that fit nowhere even with every
   lower-priority pod gone (each one touched every few seconds, so the watch offers it again). Before, they spent the
   minute's 60 plans and a seventh tenant's priority-1000 pod, which one eviction would place, was dropped and not
   offered again while its Unschedulable message stayed the same (it bound 82.5 s after creation here, when kube-
   scheduler's 60-s flush nominated it anew: a watch event). Now it is planned for at once and bound (the acceptance
   asks for 2 minutes; the time is printed).

Everything here runs on its own nodes (models L4-rules-*, taint e2e/rules) and namespaces, and is deleted at the end.
"""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .harness import until

MODELS = {"never": "L4-rules-never", "flood": "L4-rules-flood"}  # one per test: neither takes the other's room
TAINT = {"key": "e2e/rules", "operator": "Exists", "effect": "NoSchedule"}
NEVER, HIGH = "e2e-rules-never", "e2e-rules-high"
VICTIMS, TEAM, SEVENTH = "rules-low", "rules-team", "rules-tenant-7"
FLOODS = [f"rules-flood-{n}" for n in range(6)]
FLOOD_PODS = 15  # per namespace: 90 in all, more than the 60 plans a minute the flood took before
FLOOD_S = 60.0


def pod_body(name: str, milli: int, priority_class: str | None, model: str) -> dict:
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": {
                "cpu": "10m", "memory": "16Mi", "tessera.dev/gpu-milli": str(milli)}}}],  # tiny: 90 nominated pods fit
            "tolerations": [TAINT], "terminationGracePeriodSeconds": 0,  # no kubelet: a grace period would never end
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [model]}]}]}}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def make(api, namespace: str, name: str, milli: int, priority_class: str | None = None, model: str = "") -> None:
    api.create_namespaced_pod(namespace, pod_body(name, milli, priority_class, model or MODELS["flood"]))


def read(api, namespace: str, name: str):
    try:
        return api.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def bound_node(api, namespace: str, name: str, timeout: float = 60.0) -> str:
    def node() -> str | None:
        pod = read(api, namespace, name)
        return pod.spec.node_name if pod is not None else None

    return until(f"{namespace}/{name} bound", node, timeout, describe=lambda: [e.message for e in api.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}").items])


def untouched(api, namespace: str, name: str) -> bool:
    pod = read(api, namespace, name)
    return pod is not None and pod.metadata.deletion_timestamp is None


def add_node(api, cluster, name: str, gpus: int, model: str) -> None:
    api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": model, "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}})
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "250", "nvidia.com/gpu": str(gpus)}
    api.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
    until(f"node {name} in Tessera's cache", lambda: any(n["name"] == name for n in cluster["extender"].inspect()["nodes"]),
          30)


def preempted_for(cluster, namespace: str, name: str) -> list[str]:
    """tessera.log's preemption lines for the pod: whether Tessera's own preemptor acted for it."""
    log = (cluster["dir"] / "tessera.log").read_text().splitlines()
    return [line for line in log if "tessera: preempting" in line and f"for {namespace}/{name} " in line]


@pytest.fixture(scope="module")
def world(cluster):
    """The PriorityClasses and namespaces; at the end every pod, node, namespace and class made here goes."""
    api = cluster["api"]
    scheduling = client.SchedulingV1Api(api.api_client)
    for name, policy in ((NEVER, "Never"), (HIGH, "PreemptLowerPriority")):
        scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                          "metadata": {"name": name}, "value": 1000, "preemptionPolicy": policy})
    namespaces = [VICTIMS, TEAM, SEVENTH, *FLOODS]
    for ns in namespaces:
        api.create_namespace({"metadata": {"name": ns}})
    nodes: list[str] = []
    try:
        yield {"api": api, "nodes": nodes}
    finally:
        for ns in namespaces:  # grace 0: no kubelet here to end a grace period
            api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        for ns in namespaces:  # without a namespace controller here they stay Terminating, empty
            api.delete_namespace(ns)
        for node in nodes:
            api.delete_node(node)
        for name in (NEVER, HIGH):
            scheduling.delete_priority_class(name)


def test_a_never_pod_evicts_nothing_and_the_same_pod_that_may_preempt_evicts_exactly_one(world, cluster):
    """rules-0 has two GPUs, each held 600 by a priority-0 pod of another namespace: a 600-milli priority-1000 pod fits
    only once one of them goes."""
    api = world["api"]
    model = MODELS["never"]
    add_node(api, cluster, "rules-0", 2, model)
    world["nodes"].append("rules-0")
    for name in ("low-0", "low-1"):
        make(api, VICTIMS, name, 600, model=model)
        bound_node(api, VICTIMS, name)
    make(api, TEAM, "jumper", 600, NEVER, model)
    assert read(api, TEAM, "jumper").spec.preemption_policy == "Never", "the Priority admission copied the class's"
    until("kube-scheduler to mark jumper unschedulable", lambda: any(
        c.reason == "Unschedulable" for c in read(api, TEAM, "jumper").status.conditions or []), 30)
    time.sleep(15)  # Tessera's preemptor acted within 3 s before; 15 s also spans its RETRY_S re-offer
    assert untouched(api, VICTIMS, "low-0") and untouched(api, VICTIMS, "low-1"), "a Never pod evicted a pod"
    assert not read(api, TEAM, "jumper").spec.node_name and not preempted_for(cluster, TEAM, "jumper")
    said = [e.message for e in api.list_namespaced_event(TEAM, field_selector="involvedObject.name=jumper").items]
    assert not any("preempting" in m for m in said), said  # nor does its pending reason offer a preemption

    api.delete_namespaced_pod("jumper", TEAM, grace_period_seconds=0)
    until("jumper gone", lambda: read(api, TEAM, "jumper") is None, 30)
    start = time.monotonic()
    make(api, TEAM, "jumper", 600, HIGH, model)  # the same pod, allowed to preempt
    node = bound_node(api, TEAM, "jumper", timeout=30)
    took = time.monotonic() - start
    print(f"the PreemptLowerPriority pod bound {took:.1f} s after creation")
    left = [n for n in ("low-0", "low-1") if untouched(api, VICTIMS, n)]
    assert node == "rules-0" and len(left) == 1, f"exactly one victim: {left} left"
    assert preempted_for(cluster, TEAM, "jumper")


class Flood:
    """Six namespaces' pods that can never fit, touched every few seconds (each touch is a watch event that offers
    the pod to the preemptor again), for FLOOD_S."""

    def __init__(self, api) -> None:
        self.api, self.stop, self.touches = api, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        end = time.monotonic() + FLOOD_S
        round_ = 0
        while time.monotonic() < end and not self.stop.is_set():
            round_ += 1
            for ns in FLOODS:
                for i in range(FLOOD_PODS):
                    try:
                        self.api.patch_namespaced_pod(f"j-{i}", ns, {"metadata": {"labels": {"round": str(round_)}}})
                        self.touches += 1
                    except ApiException:
                        pass
            self.stop.wait(3.0)


def test_six_flooding_namespaces_leave_a_seventh_tenants_pod_planned_and_bound(world, cluster):
    """rules-a: one GPU, 500 held by a priority-1000 keeper and 400 by a priority-0 pod; rules-b: 400 by a keeper, 600
    by a priority-0 pod. The flood asks 900: no eviction gives it that anywhere. The seventh tenant asks 600: evicting
    rules-b's priority-0 pod gives it exactly that."""
    api = world["api"]
    for node in ("rules-a", "rules-b"):
        add_node(api, cluster, node, 1, MODELS["flood"])
        world["nodes"].append(node)
        make(api, VICTIMS, f"keeper-{node}", 500 if node == "rules-a" else 400, HIGH)
        assert bound_node(api, VICTIMS, f"keeper-{node}") == node
        make(api, VICTIMS, f"low-{node}", 400 if node == "rules-a" else 600)
        assert bound_node(api, VICTIMS, f"low-{node}") == node
    for ns in FLOODS:
        for i in range(FLOOD_PODS):
            make(api, ns, f"j-{i}", 900, HIGH)
    flood = Flood(api)
    flood_start = time.monotonic()
    flood.thread.start()
    try:
        until("the flood marked unschedulable", lambda: sum(
            any(c.reason == "Unschedulable" for c in p.status.conditions or [])
            for ns in FLOODS for p in api.list_namespaced_pod(ns).items) == len(FLOODS) * FLOOD_PODS, 60)
        time.sleep(max(0.0, 15.0 - (time.monotonic() - flood_start)))  # the flood has had 15 s of the preemptor
        start = time.monotonic()
        make(api, SEVENTH, "seventh", 600, HIGH)
        node = bound_node(api, SEVENTH, "seventh", timeout=120)
        took = time.monotonic() - start
        print(f"the seventh tenant's pod bound {took:.1f} s after creation, {start - flood_start:.0f} s into the "
              f"flood ({flood.touches} touches of {len(FLOODS) * FLOOD_PODS} flooding pods so far)")
        flood.thread.join(FLOOD_S + 30)  # the flood goes on for its minute
        print(f"the flood ran {time.monotonic() - flood_start:.0f} s, {flood.touches} touches")
    finally:
        flood.stop.set()
        flood.thread.join(10)
    # The acceptance asks for 2 minutes. Before, the pod waited until kube-scheduler's 60-s flush of its unschedulable
    # queue happened to nominate it elsewhere (a watch event): 82.5 s measured here, 150 s in the issue. Planned at once
    # now, so 30 s is a bound with room for kube-scheduler's backoff after the victim's deletion.
    assert node == "rules-b" and took <= 30
    assert not untouched(api, VICTIMS, "low-rules-b") and untouched(api, VICTIMS, "low-rules-a")
    assert all(untouched(api, VICTIMS, f"keeper-{n}") for n in ("rules-a", "rules-b"))
    assert preempted_for(cluster, SEVENTH, "seventh")
    assert not any(preempted_for(cluster, ns, f"j-{i}") for ns in FLOODS for i in range(FLOOD_PODS))

