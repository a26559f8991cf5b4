"""The whole install on real nodes (issue 34 item 4): Tessera as an admin deploys it, control-plane mode, Kubernetes 1.20.

Two kubelets v1.20.2 (scripts/node.sh) join a control plane whose pods reach it as on a cluster
(controlplane.sh CP_POD_NETWORK=1: the ServiceAccount admission plugin mounts each pod's token, kube-proxy
routes Services, kube-controller-manager runs Deployments, DaemonSets, Jobs and the token controller). The steps
are docs/admin-guide.md's "Install: control-plane mode": `tessera certs` (with `--ip` for the Service's ClusterIP,
as "Pointing kube-scheduler at Tessera: the URL" says for a kube-scheduler that does not resolve cluster DNS), the
guide's own blocks for the TLS and assignment key Secrets run as written, `kubectl apply -k` of the 1.20 entry
point, `rollout status`, and kube-scheduler on the host (as a control-plane node runs it) with the shipped v1beta1
configuration, only its URL, kubeconfig and certificate paths changed.

The one overlay (an admin's own, applied instead of the entry point it bases on) holds what a machine without
GPUs and without a registry needs: the image built here (scripts/image-build.sh), the Service's ClusterIP pinned
for the certificate, and the agent and device plugin reading two fake GPUs per node from a ConfigMap (fake device
nodes stand in for /dev/nvidia*). Both nodes carry the control-plane label the extender's affinity asks for (they
are this cluster's only nodes).

Shown here: the extender's two replicas Ready as their Deployment, one holding the Lease, kube-scheduler reaching
the verbs over mutual TLS through the Service; GPU pods (whole, slice, a gang Job) bound by Tessera and run by the
kubelets with exactly their devices; the leader's container killed, binding resumes within the Lease time and no
GPU is given twice; every replica stopped, CPU-only pods, the extender's own included, still start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpu_sharing.deviceplugin.plugin import GUESS
from tessera_contract import ASSIGNMENT_ANNOTATION
from testing.local_cluster import CONTROLPLANE, KUBE_BIN, ROOT, SHIPPED_CONFIG

from .harness import NODE_SUMMARY as SUMMARY
from .harness import guide_block, until, write_node_summary
from .test_nodes_e2e import (
    IMAGE_BUILD,
    NODE_SH,
    SEE,
    busybox_pod,
    fake_devices,
    gpu_pod,
    inventory_for,
    node_sh,
    over_given,
    seen,
    skip_without_nodes,
)

GUIDE = ROOT / "docs/admin-guide.md"
SYSTEM = "tessera-system"
NODES = ("node-a", "node-b")
DEVICE_PLUGIN = "app.kubernetes.io/name=tessera-device-plugin"
CLUSTER_IP = "10.0.0.88"  # the extender Service's, pinned by the overlay; in the server certificate (`--ip`)
CONTROLLERS = ("deployment,replicaset,daemonset,job,endpoint,endpointslice,serviceaccount,serviceaccount-token,garbagecollector,"
               "persistentvolume-binder,"  # the binder: the Ray example's claim (test_ray_job_e2e.py)
               "nodelifecycle")  # a stopped node tainted unreachable, its pods evicted (test_ray_job_e2e.py)
LEASE_S = 15  # `tessera serve --lease-duration`'s default


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield SUMMARY
    write_node_summary()


def kubectl_env(cp) -> dict:
    return dict(os.environ, KUBECONFIG=str(cp / "kubeconfig"), PATH=f"{KUBE_BIN}:{os.environ['PATH']}")


def run_guide(name: str, cp, cwd) -> None:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_block(name)], cwd=cwd, env=kubectl_env(cp),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (name, done.stdout, done.stderr)


def kubectl(cp, *args: str, timeout: int = 120) -> str:
    done = subprocess.run([str(KUBE_BIN / "kubectl"), *args], env=kubectl_env(cp), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def scheduler_config(pki) -> dict:
    """The shipped v1beta1 configuration; only the URL (the Service's ClusterIP), the kubeconfig and the paths of
    the certificates `tessera certs` made change."""
    shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
    for extender in shipped["extenders"]:
        assert extender["urlPrefix"] == "https://tessera-extender.tessera-system.svc:8888/tessera"
        extender["urlPrefix"] = f"https://{CLUSTER_IP}:8888/tessera"
        extender["tlsConfig"] = {k: str(pki / os.path.basename(v)) for k, v in extender["tlsConfig"].items()}
    shipped["clientConnection"]["kubeconfig"] = "__KUBECONFIG__"
    return shipped


def write_overlay(out, dev, base: str = "manifests/k8s-1.20", extra: dict | None = None, nodes=NODES) -> None:
    """The admin's overlay for this machine (module docstring) on the entry point `base`: built from the shipped
    objects, so every other field stays as shipped; `extra` adds patches (file name -> object); `nodes` get GPUs."""
    shipped = ROOT / "manifests/base"
    agent = yaml.safe_load((shipped / "agent/daemonset.yaml").read_text())
    plugin = yaml.safe_load((shipped / "device-plugin/daemonset.yaml").read_text())
    (a,) = agent["spec"]["template"]["spec"]["containers"]
    (p,) = plugin["spec"]["template"]["spec"]["containers"]
    plugin_args = list(p["args"])
    plugin_args[plugin_args.index("--dev-root") + 1] = str(dev)
    inv = {"name": "inventory", "mountPath": "/etc/tessera-inventory", "readOnly": True}
    patches = {
        "service.yaml": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tessera-extender", "namespace": SYSTEM},
                         "spec": {"clusterIP": CLUSTER_IP}},
        "agent.yaml": {"apiVersion": "apps/v1", "kind": "DaemonSet",
                       "metadata": {"name": agent["metadata"]["name"], "namespace": SYSTEM},
                       "spec": {"template": {"spec": {
                           "containers": [{"name": a["name"], "args": a["args"] + [
                               "--inventory", "/etc/tessera-inventory/$(NODE_NAME).json", "--interval", "1"],
                               "volumeMounts": [inv]}],
                           "volumes": [{"name": "inventory", "configMap": {"name": "gpu-inventory"}}]}}}},
        "device-plugin.yaml": {"apiVersion": "apps/v1", "kind": "DaemonSet",
                               "metadata": {"name": plugin["metadata"]["name"], "namespace": SYSTEM},
                               "spec": {"template": {"spec": {
                                   "containers": [{"name": p["name"], "args": plugin_args + [
                                       "--inventory", "/etc/tessera-inventory/$(NODE_NAME).json"], "volumeMounts": [inv]}],
                                   "volumes": [{"name": "dev", "hostPath": {"path": str(dev), "type": "Directory"}},
                                               {"name": "inventory", "configMap": {"name": "gpu-inventory"}}]}}}},
        **(extra or {}),
    }
    out.mkdir()
    for name, obj in patches.items():
        (out / name).write_text(yaml.safe_dump(obj))
    (out / "inventory.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpu-inventory", "namespace": SYSTEM},
        "data": {f"{n}.json": json.dumps(inventory_for(n)) for n in nodes}}))
    (out / "kustomization.yaml").write_text(yaml.safe_dump({
        "bases": [os.path.relpath(ROOT / base, out)],  # kustomize 2.0.3 takes no absolute base
        "resources": ["inventory.yaml"],
        "images": [{"name": "ghcr.io/tessera-sched/tessera", "newName": "docker.io/tessera/tessera", "newTag": "local"}],
        "patchesStrategicMerge": list(patches)}))


def control_plane(work: Path, config: Callable[[Path], dict]) -> Path:
    """Install step 1 (the certificates, the server's naming the Service's ClusterIP too), then the control plane
    with a pod network and CONTROLLERS, its kube-scheduler on `config(the certificates' directory)`."""
    cp, pki = work / "cp", work / "tessera-pki"
    subprocess.run([sys.executable, "-m", "extender.cli", "certs", "--out", str(pki), "--ip", CLUSTER_IP],
                   check=True, capture_output=True)
    cfg = work / "scheduler-config.yaml"
    cfg.write_text(yaml.safe_dump(config(pki)))
    env = dict(os.environ, TESSERA_PYTHON=sys.executable, CP_POD_NETWORK="1", CP_CONTROLLERS=CONTROLLERS)
    subprocess.run([str(CONTROLPLANE), "start", str(cp), str(cfg)], check=True, env=env)
    return cp


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    skip_without_nodes()
    from kubernetes import client, config

    work = tmp_path_factory.mktemp("install")
    cp = control_plane(work, scheduler_config)
    started: list[str] = []
    try:
        for i, name in enumerate(NODES, start=1):
            node_sh("start", str(cp), name, str(i))
            started.append(name)
        built = subprocess.run([str(IMAGE_BUILD)], capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
        assert built.returncode == 0, built.stderr[-3000:]
        _, archive, size, *_ = built.stdout.split()
        SUMMARY["image_tessera_mib"] = int(size)
        for name in NODES:
            node_sh("import", str(cp), name, archive)
            kubectl(cp, "label", "node", name, "node-role.kubernetes.io/control-plane=", "tessera.dev/gpu-node=true",
                    "tessera.dev/device-plugin=true")
        fake_devices(work / "fakedev")
        write_overlay(work / "overlay", work / "fakedev")
        run_guide("extender-tls", cp, work)  # step 1's Secret, in tessera-pki/ of the working directory
        run_guide("assignment-key", cp, work)  # step 2
        guide = GUIDE.read_text()
        for line in ("kubectl apply -k manifests/k8s-1.20/",
                     "kubectl -n tessera-system rollout status deployment/tessera-extender"):
            assert line in guide, f"docs/admin-guide.md no longer says {line!r}: change this test with it"
        t0 = time.monotonic()
        kubectl(cp, "apply", "-k", str(work / "overlay"))  # step 3, through the overlay that bases on manifests/k8s-1.20/
        kubectl(cp, "-n", SYSTEM, "rollout", "status", "deployment/tessera-extender", "--timeout=240s", timeout=260)
        ready_s = time.monotonic() - t0
        print(f"\n[install] kubectl apply -k to the extender's rollout done: {ready_s:.1f} s")
        SUMMARY["apply_to_ready_s"] = round(ready_s, 1)
        api_client = config.new_client_from_config(config_file=str(cp / "kubeconfig"))
        yield {"cp": cp, "api": client.CoreV1Api(api_client), "apps": client.AppsV1Api(api_client),
               "leases": client.CoordinationV1Api(api_client), "batch": client.BatchV1Api(api_client)}
    finally:
        for name in started:
            subprocess.run([str(NODE_SH), "remove", str(cp), name], check=False)
        subprocess.run([str(CONTROLPLANE), "stop", str(cp)], check=False)


def extender_pods(api, ready: bool = True) -> list:
    pods = api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-extender").items
    return [p for p in pods if not ready or any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def holder(leases) -> str:
    return leases.read_namespaced_lease("tessera-extender", SYSTEM).spec.holder_identity or ""


def bound_by_tessera(api, name: str):
    pod = api.read_namespaced_pod(name, "default")
    return pod if pod.spec.node_name and ASSIGNMENT_ANNOTATION in (pod.metadata.annotations or {}) else None


def why(install, name: str) -> str:
    """What a waiting pod's events, the Lease and the replicas say: the failure message of a wait here."""
    api = install["api"]
    events = [f"{e.reason}: {e.message}" for e in api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}").items]
    replicas = [(p.metadata.name, p.status.phase, [(c.restart_count, bool(c.ready)) for c in p.status.container_statuses or []])
                for p in extender_pods(api, ready=False)]
    return f"events {events[-3:]}; lease holder {holder(install['leases'])!r}; replicas {replicas}"


def test_the_extender_runs_as_its_deployment_two_ready_one_holding_the_lease(install):
    api, leases = install["api"], install["leases"]
    pods = extender_pods(api)
    assert len(pods) == 2, [p.metadata.name for p in pods]
    assert all(p.spec.service_account_name == "tessera-extender" and p.spec.security_context.run_as_user == 10001
               for p in pods)
    assert until("a replica holding the Lease", lambda: holder(leases) in {p.metadata.name for p in pods}, timeout=60)
    SUMMARY["extender_ready"] = len(pods)


def test_each_node_reports_and_advertises_its_gpus(install):
    """The agent's report reaches the extender (inventory annotation), the device plugin's devices the kubelet."""
    api = install["api"]

    def published():
        nodes = [api.read_node(n) for n in NODES]
        return all("tessera.dev/gpu-inventory" in (n.metadata.annotations or {})
                   and n.status.allocatable.get("nvidia.com/gpu") == "2" for n in nodes)
    until("each node's inventory and nvidia.com/gpu from its own agent and device plugin", published, timeout=120)
    SUMMARY["agents_reporting"] = len(NODES)


def test_gpu_pods_and_a_gang_bound_through_the_installed_extender_run_with_their_devices(install):
    """kube-scheduler calls the replicas over mutual TLS through the Service: a whole-GPU pod, a slice and a gang
    Job of two are bound by Tessera (signed assignments) and each container sees exactly its assignment's devices.
    The gang's two members are held to one node: two pods of one shape, created in one second and bound at once, are
    what the kubelet 1.20 cannot tell apart in its device plugin calls (docs/gpu-sharing.md)."""
    api, batch = install["api"], install["batch"]
    t0 = time.monotonic()
    first, second = ({"kubernetes.io/hostname": n} for n in NODES)
    api.create_namespaced_pod("default", gpu_pod("whole", 1, SEE, selector=first))
    api.create_namespaced_pod("default", gpu_pod("slice", 0, SEE, milli=250, selector=first))
    member = gpu_pod("member", 1, SEE, selector=second)
    member["metadata"].update(labels={"app": "pair"}, annotations={"tessera.dev/gang-name": "pair", "tessera.dev/gang-size": "2"})
    member["spec"]["restartPolicy"] = "Never"
    for key in ("apiVersion", "kind"):
        del member[key]
    del member["metadata"]["name"]
    batch.create_namespaced_job("default", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pair"}, "spec": {
        "parallelism": 2, "completions": 2, "backoffLimit": 0, "template": member}})
    members = until("the gang's two pods", lambda: [p.metadata.name for p in api.list_namespaced_pod(
        "default", label_selector="job-name=pair").items] if len(api.list_namespaced_pod(
            "default", label_selector="job-name=pair").items) == 2 else None, timeout=60)
    wanted, got = {}, {}
    for name in ["whole", "slice", *members]:
        pod = until(f"{name} bound by Tessera and running", lambda n=name: (p := bound_by_tessera(api, n))
                    and p.status.phase == "Running" and p, timeout=180)
        a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
        wanted[name] = (pod.spec.node_name, sorted(f"nvidia{g}" for g in a["gpus"]))
        got[name] = (pod.spec.node_name, sorted(x for x in until(f"{name}'s device list", lambda n=name: seen(api, n))
                                                 if x != "nvidiactl"))
    print(f"\n[install] whole, slice and a gang of 2 created to Running through the installed extender: "
          f"{time.monotonic() - t0:.1f} s")
    assert over_given(api) == 0
    assert {wanted[m][0] for m in members} == {NODES[1]}
    SUMMARY["devices_match_assignment"] = all(got[m] == wanted[m] for m in got)
    for name in ["whole", "slice", *members]:
        assert got[name] == wanted[name], (name, got[name], wanted[name])
    (plugin,) = [p.metadata.name for p in api.list_namespaced_pod(SYSTEM, label_selector=DEVICE_PLUGIN).items
                 if p.spec.node_name == NODES[1]]
    log = api.read_namespaced_pod_log(plugin, SYSTEM)
    assert sum(f"default/{m}: nvidia.com/gpu" in log for m in members) == 2, log  # the kubelet asked it for each
    assert GUESS not in log, log  # and each time its PodResources list named the pod it admitted


