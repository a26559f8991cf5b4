"""Time mode: pods arrive in trace order, run for their trace duration, and queue when they
do not fit. Reports queueing delay, over all pods and per class (waits.py: CPU-only, slice,
1, 2, 4, 8 GPUs), and the GPU capacity allocated and serving demand, time-averaged over the
arrival window.

The openb trace barely loads a 100-node cluster as recorded, so pods keep their trace order
and durations but arrive as a Poisson process whose rate makes the offered GPU load over the
arrival window equal `load` (a share of GPU capacity). Durations are capped at that window: a
few pods ran for months, and uncapped they would pin GPUs for the whole experiment so that the
load would not be the one asked for.

The queue is kube-scheduler 1.20's (kubequeue.py): activeQ by priority then timestamp (openb's
pods carry none, so all are equal), failed pods parked in unschedulableQ, ALL of them moved
back when a pod leaves (the AssignedPodDelete event) and by the 60 s flush, with a backoff of
1 s doubling to 10 s. A pod is never blocked by the one ahead of it (no head-of-line blocking).

Before, the replay retried the waiting pods in arrival order against the freed node alone.
For the placement that is the same as moving all of them and trying each against the whole
cluster, as long as every parked pod is retried at every departure: each was refused by every
node at its last attempt, and only a departure frees capacity, so the nodes freed since its
last attempt are the only ones that can take it, with the same feasible set and so the same
choice (`_Replay.attempt` still computes only over those). And the order is the same: a
pod's timestamp is its last failure, every parked pod fails in timestamp order at each
event, so the order stays the arrival order. With the timers off (`EVENTS_ONLY`) this replay
gives the old one's figures to the bit (openb default, 100 nodes, seed 42, k8s-default and
tessera, ideal and kube, loads 1.0 and 1.2: all eight equal).

The timers are not equivalent, and they change the figures: the flush re-tries a pod parked
over 60 s and refreshes its timestamp, so pods that arrived since go ahead of it, and a pod
still in its backoff when a pod leaves is tried up to 10 s later, after any arrival in
between. Both favour recent pods over old ones. Measured (kube scheduler, seed 42, load 1.2):
k8s-default's mean wait falls from 41.8 to 35.0 min and its 8-GPU pods' mean rises from 411
to 509 min; tessera's mean goes from 7.7 to 7.9 min, its 8-GPU pods' from 174 to 198 min.
So the timers are modelled, as upstream has them.

With a movable share (`TimeMover`), a whole-GPU pod that fits nowhere asks the defragmentation
planner (core/defrag.py), as the server's preemptor does: each GPU pod is movable by packing mode's
seeded draw and is its own one-trainer job; a moved pod lands at once where the plan says (the server
steers its replacement there) and its run is `MOVE_COST_S` longer (its replacement starting); one move
in flight per pod, at most one per `MIN_INTERVAL_S`. A reserved or drain-pool node is a target only for
the pod it is open to (its reservation's holder, a pod the pool lets in: `Backfill.closed_to`) and never
a destination, as on the server (displacement.py plan_move).

With shortest runs first (`short_first`, core/short_first.py), a GPU pod of a run over the bound is
held while more short GPU pods wait than the setting allows (short: the run it declares in
`spec.activeDeadlineSeconds`, declarations.py): it is tried only on the nodes where none of them fits now
(`held_choice`, the server's filter rule) and parked if none takes it, to be tried again at the next
departure or flush, as any refused pod. Over the 100 nodes replayed here `contested` never reaches its
budget of fit tests, so reading every node (the server reads only those the pod passed) refuses the same.
A pod of a reserving class is never held (reservations on). A short pod counts from its first attempt that
finds no node (`refused`), as the server counts it from kube-scheduler's first refusal of it for room: with
a scheduling cycle (`QueueTimings.cycle_s`) a pod can wait in activeQ for minutes before its first attempt,
and counting it from its arrival held long pods behind short ones that were about to be placed (slices waited
11.5 min against the real scheduler's 7.3 at load 1.33, docs/results.md §4b). openb's pods
carry no priority, gangs, node selectors or taints, so the server's rules for those never apply.

With drain leases (`BackfillSettings.drain_lease`), a pod that no admitting node takes is offered the drain-pool and
reserved nodes a lease opens (`choose`, the server's `narrow`); started there, its expected end is the lease's end.
A run that outlasts the lease is renewed for another bound unless a reservation holds its node (`lapse`); then it is
cut there: its node frees, and the pod queues again at once, as its controller's new pod would, never leased again,
its wait still counted from its first arrival (so the lost run counts as waiting). Every openb pod counts as made
by a controller that makes a new pod.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field, replace

from ..core.backfill import Backfill, BackfillSettings
from ..core.cluster import Cluster, NodeState, never_fits
from ..core.defrag import MIN_INTERVAL_S, MOVE_COST_S, Budgets, JobBudget
from ..core.model import NodeSpec
from ..core.policy import PolicyContext, make_policy
from ..core.run_history import RunHistory
from ..core.short_first import ShortFirstSettings, contested
from ..core.workload import TargetWorkload
from .declarations import Declaration, declare_runs
from .kubequeue import KUBE_1_20, QueueTimings, SchedulingQueue
from .packing import Mover
from .schedulers import DEFAULT_EXTENDER_WEIGHT, Choice, Scheduler, make_scheduler
from .trace import TracePod
from .waits import WaitStats, pod_class, waits_by_class

DEFAULT_NODES = 100


def sample_nodes(nodes: list[NodeSpec], count: int, seed: int) -> list[NodeSpec]:
    """`count` nodes drawn without replacement (all of them when count >= len(nodes))."""
    if count >= len(nodes):
        return list(nodes)
    return random.Random(seed).sample(nodes, count)


def arrival_order(pods: list[TracePod]) -> list[TracePod]:
    """The pods in the order time mode has them arrive: the trace's creation time, then name."""
    return sorted(pods, key=lambda p: (p.creation_time, p.request.name))


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
    classes: dict[str, WaitStats] = field(default_factory=dict)  # pod class -> its waits (waits.py)
    reservations: str = "off"  # core/backfill.py: "on" when pods that waited past their bound reserved nodes
    reservations_made: int = 0
    reservations_expired: int = 0
    reserved_peak_pct: float = 0.0  # the most GPU capacity all reservations held at once
    defrag: dict | None = None  # with a movable share: moves made, pods placed thanks to them, trainer time lost
    short_first: dict | None = None  # shortest runs first (core/short_first.py): its settings, held attempts that found no node
    declarations: str = "exact"  # what run each pod declared (declarations.py): its own, or as users declare them
    deadline_stopped: int = 0  # pods placed that the kubelet stopped at their declared deadline (users only)
    tenants: dict[str, WaitStats] | None = None  # with tenants given: each tenant's waits (a hand-built stream's)
    leases_ended: int = 0  # drain leases (core/backfill.py) that ended with their pod running: the pod deleted, queued anew
    lease_lost_gpu_h: float = 0.0  # GPU-hours those pods ran before their lease ended, lost
    leases_renewed: int = 0  # drain leases renewed at their end (no reservation held their node)

    def as_json(self) -> dict:
        out: dict = {"mode": "time"}
        out.update({k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()
                    if k not in ("classes", "tenants")
                    and (k not in ("defrag", "short_first") or v is not None)  # off: the JSON is as before
                    and (k not in ("leases_ended", "lease_lost_gpu_h", "leases_renewed") or v)})  # absent: none
        out["classes"] = {c: s.as_json() for c, s in self.classes.items()}
        if self.tenants is not None:
            out["tenants"] = {t: s.as_json() for t, s in self.tenants.items()}
        return out


