"""Run times as users declare them (extender/sim/declarations.py) and what time mode does with them (issue 37)."""

from __future__ import annotations

import random

import pytest

from extender.core.model import NodeSpec, PodRequest
from extender.core.run_history import RunHistory
from extender.core.short_first import ShortFirstSettings
from extender.sim.declarations import ROUND_VALUES_S, Declaration, DeclarationModel, declare_runs
from extender.sim.kubequeue import EVENTS_ONLY
from extender.sim.timemode import replay_time
from extender.sim.trace import TracePod

ONE_GPU = NodeSpec("n0", cpu_milli=64000, memory_mib=256 * 1024, gpu_count=1)


def runs(n: int, seed: int = 7, longest_s: float = 864_000) -> list[float]:
    """Run times spread like openb's (median minutes, a tail of days): log-uniform from 30 s to 10 days."""
    rng = random.Random(seed)
    return [30 * ((longest_s / 30) ** rng.random()) for _ in range(n)]


def test_users_declare_round_values_or_nothing_and_only_the_pods_stopped_run_less():
    trace = runs(20_000)
    drawn = declare_runs(trace, "users", seed=42)
    silent = [d for d in drawn if d.declared_s is None]
    assert 0.38 < len(silent) / len(drawn) < 0.45  # the 40% who write none, plus runs longer than every value
    for run, d in zip(trace, drawn, strict=True):
        if d.declared_s is not None:
            assert d.declared_s in ROUND_VALUES_S
        if d.stopped:  # the kubelet stops it at its deadline: it runs what it declared, less than it needed
            assert d.run_s == d.declared_s < run
        else:
            assert d.run_s == run
            assert d.declared_s is None or d.declared_s >= run
    stopped = sum(d.stopped for d in drawn) / len(drawn)
    assert 0.04 < stopped < 0.07  # 10% of the 60% who declare, less those shorter than 5 minutes
    used = [d.run_s / d.declared_s for d in drawn if d.declared_s is not None and not d.stopped]
    assert sorted(used)[len(used) // 2] < 0.5  # most use a small part of what they declare
    longer = [d for r, d in zip(trace, drawn, strict=True) if r > ROUND_VALUES_S[-1] and d.declared_s is not None]
    assert longer and all(d.stopped for d in longer)  # no value long enough: only those who declare too little write one


def test_draws_depend_on_the_seed_alone_and_exact_declares_each_run():
    trace = runs(500)
    assert declare_runs(trace, "users", 42) == declare_runs(trace, "users", 42)
    assert declare_runs(trace, "users", 42) != declare_runs(trace, "users", 43)
    assert declare_runs(trace, "exact", 42) == [Declaration(r, r) for r in trace]


@pytest.mark.parametrize("kwargs, words", [
    ({"silent": 1.5}, "silent is a share"), ({"at_limit": -0.1}, "at_limit is a share"),
    ({"at_limit": 0.6, "largest": 0.6}, "more than every declaring user"),
    ({"values_s": (600.0, 300.0)}, "ascending"), ({"values_s": ()}, "ascending"),
])
def test_impossible_models_are_refused_in_words(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DeclarationModel(**kwargs)


def test_an_unknown_mode_is_refused_in_words():
    with pytest.raises(ValueError, match="'guess' is not one of users, exact"):
        declare_runs([60.0], "guess", 42)


def gpu_pod(name: str) -> TracePod:
    return TracePod(PodRequest(name, cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000))


def replay(stream, drawn, rule=None):
    """(name, arrival, run) on one 1-GPU node, the queue without kube's timers: waits worked out by hand."""
    return replay_time([ONE_GPU], [gpu_pod(n) for n, _, _ in stream], "tessera", scheduler="ideal", node_count=1,
                       timeline=[(a, r) for _, a, r in stream], timings=EVENTS_ONLY, short_first=rule,
                       declarations="users", drawn=drawn)


def test_a_pod_that_runs_into_its_deadline_is_stopped_there_and_counted():
    stream = [("a0", 0, 5000), ("a1", 10, 100)]
    honest = replay(stream, [Declaration(7200, 5000), Declaration(None, 100)])
    assert honest.wait_max_s == pytest.approx(4990) and honest.deadline_stopped == 0
    stopped = replay(stream, [Declaration(3600, 3600, stopped=True), Declaration(None, 100)])
    assert stopped.wait_max_s == pytest.approx(3590) and stopped.deadline_stopped == 1


def test_the_queue_rules_read_the_declaration_not_the_run():
    # a0 holds the GPU until 100; a1 (a run of 7,200 s, declared so) is older than a2 (60 s). With shortest runs
    # first a2 goes ahead of a1 only if it declares its short run: the same 60 s undeclared is a long run.
    stream = [("a0", 0, 100), ("a1", 1, 7200), ("a2", 2, 60)]
    rule = ShortFirstSettings(waiting=0, run_s=3600, max_hold_s=86_400)
    declared = replay(stream, [Declaration(100, 100), Declaration(7200, 7200), Declaration(600, 60)], rule)
    assert declared.classes["1gpu"].max_s == pytest.approx(159)  # a1 starts at 160, after a2's run
    silent = replay(stream, [Declaration(100, 100), Declaration(7200, 7200), Declaration(None, 60)], rule)
    assert silent.classes["1gpu"].max_s == pytest.approx(7298)  # a2 starts at 7,300, after a1's run


def test_a_replay_with_users_declarations_stops_some_pods_and_exact_none():
    stream = [(f"p{i:03d}", i * 600.0, r) for i, r in enumerate(runs(200, seed=3, longest_s=7200))]
    pods = [gpu_pod(n) for n, _, _ in stream]
    timeline = [(a, r) for _, a, r in stream]
    users = replay_time([ONE_GPU], pods, "tessera", node_count=1, timeline=timeline, seed=5, declarations="users",
                        timings=EVENTS_ONLY)
    exact = replay_time([ONE_GPU], pods, "tessera", node_count=1, timeline=timeline, seed=5, declarations="exact",
                        timings=EVENTS_ONLY)
    expected = sum(d.stopped for d in declare_runs([r for _, _, r in stream], "users", 5))
    assert users.deadline_stopped == expected > 0 and exact.deadline_stopped == 0
    assert users.as_json()["declarations"] == "users"


# --- a silent pod's run estimated from its like's finished runs (core/run_history.py) --------------

def test_run_history_estimates_only_with_enough_runs_on_record_and_from_the_recent_ones():
    h = RunHistory(window=4, min_runs=3, quantile=0.75)
    h.finished("k", 10)
    h.finished("k", 20)
    assert h.estimate("k", 0.0) is None and h.estimate("other", 0.0) is None
    h.finished("k", 30)
    assert h.estimate("k", 0.0) == 30  # the run 75% of the recent ones finished within
    for _ in range(4):  # the shape's work changed: four long runs push the short ones out of the window
        h.finished("k", 9000)
    assert h.estimate("k", 0.0) == 9000


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"min_runs": 0}, {"min_runs": 60}, {"quantile": 0}, {"quantile": 1.5},
                                    {"max_keys": 0}])
