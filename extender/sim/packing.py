"""Packing mode: the FGD paper's experiment (docs/fragmentation.md §6).

The trace is shuffled with a seed and resampled to 130% of the cluster's GPU capacity; pods
arrive one at a time, are placed at once or fail for good, and never leave. After every pod
we record arrived and allocated GPU milli; the result is the unallocated GPU share at each
integer percent of arrived workload (50..130), averaged over the pods that land on it.

With a movable share F > 0 (`Mover`), each GPU pod is movable by a seeded draw, and a pod that fits
nowhere asks the defragmentation planner (core/defrag.py) which movable pods to move so it fits;
with F = 0 nothing of that runs and the replay is exactly the one without it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace

from ..core.cluster import Cluster
from ..core.defrag import ONE_POD_JOBS, Budgets, DefragPlan, MovableTrainer, apply, plan
from ..core.fragmentation import FragmentationIndex, FragmentationMeasure
from ..core.model import NodeSpec, PodRequest
from ..core.policy import PolicyContext, make_policy
from ..core.workload import TargetWorkload
from .schedulers import DEFAULT_EXTENDER_WEIGHT, Choice, Scheduler, make_scheduler

INFLATION = 1.3
ARRIVED_POINTS = tuple(range(50, 131))
REPORT_POINTS = (50, 60, 70, 80, 90, 95, 100, 110, 120, 130)


def inflate(pods: list[PodRequest], capacity_milli: int, seed: int, ratio: float = INFLATION) -> list[PodRequest]:
    """Seeded shuffle, then resample with replacement (or drop) to `ratio` x GPU capacity.

    Keeps the artifact's quirk: the stop test of the resampling compares the drawn pod's
    per-GPU share, not its total request.
    """
    if not any(p.gpu_demand for p in pods):  # the resampling below would never reach a GPU target: it spun for good
        raise ValueError("no pod of the trace asks for a GPU: there is no GPU load to resample (packing measures GPUs)")
    rng = random.Random(seed)
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    target = ratio * capacity_milli
    total = sum(p.gpu_demand for p in order)
    if total < target:
        n = 0
        while True:
            p = rng.choice(base)
            if total + p.gpu_milli > target:
                break
            n += 1
            order.append(replace(p, name=f"{p.name}~{n}"))
            total += p.gpu_demand
    while total > target and order:
        p = order.pop(rng.randrange(len(order)))
        total -= p.gpu_demand
    return order


@dataclass
class PackingResult:
    trace: str
    policy: str
    scheduler: str
    seed: int
    unallocated_pct: dict[str, float]
    frag_pct: dict[str, float]
    unserved_pct: dict[str, float]
    pods: int = 0
    rejected: int = 0
    elapsed_s: float = 0.0
    extra: dict = field(default_factory=dict)
    defrag: dict | None = None  # with a movable share: the share, moves made, pods placed thanks to moves

    def as_json(self) -> dict:
        out = {
            "mode": "packing", "trace": self.trace, "policy": self.policy, "scheduler": self.scheduler,
            "seed": self.seed, "unallocated_pct": self.unallocated_pct, "frag_pct": self.frag_pct,
            "unserved_pct": self.unserved_pct, "pods": self.pods, "rejected": self.rejected,
            "elapsed_s": round(self.elapsed_s, 2),
        }
        if self.defrag is not None:  # absent without moves: the JSON stays what it was before moves existed
            out["defrag"] = self.defrag
        return out


@dataclass
class Mover:
    """Packing mode's defragmentation: which placed pods are movable, and what moving them did.

    Each GPU pod is movable with probability `share`, drawn from the seed and the pod's name alone, so
    the draw does not depend on the order pods arrive or on what else was drawn. Every movable pod is
    its own one-pod job (`ONE_POD_JOBS`): packing mode has no clock, so no move is in flight when the
    next pod arrives, and a pod moved once may move again.
    """

    share: float
    seed: int
    movable: dict[str, MovableTrainer] = field(default_factory=dict)
    moves: int = 0
    placed: int = 0
    plans: int = 0  # times the planner was asked (each pod that fit nowhere)
    last: DefragPlan | None = None  # the last plan asked for

    def placed_pod(self, request: PodRequest) -> None:
        if request.gpu_count and random.Random(f"{self.seed}/{request.name}").random() < self.share:
            self.movable[request.name] = MovableTrainer(request, job=request.name)

    def rescue(self, chooser: Scheduler, request: PodRequest, budgets: Budgets = ONE_POD_JOBS,
               targets: Collection[str] | None = None, off_limits: frozenset[str] = frozenset()) -> Choice | None:
        """Place a pod that fits nowhere by moving movable pods, if a plan exists; where it went, or None.
        `targets`: the nodes the pod may be placed on by moves (None: any); `off_limits`: nodes no moved pod may
        land on (time mode: reserved and drain-pool nodes). The plan carried out is `self.last` (time mode
        lengthens the moved pods' runs by it)."""
        self.plans += 1
        found = self.last = plan(chooser.cluster, chooser.placer, request, self.movable, budgets, targets,
                                 (lambda _: off_limits) if off_limits else None)
        if found is None:
            return None
        apply(chooser.cluster, request, found)
        self.moves += len(found.moves)
        self.placed += 1
        return Choice(chooser.cluster.by_name[found.target], found.gpus)

    def summary(self) -> dict:
        return {"movable_share": self.share, "movable_pods": len(self.movable), "plans_asked": self.plans,
                "moves": self.moves, "placed_by_moves": self.placed}


def _bucket_means(sums: dict[int, list[float]], points) -> dict[str, float]:
    """Per integer percent arrived, the mean of the values recorded there. Where no pod landed, the artifact's
    neighbours within ±1; where none landed there either (a pod worth over 2% of a small cluster's GPUs jumps
    points: on 40 nodes the 110% column was nan and the JSON lacked the key), the state the last pod before it
    left, which is what the cluster holds at that point. On openb's 1213 nodes every point has its own pods."""
    out = {}
    for x in points:
        vals = sums.get(x)
        if not vals:  # the artifact falls back to the neighbours within ±1
            vals = [v for y in (x - 1, x + 1) for v in sums.get(y, [])]
        if not vals:
            below = [y for y in sums if y < x and sums[y]]
            vals = [sums[max(below)][-1]] if below else []
        if vals:
            out[str(x)] = round(sum(vals) / len(vals), 4)
    return out


def place_each(chooser: Scheduler, pods: Iterable[PodRequest],
               mover: Mover | None = None) -> Iterator[tuple[PodRequest, PodRequest, Choice | None]]:
    """Each pod in turn, placed before the next: (pod, its request as the policy accounts it, where it went or None).

    With a `mover`, a pod that fits nowhere is placed by moving movable pods where a plan exists."""
    for pod in pods:
        request = chooser.placer.request_for(pod)
        choice = chooser.choose(request)
        if choice is not None:
            chooser.cluster.place(request, choice.node.name, choice.gpus)
        elif mover is not None:
            choice = mover.rescue(chooser, request)
        if choice is not None and mover is not None:
            mover.placed_pod(request)
        yield pod, request, choice


def replay_packing(
    nodes: list[NodeSpec],
    pods: list[PodRequest],
    policy_name: str,
    scheduler: str = "ideal",
    seed: int = 42,
    trace: str = "default",
    workload: TargetWorkload | None = None,
    weight: int = DEFAULT_EXTENDER_WEIGHT,
    extender_sees: str = "all",
    movable_share: float = 0.0,
) -> PackingResult:
    started = time.perf_counter()
    workload = workload or TargetWorkload.from_pods(pods)
    cluster = Cluster(nodes)
    capacity = cluster.gpu_capacity_milli
    if capacity == 0:
        raise ValueError("the cluster has no GPUs")
    if not 0 <= movable_share <= 1:
        raise ValueError(f"movable_share is a share of pods, 0..1; got {movable_share}")
    policy = make_policy(policy_name, PolicyContext(workload, seed))
    chooser = make_scheduler(scheduler, cluster, policy, seed, weight, extender_sees)
    frag = FragmentationIndex(cluster, FragmentationMeasure(workload))
    arrived = allocated = served = 0
    unalloc: dict[int, list[float]] = {}
    fragm: dict[int, list[float]] = {}
    unserved: dict[int, list[float]] = {}
    rejected = 0
    arrived_pods = inflate(pods, capacity, seed)
    mover = Mover(movable_share, seed) if movable_share > 0 else None
    for pod, request, choice in place_each(chooser, arrived_pods, mover):
        arrived += pod.gpu_demand
        if choice is None:
            rejected += 1
        else:
            allocated += request.gpu_demand
            served += pod.gpu_demand
        x = round(100 * arrived / capacity)
        if x >= ARRIVED_POINTS[0] - 1:
            unalloc.setdefault(x, []).append(100 - 100 * allocated / capacity)
            unserved.setdefault(x, []).append(100 - 100 * served / capacity)
            fragm.setdefault(x, []).append(100 * frag.total / capacity)
    return PackingResult(
        trace=trace, policy=policy_name, scheduler=scheduler, seed=seed,
        unallocated_pct=_bucket_means(unalloc, ARRIVED_POINTS),
        frag_pct=_bucket_means(fragm, ARRIVED_POINTS),
        unserved_pct=_bucket_means(unserved, ARRIVED_POINTS),
        pods=len(arrived_pods), rejected=rejected, elapsed_s=time.perf_counter() - started,
        defrag=mover.summary() if mover is not None else None,
    )