@dataclass
class TimeMover:
    """Packing mode's `Mover` with a clock: when each pod last moved, and what the moves cost."""

    mover: Mover
    cost_s: float = MOVE_COST_S
    interval_s: float = MIN_INTERVAL_S
    moved_at: dict[str, float] = field(default_factory=dict)  # pod -> when its last move started
    lost_s: float = 0.0  # trainer-seconds lost to moves: each moved pod's replacement starting
    _lapses: list[float] = field(default_factory=list)  # heap: when a moved pod's budget next frees up
    _lapsed: int = 0  # how many of those instants have passed

    def moved(self, pod: str, now: float) -> None:
        """A move of `pod` starts now: it costs `cost_s` and bars the pod from moving for `interval_s`."""
        self.moved_at[pod] = now
        self.lost_s += self.cost_s
        heapq.heappush(self._lapses, now + self.cost_s)
        heapq.heappush(self._lapses, now + self.interval_s)

    def epoch(self, now: float) -> int:
        """How many budget changes (a move's end, an interval's end) have happened by `now`: the budgets, and so
        the plans they allow, are the same between two calls that return the same number."""
        while self._lapses and self._lapses[0] <= now:
            heapq.heappop(self._lapses)
            self._lapsed += 1
        return self._lapsed

    def budgets(self, now: float) -> Budgets:
        """Every movable pod a one-trainer job: in flight while its replacement starts, then `interval_s` apart."""
        jobs = {pod: JobBudget(world=1, min_world=0, moving=now - t < self.cost_s, last_move_s=t)
                for pod, t in self.moved_at.items()}
        return Budgets(jobs, JobBudget(world=1, min_world=0), now, self.interval_s)

    def summary(self) -> dict:
        out = self.mover.summary()
        moves = out["moves"]
        return {**out, "move_cost_s": self.cost_s, "trainer_s_lost": self.lost_s,
                "trainer_s_per_move": self.lost_s / moves if moves else 0.0}


