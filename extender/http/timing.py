"""Where a verb's time went, per call, in a `Server-Timing` response header: off unless asked for.

`tessera serve` turns it on when its environment has TESSERA_SERVER_TIMING=1 (bench/bind_latency.py
sets it; nothing shipped does). Off, nothing here runs: create_app installs no hook and the verbs
call the Extender itself. On, each verb's answer carries, in milliseconds:

    parse   from the request's start to asking for the extender's lock: the body's JSON, the
            wire checks, the pod's translation
    lock    waiting for the extender's lock (the watch applying an event, a bind's reserve)
    locked  under the lock: filter's judging, prioritize's scoring, bind's reserve
    rest    from the lock's release to the answer: encoding it (and for bind, the Binding's API call)
    total   the handler, from Flask's first hook to its last
    cpu     CPU the handler's thread used in that time; total - cpu is time off the CPU (the GIL held by
            another thread, the OS running another process, the lock)
    others  CPU the process's other threads used meanwhile (the watch, binds' API calls, Events): with one
            GIL, much of it is time this handler waited for it
    gc      the garbage collector's pauses while the call ran (in any thread: a collection stops them all)
    begin   not a duration: when the handler began, on the host's monotonic clock (time.perf_counter, in ms), so
            a caller on the same host can split its round trip into before, in and after the handler

Waitress's own time (reading the request off the socket, queueing it for a thread, writing the answer)
is outside `total`: the caller sees it as its round trip less `total`.

The lock is taken through `Extender.reading()` around the Extender's own call, which takes it again
(it is reentrant): the same critical section, timed from outside, with no change to the service.
"""

from __future__ import annotations

import gc
import os
import threading
import time

ENV = "TESSERA_SERVER_TIMING"
HEADER = "Server-Timing"
TIMED_CALLS = ("filter", "prioritize", "reserve")


def wanted(environ=os.environ) -> bool:
    """Whether `tessera serve`'s environment asks for the header."""
    return environ.get(ENV, "") == "1"


class _GcClock:
    """Seconds the collector has paused the process so far (gc.callbacks: start and stop of each collection)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0
        self.installed = False

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.total += time.perf_counter() - self._started
            self._started = 0.0

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self)
            self.installed = True


GC = _GcClock()
_call = threading.local()  # the request this thread is answering: marks set by the hooks and the timed calls


def _begin() -> None:
    _call.start, _call.cpu, _call.process, _call.gc = time.perf_counter(), time.thread_time(), time.process_time(), GC.total
    _call.asked = _call.got = _call.released = 0.0


def _header() -> str:
    end = time.perf_counter()
    start = getattr(_call, "start", end)
    asked, got, released = (_call.asked or end), (_call.got or end), (_call.released or end)
    cpu, process = time.thread_time() - _call.cpu, time.process_time() - _call.process
    parts = {"parse": asked - start, "lock": got - asked, "locked": released - got, "rest": end - released,
             "total": end - start, "cpu": cpu, "others": max(0.0, process - cpu), "gc": GC.total - _call.gc,
             "begin": start}
    return ", ".join(f"{k};dur={v * 1000:.3f}" for k, v in parts.items())


class TimedExtender:
    """The Extender as the verbs see it when timing is on: filter, prioritize and reserve timed around the lock;
    everything else is the Extender's own."""

    def __init__(self, extender) -> None:
        self.extender = extender

    def __getattr__(self, name: str):
        found = getattr(self.extender, name)
        if name not in TIMED_CALLS:
            return found

        def timed(*args, **kwargs):
            _call.asked = time.perf_counter()
            with self.extender.reading():
                _call.got = time.perf_counter()
                try:
                    return found(*args, **kwargs)
                finally:
                    _call.released = time.perf_counter()
        return timed


def install(app, extender):
    """Add the header to every answer of `app`; returns the extender the verbs should call."""
    GC.install()
    app.before_request(_begin)

    @app.after_request
    def add_header(response):
        response.headers[HEADER] = _header()
        return response

    return TimedExtender(extender)


def parse(value: str) -> dict[str, float]:
    """A Server-Timing header as written here: name -> milliseconds (what bench/bind_latency.py reads)."""
    out = {}
    for part in value.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name and dur:
            out[name] = float(dur)
    return out