def test_impossible_run_histories_are_refused_in_words(kwargs):
    with pytest.raises(ValueError, match="run history"):
        RunHistory(**kwargs)


def test_a_silent_pod_counts_as_short_when_pods_like_it_ran_short():
    # ten silent 1-GPU pods of 10 s each go first (p00-p09): their shape's history. Then q0 holds the GPU until 300,
    # q1 declares a long run and is older than q2, which is silent and runs 60 s.
    stream = [(f"p{k:02d}", 20.0 * k, 10) for k in range(10)] + [("q0", 200, 100), ("q1", 201, 7200), ("q2", 202, 60)]
    drawn = [Declaration(None, 10)] * 10 + [Declaration(100, 100), Declaration(7200, 7200), Declaration(None, 60)]
    estimated = replay(stream, drawn, ShortFirstSettings(waiting=0, estimate_silent=True))
    assert estimated.classes["1gpu"].max_s == pytest.approx(159)  # q1 starts at 360, after q2 (300-360)
    long = replay(stream, drawn, ShortFirstSettings(waiting=0))  # silent means long: q1 goes first
    assert long.classes["1gpu"].max_s == pytest.approx(7298)


def test_a_tenants_runs_never_estimate_another_tenants_silent_pod_in_time_mode():
    stream = [(f"p{k:02d}", 20.0 * k, 10) for k in range(10)] + [("q0", 200, 100), ("q1", 201, 7200), ("q2", 202, 60)]
    drawn = [Declaration(None, 10)] * 10 + [Declaration(100, 100), Declaration(7200, 7200), Declaration(None, 60)]
    rule = ShortFirstSettings(waiting=0, estimate_silent=True)

    def run(tenants):
        return replay_time([ONE_GPU], [gpu_pod(n) for n, _, _ in stream], "tessera", scheduler="ideal", node_count=1,
                           timeline=[(a, r) for _, a, r in stream], timings=EVENTS_ONLY, short_first=rule,
                           declarations="users", drawn=drawn, tenants=tenants)

    same = run(["a"] * 13)
    assert same.classes["1gpu"].max_s == pytest.approx(159)  # as above: q2 estimated short by a's runs
    apart = run(["a"] * 12 + ["b"])  # q2 is b's: a's ten short runs say nothing of it, so it is long and waits
    assert apart.classes["1gpu"].max_s == pytest.approx(7298)
    assert apart.tenants["b"].pods == 1 and apart.tenants["b"].max_s == pytest.approx(7298)
    assert apart.as_json()["tenants"]["a"]["pods"] == 12 and "tenants" not in replay(stream, drawn).as_json()
    with pytest.raises(ValueError, match="one name per pod"):
        run(["a"])


def test_run_history_keeps_at_most_max_keys_dropping_the_least_recently_fed():
    h = RunHistory(window=2, min_runs=1, max_keys=2)
    h.finished("a", 1)
    h.finished("b", 2)
    h.finished("a", 3)  # a fed last: b is the one to go
    h.finished("c", 4)
    assert h.estimate("b", 0.0) is None and h.estimate("a", 0.0) == 3 and h.estimate("c", 0.0) == 4
