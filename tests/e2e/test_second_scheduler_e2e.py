"""Second-scheduler mode on the real 1.20.2 control plane: the cluster's default kube-scheduler (a
plain one, as on a managed cluster) and a second kube-scheduler started from the shipped profile
(manifests/k8s-1.20/second-scheduler/tessera-scheduler.yaml; only the kubeconfig, the loopback
port and the local health ports changed) with `tessera serve` beside it on loopback, plain HTTP,
binding under kube-scheduler's own Lease (--bind-with-scheduler-lease).

Tessera's GPU nodes carry the taint and label tessera.dev/scheduler=tessera-scheduler (the admin
guide's recipe); Tessera's pods tolerate and select them. The default scheduler places CPU and
whole-GPU pods of other teams at the same time; no GPU may end up over capacity, no slice double
booked. TESSERA_MIXED_PODS sets the size of the mixed run (default 300; the acceptance run: 1000).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from extender.kube.contract import ASSIGNMENT_ANNOTATION

from .harness import CONTROLPLANE, KUBE_BIN, ROOT, free_port, skip_without_control_plane, wait_http

PROFILE = ROOT / "manifests/k8s-1.20/second-scheduler/tessera-scheduler.yaml"
NS = "default"
SCHED = "tessera-scheduler"
DEDICATED = {"key": "tessera.dev/scheduler", "value": SCHED, "effect": "NoSchedule"}
TOLERATE = {"key": "tessera.dev/scheduler", "operator": "Equal", "value": SCHED, "effect": "NoSchedule"}


class Tessera:
    """`tessera serve` as the pod's second container would run it: loopback, no TLS, no Lease of its own."""

    def __init__(self, work: Path, port: int) -> None:
        self.work, self.port, self.admin_port = work, port, free_port()
        self.key = work / "assignment.key"
        self.key.write_text(os.urandom(32).hex())
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.work / "tessera.log", "ab")
        env = dict(os.environ, POD_NAME=socket.gethostname(), POD_NAMESPACE="tessera-system")  # kube-scheduler's hostname
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", str(self.work / "kubeconfig"),
             "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin_port}",
             "--bind-with-scheduler-lease", f"tessera-system/{SCHED}", "--assignment-key-file", str(self.key)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        wait_http(f"http://127.0.0.1:{self.admin_port}/readyz", 60)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def inspect(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/inspect", timeout=30) as r:
            return json.loads(r.read())


def second_scheduler_config(work: Path, port: int) -> dict:
    """The shipped profile; changed: the kubeconfig (no in-cluster token here), the loopback port
    (tests run side by side) and the local health/metrics ports (two schedulers on one host)."""
    cfg = yaml.safe_load(PROFILE.read_text())
    assert "clientConnection" not in cfg
    cfg["clientConnection"] = {"kubeconfig": str(work / "kubeconfig")}
    for ext in cfg["extenders"]:
        assert ext["urlPrefix"] == "http://127.0.0.1:8888/tessera"
        ext["urlPrefix"] = f"http://127.0.0.1:{port}/tessera"
    hport = free_port()
    cfg["healthzBindAddress"] = cfg["metricsBindAddress"] = f"127.0.0.1:{hport}"
    return cfg


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    skip_without_control_plane()
    from kubernetes import client, config

    base = tmp_path_factory.mktemp("second")
    work = base / "cp"
    default_cfg = base / "default-scheduler.yaml"  # a stock kube-scheduler: what a managed cluster runs
    default_cfg.write_text(yaml.safe_dump({"apiVersion": "kubescheduler.config.k8s.io/v1beta1",
                                           "kind": "KubeSchedulerConfiguration",
                                           "clientConnection": {"kubeconfig": "__KUBECONFIG__"}}))
    env = dict(os.environ, TESSERA_PYTHON=sys.executable)
    subprocess.run([str(CONTROLPLANE), "start", str(work), str(default_cfg)], check=True, env=env)
    sched = tessera = None
    try:
        config.load_kube_config(config_file=str(work / "kubeconfig"))
        api = client.CoreV1Api()
        api.create_namespace({"metadata": {"name": "tessera-system"}})
        port = free_port()
        cfg_path = base / "tessera-scheduler.yaml"
        cfg_path.write_text(yaml.safe_dump(second_scheduler_config(work, port)))
        tessera = Tessera(work, port)
        tessera.start()
        sched_log = open(work / "logs" / "tessera-scheduler.log", "ab")
        sched = subprocess.Popen([str(KUBE_BIN / "kube-scheduler"), f"--config={cfg_path}", "--bind-address=127.0.0.1",
                                  f"--secure-port={free_port()}", f"--cert-dir={base / 'sched-certs'}", "--v=2"],
                                 stdout=sched_log, stderr=subprocess.STDOUT, start_new_session=True)
        lease = client.CoordinationV1Api()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # leader election, for real, on the shipped Lease
            try:
                holder = lease.read_namespaced_lease(SCHED, "tessera-system").spec.holder_identity or ""
                if holder.startswith(socket.gethostname() + "_"):
                    break
            except ApiException:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("the second kube-scheduler did not take its Lease tessera-system/tessera-scheduler")
        yield {"api": api, "tessera": tessera, "work": work}
    finally:
        if sched and sched.poll() is None:
            os.killpg(sched.pid, signal.SIGTERM)
            sched.wait(10)
        if tessera:
            tessera.kill()
        subprocess.run([str(CONTROLPLANE), "stop", str(work)], check=False)


def node(api, name, gpus, model="", dedicated=False, cpu="64"):
    capacity = {"cpu": cpu, "memory": "256Gi", "pods": "250", "nvidia.com/gpu": str(gpus)}
    labels = {"kubernetes.io/hostname": name}
    if model:
        labels["nvidia.com/gpu.product"] = model
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    if dedicated:  # the admin guide's recipe: taint and label
        labels[DEDICATED["key"]] = SCHED
        body["spec"] = {"taints": [{k: DEDICATED[k] for k in ("key", "value", "effect")}]}
    api.create_node(body)
    status = {"capacity": capacity, "allocatable": capacity,
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}
    api.patch_node_status(name, {"status": status})


def pod(api, name, limits, tessera=False, models=None, annotations=None, namespace=NS):
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": limits}}]}
    if tessera:  # what an ML engineer adds: the scheduler, the toleration, the node pool
        spec["schedulerName"] = SCHED
        spec["tolerations"] = [TOLERATE]
        spec["nodeSelector"] = {DEDICATED["key"]: SCHED}
    if models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": models}]}]}}}
    api.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec})


