"""manifests/, the Dockerfile and the dashboard, checked without a cluster: every file parses,
every object validates against the Kubernetes schemas of kubernetes-validate (strict, i.e. no
unknown fields), and the pieces agree with each other and with the code (ports, flags, metric
names, RBAC). The apiserver's own checks are in tests/e2e/test_manifests_e2e.py."""

from __future__ import annotations

import ast
import configparser
import functools
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from raybridge.bridge import NEVER_NAMESPACES

from .crd_schema import problems
from .kustomize import files, render

ROOT = Path(__file__).resolve().parents[1]
M = ROOT / "manifests"
KUSTOMIZATIONS = ["", "k8s-1.20", "second-scheduler", "k8s-1.20/second-scheduler", "monitoring", "ray"]
# Not in any kustomization on purpose: kube-scheduler's own config (the control plane reads it)
# and the examples ML engineers copy (docs/admin-guide.md, docs/ml-guide.md).
STANDALONE = {"scheduler", "examples"}
OWN_KINDS = {"RayCluster", "ServiceMonitor", "KubeSchedulerConfiguration"}  # not in Kubernetes' schemas


def all_yaml() -> list[Path]:
    return sorted(p for p in M.rglob("*.yaml"))


def objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rendered() -> dict[str, list[dict]]:
    return {k or ".": render(M / k) for k in KUSTOMIZATIONS}


def find(objs, kind, name):
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def test_every_manifest_parses_and_names_its_kind():
    paths = all_yaml()
    assert len(paths) >= 20
    for path in paths:
        docs = objects(path)
        assert docs, path
        if path.name == "kustomization.yaml":
            continue
        for doc in docs:
            assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), f"{path}: {doc!r:.80}"
            if doc["kind"] != "KubeSchedulerConfiguration":
                assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"


def test_every_file_is_applied_by_a_kustomization_or_standalone():
    used = {p.resolve() for k in KUSTOMIZATIONS for p in files(M / k)}
    for path in all_yaml() + sorted(M.rglob("*.json")):
        top = path.relative_to(M).parts[0]
        if top in STANDALONE:
            continue
        assert path.resolve() in used, f"{path.relative_to(ROOT)} is in no kustomization"


def test_the_120_overlay_differs_only_in_the_pdb_version():
    main, old = render(M), render(M / "k8s-1.20")
    strip = [{**o, "apiVersion": "policy/*"} if o["kind"] == "PodDisruptionBudget" else o for o in main]
    assert strip == [{**o, "apiVersion": "policy/*"} if o["kind"] == "PodDisruptionBudget" else o for o in old]
    assert {o["apiVersion"] for o in main if o["kind"] == "PodDisruptionBudget"} == {"policy/v1"}
    assert {o["apiVersion"] for o in old if o["kind"] == "PodDisruptionBudget"} == {"policy/v1beta1"}


