"""The FGD fragmentation measure (Weng et al., USENIX ATC'23), exactly as docs/fragmentation.md §3.

F_n(m), the free GPU milli of node n that a task of type m cannot use:
  R_n                              if m is CPU-only, or n's model is not allowed for m,
                                   or n lacks m's CPU, or fewer than k_m GPUs have >= d_m free;
  sum of r_g with r_g < d_m        otherwise.
F_n(M) = sum_m p_m F_n(m);  F(M) = sum_n F_n(M). Memory plays no part.

F_n depends on the CPU free only through which task CPU requests it meets, so results are
memoised on (model, CPU level, sorted free shares): nodes in the same state share one entry.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from .cluster import Cluster, NodeState
from .workload import TargetWorkload

MEMO_LIMIT = 500_000  # a replay's distinct node states; about 400 bytes each (docs/reliability.md)


class FragmentationMeasure:
    """F_n(M) for any node state, against one target workload.

    The memo is cleared when it reaches `memo_limit` entries: a long-running extender sees ever new
    node states, and a bounded memo is what keeps its memory flat.
    """

    def __init__(self, workload: TargetWorkload, memo_limit: int = MEMO_LIMIT) -> None:
        self.workload = workload
        self.memo_limit = memo_limit
        # (cpu, milli per GPU, GPU count, allowed models or None, probability)
        self._types = [
            (t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models or None, p) for t, p in workload.types
        ]
        self._cpu_levels = sorted({t.cpu_milli for t, _ in workload.types})
        self._memo: dict[tuple, float] = {}

    @property
    def memo_size(self) -> int:
        """Entries held now, never over `memo_limit`: bench/load.py reports it to show memory stays flat."""
        return len(self._memo)

    def node(self, cpu_free: int, gpu_free: Sequence[int], model: str) -> float:
        """Expected free milli-GPU of this node that the next task could not use."""
        if not gpu_free:
            return 0.0
        # A GPU whose reserved milli grew under its pods (it turned unhealthy) has negative free in the
        # core's books; for fragmentation it has nothing free, or F(M) would go negative.
        key = (model, bisect_right(self._cpu_levels, cpu_free), tuple(sorted(max(0, r) for r in gpu_free)))
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) >= self.memo_limit:
                self._memo.clear()
            value = self._memo[key] = self._compute(cpu_free, key[2], model)
        return value

    def of(self, node: NodeState) -> float:
        return self.node(node.cpu_free, node.gpu_free, node.spec.gpu_model)

    def _compute(self, cpu_free: int, gpu_free: tuple[int, ...], model: str) -> float:
        total = sum(gpu_free)
        if total == 0:
            return 0.0
        frag = 0.0
        for c, d, k, models, p in self._types:
            if k == 0 or cpu_free < c or (models is not None and model not in models):
                frag += p * total
                continue
            usable = 0
            small = 0
            for r in gpu_free:
                if r >= d:
                    usable += 1
                else:
                    small += r
            frag += p * (total if usable < k else small)
        return frag


class FragmentationIndex:
    """F(M) of a whole cluster, kept up to date incrementally: only changed nodes are recomputed."""

    def __init__(self, cluster: Cluster, measure: FragmentationMeasure) -> None:
        self.cluster = cluster
        self.measure = measure
        self.per_node = [measure.of(n) for n in cluster.nodes]
        self.total = sum(self.per_node)
        cluster.on_change(self._refresh)

    def _refresh(self, node: NodeState) -> None:
        if node.index >= len(self.per_node):
            self.per_node.extend([0.0] * (node.index + 1 - len(self.per_node)))
        new = self.measure.of(node) if self.cluster.by_name.get(node.name) is node else 0.0
        self.total += new - self.per_node[node.index]
        self.per_node[node.index] = new

    def amount_pct(self) -> float:
        """F(M) as a share of all GPU capacity, in % (Fig. 7(a) of the paper)."""
        cap = self.cluster.gpu_capacity_milli
        return 100.0 * self.total / cap if cap else 0.0

    def rate_pct(self) -> float:
        """F(M) as a share of the free GPU capacity, in % (Fig. 7(b))."""
        free = self.cluster.gpu_free_milli
        return 100.0 * self.total / free if free else 0.0
