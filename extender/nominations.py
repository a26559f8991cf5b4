"""Nominations: nodes being cleared for a preemptor, kept for it until it binds.

When Tessera preempts (kube/preemptor.py), it deletes the victims and the preemptor is bound
only at kube-scheduler's next attempt: a second or two later, or the victims' whole grace period
later (30 s by default) when a kubelet has to stop them. Until then the room the victims leave
must stay the preemptor's: otherwise the pods kube-scheduler retries first, or the ones arriving
meanwhile, take it, and the preemptor preempts again. kube-scheduler keeps such room through the
pod's `nominatedNodeName` for the resources it knows; it knows nothing of GPU slices, so Tessera
keeps it here: a pod of lower or equal priority may use a nominated node only if the preemptor
still fits there beside it (preemption.beside_nominee), as kube-scheduler's own filters do for
nominated pods.

Bounds: a nomination lasts while any of its victims is still watched (terminating), then
`ttl_s` more (the preemptor's next attempt: kube-scheduler's backoff is at most 10 s and its
flush of unschedulable pods 60 s), and never past `max_age_s` (a victim whose deletion never
finishes must not hold a node for ever). The preemptor binding, or being deleted, ends it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .core.model import PodRequest

NOMINATION_TTL_S = 60.0
NOMINATION_MAX_AGE_S = 600.0  # ten times kube's default grace period: past it, the victims' room is anyone's


@dataclass(frozen=True, slots=True)
class Nomination:
    """`uid` (pod `key`, `priority`) preempts `victims` (uid -> namespace/name) to go to `node` with `request`.

    With `moves` (namespace/name -> destination node) the victims are not evicted but moved: trainers of
    elastic Ray jobs whose replacements go to the nodes named (moves.py, kube/preemptor.py)."""

    uid: str
    key: str
    priority: int
    node: str
    request: PodRequest  # as the policy accounts it
    victims: dict[str, str]
    made: float
    moves: dict[str, str] = field(default_factory=dict)

    @property
    def victim_keys(self) -> frozenset[str]:
        return frozenset(self.victims.values())


@dataclass(slots=True)
class Nominations:
    """Bookkeeping only, under the Extender's lock: which pods preempted where, and when that lapses."""

    ttl_s: float = NOMINATION_TTL_S
    max_age_s: float = NOMINATION_MAX_AGE_S
    clock: Callable[[], float] = time.monotonic
    by_uid: dict[str, Nomination] = field(default_factory=dict)
    cleared: dict[str, float] = field(default_factory=dict)  # uid -> when its last victim left the watch

    def add(self, nomination: Nomination) -> None:
        self.by_uid[nomination.uid] = nomination
        self.cleared.pop(nomination.uid, None)

    def drop(self, uid: str) -> Nomination | None:
        self.cleared.pop(uid, None)
        return self.by_uid.pop(uid, None)

    def victim_gone(self, victim_uid: str) -> None:
        """A pod left the watch: a nomination whose victims are all gone starts its last `ttl_s`."""
        for n in self.by_uid.values():
            if victim_uid in n.victims:
                n.victims.pop(victim_uid)  # the dict is the nomination's own: the frozen record stays one object
                if not n.victims:
                    self.cleared[n.uid] = self.clock()

    def expire(self) -> list[Nomination]:
        now = self.clock()
        stale = [n for n in self.by_uid.values()
                 if now - n.made > self.max_age_s or (n.uid in self.cleared and now - self.cleared[n.uid] > self.ttl_s)]
        for n in stale:
            self.drop(n.uid)
        return stale

    def on(self, node: str, uid: str, priority: int) -> Iterator[Nomination]:
        """Other pods' nominations on `node` that a pod of `priority` must leave room for."""
        for n in self.by_uid.values():
            if n.node == node and n.uid != uid and n.priority >= priority:
                yield n
