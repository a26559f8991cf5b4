"""Run estimates in the server (extender/run_estimates.py): a silent pod's run from its namespace's finished pods.

The runs come from the watch as the kubelet writes them (startTime, the containers' finishedAt); a tenant's runs
speak only for its own namespace; a tenant that makes short runs to have its long silent pods counted short is
found out while the long ones run.
"""

from __future__ import annotations

import math

import pytest

from extender.core.run_history import RunHistory
from extender.core.short_first import ShortFirstSettings
from extender.run_estimates import RunEstimates
from extender.service import Extender
from extender.translate.objects import node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod

from .test_queue_reservations import T0, iso
from .test_service import Clock
from .test_short_first import gpu_pending

SMALL = RunHistory(window=8, min_runs=4, quantile=0.75)


def finished(name, run_s, namespace="ml", gpus=1, end=T0 - 100, phase="Succeeded", statuses=True):
    """A pod that ran `run_s` seconds on node a and finished at `end`, as the kubelet reports it."""
    pod = k8s_pod(name, gpus=gpus, node="a", phase=phase, uid=f"uid-{namespace}-{name}")
    pod["metadata"]["namespace"] = namespace
    pod["status"]["startTime"] = iso(end - run_s)
    if statuses:
        pod["status"]["containerStatuses"] = [
            {"name": "c", "state": {"terminated": {"exitCode": 0, "finishedAt": iso(end)}}}]
    return pod


def running(name, since_s, namespace="ml", now=T0):
    pod = k8s_pod(name, gpus=1, node="a", phase="Running", uid=f"uid-{namespace}-{name}")
    pod["metadata"]["namespace"] = namespace
    pod["status"]["startTime"] = iso(now - since_s)
    return pod


def estimates(clock=None):
    clock = clock or Clock()
    clock.now = T0
    return RunEstimates(True, clock, RunHistory(window=8, min_runs=4, quantile=0.75)), clock


def test_a_silent_pod_is_estimated_from_its_namespaces_finished_runs_of_its_shape_only():
    est, _ = estimates()
    for k in range(4):
        est.watched(pod_info(finished(f"f{k}", 60 * (k + 1))))
    silent = pod_info(gpu_pending("q"))
    assert est.estimate(silent) == 240  # 60, 120, 180, 240: the run 75% finished within
    other_ns = pod_info(finished("q", 0, namespace="other"))
    assert est.estimate(other_ns) is None  # another tenant's runs never speak for it
    assert est.estimate(pod_info(gpu_pending("q2", gpus=2))) is None  # nor another shape's
    assert est.estimate(pod_info(k8s_pod("cpu-only"))) is None


def test_a_run_is_the_kubelets_start_to_finish_and_is_recorded_once_per_pod():
    est, clock = estimates()
    pod = finished("f", 300, end=T0 - 5000)  # finished long ago: a relist after a restart shows it now
    for _ in range(3):
        est.watched(pod_info(pod))
    for k in range(3):
        est.watched(pod_info(finished(f"g{k}", 300)))
    assert est.estimate(pod_info(gpu_pending("q"))) == 300  # not 5,300, and the three sightings counted once
    assert est.history.estimate(("ml", 1, 1000), clock.now) == 300


def test_without_container_statuses_the_run_ends_when_the_watch_first_sees_it_finished():
    est, clock = estimates()
    for k in range(4):
        est.watched(pod_info(finished(f"f{k}", 100, end=T0, statuses=False)))
    assert est.estimate(pod_info(gpu_pending("q"))) == 100
    pod = finished("never-started", 0)
    del pod["status"]["startTime"]
    est.watched(pod_info(pod))  # never ran: nothing recorded
    assert len(est.recorded) == 4


def test_a_pod_deleted_while_it_ran_ends_at_its_deletion_and_only_once():
    est, clock = estimates()
    for k in range(4):
        info = pod_info(running(f"r{k}", 0))
        est.watched(info)
        clock.now = T0 + 50
        est.gone(info.uid)
        est.gone(info.uid)  # a second deletion event records nothing more
        clock.now = T0
    assert est.estimate(pod_info(gpu_pending("q"))) == 50
    assert not est.history.running(("ml", 1, 1000)) and not est.key_of and not est.recorded


def test_a_tenant_that_makes_short_runs_to_pass_long_silent_pods_as_short_is_found_out_while_they_run():
    est, clock = estimates()
    for k in range(6):
        est.watched(pod_info(finished(f"short{k}", 60)))
    assert est.estimate(pod_info(gpu_pending("q"))) == 60
    est.watched(pod_info(running("long0", 30)))  # under the estimate: says nothing yet
    assert est.estimate(pod_info(gpu_pending("q"))) == 60
    clock.now = T0 + 600  # long0 has run 630 s: longer than any run on record
    assert est.estimate(pod_info(gpu_pending("q"))) == 60  # one in seven: still under the quantile
    est.watched(pod_info(running("long1", 0, now=T0 + 599)))  # started a second ago: says nothing yet
    assert est.estimate(pod_info(gpu_pending("q"))) == 60
    est.watched(pod_info(running("long2", 0, now=T0 + 300)))  # run 300 s by now
    # long0 (630 s) and long2 (300 s) have run past 60, long1 not yet: of the eight runs known to reach 60 s, six
    # ended there, so 25% of runs may last longer than any on record: no finite estimate
    assert est.estimate(pod_info(gpu_pending("q"))) == math.inf


