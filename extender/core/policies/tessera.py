"""`tessera`: FGD's fragmentation gradient with tie rules that survive kube-scheduler.

FGD's published edge (docs/fragmentation.md §8) does not come from the gradient alone: its
⌊100·σ(−Δ/1000)⌋ score makes many placements equal and the artifact's scheduler then takes the
first node of a fixed order, which packs nodes one after another. Compare Δ exactly and it falls
from 4.8% to 9.3% unallocated; break its ties at random, as kube-scheduler does, and it falls to
~10%. Tessera makes each of those parts explicit and deliberate:

1. The fragmentation step Δ F_n(M) is rounded to bins of `DELTA_BIN_MILLI` centred on zero:
   a step within ±45 milli-GPU counts as "no change". Finer bins let small, mostly accidental
   differences (a rare task type's CPU threshold crossed) override the packing order; this
   bin beat FGD's sigmoid bins on the default, multigpu, gpuspec and cpu-heavy traces
   (docs/results.md has the sweep, including the widths that did worse).
2. Within a node, a slice takes the tightest GPU among those in the best bin (least room left).
3. Between nodes in the same bin, a stable order from a hash of the node's name: first-fit
   packing that does not depend on who breaks ties.

Because 3 makes the best node unique, `extender_scores` can hand kube-scheduler ranks: 10 for
that node, 9 for the rest of its bin, one less per bin further away. With an extender weight of
at least 21 (one level, 10 x weight, then outweighs LeastAllocated + BalancedAllocation, 200 at
most), kube-scheduler picks exactly the node Tessera picked.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

from ..cluster import NodeState
from ..model import PodRequest
from ..policy import MAX_EXTENDER_SCORE, NodeScore, Policy, PolicyContext, measure_for, register
from .fgd import fragmentation_deltas

DELTA_BIN_MILLI = 90


@register
class Tessera(Policy):
    name = "tessera"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.measure = measure_for(ctx)
        self.bin_milli = float(ctx.options.get("bin_milli", DELTA_BIN_MILLI))
        self._order: dict[str, int] = {}

    def node_order(self, name: str) -> int:
        """A stable pseudo-random rank per node name (smaller is tried first)."""
        rank = self._order.get(name)
        if rank is None:
            digest = blake2b(f"{self.ctx.seed}:{name}".encode(), digest_size=8).digest()
            rank = self._order[name] = int.from_bytes(digest, "big")
        return rank

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        best_key, best_gpus = None, ()
        for delta, gpus in fragmentation_deltas(self.measure, pod, node):
            room = node.gpu_free[gpus[0]] - pod.gpu_milli if pod.is_slice else 0
            key = (-round(delta / self.bin_milli), -room)
            if best_key is None or key > best_key:
                best_key, best_gpus = key, gpus
        assert best_key is not None  # filter guaranteed at least one placement
        return NodeScore((best_key[0], -self.node_order(node.name)), best_gpus)

    binned = True  # ranks are bins relative to the best node's: the server keeps bins per shape (shape_index.py)

    def extender_scores(self, scores: Sequence[NodeScore]) -> list[int]:
        if not scores:
            return []
        values = [s.value for s in scores]
        return self.scores_from_bins([v[0] for v in values], values.index(max(values)))

    def extender_bin(self, verdict: NodeScore) -> int:
        return verdict.value[0]

    def scores_from_bins(self, bins: list[int], top: int) -> list[int]:
        """10 for the best node (index `top`), then one less per bin below the best node's bin, 0 at the floor."""
        ceiling = MAX_EXTENDER_SCORE - 1 - bins[top]
        out = [ceiling + b for b in bins]  # one pass per list: this runs over every node per pod
        if min(out) < 0:  # a bin 10 or more below the best: clipped only when there is one
            out = [x if x > 0 else 0 for x in out]
        out[top] = MAX_EXTENDER_SCORE
        return out
