"""Two extender replicas behind one URL: the follower serves filter/prioritize from its own cache
and forwards binds to the Lease holder's pod over mutual TLS; killing the leader mid-stream loses
and duplicates nothing."""

from __future__ import annotations

import json
import time

from kubernetes import client

from extender.translate.objects import ASSIGNMENT_ANNOTATION
from testing.local_cluster import ExtenderProcess

from .test_kube_e2e import NS, make_node, make_pod

LEASE = ("--leader-elect", "--lease-namespace", "default", "--lease-name", "ha-e2e", "--lease-duration", "3")


def holder() -> str:
    try:
        return client.CoordinationV1Api().read_namespaced_lease("ha-e2e", "default").spec.holder_identity or ""
    except client.exceptions.ApiException:
        return ""


def wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def bound(api, names) -> set[str]:
    return {p.metadata.name for p in api.list_namespaced_pod(NS).items if p.metadata.name in names and p.spec.node_name}


def replica_pod(api, name: str, ip: str, node: str) -> None:
    """The Pod object a replica of the Deployment would have: followers forward binds only to a
    Ready pod with the extender's ServiceAccount and labels, at its podIP (http/forward.py)."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "tessera-extender", "pod-template-hash": name}},
            "spec": {"serviceAccountName": "tessera-extender", "nodeName": node,
                     "containers": [{"name": "extender", "image": "none"}]}}
    api.create_namespaced_pod(NS, body)
    api.patch_namespaced_pod_status(name, NS, {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                                          "conditions": [{"type": "Ready", "status": "True"}]}})


def test_killing_the_leader_mid_stream_loses_and_duplicates_nothing(cluster):
    api, work, original = cluster["api"], cluster["dir"], cluster["extender"]
    for n in ("ha-0", "ha-1"):
        make_node(api, n, 4, "L4")
    # two "pods" on two loopback addresses and one port, as replicas have one port on two pod IPs
    replica_pod(api, "replica-l", "127.0.0.2", "ha-1")
    replica_pod(api, "replica-f", "127.0.0.1", "ha-1")
    original.kill()  # its port is the one kube-scheduler calls: the follower takes it
    leader = ExtenderProcess(work / "kubeconfig", original.port, work / "ha-leader.log", args=LEASE,
                             env={"POD_NAME": "replica-l"}, pki=original.pki, host="127.0.0.2")
    follower = ExtenderProcess(work / "kubeconfig", original.port, work / "ha-follower.log", args=LEASE,
                               env={"POD_NAME": "replica-f"}, pki=original.pki)
    names = [f"ha-{i}" for i in range(60)]
    try:
        leader.start()
        wait(lambda: holder() == "replica-l", 20, "replica-l to take the lease")
        follower.start()
        for i, name in enumerate(names):
            make_pod(api, name, {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": str(60 + 15 * (i % 9))},
                     models=["L4"])
            if i == 20:
                # binds so far went scheduler -> follower -> leader: some must have landed
                wait(lambda: len(bound(api, names[:21])) >= 5, 60, "binds forwarded to the leader")
                before = bound(api, names)
                leader.kill()  # kill -9: no lease release, in-flight binds cut off
        wait(lambda: holder() == "replica-f", 30, "the follower to take the lease")
        wait(lambda: len(bound(api, names)) == len(names), 120, "every pod bound")
        used: dict[tuple[str, int], int] = {}
        for pod in api.list_namespaced_pod(NS).items:
            ann = (pod.metadata.annotations or {}).get(ASSIGNMENT_ANNOTATION)
            if pod.metadata.name in names:
                assert ann, f"{pod.metadata.name} bound without an assignment"
            if pod.spec.node_name and ann:
                a = json.loads(ann)
                assert a["node"] == pod.spec.node_name
                for g in a["gpus"]:
                    used[(a["node"], g)] = used.get((a["node"], g), 0) + a["milli"]
        assert max(used.values()) <= 1000
        assert not follower.inspect()["not_counted"]
        assert len(before) >= 5
    finally:
        leader.kill()
        follower.kill()
        original.start()  # later tests talk to a single replica again
        # its 60 pods go too, as a finished job's do: later modules share this cluster, and a replica started with
        # another key (test_keyring_e2e's install step) rightly refuses to start beside pods signed by a key it lacks
        for name in ("replica-l", "replica-f", *names):
            try:
                api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
            except client.exceptions.ApiException as e:
                if e.status != 404:
                    raise
        for n in ("ha-0", "ha-1"):  # and its nodes, empty now: later modules place pods by their own nodes
            api.delete_node(n)
