"""Real nodes (issue 34, first steps): two kubelets v1.20.2 from the same source build as the control plane, each
with a containerd of its own (Debian's, with runc) and a CNI bridge, joined to a local control plane with
`tessera serve` as kube-scheduler's extender and kube-controller-manager's DaemonSet controller (scripts/node.sh).
Pods run in containers from images built locally (no registry): one pinned to each node, one placed by
kube-scheduler through Tessera, and one reaching a pod of the other node over the pod network; the apiserver reads
their logs from the kubelets. The Tessera image (scripts/image-build.sh, the Dockerfile's default target) runs as
its own user without ray or torch (its `ray` target, with them, runs a Ray runtime of its own in a container),
and the shipped agent DaemonSet runs from it on both nodes: each node's report
reaches the extender, which writes the node's inventory and `tessera.dev/gpu-milli` capacity.

Each node's GPUs come from Tessera's device plugin, its shipped DaemonSet (fake device nodes standing in for
/dev/nvidia*): the kubelet, not a patched Node, advertises them, and a container gets exactly the device nodes of
its pod's signed assignment; a pod placed on a node by hand with an assignment of its own making gets none.

The extender's own install on such nodes (its Deployment, the Lease, kube-proxy for Services): test_install_e2e.py.
Not yet (the rest of issue 34): the bridge's replacement pods and Ray on real pods, the second scheduler as pods.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

from tessera_contract import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION
from testing.local_cluster import KUBE_BIN, ROOT, LocalCluster

from .harness import NODE_SUMMARY as SUMMARY
from .harness import skip_without_control_plane, until, write_node_summary

NODE_SH = ROOT / "scripts/node.sh"
IMAGE_BUILD = ROOT / "scripts/image-build.sh"
TESSERA_IMAGE = "docker.io/tessera/tessera:local"  # scripts/image-build.sh
SYSTEM = "tessera-system"
NODES = ("kubelet-a", "kubelet-b")
BUSYBOX = "docker.io/tessera/busybox:local"  # scripts/node.sh builds and imports it


@pytest.fixture(scope="module", autouse=True)
def summary():
    """What scripts/node-e2e.sh --json prints (harness.write_node_summary)."""
    yield SUMMARY
    write_node_summary()


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


def skip_without_nodes() -> None:
    skip_without_control_plane()
    why = missing_for_nodes()
    if why:
        pytest.skip(why)


def fake_devices(where) -> None:
    """Character devices of the NVIDIA major (195) with no driver behind them, standing in for /dev/nvidia* (one host
    directory serves every node here: each real node has its own /dev/nvidia0)."""
    where.mkdir(exist_ok=True)
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        if not (where / name).exists():
            os.mknod(where / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))


def node_sh(*args: str) -> None:
    subprocess.run([str(NODE_SH), *args], check=True, env=dict(os.environ, TESSERA_KUBE_BIN=str(KUBE_BIN)))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    skip_without_nodes()
    from kubernetes import client, config

    # the DaemonSet controller, for the shipped agent and device plugin DaemonSets (these nodes are real, nothing here
    # is faked for it), and the token controller, for the device plugin's ServiceAccount token
    local = LocalCluster(tmp_path_factory.mktemp("nodescp"), controllers="daemonset,serviceaccount-token")
    started: list[str] = []
    try:
        local.start()
        t0 = time.monotonic()
        for i, name in enumerate(NODES, start=1):
            node_sh("start", str(local.work), name, str(i))
            started.append(name)
        print(f"\n[nodes] {len(NODES)} kubelets Ready {time.monotonic() - t0:.1f} s after the first start")
        SUMMARY.update(kubelet_nodes=len(started), nodes_ready_s=round(time.monotonic() - t0, 1))
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(local.work / "kubeconfig")))
        until("the nodes in tessera's cache", lambda: set(NODES) <= {n["name"] for n in local.extender.inspect()["nodes"]})
        yield {"api": api, "dir": local.work, "client": api.api_client, "key": local.extender.key_file}
    finally:
        for name in started:
            subprocess.run([str(NODE_SH), "remove", str(local.work), name], check=False)
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


@pytest.fixture(scope="module")
def image(real):
    """The Tessera image built as the Dockerfile's default target (cached) and loaded into both nodes."""
    done = subprocess.run([str(IMAGE_BUILD)], capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr[-3000:]
    name, archive, size, *_ = done.stdout.split()
    print(f"\n[nodes] {name}: {size} MiB ({archive})")
    SUMMARY["image_tessera_mib"] = int(size)
    for node in NODES:
        node_sh("import", str(real["dir"]), node, archive)
    return name


def test_the_tessera_image_runs_as_its_own_user_without_ray_or_torch(real, image):
    """The default target on a kubelet, as the Dockerfile says: entrypoint `tessera`, user 10001, no ray, no torch
    (the bridge holds pods create/delete: the fewer libraries beside that token the better)."""
    api = real["api"]
    check = ("import importlib.util as u, os; "
             "print(os.getuid(), os.getgid(), u.find_spec('ray') is None, u.find_spec('torch') is None, "
             "u.find_spec('extender') is not None, u.find_spec('gpu_sharing') is not None)")
    api.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "image-check"}, "spec": {
        "nodeName": NODES[0], "restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [
            {"name": "help", "image": image, "imagePullPolicy": "Never", "args": ["--help"]},
            {"name": "inside", "image": image, "imagePullPolicy": "Never", "command": ["python3", "-c", check]}]}})
    pod = until("image-check finished", lambda: (p := api.read_namespaced_pod("image-check", "default")).status.phase
                in ("Succeeded", "Failed") and p, timeout=120)
    logs = {c: api.read_namespaced_pod_log("image-check", "default", container=c) for c in ("help", "inside")}
    assert pod.status.phase == "Succeeded", (pod.status, logs)
    assert "usage: tessera" in logs["help"] and "agent" in logs["help"], logs["help"]
    assert logs["inside"].split() == ["10001", "10001", "True", "True", "True", "True"], logs["inside"]


