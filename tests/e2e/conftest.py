"""A real control plane for end-to-end tests: etcd, kube-apiserver and kube-scheduler 1.20.2
(scripts/kube-build.sh, scripts/controlplane.sh) with the shipped v1beta1 scheduler
configuration, and `tessera serve` as the extender over HTTP (harness.py).

Skipped with a reason when the Kubernetes binaries are not built; .ci/run builds them first
(cached under ~/.cache/tessera), so CI always runs these.
"""

from __future__ import annotations

import pytest

from .harness import LocalCluster, skip_without_control_plane


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
