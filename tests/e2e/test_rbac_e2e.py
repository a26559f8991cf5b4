"""The shipped RBAC against the real kube-apiserver (RBAC authorizer), each ServiceAccount impersonated.

tests/test_manifests.py checks statically that each ServiceAccount's rules are exactly the API
calls its code makes. Here the apiserver itself decides: the calls the code makes succeed with
the shipped rules (the extender's bind is a POST to a namespace's `bindings`, which a
`pods/binding` rule does not cover), and the footholds the rules should not give are refused:
the node agent can do nothing at all, the extender cannot patch pods (it may delete one, by UID,
to preempt it) nor create a Secret (the install makes its key's).
"""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from testing.local_cluster import ROOT

from ..kustomize import render
from .harness import create_or_keep, impersonating, refused

NS = "rbac-e2e"
NODE = "rbac-e2e-node"


@pytest.fixture(scope="module")
def as_sa(cluster):
    """The shipped ServiceAccounts, Roles and bindings applied; a CoreV1Api acting as one of them."""
    api = cluster["api"]
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    for ns in ("tessera-system", NS):
        create_or_keep(api.create_namespace, {"metadata": {"name": ns}})
    for o in render(ROOT / "manifests"):
        kind, ns = o["kind"], o["metadata"].get("namespace")
        if kind == "ServiceAccount":
            create_or_keep(api.create_namespaced_service_account, ns, o)
        elif kind == "ClusterRole":
            create_or_keep(rbac.create_cluster_role, o)
        elif kind == "ClusterRoleBinding":
            create_or_keep(rbac.create_cluster_role_binding, o)
        elif kind == "Role":
            create_or_keep(rbac.create_namespaced_role, ns, o)
        elif kind == "RoleBinding":
            create_or_keep(rbac.create_namespaced_role_binding, ns, o)
    create_or_keep(api.create_node, {"metadata": {"name": NODE}})

    def make(sa: str) -> client.CoreV1Api:
        return client.CoreV1Api(impersonating(api, "tessera-system", sa))

    return make


def test_the_extender_binds_writes_nodes_and_reads_but_never_patches_pods(cluster, as_sa):
    from extender.kube.binder import ApiBinder

    admin, ext = cluster["api"], as_sa("tessera-extender")
    # nobody else schedules it: a scheduler name no scheduler answers to
    admin.create_namespaced_pod(NS, {"metadata": {"name": "bind-me"}, "spec": {
        "schedulerName": "rbac-e2e-nobody", "containers": [{"name": "c", "image": "none"}]}})
    uid = admin.read_namespaced_pod("bind-me", NS).metadata.uid
    ApiBinder(ext).bind(NS, "bind-me", uid, NODE, {"tessera.dev/e2e": "bound"})
    pod = admin.read_namespaced_pod("bind-me", NS)
    assert pod.spec.node_name == NODE and pod.metadata.annotations["tessera.dev/e2e"] == "bound"
    assert refused(lambda: ext.patch_namespaced_pod("bind-me", NS, {"metadata": {"labels": {"x": "y"}}}))
    # the agent reports it pulls become the Node's annotation and capacity (extender/kube/node_writer.py's calls)
    ext.read_node(NODE, _preload_content=False)
    ext.patch_node(NODE, {"metadata": {"annotations": {"tessera.dev/gpu-inventory": json.dumps({"gpus": []})}}})
    ext.patch_node_status(NODE, {"status": {"capacity": {"tessera.dev/gpu-milli": "0"}}})
    ext.list_namespaced_pod("tessera-system", resource_version="0", _preload_content=False)  # the agent pods
    assert refused(lambda: ext.delete_node(NODE))
    assert refused(lambda: ext.list_namespaced_secret(NS))
    # Tessera's own preemption (kube/preemptor.py): the victims' budgets (policy/v1beta1 on 1.20) and
    # the victim's pod are read, and it is deleted under its UID only
    from extender.kube.preemptor import DisruptionBudgets

    assert DisruptionBudgets(ext, client.PolicyV1Api(ext.api_client)).protected({uid: f"{NS}/bind-me"}) == frozenset()
    with pytest.raises(client.exceptions.ApiException) as wrong_uid:  # a pod of that name but another UID is spared
        ext.delete_namespaced_pod("bind-me", NS, body={"preconditions": {"uid": "not-its-uid"}})
    assert wrong_uid.value.status == 409
    ext.delete_namespaced_pod("bind-me", NS, body={"preconditions": {"uid": uid}})


def test_the_extender_reads_its_key_and_creates_no_secret(cluster, as_sa):
    """Issue 35: the install makes the assignment key's Secret, so the extender holds `get` on it and no create
    (which RBAC could not limit to that name): not its own Secret, not another one."""
    from extender.kube.assignment_key import load

    ext = as_sa("tessera-extender")
    key = {"metadata": {"name": "tessera-assignment-key"},
           "data": {"key-20261130T125600Z": base64.b64encode(b"k" * 32).decode()}}
    assert refused(lambda: ext.create_namespaced_secret("tessera-system", key))
    cluster["api"].create_namespaced_secret("tessera-system", key)  # the admin's step
    try:
        assert load(ext, "tessera-system", "tessera-assignment-key").signing.entry == "key-20261130T125600Z"
        assert refused(lambda: ext.create_namespaced_secret("tessera-system", {"metadata": {"name": "another"}}))
        assert refused(lambda: ext.read_namespaced_secret("tessera-extender-tls", "tessera-system"))
    finally:
        cluster["api"].delete_namespaced_secret("tessera-assignment-key", "tessera-system")


def test_the_node_agent_can_do_nothing_through_the_api(cluster, as_sa):
    agent = as_sa("tessera-agent")
    assert refused(lambda: agent.read_node(NODE))
    assert refused(lambda: agent.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/gpu.product": "forged"}}}))
    assert refused(lambda: agent.patch_node_status(NODE, {"status": {"capacity": {"tessera.dev/gpu-milli": "8000"}}}))
    assert refused(lambda: agent.list_pod_for_all_namespaces())
    assert "nvidia.com/gpu.product" not in (cluster["api"].read_node(NODE).metadata.labels or {})


def test_the_bridge_cannot_touch_nodes_or_bind(cluster, as_sa):
    bridge = as_sa("tessera-bridge")
    bridge.list_pod_for_all_namespaces(limit=1)
    # it never writes a pod it did not create: each job writes its own progress (raybridge/job.py)
    assert refused(lambda: bridge.patch_namespaced_pod("any-pod", NS, {"metadata": {"annotations": {"x": "y"}}}))
    assert refused(lambda: bridge.list_namespaced_secret(NS))
    assert refused(lambda: bridge.patch_node(NODE, {"metadata": {"labels": {"x": "y"}}}))
    assert refused(lambda: bridge.create_namespaced_binding(NS, {"metadata": {"name": "bind-me"},
                                                                 "target": {"kind": "Node", "name": NODE}}))
