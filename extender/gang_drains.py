"""Gang drains: a gang that has waited past its bound holds the nodes it needs while they drain.

Why: a gang is admitted only when all its members fit at once (gangs.py), and kube-scheduler retries every
pending pod when room frees, so small pods take each freed piece and a gang of 64 GPUs behind a stream of
1-GPU pods waits for ever. The same starvation that reservations with backfill cure for 8-GPU pods
(queue_reservations.py, core/backfill.py), cured the same way and under the same switch and settings
(`tessera serve --reservations on`): once every member the gang needs exists and it has waited longer than
the largest wait bound the settings name (30 min by default), it picks the nodes that drain soonest
(their pods' declared ends, `tessera.dev/expected-runtime`, unknown counting as never; then the fewest GPUs
in use) until its members fit those nodes were they empty, and from then on those nodes take no pod of its
priority or lower that is not one of its members. As their pods end, the gang fits there and is admitted
whole; the drain ends then, when the gang goes, or DRAIN_MAX_S after it was made (a wrong declaration must
not hold nodes for ever), and a gang whose drain expired does not drain again for as long.

Bounds: all drains and queue reservations together hold at most the settings' `max_share` of the
cluster's GPU capacity (a gang that would need more does not drain, and says so); a drain never takes a
node another pod or gang has reserved; a pod of higher priority than the gang is never kept off (Kubernetes'
order: the gang would not preempt it either). The choice costs one sort of the candidate nodes and a fit
walk over the ones taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .core.backfill import BackfillSettings
from .core.cluster import Cluster, NodeState
from .core.model import MILLI_PER_GPU, PodRequest
from .core.placer import Placer
from .core.policy import tightest_gpus

DRAIN_MAX_S = 2 * 3600.0  # a drain lasts at most this long; the gang does not drain again for as long after


@dataclass(frozen=True, slots=True)
class Drain:
    nodes: frozenset[str]
    made_s: float  # wall clock, like the reservations' (queue_reservations.py)
    priority: int  # the gang's: pods above it are never kept off
    gpus: float  # what the gang needs, in GPUs, for the words
    milli: int  # the GPU capacity of its nodes, counted against max_share


class GangDrains:
    """The drains of gangs that waited too long; `settings` None (reservations off): a no-op. Under the extender's lock."""

    def __init__(self, cluster: Cluster, placer: Placer, settings: BackfillSettings | None,
                 expected_end: Callable[[str], float | None], reserved_milli: Callable[[], int],
                 clock: Callable[[], float]) -> None:
        self.cluster, self.placer, self.settings = cluster, placer, settings
        self.expected_end, self.reserved_milli, self.clock = expected_end, reserved_milli, clock
        self.by_gang: dict[tuple[str, str], Drain] = {}
        self.resting: dict[tuple[str, str], float] = {}  # gang -> when it may drain again (its drain expired)
        self.refused: dict[tuple[str, str], str] = {}  # gang -> why it does not drain (over max_share), for its words

    @property
    def on(self) -> bool:
        return self.settings is not None

    @property
    def bound_s(self) -> float:
        return max(self.settings.wait_bound_s.values(), default=math.inf) if self.settings is not None else math.inf

    def due(self, key: tuple[str, str], waited_s: float) -> bool:
        return self.on and key not in self.by_gang and waited_s >= self.bound_s and self.resting.get(key, 0.0) <= self.clock()

    def drain(self, key: tuple[str, str], title: str, members: list[PodRequest], candidates: list[str],
              priority: int) -> Drain | None:
        """Hold the nodes of `candidates` that drain soonest, enough for `members` were they empty; None (and why, in
        `refused`) when no such set fits within max_share."""
        taken, scratch = [], []
        by_name = self.cluster.by_name
        left = sorted(members, key=lambda r: (r.gpu_demand, r.cpu_milli, r.memory_mib), reverse=True)
        for name in sorted((n for n in candidates if n in by_name), key=lambda n: self._drains_at(by_name[n])):
            node = by_name[name]
            empty = NodeState(node.spec, -1)
            fitted = False
            for r in list(left):
                if self.placer.fits(r, empty) is None:
                    _take(empty, r)
                    left.remove(r)
                    fitted = True
            if fitted:
                taken.append(name)
                scratch.append(node)
            if not left:
                break
        if left:
            self.refused[key] = f"{title} cannot drain: the nodes offered to it could not hold all its members even empty"
            return None
        milli = sum(n.spec.gpu_count * MILLI_PER_GPU for n in scratch)
        capacity = self.cluster.open_milli
        if capacity and self.reserved_milli() + self.held_milli() + milli > self.settings.max_share * capacity:
            self.refused[key] = (f"{title} would drain {len(taken)} nodes ({milli // MILLI_PER_GPU} GPUs), past the "
                                 f"{self.settings.max_share:.0%} of GPU capacity reservations may hold")
            return None
        self.refused.pop(key, None)
        drain = Drain(frozenset(taken), self.clock(), priority, sum(r.gpu_demand for r in members) / MILLI_PER_GPU, milli)
        self.by_gang[key] = drain
        return drain

    def release(self, key: tuple[str, str]) -> None:
        self.by_gang.pop(key, None)
        self.refused.pop(key, None)

    def expire(self) -> None:
        now = self.clock()
        for key in [k for k, d in self.by_gang.items() if now - d.made_s >= DRAIN_MAX_S]:
            del self.by_gang[key]
            self.resting[key] = now + DRAIN_MAX_S
        for key in [k for k, until in self.resting.items() if until <= now]:
            del self.resting[key]

    def closed(self, key: tuple[str, str] | None, priority: int) -> dict[str, str]:
        """node -> why, for every node a drain of another gang keeps from a pod of `priority` (its gang `key`)."""
        out: dict[str, str] = {}
        for gang, d in self.by_gang.items():
            if gang != key and priority <= d.priority:
                why = (f"tessera: node held for gang {gang[1]}, which has waited past its bound for {d.gpus:g} GPUs "
                       "together; it takes the node as it drains (pods of higher priority than the gang's still may)")
                out.update(dict.fromkeys(d.nodes, why))
        return out

    def held_milli(self) -> int:
        return sum(d.milli for d in self.by_gang.values())

    def _drains_at(self, node: NodeState) -> tuple:
        """When the node's pods are expected to be gone (inf when any is unknown), then GPU milli in use, then name."""
        ends = [self.expected_end(pod) for pod in node.pods]
        last = max((e if e is not None else math.inf for e in ends), default=0.0)
        used = sum(a.gpu_demand for a in node.pods.values())
        return last, used, node.name


def _take(node: NodeState, request: PodRequest) -> None:
    node.cpu_free -= request.cpu_milli
    node.memory_free -= request.memory_mib
    for gpu in tightest_gpus(node, request):
        node.gpu_free[gpu] -= request.gpu_milli
