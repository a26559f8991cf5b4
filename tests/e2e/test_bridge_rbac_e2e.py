"""Issue 35, item 3, on the real 1.20.2 kube-apiserver: the bridge's pod writes are namespaced.

The shipped bridge RBAC (rendered from manifests/, as the manifest e2e reads it) is applied, one namespace is enabled for
Ray jobs by docs/admin-guide.md's own loop over the namespace label (run as written, with kubectl 1.20.2; kube-system
labelled too, which the loop skips), and `kubectl auth can-i` as the bridge's ServiceAccount shows what the apiserver
lets it do: pods create and delete in the enabled namespace only, not in kube-system, not in a namespace nobody enabled,
not cluster-wide; pods read everywhere. Impersonated calls agree. Then the bridge's own loop (raybridge.bridge with
raybridge.kube's PodWriter, as the bridge's identity) meets three jobs with a lost member each: it replaces the one in
the enabled namespace, says in words (log and an Event on the job's pod) that the other namespace is not enabled, and
writes nothing in kube-system even after a RoleBinding is made there by mistake.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from raybridge.contract import LOST_ANNOTATION, PHASE_ANNOTATION
from testing.local_cluster import KUBE_BIN, ROOT

from ..kustomize import render
from .harness import create_or_keep, impersonating, refused

ON, OFF = "brns-on", "brns-off"
BRIDGE = "system:serviceaccount:tessera-system:tessera-bridge"
LABEL = "tessera.dev/ray-jobs"
KUBECTL = KUBE_BIN / "kubectl"


def guide_block(name: str) -> str:
    text = (ROOT / "docs/admin-guide.md").read_text()
    m = re.search(rf"<!-- {name}:begin -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert m, f"no {name} block in docs/admin-guide.md"
    return m.group(1)


def kubectl_env(cluster) -> dict:
    return dict(os.environ, KUBECONFIG=str(Path(cluster["dir"]) / "kubeconfig"),
                PATH=f"{KUBE_BIN}:{os.environ.get('PATH', '')}")


def can_i(cluster, verb: str, resource: str, namespace: str | None) -> bool:
    """`kubectl auth can-i VERB RESOURCE` as the bridge (a SelfSubjectAccessReview, impersonated), in a namespace
    or (None) in all of them."""
    where = ["-n", namespace] if namespace else ["--all-namespaces"]
    done = subprocess.run([str(KUBECTL), "auth", "can-i", verb, resource, *where, f"--as={BRIDGE}"],
                          env=kubectl_env(cluster), capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
    return done.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def enabled(cluster):
    """The shipped bridge RBAC applied; ON labelled and enabled by the guide's loop (kube-system labelled too)."""
    if not KUBECTL.is_file():
        pytest.skip(f"kubectl 1.20.2 not unpacked in {KUBE_BIN} (scripts/kube-build.sh without SKIP_KUBECTL)")
    api = cluster["api"]
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    for ns in ("tessera-system", ON, OFF):
        create_or_keep(api.create_namespace, {"metadata": {"name": ns}})
    shipped = [o for o in render(ROOT / "manifests")
               if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "tessera-bridge"]
    make = {"ServiceAccount": (lambda o: api.create_namespaced_service_account("tessera-system", o),
                               lambda n: api.delete_namespaced_service_account(n, "tessera-system")),
            "ClusterRole": (rbac.create_cluster_role, rbac.delete_cluster_role),
            "ClusterRoleBinding": (rbac.create_cluster_role_binding, rbac.delete_cluster_role_binding)}
    made = []  # deleted again at the end: test_manifests_e2e's dry-run creates of the same objects would answer 409
    for o in (o for o in shipped if o["kind"] in make):
        try:
            make[o["kind"]][0](o)
            made.append((o["kind"], o["metadata"]["name"]))
        except client.exceptions.ApiException as e:
            if e.status != 409:
                raise
    assert {o["metadata"]["name"] for o in shipped if o["kind"] == "ClusterRole"} == {"tessera-bridge", "tessera-bridge-jobs"}
    for ns in (ON, "kube-system"):
        api.patch_namespace(ns, {"metadata": {"labels": {LABEL: "enabled"}}})
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_block("ray-namespaces")], cwd=ROOT,
                              env=kubectl_env(cluster), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "not enabling kube-system: the bridge never acts there" in done.stderr
        yield {"api": api, "rbac": rbac, "bridge": client.CoreV1Api(impersonating(api, "tessera-system", "tessera-bridge"))}
    finally:
        api.patch_namespace("kube-system", {"metadata": {"labels": {LABEL: None}}})
        for kind, name in reversed(made):
            make[kind][1](name)


def test_kubectl_auth_can_i_shows_the_bridge_writes_pods_only_in_the_enabled_namespace(cluster, enabled):
    for verb in ("create", "delete"):
        assert can_i(cluster, verb, "pods", ON), f"pods {verb} in {ON}, enabled"
        assert not can_i(cluster, verb, "pods", "kube-system"), f"pods {verb} in kube-system"
        assert not can_i(cluster, verb, "pods", OFF), f"pods {verb} in {OFF}, not enabled"
        assert not can_i(cluster, verb, "pods", None), f"pods {verb} cluster-wide"
    for verb in ("list", "watch"):
        assert can_i(cluster, verb, "pods", None), f"pods {verb} everywhere (its one watch)"
    assert can_i(cluster, "create", "events", OFF), "events everywhere: it tells a job its namespace is not enabled"
    for verb in ("patch", "update", "deletecollection"):
        assert not can_i(cluster, verb, "pods", ON), f"pods {verb}: never, even where enabled"
    assert not can_i(cluster, "create", "rolebindings", ON) and not can_i(cluster, "get", "secrets", ON)
    names = [b.metadata.name for b in enabled["rbac"].list_namespaced_role_binding("kube-system").items]
    assert "tessera-bridge-jobs" not in names, "the guide's loop skipped kube-system"


