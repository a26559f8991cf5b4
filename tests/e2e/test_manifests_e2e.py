"""manifests/ against the real 1.20.2 kube-apiserver: server-side dry-run of every object (what
`kubectl apply --dry-run=server` does), and a check
that the apiserver kept every field we sent (1.20 silently drops unknown fields of built-in types
and prunes them from CRDs, so a misspelt field would otherwise pass). Where kubectl 1.20 is built,
`kubectl apply --dry-run=server -k` of manifests/k8s-1.20, manifests/ray and manifests/monitoring
itself, and kustomize's reading of every kustomization compared with tests/kustomize.py's.

Custom resources (RayCluster, ServiceMonitor) are dry-run through the CustomObjectsApi against
tests/crds' CRDs, installed in the apiserver (the `crds` fixture; it needs the reflect2-fixed r2
build of scripts/kube-build.sh). Those CRDs keep a RayCluster's pod templates as
preserve-unknown-fields, so each template is also dry-run as a core PodTemplate."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from testing.local_cluster import KUBE_BIN, SHIPPED_CONFIG

from ..kustomize import render

ROOT = Path(__file__).resolve().parents[2]
M = ROOT / "manifests"
KUBECTL = KUBE_BIN / "kubectl"


@pytest.fixture(scope="module")
def dyn(cluster):
    from kubernetes.dynamic import DynamicClient

    # A dry-run Namespace is not there for the objects after it, so the namespaces are made for real
    # (kubectl apply --dry-run=server has the same limit on a fresh cluster).
    for ns in ("tessera-system", "ml", "resnet-demo"):  # resnet-demo: the Ray job example's own namespace
        try:
            cluster["api"].create_namespace({"metadata": {"name": ns}})
        except ApiException as e:
            if e.status != 409:
                raise
    return DynamicClient(cluster["api"].api_client)


def missing(sent, got, path=""):
    """Paths of fields in `sent` that the apiserver's answer lacks (quantities compared as text)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [path or "/"]
        return [p for k, v in sent.items() for p in (missing(v, got[k], f"{path}.{k}") if k in got else [f"{path}.{k}"])]
    if isinstance(sent, list) and path.endswith(".tolerations") and isinstance(got, list):
        # the DefaultTolerationSeconds admission plugin appends not-ready/unreachable tolerations
        return [f"{path}[{i}]" for i, a in enumerate(sent) if not any(not missing(a, b) for b in got)]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [path]
        return [p for i, (a, b) in enumerate(zip(sent, got, strict=True)) for p in missing(a, b, f"{path}[{i}]")]
    return [] if str(sent) == str(got) or sent == got else [f"{path}: sent {sent!r}, got {got!r}"]


def dry_run(dyn, obj, namespace=None, crds=None):
    """Server-side dry-run create of `obj`; the paths of the fields the apiserver did not keep.
    Kinds in `crds` ({kind: CustomKind}, all namespaced) go through the CustomObjectsApi."""
    body = json.loads(json.dumps(obj))
    custom = (crds or {}).get(obj["kind"])
    if custom:
        ns = body["metadata"].setdefault("namespace", namespace)
        api = CustomObjectsApi(dyn.client)
        got = api.create_namespaced_custom_object(custom.group, custom.version, ns, custom.plural, body, dry_run="All")
        return missing(body, got)
    res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    ns = obj["metadata"].get("namespace", namespace) if res.namespaced else None
    if ns:
        body["metadata"]["namespace"] = ns
    got = res.create(body=body, namespace=ns, dry_run="All").to_dict()
    return missing(body, got)


def shipped_objects():
    out = []
    for k in ("k8s-1.20", "k8s-1.20/second-scheduler", "monitoring", "ray"):
        made = ("tessera-system", "ml")  # by the fixture, for real
        out += [(k, o) for o in render(M / k) if not (o["kind"] == "Namespace" and o["metadata"]["name"] in made)]
    for path in sorted((M / "examples").glob("*.yaml")):
        out += [(path.name, o) for o in yaml.safe_load_all(path.read_text()) if o]
    rc = next(o for k, o in out if o["kind"] == "RayCluster")["spec"]
    for i, t in enumerate([rc["headGroupSpec"]["template"]] + [g["template"] for g in rc["workerGroupSpecs"]]):
        out.append(("ray pod template", {"apiVersion": "v1", "kind": "PodTemplate",
                                         "metadata": {"name": f"raycluster-template-{i}", "namespace": "ml"}, "template": t}))
    return out