class _Replay:
    """One time-mode run: the scheduling queue, the running pods and the GPU-time allocated so far."""

    def __init__(self, chooser: Scheduler, pods: list[TracePod], timeline: list[tuple[float, float]], window: float,
                 timings: QueueTimings = KUBE_1_20, backfill: BackfillSettings | None = None,
                 mover: TimeMover | None = None, short_first: ShortFirstSettings | None = None,
                 declared: list[float | None] | None = None, stopped: frozenset[int] = frozenset(),
                 tenants: list[str] | None = None) -> None:
        """`declared`: each pod's declared run, what the queue rules read (declarations.py; None: undeclared), by
        default its run; `stopped`: the pods the kubelet stops at their deadline (their run is the declared one);
        `tenants`: each pod's tenant (the server's namespace), by default one for all."""
        self.tenants = tenants
        self.chooser, self.cluster, self.pods = chooser, chooser.cluster, pods
        self.declared = [d for _, d in timeline] if declared is None else declared
        self.stopped, self.deadline_stopped = stopped, 0
        self.requests = [chooser.placer.request_for(p.request) for p in pods]
        self.keys = [r.key for r in self.requests]  # the attempts ask for them millions of times at high load
        self.timeline, self.window = timeline, window
        self.waits: dict[int, float] = {}  # pod index -> its wait, for the pods placed
        self.never_fit = 0
        self.queue = SchedulingQueue(timings)
        self.freed: list[str] = []  # the node each departure freed, in order
        self.seen: dict[int, int] = {}  # waiting pod -> len(freed) at its last attempt
        self.failed: set[tuple] = set()  # (shape, seen) tried and refused since the last departure
        self.departures: list[tuple[float, int]] = []
        self.allocated = self.served = 0
        self.alloc_area = self.served_area = 0.0
        self.last_t = 0.0
        self.ends: dict[str, float] = {}  # running pod -> when it declared it leaves (absent: declared nothing)
        self.backfill = None if backfill is None else Backfill(self.cluster, self.ends.get, backfill)
        self.made = self.expired = 0
        self.peak_milli = 0
        self.guarded: set[str] = set()  # the floating drain pool's nodes at the last event
        self.mover = mover
        self.index = {r.name: i for i, r in enumerate(self.requests)} if mover is not None else {}
        self.end_at: dict[int, float] = {}  # running pod -> its departure (a move pushes it later)
        self.unmovable: set[tuple] = set()  # (shape, held node, budget epoch) the planner found no plan for since
        self.short_first = short_first
        self.history = RunHistory() if short_first is not None and short_first.estimate_silent else None
        self.shorts = _ShortPods(self.requests, self.keys)
        self.held = 0  # attempts of held pods that found no node free of shorter runs
        self.held_refused: tuple[int, set[tuple]] = (-1, set())  # (contest epoch, held pod shapes refused in it)
        self.contested_nodes: tuple[int, set[str]] = (-1, set())  # (contest epoch, the nodes a short pod fits in it)
        if short_first is not None:
            self.cluster.on_change(self.shorts.changed)
        self.leases = _Leases(backfill.drain_pool_run_s) if backfill is not None and backfill.drain_lease else None
        if self.leases is not None and mover is not None:
            raise ValueError("drain leases and moves together are not modelled in time mode: choose one")

    def run(self) -> None:
        """Events in time order (departures, then the queue's timers, then arrivals at the same instant),
        each followed by a scheduling pass over activeQ; until every pod has arrived and none waits.
        With a scheduling cycle (`QueueTimings.cycle_s`), each attempt is an event of its own instead,
        after the events at its instant, and holds the loop for the cycle."""
        nxt, count = 0, len(self.timeline)
        cycle, now, loop_free = self.queue.timings.cycle_s, 0.0, 0.0
        while nxt < count or len(self.queue):
            arrival = self.timeline[nxt][0] if nxt < count else math.inf
            departure = self.departures[0][0] if self.departures else math.inf
            timer = self.queue.next_timer() if len(self.queue) else math.inf
            turn = max(now, loop_free) if cycle and self.queue.has_active() else math.inf
            lapse = self.leases.next_s() if self.leases is not None else math.inf
            now = min(arrival, departure, timer, turn, lapse)
            if now == math.inf:
                break  # cannot happen: a queued pod fits the empty cluster, so something is running
            self.advance(now)
            if self.backfill is not None:
                self.expire(now)
                self.unguard(now)
            if departure == now:
                self.depart(now)
            elif lapse == now:
                self.lapse(now)
            elif timer == now:
                self.queue.on_timer(now)
            elif arrival == now:
                self.arrive(nxt, now)
                nxt += 1
            else:
                self.try_pod(self.queue.pop(), now)
                loop_free = now + cycle
            if not cycle:
                self.schedule(now)

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
        self.queue.add(i, now)  # openb's pods carry no priority: all 0, so the queue orders by timestamp

    def schedule(self, now: float) -> None:
        """kube-scheduler's loop: pop activeQ until it is empty, placing each pod or parking it."""
        while (i := self.queue.pop()) is not None:
            self.try_pod(i, now)

    def try_pod(self, i: int, now: float) -> None:
        """One scheduling attempt: the pod is placed, or parked in unschedulableQ."""
        if self.held_back(i, now):
            choice = self.held_choice(i, now)
            if choice is None:
                self.held += 1
                self.queue.park(i, now)
                self.refused(i, now)
            else:
                self.queue.done(i)
                self.start(i, choice, now)
            return
        choice = self.attempt(i, now)
        if choice is None and self.mover is not None and self.requests[i].gpu_count:
            choice = self.move_for(i, now)
            if choice is not None:
                self.queue.done(i)
                self.start(i, choice, now, placed=True)
                return
        if choice is None:
            self.queue.park(i, now)
            self.refused(i, now)
            if self.backfill is not None:
                self.reserve(i, now)
        else:
            self.queue.done(i)
            self.start(i, choice, now)

    def refused(self, i: int, now: float) -> None:
        """Pod i found no node: a short GPU pod now counts among those that hold long ones back (core/short_first.py),
        as the server counts it once kube-scheduler's refusal reaches the watch (short_first_queue.py)."""
        rule = self.short_first
        if rule is not None and rule.counts(self.requests[i], self.short_run(i, now), now - self.timeline[i][0]):
            self.shorts.add(i, self.timeline[i][0])

    def held_back(self, i: int, now: float) -> bool:
        """Whether pod i waits behind shorter runs (core/short_first.py); short pods past the hold bound stop counting."""
        rule = self.short_first
        if rule is None:
            return False
        timeline = self.timeline
        self.shorts.prune(lambda j: now - timeline[j][0] >= rule.max_hold_s)
        request = self.requests[i]
        if self.backfill is not None and self.backfill.settings.reserving(request):
            return False
        return rule.holds(request, self.short_run(i, now), now - timeline[i][0], len(self.shorts))

    def short_run(self, i: int, now: float) -> float | None:
        """The run shortest-runs-first reads for pod i: its declared one, else (estimate_silent) its like's (run_history.py)."""
        declared = self.declared[i]
        if declared is not None or self.history is None:
            return declared
        return self.history.estimate(self.run_key(i), now)

    def run_key(self, i: int) -> tuple:
        """Whose runs speak for pod i's: its tenant's of its GPU shape, as the server's namespace and shape
        (run_estimates.py). The trace names no tenants: unless the caller gives them, its pods are all one's."""
        request = self.requests[i]
        return (self.tenants[i] if self.tenants else "", request.gpu_count, request.gpu_milli)

    def held_choice(self, i: int, now: float) -> Choice | None:
        """The choice for a held pod among the nodes where no short pod waiting fits now (`contested`, as the server's
        filter refuses them). A refusal stands until the nodes or the short pods' shapes change (the epoch): pods of
        one shape are refused alike in between, and at the seed's load most attempts are such."""
        epoch, refused = self.held_refused
        if epoch != self.shorts.epoch:
            refused = set()
            self.held_refused = (self.shorts.epoch, refused)
            self.contested_nodes = (self.shorts.epoch, contested(self.shorts.shapes(), self.cluster.nodes))
        shape = (self.keys[i], self.declared[i] if self.backfill is not None else None, self.lease_ended(i))
        if shape in refused:
            return None
        taken = self.contested_nodes[1]
        choice = self.choose(i, [n for n in self.chooser.order if n.name not in taken], now,
                             [n for n in self.chooser.order if n.name in taken])
        if choice is None:
            refused.add(shape)
        return choice

    def attempt(self, i: int, now: float) -> Choice | None:
        """The scheduler's choice for pod i against the whole cluster, computed over the nodes freed since
        its last attempt: every other node refused it then and has only lost capacity since (pods
        leaving are the only events that free any, and a reservation ending counts as one), so the
        feasible nodes, and the choice, are the same. With reservations the refusal also depends on
        the pod's run time (backfill) and on the node it holds, if any, so those join the cache key
        (two 8-GPU pods of one shape, both run times capped at the window, hold different nodes)."""
        seen, freed = self.seen.get(i), len(self.freed)
        self.seen[i] = freed
        if seen is None:
            return self.choose(i, None, now)
        shape = (self.keys[i], seen)
        if self.backfill is not None:
            held = self.backfill.by_pod.get(self.requests[i].name)
            shape += (self.declared[i], held and held.node, self.lease_ended(i))
        cached = seen == freed or shape in self.failed
        kept = self.kept_for(i, now)
        if cached and not kept:
            return None
        names = dict.fromkeys(() if cached else self.freed[seen:])
        names.update(dict.fromkeys(kept))
        choice = self.choose(i, [self.cluster.by_name[n] for n in names], now)
        if choice is None and not cached:
            self.failed.add(shape)
        return choice

    def kept_for(self, i: int, now: float) -> list[str]:
        """The floating pool's nodes, for a pod of the reserving class: whether they take it depends on room on other
        nodes (`Backfill._rarest_with_room`), which a placement elsewhere can take away without freeing anything, so they
        are tried at every attempt (a few dozen nodes, for the 44 8-GPU pods of a run)."""
        b = self.backfill
        if b is None or not b.settings.drain_keep or not b.settings.reserving(self.requests[i]):
            return []
        return list(b.guarded(now))

    def choose(self, i: int, nodes: list[NodeState] | None, now: float,
               held_off: list[NodeState] = ()) -> Choice | None:
        """The scheduler's choice among `nodes` (all by default) less the reserved and drain-pool nodes that refuse pod i.
        `held_off`: the nodes shortest-runs-first refused it; one that takes it rules a lease out, as in the server,
        whose filter offers leases before it holds the pod off those nodes."""
        if self.backfill is None or not (self.backfill or self.backfill.pool or self.backfill.settings.drain_keep):
            return self.chooser.choose(self.requests[i], nodes=nodes)
        among = self.chooser.order if nodes is None else nodes
        free = [n for n in among if self.admits(i, n, now)]
        choice = self.chooser.choose(self.requests[i], nodes=free)
        if choice is None and self.leases is not None and i not in self.leases.ended and \
                self.chooser.choose(self.requests[i], nodes=[n for n in held_off if self.admits(i, n, now)]) is None:
            lent = self.lendable(i, among, {n.name for n in free}, now)
            choice = self.chooser.choose(self.requests[i], nodes=lent)
            if choice is not None:
                self.leases.offered = (i, choice.node.name)
        return choice

    def lendable(self, i: int, among: list[NodeState], taken: set[str], now: float) -> list[NodeState]:
        """Nothing else takes pod i: the nodes of `among` (less those `taken` from it without a lease) that a lease
        opens to it (the server's `QueueReservations.narrow`)."""
        return [n for n in among if n.name not in taken and self.admits(i, n, now, lease=True)]

    def lease_ended(self, i: int) -> bool:
        """Whether pod i's lease ended (it is not leased again): refusals of pods alike but for this differ."""
        return self.leases is not None and i in self.leases.ended

    def lapse(self, now: float) -> None:
        """A lease ended with its pod still running. Unless a reservation holds its node, the lease is renewed (as the
        server's `QueueReservations.lapsed` does): its expected end moves one bound on. Otherwise the pod is deleted
        (its run so far lost) and its controller's new pod queues at once, never leased again. Its wait runs on from
        its first arrival, so the lost run counts."""
        i = self.leases.next_pod()
        name = self.requests[i].name
        if self.cluster.assignments[name].node not in self.backfill.by_node:
            self.ends[name] = self.leased_end(i, self.leases.renew(now), now + self.leases.bound_s)
            return
        i = self.leases.lapsed()
        self.leases.lost_gpu_s += self.requests[i].gpu_demand / 1000 * (now - self.leases.started.pop(i))
        if self.history is not None:  # the server's estimates count a deleted pod's run as what it ran
            self.history.ended(self.run_key(i), i, now)
        self.release(i, now)
        self.waits.pop(i, None)
        self.queue.add(i, now)

    def leased_end(self, i: int, start: float, lease_end: float) -> float:
        """A leased pod's expected end: its lease's, or its declared end if sooner (the kubelet stops it at its
        deadline), as the server's `QueueReservations.expected_end` takes the earlier of the two."""
        return lease_end if self.declared[i] is None else min(start + self.declared[i], lease_end)

    def admits(self, i: int, node: NodeState, now: float, lease: bool = False) -> bool:
        if not self.backfill.restricted(node.name, now):
            return True
        request, placer = self.requests[i], self.chooser.placer
        verdict = placer.verdict(request, node)
        if verdict is None:
            return False  # it does not fit there anyway
        gpus = placer.gpus_for(request, node, verdict)
        if lease:
            return self.backfill.lease_admits(request, node, gpus, now)
        return self.backfill.admits(request, node, gpus, now, self.declared[i])

    def reserve(self, i: int, now: float) -> None:
        """Pod i was refused: past its class's bound it reserves the node that takes it soonest."""
        if self.backfill.reserve(self.requests[i], now - self.timeline[i][0], now, runtime_s=self.declared[i]) is not None:
            self.made += 1
            self.peak_milli = max(self.peak_milli, self.backfill.held_milli())

    def unguard(self, now: float) -> None:
        """The floating drain pool let nodes go (enough drain now, or time passed): pods they refused are tried there again."""
        if not self.backfill.settings.drain_keep:
            return
        guarded = self.backfill.guarded(now).keys()
        for name in self.guarded - guarded:
            self.reopen(name)
        self.guarded = set(guarded)

    def expire(self, now: float) -> None:
        for r in self.backfill.expire(now):
            self.expired += 1
            self.reopen(r.node)

    def reopen(self, node: str) -> None:
        """A reservation ended: its node may take pods it refused, so they are tried there again."""
        self.freed.append(node)
        self.forget_refusals()

    def forget_refusals(self) -> None:
        """Room was made (a departure, a node reopened): the attempts and plans refused since may work now."""
        self.failed.clear()
        self.unmovable.clear()
        self.shorts.changed()

    def move_for(self, i: int, now: float) -> Choice | None:
        """Pod i fits nowhere: move movable pods so it fits, if a plan exists (placed there by the plan).

        A refusal is remembered like `attempt`'s, until something frees room (a departure, a reservation or
        the pool letting a node go), a move is made or a budget frees up: in between, pods only arrive (a
        plan that moves a newcomer would have worked without it, with more room) and reservations only close
        nodes, so the planner would refuse again. Measured (tessera, kube, seed 42, load 1.33, reservations at
        once, 30% movable): 88,851 plans instead of 827,738, the same result field for field, 75 s instead of 516 s."""
        m = self.mover
        request = self.requests[i]
        held = self.backfill.by_pod.get(request.name) if self.backfill is not None else None
        shape = (self.keys[i], held and held.node, m.epoch(now))
        if shape in self.unmovable:
            return None
        targets, restricted = None, frozenset()
        if self.backfill is not None:  # the server's rules (displacement.py plan_move): targets not closed to the pod, its own
            restricted = frozenset(self.backfill.restricted_nodes(now))  # reserved node included; no restricted destination
            runtime = self.declared[i]
            targets = [n.name for n in self.cluster.nodes
                       if n.name not in restricted or not self.backfill.closed_to(request, n.name, now, runtime)]
        choice = m.mover.rescue(self.chooser, request, m.budgets(now), targets, restricted)
        if choice is None:
            self.unmovable.add(shape)
            return None
        self.unmovable.clear()
        for move in m.mover.last.moves:
            j = self.index[move.pod.name]
            self.end_at[j] += m.cost_s  # its replacement starts on the destination, then trains on
            heapq.heappush(self.departures, (self.end_at[j], j))
            if move.pod.name in self.ends:
                self.ends[move.pod.name] += m.cost_s
            m.moved(move.pod.name, now)
        return choice

    def start(self, i: int, choice: Choice, now: float, placed: bool = False) -> None:
        if not placed:
            self.cluster.place(self.requests[i], choice.node.name, choice.gpus)
        self.allocated += self.requests[i].gpu_demand
        self.served += self.pods[i].request.gpu_demand
        self.waits[i] = now - self.timeline[i][0]
        self.deadline_stopped += i in self.stopped
        self.seen.pop(i, None)
        self.shorts.discard(i)
        heapq.heappush(self.departures, (now + self.timeline[i][1], i))
        if self.declared[i] is not None:  # an undeclared run's end is unknown: backfill.py counts it as staying
            self.ends[self.requests[i].name] = now + self.declared[i]
        if self.leases is not None and self.leases.offered == (i, choice.node.name):
            self.leases.offered = None
            self.ends[self.requests[i].name] = self.leased_end(i, now, now + self.leases.bound_s)
            self.leases.lend(i, now, now + self.timeline[i][1])
        if self.history is not None:
            self.history.started(self.run_key(i), i, now)
        if self.mover is not None:
            self.end_at[i] = now + self.timeline[i][1]
            self.mover.mover.placed_pod(self.requests[i])
        if self.backfill is not None and (r := self.backfill.placed(self.requests[i].name)) is not None:
            self.reopen(r.node)

    def depart(self, now: float) -> None:
        """The next pod to finish leaves: its node has room again, and every parked pod is moved (kube 1.20's
        AssignedPodDelete event moves them all, not only those that fit the freed node)."""
        t, i = heapq.heappop(self.departures)
        if self.leases is not None and self.leases.stopped(t, i):
            return  # the run's end had it not been stopped at its lease's end
        if self.mover is not None:
            if self.end_at.get(i) != t:
                return  # a moved pod's old end: it leaves later
            del self.end_at[i]
            self.mover.mover.movable.pop(self.requests[i].name, None)
        if self.history is not None:
            self.history.ended(self.run_key(i), i, t)
        self.release(i, now)

    def release(self, i: int, now: float) -> None:
        """Pod i leaves its node (it finished, or its lease ended): the node has room again, and every parked pod is moved."""
        a = self.cluster.release(self.requests[i].name)
        self.ends.pop(a.pod, None)
        self.allocated -= self.requests[i].gpu_demand
        self.served -= self.pods[i].request.gpu_demand
        self.freed.append(a.node)
        self.forget_refusals()
        self.queue.move_all(now)


