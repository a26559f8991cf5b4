"""Reservations with backfill: a pod that has waited too long holds the node that can take it soonest.

Why: kube-scheduler retries every pending pod when capacity frees, and small pods take each freed
piece, so an 8-GPU pod waits until a whole node happens to drain. On 100 openb nodes at the seed's
load (1.33, kube scheduler, 5 seeds) tessera's 8-GPU pods waited 3.0 h on average and 9.8 h at p99
while slices waited 2 min (docs/results.md §4).

How: once a pod has waited longer than its class's bound, `reserve` picks the node that would hold
it soonest (its running pods leave by their expected ends) at least cost (the GPU-time left idle
meanwhile). From then on `admits` lets another pod onto that node only if the reserved pod can still
start there at the expected time: either the other pod fits beside it, or it is expected to end by
then (backfill). A reservation places nothing: the pod itself is placed whole, by the placer, when
it fits (a multi-GPU pod is never admitted piecewise), and `placed` drops its reservation.

Expected ends come from the caller (`expected_end(pod name)`): the run each pod declares, in the
server its `tessera.dev/expected-runtime`, in the simulator what sim/declarations.py has it declare. An unknown
end counts as never: such a pod is assumed to stay, so a node whose pods all have unknown ends is
never reserved (its start would be unknown), and a pod of unknown run time backfills a reserved
node only beside the reservation.

Bounds: a reservation expires `grace_s` after its expected start (an estimate that was wrong must
not hold a node for ever), and all reservations together hold at most `max_share` of the cluster's
GPU capacity, so slices and 1-GPU pods never lose more than that to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .cluster import Cluster, NodeState, fit_reason, never_fits
from .model import MILLI_PER_GPU, Assignment, NodeSpec, PodRequest

MAX_FIT_SETS = 256  # request shapes whose fit sets are kept (openb has 40-odd GPU shapes; tenants may make more)
ExpectedEnd = Callable[[str], float | None]  # pod name -> when it is expected to leave (None: unknown)


def _default_bounds() -> Mapping[int, float]:
    return {8: 30 * 60.0}


@dataclass(frozen=True)
class BackfillSettings:
    """When a pod may reserve, how long a reservation lives past its start, and how much all may hold.

    `wait_bound_s`: GPU count -> how long a pod asking that many whole GPUs waits before it reserves;
    a count not named never reserves. Only 8-GPU pods by default: slices and 1-GPU pods wait minutes
    (they take each freed piece), and the 2- and 4-GPU pods (31 a run) are a small share of the waits.
    30 min, measured (tessera, kube, 100 openb nodes, seeds 42-45; 42-44 for 15 and 30 min at 1.33):
    with bounds 0 / 15 / 30 min the mean wait over all pods was 2.55 / 2.20 / 2.10 min at load 1.1 (1.40 without reservations) and
    20.5 / 18.9 / 18.9 min at 1.33 (16.4), the 8-GPU mean 1.1 / 1.2 / 1.4 h at 1.1 (3.1 h): a longer
    bound costs the other pods least, and the 8-GPU pods' p99 is set by how soon a node drains, not
    by the bound (5.6-6.1 h at 1.33 with every bound).
    `max_share` 0.1: the cap is reached at every load from 1.1 (peak 9.9%), yet doubling it (bound 0,
    load 1.33) moved the 8-GPU mean from 1.0 to 1.1 h and the p99 from 5.6 to 5.8 h: no gain for more held.

    `drain_pool` (off: 0): this many nodes that can hold the largest reserving class take only pods
    expected to end within `drain_pool_run_s`, or pods of a reserving class, so a reservation there
    starts within that time. Why: without it the 8-GPU p99 is set by how soon any node drains, and
    every node holds some pod running for hours. Measured (tessera, kube, 100 openb nodes, seeds
    42-46, bound 0, max_share 0.5, 1 h runs; loads 0.7 / 1.0 / 1.33): pool 0: mean wait 0.1 / 0.7 /
    20.5 min, 8-GPU p99 3.2 / 8.0 / 5.6 h; pool 24: 0.1 / 2.3 / 10.4 min, 3.2 / 0.67 / 2.6 h; pool 32:
    0.7 / 10.0 / 15.3 min, 0.16 / 0.44 / 1.2 h (docs/results.md §4). The pool shortens the big pods'
    worst wait by hours and cuts the mean at the seed's load, but a pool large enough for every load
    costs the other pods minutes at moderate load: off by default.

    `drain_keep` (off: 0; not with `drain_pool`): a floating pool instead. For each kind of node big
    enough for the largest reserving class (its CPU and memory), the pods that need that kind (of the
    reserving class, and fitting no node it cannot use) keep its last `drain_keep` *clean* nodes: nodes
    where every other pod is expected to end within `drain_pool_run_s`. Once no more than that many are
    left, they take no longer or undeclared run but such a pod's (a reservation's holder keeps its hold).
    Why: the fixed pool's tail came from pods that fit only the largest, rarest nodes (openb: 8-GPU pods
    asking 120 cores fit only the 128-core G3 nodes, 1-4 of 100; a 10-hour 8-GPU pod that fits anywhere
    took the only G3 node of seed 43 and two 120-core pods waited 11.7 and 15.9 h at load 0.7). A pod
    that needs the kind does not make its node unclean: while a 120-core pod ran there, a CPU-only pod of
    8.8 h settled beside it when only drainable nodes were kept, and the next 120-core pod waited 8.8 h.
    Kinds nest (a larger kind fits every pod a smaller one fits), so a reserving-class pod is refused only
    the nodes kept for kinds rarer than the rarest node that can start it within `drain_pool_run_s`
    (`_rarest_with_room`): refused all of them, a 64-core 8-GPU pod waited 5.4 h while its 2 own nodes held
    long runs. Measured (tessera, kube, 100 openb nodes, seeds 42-46, reservations at once, share 0.5, 1 h
    runs; loads 0.7 / 1.0 / 1.33; docs/results.md §4 "Kinds nest"): keep 16: mean wait 0 s / 47 s / 18.0
    min, 8-GPU p99 (mean of per-seed) 4.9 / 41 / 52 min; keep 24: 1 s / 2.1 min / 10.4 min, 10 / 41 /
    46 min; without reservations 5 s / 44 s / 17.3 min and 3.6 / 11.5 / 9.8 h. Keep 16 holds the 8-GPU
    p99 under an hour at every load from 0.7 to 1.33, but costs the mean at 1.1 (4.3 against 1.5 min).
    A keep that grows with the queue (or a moving average of it) was tried and dropped: at load 1.33 it
    gave keep 4's 17.5-19.0 min, not keep 24's 10.1, because the pool must be there before long runs spread.

    `drain_lease` (off; needs a pool): a pod that no node admits is let onto a kept or reserved node on a lease of
    `drain_pool_run_s` (`lease_admits`: as if it declared that run); if it runs on, its caller stops it at the lease's
    end when a reservation holds the node, and renews the lease otherwise (the server's `QueueReservations.lapsed`,
    time mode's `lapse`). Why: under users' declarations (docs/queueing.md) 40% of pods declare nothing, so the pool,
    which admits only declared short runs, kept nodes idle while such pods waited, and a node with one silent pod never
    drained. Measured (tessera, kube, 100 openb nodes, seeds 42-46, users' declarations, with `--reservation-wait 8=0
    --drain-keep 16 --drain-pool-run 50m`; loads 0.7 / 0.9 / 1.1 / 1.2 / 1.33): 8-GPU mean 0.3 / 3.0 / 19.8 / 20.1 /
    19.5 min against 14.0-199 min as shipped, worst 8-GPU p99 22 / 70 / 158 / 139 / 157 min against 730-1118; but the
    mean over all pods 0.0 / 0.1 / 6.7 / 14.1 / 21.9 min against 0.1 / 0.4 / 1.8 / 6.0 / 14.2, and about 81 pods a
    run were deleted at a lease's end at 1.1-1.33 (85-100 GPU-hours of runs lost). Ending every lease at its bound, renewing
    none, cost more: 10.1 / 16.9 / 24.5 min at 1.1 / 1.2 / 1.33 and 236-247 runs ended. The big pods' gain is the
    other pods' wait: off by default.
    """

    wait_bound_s: Mapping[int, float] = field(default_factory=_default_bounds)
    grace_s: float = 600.0  # past the expected start: covers kube's 10 s backoff and 60 s flush many times
    max_share: float = 0.1  # of GPU capacity (milli) held by all reservations together
    drain_pool: int = 0  # nodes kept drainable for the reserving classes (see above)
    drain_pool_run_s: float = 3600.0  # the longest expected run a pool node takes from other pods
    drain_keep: int = 0  # drainable nodes kept per kind of node big enough for the reserving class (see above)
    drain_lease: bool = False  # a pod nothing else takes may use a kept or reserved node for `drain_pool_run_s` (see above)

    def __post_init__(self) -> None:
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"max_share must be 0..1, got {self.max_share}")
        if self.grace_s < 0 or any(b < 0 for b in self.wait_bound_s.values()):
            raise ValueError("bounds must not be negative")
        if self.drain_pool < 0 or self.drain_keep < 0 or self.drain_pool_run_s < 0:
            raise ValueError("the drain pool's size and run bound must not be negative")
        if self.drain_pool and self.drain_keep:
            raise ValueError("a fixed drain pool and a floating one (drain_keep) exclude each other: choose one")
        if self.drain_lease and not (self.drain_pool or self.drain_keep):
            raise ValueError("drain leases need a drain pool (drain_pool or drain_keep): without one no node is kept")

    def reserving(self, request: PodRequest) -> bool:
        """Whether pods like `request` reserve at all (whole GPUs of a count with a wait bound)."""
        return request.gpu_milli == MILLI_PER_GPU and request.gpu_count in self.wait_bound_s


@dataclass(frozen=True, slots=True)
class Reservation:
    """`request`'s hold on `node`: expected to start there at `start_s`, void after `expires_s`."""

    request: PodRequest
    node: str
    made_s: float
    start_s: float
    expires_s: float

    @property
    def pod(self) -> str:
        return self.request.name


class Backfill:
    """The live reservations over one `Cluster`; pure (no I/O), driven by the caller's clock values."""

    def __init__(self, cluster: Cluster, expected_end: ExpectedEnd, settings: BackfillSettings | None = None) -> None:
        self.cluster = cluster
        self.expected_end = expected_end
        self.settings = settings or BackfillSettings()
        self.by_node: dict[str, Reservation] = {}
        self.by_pod: dict[str, Reservation] = {}
        self._pool: tuple[int, frozenset[str]] = (-1, frozenset())  # (node count it was drawn for, names)
        # the floating pool (settings.drain_keep), all caches: a node's last expected end at its version, the
        # node kinds' fit sets, a request shape's fit set, and the guards as of (now, changes, reservations)
        self._ends: dict[str, tuple[int, tuple[float, ...]]] = {}
        self._need_memo: dict[tuple, tuple[bool, ...]] = {}
        self._kinds: tuple[frozenset[str], ...] | None = None
        self._specs: dict[str, NodeSpec] = {}
        self._fits: dict[tuple, frozenset[str]] = {}
        self._guards: tuple[tuple, dict[str, list[frozenset[str]]]] = ((), {})
        self._rooms: tuple[tuple, dict[tuple, float]] = ((), {})  # request shape -> `_rarest_with_room`, per guards state
        self._changes = 0
        if self.settings.drain_keep:
            cluster.on_change(self._changed)

    @property
    def pool(self) -> frozenset[str]:
        """The drain pool: the first `drain_pool` nodes (cluster order) that can hold the largest reserving class."""
        size = self.settings.drain_pool
        if not size:
            return frozenset()
        if self._pool[0] != len(self.cluster.nodes):
            need = max(self.settings.wait_bound_s, default=0)
            able = [n.name for n in self.cluster.nodes if n.spec.gpu_count >= need]
            self._pool = (len(self.cluster.nodes), frozenset(able[:size]))
        return self._pool[1]

    def restricted(self, name: str, now: float) -> bool:
        """Whether node `name` takes only some pods: a reservation holds it, or it is in the drain pool (fixed or floating)."""
        return name in self.by_node or name in self.pool or name in self.guarded(now)

    def restricted_nodes(self, now: float) -> set[str]:
        """Every node that takes only some pods now: a handful, so filter looks only at these."""
        return self.by_node.keys() | self.pool | self.guarded(now).keys()

    def closed_to(self, request: PodRequest, name: str, now: float, runtime_s: float | None) -> bool:
        """Whether node `name` stays closed to `request` however much room is made there: held for another pod, or a
        drain-pool node its run may not use. Its own reserved node stays open to it, as `admits` lets the holder in.
        Neither preemption nor a move clears such a node for the pod (server and time mode alike): it still could not go."""
        r = self.by_node.get(name)
        if r is not None:
            return r.pod != request.name
        return self.drain_refuses(request, name, now, runtime_s)

    def drain_refuses(self, request: PodRequest, name: str, now: float, runtime_s: float | None) -> bool:
        """Whether the drain pool keeps `request` off node `name`: never a run declared to end within the pool's bound;
        in the fixed pool any other pod but the reserving class; in the floating one any other pod but one of the
        reserving class that needs this node kind (fits no node that a kind guarding it cannot use), or that no less
        special node can start within the bound (`_rarest_with_room`)."""
        if runtime_s is not None and runtime_s <= self.settings.drain_pool_run_s:
            return False
        if not self.settings.drain_keep:
            return name in self.pool and not self.settings.reserving(request)
        guards = self.guarded(now).get(name)
        if not guards:
            return False
        if not self.settings.reserving(request):
            return True
        mine = self._fit_set(request)
        return _rarity(mine, guards) < self._rarest_with_room(request, mine, now)

    def _rarest_with_room(self, request: PodRequest, mine: frozenset[str], now: float) -> float:
        """The highest `_rarity` among the nodes a reserving-class pod fits that take it now or drain within the pool's
        run bound (-inf: none). The pod is refused the nodes kept for kinds rarer than that, and only those: it goes
        to the least special nodes that can start it within the bound, and a kind's kept nodes open to it once
        every less special node is busy past the bound.

        Why: kinds nest (a node with 96 cores fits every 8-GPU pod a 64-core node fits), and refusing a pod every
        node kept for a kind it does not need starved it when its own few nodes held runs of hours: on 100 openb
        nodes (seed 44, load 1.0, keep 16) 8-GPU pods asking 64 cores waited 2.3-5.4 h while 88-core pods that
        arrived later waited minutes. Opening every kept node to such a pod at once instead let a 6-hour 64-core
        run take one of the two 128-core nodes (seed 44, load 1.3) and a 120-core pod waited 3.9 h. Once per
        pod shape and `guarded` state, so once per server filter call of a reserving-class pod: 5.0 ms at 5,000
        nodes none of which can take it soon, against `guarded`'s own 1.0 ms (bench/floating_pool.py)."""
        guards = self.guarded(now)
        memo_key, memo = self._rooms
        if memo_key != self._guards[0]:
            memo = {}
            self._rooms = (self._guards[0], memo)
        got = memo.get(request.key)
        if got is None:
            horizon, by_name, got = now + self.settings.drain_pool_run_s, self.cluster.by_name, -math.inf
            for name in mine:
                kinds = guards.get(name)
                rarity = _rarity(mine, kinds) if kinds else math.inf
                if rarity <= got:
                    continue
                node = by_name[name]  # drains by the bound, or fits now (whole GPUs: the free count first, it is cheap)
                if self._last_ends(node)[-1] <= horizon or (
                        node.full_gpus_free >= request.gpu_count and fit_reason(request, node) is None):
                    got = rarity
                    if got == math.inf:
                        break  # a node no rarer kind keeps can start it: nothing kept opens to it
            memo[request.key] = got
        return got

    def guarded(self, now: float) -> dict[str, list[frozenset[str]]]:
        """The floating pool: node -> the fit sets of the node kinds that keep it: each kind's clean nodes (every pod
        but those that need the kind expected to end within the pool's bound), reserved or not, when no more than
        `drain_keep` are left.

        One pass over the nodes per new `now` (each node's pods are read once per version): 1.0 ms at 5,000 nodes
        of 4 pods each (62 ms for the first pass), so with a floating pool the server's filter pays that once per
        call, and nothing without."""
        keep = self.settings.drain_keep
        if not keep:
            return {}
        key = (now, self._changes, frozenset(self.by_node))
        if self._guards[0] == key:
            return self._guards[1]
        horizon = now + self.settings.drain_pool_run_s
        guards: dict[str, list[frozenset[str]]] = {}
        by_name = self.cluster.by_name
        for k, fits in enumerate(self._kind_fits()):
            kept = {name for name in fits if self._last_ends(by_name[name])[k] <= horizon}
            if len(kept) <= keep:
                for name in kept:
                    guards.setdefault(name, []).append(fits)
        self._guards = (key, guards)
        return guards

    def _kind_fits(self) -> tuple[frozenset[str], ...]:
        """For each kind of node (CPU, memory) that can hold the largest reserving class: the nodes a pod asking that
        many GPUs and all of such a node's CPU and memory would fit (that kind and larger ones)."""
        if self._kinds is None:
            count = max(self.settings.wait_bound_s, default=0)
            kinds = sorted({(n.spec.cpu_milli, n.spec.memory_mib) for n in self.cluster.nodes if n.spec.gpu_count >= count})
            fits = (self._fit_set(PodRequest("kind", cpu, memory, count, MILLI_PER_GPU)) for cpu, memory in kinds)
            self._kinds = tuple(dict.fromkeys(fits))
            self._specs = {n.name: n.spec for n in self.cluster.nodes}
        return self._kinds

    def _fit_set(self, request: PodRequest) -> frozenset[str]:
        """The nodes `request` could go to were they empty (cached per shape while the nodes stay the same)."""
        got = self._fits.get(request.key)
        if got is None:
            if len(self._fits) >= MAX_FIT_SETS:
                self._fits.clear()
            got = self._fits[request.key] = frozenset(n.name for n in self.cluster.nodes if not never_fits(request, n.spec))
        return got

    def _last_ends(self, node: NodeState) -> tuple[float, ...]:
        """Per node kind (`_kind_fits` order): when the last of the node's pods is expected to leave, not counting
        those that need that kind (inf: one has no known end; -inf: none); last, when the last of all its pods
        is. Read once per node version."""
        got = self._ends.get(node.name)
        if got is None or got[0] != node.version:
            kinds = self._kind_fits()
            pods = [(math.inf if (end := self.expected_end(name)) is None else end, self._needs(a))
                    for name, a in node.pods.items()]
            ends = tuple(max((end for end, needs in pods if not needs[k]), default=-math.inf) for k in range(len(kinds)))
            ends += (max((end for end, _ in pods), default=-math.inf),)
            got = self._ends[node.name] = (node.version, ends)
        return got[1]

    def _needs(self, a: Assignment) -> tuple[bool, ...]:
        """Per node kind: whether the pod so placed is of the reserving class and fits no node that kind cannot use
        (once per pod shape: a subset test over thousands of names is not done per pod)."""
        shape = PodRequest("shape", a.cpu_milli, a.memory_mib, len(a.gpus), a.milli if a.gpus else 0)
        got = self._need_memo.get(shape.key)
        if got is None:
            fits = self._fit_set(shape) if self.settings.reserving(shape) else None
            got = tuple(fits is not None and fits <= kind for kind in self._kind_fits())
            if len(self._need_memo) >= MAX_FIT_SETS:
                self._need_memo.clear()
            self._need_memo[shape.key] = got
        return got

    def _changed(self, node: NodeState) -> None:
        self._changes += 1
        spec = node.spec if self.cluster.by_name.get(node.name) is node else None
        if self._specs.get(node.name) is not spec:  # a node came, went or changed its spec: every cache is stale
            self._kinds, self._fits, self._ends, self._need_memo = None, {}, {}, {}

    def __len__(self) -> int:
        return len(self.by_pod)

    def held_milli(self) -> int:
        return sum(r.request.gpu_demand for r in self.by_pod.values())

    def due(self, request: PodRequest, waited_s: float) -> bool:
        """Whether the pod has waited past its class's bound and holds no reservation yet."""
        bound = self.settings.wait_bound_s.get(request.gpu_count) if request.gpu_milli == MILLI_PER_GPU else None
        return bound is not None and waited_s >= bound and request.name not in self.by_pod

    def reserve(self, request: PodRequest, waited_s: float, now: float,
                allowed: Callable[[str], bool] | None = None, runtime_s: float | None = None) -> Reservation | None:
        """Reserve the node that would hold `request` soonest at least idle cost; None when the pod is not
        due, the share cap leaves no room, or no unreserved node (of those `allowed`, default all, and not kept from a
        run of `runtime_s` by the drain pool) has a known start."""
        if not self.due(request, waited_s):
            return None
        cap = self.settings.max_share * self.cluster.open_milli
        if self.held_milli() + request.gpu_demand > cap:
            return None
        best: tuple[float, float, str] | None = None
        for node in self.cluster.nodes:
            if node.name in self.by_node or never_fits(request, node.spec) or (allowed and not allowed(node.name)) \
                    or self.drain_refuses(request, node.name, now, runtime_s):
                continue
            start, cost = self._earliest_start(request, node, now)
            if start < math.inf and (best is None or (start, cost) < best[:2]):
                best = (start, cost, node.name)
        if best is None:
            return None
        r = Reservation(request, best[2], now, best[0], best[0] + self.settings.grace_s)
        self.by_node[r.node] = self.by_pod[r.pod] = r
        return r

    def admits(self, request: PodRequest, node: NodeState, gpus: tuple[int, ...], now: float,
               runtime_s: float | None) -> bool:
        """Whether `request` may take `gpus` of `node` now: not where the drain pool keeps it off (`drain_refuses`);
        then yes on a node nobody reserved and for the holder; otherwise only when the reserved pod can still start
        there at its expected time."""
        r = self.by_node.get(node.name)
        if r is not None and r.pod == request.name:
            return True  # the holder (reserved before the pool kept its node, if it is kept now)
        if self.drain_refuses(request, node.name, now, runtime_s):
            return False
        if r is None:
            return True
        end = math.inf if runtime_s is None else now + runtime_s
        scratch = self._staying(node, r.start_s)
        if end > r.start_s:
            _take(scratch, request.cpu_milli, request.memory_mib, gpus, request.gpu_milli)
        return fit_reason(r.request, scratch) is None

    def lease_admits(self, request: PodRequest, node: NodeState, gpus: tuple[int, ...], now: float) -> bool:
        """Whether `request` may take `gpus` of `node` on a drain lease (`drain_lease`): as a pod declaring a run of the
        pool's bound would, which the lease makes true, since the pod is stopped there. Never a reserving-class pod
        (the pool keeps its nodes for it: it goes there without a lease when they take it)."""
        return self.settings.drain_lease and not self.settings.reserving(request) \
            and self.admits(request, node, gpus, now, self.settings.drain_pool_run_s)

    def placed(self, pod: str) -> Reservation | None:
        """The pod was placed (anywhere) or left the queue: its reservation, if any, ends."""
        r = self.by_pod.pop(pod, None)
        if r is not None:
            del self.by_node[r.node]
        return r

    def expire(self, now: float) -> list[Reservation]:
        """Drop the reservations past their expiry; returns them (their nodes take anyone again)."""
        gone = [r for r in self.by_pod.values() if r.expires_s <= now]
        for r in gone:
            self.placed(r.pod)
        return gone

    def awaited(self, r: Reservation) -> list[tuple[str, float]]:
        """(pod, expected end) of the pods on `r`'s node expected to leave by its start: what the reservation waits for."""
        node = self.cluster.by_name.get(r.node)
        ends = [(name, end) for name in (node.pods if node else ()) if (end := self.expected_end(name)) is not None]
        return sorted(((name, end) for name, end in ends if end <= r.start_s), key=lambda pair: (pair[1], pair[0]))

    def _staying(self, node: NodeState, at: float) -> NodeState:
        """A scratch copy of `node` holding only the pods expected to be there still at time `at`."""
        scratch = NodeState(node.spec, -1)
        for name, a in node.pods.items():
            end = self.expected_end(name)
            if end is None or end > at:
                _take(scratch, a.cpu_milli, a.memory_mib, a.gpus, a.milli)
        return scratch

    def _earliest_start(self, request: PodRequest, node: NodeState, now: float) -> tuple[float, float]:
        """(when `request` would first fit `node` as its pods leave by their expected ends, the GPU milli-seconds
        left idle until then); (inf, inf) when it would not fit before a pod of unknown end leaves."""
        leaving = sorted(((end if (end := self.expected_end(name)) is not None else math.inf, a)
                          for name, a in node.pods.items()), key=lambda pair: pair[0])
        scratch = NodeState(node.spec, -1)
        for _, a in leaving:
            _take(scratch, a.cpu_milli, a.memory_mib, a.gpus, a.milli)
        start, freed = now, []
        for end, a in leaving:
            if fit_reason(request, scratch) is None:
                break
            start = max(now, end)
            _take(scratch, -a.cpu_milli, -a.memory_mib, a.gpus, -a.milli)
            freed.append((start, a.gpu_demand))
        if fit_reason(request, scratch) is not None or start == math.inf:
            return math.inf, math.inf
        idle = node.gpu_free_total * (start - now) + sum(d * (start - t) for t, d in freed)
        return start, idle


def _rarity(mine: frozenset[str], guards: list[frozenset[str]]) -> float:
    """How special a node is to a pod that fits the nodes `mine`: the size of the rarest kind keeping the node that the
    pod does not need (fewer nodes: more special); inf when no such kind keeps it (the pod may always go there)."""
    return min((len(fits) for fits in guards if not mine <= fits), default=math.inf)


def _take(scratch: NodeState, cpu: int, memory: int, gpus: tuple[int, ...], milli: int) -> None:
    """Charge (or, with negative amounts, give back) one pod's resources on a scratch node."""
    scratch.cpu_free -= cpu
    scratch.memory_free -= memory
    for g in gpus:
        scratch.gpu_free[g] -= milli
