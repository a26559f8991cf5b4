"""Shortest runs first, the server's side: which short GPU pods wait, and whether a pod is held behind them.

The rule is core/short_first.py's, the one time mode measures (`tessera simulate --mode time --short-first
on`); this module feeds it what only the server knows. A pod's run is its `spec.activeDeadlineSeconds`
(the kubelet stops the pod that long after it started, so a short run cannot be claimed and then overrun); its wait is
now minus its `metadata.creationTimestamp` (the API server's), read from the pod the watch delivered.

Which waiting pods count (`_counts`): pending, not leaving, not a gang member, asking GPUs, a deadline
within the rule's run bound, younger than its hold bound, fitting some node as the nodes were at its last
watch event, its node selector and affinity read, and refused by kube-scheduler for want of room (its
Unschedulable message names a shortage Tessera counts, and besides only what `contested` weighs node by
node: `refused_for_room`). So a pod no scheduler has tried yet (a few milliseconds, for a live one), one of
a scheduler that does not exist, one that waits for a node selector, an affinity or a taint alone, and one
short of ephemeral storage or another resource Tessera does not count never count: such pods would wait for
ever, or be judged to fit nodes they cannot use, and hold everyone back. A tenant can still make pods that
count and wait (say, short pods asking a GPU model that is always busy): they hold a long pod off a node only
while one of them fits there, and kube-scheduler places such a pod at its next try; each stops counting at
its hold bound, and each held pod is held at most that long: docs/security.md.

Who is never held: a pod not asking GPUs, a short one, a gang member (its gang is admitted whole or not
at all; holding members one by one would only make its binds time out), a pod reservations look after,
and a pod a preemption already cleared room for. A held pod is refused at filter, as unresolvable, the
nodes where one of the counted short pods (of at least its priority) fits now (`contested`), and judged
as ever on the others: so pods that fit nowhere now hold no one off the GPUs they cannot use. The mover
plans nothing for a held pod, and the preempt verb and Tessera's preemptor evict for it only on nodes no
counted short pod could use were they emptied (`Judge.clearable`; kube-scheduler 1.20's own
preemption of whole GPUs, which asks no extender, can still evict for one: docs/security.md). The reason
is the rule's words, which kube-scheduler puts in the pod's FailedScheduling Event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tessera_contract import TERMINAL_PHASES

from .core.cluster import Cluster, NodeState, never_fits
from .core.placer import Placer
from .core.short_first import ShortFirstSettings, contested
from .state import NodeTerms, PodInfo, Tolerations, refusal_reasons

PRUNE_S = 5.0  # short pods past the hold bound are dropped this often: they may count up to 5 s too long
# kube-scheduler's reasons that `contested` weighs node by node for a short pod: the shortages Tessera counts, its own
# refusals, the node selector and required affinity (the pod's NodeTerms) and taints (its Tolerations). A short pod
# refused for anything else (ephemeral storage, another extended resource, the pod count) would be judged to fit
# nodes it cannot use, and refuse long pods there: it does not count.
JUDGED_SHORTAGES = ("Insufficient cpu", "Insufficient memory", "Insufficient nvidia.com/gpu",
                    "Insufficient tessera.dev/gpu-milli", "tessera:")
JUDGED_CONSTRAINTS = ("didn't match node selector", "didn't match Pod's node affinity", "had taint", "had untolerated taint",
                      "that the pod didn't tolerate")


def refused_for_room(kube_refusal: str) -> bool:
    """Whether kube-scheduler's Unschedulable message names a shortage Tessera counts and nothing `contested` cannot
    weigh node by node ('0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had taint {a: b}, that
    the pod didn't tolerate.' does; '... 1 Insufficient ephemeral-storage.' does not)."""
    reasons = refusal_reasons(kube_refusal)
    return any(r.split(" ", 1)[-1].startswith(JUDGED_SHORTAGES) for r in reasons) \
        and all(any(j in r for j in JUDGED_SHORTAGES + JUDGED_CONSTRAINTS) for r in reasons)


class ShortFirstQueue:
    """The short GPU pods waiting, fed by the watch (`watched`, `gone`); asked by filter (`hold`). Hold the extender's lock.

    `settings` None: off, `hold` never holds. Kept by priority, so a hold counts in one step per priority class
    (a tenant cannot add classes: PriorityClasses are the admin's) however many short pods wait."""

    def __init__(self, cluster: Cluster, placer: Placer, admits: Callable[[Tolerations, NodeTerms, str], bool],
                 settings: ShortFirstSettings | None = None, clock: Callable[[], float] = time.time,
                 estimate: Callable[[PodInfo], float | None] = lambda _info: None) -> None:
        self.cluster, self.placer, self.settings, self.clock = cluster, placer, settings, clock
        self.estimate = estimate  # a silent pod's likely run (run_estimates.py; None: not known, counted long)
        self.admits = admits  # (a pod's tolerations, its node terms, a node's name) -> whether they let it there
        self.waiting: dict[int, dict[str, float]] = {}  # priority -> {uid: created} of the short GPU pods that count
        self.priority_of: dict[str, int] = {}  # uid -> its key in `waiting`
        self.shape_of: dict[str, tuple] = {}  # uid -> its shape: what it asks and where it may go
        # priority -> shape -> [(request, tolerations, terms), pods of it]; a shape keeps its place while any pod of
        # it waits, so `contested` reads the shapes in the order they began to wait, as time mode does
        self.shapes: dict[int, dict[tuple, list]] = {}
        self._pruned = -PRUNE_S

    def watched(self, info: PodInfo) -> None:
        if self.settings is None:
            return
        if not self._counts(info):
            self.gone(info.uid)
            return
        request = self.placer.request_for(info.request)
        shape = (request.key, info.tolerations, info.node_terms)
        if self.priority_of.get(info.uid) == info.priority and self.shape_of[info.uid] == shape:
            return  # the same pod seen again: it keeps its place
        self.gone(info.uid)
        self.waiting.setdefault(info.priority, {})[info.uid] = info.created_s
        self.priority_of[info.uid] = info.priority
        self.shape_of[info.uid] = shape
        self.shapes.setdefault(info.priority, {}).setdefault(shape, [(request, info.tolerations, info.node_terms), 0])[1] += 1

    def gone(self, uid: str) -> None:
        priority = self.priority_of.pop(uid, None)
        if priority is not None:
            self._drop(priority, uid)

    def _drop(self, priority: int, uid: str) -> None:
        same = self.waiting[priority]
        del same[uid]
        if not same:
            del self.waiting[priority]
        key, shapes = self.shape_of.pop(uid), self.shapes[priority]
        shapes[key][1] -= 1
        if not shapes[key][1]:
            del shapes[key]
            if not shapes:
                del self.shapes[priority]

    def _counts(self, info: PodInfo) -> bool:
        """A short GPU pod that waits for room: pending, not leaving, no gang member, refused by kube-scheduler for
        want of room and for nothing `contested` cannot weigh (`refused_for_room`; a pod no scheduler has tried, of a
        scheduler that does not exist, or waiting for a constraint never counts), its node constraints read, and
        fitting some node as the nodes are now."""
        rule = self.settings
        if info.node or info.phase in TERMINAL_PHASES or info.terminating or info.in_gang or info.created_s is None:
            return False
        if not (info.kube_refusal and refused_for_room(info.kube_refusal)) or info.node_terms is None:
            return False
        request = self.placer.request_for(info.request)
        return rule.counts(request, self.run_of(info), self.clock() - info.created_s) \
            and not all(never_fits(request, n.spec) for n in self.cluster.nodes)

    def _prune(self, now: float) -> None:
        """Drop the short pods that have waited the hold bound: they no longer count."""
        if now - self._pruned < PRUNE_S:
            return
        self._pruned = now
        bound = self.settings.max_hold_s
        for uid in [u for same in self.waiting.values() for u, created in same.items() if now - created >= bound]:
            self._drop(self.priority_of.pop(uid), uid)

    def counted(self) -> int:
        """Short GPU pods waiting that count now (any priority): the gauge tessera_short_first_waiting_pods."""
        if self.settings is None:
            return 0
        self._prune(self.clock())
        return len(self.priority_of)

    def hold(self, info: PodInfo, known: PodInfo | None, exempt: bool) -> str:
        """Why the pod waits behind shorter runs, or "" when it does not. `known`: the pod as the watch shows it (its
        creation time and deadline are read there, never from a verb's body); a pod the watch has not seen is not held.
        `exempt`: a pod reservations or a preemption look after. A gang member is never held (its gang is admitted
        whole or not at all, gangs.py: holding members one by one would keep a whole gang from ever fitting at once)."""
        rule = self.settings
        if rule is None or exempt or known is None or known.key != info.key or known.created_s is None \
                or known.in_gang:
            return ""
        now = self.clock()
        waited = now - known.created_s
        self._prune(now)
        ahead = sum(len(same) for priority, same in self.waiting.items() if priority >= known.priority)
        return rule.reason(waited) if rule.holds(self.placer.request_for(known.request), self.run_of(known), waited, ahead) \
            else ""

    def run_of(self, info: PodInfo) -> float | None:
        """The run the rule reads: the pod's deadline, else (with estimates on) its namespace's like's (run_estimates.py)."""
        return info.deadline_s if info.deadline_s is not None else self.estimate(info)

    def contested(self, priority: int, names: list[str], states: list[NodeState] | None = None) -> list[str]:
        """The nodes of `names` a held pod of `priority` is refused: those where a counted short pod of at least that
        priority fits now and its node selector, affinity and tolerations let it go (core `contested`, which reads a
        bounded number of shapes: the highest priority first, then in the order they began to wait). `states`: the
        nodes to judge instead of the cluster's as they are now (the service asks about them emptied)."""
        admits = self.admits
        shorts = ((request, lambda name, t=tolerations, terms=terms: admits(t, terms, name), terms.size)
                  for p in sorted(self.shapes, reverse=True) if p >= priority
                  for (request, tolerations, terms), _ in self.shapes[p].values())
        by_name = self.cluster.by_name
        taken = contested(shorts, states if states is not None else (by_name[n] for n in names if n in by_name))
        return [n for n in names if n in taken]