@dataclass
class _Leases:
    """Drain leases (core/backfill.py `drain_lease`): the pods running on one, when each lease ends, and what ending
    them cost. Every openb pod counts as made by a controller (a Job, say), which makes a new pod when one is deleted:
    here the new pod is the same pod index, queued again when its lease ends, and never leased again (the server
    remembers the controller)."""

    bound_s: float
    ends: dict[int, float] = field(default_factory=dict)  # leased pod whose run outlasts its lease -> the lease's end
    started: dict[int, float] = field(default_factory=dict)  # the same pods -> when they started
    due: list[tuple[float, int]] = field(default_factory=list)  # heap of (lease end, pod), some gone
    runs: dict[int, float] = field(default_factory=dict)  # the same pods -> when their run would have ended
    cut: set[tuple[float, int]] = field(default_factory=set)  # (run end, pod) of runs a lease ended
    ended: set[int] = field(default_factory=set)  # pods whose lease ended: never leased again
    offered: tuple[int, str] | None = None  # (pod, node) the last choice lent
    count: int = 0  # leases that ended with their pod running
    renewed: int = 0  # leases renewed at their end: no reservation held the node
    lost_gpu_s: float = 0.0  # GPU-seconds those pods ran for nothing

    def next_s(self) -> float:
        while self.due and self.ends.get(self.due[0][1]) != self.due[0][0]:
            heapq.heappop(self.due)  # its pod finished within the lease
        return self.due[0][0] if self.due else math.inf

    def lend(self, i: int, now: float, run_end: float) -> None:
        if run_end > now + self.bound_s:
            self.ends[i], self.runs[i], self.started[i] = now + self.bound_s, run_end, now
            heapq.heappush(self.due, (now + self.bound_s, i))

    def next_pod(self) -> int:
        """The pod whose lease ends now (`next_s`)."""
        return self.due[0][1]

    def renew(self, now: float) -> float:
        """The lease ending now runs one bound more; returns when its pod started. A run that ends within the new lease
        is forgotten here (it will never lapse), as a pod that finished within its first lease is."""
        _, i = heapq.heappop(self.due)
        self.renewed += 1
        start = self.started[i]
        if self.runs[i] > now + self.bound_s:
            self.ends[i] = now + self.bound_s
            heapq.heappush(self.due, (now + self.bound_s, i))
        else:
            del self.ends[i], self.runs[i], self.started[i]
        return start

    def lapsed(self) -> int:
        """The pod whose lease ends now (`next_s`), its run cut there."""
        _, i = heapq.heappop(self.due)
        del self.ends[i]
        self.cut.add((self.runs.pop(i), i))
        self.ended.add(i)
        self.count += 1
        return i

    def result(self) -> dict:
        """TimeResult's fields for the leases."""
        return {"leases_ended": self.count, "lease_lost_gpu_h": self.lost_gpu_s / 3600, "leases_renewed": self.renewed}

    def stopped(self, t: float, i: int) -> bool:
        """Whether the departure (t, i) is of a run its lease ended earlier."""
        if (t, i) in self.cut:
            self.cut.discard((t, i))
            return True
        return False


