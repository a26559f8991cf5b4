"""Shortest runs first through the real kube-scheduler 1.20.2 and `tessera serve --short-first on` (issue 14;
extender/short_first_queue.py).

One node of 1 GPU, held by `first`. `long` (no spec.activeDeadlineSeconds) is created before `s1` and `s2`
(activeDeadlineSeconds 300, within the 10 min run bound). With the waiting bound at 0, `long` is held while
any short pod waits: /inspect says so, the freed GPU goes to the short pods one after the other, and
`long` binds once none waits.
"""

from __future__ import annotations

import urllib.error

import pytest

from .test_reservations_e2e import TAINT, gpus_of, one_node_cluster, until

NS = "default"
NODE = "sf-0"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from one_node_cluster(tmp_path_factory.mktemp("shortfirstcp"), NODE, 1, (
        "--short-first", "on", "--short-first-waiting", "0", "--short-first-run", "10m", "--short-first-hold", "1h"))


def make_pod(api, name, deadline=None):
    spec = {"containers": [{"name": "c", "image": "none", "resources": {"limits": {
        "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}}], "tolerations": [TAINT], "terminationGracePeriodSeconds": 0}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def seen(extender, name: str) -> dict:
    """/inspect on a pod, {} until Tessera's watch has delivered it: until then the endpoint answers 404, which urlopen
    raises, and the check right after the pod's create can come first (the likely cause of a failure after 12 s,
    one run in 14 on 2026-12-02)."""
    try:
        return extender.inspect(f"{NS}/{name}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return {}
        raise


def bound(api, names) -> list[str]:
    return [n for n in names if gpus_of(api, n) is not None]


def test_the_freed_gpu_goes_to_short_runs_first_and_the_long_pod_binds_once_none_waits(env):
    api, extender = env["api"], env["extender"]
    make_pod(api, "first", deadline=600)
    until(lambda: gpus_of(api, "first"), "binding of first")
    make_pod(api, "long")
    until(lambda: seen(extender, "long").get("status") == "pending", "long pending in tessera's cache")
    make_pod(api, "s1", deadline=300)
    make_pod(api, "s2", deadline=300)
    why = until(lambda: (w := seen(extender, "long").get("why", "")).startswith("held for shorter runs") and w,
                "long held in /inspect")
    assert "more than 0 GPU pods of at most 600 s" in why

    api.delete_namespaced_pod("first", NS, grace_period_seconds=0)
    # 120 s: when kube-scheduler's informer sees a deletion before Tessera's watch does, the pods it tries at once
    # are refused for a GPU Tessera still counts as taken and wait for kube-scheduler's flush (60 s, every 30 s)
    x = until(lambda: bound(api, ["s1", "s2"]), "binding of s1 or s2", timeout=120)[0]
    assert gpus_of(api, "long") is None, "long took the GPU while two short pods waited"
    y = "s2" if x == "s1" else "s1"
    api.delete_namespaced_pod(x, NS, grace_period_seconds=0)
    until(lambda: bound(api, [y]), f"binding of {y}", timeout=120)
    assert gpus_of(api, "long") is None, "long took the GPU while a short pod waited"
    api.delete_namespaced_pod(y, NS, grace_period_seconds=0)
    until(lambda: gpus_of(api, "long"), "binding of long once no short pod waits", timeout=120)
