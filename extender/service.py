"""The extender's state and decisions: one object, one lock, no HTTP and no API calls.

`Extender` is what kube-scheduler's verbs and the Kubernetes watch talk to. The HTTP app
(`extender.http`) parses requests into plain data and calls it; the watch (`extender.kube.cache`)
feeds it nodes and pods; the binder (`extender.kube.binder`) writes what it decided.

Each job is a small object the Extender holds and delegates to, all under its one lock, as
scheduler-plugins' coscheduling delegates to its PodGroup manager: `judge.Judge` (filter's verdict
on a pod, and bind's check of the one node), `displacement.Displacement` (who may be evicted or
moved for a pod, and the plan), `gangs.Gangs` (gang admission), `nodes.NodeTable` (GPU UUIDs,
health, taints), `adoption.Adoption` (what bound pods hold, whoever bound them),
`forgery.ForgeryLedger` (assignments whose MAC did not verify), `learning.WorkloadLearning` (the
policy follows the watched mix), `holds.BindHolds` and `holds.Arrivals` (bind's
holds until the watch confirms them; binds that came before their pod). The Extender's own methods
are the entry points (the watch's, the verbs', the preemptor's) and the lock; the shells read
several parts at once only through `reading()`.

Concurrency: kube-scheduler filters one pod at a time but binds in parallel goroutines, so
bind's select-and-commit runs under the lock and records a *reservation* (keyed by pod UID, with
a TTL) before the API call; the watch confirms it when the pod shows up bound with Tessera's
annotation. Two overlapping binds therefore always see each other's slices.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tessera_contract import TERMINAL_PHASES  # the keyring (tessera_contract/keyring.py) as the service holds it
from tessera_contract import MacSigner as AssignmentSigner

from .adoption import Adoption
from .core.backfill import BackfillSettings
from .core.cluster import Cluster
from .core.model import Assignment
from .core.openb_stats import default_workload
from .core.placer import Placer
from .core.policy import Policy
from .core.short_first import ShortFirstSettings
from .core.workload import TargetWorkload
from .displacement import Displacement
from .forgery import ForgeryLedger
from .gang_drains import GangDrains
from .gangs import Gangs
from .holds import DEFAULT_HOLD_TTL_S, WATCH_WAIT_S, Arrivals, BindHolds
from .judge import FilterOutcome, Judge, Priorities
from .learning import WorkloadLearning
from .moves import Moves
from .nodes import NodeTable
from .nominations import Nomination, Nominations
from .offers import Offers
from .queue_reservations import QueueReservations
from .run_estimates import RunEstimates
from .short_first_queue import ShortFirstQueue
from .state import (  # noqa: F401 (the bind errors and Binder are re-exported: callers named them from here)
    AlreadyBound,
    Binder,
    BindError,
    BindFailure,
    GpuInfo,
    NodeInventory,
    NodeTerms,
    NotReady,
    PodGroup,
    PodInfo,
    Taint,
    Tolerations,
    refusal_reasons,
)
from .watch_health import WatchHealth

log = logging.getLogger(__name__)

# F_n memo entries kept by a running extender (about 400 B each, so ~20 MiB): per-shape views and
# the per-node verdict memo do the caching that matters once the cluster has settled
EXTENDER_MEMO_LIMIT = 50_000


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a request could change, as immutable values: compare two to prove nothing moved.

    `placement` is what decides who gets which GPU (free capacity, assignments, reservations);
    `pods` is the set of pods the extender has heard of: only the watch adds one, never a verb.
    """

    synced: bool
    nodes: tuple[tuple[str, int, int, tuple[int, ...]], ...]  # name, cpu free, memory free, milli free per GPU
    assignments: frozenset[tuple[str, str, tuple[int, ...], int]]  # pod, node, gpus, milli
    bind_holds: frozenset[str]
    binding: frozenset[str]
    rejected: frozenset[tuple[str, str]]
    forged: frozenset[tuple[str, str]]
    pods: frozenset[str]
    queue_reserved: frozenset[tuple[str, str]] = frozenset()  # (pod, node): reservations with backfill

    @property
    def placement(self) -> tuple:
        return (self.synced, self.nodes, self.assignments, self.bind_holds, self.binding, self.rejected, self.forged,
                self.queue_reserved)