class _ShortPods:
    """The short GPU pods waiting that count (core/short_first.py), their shapes, and an epoch that moves whenever
    where they fit may have changed (a node's pods, a shape come or gone, a node reopened)."""

    def __init__(self, requests: list, keys: list[tuple]) -> None:
        self.requests, self.keys = requests, keys
        self.waiting: set[int] = set()  # younger than the hold bound
        self.arrivals: list[tuple[float, int]] = []  # heap of (arrival, pod) of the same pods (and some gone)
        self.by_shape: dict[tuple, list] = {}  # shape -> [a request of it, pods of it waiting], in the order shapes began to wait
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.waiting)

    def changed(self, _node: NodeState | None = None) -> None:
        self.epoch += 1

    def add(self, i: int, arrived: float) -> None:
        """Pod i counts (again: a pod refused twice keeps its place)."""
        if i in self.waiting:
            return
        self.waiting.add(i)
        heapq.heappush(self.arrivals, (arrived, i))
        count = self.by_shape.setdefault(self.keys[i], [self.requests[i], 0])
        count[1] += 1
        if count[1] == 1:
            self.changed()

    def discard(self, i: int) -> None:
        if i not in self.waiting:
            return
        self.waiting.discard(i)
        count = self.by_shape[self.keys[i]]
        count[1] -= 1
        if not count[1]:
            del self.by_shape[self.keys[i]]
            self.changed()

    def prune(self, too_old) -> None:
        while self.arrivals and too_old(self.arrivals[0][1]):
            self.discard(heapq.heappop(self.arrivals)[1])

    def shapes(self):
        """(request, None, 0) per shape waiting, in the order the shapes began to wait (the server's order; None: the pods
        have no node constraints here)."""
        return ((request, None, 0) for request, _ in self.by_shape.values())


