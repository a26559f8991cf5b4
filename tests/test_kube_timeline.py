"""bench/kube_timeline.py's clock: kube-scheduler's queue constants scaled to trace time, and the stream's
wall-clock schedule. The replay itself needs the real control plane and minutes, so it stays a bench."""

from __future__ import annotations

import math

import pytest

from bench.kube_timeline import Clock, first_hours, within
from extender.sim.kubequeue import EVENTS_ONLY, KUBE_1_20, QueueTimings, SchedulingQueue


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