def test_run_history_counts_running_pods_past_the_estimate_as_longer_runs_and_reads_a_bounded_number():
    def history(*elapsed: float) -> RunHistory:  # four runs on record, and pods that have run `elapsed` by t=100
        h = RunHistory(window=4, min_runs=4, quantile=0.75)
        for run in (10, 20, 30, 40):
            h.finished("k", run)
        for n, e in enumerate(elapsed):
            h.started("k", n, 100.0 - e)
        return h

    assert history().estimate("k", 100.0) == 40
    assert history(5, 35).estimate("k", 100.0) == 40  # under the estimate: no evidence
    assert history(50).estimate("k", 100.0) == 40  # one run longer than 40 of five: 80% ended by 40
    assert history(50, 60).estimate("k", 100.0) == math.inf  # two of six: only 67% can be shown to end
    assert history(15, 15).estimate("k", 100.0) == 40  # short of 20: they only leave the runs at risk
    assert history(*[1.0] * 4, *[99.0] * 1000).estimate("k", 100.0) == 40  # only the first `window` seen are read


def test_run_history_keeps_who_runs_and_records_a_run_when_it_ends():
    h = RunHistory(window=4, min_runs=1)
    h.started("k", "a", 10.0)
    h.started("k", "a", 50.0)  # seen again: it keeps its first start
    h.ended("k", "ghost", 70.0)  # never seen start: nothing on record
    assert h.running("k") == 1 and h.estimate("k", 70.0) is None
    h.ended("k", "a", 70.0)
    assert h.running("k") == 0 and h.estimate("k", 70.0) == 60
    h.ended("k", "a", 90.0)  # ended twice: recorded once
    assert h.estimate("k", 90.0) == 60 and h._running == {}


def test_the_estimates_are_off_unless_asked_and_off_they_record_nothing():
    est = RunEstimates(False)
    for k in range(20):
        est.watched(pod_info(finished(f"f{k}", 60)))
    assert est.estimate(pod_info(gpu_pending("q"))) is None and not est.recorded


def serve_with_history(estimate: bool):
    clock = Clock()
    clock.now = T0
    rule = ShortFirstSettings(waiting=2, run_s=600, max_hold_s=3600, estimate_silent=estimate)
    ext = Extender(short_first=rule, wall_clock=clock)
    ext.run_estimates.history = RunHistory(window=8, min_runs=4, quantile=0.75)
    ext.upsert_node(node_inventory(k8s_node("a", gpus=2)))
    ext.upsert_pod(pod_info(k8s_pod("r", gpus=1, node="a", phase="Running",
                                    assignment={"node": "a", "gpus": [0], "milli": 1000})))
    for k in range(4):  # the namespace's silent 1-GPU pods ran 2 min each
        ext.upsert_pod(pod_info(finished(f"f{k}", 120)))
    for name in ("s1", "s2", "s3"):  # silent pods waiting for a GPU
        ext.upsert_pod(pod_info(gpu_pending(name)))
    ext.upsert_pod(pod_info(gpu_pending("long", deadline=7200)))
    ext.mark_synced()
    return ext


@pytest.mark.parametrize("estimate", [True, False])
def test_the_server_counts_silent_pods_short_by_their_namespaces_runs_only_with_estimates_on(estimate):
    ext = serve_with_history(estimate)
    outcome = ext.filter(pod_info(gpu_pending("long", deadline=7200)), ["a"])
    held = "held for shorter runs" in outcome.unresolvable.get("a", "")
    assert held is estimate  # three silent pods estimated at 2 min wait: the declared 2-hour pod is held
    assert ext.short_first.counted() == (3 if estimate else 0)
    assert ext.filter(pod_info(gpu_pending("s1")), ["a"]).passed == ["a"]


def test_a_silent_pod_of_another_namespace_is_not_estimated_by_this_ones_runs():
    ext = serve_with_history(True)
    stranger = gpu_pending("x")
    stranger["metadata"]["namespace"] = "other"
    stranger["metadata"]["uid"] = "uid-other-x"
    assert ext.run_estimates.estimate(pod_info(stranger)) is None
    assert ext.short_first.run_of(pod_info(stranger)) is None


def test_the_rule_ships_on_without_estimates_a_flag_turns_them_on_and_is_refused_with_the_rule_off():
    from extender.cli import build_parser
    from extender.cli.serve import short_first_settings

    shipped = short_first_settings(build_parser().parse_args(["serve"]))
    assert shipped is not None and not shipped.estimate_silent
    on = build_parser().parse_args(["serve", "--short-first-estimate", "on"])
    assert short_first_settings(on).estimate_silent
    assert short_first_settings(build_parser().parse_args(["serve", "--short-first", "off"])) is None
    both = build_parser().parse_args(["serve", "--short-first", "off", "--short-first-estimate", "on"])
    with pytest.raises(ValueError, match="--short-first-estimate shapes shortest runs first, which --short-first off"):
        short_first_settings(both)
