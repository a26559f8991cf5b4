"""Who may be displaced for a pod, and the plan: preemption's victims, or trainers to move.

kube-scheduler 1.20.2 never calls the preempt verb (docs/wire-protocol.md §7), so Tessera plans
preemption itself (kube/preemptor.py acts on these plans) and answers the verb the same way when a
newer kube-scheduler calls it. Each plan is the pod's filter verdict (judge.py) read for the nodes
it fails on for want of room, then preemption.py's choice of the fewest lower-priority victims per
node, or moves.py's plan for movable trainers. Kubernetes' rules come first (`refusal`): nobody is
displaced for a gang member, a pod whose preemptionPolicy is Never, or a pod of a schedulerName
Tessera does not serve.

No lock of its own: every method expects the extender's held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessera_contract import TERMINAL_PHASES

from . import preemption
from .core.cluster import Cluster
from .core.placer import Placer
from .judge import Judge
from .moves import Moves
from .nodes import NodeTable
from .nominations import Nomination, Nominations
from .queue_reservations import QueueReservations
from .state import PodInfo

DEFAULT_SCHEDULER = "default-scheduler"  # the profile of manifests/scheduler/*.yaml, and a pod's schedulerName unset
# Nodes the cheap check before a move plan weighs (one trial fit each): past this many, a move is assumed possible and
# the plan itself (bounded: core/defrag.py) decides.
ROOM_CHECK_NODES = 4 * preemption.PLAN_NODES


@dataclass(slots=True)
class Displacement:
    """Preemption and move plans over the Extender's state (the objects it holds; none owned here)."""

    cluster: Cluster
    placer: Placer
    nodes: NodeTable
    pods: dict[str, PodInfo]
    nominations: Nominations
    moves: Moves
    queue_reservations: QueueReservations
    judge: Judge
    synced: Callable[[], bool]  # the extender's cache has listed everything: no plan before
    # the kube-scheduler profiles Tessera serves (tessera serve --scheduler-name): pods are evicted or moved only for
    # a pod of one of them (`refusal`)
    scheduler_names: frozenset[str] = field(default_factory=lambda: frozenset({DEFAULT_SCHEDULER}))

    def refusal(self, info: PodInfo) -> str:
        """Why no pod may be evicted or moved for `info`, in words; '' when Kubernetes' rules allow it. A gang member
        (room for one member promises the gang nothing); a pod whose preemptionPolicy is Never (its PriorityClass lets
        it jump the queue, never evict: kube-scheduler's PodEligibleToPreemptOthers); a pod of a schedulerName Tessera
        does not serve (another scheduler places it, or none does: a tenant naming one evicts nobody)."""
        if info.in_gang:
            return "a gang member (room for one member promises the gang nothing)"
        if not info.preempts:
            return "its preemptionPolicy is Never"
        if info.scheduler_name not in self.scheduler_names:
            return f"its schedulerName {info.scheduler_name[:63]!r} is not one Tessera serves"
        return ""

    def possible(self, info: PodInfo, preempt: bool = True) -> bool:
        """Whether any bound pod could make room for `info`: one of lower priority (with `preempt`), or a movable
        trainer of no higher priority (moves on), and no rule forbids it (`refusal`). One pass over the pods,
        no placement: the preemptor asks it before a plan spends its budget."""
        if self.refusal(info):
            return False
        return any(p.node and not p.terminating and ((preempt and p.priority < info.priority)
                                                     or (self.moves.on and p.movable and p.priority <= info.priority))
                   for p in self.pods.values())

    def room_possible(self, info: PodInfo, preempt: bool = True) -> bool:
        """The cheap check before a plan: whether the pod would fit one of the nodes a plan weighs once every pod the
        plan may take there is gone (lower priority with `preempt`, movable trainers of no higher priority with moves
        on). One trial fit per node, on the nodes a preemption plan weighs (so a pod that fails it is one that plan
        could not help) and up to ROOM_CHECK_NODES move targets (past that a move is taken as possible)."""
        failed = self.plannable(info)
        if not failed:
            return False
        nodes = dict.fromkeys(self.candidates(info, failed) if preempt else [], preempt)
        if self.moves.on and not self.judge.held_for_shorter_runs(info):
            targets = [n for n in failed if not self.queue_reservations.closed_to(info, n)]
            if len(targets) > ROOM_CHECK_NODES:
                return True
            nodes.update((n, nodes.get(n, False)) for n in targets)
        request = self.placer.request_for(info.request)
        bound = {i.key: i for i in self.pods.values() if i.node in nodes and not i.terminating}
        return any(self.fits_emptied(info, request, n, lower, bound) for n, lower in nodes.items())

    def fits_emptied(self, info: PodInfo, request, name: str, lower: bool, bound: dict[str, PodInfo]) -> bool:
        """Whether `request` fits node `name` with every pod a plan may take there gone (`bound`: the pods there by
        key): lower-priority ones with `lower`, movable trainers of no higher priority with moves on."""
        node = self.cluster.by_name.get(name)
        if node is None:
            return False
        gone = frozenset(key for key in node.pods if (i := bound.get(key)) is not None and i.node == name
                         and ((lower and i.priority < info.priority)
                              or (self.moves.on and i.movable and i.priority <= info.priority)))
        return bool(gone) and preemption.fits_without(self.placer, request, node)(gone)

    def plannable(self, info: PodInfo) -> list[str]:
        """The nodes a plan for the pod may clear: those it fails on for want of room that kube-scheduler offered it;
        [] when it fits somewhere now, or no plan is allowed (a rule, a nomination, victims still leaving)."""
        if not self.synced() or self.refusal(info) or info.uid in self.nominations.by_uid \
                or self.victims_leaving(info):
            return []
        outcome = self.judge.judge(info, sorted(self.cluster.by_name))
        return [] if outcome.passed else self.judge.offered_nodes(info, outcome.failed)

    def candidates(self, info: PodInfo, failed: list[str]) -> list[str]:
        """Of `failed`, the nodes a preemption plan weighs: clearable, not closed to the pod, with lower-priority pods,
        the PLAN_NODES holding the most such GPU milli first."""
        offered = self.judge.clearable(info, dict.fromkeys(failed))
        closed = self.judge.closed_nodes(info)  # once: per node it had cost 50 ms over 5,000 nodes
        lower = self.lower_priority_milli(info.priority, [n for n in offered if n not in closed])
        return sorted(lower, key=lambda n: (-lower[n], n))[:preemption.PLAN_NODES]

    def plan_preemption(self, info: PodInfo, protected: frozenset[str] = frozenset()) -> Nomination | None:
        """The node and victims Tessera itself would preempt for the pod now, changing nothing; None if none helps.

        For kube-scheduler 1.20.2, which never calls the preempt verb (kube/preemptor.py acts on this).
        Candidates are the nodes the pod fails on for want of room, with lower-priority pods on them,
        the PLAN_NODES holding the most such GPU milli first; `protected` names pods (namespace/name)
        a disruption budget keeps, taken only when nothing else helps.
        """
        failed = self.plannable(info)
        if not failed:
            return None
        candidates = self.candidates(info, failed)
        plan = self.victims(info, dict.fromkeys(candidates, []), protected)
        if not plan:
            return None
        node = min(plan)
        victims = {u: self.pods[u].key for u in plan[node]}
        return Nomination(info.uid, info.key, info.priority, node, self.placer.request_for(info.request), victims,
                          self.nominations.clock())

    def plan_move(self, info: PodInfo) -> Nomination | None:
        """The movable trainers Tessera would move so the pod fits, and where each goes, changing nothing; None if none.

        Only with moves on, for a pod that passes no node; the target is one of the nodes it fails on for want of room
        (not one its taints, model or a reservation close to it), and each trainer lands only where it is tolerated and
        on no node reservations or the drain pool restrict (where its replacement could be refused).
        """
        if not self.moves.on or not self.synced() or self.refusal(info) or info.uid in self.nominations.by_uid \
                or self.judge.held_for_shorter_runs(info):
            return None
        outcome = self.judge.judge(info, sorted(self.cluster.by_name))
        if outcome.passed:
            return None
        targets = [n for n in self.judge.offered_nodes(info, outcome.failed) if not self.queue_reservations.closed_to(info, n)]
        restricted = self.queue_reservations.restricted_nodes()
        return self.moves.plan(info, targets, self.nominations.by_uid.values(),
                               lambda pod: restricted.union(*(group for group, _ in self.nodes.blocked(pod.tolerations))))

    def nominate(self, plan: Nomination) -> bool:
        """Record `plan` if it still holds (victims bound there, the pod fits without them): the caller then deletes them."""
        node = self.cluster.by_name.get(plan.node)
        if node is None or plan.uid in self.nominations.by_uid or plan.uid not in self.pods:
            return False
        if any((i := self.pods.get(u)) is None or i.node != plan.node for u in plan.victims):
            return False
        if not preemption.fits_without(self.placer, plan.request, node)(plan.victim_keys):
            return False
        self.nominations.add(plan)
        if plan.moves:
            self.moves.record(plan)
        return True

    def victims_leaving(self, info: PodInfo) -> bool:
        """kube-scheduler already preempted for this pod (whole GPUs it counts itself): lower-priority pods on
        the node it nominated are terminating. Preempting again would take a second set (its own rule, too)."""
        node = self.cluster.by_name.get(info.nominated_node) if info.nominated_node else None
        if node is None:
            return False
        return any(i.terminating and i.priority < info.priority for i in self.pods.values() if i.node == node.spec.name)

    def lower_priority_milli(self, priority: int, names: Iterable[str]) -> dict[str, int]:
        """Per node of `names`, the GPU milli (+1 per pod, so CPU-only victims count) its lower-priority pods hold."""
        wanted = set(names)
        out: dict[str, int] = {}
        for i in self.pods.values():  # one pass: the pods' own nodes, not a walk of every wanted node's pods
            if i.node in wanted and i.priority < priority and not i.terminating:
                node = self.cluster.by_name.get(i.node)
                a = node.pods.get(i.key) if node is not None else None
                if a is not None:
                    out[i.node] = out.get(i.node, 0) + a.milli * len(a.gpus) + 1
        return out

    def victims(self, info: PodInfo, victims: dict[str, list[str]],
                protected: frozenset[str] = frozenset()) -> dict[str, list[str]]:
        """preempt's choice, by UID: none for a pod `refusal` names a rule against."""
        if self.refusal(info):
            return {}
        request = self.placer.request_for(info.request)
        bound = {i.key: i for i in self.pods.values() if i.node in victims and i.phase not in TERMINAL_PHASES}
        ranked: dict[str, tuple[tuple, list[str]]] = {}
        for name, uids in victims.items():
            node = self.cluster.by_name.get(name)
            if node is None or self.nodes.taint_refusal(info.tolerations, name):
                continue
            # once each, and none the watch shows on another node: kube-scheduler sends neither, a forged body may
            uids = [u for u in dict.fromkeys(uids) if (i := self.pods.get(u)) is None or i.node == name]
            given = [preemption.Victim(u, i.key, i.priority) if (i := self.pods.get(u)) else preemption.Victim(u, u, 0)
                     for u in uids]
            taken = {v.uid for v in given}
            pool = [preemption.Victim(i.uid, key, i.priority, key in protected) for key in node.pods
                    if (i := bound.get(key)) is not None and i.node == name and i.priority < info.priority
                    and i.uid not in taken and not i.terminating]
            extra = preemption.fewest_victims(preemption.fits_without(self.placer, request, node),
                                              frozenset(v.key for v in given), pool)
            if extra is not None:
                ranked[name] = (preemption.rank(given + list(extra)), uids + [v.uid for v in extra])
        best = min((r for r, _ in ranked.values()), default=None)
        return {name: chosen for name, (r, chosen) in ranked.items() if r == best}
