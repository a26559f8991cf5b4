"""A policy's verdicts per node, cached until the node changes.

Filter and score depend only on (node state, pod request), and a node's state changes only when
a pod lands on or leaves it, so pods of the same shape mostly hit this cache: the simulator's
replays and the extender's filter/prioritize calls both go through it.
"""

from __future__ import annotations

from .cluster import NodeState
from .model import PodRequest
from .policy import NodeScore, Policy


class VerdictCache:
    """Per-node memo of a policy's verdicts, dropped whenever the node's state changes.

    Pods with equal request keys get equal verdicts, so a replay of ~10k pods over ~1k nodes
    mostly hits this memo; keys are interned to small ints because hashing the request tuple
    on every lookup cost more than the lookup.
    """

    _MISS = object()
    _FEASIBLE = object()  # for policies whose score may not be cached: the filter verdict is

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._entries: list[tuple[int, dict]] = []  # by node index (unique per cluster): (node version, memo)
        self._key_ids: dict[tuple, int] = {}

    def feasible(self, pod: PodRequest, nodes) -> list[tuple[NodeState, NodeScore]]:
        """(node, verdict) for every node of `nodes` that passes the policy's filter."""
        kid = self._key_ids.setdefault(pod.key, len(self._key_ids))
        entries, miss, policy, cacheable = self._entries, self._MISS, self.policy, self.policy.cacheable
        out = []
        top = max((n.index for n in nodes), default=-1)
        if top >= len(entries):
            entries.extend([(-1, {})] * (top + 1 - len(entries)))
        for node in nodes:
            version, memo = entries[node.index]
            if version != node.version:
                memo = {}
                entries[node.index] = (node.version, memo)
                v = miss
            else:
                v = memo.get(kid, miss)
            if v is miss:
                if policy.filter(pod, node) is not None:
                    v = None
                else:
                    v = policy.score(pod, node) if cacheable else self._FEASIBLE
                memo[kid] = v
            if v is self._FEASIBLE:
                v = policy.score(pod, node)
            if v is not None:
                out.append((node, v))
        return out