def _validate_versions():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extras")
    versions = sorted({v for v in kv.utils.all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    return kv, [versions[0], versions[-1]]


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_objects_validate_strictly_against_kubernetes_schemas(which):
    """Kubernetes 1.21+ manifests against the oldest (1.25) and newest schemas bundled with
    kubernetes-validate: strict, so a misspelt field fails. The 1.20 overlay's policy/v1beta1 PDB is
    not in these schemas; the real 1.20.2 apiserver checks it (e2e)."""
    kv, versions = _validate_versions()
    version = versions[0] if which == "oldest" else versions[-1]
    checked = 0
    for path in [M, M / "second-scheduler", M / "monitoring", M / "ray"]:
        for obj in render(path):
            if obj["kind"] in OWN_KINDS:
                continue
            kv.validate(obj, version, strict=True)
            checked += 1
    for path in sorted((M / "examples").glob("*.yaml")):
        for obj in objects(path):
            kv.validate(obj, version, strict=True)
            checked += 1
    ray = find(render(M / "ray"), "RayCluster", "tessera-ray")["spec"]
    templates = [ray["headGroupSpec"]["template"]] + [g["template"] for g in ray["workerGroupSpecs"]]
    for t in templates:  # a RayCluster's pod templates are core PodTemplateSpecs
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": t}, version, strict=True)
        checked += 1
    assert checked >= 25


def test_strict_validation_catches_a_misspelt_field():
    kv, versions = _validate_versions()
    dep = json.loads(json.dumps(find(render(M), "Deployment", "tessera-extender")))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, versions[-1], strict=True)


def _crd(name):
    return yaml.safe_load((ROOT / "tests/crds" / f"{name}.yaml").read_text())


def test_custom_resources_match_their_crd_schemas():
    """RayCluster and ServiceMonitor against tests/crds (types, enums, required fields, and no
    field the apiserver would prune); their pod templates are checked as PodTemplates above and
    by the apiserver in the e2e tests."""
    crs = [o for k in ("monitoring", "ray") for o in render(M / k) if o["kind"] in ("RayCluster", "ServiceMonitor")]
    assert sorted(o["kind"] for o in crs) == ["RayCluster", "ServiceMonitor", "ServiceMonitor", "ServiceMonitor"]
    for o in crs:
        crd = _crd("raycluster" if o["kind"] == "RayCluster" else "servicemonitor")
        assert problems(o, crd) == [], o["metadata"]["name"]


def test_the_crd_check_catches_misspelt_and_mistyped_fields():
    rc = json.loads(json.dumps(find(render(M / "ray"), "RayCluster", "tessera-ray")))
    crd = _crd("raycluster")
    rc["spec"]["workerGroupSpecs"][0]["maxReplica"] = 50
    rc["spec"]["autoscalerOptions"]["upscalingMode"] = "Fast"
    rc["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 4
    found = " ".join(problems(rc, crd))
    assert "maxReplica: not in the schema" in found and "'Fast' is not one of" in found and "4 is not of type 'string'" in found


# -- the pieces agree ---------------------------------------------------------------------------


def test_scheduler_configs_reach_the_extender_service_over_mutual_tls():
    svc = find(render(M), "Service", "tessera-extender")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"  # no NodePort for the verbs unless an admin adds one
    assert not any("nodePort" in p for p in svc["spec"]["ports"])
    dep = find(render(M), "Deployment", "tessera-extender")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    prefix = args[args.index("--prefix") + 1]
    container_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args[args.index("--listen") + 1] == f"0.0.0.0:{container_ports['https']}" and ports["https"]["targetPort"] == "https"
    assert args[args.index("--admin-listen") + 1] == f"0.0.0.0:{container_ports['admin']}"
    assert args[args.index("--probe-listen") + 1] == f"0.0.0.0:{container_ports['probes']}"
    url = f"https://tessera-extender.tessera-system.svc:{ports['https']['port']}{prefix}"
    for path in sorted((M / "scheduler").glob("kube-scheduler-config.*.yaml")):
        cfg = objects(path)[0]
        for ext in cfg["extenders"]:
            assert ext["urlPrefix"] == url, path
            assert ext["enableHTTPS"] is True, path
            tls = ext["tlsConfig"]
            assert {k: Path(v).name for k, v in tls.items()} == {
                "certFile": "scheduler.crt", "keyFile": "scheduler.key", "caFile": "ca.crt"}, path


def test_the_extender_requires_client_certificates_from_its_secret():
    from extender.certs import service_names

    dep = find(render(M), "Deployment", "tessera-extender")
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = c["args"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    tls_dir = mounts["tls"]
    assert volumes["tls"]["secret"]["secretName"] == "tessera-extender-tls"
    assert volumes["tls"]["secret"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == 10001
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"), ("--client-ca", "ca.crt")):
        assert args[args.index(flag) + 1] == f"{tls_dir}/{key}"
    assert "--insecure-listen" not in args and "--inspect-from-anywhere" not in args
    svc = find(render(M), "Service", "tessera-extender")
    ns = svc["metadata"]["namespace"]
    assert f"{svc['metadata']['name']}.{ns}.svc" in service_names(namespace=ns)  # what `tessera certs` signs


def test_extender_deployment_runs_the_agreed_command():
    dep = find(render(M), "Deployment", "tessera-extender")
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert c["image"] == "ghcr.io/tessera-sched/tessera:0.1.0"
    joined = " ".join(c["args"])
    assert joined.startswith("serve ")
    assert "--leader-elect --lease-name tessera-extender --lease-namespace $(POD_NAMESPACE)" in joined
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    assert env["POD_IP"] == "status.podIP"  # the hint written on the Lease (--advertise-url default)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the probe listener: not the verbs' port, nor the admin port, whose connections any pod could hold (issue 35)
    assert c["readinessProbe"]["httpGet"]["port"] == "probes" == c["livenessProbe"]["httpGet"]["port"]
    assert spec["serviceAccountName"] == "tessera-extender"
    pdb = find(render(M), "PodDisruptionBudget", "tessera-extender")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


CONTROL_PLANE_LABELS = {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}


@pytest.mark.parametrize("entry", ["", "k8s-1.20"])
def test_the_control_plane_extender_runs_only_on_control_plane_nodes(entry):
    """Its token patches every Node, deletes pods, binds and reads the assignment key: a GPU worker that runs
    tenants' code must never hold it. Required (not preferred) node affinity, one ORed term per label kubeadm has
    put on control-plane nodes (master before, control-plane after), each term that label alone; and the taints
    of those nodes tolerated, so it can run there at all."""
    spec = find(render(M / entry), "Deployment", "tessera-extender")["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec  # a nodeSelector would AND with the terms and pin one label
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert sorted(terms, key=json.dumps) == sorted(
        ({"matchExpressions": [{"key": k, "operator": "Exists"}]} for k in CONTROL_PLANE_LABELS), key=json.dumps)
    tolerated = {t["key"] for t in spec["tolerations"] if t.get("operator") == "Exists" and t.get("effect") == "NoSchedule"}
    assert tolerated == CONTROL_PLANE_LABELS


def test_agent_and_bridge_run_the_agreed_commands():
    objs = render(M)
    agent = find(objs, "DaemonSet", "tessera-agent")["spec"]["template"]["spec"]
    c = agent["containers"][0]
    assert c["args"][0] == "agent" and "--metrics-listen" in c["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {})), "the agent must see every GPU, not one"
    bridge = find(objs, "Deployment", "tessera-bridge")["spec"]["template"]["spec"]["containers"][0]
    # the bridge talks to Kubernetes only: the image without ray and torch (test_the_bridge_imports_without_ray_or_torch)
    assert bridge["args"][0] == "bridge" and bridge["image"] == "ghcr.io/tessera-sched/tessera:0.1.0"


@pytest.mark.parametrize("entry, count", [("", 4), ("k8s-1.20", 4), ("second-scheduler", 5), ("k8s-1.20/second-scheduler", 5)])
def test_every_pod_runs_non_root_read_only_with_its_own_service_account(entry, count):
    """Each workload under a ServiceAccount of its own name: in second-scheduler mode kube-scheduler (tessera-scheduler)
    and the extender (tessera-extender) too, never one account for both (issue 35)."""
    objs = render(M / entry)
    sas = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    workloads = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(workloads) == count
    for w in workloads:
        spec = w["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] in sas and spec["serviceAccountName"] == w["metadata"]["name"]
        if w["metadata"]["name"] == "tessera-device-plugin":  # root, for the kubelet's root-owned socket directory
            assert spec["securityContext"]["runAsUser"] == 0 and not spec.get("hostPID") and not spec.get("hostNetwork")
        else:
            assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "memory" in c["resources"]["limits"] and c["resources"]["requests"]


# -- RBAC: each ServiceAccount's rules are exactly the API calls its code makes ----------------------

# Where each ServiceAccount's code starts; the scan follows imports inside the repo from there.
# extender/cli/__init__.py is the dispatcher of every command and is not followed into (each command's body
# is its own entry). Namespaced resources only ever used in Tessera's own namespace are granted by
# a Role there, never cluster-wide.
COMPONENTS = {"tessera-extender": "extender/serve.py", "tessera-agent": "gpu_sharing/cli.py",
              "tessera-bridge": "raybridge/cli.py", "tessera-device-plugin": "gpu_sharing/deviceplugin/cli.py"}
DISPATCHER = ROOT / "extender/cli/__init__.py"
OWN_NAMESPACE_ONLY = {"secrets", "leases"}
HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def _module_file(name: str) -> Path | None:
    path = ROOT / Path(*name.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _component_files(entry: str) -> set[Path]:
    todo, seen = [ROOT / entry], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        package = ".".join(f.relative_to(ROOT).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = _module_file(name)
                if target is not None and target != DISPATCHER:
                    todo.append(target)
    return seen


@functools.cache
def _api_classes() -> tuple[type, ...]:
    """Every API class of the kubernetes client (CoreV1Api, CustomObjectsApi, ...), not only those the code uses now."""
    from kubernetes import client

    found = [getattr(client, n) for n in dir(client) if n.endswith("Api") and n != "ApiClient"]  # getattr: loaded lazily
    assert len(found) > 50 and client.CustomObjectsApi in found
    return tuple(found)


@functools.cache
def _client_classes(name: str) -> list[type]:
    """The API classes that have a method of this name (create_namespaced_event: CoreV1Api and EventsV1Api)."""
    return [c for c in _api_classes() if hasattr(c, f"_{name}_serialize")]


def _rule(method: str, path: str, watched: bool) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of one request, as the apiserver authorises it."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:2] == ["namespaces", "{namespace}"]:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    assert "{" not in group + resource, f"{method} {path}: the group or resource is a parameter, no rule can be read"
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if watched else ("get" if named else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = HTTP_VERBS[method]
    return group, resource, verb


def _api_call(cls, name: str, watched: bool) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of one kubernetes-client method, from the request it builds."""
    import inspect

    src = inspect.getsource(getattr(cls, f"_{name}_serialize"))
    path = re.search(r"resource_path='([^']+)'", src).group(1)
    method = re.search(r"method='([A-Z]+)'", src).group(1)
    return _rule(method, path, watched)


API_HOLDERS = {"api", "core", "policy_api"}  # the repo's names for a kubernetes-client API object (self.api, core, self.core)


def _receiver(node) -> str:
    value = node.value
    return value.attr if isinstance(value, ast.Attribute) else value.id if isinstance(value, ast.Name) else ""


def _repo_defs(files: set[Path]) -> set[str]:
    return {n.name for f in files for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)}


def _watches(call: ast.Call) -> bool:
    """A hand-built request is a watch when its `query_params` list literal holds a `("watch", ...)` pair."""
    params = next((k.value for k in call.keywords if k.arg == "query_params"), None)
    return isinstance(params, ast.List | ast.Tuple) and any(
        isinstance(p, ast.Tuple) and p.elts and isinstance(p.elts[0], ast.Constant) and p.elts[0].value == "watch"
        for p in params.elts)


def _raw_requests(f: Path, tree: ast.AST) -> list[tuple[str, str, bool]]:
    """(method, path, watched) of each request built by hand (`api_client.param_serialize("GET", "/apis/...", ...)`,
    sent by `call_api`). Each must spell method and path as literals, and no `call_api` may send a request built
    otherwise; a watch says so with a literal `("watch", ...)` among its query parameters."""
    built, sent = [], 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "rest_client":
            raise AssertionError(f"{f.name}:{node.lineno}: a request below call_api: the RBAC scan cannot read it")
        if isinstance(node, ast.Attribute) and node.attr == "call_api":
            sent += 1
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param_serialize":
            method, path = (node.args + [None, None])[:2]
            assert all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in (method, path)), \
                f"{f.name}:{node.lineno}: param_serialize with a method or path that is not a literal"
            built.append((method.value, path.value, _watches(node)))
    assert sent <= len(built), f"{f.name}: call_api sends {sent} requests, {len(built)} built where the scan reads them"
    return built


@functools.cache
def code_api_calls(entry: str) -> frozenset[tuple[str, str, str]]:
    """Every Kubernetes API call the component's code can make: kubernetes-client methods (of any API class) named in
    it on an API object (called, or passed on as functions), `watch` on each list method of a file that streams a
    Watch, and requests built by hand for `call_api`. A client method's name on any other receiver must be one of the
    repo's own functions (Extender.delete_node), else the scan would miss a call: it fails. A name several API classes
    share (create_namespaced_event) is read as the class the component (or the dispatcher) names; if that leaves two
    rules, it fails."""
    files = _component_files(entry)
    ours = _repo_defs(files)
    texts = [f.read_text() for f in files | set(DISPATCHER.parent.glob("*.py"))]  # a command may build its API objects
    named = {c.__name__ for c in _api_classes() if any(re.search(rf"\b{c.__name__}\b", t) for t in texts)}
    for f in files:
        assert not re.search(r"kubernetes\.dynamic|DynamicClient", f.read_text()), f"{f.name}: the RBAC scan cannot read it"
    calls = set()
    for f in files:
        tree = ast.parse(f.read_text())
        streams = any(isinstance(node, ast.Attribute) and node.attr == "stream" for node in ast.walk(tree))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and (classes := _client_classes(node.attr))):
                continue
            if _receiver(node) not in API_HOLDERS:
                assert node.attr in ours, f"{f.name}:{node.lineno}: {node.attr} on {_receiver(node)!r}: name it api or core"
                continue
            classes = [c for c in classes if c.__name__ in named] or classes
            for watched in (False, True) if streams and node.attr.startswith("list_") else (False,):
                rules = {_api_call(c, node.attr, watched) for c in classes}
                assert len(rules) == 1, f"{f.name}:{node.lineno}: {node.attr} is {sorted(rules)}, depending on its class"
                calls |= rules
        calls |= {_rule(method, path, watched) for method, path, watched in _raw_requests(f, tree)}
    return frozenset(calls)  # cached: shared by every caller


# Roles Kubernetes brings, bound by name and never rendered here: (kind, name) -> where the binding may sit.
BUILT_IN_ROLES = {("ClusterRole", "system:kube-scheduler"): "cluster", ("ClusterRole", "system:volume-scheduler"): "cluster",
                  ("Role", "extension-apiserver-authentication-reader"): "kube-system"}


def _bindings(objs, sa: str):
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": "tessera-system"}
    for b in (o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if subject in b["subjects"]:
            yield b, "cluster" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]


def built_in_roles(objs, sa: str) -> set[tuple[str, str, str]]:
    """(kind, name, where) of each role Kubernetes brings that is bound to one ServiceAccount."""
    return {(b["roleRef"]["kind"], b["roleRef"]["name"], where) for b, where in _bindings(objs, sa)
            if (b["roleRef"]["kind"], b["roleRef"]["name"]) in BUILT_IN_ROLES}


def granted(objs, sa: str) -> dict[tuple[str, str, str], set[tuple[str, frozenset | None]]]:
    """(apiGroup, resource, verb) -> {(where, resourceNames)}, for one ServiceAccount, from the roles shipped here:
    where is 'cluster' or the namespace of the Role, resourceNames None when the rule names no object."""
    out: dict[tuple[str, str, str], set[tuple[str, frozenset | None]]] = {}
    for b, where in _bindings(objs, sa):
        if (b["roleRef"]["kind"], b["roleRef"]["name"]) in BUILT_IN_ROLES:
            continue
        role = find(objs, b["roleRef"]["kind"], b["roleRef"]["name"])
        for rule in role["rules"]:
            names = frozenset(rule["resourceNames"]) if "resourceNames" in rule else None
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        out.setdefault((g, r, v), set()).add((where, names))
    return out


def test_the_api_call_scan_reads_requests_as_the_apiserver_authorises_them():
    from kubernetes import client

    assert _api_call(client.CoreV1Api, "create_namespaced_binding", False) == ("", "bindings", "create")
    assert _api_call(client.CoreV1Api, "patch_node_status", False) == ("", "nodes/status", "patch")
    assert _api_call(client.CoreV1Api, "list_pod_for_all_namespaces", True) == ("", "pods", "watch")
    assert _api_call(client.CoreV1Api, "read_namespaced_secret", False) == ("", "secrets", "get")
    assert _api_call(client.CoordinationV1Api, "replace_namespaced_lease", False) == ("coordination.k8s.io", "leases", "update")
    assert ROOT / "extender/kube/node_writer.py" in _component_files(COMPONENTS["tessera-extender"])  # it writes the Nodes
    raw = ast.parse('c.param_serialize("GET", "/apis/g.io/v1/things", query_params=[("watch", "true"), ("x", y)])\n'
                    'c.param_serialize("GET", "/apis/g.io/v1/namespaces/{namespace}/things/{name}", query_params=[("limit", 1)])')
    assert [_rule(*r) for r in _raw_requests(Path("x.py"), raw)] == [("g.io", "things", "watch"), ("g.io", "things", "get")]
    assert ROOT / "raybridge/kube.py" in _component_files(COMPONENTS["tessera-bridge"])


# Second-scheduler mode: the pod's kube-scheduler needs, besides the built-in roles (whose Lease rule names only
# `kube-scheduler`), its own Lease in Tessera's namespace; what it gets beyond that is the built-in roles'.
KUBE_SCHEDULER_CALLS = frozenset({("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")})
KUBE_SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:"
INSTALLS = ["", "k8s-1.20", "second-scheduler", "k8s-1.20/second-scheduler"]
# Every ServiceAccount of every install entry point: each is held to exactly the calls of the code that runs as it.
ACCOUNTS = [(entry, o["metadata"]["name"]) for entry in INSTALLS for o in render(M / entry) if o["kind"] == "ServiceAccount"]
COMMANDS = {"serve": "extender/serve.py", "agent": "gpu_sharing/cli.py", "bridge": "raybridge/cli.py",
            "device-plugin": "gpu_sharing/deviceplugin/cli.py"}
NAMEABLE = {"get", "update", "patch", "delete"}  # verbs RBAC can limit to named objects (create and list it cannot)
# Rights an account holds only in the namespaces an admin enabled, granted by a RoleBinding there (never by a
# ClusterRoleBinding, never in NEVER_NAMESPACES), and the file whose RoleBindings enable the example's namespace.
PER_NAMESPACE = {"tessera-bridge": ({("", "pods", "create"), ("", "pods", "delete")}, M / "examples/ray-training-job.yaml")}
POD_WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}


def enabling_bindings(sa: str) -> list[dict]:
    """The RoleBindings that enable a namespace for `sa` (PER_NAMESPACE): the example's, as an admin makes them."""
    if sa not in PER_NAMESPACE:
        return []
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": "tessera-system"}
    found = [o for o in objects(PER_NAMESPACE[sa][1]) if o["kind"] == "RoleBinding" and subject in o["subjects"]]
    assert found, f"{PER_NAMESPACE[sa][1].name} enables no namespace for {sa}"
    return found


def container_calls(c: dict) -> frozenset[tuple[str, str, str]]:
    """The API calls one shipped container's code makes: its `tessera` command's component, or upstream
    kube-scheduler's own Lease (the rest of its calls are the built-in roles'). A container running anything else
    fails: no test would read its calls."""
    if c["image"].startswith(KUBE_SCHEDULER_IMAGE):
        return KUBE_SCHEDULER_CALLS
    command = (c.get("args") or [""])[0]
    assert command in COMMANDS, f"container {c['name']} runs {command!r}: no test reads its API calls"
    return code_api_calls(COMMANDS[command])


def account_calls(objs, sa: str) -> set[tuple[str, str, str]] | None:
    """Every call the containers (all of them, in every pod) running as `sa` make; None when none runs as it."""
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
    mine = [c for p in pods if p.get("serviceAccountName", "default") == sa for c in p["containers"]]
    return set().union(*(container_calls(c) for c in mine)) if mine else None


def scheduler_config(objs, spec: dict, c: dict) -> dict:
    """The KubeSchedulerConfiguration a shipped kube-scheduler container runs: its --config file, read from the
    ConfigMap mounted at that file's directory."""
    path = Path(next(a.split("=", 1)[1] for a in c["command"] if a.startswith("--config=")))
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    cm = find(objs, "ConfigMap", volumes[mounts[str(path.parent)]]["configMap"]["name"])
    return yaml.safe_load(cm["data"][path.name])


def named_objects(objs, sa: str) -> dict[str, frozenset]:
    """resource -> the objects of it (Secrets, Leases) the account's code is configured to use by name: `tessera
    serve`'s flags, or the leaderElection of the configuration kube-scheduler runs."""
    from extender.cli import build_parser

    names: dict[str, set] = {}
    for spec in (o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "DaemonSet")):
        for c in (c for c in spec["containers"] if spec["serviceAccountName"] == sa):
            if c["image"].startswith(KUBE_SCHEDULER_IMAGE):
                names.setdefault("leases", set()).add(scheduler_config(objs, spec, c)["leaderElection"]["resourceName"])
            elif c.get("args", [""])[0] == "serve":
                args = build_parser().parse_args([a.replace("$(POD_NAMESPACE)", "tessera-system") for a in c["args"]])
                names.setdefault("secrets", set()).add(args.assignment_key_secret)
                names.setdefault("leases", set()).add(args.lease_name or "tessera-extender")
    return {r: frozenset(n) for r, n in names.items()}


@pytest.mark.parametrize("entry,sa", ACCOUNTS)
def test_rbac_grants_each_service_account_exactly_the_calls_its_code_makes(entry, sa):
    """Exactly: a right the code never uses fails, a call no rule allows fails; the code is every container's that
    runs as the account. Secrets and Leases only in Tessera's namespace, and read
    or written only by the name the workload is configured with (resourceNames); no other rule names objects, since
    the code must reach any Node or pod. PER_NAMESPACE rights are granted by the RoleBindings that enable a namespace
    (the example's), never cluster-wide: the install alone grants none of them."""
    objs = render(M / entry)
    calls = account_calls(objs, sa)
    # an account that exists in an install is one a container runs as: no rights held with no code to judge them by
    # (second-scheduler mode once made tessera-extender from the shared base, bound, and ran nothing as it)
    assert calls is not None, f"{entry or '.'}: no container runs as {sa}, yet the install makes it"
    per_namespace = PER_NAMESPACE.get(sa, (set(), None))[0]
    assert not per_namespace & set(granted(objs, sa)), f"{sa}: the install itself grants {per_namespace & set(granted(objs, sa))}"
    objs = objs + enabling_bindings(sa)
    rights = granted(objs, sa)
    calls |= {c for c in per_namespace if c in rights}  # the bridge writes pods only where a namespace is enabled
    missing_rights = sorted(calls - set(rights))
    extra_rights = sorted(set(rights) - calls)
    assert not missing_rights, f"{sa}'s code makes these calls, its RBAC does not allow them: {missing_rights}"
    assert not extra_rights, f"{sa}'s RBAC allows calls its code never makes: {extra_rights}"
    names = named_objects(objs, sa)
    for (g, r, v), grants in rights.items():
        where = {w for w, _ in grants}
        if r.split("/")[0] in OWN_NAMESPACE_ONLY:
            assert where == {"tessera-system"}, f"{sa}: {r} {v} must be granted in tessera-system only, not {where}"
        if (g, r, v) in per_namespace:
            assert "cluster" not in where and not where & NEVER_NAMESPACES, f"{sa}: {r} {v} granted in {where}"
        want = names[r] if r in OWN_NAMESPACE_ONLY and v in NAMEABLE else None
        assert {n for _, n in grants} == {want}, f"{sa}: {r} {v} names {[n for _, n in grants]}, not {want}"
    expected_built_in = ({(k, n, w) for (k, n), w in BUILT_IN_ROLES.items()} if sa == "tessera-scheduler" else set())
    assert built_in_roles(objs, sa) == expected_built_in, f"{sa}: roles Kubernetes brings"


# The rules `tessera serve` runs under (manifests/base/extender/rbac.yaml): the extender's ClusterRole and the Role that
# reads the assignment key.
TESSERA_ROLES = {("ClusterRole", "tessera-extender"), ("Role", "tessera-extender-assignment-key")}


@pytest.mark.parametrize("entry", INSTALLS)
def test_no_container_holds_both_kube_schedulers_roles_and_tesseras_rights(entry):
    """Issue 35: the second scheduler's pod ran upstream kube-scheduler and `tessera serve` under one token, so
    kube-scheduler held node patch, pods delete and the assignment key, and Tessera pv/pvc update and pods/status. Now
    no pod runs both, and no container's account is bound both to a role Kubernetes brings for schedulers and to
    Tessera's rules: in second-scheduler mode kube-scheduler runs as tessera-scheduler (built-in roles only) and
    `tessera serve` as tessera-extender (Tessera's only), each in a Deployment of its own."""
    objs = render(M / entry)
    holders = {"kube-scheduler": set(), "tessera": set()}
    for w in (o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")):
        spec = w["spec"]["template"]["spec"]
        sa = spec["serviceAccountName"]
        roles = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b, _ in _bindings(objs, sa)}
        kube, ours = roles & set(BUILT_IN_ROLES), roles & TESSERA_ROLES
        runs = {"kube-scheduler" if c["image"].startswith(KUBE_SCHEDULER_IMAGE) else (c.get("args") or [""])[0]
                for c in spec["containers"]}
        assert not ({"kube-scheduler", "serve"} <= runs), f"{w['metadata']['name']} runs kube-scheduler and tessera serve"
        names = [c["name"] for c in spec["containers"]]
        assert not (kube and ours), f"{entry or '.'}: {names} run as {sa}, which holds {sorted(kube)} and {sorted(ours)}"
        if kube:
            holders["kube-scheduler"].add(sa)
            assert not any(r == "secrets" for _, r, _ in granted(objs, sa)), f"{sa} reads a Secret"
        if ours:
            holders["tessera"].add(sa)
    assert holders["tessera"] == {"tessera-extender"}
    assert holders["kube-scheduler"] == ({"tessera-scheduler"} if "second-scheduler" in entry else set())


def test_every_account_and_container_the_manifests_ship_is_held_to_its_code():
    """Every ServiceAccount a binding names or a workload runs as, in every entry point and example, is one the tests
    hold to its code's calls (ACCOUNTS above, the Ray job's account below), and every container's code is read."""
    checked = {sa for _, sa in ACCOUNTS}
    for entry in KUSTOMIZATIONS:
        objs = render(M / entry)
        if entry in INSTALLS:  # a binding names only an account of the same install: none left to one nothing runs as
            own = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
            named = {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]}
            assert named <= own, f"{entry or '.'}: bindings name {sorted(named - own)}, which this install does not make"
        for w in (o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")):
            spec = w["spec"]["template"]["spec"]
            assert spec["serviceAccountName"] in checked, f"{entry}: {w['metadata']['name']}"
            for c in spec["containers"] + spec.get("initContainers", []):
                container_calls(c)  # fails for a container whose code no test reads
        subjects = {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]}
        assert subjects <= checked, f"{entry}: {subjects - checked}"
    for path in sorted((M / "examples").glob("*.yaml")):
        bindings = [o for o in objects(path) if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        assert not bindings or path.name == "ray-training-job.yaml", path.name  # the one example with rights
        for b in bindings:
            assert [s["name"] for s in b["subjects"]] in (["resnet-demo"], ["tessera-bridge"]), (path.name, b["subjects"])


def test_no_cluster_role_binding_gives_the_bridge_pod_writes():
    """Issue 35: a pod in kube-system may name any of its ServiceAccounts, so pods create there made a compromised
    bridge cluster-admin. In no entry point or example does a ClusterRoleBinding give the bridge a pod write; its pod
    writes come only from RoleBindings of tessera-bridge-jobs, never in a namespace the bridge refuses in code; the
    words it says when refused and the admin guide name the shipped ClusterRole and ServiceAccount."""
    from raybridge.bridge import ENABLE_HINT

    everything = [o for k in KUSTOMIZATIONS for o in render(M / k)]
    everything += [o for p in sorted((M / "examples").glob("*.yaml")) for o in objects(p)]
    roles = {(o["kind"], o["metadata"]["name"]): o for o in everything if o["kind"] in ("ClusterRole", "Role")}
    subject = {"kind": "ServiceAccount", "name": "tessera-bridge", "namespace": "tessera-system"}
    bound = [b for b in everything if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in b["subjects"]]
    assert {b["kind"] for b in bound} == {"ClusterRoleBinding", "RoleBinding"}
    for b in bound:
        rules = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]["rules"]
        writes = {v for r in rules if "pods" in r["resources"] or "*" in r["resources"] for v in r["verbs"]} & POD_WRITES
        if b["kind"] == "ClusterRoleBinding":
            assert not writes, f"ClusterRoleBinding {b['metadata']['name']} gives the bridge pods {sorted(writes)}"
        else:
            assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-bridge-jobs"}
            assert b["metadata"]["namespace"] not in NEVER_NAMESPACES | {"tessera-system"}, b["metadata"]["namespace"]
    jobs = roles[("ClusterRole", "tessera-bridge-jobs")]["rules"]
    assert jobs == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}]
    assert "kube-system" in NEVER_NAMESPACES
    hint = ENABLE_HINT.format(ns="NS")
    assert "--clusterrole=tessera-bridge-jobs --serviceaccount=tessera-system:tessera-bridge" in hint
    guide = (ROOT / "docs/admin-guide.md").read_text().replace("\\\n", "")
    assert re.search(r"create rolebinding tessera-bridge-jobs\s+--clusterrole=tessera-bridge-jobs\s+"
                     r"--serviceaccount=tessera-system:tessera-bridge", guide)


def test_rbac_is_least_privilege_per_component():
    objs = render(M)
    key_role = "tessera-extender-assignment-key"
    for o in objs:
        for rule in o.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], o["metadata"]["name"]
            assert "secrets" not in rule["resources"] or o["metadata"]["name"] == key_role, o["metadata"]["name"]
    key = find(objs, "Role", key_role)  # the one Secret: get by name; the install creates it (issue 35), never the extender
    assert key["metadata"]["namespace"] == "tessera-system" and key["kind"] == "Role"
    assert key["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tessera-assignment-key"],
                             "verbs": ["get"]}]
    ext = granted(objs, "tessera-extender")
    assert ("", "pods", "patch") not in ext, "bind writes annotations through the Binding; the extender never patches pods"
    assert {v for (g, r, v) in ext if r.startswith("nodes")} == {"get", "list", "watch", "patch"}
    # the agent: no right at all, and no token to use one with
    assert granted(objs, "tessera-agent") == {}
    sa = find(objs, "ServiceAccount", "tessera-agent")
    ds = find(objs, "DaemonSet", "tessera-agent")["spec"]["template"]["spec"]
    assert sa.get("automountServiceAccountToken") is False and ds.get("automountServiceAccountToken") is False
    # the bridge: read pods and write Events everywhere; create replacements and delete its own (the code checks
    # UIDs) only in namespaces enabled for Ray jobs (the example job's own, resnet-demo); never patch a pod (each job
    # writes its own progress), never anything but pods and events
    assert granted(objs, "tessera-bridge") == {
        ("", "pods", "list"): {("cluster", None)}, ("", "pods", "watch"): {("cluster", None)},
        ("", "events", "create"): {("cluster", None)}}
    assert granted(objs + enabling_bindings("tessera-bridge"), "tessera-bridge") == granted(objs, "tessera-bridge") | {
        ("", "pods", v): {("resnet-demo", None)} for v in ("create", "delete")}
    lease = find(objs, "Role", "tessera-extender-leader-election")
    assert lease["metadata"]["namespace"] == "tessera-system"
    leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    assert lease["rules"] == [{**leases, "resourceNames": ["tessera-extender"], "verbs": ["get", "update"]},
                              {**leases, "verbs": ["create"]}]
    for binding in (o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        sa_name = binding["roleRef"]["name"].removesuffix("-leader-election").removesuffix("-assignment-key")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name, "namespace": "tessera-system"}]


def test_a_ray_jobs_service_account_holds_exactly_what_its_runner_calls_in_its_own_namespace():
    """The job side (raybridge/job.py, in the job's driver pod) writes only its own pods; its Role
    in the example is exactly its code's calls, namespaced, and nothing else of the job has rights.
    RBAC cannot narrow `pods: patch` to the job's own pods, so the job has a namespace of its own (issue 35): every
    object of the example lives in one namespace named for the job, its one gang is the only one there, and the
    steps before applying (namespace, Secret, the admin's RoleBinding) name that namespace, in the file and the guides."""
    path = M / "examples/ray-training-job.yaml"
    objs = objects(path)
    role = find(objs, "Role", "resnet-demo")
    ns = role["metadata"]["namespace"]
    assert ns == "resnet-demo" and {o["metadata"]["namespace"] for o in objs} == {ns}, "one namespace, named for the job"
    text = path.read_text()
    for step in (f"kubectl create namespace {ns}\n", f"kubectl -n {ns} create secret generic resnet-demo-ray",
                 f"kubectl -n {ns} create rolebinding tessera-bridge-jobs"):
        assert step in text, step
    assert "team-a" not in text
    for guide in ("docs/ml-guide.md", "docs/raybridge.md"):
        assert f"kubectl -n {ns} create secret generic resnet-demo-ray" in (ROOT / guide).read_text(), guide
    rights = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert rights == code_api_calls("raybridge/job.py") == {("", "pods", "list"), ("", "pods", "patch")}
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    binding = find(objs, "RoleBinding", "resnet-demo")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "resnet-demo", "namespace": ns}]
    # the job's namespace enabled for Ray jobs: the bridge's pod writes here, by the shipped ClusterRole
    enabled = find(objs, "RoleBinding", "tessera-bridge-jobs")
    assert enabled["metadata"]["namespace"] == ns and enabled["roleRef"]["name"] == "tessera-bridge-jobs"
    assert enabled["subjects"] == [{"kind": "ServiceAccount", "name": "tessera-bridge", "namespace": "tessera-system"}]
    assert len([o for o in objs if o["kind"] == "RoleBinding"]) == 2
    pods = [o for o in objs if o["kind"] == "Pod"]
    members = [p for p in pods if p["metadata"].get("annotations", {}).get("tessera.dev/runtime") == "ray"]
    assert len(members) == 3 and all(p["spec"]["automountServiceAccountToken"] is False for p in members)
    assert {p["metadata"]["annotations"]["tessera.dev/gang-name"] for p in members} == {ns}, "the namespace's one job"
    head = find(objs, "Service", "resnet-demo-head")
    for p in members:  # the job's head, in the job's namespace
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert env["TESSERA_RAY_HEAD"] == f"{head['metadata']['name']}.{ns}.svc:6379"
    for p in pods:  # every pod of the job: its own Ray token, from its Secret, never an open cluster
        env = {e["name"]: e for e in p["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "resnet-demo-ray"
        assert p["spec"]["serviceAccountName"] == "resnet-demo" and p["metadata"]["namespace"] == ns
    # only the job's own pods reach its ports; labelled scraper namespaces reach the driver's metrics port, no other
    (netpol,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    selector = netpol["spec"]["podSelector"]["matchLabels"]
    assert all(selector.items() <= p["metadata"]["labels"].items() for p in pods)
    assert netpol["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": selector}}]},
        {"from": [{"namespaceSelector": {"matchLabels": {"tessera.dev/metrics-scraper": "true"}}}],
         "ports": [{"port": 9600, "protocol": "TCP"}]}]
    (driver,) = [p for p in pods if "driver" in p["spec"]["containers"][0]["command"]]
    command = driver["spec"]["containers"][0]["command"]
    listen = command[command.index("--metrics-listen") + 1] if "--metrics-listen" in command else "0.0.0.0:9600"
    assert driver["spec"]["containers"][0]["ports"] == [{"name": "metrics", "containerPort": int(listen.rsplit(":", 1)[1])}]


