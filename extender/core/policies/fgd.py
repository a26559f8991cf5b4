"""`fgd`: Fragmentation Gradient Descent, as the paper's artifact implements it.

Each pod goes where the cluster's fragmentation F(M) grows least. Score ⌊100·σ(−Δ/1000)⌋ on
0..100; a slice takes the lowest-indexed GPU that reaches the node's best score; whole GPUs
are the lowest-indexed free ones (docs/fragmentation.md §4).
"""

from __future__ import annotations

from ..cluster import NodeState
from ..model import PodRequest
from ..policy import NodeScore, Policy, PolicyContext, lowest_gpus, measure_for, register, sigmoid_score


def fragmentation_deltas(measure, pod: PodRequest, node: NodeState) -> list[tuple[float, tuple[int, ...]]]:
    """Δ F_n(M) for each distinct way of placing `pod` on `node` (lowest GPU index first).

    A slice may go to any GPU with room; GPUs with equal free share give equal Δ, so only the
    lowest-indexed of each is tried. Whole GPUs: the lowest-indexed free ones (which ones does
    not change F).
    """
    model = node.spec.gpu_model
    base = measure.node(node.cpu_free, node.gpu_free, model)
    cpu_after = node.cpu_free - pod.cpu_milli
    if pod.gpu_count == 0:
        return [(measure.node(cpu_after, node.gpu_free, model) - base, ())]
    if pod.is_slice:
        out = []
        seen: set[int] = set()
        d = pod.gpu_milli
        for g, r in enumerate(node.gpu_free):
            if r < d or r in seen:
                continue
            seen.add(r)
            after = list(node.gpu_free)
            after[g] = r - d
            out.append((measure.node(cpu_after, after, model) - base, (g,)))
        return out
    gpus = lowest_gpus(node, pod)
    after = list(node.gpu_free)
    for g in gpus:
        after[g] -= pod.gpu_milli
    return [(measure.node(cpu_after, after, model) - base, gpus)]


@register
class FGD(Policy):
    name = "fgd"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.measure = measure_for(ctx)

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        best: NodeScore | None = None
        for delta, gpus in fragmentation_deltas(self.measure, pod, node):
            s = sigmoid_score(delta)
            if best is None or s > best.value:
                best = NodeScore(s, gpus)
        assert best is not None  # filter guaranteed at least one placement
        return best
