"""Shortest runs first (core/short_first.py, its time-mode replay and the server's short_first_queue.py; issue 14).

Time mode on hand-built streams whose waits are worked out by hand, and the real Extender fed as the
watch feeds it: pending pods with creationTimestamp and spec.activeDeadlineSeconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extender.core.backfill import BackfillSettings
from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest
from extender.core.short_first import MAX_CHECKS, MAX_SHAPES, ShortFirstSettings, contested
from extender.http.inspect import pod_reasons
from extender.service import Extender
from extender.sim.kubequeue import EVENTS_ONLY
from extender.sim.timemode import replay_time
from extender.sim.trace import TracePod
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod

from .test_queue_reservations import T0, iso
from .test_service import Clock

ONE_GPU = NodeSpec("n0", cpu_milli=64000, memory_mib=256 * 1024, gpu_count=1)


def gpu_pod(name: str, duration: float) -> TracePod:
    return TracePod(PodRequest(name, cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=1000), duration=duration)


def waits(rule: ShortFirstSettings | None, stream: list[tuple[str, float, float]], backfill=None) -> dict[str, float]:
    """The replay of a hand-built stream of (name, arrival, run) on one 1-GPU node. The queue without kube's timers
    (every parked pod retried in arrival order at each departure), so the waits can be worked out by hand."""
    pods = [gpu_pod(name, run) for name, _, run in stream]
    timeline = [(arrival, run) for _, arrival, run in stream]
    result = replay_time([ONE_GPU], pods, "tessera", scheduler="ideal", node_count=1, timeline=timeline,
                         short_first=rule, backfill=backfill, timings=EVENTS_ONLY)
    assert result.pods == len(stream) and result.never_fit == 0
    return result


# --- the rule ---------------------------------------------------------------------------------


def test_the_rule_holds_only_long_gpu_pods_behind_more_short_ones_than_its_bound_and_only_for_its_hold_bound():
    rule = ShortFirstSettings(waiting=2, run_s=600, max_hold_s=3600)
    gpu = PodRequest("p", cpu_milli=1000, memory_mib=1, gpu_count=1, gpu_milli=1000)
    cpu = PodRequest("c", cpu_milli=1000, memory_mib=1)
    assert rule.holds(gpu, None, 0, 3) and rule.holds(gpu, 601, 0, 3)  # undeclared or longer than the bound
    assert not rule.holds(gpu, None, 0, 2)  # not more short pods waiting than the bound
    assert not rule.holds(gpu, 600, 0, 30)  # a short pod is never held
    assert not rule.holds(cpu, None, 0, 30)  # nor a CPU-only pod
    assert not rule.holds(gpu, None, 3600, 30)  # nor one that has waited its hold bound
    assert rule.counts(gpu, 600, 3599) and not rule.counts(gpu, 600, 3600) and not rule.counts(cpu, 60, 0)
    assert "more than 2 GPU pods of at most 600 s" in rule.reason(600) and "3000 s left" in rule.reason(600)


@pytest.mark.parametrize("kwargs", [{"waiting": -1}, {"run_s": 0}, {"max_hold_s": -5}])
def test_impossible_settings_are_refused_in_words(kwargs):
    with pytest.raises(ValueError, match="shortest-runs-first"):
        ShortFirstSettings(**kwargs)


# --- time mode ----------------------------------------------------------------------------------

# One GPU, busy until t=100 with `first`. `long` (run 1000) arrives at 10, then three short pods (run 50)
# at 20, 30, 40. FIFO: long starts at 100 and the short ones at 1100, 1150, 1200.
STREAM = [("first", 0, 100), ("long", 10, 1000), ("s1", 20, 50), ("s2", 30, 50), ("s3", 40, 50)]


def test_without_the_rule_the_queue_is_first_come_first_served():
    result = waits(None, STREAM)
    assert result.short_first is None and "short_first" not in result.as_json()
    assert result.classes["1gpu"].max_s == pytest.approx(1160)  # s3: arrived at 40, started at 1200
    assert result.wait_mean_s == pytest.approx((0 + 90 + 1080 + 1120 + 1160) / 5)


def test_short_runs_go_first_while_more_of_them_wait_than_the_bound():
    # waiting=2: at t=100 three short pods wait, so long is held; s1 starts at 100 (two wait: long is no longer
    # held, but the GPU is busy), then at 150 long is tried before s2 (arrival order) and starts, ending at 1150.
    rule = ShortFirstSettings(waiting=2, run_s=60, max_hold_s=7200)
    result = waits(rule, STREAM)
    # first 0, s1 80 (100-20), long 140 (150-10), s2 1120 (1150-30), s3 1160 (1200-40)
    assert result.wait_mean_s == pytest.approx((0 + 80 + 140 + 1120 + 1160) / 5)
    assert result.short_first["attempts_held"] >= 1
    # waiting=0: every short pod goes first: s1 at 100, s2 at 150, s3 at 200, long at 250
    result = waits(ShortFirstSettings(waiting=0, run_s=60, max_hold_s=7200), STREAM)
    assert result.wait_mean_s == pytest.approx((0 + 80 + 120 + 160 + 240) / 5)


def test_a_long_pod_is_held_no_longer_than_the_hold_bound():
    # Short 600-milli slices (so only long and first are whole-GPU pods), one every 40 s from t=20 to 1980, each
    # running 50 s: they keep the GPU busy from 100 to 2600, one after another. Held without bound, long (arrived
    # at 10) starts at 2600; with a hold bound of 500 s it is held until t=510 and starts at the next departure, 550.
    def slice_pod(name, run):
        return TracePod(PodRequest(name, cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=600), duration=run)

    stream = [("first", 0, 100), ("long", 10, 1000)] + [(f"s{k}", 20 + 40 * k, 50) for k in range(50)]
    pods = [gpu_pod(n, r) for n, _, r in stream[:2]] + [slice_pod(n, r) for n, _, r in stream[2:]]

    def long_wait(max_hold_s):
        result = replay_time([ONE_GPU], pods, "tessera", scheduler="ideal", node_count=1,
                             timeline=[(a, r) for _, a, r in stream], timings=EVENTS_ONLY,
                             short_first=ShortFirstSettings(waiting=0, run_s=60, max_hold_s=max_hold_s))
        assert result.classes["1gpu"].pods == 2
        return result.classes["1gpu"].max_s

    assert long_wait(10_000) == pytest.approx(2590)
    assert long_wait(500) == pytest.approx(540)


def test_a_held_pod_takes_a_node_no_short_pod_fits_at_once():
    # n0 (64 cores) is busy until 100 with `first`; n1 has a GPU free but 2 cores. s1-s3 (4 cores, run 50) fit only
    # n0 and wait; `long` (1 core) arrives at 10, held (three short pods wait, bound 2), and goes to n1 at once: the
    # rule refuses it only the nodes where a short pod fits now (holding it everywhere, it waited until 100).
    def pod(name, cores, run):
        return TracePod(PodRequest(name, cpu_milli=cores * 1000, memory_mib=1024, gpu_count=1, gpu_milli=1000), run)

    nodes = [ONE_GPU, NodeSpec("n1", cpu_milli=2000, memory_mib=256 * 1024, gpu_count=1)]
    stream = [("first", 0, 100, 4), ("s1", 1, 50, 4), ("s2", 2, 50, 4), ("s3", 3, 50, 4), ("long", 10, 1000, 1)]
    result = replay_time(nodes, [pod(n, c, r) for n, _, r, c in stream], "tessera", scheduler="ideal", node_count=2,
                         timeline=[(a, r) for _, a, r, _ in stream], timings=EVENTS_ONLY,
                         short_first=ShortFirstSettings(waiting=2, run_s=60, max_hold_s=7200))
    # first 0; s1, s2, s3 start at 100, 150, 200 on n0; long 0
    assert result.wait_mean_s == pytest.approx((0 + 99 + 148 + 197 + 0) / 5)
    assert result.short_first["attempts_held"] == 0


def test_contested_reads_a_bounded_number_of_short_pod_shapes():
    node = Cluster([NodeSpec("n", cpu_milli=8000, memory_mib=8192, gpu_count=1)]).nodes[0]
    read = []

    def shorts():  # 10,000 distinct shapes asking more CPU than n has, then one that fits
        for k in range(10_000):
            read.append(k)
            yield PodRequest(f"s{k}", cpu_milli=9000 + k, memory_mib=1, gpu_count=1, gpu_milli=1000), None, 0
        yield PodRequest("fits", cpu_milli=1000, memory_mib=1, gpu_count=1, gpu_milli=1000), None, 0

    assert contested(shorts(), [node]) == set() and len(read) == MAX_SHAPES  # fewer read: fewer refused, never more
    fits = PodRequest("fits", cpu_milli=1000, memory_mib=1, gpu_count=1, gpu_milli=1000)
    assert contested([(fits, None, 0)], [node]) == {"n"}
    assert contested([(fits, lambda name: name != "n", 1)], [node]) == set()  # its constraints keep it off n


def test_contested_counts_what_a_short_pods_constraint_test_costs():
    """A tenant's short pods carrying the largest affinity the contract reads: each test of it weighs its lookups,
    so a filter makes a few of them, not thousands (counted as one step each, a padded affinity held the lock 12 s)."""
    nodes = Cluster([NodeSpec(f"n{i}", cpu_milli=8000, memory_mib=8192, gpu_count=1) for i in range(1000)]).nodes
    calls = []

    def never(name):
        calls.append(name)
        return False

    shapes = [(PodRequest(f"s{k}", cpu_milli=1000 + k, memory_mib=1, gpu_count=1, gpu_milli=1000), never, 127)
              for k in range(MAX_SHAPES)]
    assert contested(shapes, nodes) == set() and len(calls) == MAX_CHECKS // 129 + 1
    calls.clear()
    assert contested([(r, go, 0) for r, go, _ in shapes], nodes) == set() and len(calls) == MAX_CHECKS // 2


def test_a_pod_of_a_reserving_class_is_never_held():
    rule = ShortFirstSettings(waiting=0, run_s=60, max_hold_s=7200)
    backfill = BackfillSettings(wait_bound_s={1: 0.0}, max_share=1.0)
    result = waits(rule, STREAM, backfill=backfill)
    assert result.short_first["attempts_held"] == 0


# --- the server -----------------------------------------------------------------------------------
#
# Node a has two GPUs, one held by `r` (priority 0). Three short GPU pods wait (activeDeadlineSeconds 300), each
# refused by kube-scheduler for want of a GPU before the second one freed, and `long` (no deadline): with waiting=2,
# more than two short pods wait and one of them fits a now, so long is refused a.

RULE = ShortFirstSettings(waiting=2, run_s=600, max_hold_s=3600)


NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."  # kube-scheduler's refusal while a's GPU is taken


def gpu_pending(name, deadline=None, created=T0 - 60, priority=None, refusal=NO_GPU, ann=None, gpus=1, cpu="1"):
    pod = k8s_pod(name, gpus=gpus, ann=ann, cpu=cpu)
    pod["metadata"]["creationTimestamp"] = iso(created)
    if deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = deadline
    if priority is not None:
        pod["spec"]["priority"] = priority
    if refusal:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": refusal}]
    return pod


def server(rule=RULE, shorts=("s1", "s2", "s3"), short_priority=None, backfill=None, gpus=2):
    clock = Clock()
    clock.now = T0
    ext = Extender(short_first=rule, backfill=backfill, wall_clock=clock)
    ext.upsert_node(node_inventory(k8s_node("a", gpus=gpus)))
    ext.upsert_pod(pod_info(k8s_pod("r", gpus=1, node="a", phase="Running",
                                    assignment={"node": "a", "gpus": [0], "milli": 1000})))
    for name in shorts:
        ext.upsert_pod(pod_info(gpu_pending(name, deadline=300, priority=short_priority)))
    ext.upsert_pod(pod_info(gpu_pending("long")))
    ext.mark_synced()
    return ext, clock


def held(ext, pod=None):
    """Whether filter refuses the pod node a, where it would fit, for shorter runs."""
    outcome = ext.filter(pod_info(pod or gpu_pending("long")), ["a"])
    reason = outcome.unresolvable.get("a", "")
    return "held for shorter runs" in reason and not outcome.passed and not outcome.failed


def test_a_long_gpu_pod_is_held_unresolvable_in_words_while_more_short_ones_wait_than_the_bound():
    ext, _ = server()
    outcome = ext.filter(pod_info(gpu_pending("long")), ["a"])
    assert outcome.passed == [] and outcome.failed == {}
    assert "more than 2 GPU pods of at most 600 s (spec.activeDeadlineSeconds) wait" in outcome.unresolvable["a"]
    assert ext.filter(pod_info(gpu_pending("s1", deadline=300)), ["a"]).passed == ["a"]  # a short pod is judged as ever


def test_a_held_pod_is_refused_only_the_nodes_where_a_short_pod_fits_now():
    ext, _ = server(shorts=())
    ext.upsert_node(node_inventory(k8s_node("b", gpus=1, cpu="2")))  # a GPU free, too few cores for the short pods
    for name in ("s1", "s2", "s3"):
        ext.upsert_pod(pod_info(gpu_pending(name, deadline=300, cpu="4")))
    outcome = ext.filter(pod_info(gpu_pending("long")), ["a", "b"])
    assert outcome.passed == ["b"] and list(outcome.unresolvable) == ["a"]
    assert "held for shorter runs" in outcome.unresolvable["a"]


def test_short_pods_that_fit_nowhere_now_hold_no_long_pod_off_a_free_gpu():
    # A tenant keeps 25 short 8-GPU pods waiting (they fit an empty 8-GPU node, refused for room: they count); another
    # tenant's long 1-GPU pod still takes a's free GPU, which none of them could use.
    ext, _ = server(shorts=())
    ext.upsert_node(node_inventory(k8s_node("big", gpus=8)))
    ext.upsert_pod(pod_info(k8s_pod("busy", gpus=8, node="big", phase="Running",
                                    assignment={"node": "big", "gpus": list(range(8)), "milli": 1000})))
    for k in range(25):
        ext.upsert_pod(pod_info(gpu_pending(f"hog{k}", deadline=300, gpus=8)))
    assert ext.short_first.counted() == 25 and ext.held_for_shorter_runs(pod_info(gpu_pending("long")))
    assert ext.filter(pod_info(gpu_pending("long")), ["a", "big"]).passed == ["a"]


def test_short_pods_count_only_where_their_refusal_and_constraints_can_be_weighed_node_by_node():
    # `free` has a GPU free and no taint; the short pods below could never use it, so long must not be refused it.
    def offered(*shorts, node_a=None):
        ext, _ = server(shorts=())
        if node_a is not None:
            ext.upsert_node(node_inventory(node_a))
        ext.upsert_node(node_inventory(k8s_node("free", gpus=1)))
        for pod in shorts:
            ext.upsert_pod(pod_info(pod))
        return ext, ext.filter(pod_info(gpu_pending("long")), ["a", "free"])

    storage = []
    for k in range(3):  # refused for ephemeral storage, which Tessera does not count: they do not count at all
        pod = gpu_pending(f"big{k}", deadline=300, refusal="0/2 nodes are available: 2 Insufficient ephemeral-storage.")
        pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "1Pi"
        storage.append(pod)
    ext, outcome = offered(*storage)
    assert ext.short_first.counted() == 0 and outcome.passed == ["a", "free"]
    zoned = k8s_node("a", gpus=2)
    zoned["metadata"]["labels"]["zone"] = "z0"
    pinned = []
    for k in range(3):  # pinned to a by a node selector: they count, and contest a alone
        pod = gpu_pending(f"pin{k}", deadline=300, refusal="0/2 nodes are available: 1 Insufficient nvidia.com/gpu, "
                                                            "1 node(s) didn't match node selector.")
        pod["spec"]["nodeSelector"] = {"zone": "z0"}
        pinned.append(pod)
    ext, outcome = offered(*pinned, node_a=zoned)
    assert ext.short_first.counted() == 3 and outcome.passed == ["free"] and list(outcome.unresolvable) == ["a"]


def test_a_short_pod_does_not_contest_a_node_whose_taint_it_does_not_tolerate():
    ext, _ = server(shorts=())
    tainted = k8s_node("b", gpus=1)
    tainted["spec"] = {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}
    ext.upsert_node(node_inventory(tainted))
    for name in ("s1", "s2", "s3"):
        ext.upsert_pod(pod_info(gpu_pending(name, deadline=300)))
    long = gpu_pending("long")
    long["spec"]["tolerations"] = [{"key": "team", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]
    ext.upsert_pod(pod_info(long))
    outcome = ext.filter(pod_info(long), ["a", "b"])
    assert outcome.passed == ["b"] and list(outcome.unresolvable) == ["a"]


def test_the_shapes_read_are_the_highest_priority_first_and_a_pod_seen_again_keeps_its_place(monkeypatch):
    import extender.core.short_first as core

    monkeypatch.setattr(core, "MAX_SHAPES", 1)  # one shape read: which one is the order's
    ext, _ = server(shorts=())
    odd = gpu_pending("odd", deadline=300, cpu="32")  # fits an empty a, not a now (r takes one of its 32 cores)
    ext.upsert_pod(pod_info(odd))
    ext.upsert_pod(pod_info(gpu_pending("s1", deadline=300, priority=10)))  # fits a now, higher priority: read first
    ext.upsert_pod(pod_info(gpu_pending("s2", deadline=300)))
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300)))
    ext.upsert_pod(pod_info(gpu_pending("s4", deadline=300)))
    assert ext.short_first.counted() == 5 and held(ext)
    ext.delete_pod("uid-s1")
    assert not held(ext)  # the odd shape began to wait first: it is the one read, and fits nowhere now
    ext.upsert_pod(pod_info(odd))  # seen again: it keeps its place ahead of s2's shape
    assert ext.short_first.counted() == 4 and not held(ext)
    ext.delete_pod("uid-odd")
    assert held(ext)  # s2's shape is read now, and fits a


def test_no_pod_is_held_with_the_rule_off_or_when_few_short_pods_wait():
    assert not held(server(rule=None)[0])
    ext, _ = server(shorts=("s1", "s2"))
    assert not held(ext)
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300)))
    assert held(ext)
    ext.delete_pod("uid-s3")
    assert not held(ext)


def test_short_pods_that_wait_for_a_constraint_or_past_the_hold_bound_do_not_count():
    ext, clock = server(shorts=("s1", "s2"))
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300,
                                        refusal="0/1 nodes are available: 1 node(s) didn't match node selector.")))
    assert not held(ext)  # s3 waits for a label no freed GPU brings
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300)))
    assert held(ext)
    clock.now = T0 - 60 + 3600  # every pod has waited the hold bound: shorts stop counting, long is held no more
    assert not held(ext)


def test_a_long_pod_is_held_no_longer_than_the_hold_bound_and_only_behind_pods_of_its_priority():
    ext, clock = server()
    clock.now = T0 + 3000  # long waited 3060 s of its 3600: the short pods too, so they still count
    assert held(ext)
    ext.upsert_pod(pod_info(gpu_pending("long", created=T0 - 3600)))
    assert not held(ext)
    ext, _ = server()
    ext.upsert_pod(pod_info(gpu_pending("long", priority=100)))
    assert not held(ext, gpu_pending("long", priority=100))  # the short pods are of priority 0


def test_the_run_and_the_wait_are_read_from_the_watched_pod_never_the_verbs_body():
    ext, _ = server()
    assert held(ext, gpu_pending("long", deadline=60, created=T0 - 100_000))  # the body's claims change nothing
    assert not held(ext, gpu_pending("unwatched"))  # a pod the watch has not delivered is judged as ever
    ext.upsert_pod(pod_info(gpu_pending("long", deadline=True)))  # not an integer: no deadline, still long
    assert held(ext)
    ext.upsert_pod(pod_info(gpu_pending("long", deadline=600)))  # a deadline within the run bound: short
    assert not held(ext)


def test_nothing_is_preempted_for_a_held_pod():
    ext, _ = server(short_priority=100, gpus=1)  # a's one GPU is r's: no pod fits, the rule still holds long
    pod = gpu_pending("long", priority=100)
    ext.upsert_pod(pod_info(pod))
    ext.filter(pod_info(pod), ["a"])
    assert ext.held_for_shorter_runs(pod_info(pod)) and ext.plan_preemption(pod_info(pod)) is None
    free, _ = server(rule=None, gpus=1)
    free.upsert_pod(pod_info(pod))
    free.filter(pod_info(pod), ["a"])  # kube-scheduler offered it node a
    plan = free.plan_preemption(pod_info(pod))  # without the rule, r (priority 0) would be evicted for it
    assert plan is not None and list(plan.victims.values()) == ["ml/r"]


def test_a_held_pod_may_preempt_where_no_short_pod_could_use_the_room():
    # The short pods waiting ask 8 GPUs: emptying a (one GPU) could never serve them, so Tessera may evict r there for
    # long (priority 100) though the rule holds long; where a short pod could use the emptied node it still may not.
    ext, _ = server(shorts=(), gpus=1)
    ext.upsert_node(node_inventory(k8s_node("big", gpus=8)))
    ext.upsert_pod(pod_info(k8s_pod("busy", gpus=8, node="big", phase="Running",
                                    assignment={"node": "big", "gpus": list(range(8)), "milli": 1000})))
    for k in range(3):
        ext.upsert_pod(pod_info(gpu_pending(f"hog{k}", deadline=300, gpus=8, priority=100)))
    pod = gpu_pending("long", priority=100)
    ext.upsert_pod(pod_info(pod))
    ext.filter(pod_info(pod), ["a"])  # kube-scheduler offered it a
    assert ext.held_for_shorter_runs(pod_info(pod))
    plan = ext.plan_preemption(pod_info(pod))
    assert plan is not None and plan.node == "a" and list(plan.victims.values()) == ["ml/r"]
    assert ext.preempt(pod_info(pod), {"a": ["uid-r"]}) == {"a": ["uid-r"]}
    ext.upsert_pod(pod_info(gpu_pending("s1", deadline=300, priority=100)))  # a one-GPU short pod could use a emptied
    assert ext.plan_preemption(pod_info(pod)) is None and ext.preempt(pod_info(pod), {"a": ["uid-r"]}) == {}


def test_a_pod_of_a_reserving_class_is_never_held_by_the_server():
    ext, _ = server(backfill=BackfillSettings(wait_bound_s={1: 600.0}))
    assert not held(ext)


def test_inspect_says_a_held_pod_waits_for_shorter_runs_and_how_long_it_may_be_held():
    ext, clock = server()
    clock.now = T0 + 540  # long has waited 600 s of its 3600
    why = pod_reasons(ext, "ml/long")["why"]
    assert why.startswith("held for shorter runs: more than 2 GPU pods of at most 600 s") and "3000 s left" in why
    assert "held for shorter runs" not in pod_reasons(ext, "ml/s1")["why"]


def test_the_time_table_says_the_rule_and_how_often_it_held_a_pod():
    from extender.sim.report import time_table

    table = time_table([waits(ShortFirstSettings(waiting=0, run_s=60, max_hold_s=7200), STREAM)])
    assert ("Shortest runs first (core/short_first.py): longer runs kept off the nodes where a shorter one fits while "
            "more than 0 GPU pods of at most 60 s") in table
    assert "Shortest runs first" not in time_table([waits(None, STREAM)])


def test_the_metrics_count_the_short_pods_that_hold_longer_runs_back():
    from extender.http.admin import create_admin_app
    from extender.http.app import create_app
    from testing.ports import both

    ext, clock = server()
    registry = both(create_app(ext, binder=None)).extensions["tessera"]["registry"]
    client = create_admin_app(ext, registry).test_client()
    assert "tessera_short_first_waiting_pods 3.0" in client.get("/metrics").get_data(as_text=True)
    clock.now = T0 - 60 + 3600  # past the hold bound: they no longer count
    assert "tessera_short_first_waiting_pods 0.0" in client.get("/metrics").get_data(as_text=True)


def test_short_pods_no_scheduler_refused_for_room_or_that_are_leaving_do_not_count():
    ext, _ = server(shorts=("s1", "s2"))
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300, refusal=None)))  # never tried: a scheduler that is not there
    assert not held(ext)
    leaving = gpu_pending("s3", deadline=300)
    leaving["metadata"]["deletionTimestamp"] = iso(T0)
    ext.upsert_pod(pod_info(leaving))  # deleted, kept by a finalizer: it will never take a GPU
    assert not held(ext)
    ext.upsert_pod(pod_info(gpu_pending("s3", deadline=300)))
    assert held(ext)


def test_gang_members_are_neither_held_nor_counted():
    gang = {"tessera.dev/gang-name": "job", "tessera.dev/gang-size": "4"}
    ext, _ = server(shorts=("s1", "s2"))
    ext.upsert_pod(pod_info(gpu_pending("w3", deadline=300, ann=gang)))  # a short worker of a gang does not count
    assert not held(ext)
    ext, _ = server()
    launcher = gpu_pending("launcher", ann=gang)  # a long member of a gang is not held: its gang is admitted whole
    ext.upsert_pod(pod_info(launcher))
    assert "held for shorter runs" not in str(ext.filter(pod_info(launcher), ["a"]))


def test_the_preempt_verb_and_the_pending_reason_offer_no_victims_for_a_held_pod_and_a_nominee_is_not_held():
    ext, _ = server(short_priority=100, gpus=1)
    pod = gpu_pending("long", priority=100)
    ext.upsert_pod(pod_info(pod))
    assert ext.held_for_shorter_runs(pod_info(pod))
    assert ext.preempt(pod_info(pod), {"a": ["uid-r"]}) == {}
    assert ext.preemption_plan(pod_info(pod), ["a"]) == {}
    free, _ = server(rule=None, gpus=1)
    free.upsert_pod(pod_info(pod))
    assert free.preempt(pod_info(pod), {"a": ["uid-r"]}) == {"a": ["uid-r"]}  # without the rule r would be taken
    free.filter(pod_info(pod), ["a"])
    plan = free.plan_preemption(pod_info(pod))
    ext.nominations.add(plan)  # a preemption cleared room for it before the short pods came: the room is its own
    assert not ext.held_for_shorter_runs(pod_info(pod)) and ext.preempt(pod_info(pod), {"a": ["uid-r"]}) == {"a": ["uid-r"]}


def test_holding_counts_short_pods_per_priority_not_per_pod():
    ext, clock = server(shorts=())
    for i in range(500):
        ext.upsert_pod(pod_info(gpu_pending(f"low{i}", deadline=300, priority=-1)))
    assert ext.short_first.counted() == 500 and list(ext.short_first.waiting) == [-1]
    assert not held(ext)  # 500 short pods of a lower priority than long's 0 hold nothing
    clock.now = T0 - 60 + 3600  # past the hold bound: all are dropped at once
    assert ext.short_first.counted() == 0 and ext.short_first.waiting == {}


def test_the_bench_runs_both_cases_on_a_small_cluster():
    """bench/short_first_cost.py broke when `contested` took constraint tests, and nothing ran it (found 2026-12-02)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "short_first_cost.py"), "--nodes", "40", "--calls", "1"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert "bounded (16 shapes, 4096 steps)" in done.stdout and "weighed by its lookups" in done.stdout
