"""Time mode: pods arrive in trace order, run for their trace duration, and queue when they
do not fit. Reports queueing delay and time-averaged GPU allocation.

The openb trace barely loads a 100-node cluster as recorded, so pods keep their trace order
and durations but arrive as a Poisson process whose rate makes the offered GPU load over the
arrival window equal `load` (a share of GPU capacity). Durations are capped at that window: a
few pods ran for months, and uncapped they would pin GPUs for the whole experiment so that the
load would not be the one asked for.

The queue behaves like kube-scheduler's: a pod that does not fit waits, the pods behind it
are still tried (no head-of-line blocking), and waiting pods are retried in arrival order
whenever a pod leaves. Only the node that was freed can take a waiting pod, so the retry
looks at that node alone.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass

from ..core.cluster import Cluster, never_fits
from ..core.model import NodeSpec
from ..core.policy import PolicyContext, make_policy
from ..core.workload import Workload
from .schedulers import DEFAULT_EXTENDER_WEIGHT, Choice, Scheduler, make_scheduler
from .trace import TracePod

DEFAULT_NODES = 100


def sample_nodes(nodes: list[NodeSpec], count: int, seed: int) -> list[NodeSpec]:
    """`count` nodes drawn without replacement (all of them when count >= len(nodes))."""
    if count >= len(nodes):
        return list(nodes)
    return random.Random(seed).sample(nodes, count)


def compress(
    pods: list[TracePod], capacity_milli: int, load: float, seed: int
) -> tuple[list[tuple[float, float]], float]:
    """(arrival, duration) per pod, in trace order, so that offered GPU load equals `load`.

    The trace's own timestamps are bursty (99% of openb's pods arrive in the last 40 of 149
    days), so only their order is kept: gaps are drawn from a seeded Poisson process whose rate
    gives the load. Offered load = sum(demand x duration) / (capacity x arrival window), with
    durations capped at the window; the window is found by bisection.
    """
    if not pods:
        return [], 0.0
    if load <= 0:
        raise ValueError("load must be positive")
    rng = random.Random(seed)
    unit = [0.0]
    for _ in pods[1:]:
        unit.append(unit[-1] + rng.expovariate(1.0))
    span = unit[-1] or 1.0

    def offered(window: float) -> float:
        return sum(p.request.gpu_demand * min(p.duration, window) for p in pods) / (capacity_milli * window)

    # offered() falls as the window grows; its supremum (every pod capped) is total demand / capacity
    ceiling = sum(p.request.gpu_demand for p in pods) / capacity_milli
    if load >= ceiling:
        raise ValueError(f"load {load} is more than these pods can offer at once ({ceiling:.2f} of capacity)")
    lo, hi = 1e-9, 1.0
    while offered(hi) > load:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if offered(mid) > load else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    window = hi
    scale = window / span
    return [(u * scale, min(p.duration, window)) for u, p in zip(unit, pods, strict=True)], window


@dataclass
class TimeResult:
    trace: str
    policy: str
    scheduler: str
    seed: int
    load: float
    wait_mean_s: float
    wait_p50_s: float
    wait_p99_s: float
    wait_max_s: float
    gpu_alloc_mean_pct: float
    gpu_served_mean_pct: float
    pods: int
    never_fit: int
    elapsed_s: float

    def as_json(self) -> dict:
        out = {"mode": "time"}
        out.update({k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()})
        return out


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


class _Replay:
    """One time-mode run: the queue, the running pods and the GPU-time allocated so far."""

    def __init__(self, chooser: Scheduler, pods: list[TracePod], timeline: list[tuple[float, float]], window: float) -> None:
        self.chooser, self.cluster, self.pods = chooser, chooser.cluster, pods
        self.requests = [chooser.placer.request_for(p.request) for p in pods]
        self.timeline, self.window = timeline, window
        self.waits: list[float] = []
        self.never_fit = 0
        self.queue: dict[int, None] = {}  # waiting pod indices, in arrival order
        self.departures: list[tuple[float, int]] = []
        self.allocated = self.served = 0
        self.alloc_area = self.served_area = 0.0
        self.last_t = 0.0

    def run(self) -> None:
        for i, (arrival, _) in enumerate(self.timeline):
            self.depart_until(arrival)
            self.advance(arrival)
            self.arrive(i, arrival)
        while self.departures and self.queue:
            self.depart_next()

    def advance(self, t: float) -> None:
        t = min(t, self.window)
        if t > self.last_t:
            self.alloc_area += self.allocated * (t - self.last_t)
            self.served_area += self.served * (t - self.last_t)
            self.last_t = t

    def arrive(self, i: int, now: float) -> None:
        if all(never_fits(self.requests[i], n.spec) for n in self.cluster.nodes):
            self.never_fit += 1  # would not fit even an empty cluster: rejected, not queued
            return
        choice = self.chooser.choose(self.requests[i])
        if choice is None:
            self.queue[i] = None
        else:
            self.start(i, choice, now)

    def start(self, i: int, choice: Choice, now: float) -> None:
        self.cluster.place(self.requests[i], choice.node.name, choice.gpus)
        self.allocated += self.requests[i].gpu_demand
        self.served += self.pods[i].request.gpu_demand
        self.waits.append(now - self.timeline[i][0])
        heapq.heappush(self.departures, (now + self.timeline[i][1], i))

    def depart_until(self, t: float) -> None:
        while self.departures and self.departures[0][0] <= t:
            self.depart_next()

    def depart_next(self) -> None:
        """The next pod to finish leaves; the waiting pods that fit its node now start there, in arrival order."""
        now, i = heapq.heappop(self.departures)
        self.advance(now)
        a = self.cluster.release(self.requests[i].name)
        self.allocated -= self.requests[i].gpu_demand
        self.served -= self.pods[i].request.gpu_demand
        node = self.cluster.by_name[a.node]
        tried: set[tuple] = set()
        for j in list(self.queue):
            req = self.requests[j]
            if req.cpu_milli > node.cpu_free or req.gpu_demand > node.gpu_free_total or req.key in tried:
                continue
            choice = self.chooser.choose(req, nodes=[node])
            if choice is None:
                tried.add(req.key)
                continue
            del self.queue[j]
            self.start(j, choice, now)


def replay_time(
    nodes: list[NodeSpec],
    pods: list[TracePod],
    policy_name: str,
    scheduler: str = "ideal",
    seed: int = 42,
    load: float = 0.9,
    node_count: int = DEFAULT_NODES,
    trace: str = "default",
    workload: Workload | None = None,
    weight: int = DEFAULT_EXTENDER_WEIGHT,
    extender_sees: str = "all",
) -> TimeResult:
    started = time.perf_counter()
    pods = sorted(pods, key=lambda p: (p.creation_time, p.request.name))
    cluster = Cluster(sample_nodes(nodes, node_count, seed))
    capacity = cluster.gpu_capacity_milli
    if capacity == 0:
        raise ValueError("the sampled cluster has no GPUs")
    workload = workload or Workload.from_pods(p.request for p in pods)
    policy = make_policy(policy_name, PolicyContext(workload, seed))
    chooser = make_scheduler(scheduler, cluster, policy, seed, weight, extender_sees)
    timeline, window = compress(pods, capacity, load, seed)
    replay = _Replay(chooser, pods, timeline, window)
    replay.run()
    waits = sorted(replay.waits)
    n = len(waits)
    return TimeResult(
        trace=trace, policy=policy_name, scheduler=scheduler, seed=seed, load=load,
        wait_mean_s=sum(waits) / n if n else 0.0,
        wait_p50_s=_percentile(waits, 0.5), wait_p99_s=_percentile(waits, 0.99),
        wait_max_s=waits[-1] if waits else 0.0,
        gpu_alloc_mean_pct=100.0 * replay.alloc_area / (capacity * window) if window else 0.0,
        gpu_served_mean_pct=100.0 * replay.served_area / (capacity * window) if window else 0.0,
        pods=len(pods), never_fit=replay.never_fit, elapsed_s=time.perf_counter() - started,
    )
