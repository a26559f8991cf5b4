"""Second-scheduler mode installed as docs/admin-guide.md says, on real nodes (issue 34 item 4): Tessera's own
kube-scheduler and its extender run as their Deployments' pods, and the control plane's kube-scheduler is left as it
is (no extender in its configuration).

What differs from the guide, for this machine: the same overlay as tests/e2e/test_install_e2e.py (the image built
here, the Service's ClusterIP pinned, fake GPUs for the agent and the device plugin), based on
`manifests/k8s-1.20/second-scheduler/`, plus one patch: the cluster has no DNS, so the `tessera-scheduler` pods get
a hostAliases entry naming the Service's ClusterIP `tessera-extender.tessera-system.svc` (the name its shipped
configuration calls, which the server certificate carries). kube-scheduler's image is `registry.k8s.io/
kube-scheduler:v1.20.2`, built from the same source build as the control plane (scripts/node.sh) and imported into
each node.

gpu-b is Tessera's GPU pool (guide step 1: tainted and labelled, the agent and the device plugin run there);
sys-a is the system pool, with no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tessera_contract import ASSIGNMENT_ANNOTATION
from testing.local_cluster import CONTROLPLANE, ROOT

from .harness import NODE_SUMMARY as SUMMARY
from .harness import until, write_node_summary
from .test_install_e2e import (
    CLUSTER_IP,
    GUIDE,
    SYSTEM,
    bound_by_tessera,
    control_plane,
    kubectl,
    run_guide,
    write_overlay,
)
from .test_nodes_e2e import IMAGE_BUILD, NODE_SH, SEE, fake_devices, gpu_pod, node_sh, seen, skip_without_nodes

NODES = ("sys-a", "gpu-b")
POOL = NODES[1]
EXAMPLE = ROOT / "manifests/examples/second-scheduler-slice.yaml"
SCHEDULER = "tessera-scheduler"
PLAIN_SCHEDULER = {"apiVersion": "kubescheduler.config.k8s.io/v1beta1", "kind": "KubeSchedulerConfiguration",
                   "clientConnection": {"kubeconfig": "__KUBECONFIG__"}}  # the control plane's, untouched by Tessera


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield SUMMARY
    write_node_summary()


def step_one(guide: str) -> list[list[str]]:
    """Guide step 1's two commands, NODE... being the pool."""
    lines = [ln.strip() for ln in guide.splitlines() if ln.strip().startswith((
        "kubectl taint nodes NODE...", "kubectl label nodes NODE...")) and "scheduler=tessera-scheduler" in ln]
    assert len(lines) == 2, f"docs/admin-guide.md step 1 no longer reads as this test expects: {lines}"
    return [ln.replace("NODE...", POOL).split()[1:] for ln in lines]


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    skip_without_nodes()
    from kubernetes import client, config

    work = tmp_path_factory.mktemp("second")
    cp = control_plane(work, lambda _pki: PLAIN_SCHEDULER)  # the control plane's scheduler: no extender
    started: list[str] = []
    try:
        for i, name in enumerate(NODES, start=3):  # bridges tbr3, tbr4: apart from the other modules' nodes
            node_sh("start", str(cp), name, str(i))
            started.append(name)
        built = subprocess.run([str(IMAGE_BUILD)], capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
        assert built.returncode == 0, built.stderr[-3000:]
        archive = built.stdout.split()[1]
        for name in NODES:
            node_sh("import", str(cp), name, archive)
        guide = GUIDE.read_text()
        for args in step_one(guide):  # step 1: the GPU pool, tainted and labelled
            kubectl(cp, *args)
        kubectl(cp, "label", "node", POOL, "tessera.dev/gpu-node=true", "tessera.dev/device-plugin=true")
        fake_devices(work / "fakedev")
        aliases = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": SCHEDULER, "namespace": SYSTEM},
                   "spec": {"template": {"spec": {"hostAliases": [
                       {"ip": CLUSTER_IP, "hostnames": [f"tessera-extender.{SYSTEM}.svc"]}]}}}}
        write_overlay(work / "overlay", work / "fakedev", base="manifests/k8s-1.20/second-scheduler",
                      extra={"scheduler-dns.yaml": aliases}, nodes=(POOL,))
        run_guide("second-scheduler-tls", cp, work)  # step 2
        run_guide("assignment-key", cp, work)  # step 3
        for line in ("kubectl apply -k manifests/k8s-1.20/second-scheduler/",
                     "kubectl -n tessera-system rollout status deployment/tessera-scheduler"):
            assert line in guide, f"docs/admin-guide.md no longer says {line!r}: change this test with it"
        t0 = time.monotonic()
        kubectl(cp, "apply", "-k", str(work / "overlay"))  # step 4
        for deployment in ("tessera-extender", SCHEDULER):
            kubectl(cp, "-n", SYSTEM, "rollout", "status", f"deployment/{deployment}", "--timeout=240s", timeout=260)
        print(f"\n[second] kubectl apply -k to both rollouts done: {time.monotonic() - t0:.1f} s")
        SUMMARY["second_scheduler_apply_to_ready_s"] = round(time.monotonic() - t0, 1)
        api_client = config.new_client_from_config(config_file=str(cp / "kubeconfig"))
        yield {"cp": cp, "api": client.CoreV1Api(api_client)}
    finally:
        for name in started:
            subprocess.run([str(NODE_SH), "remove", str(cp), name], check=False)
        subprocess.run([str(CONTROLPLANE), "stop", str(cp)], check=False)


