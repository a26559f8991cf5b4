"""kube-controller-manager on the local cluster (issue 33): a batch/v1 Job's pods are made by the real Job
controller, placed by kube-scheduler and Tessera, and removed by the real garbage collector with the Job.

The `controllers` cluster of conftest.py, with only the `job` and `garbagecollector` controllers (CP_CONTROLLERS
of scripts/controlplane.sh): the session cluster runs none, since its Nodes are fake and the node lifecycle
controller would taint them and evict their pods. Skipped when kube-controller-manager is not built
(scripts/kube-build.sh recipe r3 or later).
"""

from __future__ import annotations

import json

import pytest

from tessera_contract import ASSIGNMENT_ANNOTATION

from .harness import until

NS = "default"
NODES = ("job-gpu-0", "job-gpu-1")  # 2 GPUs each: 4 GPUs for the Job's 3 one-GPU pods
JOB = "trainers"


@pytest.fixture(scope="module")
def env(controllers):
    core = controllers["core"]
    for name in NODES:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": "T4", "kubernetes.io/hostname": name}}})
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"}
        core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
    until("nodes in tessera's cache", lambda: set(NODES) <= {n["name"] for n in controllers["extender"].inspect()["nodes"]})
    return controllers


def job_body() -> dict:
    container = {"name": "c", "image": "none", "resources": {"limits": {
        "cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"}}}
    # terminationGracePeriodSeconds 0: no kubelet confirms a bound pod's deletion, so with the default 30 s
    # grace period the garbage collector's delete would leave the pods Terminating for good
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": JOB, "namespace": NS},
            "spec": {"parallelism": 3, "completions": 3, "backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [container]}}}}


def job_pods(core) -> list:
    return core.list_namespaced_pod(NS, label_selector=f"job-name={JOB}").items


def job_state(core, batch) -> dict:
    """The Job's status, its pods' nodes and their events (why a pod waits)."""
    events = core.list_namespaced_event(NS).items
    pods = {p.metadata.name: [p.spec.node_name, p.metadata.deletion_timestamp,
                              [e.message for e in events if e.involved_object.name == p.metadata.name]]
            for p in job_pods(core)}
    try:
        status = batch.read_namespaced_job_status(JOB, NS).status.to_dict()
    except Exception as e:  # noqa: BLE001 - only for the failure message
        status = repr(e)[:200]
    return {"job": status, "pods": pods}


def test_a_job_is_run_by_the_job_controller_placed_by_tessera_and_collected_with_its_pods(env):
    core, batch = env["core"], env["batch"]
    job = batch.create_namespaced_job(NS, job_body())

    def placed():
        pods = job_pods(core)
        done = [p for p in pods if p.spec.node_name and ASSIGNMENT_ANNOTATION in (p.metadata.annotations or {})]
        return pods if len(pods) >= 3 and len(done) == len(pods) else None

    pods = until("3 Job pods bound with Tessera's assignment", placed, describe=lambda: job_state(core, batch))
    assert len(pods) == 3, [p.metadata.name for p in pods]  # parallelism 3: the controller makes no more
    seen = set()
    for pod in pods:
        owner = next(r for r in pod.metadata.owner_references if r.controller)
        assert (owner.kind, owner.name, owner.uid) == ("Job", JOB, job.metadata.uid)
        assert pod.spec.node_name in NODES
        a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
        assert a["node"] == pod.spec.node_name and len(a["gpus"]) == 1 and a["milli"] == 1000
        seen.add((a["node"], a["gpus"][0]))
    assert len(seen) == 3, seen  # three different GPUs

    batch.delete_namespaced_job(JOB, NS, propagation_policy="Background")
    # the apiserver only deletes the Job; its pods go because the garbage collector finds their owner gone
    until("the garbage collector to delete the Job's pods", lambda: not job_pods(core),
          describe=lambda: job_state(core, batch))

    def released():
        held = [h["pod"] for n in env["extender"].inspect()["nodes"] for g in n["gpus"] for h in g["holders"]]
        return not [h for h in held if h.startswith(f"{NS}/{JOB}-")]

    until("Tessera's cache to give the pods' GPUs back", released, timeout=20)