def test_metrics_ports_agree_between_pods_services_and_servicemonitors():
    objs = render(M)
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    for w in (o for o in objs if o["kind"] in ("Deployment", "DaemonSet")):
        tmpl = w["spec"]["template"]
        ports = {p["containerPort"]: p["name"] for c in tmpl["spec"]["containers"] for p in c["ports"]}
        ann = tmpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) in ports
    for sm in render(M / "monitoring"):
        if sm["kind"] != "ServiceMonitor":
            continue
        svc = services[sm["metadata"]["name"]]
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against one object's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("entry", ["", "second-scheduler"])
def test_only_the_extender_and_labelled_scrapers_reach_the_agents_report(entry):
    """The agent's :9400/report names every pod's GPU memory on its node: in either install mode, a NetworkPolicy lets
    the pods that run `tessera serve` (which pull it) and namespaces labelled as scrapers reach it, on that port only,
    and no other workload of Tessera's (nor any pod of another namespace) matches."""
    objs = render(M / entry)
    agent = next(o for o in objs if o["kind"] == "DaemonSet")
    policies = [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == agent["metadata"]["namespace"]
                and selects(o["spec"]["podSelector"], agent["spec"]["template"]["metadata"]["labels"])]
    assert len(policies) == 1, "one policy selects the agent's pods"
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"] and len(spec["ingress"]) == 1
    rule = spec["ingress"][0]
    ports = {p["name"]: p["containerPort"] for c in agent["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert [ports[p["port"]] for p in rule["ports"]] == [9400]
    pod_peers = [peer["podSelector"] for peer in rule["from"] if set(peer) == {"podSelector"}]
    namespace_peers = [peer["namespaceSelector"] for peer in rule["from"] if set(peer) == {"namespaceSelector"}]
    assert len(pod_peers) + len(namespace_peers) == len(rule["from"])
    assert namespace_peers == [{"matchLabels": {"tessera.dev/metrics-scraper": "true"}}]
    for w in (o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")):
        serves = any(c.get("args", [""])[0] == "serve" for c in w["spec"]["template"]["spec"]["containers"])
        reaches = w["metadata"]["namespace"] == agent["metadata"]["namespace"] and any(
            selects(sel, w["spec"]["template"]["metadata"]["labels"]) for sel in pod_peers)
        assert reaches == serves, f"{w['kind']} {w['metadata']['name']}: runs serve {serves}, reaches the agent {reaches}"


def test_raycluster_is_the_seeds_shape_with_tesseras_annotations():
    rc = find(render(M / "ray"), "RayCluster", "tessera-ray")["spec"]
    head = rc["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert head["rayStartParams"]["num-gpus"] == "4" and int(head["rayStartParams"]["object-store-memory"]) > 0
    assert rc["enableInTreeAutoscaling"] is True
    (workers,) = rc["workerGroupSpecs"]
    assert (workers["minReplicas"], workers["maxReplicas"]) == (10, 50)
    assert int(workers["rayStartParams"]["object-store-memory"]) > 0
    ann = workers["template"]["metadata"]["annotations"]
    # a gang, not a Tessera Ray job: KubeRay runs these pods, so no runtime (filter would want an entrypoint)
    assert "tessera.dev/runtime" not in ann and int(ann["tessera.dev/gang-size"]) == workers["minReplicas"]
    # no dashboard, token auth on every Ray process, and only the cluster's own pods reach it
    assert head["rayStartParams"]["include-dashboard"] == "false" and "dashboard-host" not in head["rayStartParams"]
    for t in (head["template"], workers["template"]):
        env = {e["name"]: e for e in t["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
        assert 8265 not in [p["containerPort"] for p in t["spec"]["containers"][0].get("ports", [])]
    netpol = find(render(M / "ray"), "NetworkPolicy", "tessera-ray")["spec"]
    for t in (head["template"], workers["template"]):
        assert netpol["podSelector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
    assert netpol["ingress"] == [{"from": [{"podSelector": netpol["podSelector"]}]}]


def test_examples_read_as_intended_through_the_contract():
    """The examples parsed by the extender's own contract code, as it parses pods it schedules."""
    from extender.translate.objects import pod_gang, pod_request

    pod = objects(M / "examples/fractional-pod.yaml")[0]
    req = pod_request(pod)
    assert (req.gpu_count, req.gpu_milli) == (1, 250) and "NVIDIA-A100-SXM4-80GB" in req.gpu_models
    whole = pod_request(objects(M / "examples/whole-gpu-pod.yaml")[0])
    assert (whole.gpu_count, whole.gpu_milli) == (2, 1000)
    job = objects(M / "examples/gang-job.yaml")[0]["spec"]
    member = {"metadata": {"namespace": "team-a", "name": "m0", **job["template"]["metadata"]}, "spec": job["template"]["spec"]}
    gang = pod_gang(member)
    assert gang is not None and gang.size == job["parallelism"] == job["completions"] and gang.name == "team-a/ddp-gang"
    assert pod_request(member).gpu_count == 2


# -- the dashboard ------------------------------------------------------------------------------


def _extender_metric_names() -> set[str]:
    from extender.http.app import create_app
    from extender.service import Extender
    from testing.ports import both

    class NoBinder:
        def bind(self, *a, **k):
            raise AssertionError("not called")

    app = create_app(Extender(policy="tessera"), NoBinder(), prefix="/tessera")
    app.test_client().post("/tessera/filter", json={})  # so the verb histograms have a series
    text = both(app).test_client().get("/metrics").get_data(as_text=True)  # the admin port's /metrics
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}


def test_dashboard_panels_query_metrics_that_exist():
    dash = json.loads((M / "monitoring/grafana-dashboard.json").read_text())
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("fragmentation", "allocation by model", "latency", "pending", "recoveries"):
        assert topic in titles
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set(re.findall(r"\btessera_[a-z_]+\b", " ".join(exprs)))
    families = _extender_metric_names()  # as exposed: counters end in _total, histograms add _bucket
    agent = set(re.findall(r'"(tessera_[a-z_]+)"', (ROOT / "gpu_sharing/metrics.py").read_text()))
    # the extender's report puller (registered beside the verbs' metrics by `tessera serve`)
    pulled = set(re.findall(r'"(tessera_[a-z_]+)"', (ROOT / "extender/kube/agents.py").read_text()))
    families |= {f"{m}_total" for m in pulled} | pulled
    bridge = set(re.findall(r'"(tessera_bridge_[a-z_]+)"', (ROOT / "raybridge/bridge.py").read_text()))
    known = families | agent | bridge
    checked = used  # the bridge's too: panels once queried tessera_bridge_*_total series nobody exported
    unknown = {m for m in checked if m not in known and m.removesuffix("_bucket") not in known}
    assert len(checked & families) >= 6 and len(checked & agent) >= 3 and len(checked & bridge) >= 2 and not unknown, unknown
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


# -- the Dockerfile -----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerignore_excludes(rel: str) -> bool:
    import fnmatch

    excluded = False
    for pat in (ROOT / ".dockerignore").read_text().splitlines():
        pat = pat.strip()
        if not pat or pat.startswith("#"):
            continue
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.replace("/**", "")) or pat == "**":
            excluded = not neg
    return excluded


def test_dockerfile_copies_only_what_exists_and_is_sent():
    copies = 0
    for word, rest in dockerfile():
        if word not in ("COPY", "ADD"):
            continue
        assert word == "COPY", "ADD fetches and unpacks; COPY says what it does"
        args = shlex.split(rest)
        if any(a.startswith("--from") for a in args):
            continue
        for src in args[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: no such path"
            assert not _dockerignore_excludes(src), f"COPY {src}: .dockerignore keeps it out of the build context"
            copies += 1
    assert copies >= 5


def test_dockerfile_is_multi_stage_pinned_and_non_root():
    steps = dockerfile()
    froms = [shlex.split(r) for w, r in steps if w == "FROM"]
    stages = {f[2] for f in froms if len(f) == 3 and f[1].upper() == "AS"}
    assert {"build", "build-ray", "ray", "tessera"} <= stages and len(froms) >= 4
    assert froms[-1][2] == "tessera", "the default target is the image without ray and torch"
    args = dict(r.split("=", 1) for w, r in steps if w == "ARG" and "=" in r)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", args["PYTHON_IMAGE"]), "the base image's full version"
    # the final stage: a numeric non-root user and the tessera entrypoint
    last = max(i for i, (w, _) in enumerate(steps) if w == "FROM")
    final = steps[last:]
    assert ("USER", "10001:10001") in final and ("ENTRYPOINT", '["tessera"]') in final
    installs = [r for w, r in steps if w == "RUN" and "pip install" in r]
    assert installs and all("--constraint docker/constraints.txt" in r for r in installs)


def test_the_image_installs_the_nvml_extra_and_not_the_plot_one():
    """nvidia-ml-py and matplotlib are extras (setup.cfg): the agent in the image needs NVML, and `tessera simulate`
    there skips its PNG rather than carry matplotlib. scripts/image-build.sh installs what the Dockerfile does."""
    installs = [r for w, r in dockerfile() if w == "RUN" and "pip install" in r]
    assert any("'.[nvml]'" in r for r in installs) and not any("plot" in r for r in installs), installs
    script = (ROOT / "scripts/image-build.sh").read_text()
    assert 'REQUIREMENTS=("tessera[nvml]")' in script and "tessera[nvml,ray]" in script


def _requirement_names(lines) -> set[str]:
    return {re.split(r"[<>=!\[; ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in lines if line.strip() and not line.strip().startswith("#")}


def test_constraints_pin_every_dependency():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]
    runtime = _requirement_names(cfg["options"]["install_requires"].splitlines())
    runtime |= _requirement_names(extras["nvml"].splitlines()) | _requirement_names(extras["plot"].splitlines())
    ray = _requirement_names(extras["ray"].splitlines())
    pinned: set[str] = set()
    for name, need in (("constraints.txt", runtime), ("constraints-ray.txt", ray)):  # the ray target uses both
        lines = [x for x in (ROOT / "docker" / name).read_text().splitlines() if x.strip() and not x.startswith("#")]
        assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", x) for x in lines), name
        pinned |= _requirement_names(lines)
        assert need <= pinned, (name, need - pinned)


def test_the_containers_args_parse_with_tesseras_own_cli():
    """The args in the manifests are accepted by `tessera`'s parser (the bridge once it exists)."""
    from extender.cli import build_parser

    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    checked = 0
    for entry in ("", "second-scheduler"):
        for w in (o for o in render(M / entry) if o["kind"] in ("Deployment", "DaemonSet")):
            for c in w["spec"]["template"]["spec"]["containers"]:
                args = [a.replace("$(POD_NAMESPACE)", "tessera-system") for a in c.get("args", [""])]
                if args[0] not in commands:
                    continue
                ns = parser.parse_args(args)
                assert ns.command == args[0]
                checked += 1
    assert checked >= 6, commands


# -- second-scheduler mode ---------------------------------------------------------------------------

SECOND = {"second-scheduler": ("v1", "v1.25.16", "policy/v1"),
          "k8s-1.20/second-scheduler": ("v1beta1", "v1.20.2", "policy/v1beta1")}


def _serve_args(dep: dict):
    """The parsed `tessera serve` args of the Deployment's one serve container, $(POD_NAMESPACE) as its namespace."""
    from extender.cli import build_parser

    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c.get("args", [""])[0] == "serve"]
    return build_parser().parse_args([a.replace("$(POD_NAMESPACE)", dep["metadata"]["namespace"]) for a in c["args"]]), c


def _bound_roles(objs, sa: str) -> set[tuple[str, str, str]]:
    return {(b["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["name"]) for b, _ in _bindings(objs, sa)}


@pytest.mark.parametrize("entry", sorted(SECOND))
def test_second_scheduler_runs_kube_scheduler_and_the_extender_apart_over_mutual_tls(entry):
    """Issue 35: kube-scheduler and `tessera serve` in pods of their own, under accounts of their own, each with its
    own Lease. kube-scheduler's config reaches the extender's Service over mutual TLS with the client certificate of
    the Secret it mounts (at the paths of control-plane mode's config), and the extender requires certificates of the
    CA in its own Secret, names the Service in its server certificate and acts for the tessera-scheduler profile."""
    from extender.certs import service_names

    version, tag, pdb_version = SECOND[entry]
    objs = render(M / entry)
    sched = find(objs, "Deployment", "tessera-scheduler")
    spec = sched["spec"]["template"]["spec"]
    (kube,) = spec["containers"]  # kube-scheduler alone: nothing else runs under its token
    assert kube["image"] == f"registry.k8s.io/kube-scheduler:{tag}" and spec["serviceAccountName"] == "tessera-scheduler"
    cfg = scheduler_config(objs, spec, kube)
    assert cfg["apiVersion"] == f"kubescheduler.config.k8s.io/{version}" and "clientConnection" not in cfg  # in-cluster
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["tessera-scheduler"]

    ext = find(objs, "Deployment", "tessera-extender")
    ns, serve = _serve_args(ext)
    assert ext["spec"]["template"]["spec"]["serviceAccountName"] == "tessera-extender"
    assert ns.tls_cert and ns.tls_key and ns.client_ca and ns.leader_elect and not ns.insecure_listen
    assert ns.scheduler_names == ["tessera-scheduler"]
    ports = {p["name"]: p["containerPort"] for p in serve["ports"]}
    assert ns.listen == f"0.0.0.0:{ports['https']}"
    svc = find(objs, "Service", "tessera-extender")
    assert svc["spec"]["selector"].items() <= ext["spec"]["template"]["metadata"]["labels"].items()
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["targetPort"] == "https"]
    url = f"https://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc_port['port']}{ns.prefix}"
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in service_names()  # what `tessera certs` signs
    mounts = {m["name"]: m["mountPath"] for m in kube["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": "tessera-scheduler-tls", "defaultMode": 0o440}
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    binders = [e for e in cfg["extenders"] if e.get("bindVerb")]
    assert len(binders) == 1 and binders[0]["ignorable"] is False and binders[0]["managedResources"] == []
    for e in cfg["extenders"]:
        assert e["urlPrefix"] == url and e["enableHTTPS"] is True
        assert e["tlsConfig"] == {"certFile": f"{mounts['tls']}/scheduler.crt", "keyFile": f"{mounts['tls']}/scheduler.key",
                                  "caFile": f"{mounts['tls']}/ca.crt"}
    control_plane = objects(M / "scheduler/kube-scheduler-config.v1beta1.yaml")[0]["extenders"][0]
    assert (control_plane["urlPrefix"], control_plane["tlsConfig"]) == (url, binders[0]["tlsConfig"])  # one recipe

    le = cfg["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases" and le["resourceNamespace"] == "tessera-system"
    assert le["resourceName"] != ns.lease_name == "tessera-extender"  # two Leases: each side elects its own leader
    assert _bound_roles(objs, "tessera-scheduler") == {
        ("ClusterRoleBinding", "", "system:kube-scheduler"), ("ClusterRoleBinding", "", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "extension-apiserver-authentication-reader"),
        ("RoleBinding", "tessera-system", "tessera-scheduler-leader-election")}
    assert _bound_roles(objs, "tessera-extender") == {
        ("ClusterRoleBinding", "", "tessera-extender"), ("RoleBinding", "tessera-system", "tessera-extender-assignment-key"),
        ("RoleBinding", "tessera-system", "tessera-extender-leader-election")}
    lease_rules = find(objs, "Role", "tessera-scheduler-leader-election")["rules"]
    assert {"resources": ["leases"], "resourceNames": [le["resourceName"]], "verbs": ["get", "update"],
            "apiGroups": ["coordination.k8s.io"]} in lease_rules
    assert all(r["resources"] == ["leases"] for r in lease_rules)  # nothing but its own Lease
    for dep in (sched, ext):  # a drain takes at most one replica of either away
        pdb = find(objs, "PodDisruptionBudget", dep["metadata"]["name"])
        assert pdb["apiVersion"] == pdb_version and dep["spec"]["replicas"] == 2
        assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("entry", ["", "k8s-1.20"])
def test_second_scheduler_modes_extender_is_control_plane_modes_but_for_placement_and_profile(entry):
    """One Deployment tessera-extender in both modes (same name, account, Lease, Service, Secrets): switching modes
    changes it in place. Second-scheduler mode's runs where the admin's overlay puts it (no control-plane node on a
    managed cluster) and acts for the tessera-scheduler profile; nothing else differs."""
    def core(dep):
        dep = json.loads(json.dumps(dep))
        spec = dep["spec"]["template"]["spec"]
        spec["affinity"].pop("nodeAffinity", None)
        spec.pop("tolerations", None)
        args = spec["containers"][0]["args"]
        if "--scheduler-name" in args:
            del args[args.index("--scheduler-name"):args.index("--scheduler-name") + 2]
        return dep

    here = find(render(M / entry), "Deployment", "tessera-extender")
    second = find(render(M / (f"{entry}/second-scheduler" if entry else "second-scheduler")), "Deployment", "tessera-extender")
    assert core(here) == core(second)
    spec = second["spec"]["template"]["spec"]
    assert "nodeAffinity" not in spec["affinity"] and "tolerations" not in spec
    assert _serve_args(here)[0].scheduler_names is None and _serve_args(second)[0].scheduler_names == ["tessera-scheduler"]


def test_both_second_scheduler_entry_points_differ_only_in_version_bound_parts():
    new, old = render(M / "second-scheduler"), render(M / "k8s-1.20/second-scheduler")

    def strip(objs):
        out = []
        for o in objs:
            o = json.loads(json.dumps(o))
            if o["kind"] == "PodDisruptionBudget":
                o["apiVersion"] = "policy/*"
            if o["kind"] == "ConfigMap":
                o["data"] = {k: re.sub(r"(?m)^#.*\n|/v1beta1$|/v1$", "", v) for k, v in o["data"].items()}
            for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                c["image"] = c["image"].rsplit(":", 1)[0]
            out.append(o)
        return out

    assert strip(new) == strip(old)


def test_control_plane_mode_is_what_manifests_applies_and_shares_the_base_with_second_scheduler_mode():
    base = render(M / "base")
    for entry in ("", "k8s-1.20", "second-scheduler", "k8s-1.20/second-scheduler"):
        objs = render(M / entry)
        assert all(o in objs for o in base), entry
        assert find(objs, "Deployment", "tessera-extender") and find(objs, "PodDisruptionBudget", "tessera-extender")
    assert not [o for o in render(M) if o["metadata"]["name"].startswith("tessera-scheduler")]
    # what `kubectl delete -k manifests/install/second-scheduler/` removes on a switch to control-plane mode: the
    # kube-scheduler side only, nothing the extender (the same Deployment in both modes) runs with
    gone = render(M / "install/second-scheduler")
    assert gone and all(o["metadata"]["name"].startswith("tessera-scheduler") for o in gone)


def test_the_second_scheduler_example_opts_in_the_way_the_profile_and_the_guide_say():
    from extender.translate.objects import pod_request

    pod = objects(M / "examples/second-scheduler-slice.yaml")[0]
    spec = pod["spec"]
    cfg = objects(M / "k8s-1.20/second-scheduler/tessera-scheduler.yaml")[0]
    assert spec["schedulerName"] == cfg["profiles"][0]["schedulerName"] == "tessera-scheduler"
    taint = {"key": "tessera.dev/scheduler", "value": "tessera-scheduler", "effect": "NoSchedule"}
    assert {**taint, "operator": "Equal"} in spec["tolerations"]
    assert spec["nodeSelector"] == {taint["key"]: taint["value"]}
    guide = (ROOT / "docs/admin-guide.md").read_text()
    assert f"{taint['key']}={taint['value']}:{taint['effect']}" in guide  # the taint the admin puts on the nodes
    assert pod_request(pod).gpu_milli == 250


def _pod_templates(obj: dict) -> list[dict]:
    """Every pod an example or install object makes: a Pod, a workload's template, a RayCluster's groups."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return [obj]
    found = [spec["template"]] if isinstance(spec.get("template"), dict) else []
    found += [spec["jobTemplate"]["spec"]["template"]] if "jobTemplate" in spec else []
    found += [g["template"] for g in [spec.get("headGroupSpec") or {}, *(spec.get("workerGroupSpecs") or [])] if g]
    return found


def test_every_pod_the_manifests_make_passes_the_contract_at_filter():
    """A pod the shipped manifests create must not be refused by Tessera's own filter (KubeRay's workers carried
    tessera.dev/runtime: ray without an entrypoint, which filter refuses since the Ray contract is checked there)."""
    from extender.translate.objects import annotation_problems

    checked = 0
    for path in sorted(M.rglob("*.yaml")):
        for obj in objects(path):
            for template in _pod_templates(obj):
                pod = {"metadata": {"namespace": "ns", "name": "p", **(template.get("metadata") or {})},
                       "spec": template.get("spec") or {}}
                assert annotation_problems(pod) == [], f"{path.relative_to(ROOT)}: {annotation_problems(pod)}"
                checked += 1
    assert checked >= 10


def test_each_example_that_starts_with_tessera_launch_gives_it_the_assignment():
    """The slice examples set only NVIDIA_VISIBLE_DEVICES, and tessera-launch stopped with "no Tessera assignment".
    The downward API is played here: the annotations Tessera writes at bind, read through each env's fieldRef."""
    from gpu_sharing.assignment import read_assignment

    bound = {"tessera.dev/gpu-assignment": '{"node":"n","gpus":[1],"milli":250,"uuids":["GPU-b"]}',
             "tessera.dev/visible-devices": "GPU-b"}
    launched = 0
    for path in sorted((M / "examples").glob("*.yaml")):
        for obj in objects(path):
            for template in _pod_templates(obj):
                for c in template["spec"]["containers"]:
                    if "tessera-launch" not in (c.get("command") or [])[:1]:
                        continue
                    env = {}
                    for e in c.get("env") or []:
                        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
                        key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", ref)
                        env[e["name"]] = bound.get(key.group(1), "") if key else e.get("value", "")
                    env["TESSERA_PODINFO"] = "/nonexistent"
                    got = read_assignment(env)
                    assert got.milli == 250, f"{path.name}: {got}"
                    launched += 1
    assert launched >= 2


def _policy_of(objs, workload: dict) -> dict:
    """The one NetworkPolicy that selects the workload's pods."""
    ns, labels = workload["metadata"]["namespace"], workload["spec"]["template"]["metadata"]["labels"]
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == ns
                 and selects(o["spec"]["podSelector"], labels)]
    return policy


@pytest.mark.parametrize("entry", ["", "second-scheduler", "k8s-1.20", "k8s-1.20/second-scheduler"])
def test_the_pod_running_tessera_serve_admits_only_labelled_scrapers_to_its_admin_port(entry):
    """Any pod's idle connections held all 256 slots of the admin port (8889) and the kubelet's probes failed, taking
    the replica out of the Service. One NetworkPolicy on the pod that runs `tessera serve` lets its admin port be
    reached only from namespaces labelled as scrapers. The verbs port: in control-plane mode open to all (kube-scheduler
    on the host network; mutual TLS decides), in second-scheduler mode only from pods of this namespace (which, the next
    test says). The probe port is in no rule: only the kubelet asks it, from the node, which enforcing CNIs let through."""
    objs = render(M / entry)
    serve = next(w for w in objs if w["kind"] == "Deployment"
                 and any(c.get("args", [""])[0] == "serve" for c in w["spec"]["template"]["spec"]["containers"]))
    template = serve["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    open_to_all, scrapers_only, own_namespace = set(), set(), set()
    for rule in _policy_of(objs, serve)["spec"]["ingress"]:
        numbers = {ports[p["port"]] for p in rule["ports"]}
        if "from" not in rule:
            open_to_all |= numbers
        elif all(set(peer) == {"podSelector"} for peer in rule["from"]):
            own_namespace |= numbers
        else:
            assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"tessera.dev/metrics-scraper": "true"}}}]
            scrapers_only |= numbers
    assert 8889 in scrapers_only
    assert (open_to_all, own_namespace) == ((set(), {8888}) if "second-scheduler" in entry else ({8888}, set()))
    (tessera,) = [c for c in template["spec"]["containers"] if c.get("args", [""])[0] == "serve"]
    probed = {ports[tessera[k]["httpGet"]["port"]] for k in ("livenessProbe", "readinessProbe")}
    assert probed == {8890} and not probed & (open_to_all | scrapers_only | own_namespace)
    assert set(ports.values()) <= open_to_all | scrapers_only | own_namespace | probed, "every other port is in a rule"


@pytest.mark.parametrize("entry", sorted(SECOND))
def test_in_second_scheduler_mode_the_verbs_port_admits_only_kube_schedulers_pods_and_the_extenders_own(entry):
    """No kube-scheduler runs on the host network in this mode, so the verbs need not be open: only tessera-scheduler's
    pods (kube-scheduler calls the verbs) and the extender's own replicas (a follower forwards a bind to the Lease
    holder's pod IP) of this namespace reach port 8888, no other workload of Tessera's (the bridge, the agent) and no
    pod of another namespace; mutual TLS still decides who gets an answer. kube-scheduler's own pod admits only
    labelled scrapers, to its secure port (it takes no calls)."""
    objs = render(M / entry)
    ext, sched = find(objs, "Deployment", "tessera-extender"), find(objs, "Deployment", "tessera-scheduler")
    ports = {p["name"]: p["containerPort"] for c in ext["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    (verbs,) = [r for r in _policy_of(objs, ext)["spec"]["ingress"] if {ports[p["port"]] for p in r["ports"]} == {8888}]
    assert verbs["from"] and all(set(peer) == {"podSelector"} for peer in verbs["from"])  # this namespace only
    workloads = [w for w in objs if w["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
    admitted = {w["metadata"]["name"] for w in workloads
                if any(selects(peer["podSelector"], w["spec"]["template"]["metadata"]["labels"]) for peer in verbs["from"])}
    assert admitted == {"tessera-scheduler", "tessera-extender"}
    assert _policy_of(objs, sched)["spec"]["ingress"] == [
        {"ports": [{"port": "sched-https", "protocol": "TCP"}],
         "from": [{"namespaceSelector": {"matchLabels": {"tessera.dev/metrics-scraper": "true"}}}]}]
    assert [p["name"] for c in sched["spec"]["template"]["spec"]["containers"] for p in c["ports"]] == ["sched-https"]


def test_every_shipped_scheduler_configuration_keeps_one_preemption_candidate():
    """docs/security.md says so: with two candidates Tessera refused for slice room, kube-scheduler 1.20.2 panicked
    and exited at each retry (kubernetes #101548). The v1 control-plane file had no such setting."""
    paths = sorted((M / "scheduler").glob("kube-scheduler-config.*.yaml")) + sorted(M.rglob("tessera-scheduler.yaml"))
    assert len(paths) == 4
    for path in paths:
        cfg = objects(path)[0]
        assert cfg["profiles"], path
        for profile in cfg["profiles"]:
            args = [p["args"] for p in profile.get("pluginConfig", []) if p["name"] == "DefaultPreemption"]
            assert args == [{"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 1}], (path, profile["schedulerName"])


def test_the_bridge_imports_without_ray_or_torch():
    """The bridge now ships on the image without ray and torch, so `tessera bridge` must need neither: an import
    of either from its modules would fail only in a cluster. Both are made unimportable in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('ray', 'torch'):\n"
            "            raise ImportError(f'{name} is not in this image')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import raybridge.bridge, raybridge.kube, raybridge.metrics\n"
            "from extender.cli import main\n"
            "try:\n"
            "    main(['bridge', '--help'])\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('ray', 'torch')]\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# Each installation: the kube-scheduler configuration its scheduler runs, and the workload running `tessera serve`.
SCHEDULER_PROFILES = [
    ("", M / "scheduler/kube-scheduler-config.v1beta1.yaml", "tessera-extender"),
    ("", M / "scheduler/kube-scheduler-config.v1.yaml", "tessera-extender"),
    ("second-scheduler", M / "second-scheduler/tessera-scheduler.yaml", "tessera-extender"),
    ("k8s-1.20/second-scheduler", M / "k8s-1.20/second-scheduler/tessera-scheduler.yaml", "tessera-extender"),
]


@pytest.mark.parametrize("entry,config,workload", SCHEDULER_PROFILES)
def test_tessera_acts_for_exactly_the_profiles_its_scheduler_runs(entry, config, workload):
    """Issue 35: the preemptor evicted for pods of any schedulerName, default-scheduler's included in second-scheduler
    mode, where the cluster's own scheduler places them. The names `tessera serve` acts for, as its shipped args read
    (the default included), are the profiles of the configuration its kube-scheduler runs."""
    from extender.cli import build_parser
    from extender.cli.serve import served_scheduler_names

    profiles = {p["schedulerName"] for p in objects(config)[0]["profiles"]}
    dep = find(render(M / entry), "Deployment", workload)
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c.get("args", [""])[0] == "serve"]
    args = build_parser().parse_args([a.replace("$(POD_NAMESPACE)", "tessera-system") for a in c["args"]])
    assert set(served_scheduler_names(args)) == profiles