def _declared_runs(pods: list[TracePod], timeline: list[tuple[float, float]] | None, declarations: str,
                   drawn: list[Declaration] | None, seed: int, capacity: int, load: float):
    """(timeline, window, what each pod declares, the pods stopped at their deadline) for `replay_time`: each pod's
    run is what it runs as declared (stopped at a deadline below its trace duration)."""
    if drawn is None:
        drawn = declare_runs([p.duration for p in pods] if timeline is None else [d for _, d in timeline], declarations, seed)
    elif declarations != "users" or len(drawn) != len(pods):
        raise ValueError("drawn: one Declaration per pod, with declarations='users'")
    if timeline is None:  # the load offered is of the runs as they happen: a pod stopped at its deadline offers less
        timeline, window = compress([replace(p, duration=d.run_s) for p, d in zip(pods, drawn, strict=True)],
                                    capacity, load, seed)
    else:
        timeline = [(t, d.run_s) for (t, _), d in zip(timeline, drawn, strict=True)]
        window = timeline[-1][0] if timeline else 0.0
    # exact: each pod declares its run as replayed (capped at the window); users: what its user wrote
    declared = [d.declared_s for d in drawn] if declarations == "users" else None
    return timeline, window, declared, frozenset(i for i, d in enumerate(drawn) if d.stopped)


