"""Defragmentation by moving elastic trainers: which movable pods to move so that a waiting pod fits.

Placement alone cannot undo the fragmentation that arrivals and departures leave: a pod that needs a
whole node waits while every node keeps a few slices. Other schedulers defragment by evicting pods;
Tessera moves instead, and only trainers of elastic jobs that opted in (`tessera.dev/movable`; the
server's side is extender/moves.py): such a job shrinks in about 100 ms, its trainer is replaced on another node and the
job regrows, so a move costs at most one step redone. This module is the pure decision, over the placement core only:

* `plan` finds, for one waiting pod, the cheapest set of moves that lets it be placed: the fewest
  trainers moved, then the least GPU milli moved, then the first target node in tie order. All moved
  pods leave one node (the target), the waiting pod takes that node, and each moved pod goes where the
  same `Placer` (the same policy) would put it on the other nodes, one moved pod per destination, so
  each destination is judged on exactly the state it will have when the pod lands there.
* Only pods named in `movable` are ever moved, and only as their job's budget allows (`Budgets`): at
  most one move in flight per job (so at most one trainer per job in a plan), a minimum interval
  between moves of the same job, never below the job's minimum world size.
* Nothing changes while planning: every trial fit runs on a one-node scratch copy
  (`scratch_without`), destinations are read from the live verdicts. `apply` carries a plan out,
  all or nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import combinations

from .cluster import Cluster, NodeState, PlacementError, scratch_without
from .model import AccountedRequest, Assignment
from .placer import Placer

# Target nodes weighed per plan, the lowest lower bound on a plan's cost first. Packing mode on the openb
# default trace (1213 nodes, 30% of GPU pods movable, seeds 42-43, measured by wrapping `plan`): 4858 plans
# asked, a mean 0.23 candidate nodes each (most trainers fit nowhere but where they are), 0.08% of plans had
# more than 32, and every plan found was one move on the first candidate. 32 only bounds the rare worst case.
PLAN_NODES = 32
# Trial fits (a one-node scratch copy each, ~20 us) per plan over all its nodes: a node of 8 GPUs with 6
# movable trainers has 6 + 15 + 20 sets of up to three, so 256 weigh every set of up to three trainers on
# several candidate nodes. In the run above a plan took 1.0 ms mean, 1.6 ms at p99, 68 ms at most.
SEARCH_BUDGET = 256
# Minimum time between two moves of one job. A move costs the job at most one step redone and about
# 100 ms of shrinking, but its replacement needs a pod start (image, `ray start`, the torch import:
# ~3.5 s measured in raybridge's tests, minutes on a real kubelet pulling an image); five minutes
# keep one job from being moved again and again while the cluster churns.
MIN_INTERVAL_S = 300.0
# What one move costs its trainer in time mode: the replacement's start on the destination (a pod start
# with the image already there, `ray start`, the torch import) before it trains again. The e2e move
# (tests/e2e/test_moves_e2e.py) joins in seconds with no image to pull; a minute is a kubelet's pod start.
MOVE_COST_S = 60.0


@dataclass(frozen=True, slots=True)
class MovableTrainer:
    """A movable pod: its request as placed (what its replacement asks for) and the job it belongs to."""

    request: AccountedRequest
    job: str


@dataclass(frozen=True, slots=True)
class JobBudget:
    """One elastic job's disruption budget, as the caller knows it now."""

    world: int  # trainers running now
    min_world: int = 1  # the job never runs on fewer: a move shrinks it by one until the replacement joins
    moving: bool = False  # a move of this job is in flight
    last_move_s: float = -math.inf  # when its last move started (the caller's clock)


@dataclass(frozen=True, slots=True)
class Budgets:
    """Every job's budget; `default` for jobs not listed (None: a job not listed is never moved)."""

    jobs: Mapping[str, JobBudget] = field(default_factory=dict)
    default: JobBudget | None = None
    now_s: float = 0.0
    min_interval_s: float = 0.0

    def allows(self, job: str) -> bool:
        """Whether one trainer of `job` may start moving now."""
        b = self.jobs.get(job, self.default)
        return (b is not None and not b.moving and b.world - 1 >= b.min_world
                and self.now_s - b.last_move_s >= self.min_interval_s)


# Packing mode: every movable pod is its own one-pod job, with no clock and nothing in flight between pods.
ONE_POD_JOBS = Budgets(default=JobBudget(world=1, min_world=0))


