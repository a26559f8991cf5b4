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
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.cluster.shutdown()

    def add(self, n: int = 1) -> list[str]:
        names = [f"k8s-node-{next(self._ids)}" for _ in range(n)]
        for name in names:
            self.cluster.add(name)
        return names


@pytest.fixture(scope="session")
def ray_nodes(request):
    missing = ray_missing()
    if missing:
        pytest.skip(missing)
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    from raybridge.raycluster import LocalRayCluster

    nodes = Nodes(LocalRayCluster())
    request.config.stash[_NODES] = nodes
    try:
        nodes.cluster.connect()
        yield nodes
    finally:
        nodes.close()


_NODES = pytest.StashKey[Nodes]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Shut the cluster down after the last test that uses it, not at the end of the session: the
    connected driver prints Ray's notices (dead nodes, workers) into this process's stdout, which
    later tests read through capsys."""
    yield
    nodes = item.config.stash.get(_NODES, None)
    if nodes is None or nodes.closed:
        return
    items = item.session.items
    later = items[items.index(item) + 1:]
    if not any("ray_nodes" in getattr(it, "fixturenames", ()) for it in later):
        nodes.close()
