"""Pod Security in tessera-system, checked without a cluster: the namespace asks for the level its most
privileged pod needs (the agent's hostPID), so a cluster that enforces Baseline or Restricted by default still runs
the agent; and only the agent needs it, every other pod there meets Restricted's rules as they apply to what
Tessera's pod specs use."""

from __future__ import annotations

import pytest

from .kustomize import render
from .test_manifests import M, find

ENTRIES = ["", "k8s-1.20", "second-scheduler", "k8s-1.20/second-scheduler"]
LEVEL = "pod-security.kubernetes.io/enforce"
HOST_NAMESPACES = ("hostPID", "hostIPC", "hostNetwork")


def _pods(objs):
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "DaemonSet")}


def breaks_baseline(spec: dict) -> list[str]:
    """What of Baseline this pod spec breaks (the fields Tessera's pods could set)."""
    out = [f for f in HOST_NAMESPACES if spec.get(f)]
    out += [f"hostPath {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if set((sc.get("capabilities") or {}).get("add", [])):
            out.append(f"{c['name']}: capabilities added")
        if any("hostPort" in p for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
    return out


def breaks_restricted(spec: dict) -> list[str]:
    out = breaks_baseline(spec)
    pod_sc = spec.get("securityContext") or {}
    if (pod_sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append("seccompProfile")
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
            out.append(f"{c['name']}: drop ALL")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"{c['name']}: runAsNonRoot")
    return out


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_namespace_asks_for_the_level_its_pods_need_and_only_the_agent_needs_it(entry):
    objs = render(M / entry)
    ns = find(objs, "Namespace", "tessera-system")
    pods = _pods(objs)
    needs_privileged = sorted(name for name, spec in pods.items() if breaks_baseline(spec))
    assert needs_privileged == ["tessera-agent", "tessera-device-plugin"], "only the node's two may need more than Restricted"
    assert ns["metadata"]["labels"][LEVEL] == "privileged", "else the agent gets no pod where Baseline is the default"
    assert breaks_baseline(pods["tessera-agent"]) == ["hostPID"]  # the one reason, as the namespace's comment says
    # the kubelet's socket directory and the node's /dev (read-only), as root with no capability: nothing more
    assert breaks_baseline(pods["tessera-device-plugin"]) == ["hostPath device-plugins", "hostPath pod-resources", "hostPath dev"]
    plugin = pods["tessera-device-plugin"]["containers"][0]
    assert [m["readOnly"] for m in plugin["volumeMounts"] if m["name"] == "dev"] == [True]
    for name, spec in pods.items():
        if name not in ("tessera-agent", "tessera-device-plugin"):
            assert breaks_restricted(spec) == [], name


def test_the_check_sees_what_baseline_forbids():
    spec = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "securityContext": {"privileged": True},
                            "ports": [{"containerPort": 1, "hostPort": 1}]}]}
    assert breaks_baseline(spec) == ["hostNetwork", "hostPath h", "c: privileged", "c: hostPort"]
    assert "c: runAsNonRoot" in breaks_restricted({"containers": [{"name": "c"}]})


def _uid(spec: dict, container: dict) -> tuple:
    pod, own = spec.get("securityContext") or {}, container.get("securityContext") or {}
    return own.get("runAsUser", pod.get("runAsUser")), own.get("runAsGroup", pod.get("runAsGroup"))


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_agent_with_hostpid_shares_no_uid_or_gid_with_any_other_container(entry):
    """hostPID shows the agent every process on its node: processes of its own UID it could signal or trace. It ran
    as the extender's UID, so a compromised agent on a node could reach an extender replica there."""
    pods = _pods(render(M / entry if entry else M))
    agent = pods["tessera-agent"]
    assert agent.get("hostPID")
    mine = {_uid(agent, c) for c in agent["containers"]}
    assert all(None not in u for u in mine), mine  # set, not left to the image
    others = {_uid(spec, c) for name, spec in pods.items() if name != "tessera-agent" for c in spec["containers"]}
    assert not {u for pair in mine for u in pair} & {u for pair in others for u in pair if u is not None}, (mine, others)
