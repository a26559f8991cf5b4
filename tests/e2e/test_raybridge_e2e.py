"""`tessera bridge` as a process against the real control plane and a real multi-node Ray cluster.

A gang of `tessera.dev/runtime: ray` pods on fake GPU nodes is bound by kube-scheduler with
`tessera serve` as its extender; the bridge starts one trainer per pod on the Ray node named like
the pod's Kubernetes node and writes phase and progress onto the pods. A deleted pod and a killed
Ray node each shrink the job; the bridge creates a replacement pod, the extender places it, and the
job grows back. A bridge killed with -9 and started again adopts the running trainers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from raybridge.contract import PHASE_ANNOTATION, PROGRESS_ANNOTATION, REPLACES_ANNOTATION

from .harness import ROOT, free_port

pytestmark = pytest.mark.ray

NS = "rb-e2e"
TAINT = {"key": "e2e/raybridge", "operator": "Exists", "effect": "NoSchedule"}
LABEL = "e2e/raybridge"
CONFIG = {"global_batch": 24, "channels": 8, "blocks": 1, "image_size": 8, "steps": 1_000_000, "checkpoint_every": 10}


def make_node(api, name):
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "T4", LABEL: "yes", "kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}}
    api.create_node(body)
    status = {"capacity": capacity, "allocatable": capacity,
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}
    api.patch_node_status(name, {"status": status})


def make_trainer_pod(api, name):
    ann = {"tessera.dev/runtime": "ray", "tessera.dev/gang-name": "rbjob", "tessera.dev/gang-size": "2",
           "tessera.dev/entrypoint": "raybridge.examples.resnet:build", "tessera.dev/train-config": json.dumps(CONFIG)}
    spec = {"containers": [{"name": "slot", "image": "none",
                            "resources": {"limits": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"}}}],
            "nodeSelector": {LABEL: "yes"}, "tolerations": [TAINT]}
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
                                   "spec": spec})


def pods(api) -> dict:
    return {p.metadata.name: p for p in api.list_namespaced_pod(NS).items}


def progress(pod) -> dict:
    return json.loads((pod.metadata.annotations or {}).get(PROGRESS_ANNOTATION, "{}"))


def wait_for(what, check, timeout=120.0, bridge=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if bridge is not None and bridge.poll() is not None:
            raise AssertionError(f"the bridge exited ({bridge.returncode}) while waiting for {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


class BridgeProcess:
    def __init__(self, kubeconfig, ray_address, log) -> None:
        self.args = [sys.executable, "-m", "extender.cli", "bridge", "--kubeconfig", str(kubeconfig),
                     "--ray-address", ray_address, "--metrics-listen", f"127.0.0.1:{free_port()}", "--namespace", NS,
                     "--progress-every", "2"]
        self.log, self.proc = log, None

    def start(self):
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self.proc

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(20)


def trainer_pids(ray, names) -> dict:
    from raybridge.group import RAY_NAMESPACE, trainer_name

    out = {}
    for n in names:
        actor = ray.get_actor(trainer_name(f"{NS}/rbjob", f"{NS}/{n}"), namespace=RAY_NAMESPACE)
        out[n] = ray.get(actor.ping.options(concurrency_group="control").remote(), timeout=30)["pid"]
    return out


def test_bridge_runs_a_gang_through_pod_and_node_loss_and_its_own_restart(cluster, ray_nodes, tmp_path):
    import ray

    api = cluster["api"]
    try:
        api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    except ApiException as e:
        if e.status != 409:
            raise
    nodes = ray_nodes.add(3)  # Ray nodes named like the Kubernetes nodes below
    for n in nodes:
        make_node(api, n)
    bridge = BridgeProcess(cluster["dir"] / "kubeconfig", ray_nodes.cluster.address, tmp_path / "bridge.log")
    try:
        for i in range(2):
            make_trainer_pod(api, f"train-{i}")
        bridge.start()

        def running(names, world=2, after=0):
            def check():
                now = pods(api)
                ok = all(n in now and (now[n].metadata.annotations or {}).get(PHASE_ANNOTATION) == "Running"
                         and progress(now[n]).get("world") == world and progress(now[n]).get("step", 0) > after
                         for n in names)
                return now if ok else None
            return check

        now = wait_for("the gang training", running(["train-0", "train-1"], after=5), 180, bridge.proc)
        assert {now[n].spec.node_name for n in ("train-0", "train-1")} < set(nodes)

        # 1. a pod deleted: the job shrinks, a replacement pod is created, placed by the extender, joins
        api.delete_namespaced_pod("train-0", NS, grace_period_seconds=0)
        now = wait_for("the replacement of train-0", running(["train-0-r1", "train-1"]), 120, bridge.proc)
        r1 = now["train-0-r1"]
        assert r1.metadata.annotations[REPLACES_ANNOTATION] == f"{NS}/train-0" and r1.spec.node_name in nodes

        # 2. the Ray node under train-1 dies (the pod stays): recovery, a replacement pod, regrow
        before = progress(now["train-1"])
        ray_nodes.cluster.kill(now["train-1"].spec.node_name)
        now = wait_for("the replacement of train-1", running(["train-0-r1", "train-1-r1"]), 120, bridge.proc)
        assert now["train-1-r1"].spec.node_name not in (now["train-1"].spec.node_name, r1.spec.node_name)
        p = progress(now["train-1-r1"])
        assert p["recoveries"] == before["recoveries"] + 1 and p["steps_redone"] <= before["steps_redone"] + 1
        assert p["step"] > before["step"]

        # 3. the bridge is killed -9 and started again: it adopts the running trainers
        live = ["train-0-r1", "train-1-r1"]
        pids = trainer_pids(ray, live)
        bridge.kill()
        step_at_kill = progress(pods(api)["train-0-r1"])["step"]
        bridge.start()
        wait_for("training after the bridge restart", running(live, after=step_at_kill + 5), 120, bridge.proc)
        assert trainer_pids(ray, live) == pids, "a restarted bridge must adopt its trainers, not start them again"
        reasons = [e.reason for e in api.list_namespaced_event(NS, field_selector="involvedObject.name=train-0-r1").items]
        assert "TrainerAdopted" in reasons, reasons

        # 4. the whole job deleted (gracefully: the pods stay Terminating, there is no kubelet): the
        #    bridge stops its trainers and asks for no replacement
        names = set(pods(api))
        for name in names:
            api.delete_namespaced_pod(name, NS, grace_period_seconds=30)

        def stopped():
            from raybridge.group import RAY_NAMESPACE, trainer_name

            try:
                ray.get_actor(trainer_name(f"{NS}/rbjob", f"{NS}/train-0-r1"), namespace=RAY_NAMESPACE)
                return False
            except ValueError:
                return True
        wait_for("the trainers stopped", stopped, 60, bridge.proc)
        time.sleep(1)
        assert set(pods(api)) == names, "no replacement for a job being deleted"
    finally:
        bridge.kill()
        for name in pods(api):
            api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        print((tmp_path / "bridge.log").read_text()[-4000:])