RAY_CHECK = """
import os, ray, torch
ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, _node_ip_address="127.0.0.1")
@ray.remote
def part(i):
    return torch.full((4,), float(i))
total = sum(ray.get([part.remote(i) for i in (1, 2)]))
print("result", os.getuid(), ray.__version__, torch.__version__.split("+")[0], total.tolist(), len(ray.nodes()))
ray.shutdown()
"""


def pinned(path, name: str) -> str:
    """The version `name==X` pins in `path` (the Dockerfile or a constraints file)."""
    (version,) = re.findall(rf"\b{re.escape(name)}==([0-9.]+)", (ROOT / path).read_text())
    return version


def test_the_ray_image_runs_its_own_ray_runtime_with_torch_in_a_container(real):
    """The Dockerfile's `ray` target (scripts/image-build.sh --target ray: what a Ray job's driver and members run) on
    a kubelet: as user 10001, a Ray runtime of its own inside the container (GCS, raylet and workers: real processes,
    loopback only), two tasks that each return a torch tensor, summed; ray and torch at the versions pinned."""
    api = real["api"]
    done = subprocess.run([str(IMAGE_BUILD), "--target", "ray"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr[-3000:]
    name, archive, size, *_ = done.stdout.split()
    print(f"\n[nodes] {name}: {size} MiB ({archive})")
    SUMMARY["image_ray_mib"] = int(size)
    node_sh("import", str(real["dir"]), NODES[0], archive)
    api.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ray-check"}, "spec": {
        "nodeName": NODES[0], "restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [
            {"name": "ray", "image": name, "imagePullPolicy": "Never", "command": ["python3", "-c", RAY_CHECK],
             "env": [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}]}]}})
    pod = until("ray-check finished", lambda: (p := api.read_namespaced_pod("ray-check", "default")).status.phase
                in ("Succeeded", "Failed") and p, timeout=240)
    log = api.read_namespaced_pod_log("ray-check", "default")
    assert pod.status.phase == "Succeeded", (pod.status.container_statuses, log[-3000:])
    (result,) = [line.split(" ", 4)[1:] for line in log.splitlines() if line.startswith("result ")]
    assert result == [
        "10001", pinned("Dockerfile", "ray[default]"), pinned("docker/constraints-ray.txt", "torch"),
        "[3.0, 3.0, 3.0, 3.0] 1"], log[-3000:]
    api.delete_namespaced_pod("ray-check", "default", grace_period_seconds=0)


