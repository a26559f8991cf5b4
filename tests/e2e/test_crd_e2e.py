"""Custom resources on the real 1.20.2 kube-apiserver: tests/crds' CRDs installed, then a
ServiceMonitor created, read, listed, patched, dry-run and deleted, and a RayCluster's schema
enforced (422 on a wrong type, unknown fields pruned).

The r1 build of scripts/kube-build.sh (vendored reflect2 v1.0.1 under Go 1.19) segfaulted in
the apiserver on the first of these requests; every step here would fail with a connection
error, and the apiserver log would hold the SIGSEGV that the last test looks for."""

from __future__ import annotations

import os

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

NS = "default"


def _api(cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster["api"].api_client)


def _servicemonitor(name: str) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": {"selector": {"matchLabels": {"app": "demo"}},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]},
    }


def _rc(name: str) -> dict:
    template = {"spec": {"containers": [{"name": "ray", "image": "ray:2", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {"rayVersion": "2.9.0", "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": template},
                 "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 4,
                                       "rayStartParams": {}, "template": template}]},
    }


def test_a_custom_resource_is_created_read_listed_patched_and_deleted(cluster, crds):
    k, api = crds["ServiceMonitor"], _api(cluster)
    where = dict(group=k.group, version=k.version, namespace=NS, plural=k.plural)
    made = api.create_namespaced_custom_object(**where, body=_servicemonitor("crd-e2e"))
    assert made["metadata"]["uid"] and made["spec"]["endpoints"][0]["interval"] == "15s"
    got = api.get_namespaced_custom_object(**where, name="crd-e2e")
    assert got["spec"] == made["spec"] and got["metadata"]["uid"] == made["metadata"]["uid"]
    listed = api.list_namespaced_custom_object(**where, label_selector="app.kubernetes.io/part-of=tessera-e2e")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["crd-e2e"]
    api.patch_namespaced_custom_object(**where, name="crd-e2e", body={"spec": {"endpoints": [{"port": "metrics"}]}})
    assert api.get_namespaced_custom_object(**where, name="crd-e2e")["spec"]["endpoints"] == [{"port": "metrics"}]
    api.delete_namespaced_custom_object(**where, name="crd-e2e")
    with pytest.raises(ApiException) as e:
        api.get_namespaced_custom_object(**where, name="crd-e2e")
    assert e.value.status == 404


def test_a_dry_run_answers_the_object_and_stores_nothing(cluster, crds):
    k, api = crds["RayCluster"], _api(cluster)
    where = dict(group=k.group, version=k.version, namespace=NS, plural=k.plural)
    got = api.create_namespaced_custom_object(**where, body=_rc("crd-e2e-dry"), dry_run="All")
    assert got["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 4
    assert got["spec"]["headGroupSpec"]["template"] == _rc("x")["spec"]["headGroupSpec"]["template"]
    with pytest.raises(ApiException) as e:
        api.get_namespaced_custom_object(**where, name="crd-e2e-dry")
    assert e.value.status == 404


def test_the_crd_schema_rejects_a_wrong_type_and_prunes_an_unknown_field(cluster, crds):
    k, api = crds["RayCluster"], _api(cluster)
    where = dict(group=k.group, version=k.version, namespace=NS, plural=k.plural)
    bad = _rc("crd-e2e-bad")
    bad["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "four"
    with pytest.raises(ApiException) as e:
        api.create_namespaced_custom_object(**where, body=bad, dry_run="All")
    assert e.value.status == 422 and "maxReplicas" in e.value.body
    typo = _rc("crd-e2e-typo")
    typo["spec"]["workerGroupSpecs"][0]["maxReplica"] = 4
    got = api.create_namespaced_custom_object(**where, body=typo, dry_run="All")
    assert "maxReplica" not in got["spec"]["workerGroupSpecs"][0]
    assert got["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 4


def test_the_apiserver_is_still_the_process_that_started_and_logged_no_crash(cluster, crds):
    pids = dict(line.split() for line in (cluster["dir"] / "pids").read_text().splitlines() if line.strip())
    os.kill(int(pids["kube-apiserver"]), 0)  # raises ProcessLookupError if it died
    log = (cluster["dir"] / "logs/kube-apiserver.log").read_text(errors="replace")
    assert "SIGSEGV" not in log and "unsafe_map.go" not in log
    assert cluster["api"].list_namespace(limit=1).items  # and it still answers