def test_impersonated_pod_writes_agree_with_can_i(enabled):
    api, bridge = enabled["api"], enabled["bridge"]
    body = {"metadata": {"name": "brns-probe"}, "spec": {
        "schedulerName": "brns-nobody", "containers": [{"name": "c", "image": "none"}]}}
    for ns in ("kube-system", OFF):
        assert refused(lambda ns=ns: bridge.create_namespaced_pod(ns, body)), ns
    api.create_namespaced_pod(OFF, body)
    assert refused(lambda: bridge.delete_namespaced_pod("brns-probe", OFF)), "delete where not enabled"
    api.delete_namespaced_pod("brns-probe", OFF, grace_period_seconds=0)
    made = bridge.create_namespaced_pod(ON, body)
    bridge.delete_namespaced_pod("brns-probe", ON, body={"preconditions": {"uid": made.metadata.uid}})


def job_pod(ns: str, name: str, lost: bool = False) -> dict:
    ann = {"tessera.dev/runtime": "ray", "tessera.dev/gang-name": "brjob", "tessera.dev/gang-size": "2",
           "tessera.dev/entrypoint": "raybridge.examples.resnet:build", "tessera.dev/train-config": "{}",
           PHASE_ANNOTATION: "Running", **({LOST_ANNOTATION: "trainer lost"} if lost else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": ann},
            "spec": {"schedulerName": "brns-nobody", "containers": [{"name": "c", "image": "none"}]}}


class Listed:
    """The bridge's pod source: the three namespaces' pods as API dicts (what PodWatch keeps)."""

    def __init__(self, api, namespaces) -> None:
        self.api, self.namespaces = api, namespaces

    def snapshot(self):
        return [self.api.api_client.sanitize_for_serialization(p)
                for ns in self.namespaces for p in self.api.list_namespaced_pod(ns).items]


def test_the_bridge_replaces_where_enabled_says_so_where_not_and_never_acts_in_kube_system(cluster, enabled, caplog):
    from raybridge.bridge import Bridge
    from raybridge.kube import PodWriter

    api, rbac = enabled["api"], enabled["rbac"]
    mistake = {"metadata": {"name": "tessera-bridge-jobs", "namespace": "kube-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-bridge-jobs"},
               "subjects": [{"kind": "ServiceAccount", "name": "tessera-bridge", "namespace": "tessera-system"}]}
    spaces = (ON, OFF, "kube-system")
    try:
        rbac.create_namespaced_role_binding("kube-system", mistake)  # an admin's mistake: the code still refuses
        assert can_i(cluster, "create", "pods", "kube-system"), "RBAC now allows it there"
        for ns in spaces:
            api.create_namespaced_pod(ns, job_pod(ns, "brjob-0"))
            api.create_namespaced_pod(ns, job_pod(ns, "brjob-1", lost=True))
        bridge = Bridge(Listed(api, spaces), PodWriter(enabled["bridge"]), b"e2e-bridge-key-" * 3)
        with caplog.at_level(logging.INFO, logger="tessera.bridge"):
            for _ in range(4):
                bridge.turn()
        names = {ns: sorted(p.metadata.name for p in api.list_namespaced_pod(ns).items if p.metadata.name.startswith("brjob"))
                 for ns in spaces}
        assert names == {ON: ["brjob-0", "brjob-1", "brjob-1-r1"], OFF: ["brjob-0", "brjob-1"],
                         "kube-system": ["brjob-0", "brjob-1"]}
        words = [r.getMessage() for r in caplog.records]
        (off,) = [w for w in words if "is not enabled for Ray jobs" in w]
        assert f"namespace {OFF} is not enabled for Ray jobs: the apiserver refused the bridge's pods create" in off
        assert f"kubectl -n {OFF} create rolebinding tessera-bridge-jobs" in off
        (never,) = [w for w in words if "never creates or deletes pods there" in w]
        assert "job kube-system/brjob is in namespace kube-system" in never
        events = {ns: [(e.reason, e.message) for e in api.list_namespaced_event(
            ns, field_selector="involvedObject.name=brjob-1").items] for ns in spaces}
        assert events[OFF] == [("TesseraNamespaceNotEnabled", off)]
        assert events["kube-system"] == [], "nothing written in kube-system, not even an Event"
        assert [r for r, _ in events[ON]] == ["TrainerLost"]
        assert bridge.refused_namespaces == 1 and bridge.replacements == 1
    finally:
        rbac.delete_namespaced_role_binding("tessera-bridge-jobs", "kube-system")
        for ns in spaces:
            for p in api.list_namespaced_pod(ns).items:
                if p.metadata.name.startswith("brjob"):
                    api.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)


def test_the_mistaken_kube_system_binding_is_gone_and_the_label_loop_is_idempotent(cluster, enabled):
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_block("ray-namespaces")], cwd=ROOT,
                          env=kubectl_env(cluster), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not can_i(cluster, "create", "pods", "kube-system") and can_i(cluster, "create", "pods", ON)
    assert json.loads(subprocess.run([str(KUBECTL), "-n", ON, "get", "rolebindings", "-o", "json"], env=kubectl_env(cluster),
                                     capture_output=True, text=True, timeout=60, check=True).stdout)["items"]