def inventory_for(node: str) -> dict:
    """A node's two fake T4s for the agent's static backend (UUIDs differ per node, as real ones do)."""
    return {"gpus": [{"index": i, "uuid": f"GPU-{node}-{i}", "model": "Tesla-T4", "memory_mib": 15360} for i in range(2)]}


def test_the_shipped_agent_daemonset_runs_on_each_node_and_its_reports_reach_the_nodes(real, image):
    """manifests/base/agent as shipped, with three changes for a node without NVML: the image built here, the
    static backend reading the node's own file from a ConfigMap (`$(NODE_NAME)` in its args), and a 1-s interval.
    The DaemonSet controller puts a pod on each node (labelled a GPU node, as the admin guide says); its kubelet
    runs it under the manifest's securityContext (UID 10002, read-only root, hostPID); the extender pulls each
    report from the pod's IP and writes that node's inventory annotation and tessera.dev/gpu-milli capacity."""
    import yaml
    from kubernetes import client
    from kubernetes.utils import parse_quantity

    api, apps = real["api"], client.AppsV1Api(real["client"])
    api.create_namespace({"metadata": {"name": SYSTEM}})
    shipped = [o for f in ("daemonset.yaml", "rbac.yaml")
               for o in yaml.safe_load_all((ROOT / "manifests/base/agent" / f).read_text()) if o]
    (ds,) = [o for o in shipped if o["kind"] == "DaemonSet"]
    (sa,) = [o for o in shipped if o["kind"] == "ServiceAccount"]
    api.create_namespaced_service_account(SYSTEM, sa)
    api.create_namespaced_config_map(SYSTEM, {"metadata": {"name": "agent-inventory"}, "data": {
        f"{n}.json": json.dumps(inventory_for(n)) for n in NODES}})
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"][0] == "agent" and "--inventory" not in c["args"]
    c.update(image=image, imagePullPolicy="Never")
    c["args"] += ["--inventory", "/etc/tessera/$(NODE_NAME).json", "--interval", "1"]
    c["volumeMounts"].append({"name": "inventory", "mountPath": "/etc/tessera", "readOnly": True})
    spec["volumes"].append({"name": "inventory", "configMap": {"name": "agent-inventory"}})
    for node in NODES:
        api.patch_node(node, {"metadata": {"labels": {"tessera.dev/gpu-node": "true"}}})
    apps.create_namespaced_daemon_set(SYSTEM, ds)

    def agents_ready():
        pods = api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-agent").items
        ready = {p.spec.node_name for p in pods if any(c.type == "Ready" and c.status == "True"
                                                       for c in p.status.conditions or [])}
        return ready == set(NODES) and pods
    pods = until("an agent pod Ready on each node", agents_ready, timeout=120)
    assert all(p.spec.security_context.run_as_user == 10002 and p.spec.host_pid for p in pods)

    def published():
        nodes = {n: api.read_node(n) for n in NODES}
        done = {n: (json.loads(x.metadata.annotations.get("tessera.dev/gpu-inventory", "null")),
                    x.status.capacity.get("tessera.dev/gpu-milli")) for n, x in nodes.items()}
        return done if all(inv and milli for inv, milli in done.values()) else None
    done = until("each node's inventory and gpu-milli capacity written from its own agent", published, timeout=90)
    for node, (inv, milli) in done.items():
        assert parse_quantity(milli) == 2000, (node, milli)  # two GPUs; the apiserver writes it as "2k"
        assert json.dumps(inv).count(f"GPU-{node}-") == 2, (node, inv)  # its own report, not the other node's
    SUMMARY["agents_reporting"] = len(done)


