"""Reservations with backfill through the real kube-scheduler 1.20.2 and `tessera serve --reservations on`
(issue 14, items 3 and 4; extender/queue_reservations.py).

One node of 2 GPUs; `z` holds one for a declared hour. `big` asks both: kube-scheduler's own
NodeResourcesFit refuses it (one nvidia.com/gpu free), so Tessera's filter never hears of it, and the
extender's 5 s tick reserves the node for it (its wait bound here is 0 s). `long` (1 GPU, no declared
run time) is then refused there in words, and `short` (1 GPU, 10 min) binds beside `z` because it ends
before `big` can start. A restarted extender derives the same reservation from the API's timestamps.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from extender.translate.objects import ASSIGNMENT_ANNOTATION, EXPECTED_RUNTIME_ANNOTATION
from testing.local_cluster import LocalCluster

from .harness import skip_without_control_plane

NS = "default"
NODE = "res-0"
TAINT = {"key": "e2e/reserve", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from one_node_cluster(tmp_path_factory.mktemp("reservecp"), NODE, 2, (
        "--reservations", "on", "--reservation-wait", "2=0s", "--reservation-max-share", "1", "--reservation-grace", "1h"))


def one_node_cluster(work, node: str, gpus: int, extender_args: tuple[str, ...]):
    """A control plane with `tessera serve extender_args` and one Ready node of `gpus` L4 GPUs, tainted TAINT
    (the pods here tolerate it); yields {"api", "extender"} once Tessera has the node, stops everything after."""
    skip_without_control_plane()
    from kubernetes import client, config

    local = LocalCluster(work, extender_args=extender_args)
    try:
        local.start()
        config.load_kube_config(config_file=str(local.work / "kubeconfig"))
        api = client.CoreV1Api()
        api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {
            "nvidia.com/gpu.product": "L4", "kubernetes.io/hostname": node}},
            "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}})
        capacity = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        api.patch_node_status(node, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
        until(lambda: any(n["name"] == node for n in local.extender.inspect()["nodes"]), "the node in tessera's cache")
        yield {"api": api, "extender": local.extender}
    finally:
        local.stop()


def until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout}s")


def make_pod(api, name, gpus, runtime=""):
    meta = {"name": name, "annotations": {EXPECTED_RUNTIME_ANNOTATION: runtime} if runtime else {}}
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "containers": [{"name": "c", "image": "none", "resources": {"limits": {
            "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}}}],
        "tolerations": [TAINT], "terminationGracePeriodSeconds": 0}})


def gpus_of(api, name) -> list[int] | None:
    pod = api.read_namespaced_pod(name, NS)
    return json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])["gpus"] if pod.spec.node_name else None


def reservation(extender) -> dict | None:
    listed = extender.inspect()["queue_reservations"]
    return listed[0] if listed else None


def test_a_reserved_node_refuses_a_long_pod_admits_a_short_one_and_survives_a_restart(env):
    api, extender = env["api"], env["extender"]
    make_pod(api, "z", 1, runtime="1h")
    until(lambda: gpus_of(api, "z"), "binding of z")
    # as its kubelet would (a minute back, so the earlier of it and the first bound sighting is this whole second)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    api.patch_namespaced_pod_status("z", NS, {"status": {"startTime": started, "phase": "Running"}})
    make_pod(api, "big", 2)
    held = until(lambda: reservation(extender), "reservation for big")
    assert held["pod"] == f"{NS}/big" and held["node"] == NODE and held["gpus"] == 2
    assert [w["pod"] for w in held["waits_for"]] == [f"{NS}/z"]

    make_pod(api, "long", 1)
    said = until(lambda: [e.message for e in api.list_namespaced_event(NS, field_selector="involvedObject.name=long").items
                          if f"node reserved for {NS}/big" in (e.message or "")], "refusal of long in its events")
    assert "tessera.dev/expected-runtime" in said[0] and gpus_of(api, "long") is None

    make_pod(api, "short", 1, runtime="10m")
    assert until(lambda: gpus_of(api, "short"), "binding of short", timeout=20) != gpus_of(api, "z")
    assert gpus_of(api, "long") is None

    extender.kill(signal.SIGKILL)  # reservations are stored nowhere: the new process derives them again
    extender.start()
    again = until(lambda: reservation(extender), "reservation after the restart")
    assert {k: again[k] for k in ("pod", "node", "expected_start", "expires")} == \
        {k: held[k] for k in ("pod", "node", "expected_start", "expires")}
