"""Every node's verdict for each pod shape, kept current by the cluster's change events.

kube-scheduler asks filter and prioritize once per pod with (nearly) every node's name. Pods
come in few shapes (request keys), and between two pods only the node the first one landed on
changes. So instead of judging 5000 nodes per call, a view per shape holds each node's verdict
and re-judges only the nodes that changed since it was last read. Answering a call is then one
pass over the names with dict lookups, which is what makes 5000-node filter calls cheap
(bench/extender_latency.py).

Views are kept for the shapes used most recently (openb's default trace has 151 shapes; the 48
most common cover 94% of its pods). A shape whose view was dropped is rebuilt from a per-node
memo that outlives views and is dropped only when the node changes, so a rebuild costs dict
lookups, not a fresh fragmentation score per node.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .cluster import Cluster, NodeState, never_fits
from .model import NodeSpec, PodRequest
from .node_memo import NodeMemo
from .policy import NodeScore, Policy

DEFAULT_MAX_VIEWS = 48  # shapes kept; a view of 5000 nodes is about 1 MB
# Node changes remembered for views to catch up on; a view further behind is judged whole again
# (dict lookups in the per-node memo). One shared log, not a dirty set per view: marking 151 views
# per placement made the simulator's replay (which keeps every shape's view) 25% slower.
MIN_LOG = 4096


# Re-judging more nodes than this at once drops a view's ranking (rebuilt when prioritize next asks):
# building one for 5000 nodes took 7 ms (2-core machine under load), a removal and an insertion a
# few microseconds each
MAX_RANKING_UPDATES = 256


@dataclass(slots=True)
class Ranking:
    """A `binned` policy's view of the fitting nodes as prioritize needs it: each node's bin, and all of them by verdict.

    prioritize at 5000 nodes spent 0.65 ms reading every verdict to find the best one and each
    bin (Tessera.extender_scores); from here it is one lookup of a small int per node, and the
    best node is the end of `ranked`. Kept only for the shapes prioritize asked about, so the
    simulator, which never does, pays nothing.
    """

    bins: dict[str, int]  # fitting node -> its bin
    ranked: list[tuple[Any, str]]  # (verdict value, node), ascending: the best verdict last

    def add(self, name: str, value: Any, bin_: int) -> None:
        self.bins[name] = bin_
        insort(self.ranked, (value, name))

    def remove(self, name: str, value: Any) -> None:
        del self.bins[name]
        ranked = self.ranked
        del ranked[bisect_left(ranked, (value, name))]

    def top_index(self, names: list[str]) -> int | None:
        """The index in `names` of the best verdict among them; None if that is not plain to see.

        That is the best fitting node overall when `names` holds it (kube-scheduler passes every
        node Tessera passed, less what its own filters refused: usually all), else the next best.
        None (the caller reads every verdict) when the best three are all missing or the best
        value is shared (ties go to the first in `names`, which only the slow path knows).
        """
        ranked = self.ranked
        for k in range(1, min(3, len(ranked)) + 1):
            value, name = ranked[-k]
            try:
                i = names.index(name)
            except ValueError:
                continue
            return i if k == len(ranked) or ranked[-k - 1][0] != value else None
        return None


@dataclass(slots=True)
class ShapeView:
    """One shape's verdicts: `fit` for nodes it fits now, `unfit` with the reason for the rest."""

    fit: dict[str, NodeScore | None] = field(default_factory=dict)  # None: score on demand (uncacheable policy)
    unfit: dict[str, str] = field(default_factory=dict)  # the reason, in words (`ShapeIndex.never_fits` says if for good)
    dirty: set[str] = field(default_factory=set)  # nodes still to judge again: empty once `view` returns it
    seen: int = 0  # how much of the index's change log this view has caught up on
    ranking: Ranking | None = None  # for a `binned` policy, once prioritize asked about this shape