def test_a_kubelet_or_containerd_restart_keeps_the_nodes_pods_running(real):
    """Components restart in the field (upgrades, crashes): the node's containers keep running through a restart of
    its kubelet, then of its containerd (the shims hold them), and the kubelet reports the node and the pod again."""
    from kubernetes import client

    api, leases = real["api"], client.CoordinationV1Api(real["client"])
    node = NODES[1]
    api.create_namespaced_pod("default", busybox_pod("survivor", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done",
                                                     node=node))
    first = until("survivor running", lambda: running(api, "survivor"), timeout=90).status.container_statuses[0]

    def last_tick() -> int:
        """0 while the log cannot be read: a kubelet just restarted answers 404 until it has synced its pods."""
        from kubernetes.client.exceptions import ApiException

        try:
            lines = api.read_namespaced_pod_log("survivor", "default", tail_lines=1).split()
        except ApiException:
            return 0
        return int(lines[-1]) if lines else 0

    for part in ("kubelet", "containerd"):
        restarted = time.time()
        node_sh("restart", str(real["dir"]), node, part)
        until(f"{node}'s Lease renewed after its {part} restarted",
              lambda t=restarted: leases.read_namespaced_lease(node, "kube-node-lease").spec.renew_time.timestamp() > t,
              timeout=90)
        until(f"{node} Ready after its {part} restarted", lambda: {c.type: c.status for c in api.read_node(node)
                                                                     .status.conditions}["Ready"] == "True", timeout=90)
        tick = until("survivor ticking", last_tick)
        until("survivor ticking on", lambda t=tick: last_tick() > t, timeout=30)
        now = running(api, "survivor").status.container_statuses[0]
        assert (now.container_id, now.restart_count) == (first.container_id, 0), f"restarted by the {part} restart"


