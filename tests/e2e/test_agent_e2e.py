"""The node agent (static backend) against a real control plane and `tessera serve`.

Its own control plane (not the session's): its node and pods would otherwise change what the
other scenarios count. The agent is the real `tessera agent` process; only its GPUs come from a
file, which the test rewrites to make out-of-band memory appear and a GPU fail.

The agent makes no API call: `tessera serve` pulls its report from the agent pod on the node
and writes the Node (extender/kube/agents.py). There is no kubelet here, so the test writes the
agent pod as the DaemonSet controller and a kubelet would: owned by the tessera-agent DaemonSet,
running as its ServiceAccount, bound to the node, Running, its pod IP 127.0.0.1 and its port
the one the agent process listens on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity

from testing.local_cluster import ROOT, LocalCluster, free_port

from .harness import skip_without_control_plane

NS = "default"
NODE = "agent-node"
MODEL = "NVIDIA-H200"
TAINT = {"key": "e2e/agent", "operator": "Exists", "effect": "NoSchedule"}
SYSTEM = "tessera-system"
MEMORY = 143771  # MiB, an H200


def gpu(i, **extra):
    return {"index": i, "uuid": f"GPU-e2e0000{i}-0000-4000-8000-00000000000{i}", "model": "NVIDIA H200",
            "memory_mib": MEMORY, **extra}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    skip_without_control_plane()
    from kubernetes import client, config

    local = LocalCluster(tmp_path_factory.mktemp("agentcp"), extender_args=("--agent-interval", "0.5"))
    agent = None
    try:
        local.start()
        kubeconfig = local.work / "kubeconfig"
        config.load_kube_config(config_file=str(kubeconfig))
        api = client.CoreV1Api()
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        api.create_node({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                         "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}})
        api.patch_node_status(NODE, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}})
        inventory = local.work / "gpus.json"
        inventory.write_text(json.dumps({"gpus": [gpu(0), gpu(1)]}))
        metrics = free_port()
        agent_pod(api, client.AppsV1Api(), "tessera-agent-e2e", metrics)
        log = open(local.work / "agent.log", "ab")

        def start_agent() -> subprocess.Popen:  # no kubeconfig: the agent has no API access at all
            return subprocess.Popen(
                [sys.executable, "-m", "extender.cli", "agent", "--node-name", NODE,
                 "--inventory", str(inventory), "--interval", "0.5", "--metrics-listen", f"127.0.0.1:{metrics}"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def restart_agent() -> None:
            nonlocal agent
            os.killpg(agent.pid, 9)  # kill -9: no goodbye, whatever it was writing is cut off
            agent.wait(10)
            agent = start_agent()

        agent = start_agent()
        yield {"api": api, "extender": local.extender, "inventory": inventory, "metrics": metrics, "dir": local.work,
               "restart_agent": restart_agent}
    finally:
        if agent is not None and agent.poll() is None:
            os.killpg(agent.pid, 15)
            agent.wait(10)
        local.stop()


def agent_pod(api, apps, name, port, namespace=SYSTEM, owned=True):
    """The pod the DaemonSet controller would create, with the status a kubelet would write."""
    owners = []
    if owned:
        labels = {"app.kubernetes.io/name": "tessera-agent"}
        for make in (lambda: api.create_namespace({"metadata": {"name": namespace}}),
                     lambda: api.create_namespaced_service_account(namespace, {"metadata": {"name": "tessera-agent"},
                                                                               "automountServiceAccountToken": False}),
                     lambda: apps.create_namespaced_daemon_set(namespace, {"metadata": {"name": "tessera-agent"}, "spec": {
                         "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                             "containers": [{"name": "agent", "image": "none"}]}}}})):
            try:
                make()
            except ApiException as e:  # already there from an earlier call
                if e.status != 409:
                    raise
        ds = apps.read_namespaced_daemon_set("tessera-agent", namespace)
        owners = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "tessera-agent", "uid": ds.metadata.uid,
                   "controller": True, "blockOwnerDeletion": True}]
    api.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "labels": {"app.kubernetes.io/name": "tessera-agent"}, "ownerReferences": owners}, "spec": {
        "nodeName": NODE, "serviceAccountName": "tessera-agent", "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "agent", "image": "none", "ports": [{"name": "metrics", "containerPort": port}]}]}})
    api.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running", "podIP": "127.0.0.1",
                                                                 "podIPs": [{"ip": "127.0.0.1"}]}})


def until(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def extender_gpus(env):
    nodes = [n for n in env["extender"].inspect()["nodes"] if n["name"] == NODE]
    return nodes[0]["gpus"] if nodes else []


def make_pod(api, name, milli):
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "tolerations": [TAINT],
        "containers": [{"name": "c", "image": "none",
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi", "tessera.dev/gpu-milli": str(milli)}}}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [MODEL]}]}]}}}}})


def bound_gpu(api, name, timeout=60.0):
    def check():
        pod = api.read_namespaced_pod(name, NS)
        return pod if pod.spec.node_name else None

    pod = until(f"pod {name} bound", check, timeout)
    return json.loads(pod.metadata.annotations["tessera.dev/gpu-assignment"])["gpus"][0], pod.metadata.uid


def delete(api, name):
    api.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_the_agents_report_is_published_as_inventory_label_and_capacity_once(env):
    api = env["api"]
    node = until("the agent's first publication", lambda: (
        n if (n := api.read_node(NODE)).metadata.annotations and "tessera.dev/gpu-inventory" in n.metadata.annotations
        and (n.status.capacity or {}).get("tessera.dev/gpu-milli") else None))
    published = json.loads(node.metadata.annotations["tessera.dev/gpu-inventory"])["gpus"]
    assert [(g["index"], g["uuid"], g["model"], g["memory_mib"], g["healthy"], g["oob_memory_mib"]) for g in published] == [
        (i, gpu(i)["uuid"], MODEL, MEMORY, True, 0) for i in range(2)]
    assert node.metadata.labels["nvidia.com/gpu.product"] == MODEL
    assert parse_quantity(node.status.capacity["tessera.dev/gpu-milli"]) == 2000
    until("the extender to see both GPUs", lambda: len(extender_gpus(env)) == 2)
    version = api.read_node(NODE).metadata.resource_version
    time.sleep(3)  # six more ticks with nothing new: no write
    assert api.read_node(NODE).metadata.resource_version == version


def test_out_of_band_memory_moves_the_next_slice_and_a_slices_own_memory_does_not(env):
    api, inventory = env["api"], env["inventory"]
    make_pod(api, "before", 500)
    first, uid = bound_gpu(api, "before")
    other = 1 - first
    # the slice's own process on its GPU is not out-of-band; the agent's metrics show it by pod UID
    inventory.write_text(json.dumps({"gpus": [gpu(i, processes=[{"pid": 100, "used_mib": 30000, "pod_uid": uid}] if i == first
                                                  else []) for i in range(2)]}))
    text = until("the slice's use in the metrics", lambda: (
        t if f'pod_uid="{uid}"' in (t := urllib.request.urlopen(f"http://127.0.0.1:{env['metrics']}/metrics").read().decode())
        else None))
    assert f'tessera_gpu_pod_memory_used_bytes{{gpu="{first}",node="{NODE}",pod_uid="{uid}"' in text
    time.sleep(2)  # four pulls: the extender judged the 30000 MiB in-band (its signed assignment is on that GPU)
    assert all(g["oob_memory_mib"] == 0 for g in json.loads(api.read_node(NODE).metadata.annotations[
        "tessera.dev/gpu-inventory"])["gpus"])
    assert all(g["free_milli"] == (500 if g["index"] == first else 1000) for g in extender_gpus(env))
    # the slice's process ends before its pod is gone, as a container's does: once the pod is deleted a
    # process still naming its UID belongs to no pod the extender knows, and would count out-of-band
    inventory.write_text(json.dumps({"gpus": [gpu(i) for i in range(2)]}))
    until("the slice's process to leave the metrics", lambda: f'pod_uid="{uid}"' not in urllib.request.urlopen(
        f"http://127.0.0.1:{env['metrics']}/metrics").read().decode())
    delete(api, "before")
    until("the slice to be released", lambda: all(g["free_milli"] == 1000 for g in extender_gpus(env)))
    # a process Kubernetes knows nothing of takes 70% of the GPU the first slice went to
    inventory.write_text(json.dumps({"gpus": [gpu(i, processes=[{"pid": 4242, "used_mib": int(MEMORY * 0.7)}] if i == first
                                                  else []) for i in range(2)]}))
    free = until("the extender to withhold the out-of-band share", lambda: (
        [g["free_milli"] for g in gs] if (gs := extender_gpus(env)) and gs[first]["free_milli"] < 500 else None))
    assert free[first] == 1000 - 702 and free[other] == 1000  # 70% rounded up to 256 MiB: 100608 MiB -> 700.x -> 701+1
    make_pod(api, "after", 500)
    assert bound_gpu(api, "after")[0] == other  # the same pod on the same empty node now goes elsewhere
    env["after_gpu"], env["oob_gpu"] = other, first


def test_an_unhealthy_gpu_gets_no_new_pods_and_its_pods_are_named(env):
    api, inventory = env["api"], env["inventory"]
    bad, oob = env["after_gpu"], env["oob_gpu"]
    make_pod(api, "fits-now", 400)  # 500 left beside "after"; 298 beside the out-of-band use
    assert bound_gpu(api, "fits-now")[0] == bad
    delete(api, "fits-now")
    until("fits-now released", lambda: extender_gpus(env)[bad]["free_milli"] == 500)
    gpus = [gpu(i) for i in range(2)]
    gpus[oob]["processes"] = [{"pid": 4242, "used_mib": int(MEMORY * 0.7)}]
    gpus[bad].update(healthy=False, health_reason="XID 79")
    inventory.write_text(json.dumps({"gpus": gpus}))
    shown = until("the extender to withdraw the GPU", lambda: (
        m if (m := env["extender"].inspect())["unhealthy_gpus"] else None))
    assert shown["unhealthy_gpus"] == [{"node": NODE, "gpu": bad, "uuid": gpu(bad)["uuid"], "pods": ["default/after"]}]
    assert until("capacity to drop", lambda: parse_quantity(api.read_node(NODE).status.capacity["tessera.dev/gpu-milli"]) == 1000)
    make_pod(api, "refused", 400)
    time.sleep(4)
    assert not api.read_namespaced_pod("refused", NS).spec.node_name
    reasons = env["extender"].inspect(f"{NS}/refused")["nodes"]
    assert reasons[NODE] == "no GPU has 400 milli free (largest free share 298)"
    log = (env["dir"] / "tessera.log").read_text()
    assert "is unhealthy: withdrawn from placement; pods on it: default/after" in log


def test_a_killed_agent_restarts_and_publishes_what_the_gpus_hold_now(env):
    api, inventory = env["api"], env["inventory"]
    env["restart_agent"]()  # killed, and the GPUs change while it is down
    inventory.write_text(json.dumps({"gpus": [gpu(0, processes=[{"pid": 77, "used_mib": MEMORY // 2}]), gpu(1)]}))
    env["restart_agent"]()

    def published():  # the annotation and the status capacity are two writes: wait for both
        node = api.read_node(NODE)
        ann = (node.metadata.annotations or {}).get("tessera.dev/gpu-inventory")
        gpus = json.loads(ann)["gpus"] if ann else []
        healthy_again = parse_quantity(node.status.capacity.get("tessera.dev/gpu-milli", "0")) == 2000
        return gpus if gpus and gpus[0].get("oob_memory_mib", 0) >= MEMORY // 2 and gpus[1].get("healthy") \
            and healthy_again else None

    gpus = until("the restarted agent's inventory and capacity", published)
    assert [g["index"] for g in gpus] == [0, 1]
    # and the extender places by it: GPU 0 has at most half of its milli open
    seen = until("the extender to see it", lambda: next((n for n in env["extender"].inspect()["nodes"]
                                                          if n["name"] == NODE and n["gpus"][0]["free_milli"] <= 500), None))
    assert seen["gpus"][1]["free_milli"] + sum(h["milli"] for h in seen["gpus"][1]["holders"]) == 1000


class Counting(BaseHTTPRequestHandler):
    """An impostor agent: a report claiming the node's GPUs are full. It must never be asked."""

    hits = 0

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        body = json.dumps({"gpus": [gpu(i, pods={}, unattributed_mib=MEMORY) for i in range(2)]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_an_unsigned_pods_memory_is_out_of_band_and_impostor_agents_are_not_asked(env):
    """A tenant pod on the node with a self-written assignment (no MAC) holds memory on the GPU the
    valid pod `after` shares: the extender counts the squatter's memory out-of-band, `after`'s not.
    Impostor agent pods (in a tenant namespace; in Tessera's but not the DaemonSet's) are never asked."""
    from kubernetes import client

    api, inventory = env["api"], env["inventory"]
    shared = env["after_gpu"]
    after_uid = api.read_namespaced_pod("after", NS).metadata.uid
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "squatter", "annotations": {
        "tessera.dev/gpu-assignment": json.dumps({"node": NODE, "gpus": [shared], "milli": 500, "uuids": []})}},
        "spec": {"nodeName": NODE, "tolerations": [TAINT], "containers": [{"name": "c", "image": "none"}]}})
    squatter_uid = api.read_namespaced_pod("squatter", NS).metadata.uid
    impostor = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        port = impostor.server_address[1]
        agent_pod(api, client.AppsV1Api(), "tessera-agent-impostor", port, namespace=NS)
        agent_pod(api, client.AppsV1Api(), "tessera-agent-unowned", port, namespace=SYSTEM, owned=False)
        gpus = [gpu(0), gpu(1)]
        gpus[shared]["processes"] = [{"pid": 10, "used_mib": 20000, "pod_uid": after_uid},
                                     {"pid": 11, "used_mib": 40000, "pod_uid": squatter_uid}]
        inventory.write_text(json.dumps({"gpus": gpus}))

        def published():
            ann = (api.read_node(NODE).metadata.annotations or {}).get("tessera.dev/gpu-inventory")
            got = json.loads(ann)["gpus"] if ann else []
            return got if got and got[shared]["oob_memory_mib"] > 0 and got[1 - shared]["oob_memory_mib"] == 0 else None

        got = until("the squatter's memory out-of-band", published)
        assert got[shared]["oob_memory_mib"] == 40192  # 40000 MiB up to the next 256: the squatter's, not after's 20000
        time.sleep(2)
        assert Counting.hits == 0, "an impostor agent pod was asked for its report"
        assert got == json.loads(api.read_node(NODE).metadata.annotations["tessera.dev/gpu-inventory"])["gpus"]
    finally:
        impostor.shutdown()
