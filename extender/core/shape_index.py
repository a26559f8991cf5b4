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

from collections import OrderedDict
from dataclasses import dataclass, field

from .cluster import Cluster, NodeState, never_fits
from .model import PodRequest
from .node_memo import NodeMemo
from .policy import NodeScore, Policy

DEFAULT_MAX_VIEWS = 48  # shapes kept; a view of 5000 nodes is about 1 MB


@dataclass(slots=True)
class ShapeView:
    """One shape's verdicts: `fit` for nodes it fits now, `unfit` with the reason for the rest."""

    fit: dict[str, NodeScore | None] = field(default_factory=dict)  # None: score on demand (uncacheable policy)
    unfit: dict[str, tuple[str, bool]] = field(default_factory=dict)  # (reason, never fits even when empty)
    dirty: set[str] = field(default_factory=set)


class ShapeIndex:
    """Per-shape views over one cluster for one policy; a new policy or cluster needs a new index."""

    def __init__(self, cluster: Cluster, policy: Policy, max_views: int = DEFAULT_MAX_VIEWS) -> None:
        self.cluster = cluster
        self.policy = policy
        self.max_views = max_views
        self._views: OrderedDict[tuple, ShapeView] = OrderedDict()
        self._memo = NodeMemo()  # per node: {shape id: verdict}, outlives views
        self._shape_ids: dict[tuple, int] = {}  # interned: hashing the request key per node cost more than the lookup
        cluster.on_change(self._touch)

    def use(self, policy: Policy) -> None:
        """A new policy (a relearned workload): every verdict is judged afresh; the listener stays."""
        self.policy = policy
        self._views.clear()
        self._memo = NodeMemo()
        self._shape_ids.clear()

    def _touch(self, node: NodeState) -> None:
        name = node.name
        for view in self._views.values():
            view.dirty.add(name)
        if self.cluster.by_name.get(name) is not node:
            self._memo.drop(node)  # removed: node indexes are never reused

    def view(self, pod: PodRequest) -> ShapeView:
        """The shape's view, with every node changed since the last read judged again."""
        view = self._views.get(pod.key)
        if view is None:
            view = ShapeView(dirty=set(self.cluster.by_name))
            self._views[pod.key] = view
            if len(self._views) > self.max_views:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(pod.key)
        if view.dirty:
            self._judge(pod, view)
        return view

    def _judge(self, pod: PodRequest, view: ShapeView) -> None:
        by_name, memo = self.cluster.by_name, self._memo.of
        sid = self._shape_ids.setdefault(pod.key, len(self._shape_ids))
        for name in view.dirty:
            view.fit.pop(name, None)
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
            else:
                view.unfit[name] = value
        view.dirty.clear()

    def _verdict(self, pod: PodRequest, node: NodeState) -> tuple[bool, object]:
        reason = self.policy.filter(pod, node)
        if reason is None:
            return True, (self.policy.score(pod, node) if self.policy.cacheable else None)
        return False, (f"tessera: {reason}", never_fits(self.policy.request_for(pod), node.spec))

    def scores(self, pod: PodRequest, view: ShapeView, names: list[str]) -> list[NodeScore]:
        """Verdicts for `names`, all of which must be in `view.fit`."""
        fit = view.fit
        if self.policy.cacheable:
            return [fit[n] for n in names]  # type: ignore[misc]
        by_name = self.cluster.by_name
        return [self.policy.score(pod, by_name[n]) for n in names]
