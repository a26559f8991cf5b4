"""Shortest runs first: while many short GPU pods wait, a GPU pod of a longer run waits behind them.

Why: at the seed's load (1.33, 100 openb nodes, kube scheduler) the cluster is saturated and the mean
wait is set by who takes each freed GPU. kube-scheduler's queue hands it to the oldest pod that fits,
and a pod that runs for hours then holds it for hours while dozens of pods of a few minutes wait. With
short pods first, each freed GPU serves many pods before a long run settles there; the long pods wait
longer, the many short ones much less (the order that minimises mean wait on one machine, in queueing
theory's shortest-processing-time rule). Measured (tessera, kube, seeds 42-46; docs/results.md §4
"Shortest runs first"): mean wait over all pods 1.5 -> 1.4 min at load 1.1 and 17.3 -> 6.7 min at 1.33.
Through the real kube-scheduler (bench/kube_timeline.py --short-first, replayed 50 times faster, seed 42,
first 6 h at 1.33): 17.8 -> 6.9 min, time mode 17.6 -> 6.6. A held pod's attempt costs kube-scheduler an
extender call, so the rule wants a scheduling loop with room: replayed 100 times faster (each attempt
1.7 s of trace time) the loop saturated and the real run lost the gain (18.7 min).

What a run time is: in the server, a pod's `spec.activeDeadlineSeconds`, which the kubelet enforces by
stopping the pod that long after it started, so a pod cannot claim a short run and keep its GPUs for hours (Slurm's
backfill trusts a job's time limit for the same reason). The simulator knows each pod's duration and
reads it as if every pod set its deadline to it. A pod without one is long.

Bounds (a prototype of this rule in the same replay, same seeds, mean wait at loads 1.1 / 1.33):
  * `waiting` 20: long pods are held only while more than 20 short GPU pods wait. 10 left GPUs idle
    (allocation 78.7 against 81.7% at 1.33, mean 2.2 min at 1.1); 50 / 80 helped less at 1.33 (7.1 /
    8.1 min against 6.3).
  * `run_s` 1 h: a run of at most an hour is short. 30 min: 8.4 min at 1.33; 2 h: 6.4 min, the same
    as 1 h within noise, so the shorter bound, which lets fewer pods to the front of the queue.
  * `max_hold_s` 2 h: a long pod that has waited this long is held no more, so none starves behind a
    stream of short ones (6.6 min at 1.33 against 6.3 unbounded; 1 h cost more: 8.1 min). Symmetrically
    a short pod that has waited this long no longer counts, so pods that wait for ever (a GPU model that
    is always busy, a constraint never met) hold nobody back for longer than that.
  * priority first: only short pods of at least the long pod's priority count against it, as
    kube-scheduler orders its queue by priority before arrival.

Pure: the caller counts the short pods waiting and passes the clock's values.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import PodRequest


@dataclass(frozen=True)
class ShortFirstSettings:
    waiting: int = 20  # short GPU pods waiting above which long GPU pods are held (see the module's figures)
    run_s: float = 3600.0  # the longest run that counts as short
    max_hold_s: float = 7200.0  # a long pod waiting this long is held no more; a short pod this old no longer counts

    def __post_init__(self) -> None:
        if self.waiting < 0 or self.run_s <= 0 or self.max_hold_s <= 0:
            raise ValueError("shortest-runs-first needs a waiting count of 0 or more and positive run and hold bounds")

    def short(self, runtime_s: float | None) -> bool:
        """Whether a run of `runtime_s` (None: not declared) is short."""
        return runtime_s is not None and runtime_s <= self.run_s

    def counts(self, request: PodRequest, runtime_s: float | None, waited_s: float) -> bool:
        """Whether a waiting pod counts among the short pods that hold long ones back."""
        return request.gpu_demand > 0 and self.short(runtime_s) and waited_s < self.max_hold_s

    def holds(self, request: PodRequest, runtime_s: float | None, waited_s: float, short_waiting: int) -> bool:
        """Whether a pod waits behind `short_waiting` short GPU pods (those of at least its priority)."""
        return (request.gpu_demand > 0 and not self.short(runtime_s) and waited_s < self.max_hold_s
                and short_waiting > self.waiting)

    def reason(self, waited_s: float) -> str:
        """The words for a held pod: what it waits behind, and when it is held no more."""
        return (f"tessera: held for shorter runs: more than {self.waiting} GPU pods of at most {self.run_s:.0f} s "
                f"(spec.activeDeadlineSeconds) wait; a GPU pod of a longer or undeclared run waits while they do "
                f"for at most {self.max_hold_s:.0f} s ({max(0.0, self.max_hold_s - waited_s):.0f} s left for this pod)")