def bound(api, name, timeout=60, namespace=NS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = api.read_namespaced_pod(name, namespace)
        if p.spec.node_name:
            return p
        time.sleep(0.2)
    raise AssertionError(f"{name} not bound within {timeout}s: {events(api, name, namespace)}")


def events(api, name, namespace=NS):
    return [e.message for e in api.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items]


def assignment(p):
    return json.loads(p.metadata.annotations[ASSIGNMENT_ANNOTATION])


@pytest.fixture(scope="module")
def api(two):
    api = two["api"]
    node(api, "ts-a100-0", 8, "A100", dedicated=True)
    node(api, "ts-t4-0", 2, "T4", dedicated=True)
    node(api, "ts-t4-1", 2, "T4", dedicated=True)
    node(api, "ts-p4-0", 1, "P4", dedicated=True)
    node(api, "ts-v100-0", 2, "V100", dedicated=True)
    node(api, "ts-v100-1", 2, "V100", dedicated=True)
    node(api, "gen-0", 4, "A10")   # another team's GPU node: the default scheduler's
    node(api, "cpu-0", 0)
    deadline = time.monotonic() + 30
    while len(two["tessera"].inspect()["nodes"]) < 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    return api


def test_scenarios_pass_with_schedulername_tessera_scheduler(api, two):
    """whole, fraction, multi-GPU, model constraint, gang and unfittable, through the second scheduler."""
    pod(api, "whole", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, tessera=True)
    a = assignment(bound(api, "whole"))
    assert a["milli"] == 1000 and len(a["gpus"]) == 1 and a["node"].startswith("ts-")
    for i, milli in enumerate((300, 300, 400)):
        pod(api, f"slice-{i}", {"cpu": "1", "memory": "1Gi", "tessera.dev/gpu-milli": str(milli)}, tessera=True, models=["T4"])
    used = {}
    for i in range(3):
        a = assignment(bound(api, f"slice-{i}"))
        used[(a["node"], a["gpus"][0])] = used.get((a["node"], a["gpus"][0]), 0) + a["milli"]
    assert max(used.values()) <= 1000 and len(used) < 3  # packed onto shared GPUs
    pod(api, "quad", {"cpu": "4", "memory": "4Gi", "nvidia.com/gpu": "4"}, tessera=True)
    a = assignment(bound(api, "quad"))
    assert a["node"] == "ts-a100-0" and len(set(a["gpus"])) == 4
    pod(api, "p4-big", {"cpu": "1", "memory": "1Gi", "tessera.dev/gpu-milli": "600"}, tessera=True, models=["P4"])
    assert bound(api, "p4-big").spec.node_name == "ts-p4-0"
    pod(api, "p4-second", {"cpu": "1", "memory": "1Gi", "tessera.dev/gpu-milli": "500"}, tessera=True, models=["P4"])
    for i in range(2):
        pod(api, f"g-{i}", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}, tessera=True, models=["V100"],
            annotations={"tessera.dev/gang-name": "g", "tessera.dev/gang-size": "2"})
    assert {bound(api, f"g-{i}").spec.node_name for i in range(2)} == {"ts-v100-0", "ts-v100-1"}
    deadline = time.monotonic() + 30
    text = ""
    while "no GPU has 500 milli free" not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = " ".join(events(api, "p4-second"))
    assert not api.read_namespaced_pod("p4-second", NS).spec.node_name
    # grouped for kube-scheduler's count (core/cluster.py: grouped); the share per node is in /inspect
    assert "tessera: no GPU has 500 milli free" in text and "largest free share" not in text, text
    api.delete_namespaced_pod("p4-second", NS, grace_period_seconds=0)


