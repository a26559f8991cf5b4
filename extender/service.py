"""The extender's state and decisions: one object, one lock, no HTTP and no API calls.

`Extender` is what kube-scheduler's verbs and the Kubernetes watch talk to. The HTTP app
(`extender.http`) parses requests into plain data and calls it; the watch (`extender.kube.cache`)
feeds it nodes and pods; the binder (`extender.kube.binder`) writes what it decided.

Each job other than placement is a small object the Extender holds and delegates to, all under
its one lock: `nodes.NodeTable` (GPU UUIDs, health, taints), `adoption.Adoption` (what bound pods
hold, whoever bound them), `forgery.ForgeryLedger` (assignments whose MAC did not verify),
`learning.WorkloadLearning` (the policy follows the watched mix), `reservations.Reservations`
(bind's holds until the watch confirms them).

Concurrency: kube-scheduler filters one pod at a time but binds in parallel goroutines, so
bind's select-and-commit runs under the lock and records a *reservation* (keyed by pod UID, with
a TTL) before the API call; the watch confirms it when the pod shows up bound with Tessera's
annotation. Two overlapping binds therefore always see each other's slices.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import filterfalse

from tessera_contract import TERMINAL_PHASES  # the keyring (tessera_contract/keyring.py) as the service holds it
from tessera_contract import MacSigner as AssignmentSigner

from . import preemption
from .adoption import Adoption
from .core.backfill import BackfillSettings
from .core.cluster import Cluster, NodeState
from .core.model import Assignment
from .core.openb_stats import default_workload
from .core.placer import Placer
from .core.policy import Policy
from .core.short_first import ShortFirstSettings
from .core.workload import Workload
from .forgery import ForgeryLedger
from .gang_drains import GangDrains
from .gangs import Gangs, key_of
from .learning import WorkloadLearning
from .moves import Moves
from .nodes import NodeTable
from .nominations import Nomination, Nominations
from .offers import Offers
from .queue_reservations import QueueReservations
from .reservations import DEFAULT_RESERVATION_TTL_S, Reservations
from .short_first import ShortFirstQueue
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
NOT_CACHED = "tessera: node not in its cache (no GPU inventory yet)"
# A bind can arrive before the watch delivers its pod (kube-scheduler's informer was faster; the
# e2e stream saw it for 5 pods of 200): the bind waits up to WATCH_WAIT_S for it rather than
# failing the pod into a backoff. At most MAX_WATCH_WAITS such binds wait at once, so binds for
# pods that do not exist cannot hold more than that many serving threads; others are refused.
WATCH_WAIT_S = 1.0
MAX_WATCH_WAITS = 4
DEFAULT_SCHEDULER = "default-scheduler"  # the profile of manifests/scheduler/*.yaml, and a pod's schedulerName unset
# Nodes the cheap check before a move plan weighs (one trial fit each): past this many, a move is assumed possible and
# the plan itself (bounded: core/defrag.py) decides.
ROOM_CHECK_NODES = 4 * preemption.PLAN_NODES


# What kube-scheduler's reasons say that Tessera weighs itself, node by node: shortages, the node selector and required
# node affinity (NodeTerms) and taints (filter's own check). Any other reason (a cordoned node, host ports, ...) rules
# out nodes Tessera cannot tell apart from the rest, so then no node is a candidate.
READ_REFUSALS = ("Insufficient ", "Too many pods", "tessera:", "didn't match node selector",
                 "didn't match Pod's node affinity", "had taint", "had untolerated taint", "that the pod didn't tolerate")


def short_of_room(kube_refusal: str) -> bool:
    """Whether kube-scheduler's Unschedulable message ('0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1
    node(s) didn't match node selector.') names a reason that evicting or moving pods could cure, and no reason that
    Tessera cannot place on a node (a cordoned node's '1 node(s) were unschedulable': evicting there helps nobody)."""
    reasons = refusal_reasons(kube_refusal)
    return any(r.split(" ", 1)[-1].startswith(("Insufficient ", "Too many pods", "tessera:")) for r in reasons) \
        and all(any(read in r for read in READ_REFUSALS) for r in reasons)


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]  # could fit if something left (preemption may help)
    unresolvable: dict[str, str]  # cannot fit even on the empty node


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a request could change, as immutable values: compare two to prove nothing moved.

    `placement` is what decides who gets which GPU (free capacity, assignments, reservations);
    `pods` is the set of pods the extender has heard of: only the watch adds one, never a verb.
    """

    synced: bool
    nodes: tuple[tuple[str, int, int, tuple[int, ...]], ...]  # name, cpu free, memory free, milli free per GPU
    assignments: frozenset[tuple[str, str, tuple[int, ...], int]]  # pod, node, gpus, milli
    reservations: frozenset[str]
    binding: frozenset[str]
    rejected: frozenset[tuple[str, str]]
    forged: frozenset[tuple[str, str]]
    pods: frozenset[str]
    queue_reserved: frozenset[tuple[str, str]] = frozenset()  # (pod, node): reservations with backfill

    @property
    def placement(self) -> tuple:
        return (self.synced, self.nodes, self.assignments, self.reservations, self.binding, self.rejected, self.forged,
                self.queue_reserved)




class Extender:
    def __init__(
        self,
        policy: str = "tessera",
        workload: Workload | None = None,
        reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        signer: AssignmentSigner | None = None,
        watch_wait_s: float = WATCH_WAIT_S,
        prior: Workload | None = None,
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
        self.holds = Reservations(reservation_ttl_s, clock)  # GPUs bind took before the watch confirms (reservations.py)
        self.nominations = Nominations(clock=clock)  # nodes being cleared for preemptors (nominations.py)
        self.verb_preempts = True  # the preempt verb answers victims; serve.py turns it off unless kube-scheduler deletes them
        # the kube-scheduler profiles Tessera serves (tessera serve --scheduler-name): pods are evicted or moved only for
        # a pod of one of them (displace_refusal)
        self.scheduler_names: frozenset[str] = frozenset({DEFAULT_SCHEDULER})
        self.signer = signer  # with a key, only assignments Tessera signed count (kube/contract.py)
        self.forgery = ForgeryLedger()  # pods whose assignment annotation was set aside (forgery.py)
        self.synced = False
        self.offers = Offers(self.cluster)  # where kube-scheduler let pods be tried (offers.py)
        self._seen = threading.Condition(self._lock)  # notified whenever the watch delivers a pod
        self.watch_wait_s = watch_wait_s
        self._watch_slots = threading.BoundedSemaphore(MAX_WATCH_WAITS)
        self.watch_health = WatchHealth()  # objects the watch skipped, and whether it keeps up (watch_health.py)
        self.adoption = Adoption(self.cluster, self.pods, self.holds)  # what bound pods hold (adoption.py)
        self.policy = self.learning.policy_for(workload or prior or default_workload())
        self.placer = Placer(self.cluster, self.policy)  # the placement cycle the simulator runs too
        # reservations with backfill (queue_reservations.py; off without settings): not bind's `holds`
        self.queue_reservations = QueueReservations(self.cluster, self.placer, self._blocked, backfill, wall_clock,
                                                    claimed=lambda: self.gangs.drained_nodes())
        self.moves = Moves(self.cluster, self.placer, self.pods, clock)  # trainers moved to make room (moves.py); off by default
        # shortest runs first (short_first.py; off without settings): long GPU pods wait while many short ones do
        self.short_first = ShortFirstQueue(self.cluster, self.placer, self._constraints_admit, short_first, wall_clock)
        # gangs: admitted whole when all their members exist and fit, GPUs held until bound (gangs.py)
        drains = GangDrains(self.cluster, self.placer, backfill, self.queue_reservations.expected_end,
                            self.queue_reservations.held_milli, wall_clock)
        self.gangs = Gangs(self.cluster, self.placer, self.pods, self.offers, self._release, self._blocked,
                           self._closed_nodes, clock, drains)

    # The state the modules above own, under the names the verbs, /inspect and /metrics read.

    @property
    def reservations(self) -> dict[str, float]:  # uid -> expiry of the GPUs its bind holds
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
                self._seen.notify_all()
            self.forgery.note(info)
            self.adoption.watched(info)
            self.gangs.watched(info, old)
            if info.node:
                self.nominations.drop(info.uid)
                self.moves.bound(info)
            self.queue_reservations.watched(info)
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
            gang = self._gang_outcome(self.gangs.filter(info, offered), offered)
            if gang is not None:  # its offer is kept by its gang (nothing is preempted or moved for a gang member)
                return FilterOutcome(gang.passed, {**gang.failed, **steered}, gang.unresolvable)
            outcome = self._held_off(info, self._backfill(info, self._judge(info, names), reserve=True))
            if self.moves.dests and info.replaces:  # a moved trainer's replacement goes where its move planned
                outcome = FilterOutcome(self.moves.steer(info, outcome.passed, outcome.failed), outcome.failed,
                                        outcome.unresolvable)
            self._note_offer(info, names, outcome)
            return outcome

    def _gang_outcome(self, verdict, names: list[str]) -> FilterOutcome | None:
        """A gang member's verdict (gangs.py) as filter's answer; None when it is judged as any pod."""
        if verdict is None or verdict.individual:
            return None
        if verdict.passed:
            held = f"tessera: held for this pod on {verdict.passed}, where its gang was admitted"
            return FilterOutcome([n for n in names if n == verdict.passed],
                                 {n: held for n in names if n != verdict.passed}, {})
        if verdict.never:
            return FilterOutcome([], {}, dict.fromkeys(names, verdict.words))
        return FilterOutcome([], dict.fromkeys(names, verdict.words), {})

    def _note_offer(self, info: PodInfo, names: list[str], outcome: FilterOutcome) -> None:
        """Remember where kube-scheduler let a watched pending pod be tried, when it fits none of it (offers.py)."""
        known = self.pods.get(info.uid)  # a filter may come before the watch delivers the pod: kept under its key
        if (known is not None and (known.key != info.key or known.node)) or info.node:
            return
        if outcome.passed:
            self.offers.forget(info.uid)
            return
        self.offers.note(info.uid, info.key, names)

    def _offered_nodes(self, info: PodInfo, failed: Iterable[str]) -> list[str]:
        """The nodes of `failed` kube-scheduler offered the pod at its last filter. When it offered none (its own checks
        refused every node first), those its node selector and required affinity admit if one of kube's reasons is a
        shortage room could cure (a whole-GPU pod's `Insufficient nvidia.com/gpu`), none if every reason is a
        constraint (node selector, affinity, taints)."""
        offered = self.offers.offered(info.uid, info.key, failed)
        if offered is None:
            if not short_of_room(info.kube_refusal):
                return []
            terms = info.node_terms  # kube's message names no node: its node selector and affinity, read here, do;
            # terms too many or too odd to read admit no node (read as "every node", 65 padded values had other
            # tenants' pods evicted on nodes the pod could never use)
            return [n for n in failed if terms is not None and terms.admits(n, self.nodes.labels.get(n, {}))]
        return offered

    def gpu_view(self, info: PodInfo) -> FilterOutcome | None:
        """filter's verdict on every cached node, changing nothing (no hold dropped); None until synced.

        For a pod kube-scheduler's own checks refused before it asked Tessera (kube/waiting.py).
        """
        with self._lock:
            if not self.synced:
                return None
            names = sorted(self.cluster.by_name)
            gang = self._gang_outcome(self.gangs.view(info), names)
            if gang is not None:
                return gang
            return self._held_off(info, self._backfill(info, self._judge(info, names), reserve=False))

    def held_for_shorter_runs(self, info: PodInfo) -> str:
        """Why the pod waits behind shorter runs (short_first.py), "" if it does not. Not held: a pod reservations look
        after, and one a preemption already cleared room for (its victims are gone: the room is its own)."""
        with self._lock:
            exempt = info.uid in self.nominations.by_uid or self.queue_reservations.on and \
                self.queue_reservations.backfill.settings.reserving(self.placer.request_for(info.request))
            return self.short_first.hold(info, self.pods.get(info.uid), exempt)

    def _held_off(self, info: PodInfo, outcome: FilterOutcome) -> FilterOutcome:
        """`outcome` less, for a pod shortest-runs-first holds, the passed nodes where a short pod waiting fits now
        (short_first.py): refused as unresolvable in the rule's words. Unchanged for a pod the rule does not hold.
        Only the passed nodes are read: the others refuse the pod anyway. Hold the lock."""
        held = self.held_for_shorter_runs(info) if outcome.passed else ""
        if not held:
            return outcome
        taken = self.short_first.contested(self.pods[info.uid].priority, outcome.passed)
        if not taken:
            return outcome
        return FilterOutcome([n for n in outcome.passed if n not in taken], outcome.failed,
                             {**outcome.unresolvable, **dict.fromkeys(taken, held)})

    def _clearable(self, info: PodInfo, nodes: dict[str, list]) -> dict[str, list]:
        """`nodes` (name -> anything) less, for a pod shortest-runs-first holds, those a counted short pod could use were
        they empty: pods are evicted for a held pod only where no shorter run could have the room instead (the
        nominee is then not held: the room would be its own). Unchanged for a pod the rule does not hold."""
        if not nodes or not self.held_for_shorter_runs(info):
            return nodes
        by_name = self.cluster.by_name
        empty = [NodeState(by_name[n].spec, -1) for n in nodes if n in by_name]
        taken = set(self.short_first.contested(self.pods[info.uid].priority, [n.name for n in empty], empty))
        return {n: v for n, v in nodes.items() if n in by_name and n not in taken}

    def _backfill(self, info: PodInfo, outcome: FilterOutcome, reserve: bool) -> FilterOutcome:
        """Reserved nodes refuse pods that would delay their reservation; with `reserve`, a watched pod past its
        class's wait bound that passes no node reserves one (queue_reservations.py). Unresolvable: evicting pods
        there would not let this one in, so kube-scheduler must not preempt for it. Hold the lock."""
        passed, refused = self.queue_reservations.narrow(info, self.pods.get(info.uid), outcome.passed, reserve)
        drained = self.gangs.drains.closed(key_of(info), info.priority) if self.gangs.drains.by_gang else {}
        refused.update((n, drained[n]) for n in passed if n in drained)  # nodes draining for a gang that waited long
        passed = [n for n in passed if n not in refused]
        return FilterOutcome(passed, outcome.failed, {**outcome.unresolvable, **refused}) if refused else outcome

    def _judge(self, info: PodInfo, names: list[str]) -> FilterOutcome:
        """Which of `names` the pod fits, and why not the others (hold the lock)."""
        blocked = self._blocked(info.tolerations)
        request = self.placer.request_for(info.request)
        passed, rest = self.placer.split(request, names)  # C-level passes: this runs over every node per pod
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for group, reason in blocked:  # tainted nodes the pod does not tolerate: usually none
            hit = list(filter(group.__contains__, passed))
            if hit:
                passed = list(filterfalse(group.__contains__, passed))
                unresolvable.update(dict.fromkeys(hit, reason))
        if self.nominations.by_uid:  # nodes being cleared for a preemptor: usually none
            kept = self._nominee_refusals(info, request, passed)
            if kept:
                passed = [n for n in passed if n not in kept]
                failed.update(kept)
        if rest:
            unfit = self.placer.view(request).unfit
            for name in rest:  # usually a few: not a Python loop over all 5000 names
                reason = unfit.get(name)
                if reason is None:
                    failed[name] = NOT_CACHED
                else:
                    (unresolvable if self.placer.never_fits(request, name) else failed)[name] = reason
        if not passed and request.gpu_models:
            unresolvable = self._models_nowhere(request.gpu_models, unresolvable)
        return FilterOutcome(passed, failed, unresolvable)

    def _models_nowhere(self, models: frozenset[str], unresolvable: dict[str, str]) -> dict[str, str]:
        """A model no node has, said as such with the models there are: "GPU model T4 not in A100" on every node
        left a newcomer to guess that the cluster's A100s are labelled NVIDIA-A100-SXM4-80GB (hold the lock)."""
        have = {n.spec.gpu_model for n in self.cluster.nodes if n.spec.gpu_count}
        if models & have:
            return unresolvable
        words = (f"tessera: no node has GPU model {'|'.join(sorted(models)[:4])}{' (and more)' if len(models) > 4 else ''}; "
                 f"the cluster's models: {', '.join(sorted(have)[:8]) or 'none'}")
        return {n: words if "GPU model " in r else r for n, r in unresolvable.items()}

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
            keep = self._victims(info, self._clearable(info, victims)) if self.verb_preempts else {}
            log.info("tessera: preemption for %s (priority %d): candidates %s, answered %s", info.key, info.priority,
                     {n: len(u) for n, u in victims.items()}, keep or "no node")
            return keep

    def preemption_plan(self, info: PodInfo, nodes: Iterable[str]) -> dict[str, list[str]]:
        """What preempt would answer were `nodes` offered with no victims, as pod names (the pending reason), changing nothing."""
        with self._lock:
            if not self.synced:
                return {}
            plan = self._victims(info, self._clearable(info, dict.fromkeys(nodes, [])))
            return {n: [self.pods[u].key for u in uids if u in self.pods] for n, uids in plan.items()}

    def displace_refusal(self, info: PodInfo) -> str:
        """Why no pod may be evicted or moved for `info`, in words; '' when Kubernetes' rules allow it. A gang member
        (room for one member promises the gang nothing); a pod whose preemptionPolicy is Never (its PriorityClass lets
        it jump the queue, never evict: kube-scheduler's PodEligibleToPreemptOthers); a pod of a schedulerName Tessera
        does not serve (another scheduler places it, or none does: a tenant naming one evicts nobody)."""
        if info.in_gang:
            return "a gang member (room for one member promises the gang nothing)"
        if not info.preempts:
            return "its preemptionPolicy is Never"
        if info.scheduler_name not in self.scheduler_names:
            return f"its schedulerName {info.scheduler_name[:63]!r} is not one Tessera serves"
        return ""

    def may_displace(self, info: PodInfo, preempt: bool = True) -> bool:
        """Whether any bound pod could make room for `info`: one of lower priority (with `preempt`), or a movable
        trainer of no higher priority (moves on), and no rule forbids it (`displace_refusal`). One pass over the pods,
        no placement: the preemptor asks it before a plan spends its budget."""
        if self.displace_refusal(info):
            return False
        with self._lock:
            return any(p.node and not p.terminating and ((preempt and p.priority < info.priority)
                                                         or (self.moves.on and p.movable and p.priority <= info.priority))
                       for p in self.pods.values())

    def room_possible(self, info: PodInfo, preempt: bool = True) -> bool:
        """The cheap check before a plan: whether the pod would fit one of the nodes a plan weighs once every pod the
        plan may take there is gone (lower priority with `preempt`, movable trainers of no higher priority with moves
        on). One trial fit per node, on the nodes a preemption plan weighs (so a pod that fails it is one that plan
        could not help) and up to ROOM_CHECK_NODES move targets (past that a move is taken as possible)."""
        with self._lock:
            failed = self._plannable(info)
            if not failed:
                return False
            nodes = dict.fromkeys(self._preemption_candidates(info, failed) if preempt else [], preempt)
            if self.moves.on and not self.held_for_shorter_runs(info):
                targets = [n for n in failed if not self.queue_reservations.closed_to(info, n)]
                if len(targets) > ROOM_CHECK_NODES:
                    return True
                nodes.update((n, nodes.get(n, False)) for n in targets)
            request = self.placer.request_for(info.request)
            bound = {i.key: i for i in self.pods.values() if i.node in nodes and not i.terminating}
            return any(self._fits_emptied(info, request, n, lower, bound) for n, lower in nodes.items())

    def _fits_emptied(self, info: PodInfo, request, name: str, lower: bool, bound: dict[str, PodInfo]) -> bool:
        """Whether `request` fits node `name` with every pod a plan may take there gone (`bound`: the pods there by
        key): lower-priority ones with `lower`, movable trainers of no higher priority with moves on (hold the lock)."""
        node = self.cluster.by_name.get(name)
        if node is None:
            return False
        gone = frozenset(key for key in node.pods if (i := bound.get(key)) is not None and i.node == name
                         and ((lower and i.priority < info.priority)
                              or (self.moves.on and i.movable and i.priority <= info.priority)))
        return bool(gone) and preemption.fits_without(self.placer, request, node)(gone)

    def _plannable(self, info: PodInfo) -> list[str]:
        """The nodes a plan for the pod may clear: those it fails on for want of room that kube-scheduler offered it;
        [] when it fits somewhere now, or no plan is allowed (a rule, a nomination, victims still leaving). Hold the lock."""
        if not self.synced or self.displace_refusal(info) or info.uid in self.nominations.by_uid \
                or self._victims_leaving(info):
            return []
        outcome = self._judge(info, sorted(self.cluster.by_name))
        return [] if outcome.passed else self._offered_nodes(info, outcome.failed)

    def _preemption_candidates(self, info: PodInfo, failed: list[str]) -> list[str]:
        """Of `failed`, the nodes a preemption plan weighs: clearable, not closed to the pod, with lower-priority pods,
        the PLAN_NODES holding the most such GPU milli first (hold the lock)."""
        offered = self._clearable(info, dict.fromkeys(failed))
        closed = self._closed_nodes(info)  # once: per node it had cost 50 ms over 5,000 nodes
        lower = self._lower_priority_milli(info.priority, [n for n in offered if n not in closed])
        return sorted(lower, key=lambda n: (-lower[n], n))[:preemption.PLAN_NODES]

    def plan_preemption(self, info: PodInfo, protected: frozenset[str] = frozenset()) -> Nomination | None:
        """The node and victims Tessera itself would preempt for the pod now, changing nothing; None if none helps.

        For kube-scheduler 1.20.2, which never calls the preempt verb (kube/preemptor.py acts on this).
        Candidates are the nodes the pod fails on for want of room, with lower-priority pods on them,
        the PLAN_NODES holding the most such GPU milli first; `protected` names pods (namespace/name)
        a disruption budget keeps, taken only when nothing else helps.
        """
        with self._lock:
            failed = self._plannable(info)
            if not failed:
                return None
            candidates = self._preemption_candidates(info, failed)
            plan = self._victims(info, dict.fromkeys(candidates, []), protected)
            if not plan:
                return None
            node = min(plan)
            victims = {u: self.pods[u].key for u in plan[node]}
            return Nomination(info.uid, info.key, info.priority, node, self.placer.request_for(info.request), victims,
                              self.nominations.clock())

    def plan_move(self, info: PodInfo) -> Nomination | None:
        """The movable trainers Tessera would move so the pod fits, and where each goes, changing nothing; None if none.

        Only with moves on, for a pod that passes no node; the target is one of the nodes it fails on for want of room
        (not one its taints, model or a reservation close to it), and each trainer lands only where it is tolerated and
        on no node reservations or the drain pool restrict (where its replacement could be refused).
        """
        with self._lock:
            if not self.moves.on or not self.synced or self.displace_refusal(info) or info.uid in self.nominations.by_uid \
                    or self.held_for_shorter_runs(info):
                return None
            outcome = self._judge(info, sorted(self.cluster.by_name))
            if outcome.passed:
                return None
            targets = [n for n in self._offered_nodes(info, outcome.failed) if not self.queue_reservations.closed_to(info, n)]
            restricted = self.queue_reservations.restricted_nodes()
            return self.moves.plan(info, targets, self.nominations.by_uid.values(),
                                   lambda pod: restricted.union(*(group for group, _ in self._blocked(pod.tolerations))))

    def nominate(self, plan: Nomination) -> bool:
        """Record `plan` if it still holds (victims bound there, the pod fits without them): the caller then deletes them."""
        with self._lock:
            node = self.cluster.by_name.get(plan.node)
            if node is None or plan.uid in self.nominations.by_uid or plan.uid not in self.pods:
                return False
            if any((i := self.pods.get(u)) is None or i.node != plan.node for u in plan.victims):
                return False
            if not preemption.fits_without(self.placer, plan.request, node)(plan.victim_keys):
                return False
            self.nominations.add(plan)
            if plan.moves:
                self.moves.record(plan)
            return True

    def drop_nomination(self, uid: str) -> None:
        """The preemption could not go ahead (a victim's deletion failed): its node is anyone's again."""
        with self._lock:
            self.nominations.drop(uid)

    def _victims_leaving(self, info: PodInfo) -> bool:
        """kube-scheduler already preempted for this pod (whole GPUs it counts itself): lower-priority pods on
        the node it nominated are terminating. Preempting again would take a second set (its own rule, too)."""
        node = self.cluster.by_name.get(info.nominated_node) if info.nominated_node else None
        if node is None:
            return False
        return any(i.terminating and i.priority < info.priority for i in self.pods.values() if i.node == node.spec.name)

    def _lower_priority_milli(self, priority: int, names: Iterable[str]) -> dict[str, int]:
        """Per node of `names`, the GPU milli (+1 per pod, so CPU-only victims count) its lower-priority pods hold."""
        wanted = set(names)
        out: dict[str, int] = {}
        for i in self.pods.values():  # one pass: the pods' own nodes, not a walk of every wanted node's pods
            if i.node in wanted and i.priority < priority and not i.terminating:
                node = self.cluster.by_name.get(i.node)
                a = node.pods.get(i.key) if node is not None else None
                if a is not None:
                    out[i.node] = out.get(i.node, 0) + a.milli * len(a.gpus) + 1
        return out

    def _nominee_refusals(self, info: PodInfo, request, passed: list[str]) -> dict[str, str]:
        """Nodes of `passed` being cleared for a preemptor of equal or higher priority that this pod would crowd out."""
        out: dict[str, str] = {}
        nodes = {n.node for n in self.nominations.by_uid.values()}
        for name in nodes.intersection(passed):
            node = self.cluster.by_name[name]
            for n in self.nominations.on(name, info.uid, info.priority):
                if not preemption.beside_nominee(self.placer, request, node, n.request, n.victim_keys):
                    how = "Tessera moves trainers off it to make room" if n.moves else "which preempted pods there"
                    out[name] = f"tessera: node is being cleared for {n.key} (priority {n.priority}), {how}"
                    break
        return out

    def _victims(self, info: PodInfo, victims: dict[str, list[str]],
                 protected: frozenset[str] = frozenset()) -> dict[str, list[str]]:
        """preempt's choice, by UID (hold the lock): none for a pod `displace_refusal` names a rule against."""
        if self.displace_refusal(info):
            return {}
        request = self.placer.request_for(info.request)
        bound = {i.key: i for i in self.pods.values() if i.node in victims and i.phase not in TERMINAL_PHASES}
        ranked: dict[str, tuple[tuple, list[str]]] = {}
        for name, uids in victims.items():
            node = self.cluster.by_name.get(name)
            if node is None or self._taint_refusal(info.tolerations, name):
                continue
            # once each, and none the watch shows on another node: kube-scheduler sends neither, a forged body may
            uids = [u for u in dict.fromkeys(uids) if (i := self.pods.get(u)) is None or i.node == name]
            given = [preemption.Victim(u, i.key, i.priority) if (i := self.pods.get(u)) else preemption.Victim(u, u, 0)
                     for u in uids]
            taken = {v.uid for v in given}
            pool = [preemption.Victim(i.uid, key, i.priority, key in protected) for key in node.pods
                    if (i := bound.get(key)) is not None and i.node == name and i.priority < info.priority
                    and i.uid not in taken and not i.terminating]
            extra = preemption.fewest_victims(preemption.fits_without(self.placer, request, node),
                                              frozenset(v.key for v in given), pool)
            if extra is not None:
                ranked[name] = (preemption.rank(given + list(extra)), uids + [v.uid for v in extra])
        best = min((r for r, _ in ranked.values()), default=None)
        return {name: chosen for name, (r, chosen) in ranked.items() if r == best}

    def prioritize(self, info: PodInfo, node_names: Iterable[str]) -> list[tuple[str, int]]:
        with self._lock:
            self._ready()
            self._retry_drops_hold(info)
            names = list(node_names)
            fitting, scores = self.placer.extender_scores(self.placer.request_for(info.request), names)
            if len(fitting) == len(names):
                return list(zip(names, scores, strict=True))
            out = dict.fromkeys(names, 0)
            out.update(zip(fitting, scores, strict=True))
            return list(out.items())

    def reserve(self, uid: str, key: str, node_name: str) -> tuple[Assignment, tuple[str, ...]]:
        """Bind's select-and-commit: choose the GPUs on `node_name` and hold them for the pod.

        Only for a pod the watch knows under this UID and name, still pending, and only onto a
        node that passes this extender's own filter for it now (fit, GPU model, taints, its
        gang as the watch shows it). Idempotent: a pod that already holds GPUs on that node (a
        retried bind the watch has not confirmed yet) gets the same assignment back.
        """
        with self._lock:
            self._ready()
            info = self.pods.get(uid) or self._await_watch(uid)
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
            assignment = self._choose_gpus(info, node_name)
            self.holds.hold(uid)
            self.nominations.drop(uid)
            return assignment, self.gpu_uuids.get(node_name, ())

    def _choose_gpus(self, info: PodInfo, node_name: str) -> Assignment:
        """Reserve's placement: the pod's GPUs on `node_name` as the placer picks them, committed (hold the lock)."""
        node = self.cluster.by_name.get(node_name)
        if node is None:
            raise BindError(f"tessera: node {node_name} is not in its cache")
        request = self.placer.request_for(info.request)
        verdict = self.placer.verdict(request, node)
        reason = self.placer.fits(request, node) if verdict is None else None
        reason = reason or self._taint_refusal(info.tolerations, node_name)
        if reason is not None:
            raise BindError(f"tessera: pod {info.key} no longer fits {node_name}: {reason}")
        assert verdict is not None  # it fits
        gpus = self.placer.gpus_for(request, node, verdict)
        if (refusal := self.queue_reservations.refusal(info, node, gpus)) is not None:  # another pod's reservation
            raise BindError(f"tessera: pod {info.key} may not take {node_name} now: {refusal.removeprefix('tessera: ')}")
        if (drained := self.gangs.drains.closed(key_of(info), info.priority).get(node_name)) is not None:
            raise BindError(f"tessera: pod {info.key} may not take {node_name} now: {drained.removeprefix('tessera: ')}")
        crowded = [n for n in self.nominations.on(node_name, info.uid, info.priority)
                   if preemption.fits_without(self.placer, n.request, node)(n.victim_keys)]
        assignment = self.cluster.place(request, node_name, gpus)
        for n in crowded:  # GPUs picked here must not be the ones a preemptor on this node waits for
            if not preemption.fits_without(self.placer, n.request, node)(n.victim_keys):
                self.cluster.release(assignment.pod)
                raise BindError(f"tessera: node {node_name} is being cleared for {n.key} (priority {n.priority}); "
                                f"{info.key} would take the room it waits for")
        return assignment

    def _await_watch(self, uid: str) -> PodInfo | None:
        """The pod with this UID once the watch delivers it, waiting up to `watch_wait_s` (lock released meanwhile)."""
        if self.watch_wait_s <= 0 or not self._watch_slots.acquire(blocking=False):
            return None
        try:
            deadline = time.monotonic() + self.watch_wait_s
            while (info := self.pods.get(uid)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._seen.wait(left)
            return info
        finally:
            self._watch_slots.release()

    def bind_done(self, uid: str, ok: bool) -> None:
        """The bind's API call returned: keep the reservation for the watch to confirm, or give it back."""
        with self._lock:
            self.holds.binding.discard(uid)
            info = self.pods.get(uid)
            if not ok and uid in self.reservations and info is not None:
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
                reservations=frozenset(self.reservations), binding=frozenset(self.holds.binding),
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

    def _closed_nodes(self, info: PodInfo) -> set[str]:
        """Nodes other pods' claims close to this one: reserved for a pod waiting past its bound, or being cleared
        for a preemptor of its priority or higher (gang admission steps around them)."""
        closed = {n for n in self.queue_reservations.restricted_nodes() if self.queue_reservations.closed_to(info, n)}
        closed |= set(self.gangs.drains.closed(key_of(info), info.priority))
        return closed | {n.node for n in self.nominations.by_uid.values() if n.priority >= info.priority and n.uid != info.uid}

    def _blocked(self, tolerations: Tolerations) -> list[tuple[set[str], str]]:
        """The tainted nodes this pod may not use, grouped by their taints, with the reason: O(distinct taint sets)."""
        out = []
        for taints, names in self.nodes.tainted.items():
            taint = tolerations.first_untolerated(taints)
            if taint is not None:
                out.append((names, f"tessera: node has taint {taint} that the pod does not tolerate"))
        return out

    def _constraints_admit(self, tolerations: Tolerations, terms: NodeTerms, node: str) -> bool:
        """Whether a pod of these tolerations and node terms may go to `node` by its taints and labels."""
        return terms.admits(node, self.nodes.labels.get(node, {})) \
            and tolerations.first_untolerated(self.nodes.taints.get(node, ())) is None

    def _taint_refusal(self, tolerations: Tolerations, node: str) -> str | None:
        taint = tolerations.first_untolerated(self.nodes.taints.get(node, ()))
        return None if taint is None else f"node has taint {taint} that the pod does not tolerate"

