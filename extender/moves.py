"""Moves: the server's side of defragmentation by moving elastic trainers (core/defrag.py, issue 15).

When a GPU pod fits nowhere, a plan may move trainers of elastic Ray jobs whose owner opted in
(`tessera.dev/movable: "true"` on the job's pods) off one node, the *target*, so that the pod fits
there. The extender keeps the plan as a nomination (nominations.py: the target's room stays the
waiting pod's, as for a preemptor), kube/preemptor.py deletes each moved trainer's pod, the job shrinks
around it and the Ray bridge creates its replacement, which filter then steers to the destination the
plan named. The job regrows when the replacement starts. This module is the bookkeeping, under the
Extender's lock:

* which pods are movable now (opted in, and of no higher priority than the waiting pod), and each
  job's budget: world = its members bound and not
  leaving; a job with a member pending or terminating, or named in a live plan, is mid-move and is not
  touched again; at most one move per `min_interval_s` per job; never below a world of `MIN_WORLD`;
* where each moved trainer's replacement goes (`steer`): a pod whose `tessera.dev/replaces` names a
  moved trainer of its own namespace passes filter only on the plan's destination while that node
  still fits it (elsewhere as usual when it does not). The tenant can write that annotation on any
  pod: it steers that pod to room it could have taken anyway, and no room is held for it.

Nothing here is stored: after a restart the plan is gone, the replacement is placed as any pod is,
and the waiting pod may be planned for again. Every pod is then running or pending, never lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .core import defrag
from .core.cluster import Cluster
from .core.defrag import MIN_INTERVAL_S
from .core.placer import Placer
from .nominations import NOMINATION_MAX_AGE_S, Nomination
from .state import PodInfo

# A move shrinks the job by one until the replacement joins; Ray jobs run on any world of 1 or more
# (raybridge's controller re-forms its group around the survivors), so one trainer must stay.
MIN_WORLD = 1


@dataclass(slots=True)
class Moves:
    cluster: Cluster
    placer: Placer
    pods: dict[str, PodInfo]  # the Extender's watched pods (uid -> info)
    clock: Callable[[], float]
    on: bool = False
    min_interval_s: float = MIN_INTERVAL_S
    last_move: dict[str, float] = field(default_factory=dict)  # job (namespace/gang) -> when its last move started
    dests: dict[str, tuple[str, float]] = field(default_factory=dict)  # moved pod key -> (destination, when planned)
    made: int = 0  # trainers moved since start (the tessera_trainer_moves counter)

    def plan(self, info: PodInfo, targets: Iterable[str], nominations: Iterable[Nomination],
             blocked: Callable[[PodInfo], set[str]]) -> Nomination | None:
        """The trainers to move so `info` fits one of `targets` (nodes it fails on for want of room), or None.

        `blocked(pod)`: nodes that pod may not use (taints it does not tolerate), kept out of its destinations."""
        movable, budgets, by_key = self._movable(nominations, info.priority)
        if not movable:
            return None
        request = self.placer.request_for(info.request)
        found = defrag.plan(self.cluster, self.placer, request, movable, budgets, frozenset(targets),
                            lambda key: blocked(by_key[key]))
        if found is None:
            return None
        victims = {by_key[m.pod.name].uid: m.pod.name for m in found.moves}
        return Nomination(info.uid, info.key, info.priority, found.target, request, victims, self.clock(),
                          moves={m.pod.name: m.dest for m in found.moves})

    def record(self, plan: Nomination) -> None:
        """A plan is going ahead: its jobs' clocks start, and its replacements will be steered."""
        now = self.clock()
        for uid, key in plan.victims.items():
            info = self.pods.get(uid)
            if info is not None and info.gang is not None:
                self.last_move[info.gang.name] = now
            self.dests[key] = (plan.moves[key], now)
            self.made += 1

    def steer(self, info: PodInfo, passed: list[str], failed: dict[str, str]) -> list[str]:
        """`passed` narrowed to the plan's destination for a moved trainer's replacement (while it fits there)."""
        dest = self.dests.get(info.replaces) if info.replaces else None
        if dest is None or dest[0] not in passed or len(passed) == 1:
            return passed
        why = f"tessera: {info.replaces} was moved to make room, and its replacement goes to {dest[0]}, as planned"
        failed.update((n, why) for n in passed if n != dest[0])
        return [dest[0]]

    def bound(self, info: PodInfo) -> None:
        """A pod was seen bound: a replacement that landed ends its steering."""
        if info.replaces:
            self.dests.pop(info.replaces, None)

    def expire(self) -> None:
        now = self.clock()
        for key in [k for k, (_, made) in self.dests.items() if now - made > NOMINATION_MAX_AGE_S]:
            del self.dests[key]
        for job in [j for j, t in self.last_move.items() if now - t > self.min_interval_s]:
            del self.last_move[job]

    def _movable(self, nominations: Iterable[Nomination], priority: int
                 ) -> tuple[dict[str, defrag.MovableTrainer], defrag.Budgets, dict[str, PodInfo]]:
        """The trainers movable for a pod of `priority` (pod key -> trainer), every job's budget, and those pods by key.

        Never a trainer of higher priority than the waiting pod: a pod nobody ranked above a job does not disturb it."""
        world: dict[str, int] = {}
        moving = {self.pods[u].gang.name for n in nominations for u in n.victims
                  if u in self.pods and self.pods[u].gang is not None}
        movable: dict[str, defrag.MovableTrainer] = {}
        by_key: dict[str, PodInfo] = {}
        for info in self.pods.values():
            if info.gang is None:
                continue
            job = info.gang.name
            if not info.node or info.terminating:
                moving.add(job)  # a member pending (a replacement not placed yet) or leaving: the job is mid-move
                continue
            world[job] = world.get(job, 0) + 1
            if info.movable and info.priority <= priority and info.key in self.cluster.assignments:
                movable[info.key] = defrag.MovableTrainer(self.placer.request_for(info.request), job)
                by_key[info.key] = info
        jobs = {job: defrag.JobBudget(world=w, min_world=MIN_WORLD, moving=job in moving,
                                      last_move_s=self.last_move.get(job, -math.inf)) for job, w in world.items()}
        budgets = defrag.Budgets(jobs, None, self.clock(), self.min_interval_s)
        return movable, budgets, by_key

    def listing(self) -> list[dict]:
        """For /inspect: where each moved trainer's replacement is being sent."""
        return [{"moved": key, "destination": dest} for key, (dest, _) in sorted(self.dests.items())]