def test_killing_the_leaders_container_binding_resumes_within_the_lease_time(install):
    """The Lease holder's container is killed (SIGKILL: a crash; its kubelet restarts it, under the same pod name).
    A live replica renews the Lease within the Lease time, a GPU pod created then is bound at once, and no GPU is
    given twice. (The pod created at the kill: next test.)"""
    api, leases = install["api"], install["leases"]
    for name in ("whole", "slice"):  # room: node-a's two GPUs, one for the pod created at the kill, one for the next
        api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    until("whole and slice gone", lambda: not {"whole", "slice"} & {p.metadata.name for p in api.list_namespaced_pod(
        "default").items}, timeout=60)
    leader = holder(leases)
    pod = api.read_namespaced_pod(leader, SYSTEM)
    (status,) = pod.status.container_statuses
    killed_at, t0 = time.time(), time.monotonic()
    node_sh("kill", str(install["cp"]), pod.spec.node_name, status.container_id)
    api.create_namespaced_pod("default", gpu_pod("at-kill", 1, SEE))

    def renewed_by_a_live_replica():
        spec = leases.read_namespaced_lease("tessera-extender", SYSTEM).spec
        return spec.holder_identity if spec.renew_time and spec.renew_time.timestamp() > killed_at + 1 else None
    now = until("the Lease renewed after the kill", renewed_by_a_live_replica, timeout=LEASE_S * 3, every=0.2,
                describe=lambda: why(install, "at-kill"))
    failover = time.monotonic() - t0
    t1 = time.monotonic()
    api.create_namespaced_pod("default", gpu_pod("after-failover", 1, SEE))
    # a new holder binds once it has rebuilt its view of bound pods: a bind before that is refused, and kube-scheduler
    # 1.20 retries it at the latest 60 s later (seen once on this loaded machine, a second after the renewal)
    until("after-failover bound by Tessera", lambda: bound_by_tessera(api, "after-failover"), timeout=60 + 30, every=0.2,
          describe=lambda: why(install, "after-failover"))
    bind_after = time.monotonic() - t1
    print(f"\n[install] leader {leader}'s container killed: Lease renewed by {now} {failover:.1f} s later; "
          f"a pod created then bound in {bind_after:.1f} s")
    SUMMARY.update(lease_failover_s=round(failover, 1), bind_after_failover_s=round(bind_after, 1),
                   lease_holder_after_kill="same pod, restarted" if now == leader else "other")
    assert failover <= LEASE_S + 10, failover  # a holder that renewed just before it died holds the Lease a full term
    until("after-failover running", lambda: api.read_namespaced_pod("after-failover", "default").status.phase == "Running",
          timeout=120)
    SUMMARY["double_bound"] = over_given(api)
    assert SUMMARY["double_bound"] == 0


