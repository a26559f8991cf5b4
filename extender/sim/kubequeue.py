"""kube-scheduler 1.20's scheduling queue (its PriorityQueue), as time mode replays it.

Three queues, as upstream has them:
- activeQ: the pods to try next, highest priority first, then the oldest timestamp. A pod's
  timestamp is when it was added, and is refreshed each time it fails and is put back, so
  among equal priorities the pod that failed longest ago goes first. openb's pods carry no
  priority: all are 0 here, and the order is by timestamp alone.
- unschedulableQ: pods that failed, parked until a cluster event moves them all (here: an
  assigned pod deleted, i.e. a pod leaving) or until the periodic flush, every 30 s, moves
  those parked longer than 60 s.
- backoffQ: a moved pod still within its backoff (1 s after the first attempt, doubling per
  attempt up to 10 s, counted from its timestamp) waits there; a 1 s timer moves the pods
  whose backoff has run out to activeQ.

A scheduling cycle takes no time here by default (kube-scheduler tries about a hundred pods a
second, against waits of minutes), so a move request never lands while a pod is being tried, and
a pod that fails always goes to unschedulableQ. `cycle_s` gives each attempt a duration instead:
replayed 100 times faster (bench/kube_timeline.py), a 25 ms cycle is 2.5 s of trace time, and a
scheduler that cannot try the pods moved back before the next ones arrive makes every pod wait
behind them. The attempt's outcome still counts from its start.

`QueueTimings.scaled(factor)` is the same clocks seen from a replay `factor` times faster than
the trace (bench/kube_timeline.py drives the real kube-scheduler that way): its 1 s backoff is
then `factor` seconds of trace time, and time mode needs the same clocks to be comparable.

`EVENTS_ONLY` switches the timers off: no backoff, no flush, every parked pod retried at each
event. It is the model time mode had before; the two are compared in timemode.py's docstring.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class QueueTimings:
    """The queue's clocks, in seconds (kube-scheduler 1.20's defaults)."""

    backoff_initial_s: float = 1.0  # podInitialBackoffSeconds
    backoff_max_s: float = 10.0  # podMaxBackoffSeconds
    unschedulable_timeout_s: float = 60.0  # unschedulableQTimeInterval
    flush_period_s: float = 30.0  # flushUnschedulableQLeftover runs this often
    backoff_tick_s: float = 1.0  # flushBackoffQCompleted runs this often
    cycle_s: float = 0.0  # how long one scheduling attempt holds the loop (0: none, see below)

    def scaled(self, factor: float) -> QueueTimings:
        """Every clock `factor` times longer: kube-scheduler's wall-clock constants in the trace time of a
        replay run `factor` times faster than the trace. An integer factor keeps the timer ticks whole
        multiples of their period, as `SchedulingQueue.on_timer` compares them exactly."""
        if not factor > 0 or math.isinf(factor):
            raise ValueError(f"the clock factor must be positive and finite, got {factor}")
        return QueueTimings(**{f.name: getattr(self, f.name) * factor for f in fields(self)})


KUBE_1_20 = QueueTimings()
EVENTS_ONLY = QueueTimings(backoff_initial_s=0.0, backoff_max_s=0.0, unschedulable_timeout_s=math.inf,
                           flush_period_s=math.inf, backoff_tick_s=math.inf)
QUEUES = {"kube-1.20": KUBE_1_20, "events-only": EVENTS_ONLY}  # what `tessera simulate --queue` names


class SchedulingQueue:
    """Pods (by index) waiting to be scheduled: `add` on arrival, `pop` the next to try, then
    `done` when it was placed or `park` when it was not; `move_all` on a cluster event and
    `on_timer` at `next_timer()`."""

    def __init__(self, timings: QueueTimings = KUBE_1_20) -> None:
        self.timings = timings
        self._seq = 0  # orders events at the same instant, as nanosecond timestamps do upstream
        self._active: list[tuple[int, float, int, int]] = []  # (-priority, timestamp, seq, pod)
        self._backoff: list[tuple[float, int, int]] = []  # (backoff expiry, seq, pod)
        self._unschedulable: dict[int, float] = {}  # pod -> timestamp, in the order parked (so oldest first)
        self._priority: dict[int, int] = {}
        self._stamp: dict[int, tuple[float, int]] = {}
        self.attempts: dict[int, int] = {}
        # backoff by attempts (0 and 1 alike), up to where it reaches the cap
        steps = [timings.backoff_initial_s]
        while 0 < steps[-1] and steps[-1] * 2 < timings.backoff_max_s:
            steps.append(steps[-1] * 2)
        self._backoff_steps = [steps[0], *steps, timings.backoff_max_s]

    def __len__(self) -> int:
        """Pods waiting, in any of the three queues (and the one being tried)."""
        return len(self._priority)

    def add(self, pod: int, now: float, priority: int = 0) -> None:
        self._priority[pod] = priority
        self.attempts[pod] = 0
        self._restamp(pod, now)
        self._to_active(pod)

    def has_active(self) -> bool:
        """Whether activeQ holds a pod to try."""
        return bool(self._active)

    def pop(self) -> int | None:
        """The next pod to try, or None when activeQ is empty."""
        if not self._active:
            return None
        pod = heapq.heappop(self._active)[3]
        self.attempts[pod] += 1
        return pod

    def done(self, pod: int) -> None:
        """The popped pod was placed: it leaves the queue."""
        del self._priority[pod], self._stamp[pod], self.attempts[pod]

    def park(self, pod: int, now: float) -> None:
        """The popped pod did not fit: its timestamp is refreshed and it waits in unschedulableQ."""
        self._restamp(pod, now)
        self._unschedulable[pod] = now

    def move_all(self, now: float) -> None:
        """A cluster event (a pod left): every parked pod goes to activeQ, or backoffQ while backing off."""
        parked, self._unschedulable = self._unschedulable, {}
        for pod in parked:
            self._move(pod, now)

    def next_timer(self) -> float:
        """When a timer next moves a pod (math.inf when none will)."""
        t = self.timings
        due = math.inf
        if self._backoff:
            due = math.ceil(self._backoff[0][0] / t.backoff_tick_s) * t.backoff_tick_s
        if self._unschedulable and math.isfinite(t.flush_period_s):
            oldest = next(iter(self._unschedulable.values()))
            # the first flush tick strictly more than the timeout after the oldest parked pod
            due = min(due, (math.floor((oldest + t.unschedulable_timeout_s) / t.flush_period_s) + 1) * t.flush_period_s)
        return due

    def on_timer(self, now: float) -> None:
        """The timers due at `now`: backoffQ's completed pods to activeQ; at a flush tick, pods parked
        more than the timeout to activeQ (or backoffQ)."""
        while self._backoff and self._backoff[0][0] <= now:
            self._to_active(heapq.heappop(self._backoff)[2])
        t = self.timings
        if not math.isfinite(t.flush_period_s) or now % t.flush_period_s:
            return
        stale = [pod for pod, stamp in self._unschedulable.items() if now - stamp > t.unschedulable_timeout_s]
        for pod in stale:
            del self._unschedulable[pod]
            self._move(pod, now)

    def backoff_expiry(self, pod: int) -> float:
        """Timestamp + initial backoff doubled per attempt after the first, capped at the maximum."""
        steps = self._backoff_steps
        return self._stamp[pod][0] + steps[min(self.attempts[pod], len(steps) - 1)]

    def _move(self, pod: int, now: float) -> None:
        expiry = self.backoff_expiry(pod)
        if expiry > now:
            self._seq += 1
            heapq.heappush(self._backoff, (expiry, self._seq, pod))
        else:
            self._to_active(pod)

    def _to_active(self, pod: int) -> None:
        stamp, seq = self._stamp[pod]
        heapq.heappush(self._active, (-self._priority[pod], stamp, seq, pod))

    def _restamp(self, pod: int, now: float) -> None:
        self._seq += 1
        self._stamp[pod] = (now, self._seq)
