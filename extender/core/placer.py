"""One placement cycle: where a pod fits, how the policy scores those nodes, which GPUs it gets.

The server's verbs (filter, prioritize, reserve, preempt, the GPU view), its gang admission and
the simulator's two schedulers all place through a `Placer`, so `tessera simulate` speaks for
the server: they cannot disagree about a pod any more (tests/test_differential.py replays the
openb stream through both). Before, they ran two engines, and the server forgot the policy's
request transform: with `k8s-default` it admitted a 250-milli slice onto a GPU with 500 milli
free that the simulator (rightly) refused, since stock Kubernetes hands out whole GPUs.

The transform is applied once, at entry: a caller turns the pod's request into the request as
the policy accounts it with `request_for`, and every other method takes that `AccountedRequest`
(and refuses a bare `PodRequest`: a missed transform is a TypeError, not a wrong placement).
Verdicts come from one cache, the per-shape `ShapeIndex`: the server needs its views (a filter
call names up to 5000 nodes and is answered with dict lookups), and the simulator's replay is no
slower through it (`tessera simulate` fgd on openb, seed 42, 2-core machine under load: 2.3-2.7 s
of CPU with the ideal scheduler where the simulator's own per-node cache took 3.0-3.5 s; with kube
8.8-10.1 s against 8.9-10.8 s before, the same within noise).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not, not_

from .cluster import Cluster, NodeState
from .model import AccountedRequest, PodRequest
from .policy import NodeScore, Policy
from .shape_index import DEFAULT_MAX_VIEWS, ShapeIndex, ShapeView


@dataclass(frozen=True, slots=True)
class Choice:
    """Where a pod goes: a node and the GPUs on it."""

    node: NodeState
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Fitting:
    """Which of a list of names one shape fits, as of one generation of one view (filter's answer).

    kube-scheduler sends prioritize the names filter just passed, with nothing changed in between:
    prioritize takes them from here instead of looking 5000 fresh name strings up again.
    """

    key: tuple  # the request's shape
    view: ShapeView  # held, so that `is` cannot match a new view at a reused address
    changes: int  # the index's generation: any node change since makes this stale
    names: list[str]  # the names that fit, in the order asked
    bins: list[int] | None  # each one's bin, where the view keeps a ranking (a binned policy): prioritize needs them

    def answers(self, key: tuple, view: ShapeView, changes: int, names: list[str]) -> bool:
        """Whether `names` are exactly the names that fit, for this shape and view, with nothing changed since."""
        return self.changes == changes and self.view is view and self.key == key and self.names == names


class Placer:
    """A policy's feasibility, scores and GPU picks over one live `Cluster`, cached per shape."""

    def __init__(self, cluster: Cluster, policy: Policy, max_views: int = DEFAULT_MAX_VIEWS,
                 order: Sequence[NodeState] | None = None) -> None:
        """`order`: the nodes in the order ties go (the ideal scheduler's seeded shuffle); the cluster's by default."""
        self.cluster = cluster
        self.policy = policy
        self._index = ShapeIndex(cluster, policy, max_views)
        self._order = None if order is None else list(order)
        self._pairs: list[tuple[str, NodeState]] | None = None  # (name, node) in tie order: names looked up once
        self._last: Fitting | None = None  # the last `fitting` answer, for `scores` on the same names
        cluster.on_change(self._membership)

    def _membership(self, node: NodeState) -> None:
        if self._order is None and (node.version == 0 or self.cluster.by_name.get(node.spec.name) is not node):
            self._pairs = None  # a node was added (version 0) or removed: the cluster order changed

    def _in_order(self, nodes: Iterable[NodeState] | None) -> list[tuple[str, NodeState]]:
        if nodes is not None:
            return [(n.spec.name, n) for n in nodes]
        if self._pairs is None:
            self._pairs = [(n.spec.name, n) for n in (self.cluster.nodes if self._order is None else self._order)]
        return self._pairs

    @property
    def generation(self) -> int:
        """Node changes so far: while it stands still, no node's free capacity or verdict changed (gangs.py memo)."""
        return self._index.changes

    def in_order(self) -> list[NodeState]:
        """Every node in tie order: what `choose` weighs when given no nodes (a caller that leaves some out keeps it)."""
        return [n for _, n in self._in_order(None)]

    def use(self, policy: Policy) -> None:
        """Place with another policy from now on (a relearned workload): every verdict is judged afresh."""
        self.policy = policy
        self._index.use(policy)

    def request_for(self, pod: PodRequest) -> AccountedRequest:
        """The entry: the pod's request as the policy accounts it (k8s-default: a slice is a whole GPU)."""
        r = self.policy.request_for(pod)
        return AccountedRequest(r.name, r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_models)

    def fits(self, request: AccountedRequest, node: NodeState) -> str | None:
        """Why `request` may not go to `node` now, in words; None when it may (uncached: for scratch nodes)."""
        return self.policy.filter(accounted(request), node)

    def _view(self, request: AccountedRequest) -> ShapeView:
        return self._index.view(accounted(request))

    def view(self, request: AccountedRequest) -> ShapeView:
        """Every node's verdict for the request's shape, current: `fit` by name, `unfit` with the reason."""
        return self._view(request)

    def never_fits(self, request: AccountedRequest, name: str) -> bool:
        """Whether the request could not go to node `name` even if it were empty (preemption cannot help)."""
        return self._index.never_fits(accounted(request), name)

    def feasible(self, request: AccountedRequest, nodes: Iterable[NodeState] | None = None) -> list[tuple[NodeState, NodeScore]]:
        """(node, verdict) for each of `nodes` (all, in tie order, by default) that the request fits, in that order."""
        fit = self._view(request).fit
        pairs = self._in_order(nodes)
        if self.policy.cacheable:  # verdicts are NodeScores, never None
            get = fit.get
            return [(n, v) for name, n in pairs if (v := get(name)) is not None]
        score = self.policy.score
        return [(n, score(request, n)) for name, n in pairs if name in fit]

    def split(self, request: AccountedRequest, names: list[str]) -> tuple[list[str], list[str]]:
        """The names of `names` the request fits and the rest, each in order (filter); the first remembered for prioritize.

        One pass of dict lookups (C-level: this runs over every node per pod); the rest is picked
        from its answers, not by looking every name up again. Where the view keeps a ranking, the
        lookups are of the bins, which prioritize then need not look up again (0.1-0.3 ms a pod).
        """
        view = self._view(request)
        ranking = view.ranking
        if ranking is None:
            fits = list(map(view.fit.__contains__, names))
            bins = None
        else:
            found = list(map(ranking.bins.get, names))
            fits = list(map(is_not, found, repeat(None)))
            bins = list(compress(found, fits))
        fitting = list(compress(names, fits))
        rest = list(compress(names, map(not_, fits))) if len(fitting) < len(names) else []
        self._last = Fitting(request.key, view, self._index.changes, fitting, bins)
        return fitting, rest

    def _reused(self, request: AccountedRequest, view: ShapeView, names: list[str]) -> Fitting | None:
        """filter's answer, when `names` are what it passed and nothing changed since (prioritize)."""
        last = self._last
        return last if last is not None and last.answers(request.key, view, self._index.changes, names) else None

    def scores(self, request: AccountedRequest, names: list[str]) -> tuple[list[str], list[NodeScore]]:
        """The names of `names` the request fits, in order, and the policy's verdict on each."""
        view = self._view(request)
        last = self._reused(request, view, names)
        fitting = last.names if last is not None else list(filter(view.fit.__contains__, names))
        return fitting, self._index.scores(request, view, fitting)

    def extender_scores(self, request: AccountedRequest, names: list[str]) -> tuple[list[str], list[int]]:
        """The names of `names` the request fits, in order, and the policy's extender score for each (prioritize).

        A `binned` policy answers from the shape's ranking: a small int per node and the best node
        known, where reading all 5000 verdicts cost 0.65 ms (shape_index.Ranking).
        """
        if not (self.policy.binned and self.policy.cacheable):
            fitting, verdicts = self.scores(request, names)
            return fitting, self.policy.extender_scores(verdicts)
        view = self._view(request)
        last = self._reused(request, view, names)
        fitting = last.names if last is not None else list(filter(view.fit.__contains__, names))
        if not fitting:
            return fitting, []
        ranking = self._index.ranking(view)
        top = ranking.top_index(fitting)
        if top is None:  # the best is shared or kube-scheduler left it out: read every verdict
            return fitting, self.policy.extender_scores(self._index.scores(request, view, fitting))
        bins = last.bins if last is not None and last.bins is not None else list(map(ranking.bins.__getitem__, fitting))
        return fitting, self.policy.scores_from_bins(bins, top)

    def best_first(self, request: AccountedRequest) -> list[str]:
        """Every node the request fits now, the policy's best verdict first (gang admission fills them in this order).

        A `binned` policy keeps the shape's verdicts sorted already (the `Ranking` prioritize reads): read it backwards,
        no sort. Others: every verdict, sorted, ties in the cluster's order.
        """
        if self.policy.binned and self.policy.cacheable:
            return [name for _, name in reversed(self._index.ranking(self._view(request)).ranked)]
        found = self.feasible(request)
        order = sorted(range(len(found)), key=lambda i: -found[i][1].value)
        return [found[i][0].spec.name for i in order]

    def verdict(self, request: AccountedRequest, node: NodeState) -> NodeScore | None:
        """The policy's verdict on one node, None when the request does not fit it."""
        found = self.feasible(request, (node,))
        return found[0][1] if found else None

    def gpus_for(self, request: AccountedRequest, node: NodeState, verdict: NodeScore) -> tuple[int, ...]:
        """The GPUs the request gets on a chosen node: the verdict's pick, or the policy's late pick."""
        return verdict.gpus if verdict.gpus is not None else self.policy.pick_gpus(accounted(request), node)

    def choose(self, request: AccountedRequest, nodes: Sequence[NodeState] | None = None,
               rng: random.Random | None = None) -> Choice | None:
        """The paper's choice: the best verdict, the first in tie order among equals (drawn with `rng` for Random-fit)."""
        found = self.feasible(request, nodes)
        if not found:
            return None
        if self.policy.random_ties and rng is not None:
            top = max(v.value for _, v in found)
            node, best = rng.choice([(n, v) for n, v in found if v.value == top])
            return Choice(node, self.gpus_for(request, node, best))
        node, best = found[0]
        for n, v in found:
            if v.value > best.value:
                node, best = n, v
        return Choice(node, self.gpus_for(request, node, best))


def accounted(request: AccountedRequest) -> AccountedRequest:
    """`request`, checked to have come through `Placer.request_for` (a bare PodRequest would skip the policy's transform)."""
    if type(request) is not AccountedRequest:
        raise TypeError(f"{type(request).__name__} {request.name!r}: place the request as the policy accounts it "
                        f"(Placer.request_for), not the pod's own")
    return request
