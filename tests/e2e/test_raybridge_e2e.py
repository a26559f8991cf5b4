"""Issue 12's acceptance on the real control plane: the bridge and two jobs in two namespaces, each
acting under its own identity (the shipped RBAC, enforced by the real kube-apiserver: every client
here impersonates its ServiceAccount).

Job A (namespace rb-a) runs for real: kube-scheduler with `tessera serve` binds its gang, its own
runner (raybridge/job.py, as the job's ServiceAccount) starts the trainers on the job's Ray
cluster (a real multi-node one, ray.cluster_utils), writes phase and progress on its own pods,
recovers from a killed Ray node and marks the lost pod; the bridge (as tessera-bridge) creates the
replacement, the extender places it, the job grows back.

Job B (namespace rb-b) is hostile: an entrypoint that would leave a mark if anything imported it,
forged bridge annotations (created-by, a MAC copied from the bridge's own pod in rb-a, replaces
naming A's pod), every pod marked lost. The bridge runs none of it, creates nothing in rb-a for it,
deletes none of B's own pods, and B's ServiceAccount can neither read nor write anything in rb-a.
The bridge's effective rights are listed from the apiserver (SelfSubjectRulesReview).

One namespace per job (the example's own namespace is named for it, and each job here gets its own): when a second
job's pod appears in rb-a anyway, A's identity can mark it lost (its Role patches every pod of its namespace, which is
why the namespace is the job's boundary), and the bridge then replaces and deletes nothing in rb-a and says why.

What this does not run (no kubelet here): the job's driver and member containers. Their commands
are tested in tests/raybridge/test_job_entry.py, Ray's token refusal in test_ray_token.py, the
per-job store and liveness secrets in test_secure_store.py and test_liveness.py.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
import yaml
from kubernetes import client

from raybridge.contract import (
    BRIDGE_MAC_ANNOTATION,
    CREATED_BY_ANNOTATION,
    LOST_ANNOTATION,
    PHASE_ANNOTATION,
    PROGRESS_ANNOTATION,
    REPLACES_ANNOTATION,
)
from testing.local_cluster import ROOT

from ..kustomize import render
from .harness import create_or_keep, impersonating, refused

pytestmark = pytest.mark.ray

A, B = "rb-a", "rb-b"
TAINT = {"key": "e2e/raybridge", "operator": "Exists", "effect": "NoSchedule"}
LABEL = "e2e/raybridge"
CONFIG = {"global_batch": 24, "channels": 8, "blocks": 1, "image_size": 8, "steps": 1_000_000, "checkpoint_every": 10}
HOSTILE = "tests.e2e.hostile_entry:build"
EXAMPLE_NS = "resnet-demo"  # manifests/examples/ray-training-job.yaml: one namespace per job, named for it


def make_node(api, name):
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "T4", LABEL: "yes", "kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": TAINT["key"], "effect": TAINT["effect"]}]}}
    api.create_node(body)
    status = {"capacity": capacity, "allocatable": capacity,
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}]}
    api.patch_node_status(name, {"status": status})


def member_pod(ns, name, gang, size, entrypoint, extra=None, gpu=True):
    ann = {"tessera.dev/runtime": "ray", "tessera.dev/gang-name": gang, "tessera.dev/gang-size": str(size),
           "tessera.dev/entrypoint": entrypoint, "tessera.dev/train-config": json.dumps(CONFIG), **(extra or {})}
    limits = {"cpu": "100m", "memory": "64Mi", **({"nvidia.com/gpu": "1"} if gpu else {})}
    spec = {"serviceAccountName": "job", "containers": [{"name": "member", "image": "none", "resources": {"limits": limits}}],
            "nodeSelector": {LABEL: "yes"}, "tolerations": [TAINT]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": ann}, "spec": spec}


def install_rbac(api):
    """The shipped bridge RBAC, and the example job's ServiceAccount/Role/RoleBinding in each namespace, with the
    example's RoleBinding that enables its namespace for Ray jobs (the bridge's pod writes there)."""
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    for ns in ("tessera-system", A, B):
        create_or_keep(api.create_namespace, {"metadata": {"name": ns}})
    for o in render(ROOT / "manifests"):
        if o["metadata"]["name"] not in ("tessera-bridge", "tessera-bridge-jobs"):
            continue
        if o["kind"] == "ServiceAccount":
            create_or_keep(api.create_namespaced_service_account, "tessera-system", o)
        elif o["kind"] == "ClusterRole":
            create_or_keep(rbac.create_cluster_role, o)
        elif o["kind"] == "ClusterRoleBinding":
            create_or_keep(rbac.create_cluster_role_binding, o)
    example = [d for d in yaml.safe_load_all((ROOT / "manifests/examples/ray-training-job.yaml").read_text()) if d]
    home = f'"namespace": "{EXAMPLE_NS}"'  # the example job's own namespace, named for it: moved first, then renamed
    for ns in (A, B):
        for o in example:
            if o["kind"] not in ("ServiceAccount", "Role", "RoleBinding"):
                continue
            o = json.loads(json.dumps(o).replace(home, f'"namespace": "{ns}"').replace("resnet-demo", "job"))
            assert o["metadata"]["namespace"] == ns, o
            fn = {"ServiceAccount": api.create_namespaced_service_account, "Role": rbac.create_namespaced_role,
                  "RoleBinding": rbac.create_namespaced_role_binding}[o["kind"]]
            create_or_keep(fn, ns, o)


def effective_rules(api_client, namespace: str) -> dict[str, set[str]]:
    """resource -> verbs the apiserver says this identity holds in `namespace` (discovery rules left out)."""
    review = client.AuthorizationV1Api(api_client).create_self_subject_rules_review(
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": namespace}})
    out: dict[str, set[str]] = {}
    for rule in review.status.resource_rules:
        for r in rule.resources or []:
            if r.startswith("selfsubject"):
                continue
            out.setdefault(r, set()).update(rule.verbs)
    return out


class BridgeThread:
    """The bridge's loop with the bridge's identity (the same code `tessera bridge` runs)."""

    def __init__(self, api_client) -> None:
        from raybridge.bridge import Bridge
        from raybridge.kube import PodWatch, PodWriter

        core = client.CoreV1Api(api_client)
        self.watch = PodWatch(core)
        self.bridge = Bridge(self.watch, PodWriter(core), b"e2e-bridge-key-" * 3)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def start(self):
        threading.Thread(target=self.watch.run, daemon=True).start()
        self.watch.synced.wait(30)
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        try:
            while not self.stop.is_set():
                self.bridge.turn()
                time.sleep(0.1)
        except BaseException as e:  # surfaced by the test
            self.error = e

    def close(self):
        self.stop.set()
        self.watch.stop()


def pods(api, ns) -> dict:
    return {p.metadata.name: p for p in api.list_namespaced_pod(ns).items}


def progress(pod) -> dict:
    return json.loads((pod.metadata.annotations or {}).get(PROGRESS_ANNOTATION, "{}"))


def run_until(runner, bridge, what, check, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.turn()
        if bridge.error:
            raise AssertionError(f"the bridge failed: {bridge.error!r}")
        got = check()
        if got:
            return got
    raise AssertionError(f"timed out waiting for {what} ({runner.waiting})")


def test_two_jobs_in_two_namespaces_the_bridge_repairs_one_and_runs_nothing_of_the_hostile_other(
        cluster, ray_nodes, tmp_path, monkeypatch):
    from raybridge.job import JobRunner, OwnPods

    api = cluster["api"]
    install_rbac(api)
    marker = tmp_path / "hostile-ran"
    monkeypatch.setenv("TESSERA_E2E_HOSTILE_MARK", str(marker))
    nodes = ray_nodes.add(3)  # the job's Ray cluster: nodes named like the Kubernetes nodes below
    for n in nodes:
        make_node(api, n)
    bridge_client = impersonating(api, "tessera-system", "tessera-bridge")
    job_a, job_b = client.CoreV1Api(impersonating(api, A, "job")), client.CoreV1Api(impersonating(api, B, "job"))

    # the bridge's effective rights, as the apiserver computes them: pods and events, nothing else
    assert effective_rules(bridge_client, A) == {"pods": {"list", "watch", "create", "delete"}, "events": {"create"}}
    assert effective_rules(client.ApiClient(job_a.api_client.configuration, header_name="Impersonate-User",
                                            header_value=f"system:serviceaccount:{A}:job"), B) == {}

    bridge = BridgeThread(bridge_client)
    runner = None
    try:
        for i in range(2):
            api.create_namespaced_pod(A, member_pod(A, f"train-{i}", "rbjob", 2, "raybridge.examples.resnet:build"))
        bridge.start()
        runner = JobRunner(OwnPods(job_a, A), "rbjob", {"rendezvous_host": "127.0.0.1", "detached": False},
                           steps_per_turn=5, progress_every_s=1, pod_resources=False)

        def training(names, after=0, recoveries=0):
            def check():
                now = pods(api, A)
                ok = all(n in now and (now[n].metadata.annotations or {}).get(PHASE_ANNOTATION) == "Running"
                         and progress(now[n]).get("world") == 2 and progress(now[n]).get("step", 0) > after
                         and progress(now[n]).get("recoveries", 0) >= recoveries for n in names)
                return now if ok else None
            return check

        now = run_until(runner, bridge, "job A training", training(["train-0", "train-1"], after=5))
        assert {now[n].spec.node_name for n in ("train-0", "train-1")} < set(nodes)

        # the Ray node under train-1 dies (its pod stays): the job recovers and marks the pod; the
        # bridge replaces it in rb-a, the extender places the replacement, the job grows back
        victim = now["train-1"].spec.node_name
        ray_nodes.cluster.kill(victim)
        now = run_until(runner, bridge, "the replacement of train-1",
                        training(["train-0", "train-1-r1"], recoveries=1))
        r1 = now["train-1-r1"]
        assert (now["train-1"].metadata.annotations or {}).get(LOST_ANNOTATION), "the job marked its lost pod"
        assert r1.metadata.annotations[REPLACES_ANNOTATION] == f"{A}/train-1" and r1.spec.node_name not in (victim,)
        assert r1.metadata.annotations[CREATED_BY_ANNOTATION] == "tessera-bridge"
        p = progress(r1)
        assert p["recoveries"] == 1 and p["steps_redone"] <= 1 and p["last_recovery_s"] >= p["last_detection_s"] >= 0

        # job B, hostile, in rb-b
        copied_mac = r1.metadata.annotations[BRIDGE_MAC_ANNOTATION]
        forged = {PHASE_ANNOTATION: "Running", LOST_ANNOTATION: "x", CREATED_BY_ANNOTATION: "tessera-bridge",
                  REPLACES_ANNOTATION: f"{A}/train-0", BRIDGE_MAC_ANNOTATION: copied_mac}
        api.create_namespaced_pod(B, member_pod(B, "train-1-r1", "evil", 1, HOSTILE, forged, gpu=False))
        api.create_namespaced_pod(B, member_pod(B, "evil-0", "evil", 1, HOSTILE, forged, gpu=False))
        time.sleep(3)  # many bridge turns
        before_a = set(pods(api, A))
        b_pods = pods(api, B)
        assert {"train-1-r1", "evil-0"} <= set(b_pods), "the bridge deleted a pod it did not create"
        assert before_a == set(pods(api, A)) and f"{A}/train-0" not in {
            (q.metadata.annotations or {}).get(REPLACES_ANNOTATION) for q in pods(api, A).values()}
        created_in_b = [n for n, q in b_pods.items() if (q.metadata.annotations or {}).get(REPLACES_ANNOTATION, "").startswith(B)]
        assert len(created_in_b) <= 1, "one replacement at most for a gang of one (never above the gang size)"
        assert HOSTILE.split(":")[0] not in sys.modules and not marker.exists(), "the bridge ran the hostile entrypoint"
        # B's identity reaches nothing of A's: not its pods, not their annotations, not deleting them
        assert refused(lambda: job_b.list_namespaced_pod(A))
        assert refused(lambda: job_b.patch_namespaced_pod("train-0", A, {"metadata": {"annotations": {LOST_ANNOTATION: "x"}}}))
        assert refused(lambda: job_b.delete_namespaced_pod("train-0", A))
        assert refused(lambda: job_b.create_namespaced_pod(A, member_pod(A, "x", "rbjob", 2, HOSTILE)))
        assert refused(lambda: job_a.list_namespaced_secret(A)), "a job's identity reads no Secret, not even its own"
        # A trained on throughout
        step = progress(pods(api, A)["train-0"])["step"]
        run_until(runner, bridge, "job A still training", training(["train-0", "train-1-r1"], after=step + 5))

        # a second job in A's namespace, which the example says never to do: A's identity may patch its pods too (the
        # Role grants every pod of the namespace) and marks one lost; the bridge now replaces and deletes nothing in rb-a
        before_a = set(pods(api, A))
        api.create_namespaced_pod(A, member_pod(A, "other-0", "other", 1, "raybridge.examples.resnet:build",
                                                {PHASE_ANNOTATION: "Running"}, gpu=False))
        job_a.patch_namespaced_pod("other-0", A, {"metadata": {"annotations": {LOST_ANNOTATION: "job A's word"}}})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not bridge.bridge.shared_namespaces:
            time.sleep(0.2)
        time.sleep(2)  # many bridge turns
        assert set(pods(api, A)) == before_a | {"other-0"}, "nothing replaced or deleted in a namespace of two jobs"
        assert bridge.error is None and bridge.bridge.shared_namespaces == 1
        shared = [e.message for e in api.list_namespaced_event(A, field_selector="involvedObject.name=other-0").items
                  if e.reason == "TesseraNamespaceShared"]
        assert len(shared) == 1 and f"namespace {A} holds Ray pods of 2 jobs ('other', 'rbjob')" in shared[0]
    finally:
        bridge.close()
        if runner is not None and runner.state is not None:
            runner.state.controller.close()
        for ns in (A, B):
            for name in pods(api, ns):
                api.delete_namespaced_pod(name, ns, grace_period_seconds=0)
