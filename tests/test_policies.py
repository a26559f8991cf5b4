"""Each policy's choice on small clusters, worked out by hand."""

import pytest

from extender.core.policy import PolicyContext, make_policy, policy_names
from extender.core.workload import TargetWorkload, TaskType
from extender.sim.schedulers import IdealScheduler

from .conftest import cluster, node, pod

WL = TargetWorkload(((TaskType(2000, 500, 1), 0.5), (TaskType(4000, 1000, 1), 0.5)))


def choose(policy_name, c, p, seed=0):
    policy = make_policy(policy_name, PolicyContext(WL, seed))
    sched = IdealScheduler(c, policy, seed)
    sched.order = list(c.nodes)  # a known tie order: node list order
    choice = sched.choose(sched.placer.request_for(p))
    return None if choice is None else (choice.node.name, choice.gpus)


def half_used():
    """n-fresh: untouched 2-GPU node; n-half: GPU 0 has 500 free; listed fresh first."""
    c = cluster(node("n-fresh"), node("n-half"))
    c.place(pod("existing", 1, 500), "n-half", (0,))
    return c


def test_every_policy_is_registered():
    assert set(policy_names()) >= {"fgd", "bestfit", "dotprod", "packing", "clustering", "random", "k8s-default", "tessera"}
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", PolicyContext(WL))


@pytest.mark.parametrize("name", ["fgd", "tessera", "bestfit", "packing", "clustering"])
def test_a_slice_fills_the_half_used_gpu(name):
    # a 500 slice on the 500-free GPU leaves no fragment; on a fresh GPU it would leave 500
    assert choose(name, half_used(), pod("s", 1, 500)) == ("n-half", (0,))


def test_fgd_picks_the_gpu_that_grows_fragmentation_least():
    c = cluster(node("n", gpus=3))
    c.place(pod("a", 1, 300), "n", (0,))  # GPU0: 700 free
    c.place(pod("b", 1, 600), "n", (1,))  # GPU1: 400 free
    # a 400 slice: on GPU1 it leaves 0 (fragment falls by 400*...); on GPU0 it leaves 300
    assert choose("fgd", c, pod("s", 1, 400)) == ("n", (1,))


def test_dotprod_prefers_the_least_free_capacity_along_the_demand():
    c = cluster(node("big", gpus=8, cpu=96_000), node("small", gpus=2, cpu=32_000))
    assert choose("dotprod", c, pod("w", 1)) == ("small", (0,))


def test_bestfit_prefers_the_node_left_fullest():
    c = cluster(node("big", gpus=8, cpu=96_000), node("small", gpus=2, cpu=32_000))
    assert choose("bestfit", c, pod("w", 1)) == ("small", (0,))


def test_packing_prefers_used_nodes_for_whole_gpus():
    c = cluster(node("fresh", gpus=2), node("used", gpus=4))
    c.place(pod("x", 1), "used", (0,))
    assert choose("packing", c, pod("w", 1)) == ("used", (1,))


def test_clustering_keeps_shapes_together():
    c = cluster(node("slices", gpus=2), node("wholes", gpus=2))
    c.place(pod("x", 1, 300), "slices", (0,))
    c.place(pod("y", 1), "wholes", (0,))
    assert choose("clustering", c, pod("w", 1))[0] == "wholes"
    assert choose("clustering", c, pod("s", 1, 200))[0] == "slices"


def test_k8s_default_rounds_a_slice_up_to_a_whole_gpu_and_spreads():
    c = cluster(node("busy", gpus=2), node("idle", gpus=2))
    c.place(pod("x", 1, 1000, cpu=16_000), "busy", (0,))
    policy = make_policy("k8s-default", PolicyContext(WL))
    assert policy.request_for(pod("s", 1, 250)).gpu_milli == 1000
    assert choose("k8s-default", c, pod("s", 1, 250)) == ("idle", (0,))


def test_random_is_seeded():
    c = cluster(*(node(f"n{i}") for i in range(20)))
    picks = {choose("random", c, pod("s", 1, 100), seed=s) for s in range(8)}
    assert len(picks) > 1
    assert choose("random", c, pod("s", 1, 100), seed=3) == choose("random", c, pod("s", 1, 100), seed=3)


@pytest.mark.parametrize("name", ["fgd", "tessera", "bestfit", "dotprod", "packing", "clustering", "random", "k8s-default"])
def test_every_policy_respects_models_and_capacity(name):
    c = cluster(node("p100", gpus=2, model="P100"), node("t4", gpus=1, model="T4"))
    assert choose(name, c, pod("m", 1, 1000, models={"P100"}))[0] == "p100"
    assert choose(name, c, pod("m", 2, models={"T4"})) is None
    assert choose(name, c, pod("huge", 1, cpu=10**9)) is None


@pytest.mark.parametrize("name", policy_names())
def test_extender_scores_are_ints_from_0_to_10(name):
    # kube-scheduler decodes Score as int64: a float (5.0) fails the whole prioritize call
    policy = make_policy(name, PolicyContext(WL))
    c = half_used()
    p = pod("s", 1, 500)
    verdicts = [policy.score(p, n) for n in c.nodes if policy.filter(p, n) is None]
    scores = policy.extender_scores(verdicts)
    assert len(scores) == len(verdicts) == 2
    assert all(type(s) is int and 0 <= s <= 10 for s in scores)