@dataclass(frozen=True, slots=True)
class Move:
    """One trainer moved: it leaves `source` and its replacement takes `gpus` of `dest`."""

    pod: AccountedRequest
    source: str
    dest: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """The waiting pod goes to `gpus` of `target` once `moves` are made."""

    target: str
    gpus: tuple[int, ...]
    moves: tuple[Move, ...]

    @property
    def cost(self) -> tuple[int, int]:
        """What the plan is ranked by: trainers moved, then GPU milli moved."""
        return len(self.moves), sum(m.pod.gpu_demand for m in self.moves)


Blocked = Callable[[str], Collection[str]]  # a moved pod's name -> nodes it may not land on (taints it does not tolerate)


def plan(cluster: Cluster, placer: Placer, request: AccountedRequest, movable: Mapping[str, MovableTrainer],
         budgets: Budgets, targets: Collection[str] | None = None, blocked: Blocked | None = None) -> DefragPlan | None:
    """The cheapest plan that places `request` (as the policy accounts it), or None when no set of movable
    trainers on any one of the PLAN_NODES most promising nodes helps within SEARCH_BUDGET trial fits.

    `targets`: the only nodes the waiting pod may take (None: any); `blocked`: nodes each moved pod may not
    land on (the server's taints; None: none)."""
    best: DefragPlan | None = None
    trials = [SEARCH_BUDGET]
    for bound, node, pool in _candidates(cluster, placer, request, movable, budgets, targets)[:PLAN_NODES]:
        if best is not None and bound >= best.cost:
            break  # candidates come in order of this lower bound: no later node can beat the plan in hand
        found = _cheapest_on(placer, request, node, pool, best, trials, blocked)
        if found is not None:
            best = found
        if trials[0] <= 0:
            break
    return best


def _candidates(cluster: Cluster, placer: Placer, request: AccountedRequest, movable: Mapping[str, MovableTrainer],
                budgets: Budgets, targets: Collection[str] | None
                ) -> list[tuple[tuple[int, int], NodeState, list[MovableTrainer]]]:
    """(lower bound on a plan's cost there, node, its movable trainers smallest first) for each node where
    moving trainers could be enough, the lowest bound first, then in tie order.

    A trainer that fits on no node but its own is left out at once (one lookup in its shape's view):
    on a full cluster most are, and each would otherwise cost trial fits for nothing."""
    elsewhere: dict[tuple, int] = {}
    pools: dict[str, list[MovableTrainer]] = {}
    for name, t in movable.items():
        placed = cluster.assignments.get(name)
        if placed is None or (targets is not None and placed.node not in targets):
            continue
        if budgets.allows(t.job) and _fits_elsewhere(placer, t.request, placed.node, elsewhere):
            pools.setdefault(placed.node, []).append(t)
    if not pools:
        return []
    rank = {n.name: i for i, n in enumerate(placer.in_order())}
    out = []
    for name, pool in pools.items():
        node = cluster.by_name[name]
        if not _enough(request, node, pool) or placer.never_fits(request, name):
            continue
        alone = [_milli(t) for t in pool if _enough(request, node, [t])]
        bound = (1, min(alone)) if alone else (2, _gpu_short(request, node))
        out.append((bound, rank[name], node, sorted(pool, key=_milli)))
    out.sort(key=lambda c: (c[0], c[1]))
    return [(bound, node, pool) for bound, _, node, pool in out]


def _fits_elsewhere(placer: Placer, pod: AccountedRequest, node: str, memo: dict[tuple, int]) -> bool:
    """Whether `pod` fits some node other than `node` now (its shape's view, counted once per plan)."""
    count = memo.get(pod.key)
    if count is None:
        count = memo[pod.key] = len(placer.view(pod).fit)
    return count > 1 or (count == 1 and node not in placer.view(pod).fit)


def _gpu_short(request: AccountedRequest, node: NodeState) -> int:
    """GPU milli that must leave `node` at least before the request fits its best GPUs: a lower bound on milli moved."""
    have = sorted(node.gpu_free, reverse=True)[:request.gpu_count]
    return max(0, request.gpu_demand - sum(max(0, f) for f in have))


def _milli(trainer: MovableTrainer) -> int:
    return trainer.request.gpu_demand


