"""filter and prioritize's fast path (placer.split, Placer.extender_scores over a shape's Ranking, filter's
answer reused by prioritize) must answer what judging every node afresh answers, and never serve a stale one."""

import random

import pytest

from extender.core.cluster import Cluster
from extender.core.placer import Placer
from extender.core.policy import MAX_EXTENDER_SCORE, PolicyContext, make_policy
from extender.core.shape_index import Ranking
from extender.http import wire
from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod

from .conftest import node, pod
from .test_shape_index import MIX, SHAPES


def tessera_rule(verdicts):
    """Tessera's extender scores as specified (docs, policies/tessera.py): 10 for the first best verdict,
    then 9 for its bin and one less per bin below, never under 0."""
    if not verdicts:
        return []
    values = [v.value for v in verdicts]
    top = values.index(max(values))
    out = [max(0, MAX_EXTENDER_SCORE - 1 - (values[top][0] - v[0])) for v in values]
    out[top] = MAX_EXTENDER_SCORE
    return out


def judged_afresh(policy, cluster, request, names):
    """(names that fit, their extender scores) from a fresh judgement of every named node."""
    fitting = [n for n in names if n in cluster.by_name and policy.filter(request, cluster.by_name[n]) is None]
    verdicts = [policy.score(request, cluster.by_name[n]) for n in fitting]
    rule = tessera_rule if policy.name == "tessera" else policy.extender_scores
    return fitting, rule(verdicts)


def asked(rng, cluster, fit_now):
    """A name list as kube-scheduler might send it: all nodes, filter's survivors, or a shuffled part with strangers."""
    names = [n.name for n in cluster.nodes]
    kind = rng.random()
    if kind < 0.3:
        return names
    if kind < 0.6:
        return [n for n in names if n in fit_now]
    part = rng.sample(names, rng.randint(0, len(names))) + ["no-such-node"] * rng.randint(0, 1)
    rng.shuffle(part)
    return part


def change(rng, cluster, policy, placed, step):
    action = rng.random()
    if action < 0.5:
        request = rng.choice(SHAPES)
        fits = [n for n in cluster.nodes if policy.filter(request, n) is None]
        if fits:
            target = rng.choice(fits)
            p = pod(f"p{step}", request.gpu_count, request.gpu_milli, cpu=request.cpu_milli, models=request.gpu_models)
            placed.append(cluster.place(p, target.name, policy.score(p, target).gpus or policy.pick_gpus(p, target)).pod)
    elif action < 0.8 and placed:
        cluster.release(placed.pop(rng.randrange(len(placed))))
    elif action < 0.9:
        cluster.add_node(node(f"m{step}", gpus=rng.choice([1, 4, 8]), model=rng.choice(["T4", "A100"])))
    elif len(cluster.nodes) > 2:
        gone = {a.pod for a in cluster.remove_node(rng.choice(cluster.nodes).name)}
        placed[:] = [p for p in placed if p not in gone]


@pytest.mark.parametrize("policy_name", ["tessera", "fgd", "bestfit"])
def test_split_and_extender_scores_match_a_fresh_judgement_on_random_clusters(policy_name):
    rng = random.Random(11)
    cluster = Cluster([node(f"n{i:02d}", gpus=rng.choice([2, 4, 8]), model=rng.choice(["T4", "V100"])) for i in range(24)])
    policy = make_policy(policy_name, PolicyContext(MIX))
    placer = Placer(cluster, policy, max_views=4)  # fewer views than shapes: rankings are dropped and rebuilt too
    placed: list[str] = []
    for step in range(500):
        change(rng, cluster, policy, placed, step)
        request = placer.request_for(rng.choice(SHAPES))
        fit_now = {n.name for n in cluster.nodes if policy.filter(request, n) is None}
        names = asked(rng, cluster, fit_now)
        fitting, rest = placer.split(request, names)
        assert fitting == [n for n in names if n in fit_now], f"step {step}"
        assert rest == [n for n in names if n not in fit_now], f"step {step}"
        # prioritize, as kube-scheduler calls it: filter's survivors (the reused answer), or a part of them
        again = fitting if rng.random() < 0.7 else rng.sample(fitting, len(fitting) // 2)
        assert placer.extender_scores(request, again) == judged_afresh(policy, cluster, request, again), f"step {step}"


def test_the_best_node_is_found_below_missing_ones_and_a_shared_best_is_left_to_the_slow_path():
    ranking = Ranking({"a": 1, "b": 2, "c": 2}, [((1, -5), "a"), ((2, -4), "b"), ((2, -1), "c")])
    assert ranking.top_index(["a", "b", "c"]) == 2
    assert ranking.top_index(["b", "a"]) == 0  # c, the best, was not asked about: b is the best asked
    assert ranking.top_index(["a"]) == 0
    tied = Ranking({"a": 2, "b": 2}, [((2, -1), "a"), ((2, -1), "b")])
    assert tied.top_index(["a", "b"]) is None


def two_node_extender():
    e = Extender()
    for n in ("a", "b"):
        e.upsert_node(node_inventory(k8s_node(n, gpus=4)))
    e.mark_synced()
    return e


def afresh(e, info, names):
    fitting, scores = judged_afresh(e.policy, e.cluster, e.placer.request_for(info.request), names)
    out = dict.fromkeys(names, 0)
    out.update(zip(fitting, scores, strict=True))
    return list(out.items())


def bind_on_best(e, best):
    e.upsert_pod(pod_info(k8s_pod("x", gpus=4, node=best, phase="Running")))


def node_shrinks(e, best):
    e.upsert_node(node_inventory(k8s_node(best, gpus=4, cpu="500m")))  # the pod asks 1 CPU: it no longer fits


def node_goes(e, best):
    e.delete_node(best)


def reserve_on_best(e, best):
    e.upsert_pod(pod_info(k8s_pod("y", gpus=4, uid="uid-y")))
    e.reserve("uid-y", "ml/y", best)


@pytest.mark.parametrize("what", [bind_on_best, node_shrinks, node_goes, reserve_on_best])
def test_a_change_between_filter_and_prioritize_is_never_answered_from_filters_work(what):
    e = two_node_extender()
    info = pod_info(k8s_pod("p", milli=500))
    passed = e.filter(info, ["a", "b"]).passed
    before = dict(e.prioritize(info, passed))
    best = max(before, key=before.get)
    assert e.filter(info, ["a", "b"]).passed == passed
    what(e, best)
    after = list(e.prioritize(info, passed))
    assert after == afresh(e, info, passed)
    assert dict(after) != before  # the change moved the answer: a reused one would have been stale


@pytest.mark.parametrize("names", [["a", 1], ["a", None], [["a"]], [{"a": 1}], ["a", 1.5], [True]])
def test_node_names_that_are_not_all_strings_are_refused_in_words(names):
    with pytest.raises(wire.WireError, match="NodeNames: expected an array of strings"):
        wire.parse_extender_args({"Pod": {"metadata": {"name": "p", "uid": "u"}}, "NodeNames": names})


def test_string_node_names_are_taken_as_sent():
    for names in ([], ["a"], ["b", "a", "b", ""]):
        assert wire.parse_extender_args({"Pod": {"metadata": {"name": "p", "uid": "u"}}, "NodeNames": names}).node_names == names