def test_every_shipped_object_passes_server_side_dry_run_unchanged(dyn, crds):
    objects = shipped_objects()
    failures = {}
    for where, obj in objects:
        try:
            lost = dry_run(dyn, obj, namespace="default", crds=crds)
        except ApiException as e:
            failures[f"{where}: {obj['kind']}/{obj['metadata']['name']}"] = f"{e.status} {e.body[:300]}"
            continue
        if lost:
            failures[f"{where}: {obj['kind']}/{obj['metadata']['name']}"] = f"fields dropped: {lost}"
    assert not failures, failures
    kinds = {o["kind"] for _, o in objects}
    assert {"Deployment", "DaemonSet", "Service", "PodDisruptionBudget", "ClusterRole", "Role",
            "ConfigMap", "Job", "Pod", "PodTemplate", "RayCluster", "ServiceMonitor"} <= kinds
    assert sum(o["kind"] in crds for _, o in objects) == 4  # 1 RayCluster, 3 ServiceMonitors
    assert len(objects) >= 28


def test_the_dropped_field_check_and_the_apiserver_both_catch_mistakes(dyn):
    dep = next(o for o in render(M) if o["kind"] == "Deployment" and o["metadata"]["name"] == "tessera-extender")
    typo = json.loads(json.dumps(dep))
    c = typo["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    assert any("readinesProbe" in p for p in dry_run(dyn, typo))  # 1.20 accepts it, silently dropped
    bad = json.loads(json.dumps(dep))
    bad["spec"]["replicas"] = -1
    with pytest.raises(ApiException) as e:
        dry_run(dyn, bad)
    assert e.value.status == 422


def test_the_crds_catch_mistakes_in_the_custom_resources(dyn, crds):
    """The same two checks for the RayCluster: a misspelt field is pruned (1.20 says nothing),
    a value outside the schema is refused."""
    rc = next(o for o in render(M / "ray") if o["kind"] == "RayCluster")
    typo = json.loads(json.dumps(rc))
    typo["spec"]["workerGroupSpecs"][0]["minReplica"] = typo["spec"]["workerGroupSpecs"][0].pop("minReplicas")
    assert [p for p in dry_run(dyn, typo, crds=crds) if "minReplica" in p] == [".spec.workerGroupSpecs[0].minReplica"]
    bad = json.loads(json.dumps(rc))
    bad["spec"]["autoscalerOptions"]["upscalingMode"] = "Fast"
    with pytest.raises(ApiException) as e:
        dry_run(dyn, bad, crds=crds)
    assert e.value.status == 422 and "upscalingMode" in e.value.body


def _kubectl(*args, kubeconfig):
    if not KUBECTL.is_file():
        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN} (scripts/kube-build.sh without SKIP_KUBECTL)")
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    return subprocess.run([str(KUBECTL), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("which", ["k8s-1.20", "k8s-1.20/second-scheduler", "monitoring", "ray"])
def test_kubectl_apply_dry_run_server(cluster, dyn, request, which):
    if which not in ("k8s-1.20", "k8s-1.20/second-scheduler"):
        request.getfixturevalue("crds")  # RayCluster and ServiceMonitor need their CRDs
    out = _kubectl("apply", "--dry-run=server", "-k", str(M / which), kubeconfig=cluster["dir"] / "kubeconfig")
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.strip()]
    assert len(lines) == len(render(M / which)), out.stdout
    assert all("(server dry run)" in x for x in lines), out.stdout


@pytest.mark.parametrize("which", ["k8s-1.20", "k8s-1.20/second-scheduler", "monitoring", "ray"])
def test_kubectls_kustomize_reads_what_the_tests_read(cluster, which):
    out = _kubectl("kustomize", str(M / which), kubeconfig=cluster["dir"] / "kubeconfig")
    assert out.returncode == 0, out.stderr

    def key(o):
        return (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])

    theirs = sorted((o for o in yaml.safe_load_all(out.stdout) if o), key=key)
    ours = sorted(render(M / which), key=key)
    assert [key(o) for o in theirs] == [key(o) for o in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert not missing(b, a), key(b)


def test_kube_scheduler_runs_the_shipped_v1beta1_config_changed_only_in_url_kubeconfig_and_cert_paths(cluster):
    """What kube-scheduler was started with (controlplane.sh's rendered copy) against the shipped
    file. Beside URL and kubeconfig, the script turns off leader election and puts the healthz and
    metrics ports on free loopback ports, so that several local clusters can run at once."""
    shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
    ran = yaml.safe_load((cluster["dir"] / "scheduler-config.yaml").read_text())
    for ext in shipped["extenders"] + ran["extenders"]:
        ext.pop("urlPrefix")
        ext["tlsConfig"] = {k: Path(v).name for k, v in ext["tlsConfig"].items()}  # the certificates' directory differs
    assert ran["extenders"] == shipped["extenders"] and all(e["enableHTTPS"] for e in ran["extenders"])
    assert ran["clientConnection"].pop("kubeconfig") == str(cluster["dir"] / "kubeconfig")
    shipped["clientConnection"].pop("kubeconfig")
    assert ran.pop("leaderElection") == {"leaderElect": False}
    shipped.pop("leaderElection")
    for k in ("healthzBindAddress", "metricsBindAddress"):
        assert ran.pop(k).startswith("127.0.0.1:")
    assert ran == shipped