class ShapeIndex:
    """Per-shape views over one cluster for one policy; a new policy or cluster needs a new index."""

    def __init__(self, cluster: Cluster, policy: Policy, max_views: int = DEFAULT_MAX_VIEWS, min_log: int = MIN_LOG) -> None:
        self.cluster = cluster
        self.policy = policy
        self.max_views = max_views
        self.min_log = min_log
        self._log: list[str] = []  # names of the nodes changed, oldest first
        self._log_base = 0  # how many changes were dropped from the log's front
        self._views: OrderedDict[tuple, ShapeView] = OrderedDict()
        self._memo = NodeMemo()  # per node: {shape id: verdict}, outlives views
        self._shape_ids: dict[tuple, int] = {}  # interned: hashing the request key per node cost more than the lookup
        self._never: dict[int, dict[int, tuple[NodeSpec, bool]]] = {}  # node index -> shape id -> (spec judged, never fits)
        cluster.on_change(self._touch)

    def use(self, policy: Policy) -> None:
        """A new policy (a relearned workload): every verdict is judged afresh; the listener stays."""
        self.policy = policy
        self._views.clear()
        self._memo = NodeMemo()
        self._shape_ids.clear()
        self._never.clear()

    def _touch(self, node: NodeState) -> None:
        name = node.spec.name
        log = self._log
        log.append(name)
        if len(log) > max(self.min_log, 4 * len(self.cluster.nodes)):
            half = len(log) // 2
            del log[:half]
            self._log_base += half
        if self.cluster.by_name.get(name) is not node:
            self._memo.drop(node)  # removed: node indexes are never reused
            self._never.pop(node.index, None)

    @property
    def changes(self) -> int:
        """Node changes seen so far: while it stands still, every view's verdicts stand too (a generation)."""
        return self._log_base + len(self._log)

    def _catch_up(self, view: ShapeView) -> None:
        """Mark the nodes changed since the view last read the log (all, if it fell off the log)."""
        end = self.changes
        if view.seen < self._log_base:
            view.dirty = set(self.cluster.by_name) | set(view.fit) | set(view.unfit)
        elif view.seen < end:
            view.dirty.update(self._log[view.seen - self._log_base:])
        view.seen = end

    def view(self, pod: PodRequest) -> ShapeView:
        """The shape's view, with every node changed since the last read judged again."""
        view = self._views.get(pod.key)
        if view is None:
            view = ShapeView(dirty=set(self.cluster.by_name), seen=self.changes)
            self._views[pod.key] = view
            if len(self._views) > self.max_views:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(pod.key)
            self._catch_up(view)
        if view.dirty:
            self._judge(pod, view)
        return view

    def ranking(self, view: ShapeView) -> Ranking:
        """The view's ranking for a `binned` policy (a cacheable one), built on first use and kept current after."""
        if view.ranking is None:
            bin_of = self.policy.extender_bin
            view.ranking = Ranking({name: bin_of(v) for name, v in view.fit.items()},  # type: ignore[arg-type]
                                   sorted((v.value, name) for name, v in view.fit.items()))  # type: ignore[union-attr]
        return view.ranking

    def _judge(self, pod: PodRequest, view: ShapeView) -> None:
        by_name, memo = self.cluster.by_name, self._memo.of
        sid = self._shape_ids.setdefault(pod.key, len(self._shape_ids))
        if len(view.dirty) > MAX_RANKING_UPDATES:
            view.ranking = None
        ranking, bin_of = view.ranking, self.policy.extender_bin
        for name in view.dirty:
            old = view.fit.pop(name, None)
            if ranking is not None and old is not None:
                ranking.remove(name, old.value)
            view.unfit.pop(name, None)
            node = by_name.get(name)
            if node is None:
                continue  # removed
            known = memo(node)
            verdict = known.get(sid)
            if verdict is None:
                verdict = known[sid] = self._verdict(pod, node)
            fits, value = verdict
            if fits:
                view.fit[name] = value
                if ranking is not None:
                    ranking.add(name, value.value, bin_of(value))
            else:
                view.unfit[name] = value
        view.dirty.clear()

    def _verdict(self, pod: PodRequest, node: NodeState) -> tuple[bool, object]:
        reason = self.policy.filter(pod, node)
        if reason is None:
            return True, (self.policy.score(pod, node) if self.policy.cacheable else None)
        return False, f"tessera: {reason}"

    def never_fits(self, pod: PodRequest, name: str) -> bool:
        """Whether the shape could not go to node `name` even if it were empty (preemption cannot help).

        Asked only where it matters (the server's filter, for nodes the pod does not fit), and once
        per node spec and shape: working it out with every unfit verdict cost the simulator's
        replay 150,000 empty-node fit checks that nobody read.
        """
        node = self.cluster.by_name.get(name)
        if node is None:
            return False
        sid = self._shape_ids.setdefault(pod.key, len(self._shape_ids))
        of_node = self._never.setdefault(node.index, {})
        known = of_node.get(sid)
        if known is None or known[0] is not node.spec:
            known = of_node[sid] = (node.spec, never_fits(pod, node.spec))
        return known[1]

    def scores(self, pod: PodRequest, view: ShapeView, names: list[str]) -> list[NodeScore]:
        """Verdicts for `names`, all of which must be in `view.fit`."""
        fit = view.fit
        if self.policy.cacheable:
            return [fit[n] for n in names]  # type: ignore[misc]
        by_name = self.cluster.by_name
        return [self.policy.score(pod, by_name[n]) for n in names]