def test_the_pod_whose_binds_failed_during_the_failover_is_bound_later(install):
    """The pod created at the kill: its binds failed while the leader was down (`cannot reach the leader`), and
    kube-scheduler 1.20 retries a pod whose bind failed when the cluster changes or, at the latest, 60 s later (its
    unschedulable queue's flush). One whole GPU is free for it. (Until this test freed node-a's slice too, the pod created
    after the failover took the one GPU free, and this one was rightly refused as `fewer than 1 whole GPUs free`: the
    open bug written down for it was the test's own count.)"""
    api = install["api"]
    assert "at-kill" in {p.metadata.name for p in api.list_namespaced_pod("default").items}, "the test before creates it"
    try:
        until("at-kill bound by Tessera", lambda: bound_by_tessera(api, "at-kill"), timeout=LEASE_S + 60 + 30,
              describe=lambda: why(install, "at-kill"))
    finally:
        SUMMARY["pod_at_kill_bound"] = bool(bound_by_tessera(api, "at-kill"))
        SUMMARY["double_bound"] = over_given(api)
    assert SUMMARY["double_bound"] == 0


def test_with_every_replica_stopped_cpu_pods_start_and_the_extender_comes_back(install):
    """Scaled to zero: a CPU-only pod is placed by kube-scheduler alone (the ignorable entry) and runs while a GPU pod
    waits; scaled back, the extender's own pods (CPU-only) are placed the same way and Tessera binds the waiting pod."""
    api, apps = install["api"], install["apps"]
    for name in ("at-kill", "after-failover"):  # room for gpu-waits: one whole GPU
        api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    until("room made", lambda: not {"at-kill", "after-failover"} & {p.metadata.name for p in api.list_namespaced_pod(
        "default").items}, timeout=60)
    apps.patch_namespaced_deployment_scale("tessera-extender", SYSTEM, {"spec": {"replicas": 0}})
    until("no extender pod", lambda: not extender_pods(api, ready=False), timeout=90)
    api.create_namespaced_pod("default", gpu_pod("gpu-waits", 1, SEE))
    cpu = busybox_pod("cpu-only", "sleep 3600")
    cpu["spec"].pop("automountServiceAccountToken")  # as a tenant writes it: the token admission mounts
    api.create_namespaced_pod("default", cpu)
    until("cpu-only running with no Tessera replica", lambda: api.read_namespaced_pod("cpu-only", "default").status.phase
          == "Running", timeout=120)
    assert not api.read_namespaced_pod("gpu-waits", "default").spec.node_name
    SUMMARY["cpu_pods_start_without_tessera"] = True
    apps.patch_namespaced_deployment_scale("tessera-extender", SYSTEM, {"spec": {"replicas": 2}})
    until("two extender replicas Ready again", lambda: len(extender_pods(api)) == 2, timeout=180)
    until("gpu-waits bound by Tessera once it is back", lambda: bound_by_tessera(api, "gpu-waits"), timeout=120)
    assert over_given(api) == 0


