"""A real control plane for end-to-end tests: etcd, kube-apiserver and kube-scheduler 1.20.2
(scripts/kube-build.sh, scripts/controlplane.sh) with the shipped v1beta1 scheduler
configuration, and `tessera serve` as the extender over HTTP (testing/local_cluster.py).

Skipped with a reason when the Kubernetes binaries are not built (scripts/test builds them first,
cached under ~/.cache/tessera). With TESSERA_REQUIRE_E2E=1, which CI's .ci/run sets, a test here that
skips fails instead, with its reason: a broken build or a missing package can no longer turn CI green.
"""

from __future__ import annotations

import os

import pytest

from testing.local_cluster import LocalCluster

from .harness import skip_without_control_plane

# The controllers the second cluster runs (scripts/controlplane.sh CP_CONTROLLERS): Jobs and the garbage collector that
# removes a deleted Job's pods. Not the node lifecycle controller: the Nodes here are fake, it would taint them.
CONTROLLERS = "job,garbagecollector"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    skip_without_control_plane()
    from kubernetes import client, config

    local = LocalCluster(tmp_path_factory.mktemp("cp"))
    try:
        local.start()
        config.load_kube_config(config_file=str(local.work / "kubeconfig"))
        yield {"api": client.CoreV1Api(), "extender": local.extender, "dir": local.work}
    finally:
        local.stop()


@pytest.fixture(scope="session")
def crds(cluster):
    """tests/crds' RayCluster, ServiceMonitor and PodGroup CRDs installed and Established: {kind: CustomKind}."""
    from .crds import install, recipe_too_old

    too_old = recipe_too_old()
    if too_old:
        pytest.skip(too_old)
    return install(cluster["api"].api_client)


@pytest.fixture(scope="session")
def controllers(tmp_path_factory):
    """A second control plane that also runs kube-controller-manager (CONTROLLERS), with `tessera serve` beside it:
    {"core", "batch", "custom": API objects of its own client, "extender": the ExtenderProcess, "dir"}. Skipped when
    kube-controller-manager is not built (scripts/kube-build.sh recipe r3 or later)."""
    skip_without_control_plane(controllers=True)
    from kubernetes import client, config

    from .crds import install

    local = LocalCluster(tmp_path_factory.mktemp("controllerscp"), controllers=CONTROLLERS)
    try:  # tests/crds (the PodGroup CRD among them) before tessera serve starts: its PodGroup watch finds them at once
        local.start(lambda kubeconfig: install(config.new_client_from_config(config_file=str(kubeconfig))))
        # a client of its own: config.load_kube_config would repoint every other module's default client here
        api_client = config.new_client_from_config(config_file=str(local.work / "kubeconfig"))
        yield {"core": client.CoreV1Api(api_client), "batch": client.BatchV1Api(api_client),
               "custom": client.CustomObjectsApi(api_client), "api_client": api_client,
               "extender": local.extender, "dir": local.work}
    finally:
        local.stop()


REQUIRED = os.environ.get("TESSERA_REQUIRE_E2E") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under TESSERA_REQUIRE_E2E=1 an end-to-end test that skips is reported as failed, with the reason."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and TESSERA_REQUIRE_E2E=1 says end-to-end tests must run here: {reason}"
