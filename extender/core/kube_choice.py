"""kube-scheduler 1.20's choice among the nodes that passed filter, with an extender configured.

Each node's total is the extender's 0..10 score times its weight times 10, plus the default
score plugins that vary with node state (LeastAllocated + BalancedAllocation, 0..100 each;
core/kube_scores.py); the highest total wins and equal totals are drawn uniformly at random.
One node left after filter is taken without scoring (kube-scheduler does not call prioritize
then). The simulator's `kube` scheduler chooses with this object, and the differential test
(tests/test_differential.py) applies it to the server's own prioritize answers with the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .cluster import NodeState
from .kube_scores import MAX_PLUGINS_SCORE, default_plugins_score
from .model import PodRequest
from .node_memo import NodeMemo

DEFAULT_EXTENDER_WEIGHT = 100


class KubeChoice:
    """Totals and the seeded tie draw; the plugins' scores memoised per node state and (cpu, memory)."""

    def __init__(self, seed: int, weight: int = DEFAULT_EXTENDER_WEIGHT) -> None:
        self.rng = random.Random(seed)
        self.weight = weight
        self._plugins = NodeMemo()  # per node: {(cpu, memory) request: plugins' score}

    def pick(self, request: PodRequest, nodes: Sequence[NodeState], extender: Sequence[int]) -> int:
        """The index into `nodes` kube-scheduler binds to, given the extender's score for each."""
        if len(nodes) == 1:
            return 0
        scale = self.weight * 10
        # one extender level outweighs the plugins (200 at most): only the top level can win
        floor = max(extender) if scale > MAX_PLUGINS_SCORE else None
        key = (request.cpu_milli, request.memory_mib)
        memo_of = self._plugins.of
        best_total, ties = -1, []
        for i, (node, e) in enumerate(zip(nodes, extender, strict=True)):
            if floor is not None and e != floor:
                continue
            memo = memo_of(node)
            plugins = memo.get(key)
            if plugins is None:
                plugins = memo[key] = default_plugins_score(request, node)
            total = e * scale + plugins
            if total > best_total:
                best_total, ties = total, [i]
            elif total == best_total:
                ties.append(i)
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)
