"""Drain leases through the real kube-scheduler 1.20.2, the real Job controller and `tessera serve --drain-lease on`
(queue_reservations.py, kube/preemptor.py).

One node of 2 GPUs, the fixed drain pool's one node (kept for 2-GPU pods: `--reservation-wait 2=1h`), which takes other
pods only if they declare a run of at most 20 s (`--drain-pool-run 20s`). A batch/v1 Job asks one GPU and declares
nothing. No other node takes its pod, so Tessera lends the kept node: the pod binds there on a lease. 20 s later the
lease lapses with the pod still there; Tessera deletes it, the Job controller makes a new pod, and that one is not
lent the node again: it waits, refused in words.
"""

from __future__ import annotations

import pytest

from tessera_contract import ASSIGNMENT_ANNOTATION
from testing.local_cluster import LocalCluster

from .conftest import CONTROLLERS
from .harness import skip_without_control_plane, until

NS = "default"
NODE = "lease-0"
JOB = "overrunner"
BOUND_S = 20


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    skip_without_control_plane(controllers=True)
    from kubernetes import client, config

    local = LocalCluster(tmp_path_factory.mktemp("leasecp"), controllers=CONTROLLERS, extender_args=(
        "--reservations", "on", "--reservation-wait", "2=1h", "--drain-pool", "1", "--drain-pool-run", f"{BOUND_S}s",
        "--drain-lease", "on"))
    try:
        local.start()
        api_client = config.new_client_from_config(config_file=str(local.work / "kubeconfig"))
        core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
            "nvidia.com/gpu.product": "L4", "kubernetes.io/hostname": NODE}}})
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"}
        core.patch_node_status(NODE, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
        until("the node in tessera's cache", lambda: any(n["name"] == NODE for n in local.extender.inspect()["nodes"]))
        yield {"core": core, "batch": batch, "extender": local.extender}
    finally:
        local.stop()


def job_body() -> dict:
    container = {"name": "c", "image": "none", "resources": {"limits": {"cpu": "100m", "memory": "64Mi",
                                                                        "nvidia.com/gpu": "1"}}}
    # terminationGracePeriodSeconds 0: no kubelet confirms a bound pod's deletion (the node is an API object only)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": JOB, "namespace": NS},
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 4, "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [container]}}}}


def test_a_job_pod_lent_the_kept_node_is_deleted_at_the_bound_and_its_successor_is_not_lent_it(env):
    core, batch, extender = env["core"], env["batch"], env["extender"]
    batch.create_namespaced_job(NS, job_body())

    def pods():
        return [p for p in core.list_namespaced_pod(NS, label_selector=f"job-name={JOB}").items
                if not p.metadata.deletion_timestamp]

    def state():
        events = core.list_namespaced_event(NS).items
        return {"pods": [(p.metadata.name, p.spec.node_name) for p in pods()],
                "leases": extender.inspect().get("drain_leases"),
                "events": [(e.involved_object.name, e.reason, e.message) for e in events][-12:]}

    def bound():
        got = [p for p in pods() if p.spec.node_name and ASSIGNMENT_ANNOTATION in (p.metadata.annotations or {})]
        return got[0] if got else None

    first = until("the Job's pod bound on a lease", bound, describe=state)
    assert first.spec.node_name == NODE
    (lease,) = until("the lease in /inspect", lambda: extender.inspect().get("drain_leases"), describe=state)
    assert lease["pod"] == f"{NS}/{first.metadata.name}" and lease["node"] == NODE

    def successor():
        now = pods()
        return now if now and all(p.metadata.name != first.metadata.name for p in now) else None

    (second,) = until("Tessera to delete the pod at its lease's end and the Job to make another", successor,
                      timeout=BOUND_S + 60, describe=state)
    ended = [e for e in core.list_namespaced_event(NS).items
             if e.involved_object.name == first.metadata.name and e.reason == "TesseraLeaseEnded"]
    assert ended and f"ran past its drain lease on {NODE}" in ended[0].message

    def refused():
        events = core.list_namespaced_event(NS).items
        return [e for e in events if e.involved_object.name == second.metadata.name and "kept drainable" in e.message]

    until("the successor refused the kept node in words", refused, timeout=60, describe=state)
    assert core.read_namespaced_pod(second.metadata.name, NS).spec.node_name is None
    assert extender.inspect().get("drain_leases") == []
