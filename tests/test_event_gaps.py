"""Bind Events wait for a gap between the verbs kube-scheduler waits on (kube/cache.py EventSink, http/app.py
InFlight): a write while a filter runs took its CPU from that filter (bench/bind_latency.py)."""

from __future__ import annotations

import threading
import time

from extender.http.app import InFlight, create_app
from extender.kube import cache
from extender.service import Extender
from tests.fakeapi import FakeApi, wait_for


def sink(api: FakeApi, in_flight: InFlight):
    stop = threading.Event()
    events = cache.EventSink(api, stop, defer_while=in_flight.busy)
    threading.Thread(target=events.run, daemon=True).start()
    return events, stop


def test_an_event_waits_while_a_filter_is_answered_and_is_written_once_it_ends():
    api, in_flight = FakeApi(), InFlight()
    events, stop = sink(api, in_flight)
    try:
        with in_flight:
            events.offer("Pod", "ml", "p", "uid-p", "", "bound to n1", cache.BOUND_REASON)
            time.sleep(0.2)
            assert api.events == []  # not while the filter runs
        wait_for(lambda: len(api.events) == 1, what="the Event after the filter")
    finally:
        stop.set()


def test_a_steady_stream_of_calls_delays_an_event_by_at_most_max_defer_s(monkeypatch):
    monkeypatch.setattr(cache, "MAX_DEFER_S", 0.3)
    api, in_flight = FakeApi(), InFlight()
    events, stop = sink(api, in_flight)
    try:
        with in_flight:  # never a gap
            started = time.monotonic()
            events.offer("Pod", "ml", "p", "uid-p", "", "bound to n1", cache.BOUND_REASON)
            wait_for(lambda: len(api.events) == 1, what="the Event despite no gap")
            assert 0.25 <= time.monotonic() - started < 2.0
    finally:
        stop.set()


def test_a_filter_call_counts_as_in_flight_while_it_is_answered():
    in_flight, seen = InFlight(), []
    ext = Extender()
    ext.mark_synced()
    real_filter = ext.filter

    def filter_seeing(*args, **kwargs):
        seen.append(in_flight.busy())
        return real_filter(*args, **kwargs)

    ext.filter = filter_seeing
    client = create_app(ext, binder=None, in_flight=in_flight).test_client()
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    assert client.post("/tessera/filter", json={"Pod": pod, "NodeNames": []}).status_code == 200
    assert seen == [True] and not in_flight.busy()