def _arriving(pods: list[TracePod], tenants: list[str] | None) -> tuple[list[TracePod], list[str] | None]:
    """The pods in arrival order, and their tenants (given in the pods' order) in the same order."""
    if tenants is None:
        return arrival_order(pods), None
    if len(tenants) != len(pods):
        raise ValueError("tenants: one name per pod")
    tenant_of = {p.request.name: t for p, t in zip(pods, tenants, strict=True)}
    ordered = arrival_order(pods)
    return ordered, [tenant_of[p.request.name] for p in ordered]


def replay_time(
    nodes: list[NodeSpec],
    pods: list[TracePod],
    policy_name: str,
    scheduler: str = "ideal",
    seed: int = 42,
    load: float = 0.9,
    node_count: int = DEFAULT_NODES,
    trace: str = "default",
    workload: TargetWorkload | None = None,
    weight: int = DEFAULT_EXTENDER_WEIGHT,
    extender_sees: str = "all",
    timings: QueueTimings = KUBE_1_20,
    timeline: list[tuple[float, float]] | None = None,
    backfill: BackfillSettings | None = None,
    movable_share: float = 0.0,
    short_first: ShortFirstSettings | None = None,
    declarations: str = "exact",
    drawn: list[Declaration] | None = None,
    tenants: list[str] | None = None,
) -> TimeResult:
    """One time-mode run. `timeline`, (arrival, duration) per pod in trace order, replaces the compressed trace (a
    hand-built stream whose waits can be worked out by hand); the arrival window is then up to the last arrival.
    `backfill`: reservations with backfill, and drain leases (core/backfill.py), off by default;
    `short_first`: shortest runs first (core/short_first.py), off by default; `declarations`: what run each pod
    declares (declarations.py): `exact` its own, `users` as users declare them, each pod then stopped at its deadline;
    `drawn`, one `Declaration` per pod in trace order, replaces the users' draw (a hand-built stream's); `tenants`, one
    name per pod in the same order, keys the run estimates by tenant and reports each tenant's waits."""
    started = time.perf_counter()
    pods, tenants = _arriving(pods, tenants)
    cluster = Cluster(sample_nodes(nodes, node_count, seed))
    if (capacity := cluster.gpu_capacity_milli) == 0:
        raise ValueError("the sampled cluster has no GPUs")
    workload = workload or TargetWorkload.from_pods(p.request for p in pods)
    policy = make_policy(policy_name, PolicyContext(workload, seed))
    chooser = make_scheduler(scheduler, cluster, policy, seed, weight, extender_sees)
    timeline, window, declared, stopped = _declared_runs(pods, timeline, declarations, drawn, seed, capacity, load)
    if not 0 <= movable_share <= 1:
        raise ValueError(f"movable_share is a share of pods, 0..1; got {movable_share}")
    mover = TimeMover(Mover(movable_share, seed)) if movable_share > 0 else None
    replay = _Replay(chooser, pods, timeline, window, timings, backfill, mover, short_first, declared, stopped, tenants)
    replay.run()
    overall = WaitStats.of(replay.waits.values())
    return TimeResult(
        trace=trace, policy=policy_name, scheduler=scheduler, seed=seed, load=load,
        wait_mean_s=overall.mean_s, wait_p50_s=overall.p50_s, wait_p99_s=overall.p99_s, wait_max_s=overall.max_s,
        gpu_alloc_mean_pct=100.0 * replay.alloc_area / (capacity * window) if window else 0.0,
        gpu_served_mean_pct=100.0 * replay.served_area / (capacity * window) if window else 0.0,
        pods=len(pods), never_fit=replay.never_fit, elapsed_s=time.perf_counter() - started,
        classes=waits_by_class((pod_class(pods[i].request) for i in replay.waits), replay.waits.values()),
        reservations="off" if backfill is None else "on", reservations_made=replay.made,
        reservations_expired=replay.expired, reserved_peak_pct=100.0 * replay.peak_milli / capacity,
        defrag=mover.summary() if mover is not None else None,
        short_first=None if short_first is None else {
            "waiting": short_first.waiting, "run_s": short_first.run_s, "max_hold_s": short_first.max_hold_s,
            "estimate_silent": short_first.estimate_silent, "attempts_held": replay.held},
        declarations=declarations, deadline_stopped=replay.deadline_stopped,
        tenants=None if tenants is None else waits_by_class((tenants[i] for i in replay.waits), replay.waits.values()),
        **(replay.leases.result() if replay.leases else {}),
    )