@pytest.fixture(scope="module")
def device_plugins(real, image):
    """manifests/base/device-plugin as shipped, with the changes a node without a GPU and a cluster without
    kube-proxy need: the image built here; the static backend reading the node's own file from a ConfigMap
    (`$(NODE_NAME)`); fake device nodes (character devices of the NVIDIA major, 195, no driver behind them) in
    a directory of the host in place of /dev; and the apiserver reached on the host's loopback (hostNetwork, the
    account's token mounted from its Secret: this apiserver runs without the ServiceAccount admission plugin,
    and no kube-proxy serves the `kubernetes` Service yet). Its hostPath /var/lib/kubelet/device-plugins is each
    node's own directory: each node's kubelet and containerd run in a mount namespace of their own (node.sh).
    The real DaemonSet controller places a pod on each node labelled for it, and each node's kubelet runs it."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api, apps = real["api"], client.AppsV1Api(real["client"])
    try:
        api.create_namespace({"metadata": {"name": SYSTEM}})
    except ApiException as e:
        assert e.status == 409, e
    dev = real["dir"] / "fakedev"
    fake_devices(dev)
    api.create_namespaced_config_map(SYSTEM, {"metadata": {"name": "plugin-inventory"}, "data": {
        f"{n}.json": json.dumps(inventory_for(n)) for n in NODES}})
    # the install's key Secret (docs/admin-guide.md "Create the assignment key"), holding the extender's key
    api.create_namespaced_secret(SYSTEM, {"metadata": {"name": "tessera-assignment-key"},
                                          "stringData": {"key": real["key"].read_text()}})
    shipped = [o for f in ("daemonset.yaml", "rbac.yaml")
               for o in yaml.safe_load_all((ROOT / "manifests/base/device-plugin" / f).read_text()) if o]
    for o in shipped:
        if o["kind"] == "ServiceAccount":
            api.create_namespaced_service_account(SYSTEM, o)
        elif o["kind"] == "ClusterRole":
            client.RbacAuthorizationV1Api(real["client"]).create_cluster_role(o)
        elif o["kind"] == "ClusterRoleBinding":
            client.RbacAuthorizationV1Api(real["client"]).create_cluster_role_binding(o)
    token = until("the token controller's Secret for tessera-device-plugin", lambda: (
        sa := api.read_namespaced_service_account("tessera-device-plugin", SYSTEM)).secrets and sa.secrets[0].name)
    (ds,) = [o for o in shipped if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    c.update(image=image, imagePullPolicy="Never")
    port = real["api"].api_client.configuration.host.rsplit(":", 1)[1]
    c["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
    # two plugin pods share this host's network: no metrics port
    c["args"] += ["--inventory", "/etc/tessera-inventory/$(NODE_NAME).json", "--metrics-listen", "none"]
    c["args"][c["args"].index("--dev-root") + 1] = str(dev)
    c["volumeMounts"] += [{"name": "inventory", "mountPath": "/etc/tessera-inventory", "readOnly": True},
                          {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}]
    (v,) = [v for v in spec["volumes"] if v["name"] == "dev"]
    v["hostPath"]["path"] = str(dev)
    spec["volumes"] += [{"name": "inventory", "configMap": {"name": "plugin-inventory"}},
                        {"name": "token", "secret": {"secretName": token}}]
    spec["hostNetwork"] = True
    for node in NODES:
        api.patch_node(node, {"metadata": {"labels": {"tessera.dev/device-plugin": "true"}}})
    apps.create_namespaced_daemon_set(SYSTEM, ds)

    def plugins_running():
        pods = api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-device-plugin").items
        return {p.spec.node_name for p in pods if p.status.phase == "Running"} == set(NODES) and pods
    t0 = time.monotonic()
    pods = until("a device plugin pod running on each node", plugins_running, timeout=120)
    print(f"\n[nodes] device plugin DaemonSet: a pod Running on each node {time.monotonic() - t0:.1f} s after it was created")
    SUMMARY.update(device_plugins_running=len(pods), device_plugin_ready_s=round(time.monotonic() - t0, 1))
    yield {p.spec.node_name: p.metadata.name for p in pods}


def gpu_pod(name: str, gpus: int, command: str, *, node: str = "", selector: dict | None = None,
            annotations: dict | None = None, milli: int = 0) -> dict:
    """`gpus` whole GPUs, or with `milli` a slice of one."""
    pod = busybox_pod(name, command, node=node, selector=selector)
    c = pod["spec"]["containers"][0]
    c["resources"]["limits"] = {"tessera.dev/gpu-milli": str(milli)} if milli else {"nvidia.com/gpu": str(gpus)}
    c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]  # the tenant asks for every GPU
    pod["metadata"]["annotations"] = annotations or {}
    return pod


SEE = ("echo devices: $(ls /dev | grep nvidia | sort | tr '\\n' ' '); echo env: $NVIDIA_VISIBLE_DEVICES; "
       "echo milli: $TESSERA_GPU_MILLI; sleep 3600")


def seen(api, name: str) -> list[str]:
    text = api.read_namespaced_pod_log(name, "default")
    line = next((x for x in text.splitlines() if x.startswith("devices:")), "")
    return line.split()[1:]


def test_the_kubelet_advertises_the_gpus_its_device_plugin_lists(real, device_plugins):
    """Capacity from the device plugin, as on a GPU node: the kubelet writes nvidia.com/gpu from ListAndWatch."""
    api = real["api"]
    until("nvidia.com/gpu: 2 on each node, from its kubelet",
          lambda: all(api.read_node(n).status.allocatable.get("nvidia.com/gpu") == "2" for n in NODES), timeout=90)


def test_containers_see_exactly_the_gpus_tessera_assigned_and_a_forged_pod_none(real, device_plugins):
    """Placed by kube-scheduler and Tessera: a 1-GPU pod and a 2-GPU pod each see the device nodes of their
    assignment and no other, although each sets NVIDIA_VISIBLE_DEVICES=all. A pod put on a node by hand (spec.nodeName)
    with an assignment annotation and a MAC of its own making is refused by the device plugin: the kubelet fails it
    and no container of it starts."""
    api = real["api"]
    until("nvidia.com/gpu on the nodes", lambda: all(api.read_node(n).status.allocatable.get("nvidia.com/gpu") == "2"
                                                     for n in NODES), timeout=90)
    t0 = time.monotonic()
    api.create_namespaced_pod("default", gpu_pod("gpu-one", 1, SEE, selector={"kubernetes.io/hostname": NODES[0]}))
    api.create_namespaced_pod("default", gpu_pod("gpu-two", 2, SEE, selector={"kubernetes.io/hostname": NODES[1]}))
    for name, count in (("gpu-one", 1), ("gpu-two", 2)):
        pod = until(f"{name} running", lambda n=name: running(api, n), timeout=120)
        print(f"\n[nodes] {name}: created to Running (placed by Tessera, devices from the plugin) {time.monotonic() - t0:.1f} s")
        SUMMARY.setdefault("gpu_pod_start_s", []).append(round(time.monotonic() - t0, 1))
        assigned = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
        assert len(assigned["gpus"]) == count
        want = sorted([f"nvidia{g}" for g in assigned["gpus"]] + ["nvidiactl"])
        got = until(f"{name}'s device list", lambda n=name: seen(api, n))
        assert sorted(got) == want, (name, got, assigned)
    SUMMARY["devices_match_assignment"] = True
    free = 1 - json.loads(api.read_namespaced_pod("gpu-one", "default").metadata.annotations[ASSIGNMENT_ANNOTATION])["gpus"][0]
    forged = json.dumps({"node": NODES[0], "gpus": [free], "milli": 1000, "uuids": [f"GPU-{NODES[0]}-{free}"]})
    api.create_namespaced_pod("default", gpu_pod("forged", 1, SEE, node=NODES[0], annotations={
        ASSIGNMENT_ANNOTATION: forged, MAC_ANNOTATION: "v1:" + "0" * 12 + ":" + "0" * 64}))
    pod = until("the forged pod failed by its kubelet", lambda: (p := api.read_namespaced_pod("forged", "default"))
                .status.phase == "Failed" and p, timeout=90)
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert "no pod bound here waits for nvidia.com/gpu devices" in pod.status.message, pod.status.message
    assert not pod.status.container_statuses or not any(s.state.running for s in pod.status.container_statuses)
    SUMMARY["forged_sees_none"] = True


def test_a_plugin_or_kubelet_restart_keeps_the_gpus_given_and_gives_none_twice(real, device_plugins):
    """Faults the field sends: the plugin's pod on one node is deleted (its DaemonSet starts another), the kubelet of
    the other restarts (it deletes the plugin's socket; the plugin registers again). The pods holding GPUs keep their
    containers; a pod put by hand on the node whose two GPUs are taken is refused by its kubelet (the allocations
    survived in the kubelet's checkpoint, in the node's own device plugin directory); a pod placed by Tessera on the
    node with one GPU left gets that one, not its neighbour's."""
    api = real["api"]
    holders = {n: running(api, n) for n in ("gpu-one", "gpu-two")}
    assert all(holders.values()), "test_containers_see_exactly_... runs first and leaves them running"
    full, spare = NODES[1], NODES[0]
    old = device_plugins[full]
    api.delete_namespaced_pod(old, SYSTEM)

    def replaced():
        pods = api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-device-plugin").items
        return [p for p in pods if p.spec.node_name == full and p.metadata.name != old and p.status.phase == "Running"]
    until(f"a new device plugin pod on {full}", replaced, timeout=120)
    restarted = time.time()
    node_sh("restart", str(real["dir"]), spare, "kubelet")
    from kubernetes import client
    leases = client.CoordinationV1Api(real["client"])
    until(f"{spare}'s kubelet back", lambda: leases.read_namespaced_lease(spare, "kube-node-lease").spec.renew_time
          .timestamp() > restarted, timeout=90)
    until("nvidia.com/gpu: 2 again on each node", lambda: all(
        api.read_node(n).status.allocatable.get("nvidia.com/gpu") == "2" for n in NODES), timeout=90)
    for name, before in holders.items():
        now = running(api, name)
        assert now and now.status.container_statuses[0].container_id == before.status.container_statuses[0].container_id
        assert now.status.container_statuses[0].restart_count == 0, name
    api.create_namespaced_pod("default", gpu_pod("squatter", 1, SEE, node=full))
    pod = until("the squatter failed by its kubelet", lambda: (p := api.read_namespaced_pod("squatter", "default"))
                .status.phase == "Failed" and p, timeout=90)
    # the kubelet's device manager allocates before its resource-fit check: it finds no device free itself
    assert pod.status.reason == "UnexpectedAdmissionError", pod.status
    assert "requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0" in pod.status.message
    api.create_namespaced_pod("default", gpu_pod("gpu-three", 1, SEE, selector={"kubernetes.io/hostname": spare}))
    three = until("gpu-three running", lambda: running(api, "gpu-three"), timeout=120)
    mine = json.loads(three.metadata.annotations[ASSIGNMENT_ANNOTATION])["gpus"]
    neighbour = json.loads(holders["gpu-one"].metadata.annotations[ASSIGNMENT_ANNOTATION])["gpus"]
    assert set(mine).isdisjoint(neighbour), (mine, neighbour)
    assert sorted(until("gpu-three's device list", lambda: seen(api, "gpu-three"))) == sorted(
        [f"nvidia{g}" for g in mine] + ["nvidiactl"])
    SUMMARY["double_bound"] = over_given(api)
    assert SUMMARY["double_bound"] == 0
    SUMMARY["restarts_keep_gpus"] = True


def over_given(api) -> int:
    """GPUs whose running pods' assignments add up to more than one GPU (1000 milli)."""
    held: dict[tuple[str, int], int] = {}
    for p in api.list_namespaced_pod("default").items:
        a = json.loads((p.metadata.annotations or {}).get(ASSIGNMENT_ANNOTATION, "null") or "null")
        if p.status.phase == "Running" and a:
            for g in a["gpus"]:
                held[(p.spec.node_name, g)] = held.get((p.spec.node_name, g), 0) + a["milli"]
    return sum(1 for milli in held.values() if milli > 1000)


def test_two_slices_of_one_gpu_each_see_that_gpu_and_their_share(real, device_plugins):
    """Slices as devices: the plugin serves tessera.dev/gpu-milli as a thousand devices per GPU; two 250-milli pods
    placed by Tessera on a node with free GPUs each get the device node of their assignment's GPU, and their share
    in TESSERA_GPU_MILLI (what tessera-launch caps to), from the plugin, not from the pod's own spec."""
    api = real["api"]
    api.delete_namespaced_pod("gpu-two", "default", grace_period_seconds=0)  # frees both GPUs of NODES[1]
    until("gpu-two gone", lambda: "gpu-two" not in {p.metadata.name for p in api.list_namespaced_pod("default").items},
          timeout=60)
    until("tessera.dev/gpu-milli on the nodes, from the plugin", lambda: all(
        api.read_node(n).status.allocatable.get("tessera.dev/gpu-milli") in ("2k", "2000") for n in NODES), timeout=90)
    for name in ("slice-a", "slice-b"):
        api.create_namespaced_pod("default", gpu_pod(name, 0, SEE, milli=250, selector={"kubernetes.io/hostname": NODES[1]}))
    for name in ("slice-a", "slice-b"):
        pod = until(f"{name} running", lambda n=name: running(api, n), timeout=120)
        a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
        assert a["milli"] == 250 and len(a["gpus"]) == 1, a
        assert sorted(until(f"{name}'s device list", lambda n=name: seen(api, n))) == [f"nvidia{a['gpus'][0]}", "nvidiactl"]
        text = api.read_namespaced_pod_log(name, "default")
        assert "milli: 250" in text, text
    assert over_given(api) == 0
    SUMMARY["slices_match_assignment"] = True
