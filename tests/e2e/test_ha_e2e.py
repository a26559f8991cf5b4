"""Two extender replicas behind one URL: the follower serves filter/prioritize from its own cache
and forwards binds to the Lease holder; killing the leader mid-stream loses and duplicates nothing."""

from __future__ import annotations

import json
import time

from kubernetes import client

from extender.kube.contract import ASSIGNMENT_ANNOTATION

from .harness import ExtenderProcess, free_port
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


def test_killing_the_leader_mid_stream_loses_and_duplicates_nothing(cluster):
    api, work, original = cluster["api"], cluster["dir"], cluster["extender"]
    for n in ("ha-0", "ha-1"):
        make_node(api, n, 4, "L4")
    original.kill()  # its port is the one kube-scheduler calls: the follower takes it
    lport = free_port()
    leader = ExtenderProcess(work / "kubeconfig", lport, work / "ha-leader.log",
                             args=(*LEASE, "--advertise-url", f"http://127.0.0.1:{lport}/tessera"),
                             env={"POD_NAME": "replica-l"})
    follower = ExtenderProcess(work / "kubeconfig", original.port, work / "ha-follower.log",
                               args=(*LEASE, "--advertise-url", f"http://127.0.0.1:{original.port}/tessera"),
                               env={"POD_NAME": "replica-f"})
    try:
        leader.start()
        wait(lambda: holder() == "replica-l", 20, "replica-l to take the lease")
        follower.start()
        names = [f"ha-{i}" for i in range(60)]
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
