"""How long a pod that declares no run will likely run: what pods like it ran when they finished.

Shortest runs first (short_first.py) counted a pod without `spec.activeDeadlineSeconds` as long. Under
run times as users declare them (sim/declarations.py: 40% declare nothing), that held back the many
short pods among the silent ones behind the few that declare, and the rule lost most of what it won
with exact run times (docs/queueing.md has the figures). On openb's default trace, 57-100% of each
common shape's pods run at most an hour, so a silent pod is usually short, and its shape says how
likely.

A `RunHistory` keeps the last `window` finished runs per key and estimates a silent pod's run as
their `quantile`: the run that so many of its like finished within. With fewer than `min_runs`
runs on record there is no estimate, and the pod stays long, as before.

Keys are the caller's. Time mode's is the pod's GPU shape (openb's pods carry nothing else that
groups them); the server's is the namespace and the shape (extender/run_estimates.py), so that one
tenant's runs never speak for another's pods. At most `max_keys` keys are kept, so pods of ever new
shapes cost bounded memory. Pods still running count too, each as a run at least as long as it has run
so far (`estimate`), so a tenant cannot pass a batch of long silent pods as short by making short ones first.
The history keeps them itself (`started`, `ended`), so the server and time mode feed it alike and keep no
second account of who runs.

On with `--short-first-estimate on` (serve and time mode alike). The estimate is never trusted where a
wrong one would cost others what they were promised: reservations and their backfill read only declared
runs (choosing the node to reserve by estimated ends was measured and dropped: docs/queueing.md).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class RunHistory:
    window: int = 50  # recent runs kept per key: a shape's runs change as its owners' work does
    min_runs: int = 10  # fewer on record: no estimate
    quantile: float = 0.75  # the estimate: the run that this share of the recent runs finished within
    max_keys: int = 4096  # tenants choose shapes: past this many keys the one least recently fed is dropped
    _runs: dict[Hashable, deque[float]] = field(default_factory=dict)
    # key -> {pod: its start} of the pods running now, in the order they started (the oldest are read first)
    _running: dict[Hashable, dict[Hashable, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window < 1 or not 1 <= self.min_runs <= self.window or not 0 < self.quantile <= 1 or self.max_keys < 1:
            raise ValueError("run history: window, min_runs and max_keys at least 1, min_runs at most window, "
                             "quantile in (0, 1]")

    def finished(self, key: Hashable, run_s: float) -> None:
        """A pod of `key` finished after `run_s` seconds (stopped at a deadline counts as what it ran)."""
        runs = self._runs.pop(key, None)  # re-inserted: the dict's order is the order keys were last fed
        if runs is None:
            runs = deque(maxlen=self.window)
            if len(self._runs) >= self.max_keys:
                del self._runs[next(iter(self._runs))]
        self._runs[key] = runs
        runs.append(run_s)

    def started(self, key: Hashable, pod: Hashable, at: float) -> None:
        """Pod `pod` of `key` runs since `at`; seen again, it keeps its first start. The caller bounds how many run:
        each holds GPUs it was given (the server feeds only bound GPU pods)."""
        self._running.setdefault(key, {}).setdefault(pod, at)

    def ended(self, key: Hashable, pod: Hashable, at: float) -> None:
        """Pod `pod` of `key` stopped running at `at` (finished, stopped at its deadline, or deleted): its run goes on
        record. A pod never seen start records nothing."""
        same = self._running.get(key)
        start = None if same is None else same.pop(pod, None)
        if start is None:
            return
        if not same:
            del self._running[key]
        self.finished(key, max(0.0, at - start))

    def running(self, key: Hashable) -> int:
        """How many pods of `key` run now."""
        return len(self._running.get(key, ()))

    def estimate(self, key: Hashable, now: float) -> float | None:
        """The run a silent pod of `key` will likely finish within, at `now`; None with too few runs on record.

        The pods of `key` still running (at most `window` are read, in the order they were seen to start) have run
        `now` minus their start so far. Each is a run known to last at least that long, so the quantile is taken of the
        Kaplan-Meier estimate of the runs, finished and running together (Kaplan & Meier 1958): without running
        pods it is the plain quantile of the finished ones. Finished runs alone are the short ones first (a long
        run is still running when many short ones of the same start have ended); a tenant that makes short runs to
        have a batch of long silent pods counted short is found out while the long ones run, not only when they
        end: once `quantile` of the runs cannot be shown to finish within any run on record, there is no finite
        estimate (math.inf, a long run)."""
        runs = self._runs.get(key)
        if runs is None or len(runs) < self.min_runs:
            return None
        running = (now - start for start in self._running.get(key, {}).values())
        return _km_quantile(sorted(runs), sorted(itertools.islice(running, self.window)), self.quantile)


def _km_quantile(ended: list[float], censored: list[float], quantile: float) -> float:
    """The first run t at which the Kaplan-Meier share of runs ended by t exceeds `quantile` (math.inf if none)."""
    left = 1.0  # the share of runs still going
    at_risk, i, j = len(ended) + len(censored), 0, 0
    while i < len(ended):
        t = ended[i]
        while j < len(censored) and censored[j] < t:  # running, and so far shorter than t: not known to reach t
            j, at_risk = j + 1, at_risk - 1
        done = 0
        while i < len(ended) and ended[i] == t:
            i, done = i + 1, done + 1
        left *= 1 - done / at_risk
        at_risk -= done
        if left < 1 - quantile - 1e-9 or left <= 0:
            return t
    return math.inf
