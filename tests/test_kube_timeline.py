"""bench/kube_timeline.py's clock: kube-scheduler's queue constants and cycle scaled to trace time, and the
stream's wall-clock schedule. The replay itself needs the real control plane and minutes, so it stays a bench."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.kube_timeline import (
    Clock,
    build_stream,
    busy_cycle,
    first_hours,
    scheduler_metrics,
    short_first_server_args,
    tie_mean,
    with_deadlines,
    within,
)
from extender.sim.kubequeue import EVENTS_ONLY, KUBE_1_20, QueueTimings, SchedulingQueue
from extender.sim.timemode import replay_time
from extender.sim.trace import TracePod

from .conftest import node, openb, pod


def test_scaled_timings_are_every_clock_times_the_factor():
    assert KUBE_1_20.scaled(100) == QueueTimings(backoff_initial_s=100.0, backoff_max_s=1000.0,
                                                 unschedulable_timeout_s=6000.0, flush_period_s=3000.0,
                                                 backoff_tick_s=100.0)
    assert KUBE_1_20.scaled(1) == KUBE_1_20
    assert EVENTS_ONLY.scaled(50) == EVENTS_ONLY  # no timers stay no timers
    assert KUBE_1_20 == QueueTimings()  # the default, docs/results.md §4's clocks, is untouched


@pytest.mark.parametrize("factor", [0, -1, math.inf, math.nan])
def test_scaling_refuses_a_factor_that_is_no_clock(factor):
    with pytest.raises(ValueError, match="positive and finite"):
        KUBE_1_20.scaled(factor)


def test_a_scaled_queue_behaves_as_the_unscaled_one_in_scaled_time():
    """One pod refused twice, a pod leaving 0.5 s after the first refusal: under clocks x 60 every instant is x 60."""
    def trace(timings: QueueTimings, factor: float) -> list[float]:
        q, seen = SchedulingQueue(timings), []
        q.add(0, 0.0)
        assert q.pop() == 0
        q.park(0, 0.0)
        q.move_all(0.5 * factor)  # still backing off (1 s): to backoffQ, out at the next tick
        seen.append(q.next_timer())
        q.on_timer(seen[-1])
        assert q.pop() == 0
        q.park(0, seen[-1])
        seen.append(q.next_timer())  # nothing moves it: the flush, past the 60 s timeout
        return seen

    plain, scaled = trace(KUBE_1_20, 1), trace(KUBE_1_20.scaled(60), 60)
    assert plain == [1.0, 90.0]
    assert scaled == [60 * t for t in plain]


def test_first_hours_cuts_the_stream_at_its_arrivals():
    timeline = [(0.0, 10.0), (1800.0, 5.0), (3599.0, 1.0), (3600.0, 1.0), (9000.0, 1.0)]
    assert first_hours(timeline, 1) == 3
    assert first_hours(timeline, 2.5) == 4
    assert first_hours(timeline, 0) == 5  # no cut
    assert first_hours(timeline, 0, limit=2) == 2
    assert first_hours(timeline, 1, limit=10) == 3


def test_the_clock_maps_trace_time_to_wall_time_and_back():
    clock = Clock(start=1000.0, compression=100)
    assert clock.wall(0) == 1000.0
    assert clock.wall(3600) == 1036.0  # an hour of trace in 36 s
    assert clock.trace(1036.0) == pytest.approx(3600)
    assert clock.span(0.05) == pytest.approx(5.0)  # 50 ms of API latency is 5 s of trace


def test_within_is_fifteen_percent_or_two_minutes():
    assert within(110.0, 0.0)  # under 2 minutes apart
    assert not within(121.0, 0.0)
    assert within(3400.0, 3000.0)  # 13% of 50 min
    assert not within(3500.0, 3000.0)  # 17%


def test_a_scheduling_cycle_makes_pods_that_arrive_together_wait_their_turn():
    """Three pods that fit at once, all arriving at 0: with no cycle none waits; with a 2 s cycle the second
    is tried at 2 s and the third at 4 s (kube-scheduler tries one pod at a time)."""
    cluster = [node("n1", gpus=4, cpu=64_000)]
    pods = [TracePod(pod(f"p{i}", gpus=1), creation_time=0.0, duration=100.0) for i in range(3)]
    timeline = [(0.0, 100.0)] * 3

    def waits(timings: QueueTimings) -> tuple[float, float]:
        r = replay_time(cluster, pods, "tessera", "kube", 42, node_count=1, timings=timings, timeline=timeline)
        return r.wait_mean_s, r.wait_max_s

    assert waits(KUBE_1_20) == (0.0, 0.0)
    assert waits(replace(KUBE_1_20, cycle_s=2.0)) == (2.0, 4.0)
    assert waits(replace(KUBE_1_20, cycle_s=0.02).scaled(100)) == (2.0, 4.0)  # 20 ms, replayed 100 times faster


def test_busy_cycle_counts_only_the_spans_when_activeq_was_never_empty():
    samples = [(0.0, 0, 0), (1.0, 10, 30), (2.0, 60, 40), (3.0, 110, 25), (4.0, 130, 0), (5.0, 131, 0)]
    assert busy_cycle(samples) == pytest.approx(2.0 / 100)  # 1-2 s and 2-3 s: 100 attempts in 2 s
    assert busy_cycle(samples[:2]) == 0.0  # never busy at both ends


def test_scheduler_metrics_reads_queue_lengths_and_attempts():
    text = "\n".join([
        "# HELP scheduler_pending_pods [STABLE] Number of pending pods",
        'scheduler_pending_pods{queue="active"} 12',
        'scheduler_pending_pods{queue="backoff"} 3',
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 100',
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 40',
        'scheduler_pending_pods_total{queue="active"} 99',
    ])
    assert scheduler_metrics(text) == {"pending_active": 12.0, "pending_backoff": 3.0, "attempts_scheduled": 100.0,
                                       "attempts_unschedulable": 40.0}


def test_the_tie_mean_averages_each_statistic_over_the_runs_and_keeps_every_class():
    from extender.sim.waits import WaitStats

    a = {"8gpu": WaitStats(4, 600.0, 0.0, 2400.0, 2400.0), "slice": WaitStats(9, 60.0, 0.0, 300.0, 400.0)}
    b = {"8gpu": WaitStats(4, 1200.0, 60.0, 3600.0, 3600.0)}
    got = tie_mean([a, b])
    assert got["8gpu"] == WaitStats(4, 900.0, 30.0, 3000.0, 3000.0)
    assert got["slice"] == a["slice"], "a class one run lacks is averaged over the runs that have it"


def test_with_short_first_the_server_sees_the_rule_in_wall_seconds_and_a_pod_is_short_on_both_sides_alike():
    from extender.cli import build_parser
    from extender.cli.serve import short_first_settings
    from extender.core.short_first import ShortFirstSettings

    args = short_first_server_args(100)
    assert args == ("--short-first", "on", "--short-first-waiting", "20", "--short-first-run", "36s",
                    "--short-first-hold", "72s", "--short-first-estimate", "off")
    served = short_first_settings(build_parser().parse_args(["serve", *args]))
    traced = ShortFirstSettings()
    for run in (1, 99, 100, 3599, 3600, 3601, 3700, 7200):
        deadline = max(1, math.ceil(run / 100))  # what the bench writes into the pod
        assert served.short(deadline) == traced.short(run), run


def test_users_declarations_reach_the_real_pods_as_time_mode_reads_them():
    """A silent pod carries no deadline, a declaring one its declaration / C rounded up, and each runs what it runs as
    declared (stopped at a deadline below its run): the stream time mode replays with the same draw."""
    from argparse import Namespace

    args = Namespace(trace=str(openb("openb_pod_list_default.csv")), nodes=str(openb("openb_node_list_gpu_node.csv")),
                     seed=42, load=1.33, hours=1.0, limit=0, declarations="users")
    stream = with_deadlines(build_stream(args), 50)
    assert stream.drawn is not None and len(stream.drawn) == len(stream.pods) == len(stream.deadlines)
    silent = [i for i, d in enumerate(stream.drawn) if d.declared_s is None]
    assert silent and all(stream.deadlines[i] is None for i in silent)
    assert all(stream.deadlines[i] == math.ceil(d.declared_s / 50) for i, d in enumerate(stream.drawn) if i not in silent)
    runs = zip(stream.timeline, stream.drawn, strict=True)
    assert all(run == d.run_s <= stream.pods[i].duration for i, ((_, run), d) in enumerate(runs))
    assert any(d.stopped and d.run_s < stream.pods[i].duration for i, d in enumerate(stream.drawn))
    exact = with_deadlines(build_stream(Namespace(**{**vars(args), "declarations": "exact"})), 50)
    assert exact.drawn is None and exact.deadlines == tuple(max(1, math.ceil(d / 50)) for _, d in exact.timeline)


def test_the_waits_file_has_one_line_per_created_pod_with_its_real_wait_in_trace_time(tmp_path):
    """`--waits`: a pod bound 2 wall seconds after its due arrival waited 2 x C trace seconds, one never bound is
    null, one never created (no name) is left out; each line names the pod's index, class, declared run and node
    (null for the pod never bound)."""
    import json
    from argparse import Namespace

    from bench.kube_timeline import Bind, RealRun, write_waits

    args = Namespace(trace=str(openb("openb_pod_list_default.csv")), nodes=str(openb("openb_node_list_gpu_node.csv")),
                     seed=42, load=1.33, hours=0.05, limit=3, declarations="users")
    stream = build_stream(args)
    clock = Clock(start=100.0, compression=50)
    run = RealRun(clock, names=["a", "", "c"])
    run.bound["a"] = Bind(clock.wall(stream.timeline[0][0]) + 2.0, "node-7")
    out = tmp_path / "waits.jsonl"
    write_waits(str(out), stream, run)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["pod"] for d in lines] == [0, 2]
    assert lines[0]["wait_s"] == pytest.approx(100.0) and lines[1]["wait_s"] is None
    assert lines[0]["node"] == "node-7" and lines[1]["node"] is None
    assert lines[0]["declared_s"] == stream.drawn[0].declared_s and lines[0]["arrival_s"] == stream.timeline[0][0]