def test_a_killed_agent_leaves_its_nodes_pods_their_gpus_and_the_node_in_use(install):
    """node-a's agent container is killed (SIGKILL; its kubelet restarts it). While it is down the extender's pulls
    fail and the node's last report stands: a slice pod created then is bound to node-a by Tessera and runs with its
    GPU's device; the pods bound before keep running; the agent comes back; no GPU is given twice (issue 34, faults)."""
    api, node = install["api"], NODES[0]
    before = {p.metadata.name: p.status.container_statuses[0].restart_count for p in api.list_namespaced_pod(
        "default").items if p.status.phase == "Running"}
    (agent,) = [p for p in api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-agent").items
                if p.spec.node_name == node]
    (status,) = agent.status.container_statuses
    node_sh("kill", str(install["cp"]), node, status.container_id)
    api.create_namespaced_pod("default", gpu_pod("agent-down", 0, SEE, milli=250, selector={"kubernetes.io/hostname": node}))
    pod = until("agent-down bound by Tessera and running", lambda: (p := bound_by_tessera(api, "agent-down"))
                and p.status.phase == "Running" and p, timeout=120, describe=lambda: why(install, "agent-down"))
    a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
    assert (pod.spec.node_name, a["milli"]) == (node, 250)
    assert [x for x in until("agent-down's device list", lambda: seen(api, "agent-down")) if x != "nvidiactl"] == \
        [f"nvidia{a['gpus'][0]}"]
    until("the agent restarted and running", lambda: (s := api.read_namespaced_pod(
        agent.metadata.name, SYSTEM).status.container_statuses[0]).restart_count > status.restart_count and s.ready,
        timeout=120)
    after = {p.metadata.name: (p.status.phase, p.status.container_statuses[0].restart_count)
             for p in api.list_namespaced_pod("default").items if p.metadata.name in before}
    assert after == {n: ("Running", r) for n, r in before.items()}, (before, after)
    assert "tessera.dev/gpu-inventory" in (api.read_node(node).metadata.annotations or {})
    assert over_given(api) == 0