def state(api, name: str) -> str:
    """A waiting pod's node, phase and last events, and the tessera-scheduler pods: a wait's failure message here."""
    pod = api.read_namespaced_pod(name, "default")
    events = [f"{e.reason}: {e.message}" for e in api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}").items]
    schedulers = [(p.metadata.name, p.status.phase) for p in api.list_namespaced_pod(
        SYSTEM, label_selector=f"app.kubernetes.io/name={SCHEDULER}").items]
    logs = []
    for p in api.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=tessera-device-plugin").items:
        try:
            tail = api.read_namespaced_pod_log(p.metadata.name, SYSTEM, tail_lines=8)
        except Exception as e:  # noqa: BLE001 (a failure message: say what could not be read)
            tail = f"(no log: {type(e).__name__})"
        logs.append(f"{p.metadata.name} on {p.spec.node_name} ({p.status.phase}): {tail}")
    return (f"node {pod.spec.node_name!r} phase {pod.status.phase}; events {events[-3:]}; schedulers {schedulers}; "
            f"device plugins {logs}")


def opted_in(pod: dict) -> dict:
    """Guide step 5: the example's three lines (schedulerName, toleration, node selector), taken from the example."""
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    pod["spec"].update({k: example[k] for k in ("schedulerName", "tolerations", "nodeSelector")})
    return pod


def test_both_deployments_run_as_pods_two_replicas_each(second):
    api = second["api"]
    for name in ("tessera-extender", SCHEDULER):
        pods = api.list_namespaced_pod(SYSTEM, label_selector=f"app.kubernetes.io/name={name}").items
        assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods), [
            (p.metadata.name, p.spec.node_name, p.status.phase) for p in pods]


def test_tesseras_scheduler_places_a_slice_pod_that_runs_with_its_gpu(second):
    api = second["api"]
    t0 = time.monotonic()
    api.create_namespaced_pod("default", opted_in(gpu_pod("slice-ts", 0, SEE, milli=250)))
    pod = until("slice-ts bound by Tessera through tessera-scheduler and running", lambda: (
        p := bound_by_tessera(api, "slice-ts")) and p.status.phase == "Running" and p, timeout=180,
        describe=lambda: state(api, "slice-ts"))
    print(f"\n[second] a slice pod created to Running through tessera-scheduler's pods: {time.monotonic() - t0:.1f} s")
    a = json.loads(pod.metadata.annotations[ASSIGNMENT_ANNOTATION])
    assert pod.spec.node_name == POOL and a["milli"] == 250
    assert [x for x in until("slice-ts's device list", lambda: seen(api, "slice-ts")) if x != "nvidiactl"] == \
        [f"nvidia{a['gpus'][0]}"]
    events = [e for e in api.list_namespaced_event("default", field_selector="involvedObject.name=slice-ts").items
              if e.reason == "Scheduled"]
    assert events and all(SCHEDULER in (e.reporting_component, e.source and e.source.component) for e in events), [
        (e.reporting_component, e.source) for e in events]
    SUMMARY["second_scheduler_placed"] = True


def test_a_default_scheduler_pod_never_shares_a_gpu_with_a_tessera_pod(second):
    """The honest pod (no toleration) waits: the pool is tainted and the system pool has no GPU. The careless or hostile
    one (the toleration without `schedulerName`, the guide's caveat) is placed on the pool by the default scheduler,
    and the device plugin gives it no device: no Tessera assignment, so the kubelet fails it at admission."""
    api = second["api"]
    api.create_namespaced_pod("default", gpu_pod("honest", 1, SEE))
    careless = gpu_pod("careless", 1, SEE)
    careless["spec"]["tolerations"] = yaml.safe_load(EXAMPLE.read_text())["spec"]["tolerations"]
    careless["spec"]["restartPolicy"] = "Never"
    api.create_namespaced_pod("default", careless)
    pod = until("careless placed by the default scheduler and refused its devices", lambda: (
        p := api.read_namespaced_pod("careless", "default")).status.phase == "Failed" and p, timeout=120)
    assert pod.spec.node_name == POOL and ASSIGNMENT_ANNOTATION not in (pod.metadata.annotations or {})
    assert pod.status.reason == "UnexpectedAdmissionError", (pod.status.reason, pod.status.message)
    assert "no pod bound here waits for nvidia.com/gpu devices" in (pod.status.message or "")
    honest = api.read_namespaced_pod("honest", "default")
    assert not honest.spec.node_name and honest.status.phase == "Pending"
    running = [p for p in api.list_namespaced_pod("default").items if p.status.phase == "Running"]
    assert [p.metadata.name for p in running] == ["slice-ts"]  # the only container with a GPU is Tessera's pod's
    SUMMARY["default_scheduler_pod_shared_a_gpu"] = False