class Extender:
    def __init__(
        self,
        policy: str = "tessera",
        workload: TargetWorkload | None = None,
        hold_ttl_s: float = DEFAULT_HOLD_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        signer: AssignmentSigner | None = None,
        watch_wait_s: float = WATCH_WAIT_S,
        prior: TargetWorkload | None = None,
        seed: int = 0,
        backfill: BackfillSettings | None = None,
        wall_clock: Callable[[], float] = time.time,
        short_first: ShortFirstSettings | None = None,
    ) -> None:
        self.policy_name = policy
        self.seed = seed  # the policy's (Random-fit's draws, tessera's node order): a replay's seed reproduces it
        self.learning = WorkloadLearning(policy, EXTENDER_MEMO_LIMIT, workload, seed=seed)  # the policy follows the mix
        self._lock = threading.RLock()
        self.cluster = Cluster([])
        self.nodes = NodeTable(self.cluster)  # GPU UUIDs, health and taints per node (nodes.py)
        self.pods: dict[str, PodInfo] = {}  # uid -> what we know of the pod
        self.holds = BindHolds(hold_ttl_s, clock)  # GPUs bind took before the watch confirms (holds.py)
        self.nominations = Nominations(clock=clock)  # nodes being cleared for preemptors (nominations.py)
        self.verb_preempts = True  # the preempt verb answers victims; serve.py turns it off unless kube-scheduler deletes them
        self.signer = signer  # with a key, only assignments Tessera signed count (translate/objects.py)
        self.forgery = ForgeryLedger()  # pods whose assignment annotation was set aside (forgery.py)
        self.synced = False
        self.offers = Offers(self.cluster)  # where kube-scheduler let pods be tried (offers.py)
        self.arrivals = Arrivals(self._lock, watch_wait_s)  # binds that came before their pod's watch event
        self.watch_health = WatchHealth()  # objects the watch skipped, and whether it keeps up (watch_health.py)
        self.adoption = Adoption(self.cluster, self.pods, self.holds)  # what bound pods hold (adoption.py)
        self.policy = self.learning.policy_for(workload or prior or default_workload())
        self.placer = Placer(self.cluster, self.policy)  # the placement cycle the simulator runs too
        # reservations with backfill (queue_reservations.py; off without settings): not bind's `holds`
        self.queue_reservations = QueueReservations(self.cluster, self.placer, self.nodes.blocked, backfill, wall_clock,
                                                    claimed=lambda: self.gangs.drained_nodes())
        self.moves = Moves(self.cluster, self.placer, self.pods, clock)  # trainers moved to make room (moves.py); off by default
        # shortest runs first (short_first_queue.py; off without settings): long GPU pods wait while many short ones do;
        # a silent pod's run estimated from its namespace's pods of its shape (run_estimates.py; with the settings' word)
        self.run_estimates = RunEstimates(short_first is not None and short_first.estimate_silent, wall_clock)
        self.short_first = ShortFirstQueue(self.cluster, self.placer, self.nodes.admit, short_first, wall_clock,
                                           self.run_estimates.estimate)
        # gangs: admitted whole when all their members exist and fit, GPUs held until bound (gangs.py)
        drains = GangDrains(self.cluster, self.placer, backfill, self.queue_reservations.expected_end,
                            self.queue_reservations.held_milli, wall_clock)
        self.gangs = Gangs(self.cluster, self.placer, self.pods, self.offers, self._release, self.nodes.blocked,
                           lambda info: self.judge.closed_nodes(info), clock, drains)
        # filter's verdict (judge.py), and who may be evicted or moved for a pod and how (displacement.py)
        self.judge = Judge(self.cluster, self.placer, self.nodes, self.pods, self.offers, self.nominations,
                           self.queue_reservations, self.short_first, self.gangs)
        self.displacement = Displacement(self.cluster, self.placer, self.nodes, self.pods, self.nominations, self.moves,
                                         self.queue_reservations, self.judge, lambda: self.synced)

    # The state the modules above own, under the names the verbs, /inspect and /metrics read.

    @property
    def bind_holds(self) -> dict[str, float]:  # uid -> expiry of the GPUs its bind holds
        return self.holds.expiry

    @property
    def gpu_uuids(self) -> dict[str, tuple[str, ...]]:
        return self.nodes.gpu_uuids

    @property
    def gpu_info(self) -> dict[str, tuple[GpuInfo, ...]]:
        return self.nodes.gpu_info

    @property
    def rejected(self) -> dict[str, str]:  # uid -> why a watched assignment was not counted
        return self.adoption.rejected

    @property
    def forged(self) -> dict[str, str]:  # uid -> why its assignment annotation was set aside
        return self.forgery.reasons

    def _use(self, policy: Policy) -> None:
        """Switch policy (a relearned workload): verdicts start afresh."""
        self.policy = policy
        self.placer.use(policy)

    @contextmanager
    def reading(self) -> Iterator[Extender]:
        """The shells' one door for reading several parts at once (/inspect, /metrics, the waiting reasons): the
        extender held still under its lock. Read only, and copy out what outlives the block."""
        with self._lock:
            yield self

    # --- the watch feeds these ---------------------------------------------------------------

    def upsert_node(self, inv: NodeInventory) -> None:
        with self._lock:
            self.nodes.upsert(inv, warn=self.synced)

    def delete_node(self, name: str) -> None:
        with self._lock:
            for a in self.nodes.remove(name):
                self.holds.drop(self.adoption.uid_of(a.pod))

    def pods_on_gpu(self, node: str, gpu: int) -> list[str]:
        """namespace/name of every pod holding a share of GPU `gpu` of `node`."""
        with self._lock:
            return self.nodes.pods_on_gpu(node, gpu)

    def unhealthy_gpus(self) -> list[dict]:
        """Every GPU its agent reports unhealthy, with the pods still on it (they need moving)."""
        with self._lock:
            return self.nodes.unhealthy_gpus()

    def upsert_pod(self, info: PodInfo) -> None:
        """A pod as the API shows it: learn its request; account what it holds once it is bound."""
        with self._lock:
            self._observe(info)
            old = self.pods.get(info.uid)
            self.pods[info.uid] = info
            if old is None:
                self.arrivals.arrived()
            self.forgery.note(info)
            self.adoption.watched(info)
            self.gangs.watched(info, old)
            if info.node:
                self.nominations.drop(info.uid)
                self.moves.bound(info)
            self.queue_reservations.watched(info)
            self.run_estimates.watched(info)
            self.short_first.watched(info)

    def delete_pod(self, uid: str) -> None:
        with self._lock:
            self.offers.forget(uid)
            info = self.pods.pop(uid, None)
            self.adoption.gone(uid, info)
            self.gangs.gone(uid, info)
            self.forgery.forget(uid)
            self.nominations.drop(uid)
            self.nominations.victim_gone(uid)
            self.queue_reservations.gone(uid, info)
            self.run_estimates.gone(uid)
            self.short_first.gone(uid)

    def upsert_pod_group(self, group: PodGroup) -> None:
        """A scheduler-plugins PodGroup as the watch shows it (kube/podgroups.py): the size of the gang its pods form."""
        with self._lock:
            self.gangs.upsert_group(group)

    def delete_pod_group(self, key: str) -> None:
        with self._lock:
            self.gangs.delete_group(key)

    def pod_groups_served(self, served: bool, why: str = "") -> None:
        """Whether the API serves PodGroups (its CRD installed); `why` in words when not, for the pods that name one."""
        with self._lock:
            self.gangs.groups_missing = "" if served else (why or "the PodGroup CRD is not installed")

    def mark_synced(self) -> None:
        with self._lock:
            first, self.synced = not self.synced, True
            if first:  # every pod is counted now: the unhealthy GPUs' holders can be named truly
                self.nodes.warn_unhealthy("at start-up: ")

    # --- kube-scheduler's verbs ---------------------------------------------------------------
    #
    # The verbs judge the pod in the request and remember nothing of it: only the watch adds pods
    # (a client that reaches the port could otherwise invent pods, bind them, or teach the
    # workload learner its own mix). Bind acts only for a pod the watch knows, by UID and name.

    def filter(self, info: PodInfo, node_names: Iterable[str]) -> FilterOutcome:
        with self._lock:
            self._ready()
            self._retry_drops_hold(info)
            names = list(node_names)
            steered: dict[str, str] = {}  # a moved trainer's replacement: only where its move planned (moves.py)
            offered = self.moves.steer(info, names, steered) if self.moves.dests and info.replaces else names
            gang = self.judge.gang_outcome(self.gangs.filter(info, offered), offered)
            if gang is not None:  # its offer is kept by its gang (nothing is preempted or moved for a gang member)
                return FilterOutcome(gang.passed, {**gang.failed, **steered}, gang.unresolvable)
            outcome = self.judge.held_off(info, self.judge.backfill(info, self.judge.judge(info, names), reserve=True))
            if self.moves.dests and info.replaces:  # a moved trainer's replacement goes where its move planned
                outcome = FilterOutcome(self.moves.steer(info, outcome.passed, outcome.failed), outcome.failed,
                                        outcome.unresolvable)
            self.judge.note_offer(info, names, outcome)
            return outcome

    def gpu_view(self, info: PodInfo) -> FilterOutcome | None:
        """filter's verdict on every cached node, changing nothing (no hold dropped); None until synced.

        For a pod kube-scheduler's own checks refused before it asked Tessera (kube/waiting.py).
        """
        with self._lock:
            if not self.synced:
                return None
            names = sorted(self.cluster.by_name)
            gang = self.judge.gang_outcome(self.gangs.view(info), names)
            if gang is not None:
                return gang
            return self.judge.held_off(info, self.judge.backfill(info, self.judge.judge(info, names), reserve=False))

    def preempt(self, info: PodInfo, victims: dict[str, list[str]]) -> dict[str, list[str]]:
        """Per candidate node, kube-scheduler's victims plus the fewest lower-priority pods that make GPU room.

        Only the best-ranked nodes are kept (preemption.py: kube-scheduler's own order), and a node
        where no lower-priority pods help is vetoed. A gang member preempts nothing: kube-scheduler
        preempts for one pod at a time, so evicting for one member could not promise room for the
        whole gang, and pods would die for a gang that still waits. With `verb_preempts` off every
        node is vetoed: Tessera preempts itself (kube/preemptor.py) or not at all, never twice.
        """
        with self._lock:
            self._ready()
            keep = self.displacement.victims(info, self.judge.clearable(info, victims)) if self.verb_preempts else {}
            log.info("tessera: preemption for %s (priority %d): candidates %s, answered %s", info.key, info.priority,
                     {n: len(u) for n, u in victims.items()}, keep or "no node")
            return keep

    def preemption_plan(self, info: PodInfo, nodes: Iterable[str]) -> dict[str, list[str]]:
        """What preempt would answer were `nodes` offered with no victims, as pod names (the pending reason), changing nothing."""
        with self._lock:
            if not self.synced:
                return {}
            plan = self.displacement.victims(info, self.judge.clearable(info, dict.fromkeys(nodes, [])))
            return {n: [self.pods[u].key for u in uids if u in self.pods] for n, uids in plan.items()}

    # Preemption and moves as kube/preemptor.py plans them (displacement.py has the rules).

    @property
    def scheduler_names(self) -> frozenset[str]:  # the profiles Tessera serves: only their pods displace others
        return self.displacement.scheduler_names

    @scheduler_names.setter
    def scheduler_names(self, names: frozenset[str]) -> None:
        self.displacement.scheduler_names = frozenset(names)

    def displace_refusal(self, info: PodInfo) -> str:
        return self.displacement.refusal(info)

    def may_displace(self, info: PodInfo, preempt: bool = True) -> bool:
        with self._lock:
            return self.displacement.possible(info, preempt)

    def room_possible(self, info: PodInfo, preempt: bool = True) -> bool:
        with self._lock:
            return self.displacement.room_possible(info, preempt)

    def plan_preemption(self, info: PodInfo, protected: frozenset[str] = frozenset()) -> Nomination | None:
        with self._lock:
            return self.displacement.plan_preemption(info, protected)

    def plan_move(self, info: PodInfo) -> Nomination | None:
        with self._lock:
            return self.displacement.plan_move(info)

    def nominate(self, plan: Nomination) -> bool:
        with self._lock:
            return self.displacement.nominate(plan)

    def held_for_shorter_runs(self, info: PodInfo) -> str:
        with self._lock:
            return self.judge.held_for_shorter_runs(info)

    def drain_leases(self, ended: list | tuple = ()) -> list:
        """The drain leases lapsed with their pod still there, for the preemptor to end; given those it ended, records them."""
        with self._lock:
            for lease in ended:
                self.queue_reservations.lease_over(lease)
            return [] if ended else self.queue_reservations.lapsed()

    def drop_nomination(self, uid: str) -> None:
        """The preemption could not go ahead (a victim's deletion failed): its node is anyone's again."""
        with self._lock:
            self.nominations.drop(uid)

    def prioritize(self, info: PodInfo, node_names: Iterable[str]) -> Priorities:
        with self._lock:
            self._ready()
            self._retry_drops_hold(info)
            names = list(node_names)
            fitting, scores = self.placer.extender_scores(self.placer.request_for(info.request), names)
            if len(fitting) == len(names):
                return Priorities(names, scores)
            out = dict.fromkeys(names, 0)  # a node it no longer fits scores 0 (and a name sent twice is answered once)
            out.update(zip(fitting, scores, strict=True))
            return Priorities(list(out), list(out.values()))

    def reserve(self, uid: str, key: str, node_name: str) -> tuple[Assignment, tuple[str, ...]]:
        """Bind's select-and-commit: choose the GPUs on `node_name` and hold them for the pod.

        Only for a pod the watch knows under this UID and name, still pending, and only onto a
        node that passes this extender's own filter for it now (fit, GPU model, taints, its
        gang as the watch shows it). Idempotent: a pod that already holds GPUs on that node (a
        retried bind the watch has not confirmed yet) gets the same assignment back.
        """
        with self._lock:
            self._ready()
            info = self.pods.get(uid) or self.arrivals.await_pod(uid, self.pods)
            if info is None or info.key != key:
                # the same words whether the UID is unknown or belongs to another pod: no oracle
                raise BindError(f"tessera: pod {key} ({uid}) is unknown: no pod with that UID and name was seen "
                                "through the API watch, and tessera binds only those (one just created may not have "
                                "arrived yet: kube-scheduler will retry)")
            if info.phase in TERMINAL_PHASES:
                raise BindError(f"tessera: pod {key} has finished ({info.phase}); there is nothing to bind")
            if info.node:
                if info.node == node_name:  # Tessera bound it already (a gang member: kube/gang_binder.py)
                    raise AlreadyBound(f"tessera: pod {key} is already bound to {info.node}")
                raise BindError(f"tessera: pod {key} is already bound to {info.node}")
            held = self.cluster.assignments.get(key)
            if held is None and info.in_gang:  # its gang admitted now with it on this node, or running: else why not
                refusal = self.gangs.bind_refusal(info, node_name)
                if refusal:
                    raise BindError(refusal)
                held = self.cluster.assignments.get(key)
            if held is not None:
                if held.node != node_name:
                    raise BindError(f"tessera: pod {key} already holds GPUs on {held.node}, not {node_name}")
                if self.gangs.binding(uid):  # admission's hold: its lapse waits for this call (gangs.py tick)
                    self.holds.binding.add(uid)
                return held, self.gpu_uuids.get(node_name, ())
            assignment = self.judge.place(info, node_name)
            self.holds.hold(uid)
            self.nominations.drop(uid)
            return assignment, self.gpu_uuids.get(node_name, ())

    def bind_done(self, uid: str, ok: bool) -> None:
        """The bind's API call returned: keep the reservation for the watch to confirm, or give it back."""
        with self._lock:
            self.holds.binding.discard(uid)
            info = self.pods.get(uid)
            if not ok and uid in self.bind_holds and info is not None:
                self._release(uid, info.key)

    def expire_reservations(self) -> int:
        """Drop reservations the watch never confirmed (the pod vanished, the API call was lost); expire and make
        queue reservations (queue_reservations.py: pods kube-scheduler's own checks keep from filter reserve here)."""
        with self._lock:
            self.queue_reservations.tick()
            self.gangs.tick(self.holds.binding)
            stale = self.holds.expired()
            for uid in stale:
                info = self.pods.get(uid)
                if info is not None:
                    self._release(uid, info.key)
                self.holds.drop(uid)
            return len(stale)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                synced=self.synced,
                nodes=tuple((n.name, n.cpu_free, n.memory_free, tuple(n.gpu_free)) for n in self.cluster.nodes),
                assignments=frozenset((a.pod, a.node, a.gpus, a.milli) for a in self.cluster.assignments.values()),
                bind_holds=frozenset(self.bind_holds), binding=frozenset(self.holds.binding),
                rejected=frozenset(self.rejected.items()), forged=frozenset(self.forged.items()), pods=frozenset(self.pods),
                queue_reserved=frozenset((r.pod, r.node) for r in self.queue_reservations.backfill.by_pod.values()),
            )

    # --- internals ------------------------------------------------------------------------------

    def _ready(self) -> None:
        if not self.synced:
            raise NotReady("tessera: cluster cache not synced yet; kube-scheduler will retry")
        self.expire_reservations()
        for n in self.nominations.expire():
            log.info("tessera: nomination of %s on %s lapsed", n.key, n.node)
        self.moves.expire()

    def _retry_drops_hold(self, info: PodInfo) -> None:
        """A watched pod filtered again after a bind attempt: the scheduler is retrying, drop its hold.

        Only for the pod the watch knows under this UID and name, still pending there; the
        posted pod itself is never stored.
        """
        known = self.pods.get(info.uid)
        if known is None or known.key != info.key or known.node or info.node:
            return
        if self.holds.awaiting_watch(info.uid):
            self._release(info.uid, known.key)

    def _observe(self, info: PodInfo) -> None:
        """A pod the watch delivers for the first time teaches the workload (learning.py); verbs never do."""
        if info.uid in self.pods:
            return
        relearned = self.learning.observe(info.request, self.policy.ctx.workload, info.key.partition("/")[0])
        if relearned is not None:
            self._use(relearned)

    def _release(self, uid: str, key: str) -> None:
        self.adoption.release(uid, key)

    def gang_status(self, info: PodInfo) -> tuple[int, int, int, str]:
        """(members placed, members seen, members required, why it waits or '') for a gang member (/inspect)."""
        with self._lock:
            return self.gangs.status(info)

    def gang_round(self) -> list[tuple[str, str, str]]:
        """One round of the gang binder (kube/gang_binder.py): gangs tried again off the request path, then the
        (uid, namespace/name, node) of each admitted member Tessera binds itself now."""
        with self._lock:
            if not self.synced:
                return []
            self.gangs.retry()
            return self.gangs.to_bind(self.holds.binding)
