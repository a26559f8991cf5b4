"""The per-shape verdict index must always say what judging every node afresh would say."""

import random

import pytest

from extender.core.cluster import Cluster, PlacementError, never_fits
from extender.core.policy import PolicyContext, make_policy
from extender.core.shape_index import ShapeIndex
from extender.core.workload import TargetWorkload, TaskType

from .conftest import node, pod

MIX = TargetWorkload(((TaskType(1000, 250, 1), 0.3), (TaskType(1000, 500, 1), 0.3), (TaskType(4000, 1000, 1), 0.2),
                (TaskType(8000, 1000, 2), 0.2)))
SHAPES = [pod("s1", 1, 250), pod("s2", 1, 500), pod("w1", 1, 1000, cpu=4000), pod("w2", 2, 1000, cpu=8000),
          pod("t4only", 1, 500, models=("T4",)), pod("big", 4, 1000)]


def fresh(policy, cluster, request):
    fit, unfit = {}, {}
    for n in cluster.nodes:
        reason = policy.filter(request, n)
        if reason is None:
            fit[n.name] = policy.score(request, n)
        else:
            unfit[n.name] = (f"tessera: {reason}", never_fits(request, n.spec))
    return fit, unfit


@pytest.mark.parametrize(("policy_name", "min_log"), [("tessera", 4096), ("fgd", 4096), ("bestfit", 4096), ("bestfit", 8)])
def test_views_match_a_fresh_judgement_through_random_changes(policy_name, min_log):
    rng = random.Random(3)
    cluster = Cluster([node(f"n{i}", gpus=rng.choice([2, 4]), model=rng.choice(["T4", "V100"])) for i in range(12)])
    policy = make_policy(policy_name, PolicyContext(MIX))
    # fewer views than shapes: eviction is exercised too; a short change log: views fall off it
    index = ShapeIndex(cluster, policy, max_views=4, min_log=min_log)
    placed, serial = [], 0
    for step in range(400):
        action = rng.random()
        if action < 0.55:
            request = rng.choice(SHAPES)
            fit = index.view(request).fit
            if fit:
                name = rng.choice(sorted(fit))
                serial += 1
                p = pod(f"p{serial}", request.gpu_count, request.gpu_milli, cpu=request.cpu_milli, models=request.gpu_models)
                gpus = policy.score(p, cluster.by_name[name]).gpus or policy.pick_gpus(p, cluster.by_name[name])
                placed.append(cluster.place(p, name, gpus).pod)
        elif action < 0.85 and placed:
            cluster.release(placed.pop(rng.randrange(len(placed))))
        elif action < 0.93:
            cluster.add_node(node(f"m{step}", gpus=rng.choice([1, 8]), model=rng.choice(["T4", "A100"])))
        else:
            victim = rng.choice(cluster.nodes).name
            gone = {a.pod for a in cluster.remove_node(victim)}
            placed = [p for p in placed if p not in gone]
        request = rng.choice(SHAPES)
        view = index.view(request)
        fit, unfit = fresh(policy, cluster, request)
        assert view.fit == fit, f"step {step}"
        assert {n: (r, index.never_fits(request, n)) for n, r in view.unfit.items()} == unfit, f"step {step}"
        assert not view.dirty


def test_a_removed_node_leaves_every_view():
    cluster = Cluster([node("a"), node("b")])
    index = ShapeIndex(cluster, make_policy("tessera", PolicyContext(MIX)))
    assert set(index.view(SHAPES[0]).fit) == {"a", "b"}
    cluster.remove_node("a")
    assert set(index.view(SHAPES[0]).fit) == {"b"} and not index.view(SHAPES[0]).unfit
    with pytest.raises(PlacementError):
        cluster.place(SHAPES[0], "a", (0,))
