"""Drain leases through the real kube-scheduler 1.20.2, the real Job controller and `tessera serve --drain-lease on`
(queue_reservations.py, kube/preemptor.py).

One node of 2 GPUs, the fixed drain pool's one node (kept for 2-GPU pods, which reserve at once:
`--reservation-wait 2=0s`, and may hold the whole cluster: `--reservation-max-share 1`), which takes other pods only if
they declare a run of at most 20 s (`--drain-pool-run 20s`). A batch/v1 Job asks one GPU and declares nothing. No
other node takes its pod, so Tessera lends the kept node: the pod binds there on a lease. 20 s later the lease lapses
with the pod still there and nobody waiting for the node: the lease is renewed and the pod runs on. Then a 2-GPU pod
comes; kube-scheduler's own check refuses it (one GPU is free), and Tessera's sweep reserves the node for it. At the
renewed lease's end Tessera deletes the Job's pod, and the 2-GPU pod binds there. Once it has gone, the Job
controller's new pod is not lent the node again: it waits, refused in words.
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
        "--reservations", "on", "--reservation-wait", "2=0s", "--reservation-max-share", "1", "--drain-pool", "1",
        "--drain-pool-run", f"{BOUND_S}s", "--drain-lease", "on"))
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


def big_pod() -> dict:
    limits = {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "2"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": NS}, "spec": {
        "terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "none", "resources": {"limits": limits}}]}}


def test_a_job_pod_lent_the_kept_node_runs_on_until_a_reservation_waits_then_is_deleted_at_the_bound(env):
    core, batch, extender = env["core"], env["batch"], env["extender"]
    batch.create_namespaced_job(NS, job_body())

    def pods():
        return [p for p in core.list_namespaced_pod(NS, label_selector=f"job-name={JOB}").items
                if not p.metadata.deletion_timestamp]

    def state():
        events = core.list_namespaced_event(NS).items
        return {"pods": [(p.metadata.name, p.spec.node_name) for p in pods()],
                "leases": extender.inspect().get("drain_leases"),
                "events": [(e.involved_object.name, e.reason, e.message) for e in events][-16:],
                "all_pods": [(p.metadata.name, p.spec.node_name) for p in core.list_namespaced_pod(NS).items]}

    def bound():
        got = [p for p in pods() if p.spec.node_name and ASSIGNMENT_ANNOTATION in (p.metadata.annotations or {})]
        return got[0] if got else None

    first = until("the Job's pod bound on a lease", bound, describe=state)
    assert first.spec.node_name == NODE
    (lease,) = until("the lease in /inspect", lambda: extender.inspect().get("drain_leases"), describe=state)
    assert lease["pod"] == f"{NS}/{first.metadata.name}" and lease["node"] == NODE

    def renewed():
        leases = extender.inspect().get("drain_leases")
        return leases if leases and leases[0]["ends"] > lease["ends"] else None

    (again,) = until("the lease renewed at its end (no reservation holds the node)", renewed, timeout=BOUND_S + 30,
                     describe=state)
    assert again["pod"] == lease["pod"] and [p.metadata.name for p in pods()] == [first.metadata.name]
    assert not core.list_namespaced_event(NS, field_selector="reason=TesseraLeaseEnded").items
    core.create_namespaced_pod(NS, big_pod())
    until("the 2-GPU pod's reservation on the kept node",
          lambda: any(r.get("node") == NODE for r in extender.inspect().get("queue_reservations", ())), describe=state)

    def successor():
        now = pods()
        return now if now and all(p.metadata.name != first.metadata.name for p in now) else None

    (second,) = until("Tessera to delete the pod at its lease's end and the Job to make another", successor,
                      timeout=BOUND_S + 60, describe=state)
    # kube-scheduler retries a pod it found unschedulable when a bound pod is deleted, or at the latest when its
    # unschedulable queue is flushed (pods left there 60 s, checked every 30 s): hence up to 90 s, and a margin
    until("the 2-GPU pod bound on the node it reserved",
          lambda: core.read_namespaced_pod("big", NS).spec.node_name == NODE, timeout=150, describe=state)
    ended = [e for e in core.list_namespaced_event(NS).items
             if e.involved_object.name == first.metadata.name and e.reason == "TesseraLeaseEnded"]
    assert ended and f"ran past its drain lease on {NODE}" in ended[0].message

    # the 2-GPU pod leaves; the node is free, and the Job's new pod is still not lent it: its runs outlast the bound
    core.delete_namespaced_pod("big", NS, grace_period_seconds=0)

    def refused():
        events = core.list_namespaced_event(NS).items
        return [e for e in events if e.involved_object.name == second.metadata.name and "kept drainable" in e.message]

    until("the successor refused the kept node in words", refused, timeout=150, describe=state)
    assert core.read_namespaced_pod(second.metadata.name, NS).spec.node_name is None
    assert extender.inspect().get("drain_leases") == []
