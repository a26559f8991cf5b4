"""Queue reservations: the server's side of reservations with backfill (core/backfill.py, issue 14 item 3).

Not bind's holds (reservations.py: GPUs a bind took until the watch confirms it). A queue reservation
holds no GPU: it names a node that a pod waiting past its class's bound will take when the node's
running pods leave, and from then on refuses the node to any other pod that would delay that start.
The simulator's time mode runs the same `Backfill` (`tessera simulate --mode time --reservations on`);
this module feeds it what only the server knows:

  * a pending pod's wait: now minus its `metadata.creationTimestamp` (written by the API server, so a
    tenant cannot age its own pod), read from the pod the watch delivered, never the one a verb posted;
  * a bound pod's expected end: its start plus the run time it declares (`PodInfo.declared_run_s`: the shorter of
    `spec.activeDeadlineSeconds`, where the kubelet stops it, and `tessera.dev/expected-runtime`, a hint), unknown
    (None) without either. Its start is the earlier of when this process first saw it bound and
    its `status.startTime` (the kubelet's): after a restart the watch sees every pod "first" at once,
    and startTime keeps the estimate where it was.

When a pod reserves: in filter, when no node offered passes it; and every SWEEP_S from the extender's
expiry tick, for pods kube-scheduler's own checks refused before Tessera was asked (an 8-GPU pod on a
cluster with no 8 free `nvidia.com/gpu` never reaches filter). Reservations are not stored anywhere:
they are derived again, from the same timestamps, by a restarted extender (docs/architecture.md).

A reservation sees only what Tessera judges (GPUs, CPU, memory, GPU model, taints), not the rest of
kube-scheduler's checks (a nodeSelector on another label, pod affinity). A pod one of those keeps off its
reserved node would hold it reserved, expiring and reserving again, for as long as it waits; so a
reservation that expires while its pod fits the node (kube-scheduler had the chance and did not bind it
there) marks the pod: it never reserves again. A pod kube-scheduler keeps off its reserved node therefore
restricts that node's backfill for one reservation at most, and all reservations together never cover
more than `max_share` of the cluster's GPUs.

A deadline cannot lie short: the kubelet stops the pod there, so a pod that declares only a deadline is gone by
its expected end. An expected runtime is the tenant's word: one that lies (declares 10 min, runs 10 h) delays the
reserved pod, which its reservation's expiry (`grace_s` past the expected start) bounds; once a pod has
overrun its declared end by the grace its end counts as unknown again, so the waiting pod reserves
elsewhere rather than the liar's node again. It never gives the liar capacity it would not get without
reservations.

Drain leases (`--drain-lease on`, core/backfill.py `drain_lease`): a pod that every node kube-scheduler passed
refuses only because the drain pool keeps it (or a reservation holds it) is offered those nodes anyway, on the
condition that it leaves within the pool's bound; bind records the lease, the pod's expected end becomes the lease's
end (so its node still drains by the bound). When the lease lapses with the pod still there and a reservation holds
its node, kube/preemptor.py deletes the pod (its disruption budget allowing), and its controller makes a new pod;
with no reservation on the node, nobody waits for it to drain, and the lease is renewed for another bound (`lapsed`).
Only pods that a controller replaces are leased (an ownerReference marked controller), never one whose owner wrote
`cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, a gang member or a pod of a reserving class, and never
a pod of a controller whose earlier pod's lease ended: its runs outlast the bound. Leases live in memory: after a
restart a leased pod counts by what it declares, so its node leaves the pool, and nothing is deleted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from tessera_contract import EXPECTED_RUNTIME_ANNOTATION, TERMINAL_PHASES

from .core.backfill import Backfill, BackfillSettings, Reservation
from .core.cluster import Cluster, NodeState, fit_reason
from .core.model import PodRequest
from .core.placer import Placer
from .state import PodInfo, Tolerations

LEASE_RETRY_S = 30.0  # a lapsed lease whose pod a disruption budget protects is asked again this much later
MAX_LEASE_ENDED = 10_000  # controllers remembered as having had a pod's lease end (oldest forgotten first)
SWEEP_S = 5.0  # the cache's expiry tick runs every 5 s; waits bounded in minutes need no finer step
MAX_SWEEP_TRIES = 8  # due pods tried per sweep (each a pass over the nodes), oldest first: bounded work under the lock
AWAITED_SHOWN = 5  # pods named in what a reservation waits for

Blocked = Callable[[Tolerations], list[tuple[set[str], str]]]  # the Extender's tainted-node groups a pod may not use


def when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Lease:
    """A pod let onto a kept or reserved node for the drain pool's bound only (core/backfill.py `drain_lease`)."""

    uid: str
    key: str
    node: str
    controller_uid: str
    ends_s: float


