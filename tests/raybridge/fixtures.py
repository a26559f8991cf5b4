"""One real multi-node Ray cluster (ray.cluster_utils) shared by every Ray test (tests/conftest.py imports it):
raybridge's own and the end-to-end test against the real control plane (one cluster start per session).

Nodes are named like Kubernetes nodes (k8s-node-N) through the resources raybridge.placement
names. Skipped with a reason when the `ray` extra (ray, torch, numpy) is not installed.
"""

from __future__ import annotations

import itertools
import os
import tempfile

import pytest

from raybridge.raycluster import ray_missing


class Nodes:
    """Hands out fresh node names; tests kill some and add others (add only from the main thread)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self._ids = itertools.count(1)

    def add(self, n: int = 1) -> list[str]:
        names = [f"k8s-node-{next(self._ids)}" for _ in range(n)]
        for name in names:
            self.cluster.add(name)
        return names


@pytest.fixture(scope="session")
def ray_nodes():
    missing = ray_missing()
    if missing:
        pytest.skip(missing)
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    from raybridge.raycluster import LocalRayCluster

    cluster = LocalRayCluster()
    try:
        cluster.connect()
        yield Nodes(cluster)
    finally:
        cluster.shutdown()