def _enough(request: AccountedRequest, node: NodeState, pool: list[MovableTrainer]) -> bool:
    """Arithmetic only (no copy): whether the node's free room plus everything `pool` holds could hold the
    request. Necessary for a fit, so a node failing it is skipped without a trial."""
    held = [node.pods[t.request.name] for t in pool]
    if request.cpu_milli > node.cpu_free + sum(a.cpu_milli for a in held):
        return False
    if request.memory_mib > node.memory_free + sum(a.memory_mib for a in held):
        return False
    if not request.gpu_count:
        return True
    freed = list(node.gpu_free)
    for a in held:
        for g in a.gpus:
            freed[g] += a.milli
    return sum(1 for f in freed if f >= request.gpu_milli) >= request.gpu_count


def _cheapest_on(placer: Placer, request: AccountedRequest, node: NodeState, pool: list[MovableTrainer],
                 best: DefragPlan | None, trials: list[int], blocked: Blocked | None = None) -> DefragPlan | None:
    """The cheapest plan with `node` as target that beats `best`, or None; `trials[0]` counts down the budget."""
    for trainers in _sets(pool, len(best.moves) if best is not None else len(pool), trials[0]):
        chosen = tuple(t.request for t in trainers)
        cost = (len(chosen), sum(p.gpu_demand for p in chosen))
        if best is not None and cost >= best.cost:
            continue
        if trials[0] <= 0:
            return None
        trials[0] -= 1
        gpus = _fit_once_gone(placer, request, node, frozenset(p.name for p in chosen))
        if gpus is None:
            continue
        moves = _destinations(placer, node, chosen, blocked)
        if moves is not None:
            return DefragPlan(node.name, gpus, moves)  # sets come cheapest first: the first that works is this node's best
    return None


def _sets(pool: list[MovableTrainer], most: int, budget: int) -> Iterator[tuple[MovableTrainer, ...]]:
    """Sets of trainers of distinct jobs (one move in flight per job), fewest first, then least milli; sizes
    with more sets than `budget` trials are not even listed (a node of many small trainers)."""
    for size in range(1, most + 1):
        if math.comb(len(pool), size) > budget:
            return
        sets = [c for c in combinations(pool, size) if len({t.job for t in c}) == size]
        yield from sorted(sets, key=lambda c: sum(t.request.gpu_demand for t in c))


def _fit_once_gone(placer: Placer, request: AccountedRequest, node: NodeState, gone: frozenset[str]) -> tuple[int, ...] | None:
    """The GPUs the policy would give `request` on `node` once the pods `gone` left, or None if it would not fit."""
    spot = scratch_without(node, gone).nodes[0]
    if placer.fits(request, spot) is not None:
        return None
    return placer.gpus_for(request, spot, placer.policy.score(request, spot))


def _destinations(placer: Placer, target: NodeState, pods: tuple[AccountedRequest, ...],
                  blocked: Blocked | None = None) -> tuple[Move, ...] | None:
    """Where each moved pod goes: the policy's choice among the nodes other than the target, the
    destinations already taken by this plan and the nodes `blocked` keeps it off; None when one fits nowhere."""
    taken = {target.name}
    moves = []
    order = placer.in_order()
    for pod in pods:
        off = taken.union(blocked(pod.name)) if blocked is not None else taken
        choice = placer.choose(pod, [n for n in order if n.name not in off])
        if choice is None:
            return None
        taken.add(choice.node.name)
        moves.append(Move(pod, target.name, choice.node.name, choice.gpus))
    return tuple(moves)


def apply(cluster: Cluster, request: AccountedRequest, found: DefragPlan) -> Assignment:
    """Carry a plan out on the cluster it was made for: the moved pods leave, the waiting pod takes the
    target, each moved pod lands on its destination. All or nothing: if any step is refused (the cluster
    changed since planning), every step already taken is undone and PlacementError raised."""
    undo: list[Callable[[], object]] = []
    try:
        for m in found.moves:
            left = cluster.release(m.pod.name)
            undo.append(lambda a=left: cluster.adopt(a))
        placed = cluster.place(request, found.target, found.gpus)
        undo.append(lambda: cluster.release(request.name))
        for m in found.moves:
            cluster.place(m.pod, m.dest, m.gpus)
            undo.append(lambda name=m.pod.name: cluster.release(name))
    except PlacementError:
        for step in reversed(undo):
            step()
        raise
    return placed