class QueueReservations:
    """The server's `Backfill`: fed by the watch (`watched`, `gone`), asked by filter (`narrow`) and bind (`refusal`).

    `settings` None: reservations off, every method a no-op that admits everything. Hold the extender's lock.
    """

    def __init__(self, cluster: Cluster, placer: Placer, blocked: Blocked, settings: BackfillSettings | None = None,
                 clock: Callable[[], float] = time.time, claimed: Callable[[], set[str]] = set) -> None:
        self.placer, self.blocked, self.clock = placer, blocked, clock
        self.claimed = claimed  # nodes gangs hold while they drain (gang_drains.py): never reserved for a pod
        self.on = settings is not None
        self.backfill = Backfill(cluster, self.expected_end, settings)
        self.started: dict[str, float] = {}  # bound pod key -> when it started (epoch s)
        self.runtime: dict[str, float] = {}  # pod key -> the run time it declares
        self.waiting: dict[str, PodInfo] = {}  # uid -> pending pod of a class with a wait bound
        self.shunned: set[str] = set()  # pods whose reservation expired on a node they fitted: kube refuses them there
        self.leases: dict[str, Lease] = {}  # pod key -> its drain lease (bound pods on a node they took on a lease)
        self.lease_ended: dict[str, None] = {}  # controllers whose pod's lease ended, oldest first: never leased again
        self.lease_asked: dict[str, float] = {}  # pod key -> when its lapsed lease may be asked to end again
        self.leases_ended = 0  # pods deleted at their lease's end since start (the tessera_drain_leases_ended counter)
        self.leases_renewed = 0  # leases renewed at their end, no reservation holding their node (..._renewed counter)
        self._swept = -SWEEP_S

    def expected_end(self, pod: str) -> float | None:
        """Its start plus its declared run; unknown (it stays) without both, and once it has overrun that by
        more than the grace: a run time that proved wrong must not keep drawing reservations to its node."""
        start, runtime, lease = self.started.get(pod), self.runtime.get(pod), self.leases.get(pod)
        end = start + runtime if start is not None and runtime is not None else math.inf
        if lease is not None:
            end = min(end, lease.ends_s)
        return None if end == math.inf or end + self.backfill.settings.grace_s <= self.clock() else end

    # --- the watch ------------------------------------------------------------------------------

    def watched(self, info: PodInfo) -> None:
        if not self.on:
            return
        if info.node and info.key in self.started:
            pass  # the run time it declared when it was first seen bound stays: edited after an overrun, it drew
            # reservations back to its node every grace period (and made its node count as clean for the pool)
        elif info.declared_run_s is None:
            self.runtime.pop(info.key, None)
        else:
            self.runtime[info.key] = info.declared_run_s
        if info.node or info.phase in TERMINAL_PHASES:
            self.backfill.placed(info.key)  # placed (here or by another binder) or finished: its reservation ends
        if not info.node and info.phase not in TERMINAL_PHASES and not info.in_gang \
                and info.request.gpu_count in self.backfill.settings.wait_bound_s:
            self.waiting[info.uid] = info
        else:
            self.waiting.pop(info.uid, None)
        if info.node:  # the earliest start heard of: first seen bound, or the kubelet's startTime once it writes one
            start = min(self.clock(), info.started_s if info.started_s is not None else math.inf)
            self.started[info.key] = min(start, self.started.get(info.key, start))

    def gone(self, uid: str, info: PodInfo | None) -> None:
        self.waiting.pop(uid, None)
        if info is not None:
            self.shunned.discard(info.key)
            self.started.pop(info.key, None)
            self.runtime.pop(info.key, None)
            self.leases.pop(info.key, None)
            self.lease_asked.pop(info.key, None)
            self.backfill.placed(info.key)

    # --- the verbs ------------------------------------------------------------------------------

    def narrow(self, info: PodInfo, known: PodInfo | None, passed: list[str], reserve: bool) -> tuple[list[str], dict[str, str]]:
        """(the nodes of `passed` the pod may take, {reserved node: why not}); with `reserve`, a watched pod past its
        bound that passes none reserves the node that takes it soonest. `known`: the pod as the watch shows it."""
        if not self.on:
            return passed, {}
        known = known if known is not None and known.key == info.key and not known.node else None
        request = self.placer.request_for(info.request)
        runtime = (known or info).declared_run_s
        refused = {}
        restricted = self.backfill.restricted_nodes(self.clock())  # a handful, not every node passed
        offered = set(passed) if restricted else ()
        for name in [n for n in restricted if n in offered]:
            if (node := self.backfill.cluster.by_name.get(name)) is not None and (why := self._refusal(request, node, runtime)):
                refused[name] = why
        if refused and len(refused) == len(offered) and self._leasable(known or info, request):
            leased = [n for n in refused if self._lease_admits(request, self.backfill.cluster.by_name[n])]
            for name in leased:  # nothing else takes it: the nodes a lease opens are offered
                del refused[name]
        if refused:
            passed = [n for n in passed if n not in refused]
        if reserve and not passed and known is not None:
            self._reserve(known, request)
        return passed, refused

    def restricted_nodes(self) -> set[str]:
        """Nodes that take only some pods now (reserved, or kept by a drain pool); none with reservations off."""
        return self.backfill.restricted_nodes(self.clock()) if self.on else set()

    def closed_to(self, info: PodInfo, name: str) -> bool:
        """Whether node `name` stays closed to the pod however much room is made there (`Backfill.closed_to`)."""
        if not self.on:
            return False
        return self.backfill.closed_to(self.placer.request_for(info.request), name, self.clock(), info.declared_run_s)

    def refusal(self, info: PodInfo, node: NodeState, gpus: tuple[int, ...]) -> str | None:
        """Why bind may not give `gpus` of `node` to the (watched) pod: another pod's reservation there; None when it may."""
        if not self.on:
            return None
        request = self.placer.request_for(info.request)
        why = self._refusal(request, node, info.declared_run_s, gpus)
        if why is not None and self._leasable(info, request) and self._lease_admits(request, node, gpus):
            now = self.clock()
            self.leases[info.key] = Lease(info.uid, info.key, node.name, info.controller_uid,
                                          now + self.backfill.settings.drain_pool_run_s)
            return None
        return why

    def lapsed(self) -> list[Lease]:
        """The leases past their end whose pod still runs on the leased node and whose node a reservation holds, each
        at most once per LEASE_RETRY_S: kube/preemptor.py deletes those pods (their disruption budgets allowing).
        A lease past its end on a node no reservation holds is renewed for another bound instead.

        Why renew: a lease exists so that its node drains by the bound for a pod that needs it; with nobody waiting
        for the node, ending the run loses it for nothing. Measured in time mode (100 openb nodes, users'
        declarations, seeds 42-46, 50 min leases; docs/queueing.md "Renewing a lease nobody waits for"): the runs
        ended fell from 236-247 a run to about 81 at loads 1.1-1.33, the GPU-hours they had run from about 190 a run
        to 85-100, and the mean wait over all pods from 10.1 / 16.9 / 24.5 to 6.7 / 14.1 / 21.9 min at 1.1 / 1.2 /
        1.33; the worst 8-GPU p99 moved from 179 / 187 / 150 to 158 / 139 / 157 min."""
        if not self.leases:
            return []
        now, assignments = self.clock(), self.backfill.cluster.assignments
        out = []
        for key, lease in list(self.leases.items()):
            a = assignments.get(key)
            if a is None or a.node != lease.node:
                del self.leases[key]  # it left, or its bind failed
                self.lease_asked.pop(key, None)
            elif lease.ends_s > now:
                continue
            elif lease.node not in self.backfill.by_node:
                self.leases[key] = replace(lease, ends_s=now + self.backfill.settings.drain_pool_run_s)
                self.leases_renewed += 1
            elif self.lease_asked.get(key, -math.inf) <= now:
                self.lease_asked[key] = now + LEASE_RETRY_S
                out.append(lease)
        return out

    def lease_over(self, lease: Lease) -> None:
        """The lapsed pod was deleted: its controller's next pod is never leased (its runs outlast the pool's bound)."""
        self.leases.pop(lease.key, None)
        self.lease_asked.pop(lease.key, None)
        self.leases_ended += 1
        self.lease_ended[lease.controller_uid] = None
        if len(self.lease_ended) > MAX_LEASE_ENDED:
            del self.lease_ended[next(iter(self.lease_ended))]

    def tick(self) -> None:
        """Expire what ran out and, every SWEEP_S, let due pods that filter never saw reserve."""
        if not self.on:
            return
        now = self.clock()
        for r in self.backfill.expire(now):
            node = self.backfill.cluster.by_name.get(r.node)
            if node is not None and fit_reason(r.request, node) is None:
                self.shunned.add(r.pod)  # it fitted its node and was not bound there: kube-scheduler refuses it
        for r in [r for r in self.backfill.by_pod.values() if r.pod in self.backfill.cluster.assignments]:
            self.backfill.placed(r.pod)  # bind gave it GPUs: the watch will confirm
        if now - self._swept < SWEEP_S:
            return
        self._swept = now
        due = sorted((i for i in self.waiting.values() if i.created_s is not None and i.key not in self.backfill.by_pod),
                     key=lambda i: i.created_s)
        for info in due[:MAX_SWEEP_TRIES]:
            request = self.placer.request_for(info.request)
            if not self._fits_somewhere(info, request):
                self._reserve(info, request)

    # --- what people see ------------------------------------------------------------------------

    def note(self, key: str) -> str:
        """The pending reason's words for a pod holding a reservation ('' when it holds none)."""
        r = self.backfill.by_pod.get(key)
        if r is None:
            return ""
        return f"; node {r.node} is reserved for it from {when(r.start_s)} (until {when(r.expires_s)}){self._awaits(r)}"

    def listing(self) -> list[dict]:
        """Every reservation for /inspect: pod, node, since, expected start, expiry, GPUs, what it waits for."""
        out = []
        for r in sorted(self.backfill.by_pod.values(), key=lambda r: r.made_s):
            awaited = self.backfill.awaited(r)
            out.append({"pod": r.pod, "node": r.node, "since": when(r.made_s), "expected_start": when(r.start_s),
                        "expires": when(r.expires_s), "gpus": r.request.gpu_count,
                        "waits_for": [{"pod": p, "expected_end": when(end)} for p, end in awaited[:AWAITED_SHOWN]],
                        "waits_for_more": max(0, len(awaited) - AWAITED_SHOWN)})
        return out

    def lease_listing(self) -> list[dict]:
        """Every drain lease for /inspect: pod, node, when it ends."""
        return [{"pod": lease.key, "node": lease.node, "ends": when(lease.ends_s)}
                for lease in sorted(self.leases.values(), key=lambda lease: (lease.ends_s, lease.key))]

    def held_milli(self) -> int:
        """The GPU milli all reservations hold (0 with reservations off)."""
        return self.backfill.held_milli() if self.on else 0

    def held_share(self) -> float:
        """The share of the cluster's GPU capacity all reservations hold (never over the settings' max_share)."""
        capacity = self.backfill.cluster.open_milli
        return self.backfill.held_milli() / capacity if capacity else 0.0

    # --- internals ------------------------------------------------------------------------------

    def _refusal(self, request: PodRequest, node: NodeState, runtime: float | None,
                 gpus: tuple[int, ...] | None = None) -> str | None:
        r, now = self.backfill.by_node.get(node.name), self.clock()
        if (r is None or r.pod == request.name) and not self.backfill.drain_refuses(request, node.name, now, runtime):
            return None
        if gpus is None and (gpus := self._gpus(request, node)) is None:
            return None  # it does not fit there anyway: filter already said why
        if self.backfill.admits(request, node, gpus, now, runtime):
            return None
        if r is None or r.pod == request.name:  # the drain pool refused it
            return (f"tessera: node kept drainable for pods of {', '.join(map(str, sorted(self.backfill.settings.wait_bound_s)))}"
                    f" GPUs; it takes other pods only if they declare a {EXPECTED_RUNTIME_ANNOTATION} of at most "
                    f"{self.backfill.settings.drain_pool_run_s:.0f} s")
        return (f"tessera: node reserved for {r.pod} ({r.request.gpu_count} GPUs) from {when(r.start_s)}; this pod would "
                f"delay it (a pod declaring a short enough {EXPECTED_RUNTIME_ANNOTATION} may run there first)")

    def _leasable(self, info: PodInfo, request: PodRequest) -> bool:
        """Whether the pod may be leased a node: leases on, a pod with a controller that makes a new one (a bare pod
        deleted is gone), no safe-to-evict "false", not a gang member (its gang would lose one member), not of a
        reserving class, and no earlier pod of its controller's lease ended."""
        s = self.backfill.settings
        return s.drain_lease and bool(info.controller_uid) and info.evictable and not info.in_gang \
            and not s.reserving(request) and info.controller_uid not in self.lease_ended

    def _lease_admits(self, request: PodRequest, node: NodeState, gpus: tuple[int, ...] | None = None) -> bool:
        gpus = gpus if gpus is not None else self._gpus(request, node)
        return gpus is not None and self.backfill.lease_admits(request, node, gpus, self.clock())

    def _gpus(self, request: PodRequest, node: NodeState) -> tuple[int, ...] | None:
        """The GPUs the placer would give the pod on `node` (what bind would be asked for); None where it does not fit."""
        verdict = self.placer.verdict(request, node)
        return None if verdict is None else self.placer.gpus_for(request, node, verdict)

    def _fits_somewhere(self, info: PodInfo, request: PodRequest) -> bool:
        blocked = set().union(*(names for names, _ in self.blocked(info.tolerations)))
        by_name = self.backfill.cluster.by_name
        return any(name not in blocked and self._refusal(request, by_name[name], info.declared_run_s) is None
                   for name in self.placer.view(request).fit if name in by_name)

    def _reserve(self, info: PodInfo, request: PodRequest) -> Reservation | None:
        if info.created_s is None or info.in_gang or info.key in self.shunned:
            return None
        now = self.clock()
        blocked = set().union(*(names for names, _ in self.blocked(info.tolerations)), self.claimed())
        return self.backfill.reserve(request, now - info.created_s, now, allowed=lambda n: n not in blocked,
                                     runtime_s=info.declared_run_s)

    def _awaits(self, r: Reservation) -> str:
        awaited = self.backfill.awaited(r)
        if not awaited:
            return ""
        shown = ", ".join(p for p, _ in awaited[:AWAITED_SHOWN]) + (f" and {len(awaited) - AWAITED_SHOWN} more"
                                                                      if len(awaited) > AWAITED_SHOWN else "")
        return f", when {shown} {'is' if len(awaited) == 1 else 'are'} expected to end"
