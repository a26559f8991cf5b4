"""Real nodes (issue 34, first step): two kubelets v1.20.2 from the same source build as the control plane, each
with a containerd of its own (Debian's, with runc) and a CNI bridge, joined to a local control plane with
`tessera serve` as kube-scheduler's extender (scripts/node.sh). Pods run in containers from images built locally
(no registry): one pinned to each node, one placed by kube-scheduler through Tessera, and one reaching a pod of the
other node over the pod network. The apiserver reads their logs from the kubelets.

Not yet here (the rest of issue 34): the Tessera image, a device plugin advertising fake GPUs, the shipped
manifests as Deployments and DaemonSets on these nodes, kube-proxy for Services.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from .harness import KUBE_BIN, ROOT, LocalCluster, skip_without_control_plane, until

NODE_SH = ROOT / "scripts/node.sh"
NODES = ("kubelet-a", "kubelet-b")
BUSYBOX = "docker.io/tessera/busybox:local"  # scripts/node.sh builds and imports it


def missing_for_nodes() -> str:
    """Why real nodes cannot run here, or ""."""
    if os.geteuid() != 0:
        return "real nodes need root (containerd and the kubelet make mounts, cgroups and network namespaces)"
    if not (KUBE_BIN / "kubelet").exists():
        return f"{KUBE_BIN}/kubelet missing: scripts/kube-build.sh (recipe r4) builds it"
    for b in ("containerd", "runc", "buildah", "ctr"):
        if not shutil.which(b):
            return f"{b} missing: scripts/kube-build.sh installs Debian's containerd, runc, buildah, busybox-static"
    return ""


def node_sh(*args: str) -> None:
    subprocess.run([str(NODE_SH), *args], check=True, env=dict(os.environ, TESSERA_KUBE_BIN=str(KUBE_BIN)))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    skip_without_control_plane()
    why = missing_for_nodes()
    if why:
        pytest.skip(why)
    from kubernetes import client, config

    local = LocalCluster(tmp_path_factory.mktemp("nodescp"))
    started: list[str] = []
    try:
        local.start()
        t0 = time.monotonic()
        for i, name in enumerate(NODES, start=1):
            node_sh("start", str(local.work), name, str(i))
            started.append(name)
        print(f"\n[nodes] {len(NODES)} kubelets Ready {time.monotonic() - t0:.1f} s after the first start")
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(local.work / "kubeconfig")))
        until("the nodes in tessera's cache", lambda: set(NODES) <= {n["name"] for n in local.extender.inspect()["nodes"]})
        yield {"api": api, "dir": local.work}
    finally:
        for name in started:
            subprocess.run([str(NODE_SH), "stop", str(local.work), name], check=False)
        local.stop()


def busybox_pod(name: str, command: str, node: str = "", selector: dict | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                                  "command": ["/bin/sh", "-c", command],
                                  "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}}}],
                  "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def running(api, name: str):
    pod = api.read_namespaced_pod(name, "default")
    waiting = [s.state.waiting.reason for s in pod.status.container_statuses or [] if s.state.waiting]
    assert not {"ErrImageNeverPull", "CreateContainerError", "CrashLoopBackOff"} & set(waiting), (name, waiting)
    return pod if pod.status.phase == "Running" else None


def test_two_kubelets_register_ready_with_their_own_capacity(real):
    api = real["api"]
    for name in NODES:
        node = api.read_node(name)
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready["Ready"] == "True", ready
        assert node.metadata.labels["tessera.dev/kubelet"] == "real"
        assert node.status.node_info.kubelet_version == "v1.20.2"
        assert node.status.node_info.container_runtime_version.startswith("containerd://1.6")
        assert int(node.status.capacity["cpu"]) == os.cpu_count()  # read from the machine, not a patched object


def test_a_pod_pinned_to_each_node_runs_and_its_log_comes_from_that_kubelet(real):
    api = real["api"]
    for name in NODES:
        api.create_namespaced_pod("default", busybox_pod(f"hello-{name}", "echo ran as $(id -u) on $(hostname); sleep 3600",
                                                         node=name))
    for name in NODES:
        pod = until(f"hello-{name} running", lambda n=name: running(api, f"hello-{n}"), timeout=90)
        assert pod.status.pod_ip.startswith(f"10.244.{NODES.index(name) + 1}.")  # the node's own pod subnet
        text = until(f"hello-{name}'s log", lambda n=name: api.read_namespaced_pod_log(f"hello-{n}", "default"))
        assert text.startswith("ran as 0 on hello-"), text


def test_kube_scheduler_and_tessera_place_a_pod_that_a_kubelet_then_runs(real):
    """kube-scheduler with the shipped extender configuration (filter and prioritize call Tessera) binds a pod to
    the node its selector names, and that node's kubelet starts it."""
    api = real["api"]
    api.create_namespaced_pod("default", busybox_pod("placed", "sleep 3600", selector={"kubernetes.io/hostname": NODES[1]}))
    pod = until("placed running", lambda: running(api, "placed"), timeout=90)
    assert pod.spec.node_name == NODES[1]


def test_a_pod_reaches_a_pod_of_the_other_node_over_the_pod_network(real):
    api = real["api"]
    api.create_namespaced_pod("default", busybox_pod(
        "server", "mkdir -p /www && echo from-the-other-node > /www/index.html && busybox httpd -f -p 8080 -h /www",
        node=NODES[0]))
    server = until("server running", lambda: running(api, "server"), timeout=90)
    api.create_namespaced_pod("default", busybox_pod(
        "client", f"for i in $(seq 1 30); do wget -q -O - http://{server.status.pod_ip}:8080/ && break; "
        "sleep 1; done; sleep 3600", node=NODES[1]))
    until("client running", lambda: running(api, "client"), timeout=90)
    text = until("the client's fetch", lambda: "from-the-other-node" in api.read_namespaced_pod_log("client", "default"))
    assert text
