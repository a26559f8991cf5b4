"""The one placement cycle (extender/core/placer.py) that the server's verbs and the simulator share."""

import ast
from pathlib import Path

import pytest

from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest
from extender.core.placer import Placer
from extender.core.policy import PolicyContext, make_policy
from extender.core.workload import TargetWorkload
from extender.service import Extender
from extender.sim.schedulers import make_scheduler
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod


def k8s_default_server_with_half_a_gpu_free() -> Extender:
    e = Extender(policy="k8s-default")
    e.upsert_node(node_inventory(k8s_node("a", gpus=1)))
    e.mark_synced()
    e.upsert_pod(pod_info(k8s_pod("half", milli=500, node="a", phase="Running",
                                  assignment={"node": "a", "gpus": [0], "milli": 500})))
    return e


def test_k8s_default_rounds_a_slice_to_a_whole_gpu_on_the_server_as_in_the_simulator():
    """Stock Kubernetes hands out whole GPUs: a 250-milli slice needs a GPU nobody holds any of.

    The simulator always rounded (Policy.request_for); the server's filter, prioritize and
    reserve did not, and admitted the slice onto the GPU with 500 milli free.
    """
    e = k8s_default_server_with_half_a_gpu_free()
    slice_pod = pod_info(k8s_pod("s", milli=250))
    outcome = e.filter(slice_pod, ["a"])
    assert outcome.passed == [] and "a" in outcome.failed
    assert e.gpu_view(slice_pod).passed == []
    # the simulator's verdict on the same state
    policy = make_policy("k8s-default", PolicyContext(TargetWorkload.from_pods([PodRequest("w", 1000, 1024, 1, 250)])))
    cluster = Cluster([NodeSpec("a", 32_000, 131_072, 1, "T4")])
    cluster.place(PodRequest("half", 1000, 1024, 1, 500), "a", (0,))
    kube = make_scheduler("kube", cluster, policy, 42)
    assert kube.choose(kube.placer.request_for(slice_pod.request)) is None


def test_k8s_default_reserves_a_whole_gpu_for_a_slice():
    e = Extender(policy="k8s-default")
    e.upsert_node(node_inventory(k8s_node("a", gpus=2)))
    e.mark_synced()
    e.upsert_pod(pod_info(k8s_pod("s", milli=250)))
    assignment, _ = e.reserve("uid-s", "ml/s", "a")
    assert assignment.milli == 1000 and e.cluster.by_name["a"].gpu_free == [0, 1000]


def test_k8s_default_admits_a_gang_of_slices_only_where_each_gets_a_whole_gpu():
    """Gang admission packs the members as the policy accounts them: three slices need three GPUs under k8s-default."""
    for policy, fits in (("k8s-default", False), ("fgd", True)):
        e = Extender(policy=policy)
        e.upsert_node(node_inventory(k8s_node("a", gpus=2)))
        e.mark_synced()
        for i in range(3):
            e.upsert_pod(pod_info(slice_gang_pod(f"g-{i}", "trio", 3, milli=250)))
        outcome = e.filter(pod_info(slice_gang_pod("g-2", "trio", 3, milli=250)), ["a"])
        assert (outcome.passed == ["a"]) is fits, policy
        assert (len(e.cluster.assignments) == 3) is fits, policy  # admitted: every member holds its share
        if not fits:  # 3 whole GPUs of the 2 there are: preemption cannot help either
            assert "needs 3 GPUs for the 3 members still to place; the cluster has 2" in outcome.unresolvable["a"]


def slice_gang_pod(name: str, gang: str, size: int, milli: int) -> dict:
    pod = k8s_pod(name, milli=milli)
    pod["metadata"]["annotations"].update({"tessera.dev/gang-name": gang, "tessera.dev/gang-size": str(size)})
    return pod


def test_kube_choice_draws_only_among_equal_totals_and_not_for_a_single_node():
    """One node left after filter is taken without a draw, so the server and a replay keep one tie stream."""
    from extender.core.kube_choice import KubeChoice

    cluster = Cluster([NodeSpec(f"n{i}", 32_000, 131_072, 4, "T4") for i in range(4)])
    request = PodRequest("p", 1000, 1024, 1, 1000)
    fresh, used = KubeChoice(seed=5), KubeChoice(seed=5)
    assert used.pick(request, cluster.nodes[:1], [3]) == 0
    assert used.rng.getstate() == fresh.rng.getstate()
    # one extender level outweighs kube's plugins (weight 100: 1000 per level, 200 at most from the plugins)
    assert used.pick(request, cluster.nodes, [9, 10, 9, 9]) == 1
    draws = {KubeChoice(seed=s).pick(request, cluster.nodes, [10, 10, 10, 7]) for s in range(40)}
    assert draws == {0, 1, 2}  # equal totals (identical nodes): drawn among them, never the lower one


def test_every_placer_entry_refuses_a_request_the_policy_has_not_accounted():
    """The server once skipped the k8s-default transform at one call site and admitted a slice stock Kubernetes
    would not; now a bare PodRequest is a TypeError at whichever placer method it reaches (issue 36 item 5)."""
    policy = make_policy("k8s-default", PolicyContext(TargetWorkload.from_pods([PodRequest("w", 1000, 1024, 1, 250)])))
    cluster = Cluster([NodeSpec("a", 32_000, 131_072, 2, "T4")])
    placer = Placer(cluster, policy)
    bare = PodRequest("s", 1000, 1024, 1, 250)
    node = cluster.nodes[0]
    for call in (lambda r: placer.view(r), lambda r: placer.fits(r, node), lambda r: placer.feasible(r),
                 lambda r: placer.split(r, ["a"]), lambda r: placer.extender_scores(r, ["a"]),
                 lambda r: placer.best_first(r), lambda r: placer.choose(r), lambda r: placer.never_fits(r, "a")):
        with pytest.raises(TypeError, match="Placer.request_for"):
            call(bare)
    accounted = placer.request_for(bare)
    assert accounted.gpu_milli == 1000 and placer.split(accounted, ["a"]) == (["a"], [])  # a whole GPU, as stock Kubernetes


def test_only_the_placer_makes_an_accounted_request():
    """The type is only a guard if nothing else builds one: no `AccountedRequest(` outside core/placer.py."""
    root = Path(__file__).resolve().parents[1]
    def calls(path: Path) -> bool:
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "AccountedRequest"
                   for n in ast.walk(ast.parse(path.read_text())))

    makers = sorted(str(p.relative_to(root)) for package in ("extender", "gpu_sharing", "raybridge", "bench")
                    for p in (root / package).rglob("*.py") if calls(p))
    assert makers == ["extender/core/placer.py"]
