"""Shortest runs first, the server's side: which short GPU pods wait, and whether a pod is held behind them.

The rule is core/short_first.py's, the one time mode measures (`tessera simulate --mode time --short-first
on`); this module feeds it what only the server knows. A pod's run is its `spec.activeDeadlineSeconds`
(the kubelet kills the pod at that age, so a short run cannot be claimed and then overrun); its wait is
now minus its `metadata.creationTimestamp` (the API server's), read from the pod the watch delivered.

Which waiting pods count (`counted`): pending, not finished, asking GPUs, a deadline within the rule's
run bound, younger than its hold bound, fitting some node were the node empty, and not refused by
kube-scheduler for a reason no freed GPU cures (its Unschedulable message names a node selector, an
affinity, a taint: such a pod waits for ever and must hold nobody back). A tenant can still make pods
that count and wait (say, short pods asking a GPU model that is always busy); each such pod stops
counting at its hold bound, and each held pod is held at most that long: docs/security.md.

Held pods are refused every node at filter as unresolvable (evicting pods cannot help a pod that waits
its turn, so neither kube-scheduler nor Tessera's preemptor preempts or moves for it), with the rule's
words as the reason kube-scheduler puts in the pod's FailedScheduling Event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .core.cluster import Cluster, never_fits
from .core.placer import Placer
from .core.short_first import ShortFirstSettings
from .queue_reservations import TERMINAL
from .state import PodInfo


class ShortFirstQueue:
    """The short GPU pods waiting, fed by the watch (`watched`, `gone`); asked by filter (`hold`). Hold the extender's lock.

    `settings` None: off, `hold` never holds."""

    def __init__(self, cluster: Cluster, placer: Placer, cured_by_room: Callable[[str], bool],
                 settings: ShortFirstSettings | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cluster, self.placer, self.settings, self.clock = cluster, placer, settings, clock
        self.cured_by_room = cured_by_room  # kube-scheduler's Unschedulable message -> whether freed room cures it
        self.waiting: dict[str, tuple[int, float]] = {}  # uid -> (priority, created) of a short GPU pod waiting

    def watched(self, info: PodInfo) -> None:
        if self.settings is None:
            return
        if self._counts(info):
            self.waiting[info.uid] = (info.priority, info.created_s)
        else:
            self.waiting.pop(info.uid, None)

    def gone(self, uid: str) -> None:
        self.waiting.pop(uid, None)

    def _counts(self, info: PodInfo) -> bool:
        rule = self.settings
        if info.node or info.phase in TERMINAL or info.created_s is None or not rule.short(info.deadline_s):
            return False
        if info.kube_refusal and not self.cured_by_room(info.kube_refusal):
            return False
        request = self.placer.request_for(info.request)
        return request.gpu_demand > 0 and not all(never_fits(request, n.spec) for n in self.cluster.nodes)

    def counted(self) -> int:
        """Short GPU pods waiting that count now (any priority): the gauge tessera_short_first_waiting_pods."""
        if self.settings is None:
            return 0
        now, bound = self.clock(), self.settings.max_hold_s
        return sum(1 for _, created in self.waiting.values() if now - created < bound)

    def hold(self, info: PodInfo, known: PodInfo | None, exempt: bool) -> str:
        """Why the pod waits behind shorter runs, or "" when it does not. `known`: the pod as the watch shows it (its
        creation time and deadline are read there, never from a verb's body); a pod the watch has not seen is not held.
        `exempt`: a pod reservations look after (a reserving class with reservations on)."""
        rule = self.settings
        if rule is None or exempt or known is None or known.key != info.key or known.created_s is None:
            return ""
        now = self.clock()
        waited = now - known.created_s
        request = self.placer.request_for(known.request)
        if request.gpu_demand == 0 or rule.short(known.deadline_s) or waited >= rule.max_hold_s:
            return ""
        ahead = 0
        for uid, (priority, created) in self.waiting.items():
            if uid != known.uid and priority >= known.priority and now - created < rule.max_hold_s:
                ahead += 1
                if ahead > rule.waiting:
                    return rule.reason(waited)
        return ""

