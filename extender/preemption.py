"""Preemption for GPU pods: on each candidate node, the fewest lower-priority victims that make room.

kube-scheduler 1.20 picks candidate victims with its in-tree filters only, and those ignore
`tessera.dev/gpu-milli` (it is `ignoredByScheduler`): a 600-milli pod beside two 500-milli pods
dry-runs as fitting with no victim at all, is nominated, and waits forever. Its HTTP extender maps
each UID the preempt verb returns back to a pod in its own cache on that node, so the verb may
*change* the victims (docs/wire-protocol.md §7). This module decides them:

* kube-scheduler's own victims stay (its in-tree filters need them: CPU, memory, ports);
* to them it adds the fewest pods, each of lower priority than the preemptor and bound to the node
  as the watch shows it, whose removal lets the Placer fit the pod (one GPU for a slice, the GPUs a
  multi-GPU pod needs, with CPU, memory and model as the policy judges them);
* among sets it prefers the lowest highest priority, then the fewest pods, as kube-scheduler's
  pickOneNodeForPreemption ranks nodes, and the verb keeps only the best-ranked nodes, so the
  choice does not rest on kube-scheduler's tie-breaks;
* a node where no set of such pods helps is vetoed: nothing is evicted for nothing;
* pods a PodDisruptionBudget protects (`Victim.protected`) are taken only when no set without
  them helps, and sets with fewer of them rank first, as kube-scheduler's selectVictimsOnNode and
  pickOneNodeForPreemption do: a budget is honoured where it can be, never a reason to leave the
  preemptor waiting for ever.

Every returned set is non-redundant: no victim could be spared with the others still removed.

kube-scheduler 1.20.2 never calls the preempt verb (docs/wire-protocol.md §7), so Tessera also
acts on this choice itself: `plan` picks one node's victims and `kube/preemptor.py` deletes them.
`beside_nominee` keeps the room so made for the preemptor: a pod of lower or equal priority may
use a node being cleared only if the preemptor still fits there beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations

from .core.cluster import NodeState, scratch_without
from .core.model import PodRequest
from .core.placer import Placer

# Trial fits tried per node before the exact search gives way to kube-scheduler's own greedy
# (reprieve the most important first). A node of 8 GPUs with 16 slices needs 16 + 120 trials for
# every set of up to two victims; the trials build a one-node cluster (~20 us each), so 512 keep a
# call over kube-scheduler's 100 candidate nodes near a second at worst.
SEARCH_BUDGET = 512
# Nodes Tessera's own preemption plan weighs per pod (kube-scheduler 1.20 dry-runs max(10% of nodes,
# 100)): each costs up to SEARCH_BUDGET trial fits under the extender's lock, so 32 bound a plan near
# 0.3 s at worst; the nodes whose lower-priority pods hold the most GPU milli go first.
PLAN_NODES = 32
PRIORITY_OFFSET = 2**31  # kube-scheduler adds MaxInt32 + 1 before summing priorities, so more pods always weigh more


@dataclass(frozen=True, slots=True)
class Victim:
    uid: str
    key: str  # namespace/name, as the cluster names its assignment
    priority: int
    protected: bool = False  # a PodDisruptionBudget allows no more disruptions of it (kube/preemptor.py reads them)


def rank(victims: Iterable[Victim]) -> tuple[int, int, int, int]:
    """kube-scheduler's order between candidate nodes: fewest budget violations, lowest highest priority,
    lowest offset sum, fewest."""
    chosen = list(victims)
    prios = [v.priority for v in chosen]
    return (sum(v.protected for v in chosen), max(prios, default=-PRIORITY_OFFSET),
            sum(p + PRIORITY_OFFSET for p in prios), len(prios))


def fits_without(placer: Placer, request: PodRequest, node: NodeState) -> Callable[[frozenset[str]], bool]:
    """Whether `request` fits `node` once the pods named (namespace/name) are gone, on a scratch copy."""
    def fits(gone: frozenset[str]) -> bool:
        return placer.fits(request, scratch_without(node, gone).nodes[0]) is None
    return fits


def fewest_victims(fits: Callable[[frozenset[str]], bool], given: frozenset[str], pool: list[Victim],
                   budget: int = SEARCH_BUDGET) -> tuple[Victim, ...] | None:
    """The victims from `pool` to add to `given` (keys) so the pod fits; () if none needed; None if none help.

    Priority levels are tried from the lowest up, so a set of low-priority pods wins over a
    smaller one that would take a higher-priority pod (kube-scheduler's node order); pods a
    disruption budget protects join only once every unprotected pod is not enough.
    """
    if fits(given):
        return ()
    for with_protected in (False, True):
        for level in sorted({v.priority for v in pool}):
            allowed = [v for v in pool if v.priority <= level and (with_protected or not v.protected)]
            if fits(given | {v.key for v in allowed}):
                return _smallest(fits, given, allowed, budget)
    return None


def _smallest(fits: Callable[[frozenset[str]], bool], given: frozenset[str], allowed: list[Victim],
              budget: int) -> tuple[Victim, ...]:
    """The fewest of `allowed` that make the pod fit (all of them do), best ranked; greedy past the budget."""
    for size in range(1, len(allowed) + 1):
        trials = math.comb(len(allowed), size)
        if trials > budget:
            break
        budget -= trials
        found = [c for c in combinations(allowed, size) if fits(given | {v.key for v in c})]
        if found:
            return min(found, key=rank)
    return _reprieve(fits, given, allowed)


def beside_nominee(placer: Placer, request: PodRequest, node: NodeState, nominee: PodRequest,
                   victims: frozenset[str]) -> bool:
    """Whether `request` may take room on a node being cleared for `nominee`: the nominee, placed
    first where the policy puts it once its victims are gone, must leave room for `request` too.

    A nominee that would not fit even then is stale (the node changed under it) and blocks nothing.
    """
    trial = scratch_without(node, victims)
    spot = trial.nodes[0]
    if placer.fits(nominee, spot) is not None:
        return True
    trial.place(nominee, spot.spec.name, placer.gpus_for(nominee, spot, placer.policy.score(nominee, spot)))
    return placer.fits(request, spot) is None


def _reprieve(fits: Callable[[frozenset[str]], bool], given: frozenset[str], allowed: list[Victim]) -> tuple[Victim, ...]:
    """kube-scheduler's selectVictimsOnNode: all removed, then each put back, the most important first, if it still fits."""
    gone = {v.key: v for v in allowed}
    for v in sorted(allowed, key=lambda v: -v.priority):
        del gone[v.key]
        if not fits(given | gone.keys()):
            gone[v.key] = v
    return tuple(gone.values())
