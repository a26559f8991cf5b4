"""Filter's verdict on one pod: which nodes it fits now, and why not the others, in words.

The Extender asks this object, under its one lock, for every filter call, for the background judge
of pods kube-scheduler refused before asking (kube/waiting.py, `Extender.gpu_view`) and for the
nodes a preemption or move plan may clear (displacement.py). A verdict has three parts
(`FilterOutcome`): the nodes that pass, those that fail for want of room (evicting or moving pods
could cure it) and those that can never take the pod (its model, a taint, a reservation or drain
that keeps the node for another pod). Each rule beyond the Placer's fit is a small object this one
consults: the NodeTable's taints, the nominations of nodes being cleared for a preemptor,
reservations with backfill, a gang's drains, and shortest-runs-first.

No lock of its own: every method expects the extender's held.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import filterfalse

from . import preemption
from .core.cluster import Cluster, NodeState
from .core.model import Assignment
from .core.placer import Placer
from .gangs import Gangs, key_of
from .nodes import NodeTable
from .nominations import Nominations
from .offers import Offers
from .queue_reservations import QueueReservations
from .short_first_queue import ShortFirstQueue
from .state import BindError, PodInfo, refusal_reasons

NOT_CACHED = "tessera: node not in its cache (no GPU inventory yet)"

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
class Priorities:
    """prioritize's answer: each name asked about and its score, as two lists in the order asked.

    Kept apart, not as (name, score) pairs: the wire's HostPriority objects are built straight from
    the two (wire.host_priorities), where a list of 5,000 pairs in between cost 0.37 ms of 1.16 per
    call at 5,000 nodes. Iterating gives the pairs, so `dict(priorities)` reads as before.
    """

    names: list[str]
    scores: list[int]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return zip(self.names, self.scores, strict=True)


@dataclass(slots=True)
class Judge:
    """The rules of filter's verdict, over the Extender's state (the objects it holds; none owned here)."""

    cluster: Cluster
    placer: Placer
    nodes: NodeTable
    pods: dict[str, PodInfo]
    offers: Offers
    nominations: Nominations
    queue_reservations: QueueReservations
    short_first: ShortFirstQueue
    gangs: Gangs

    def judge(self, info: PodInfo, names: list[str]) -> FilterOutcome:
        """Which of `names` the pod fits, and why not the others."""
        blocked = self.nodes.blocked(info.tolerations)
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
            kept = self.nominee_refusals(info, request, passed)
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
            unresolvable = self.models_nowhere(request.gpu_models, unresolvable)
        return FilterOutcome(passed, failed, unresolvable)

    def models_nowhere(self, models: frozenset[str], unresolvable: dict[str, str]) -> dict[str, str]:
        """A model no node has, said as such with the models there are: "GPU model T4 not in A100" on every node
        left a newcomer to guess that the cluster's A100s are labelled NVIDIA-A100-SXM4-80GB."""
        have = {n.spec.gpu_model for n in self.cluster.nodes if n.spec.gpu_count}
        if models & have:
            return unresolvable
        words = (f"tessera: no node has GPU model {'|'.join(sorted(models)[:4])}{' (and more)' if len(models) > 4 else ''}; "
                 f"the cluster's models: {', '.join(sorted(have)[:8]) or 'none'}")
        return {n: words if "GPU model " in r else r for n, r in unresolvable.items()}

    def nominee_refusals(self, info: PodInfo, request, passed: list[str]) -> dict[str, str]:
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

    def backfill(self, info: PodInfo, outcome: FilterOutcome, reserve: bool) -> FilterOutcome:
        """Reserved nodes refuse pods that would delay their reservation; with `reserve`, a watched pod past its
        class's wait bound that passes no node reserves one (queue_reservations.py). Unresolvable: evicting pods
        there would not let this one in, so kube-scheduler must not preempt for it."""
        passed, refused = self.queue_reservations.narrow(info, self.pods.get(info.uid), outcome.passed, reserve)
        drained = self.gangs.drains.closed(key_of(info), info.priority) if self.gangs.drains.by_gang else {}
        if drained:  # nodes draining for a gang that waited long; usually none, and then no pass over 5,000 names
            refused.update((n, drained[n]) for n in passed if n in drained)
        if not refused:
            return outcome
        passed = [n for n in passed if n not in refused]
        return FilterOutcome(passed, outcome.failed, {**outcome.unresolvable, **refused})

    def held_for_shorter_runs(self, info: PodInfo) -> str:
        """Why the pod waits behind shorter runs (short_first_queue.py), "" if it does not. Not held: a pod reservations look
        after, and one a preemption already cleared room for (its victims are gone: the room is its own)."""
        exempt = info.uid in self.nominations.by_uid or self.queue_reservations.on and \
            self.queue_reservations.backfill.settings.reserving(self.placer.request_for(info.request))
        return self.short_first.hold(info, self.pods.get(info.uid), exempt)

    def held_off(self, info: PodInfo, outcome: FilterOutcome) -> FilterOutcome:
        """`outcome` less, for a pod shortest-runs-first holds, the passed nodes where a short pod waiting fits now
        (short_first_queue.py): refused as unresolvable in the rule's words. Unchanged for a pod the rule does not hold.
        Only the passed nodes are read: the others refuse the pod anyway."""
        held = self.held_for_shorter_runs(info) if outcome.passed else ""
        if not held:
            return outcome
        taken = self.short_first.contested(self.pods[info.uid].priority, outcome.passed)
        if not taken:
            return outcome
        return FilterOutcome([n for n in outcome.passed if n not in taken], outcome.failed,
                             {**outcome.unresolvable, **dict.fromkeys(taken, held)})

    def clearable(self, info: PodInfo, nodes: dict[str, list]) -> dict[str, list]:
        """`nodes` (name -> anything) less, for a pod shortest-runs-first holds, those a counted short pod could use were
        they empty: pods are evicted for a held pod only where no shorter run could have the room instead (the
        nominee is then not held: the room would be its own). Unchanged for a pod the rule does not hold."""
        if not nodes or not self.held_for_shorter_runs(info):
            return nodes
        by_name = self.cluster.by_name
        empty = [NodeState(by_name[n].spec, -1) for n in nodes if n in by_name]
        taken = set(self.short_first.contested(self.pods[info.uid].priority, [n.name for n in empty], empty))
        return {n: v for n, v in nodes.items() if n in by_name and n not in taken}

    def offered_nodes(self, info: PodInfo, failed: Iterable[str]) -> list[str]:
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

    def gang_outcome(self, verdict, names: list[str]) -> FilterOutcome | None:
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

    def note_offer(self, info: PodInfo, names: list[str], outcome: FilterOutcome) -> None:
        """Remember where kube-scheduler let a watched pending pod be tried, when it fits none of it (offers.py)."""
        known = self.pods.get(info.uid)  # a filter may come before the watch delivers the pod: kept under its key
        if (known is not None and (known.key != info.key or known.node)) or info.node:
            return
        if outcome.passed:
            self.offers.forget(info.uid)
            return
        self.offers.note(info.uid, info.key, names)

    def closed_nodes(self, info: PodInfo) -> set[str]:
        """Nodes other pods' claims close to this one: reserved for a pod waiting past its bound, or being cleared
        for a preemptor of its priority or higher (gang admission steps around them)."""
        closed = {n for n in self.queue_reservations.restricted_nodes() if self.queue_reservations.closed_to(info, n)}
        closed |= set(self.gangs.drains.closed(key_of(info), info.priority))
        return closed | {n.node for n in self.nominations.by_uid.values() if n.priority >= info.priority and n.uid != info.uid}

    def place(self, info: PodInfo, node_name: str) -> Assignment:
        """Bind's placement (`Extender.reserve`): filter's rules once more for the one node, then the pod's GPUs there as
        the placer picks them, committed; BindError in words when the node no longer takes the pod."""
        node = self.cluster.by_name.get(node_name)
        if node is None:
            raise BindError(f"tessera: node {node_name} is not in its cache")
        request = self.placer.request_for(info.request)
        verdict = self.placer.verdict(request, node)
        reason = self.placer.fits(request, node) if verdict is None else None
        reason = reason or self.nodes.taint_refusal(info.tolerations, node_name)
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
