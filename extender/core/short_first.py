"""Shortest runs first: while many short GPU pods wait, a GPU pod of a longer run waits behind them.

Why: at the seed's load (1.33, 100 openb nodes, kube scheduler) the cluster is saturated and the mean
wait is set by who takes each freed GPU. kube-scheduler's queue hands it to the oldest pod that fits,
and a pod that runs for hours then holds it for hours while dozens of pods of a few minutes wait. With
short pods first, each freed GPU serves many pods before a long run settles there; the long pods wait
longer, the many short ones much less (the order that minimises mean wait on one machine, in queueing
theory's shortest-processing-time rule). Measured (tessera, kube, seeds 42-46; docs/results.md §4
"Shortest runs first"): mean wait over all pods 1.5 -> 1.4 min at load 1.1 and 17.3 -> 6.9 min at 1.33
(6.7 in the rule's first version, which held a pod off every node: `contested` below).
Through the real kube-scheduler (bench/kube_timeline.py --short-first, replayed 50 times faster, seed 42,
first 6 h at 1.33): 17.8 -> 6.9 min, time mode 17.6 -> 6.6 (held everywhere); 6.5 and 6.5 held off only
contested nodes. A held pod's attempt costs kube-scheduler an extender call, so the rule wants a scheduling
loop with room: replayed 100 times faster (each attempt 1.7 s of trace time) the loop saturated and the
real run lost the gain (18.7 min).

What a run time is: in the server, a pod's `spec.activeDeadlineSeconds`, which the kubelet enforces by
stopping the pod that long after it started, so a pod cannot claim a short run and keep its GPUs for hours (Slurm's
backfill trusts a job's time limit for the same reason). The simulator has each pod declare a deadline
as users do (sim/declarations.py: round values, some too short, many none). A pod without one is long,
unless `estimate_silent` (`--short-first-estimate on`) reads its run from pods like it (run_history.py; the
server keys them by namespace as well, run_estimates.py).

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

Where a held pod is refused (`contested`): only on the nodes where one of the short pods waiting fits now,
so the GPUs it would take are ones a short pod can use at once; anywhere else it is placed as ever. Why:
holding a long pod everywhere let pods that fit nowhere now (a tenant's short pods asking 8 GPUs, or a
model that is always busy) hold every other tenant's long pods for the whole hold bound, while the GPUs
refused them idled. It costs the mean nothing that matters, measured against holding everywhere (same
seeds, mean wait at loads 1.1 / 1.2 / 1.33): 1.4 / 3.5 / 6.9 min against 1.4 / 3.5 / 6.7 min (docs/results.md §4).

Pure: the caller counts the short pods waiting and passes the clock's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .cluster import NodeState, fit_reason
from .model import PodRequest
from .run_history import RunHistory

MAX_SHAPES = 16  # distinct short-pod shapes `contested` reads per call
MAX_CHECKS = 4096  # node-and-shape fit tests per `contested` call (see `contested`)


@dataclass(frozen=True)
class ShortFirstSettings:
    waiting: int = 20  # short GPU pods waiting above which long GPU pods are held (see the module's figures)
    run_s: float = 3600.0  # the longest run that counts as short
    max_hold_s: float = 7200.0  # a long pod waiting this long is held no more; a short pod this old no longer counts
    estimate_silent: bool = False  # a pod with no deadline: its run estimated from its like's finished runs (run_history.py)

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
        """Whether a pod waits behind `short_waiting` short GPU pods (those of at least its priority): it is then
        refused the nodes where one of them fits now (`contested`)."""
        return (request.gpu_demand > 0 and not self.short(runtime_s) and waited_s < self.max_hold_s
                and short_waiting > self.waiting)

    @property
    def _estimated(self) -> str:
        share = f"{RunHistory.quantile:.0%}"  # the estimate's own quantile, so the words follow it
        return f", or without one the run {share} of its namespace's like pods finished within" if self.estimate_silent else ""

    def reason(self, waited_s: float) -> str:
        """The words for a held pod: what it waits behind, and when it is held no more."""
        return (f"tessera: held for shorter runs: more than {self.waiting} GPU pods of at most {self.run_s:.0f} s "
                f"(spec.activeDeadlineSeconds{self._estimated}) wait; a GPU pod of a longer or undeclared run is refused "
                f"the nodes where one of them fits, while they wait and for at most {self.max_hold_s:.0f} s "
                f"({max(0.0, self.max_hold_s - waited_s):.0f} s left for this pod)")


def contested(shorts: Iterable[tuple[PodRequest, Callable[[str], bool] | None, int]], nodes: Iterable[NodeState]) -> set[str]:
    """The names of `nodes` where one of the short pods waiting fits now: a held pod is refused these nodes and only
    these. `shorts`: one (request, where it may go, what asking that costs) per distinct shape, where it may go being
    None (anywhere it fits, as in time mode) or a test of a node's name by its selector, affinity and tolerations
    (the server), and its cost the lookups that test makes on one node (the pod's `NodeTerms.size`; 0 with None).

    Bounded, because tenants choose the shapes and their constraints: at most `MAX_SHAPES` shapes are read and
    `MAX_CHECKS` steps taken, a fit test one step and a constraint test 1 + its cost, and the nodes past that
    budget are not contested. Against 32 shapes that fit none of 5,000 idle nodes, a call took 85 ms unbounded and
    1.8 ms bounded (bench/short_first_cost.py, 2-core machine), under the extender's lock; against shapes that fit every
    node and carry the largest affinity the contract reads, 0.6 ms, and 18 ms with each constraint test counted as
    one step (a padded affinity, before the contract capped expressions in all, made one filter take 12 s). So
    pods of many odd shapes can only refuse a held pod fewer nodes, never more. The caller passes only the nodes
    the held pod fits (the server: those its filter passed), which at the seed's load are a few; a node without
    the CPU, memory or GPU room the least demanding shape asks is passed over before any test."""
    shapes = []
    for short in shorts:
        shapes.append(short)
        if len(shapes) >= MAX_SHAPES:
            break
    if not shapes:
        return set()
    cpu, memory = min(r.cpu_milli for r, _, _ in shapes), min(r.memory_mib for r, _, _ in shapes)
    milli = min(r.gpu_milli for r, _, _ in shapes)
    taken, budget = set(), MAX_CHECKS
    for node in nodes:
        if node.cpu_free < cpu or node.memory_free < memory or max(node.gpu_free, default=0) < milli:
            continue
        for request, may_go, cost in shapes:
            budget -= 1
            if fit_reason(request, node) is None:
                if may_go is not None:
                    budget -= 1 + cost
                if may_go is None or may_go(node.name):
                    taken.add(node.name)
                    break
            if budget <= 0:
                break
        if budget <= 0:
            break
    return taken