def test_the_default_schedulers_pods_never_reach_tesseras_nodes_and_tessera_counts_them(api, two):
    pod(api, "team-b-gpu", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"})  # no schedulerName
    pod(api, "team-b-cpu", {"cpu": "1", "memory": "1Gi"})
    assert bound(api, "team-b-gpu").spec.node_name == "gen-0"  # the only untainted GPU node
    assert not bound(api, "team-b-cpu").spec.node_name.startswith("ts-")
    for name in ("team-b-gpu", "team-b-cpu"):
        assert ASSIGNMENT_ANNOTATION not in (api.read_namespaced_pod(name, NS).metadata.annotations or {})
    deadline = time.monotonic() + 10
    free = 64000
    while free == 64000 and time.monotonic() < deadline:  # Tessera's cache counts the default scheduler's pods
        free = next(n for n in two["tessera"].inspect()["nodes"] if n["name"] == "gen-0")["cpu_free_milli"]
        time.sleep(0.3)
    assert free == 63000


def mixed_pods(n: int, seed: int = 7):
    """n pods of three kinds: other teams' CPU pods, other teams' whole-GPU pods (default scheduler),
    and Tessera's slices and whole GPUs (tessera-scheduler)."""
    rng = random.Random(seed)
    for i in range(n):
        r = rng.random()
        if r < 0.4:
            yield f"mx-cpu-{i}", {"cpu": "100m", "memory": "64Mi"}, False
        elif r < 0.55:
            yield f"mx-gpu-{i}", {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(rng.choice((1, 1, 2)))}, False
        elif r < 0.95:
            milli = rng.choice((50, 100, 150, 250))
            yield f"mx-slice-{i}", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": str(milli)}, True
        else:
            yield f"mx-whole-{i}", {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"}, True


def test_mixed_pods_from_both_schedulers_never_double_book(api, two):
    n = int(os.environ.get("TESSERA_MIXED_PODS", "300"))
    for i in range(max(6, n // 60)):  # room for Tessera's share; other teams' whole GPUs run out first
        node(api, f"mx-ts-{i}", 8, "H100", dedicated=True)
    for i in range(6):
        node(api, f"mx-gen-{i}", 8, "L4")
    for i in range(4):
        node(api, f"mx-cpu-node-{i}", 0)
    capacity = {x.metadata.name: int((x.status.allocatable or {}).get("nvidia.com/gpu", "0")) for x in api.list_node().items}
    names = []
    t0 = time.monotonic()
    for name, limits, by_tessera in mixed_pods(n):
        pod(api, name, limits, tessera=by_tessera, models=["H100"] if by_tessera else None)
        names.append(name)
    created = time.monotonic() - t0
    last, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + max(240, n * 0.6)
    while time.monotonic() < deadline:  # until every pod is bound, or nothing moved for 20 s
        pods = {p.metadata.name: p for p in api.list_namespaced_pod(NS).items if p.metadata.name.startswith("mx-")}
        done = sum(1 for p in pods.values() if p.spec.node_name)
        if done != last:
            last, stable_since = done, time.monotonic()
        if done == n or time.monotonic() - stable_since > 20:
            break
        time.sleep(1)
    elapsed = time.monotonic() - t0
    everything = api.list_pod_for_all_namespaces().items
    gpus_on = {}
    slices = {}
    counts = {"cpu": 0, "gpu": 0, "slice": 0, "whole": 0}
    for p in everything:
        if not p.spec.node_name:
            continue
        limits = p.spec.containers[0].resources.limits or {}
        gpus_on[p.spec.node_name] = gpus_on.get(p.spec.node_name, 0) + int(limits.get("nvidia.com/gpu", "0"))
        ann = p.metadata.annotations or {}
        if p.spec.scheduler_name == SCHED:
            a = json.loads(ann[ASSIGNMENT_ANNOTATION])
            assert a["node"] == p.spec.node_name and p.spec.node_name.startswith(("ts-", "mx-ts-"))
            for g in a["gpus"]:
                slices[(a["node"], g)] = slices.get((a["node"], g), 0) + a["milli"]
        else:
            assert not p.spec.node_name.startswith(("ts-", "mx-ts-")), f"{p.metadata.name} on Tessera's node"
        if p.metadata.name.startswith("mx-"):
            counts[p.metadata.name.split("-")[1]] += 1
    over = {k: v for k, v in gpus_on.items() if v > capacity.get(k, 0)}
    double = {k: v for k, v in slices.items() if v > 1000}
    pending = n - sum(counts.values())
    print(f"\nmixed: {n} pods created in {created:.0f} s, decided in {elapsed:.0f} s; bound {counts}, pending {pending}; "
          f"GPUs over capacity: {len(over)}, slices double-booked: {len(double)}")
    assert not over and not double
    assert counts["cpu"] and counts["gpu"] and counts["slice"] and counts["whole"]
    seen = two["tessera"].inspect()
    assert not seen["not_counted"] and not seen["forged"]
    # pending pods are only those capacity refuses: other teams' whole GPUs beyond the L4 nodes
    if pending:
        left = [p for p in api.list_namespaced_pod(NS).items if p.metadata.name.startswith("mx-") and not p.spec.node_name]
        assert all(p.metadata.name.startswith("mx-gpu-") for p in left), [p.metadata.name for p in left][:10]


def test_with_tessera_stopped_other_pods_schedule_and_gpu_pods_wait_for_it(api, two):
    t = two["tessera"]
    t.kill()
    try:
        pod(api, "down-cpu", {"cpu": "100m", "memory": "64Mi"})
        # Tessera's own replacement pod: the Deployment has no schedulerName, the default scheduler places it
        pod(api, "tessera-scheduler-replacement", {"cpu": "500m", "memory": "512Mi"}, namespace="tessera-system")
        pod(api, "down-slice", {"cpu": "100m", "memory": "64Mi", "tessera.dev/gpu-milli": "200"}, tessera=True)
        assert bound(api, "down-cpu", 30).spec.node_name
        assert bound(api, "tessera-scheduler-replacement", 30, namespace="tessera-system").spec.node_name
        time.sleep(5)
        assert not api.read_namespaced_pod("down-slice", NS).spec.node_name  # waits: no GPU picked by nobody
    finally:
        t.start()
    a = assignment(bound(api, "down-slice", 120))  # kube-scheduler retries it once Tessera answers again
    assert a["milli"] == 200
    seen = t.inspect()
    assert not seen["not_counted"] and f"{NS}/down-slice" in {
        h["pod"] for n in seen["nodes"] for g in n["gpus"] for h in g["holders"]}
    for n in seen["nodes"]:  # no GPU double-booked across the outage
        for g in n["gpus"]:
            assert sum(h["milli"] for h in g["holders"]) <= 1000, (n["name"], g)
