"""The FGD paper's baselines, each as its artifact configures it (docs/fragmentation.md §5).

All score on 0..100 integers; the GPU choice is the tightest fit unless said otherwise.
The normalisers 128 CPUs and 8 GPUs are the largest node of the openb cluster, as in the artifact.
"""

from __future__ import annotations

import random

from ..cluster import NodeState
from ..model import MILLI_PER_GPU, PodRequest
from ..policy import NodeScore, Policy, PolicyContext, random_gpus, register, tightest_gpus

CPU_NORM = 128_000  # milli-CPU of the largest node
GPU_NORM = 8 * MILLI_PER_GPU  # milli-GPU of the largest node


@register
class BestFit(Policy):
    """The node left with the least weighted CPU + GPU after placement."""

    name = "bestfit"

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        left = 0.5 * (node.cpu_free - pod.cpu_milli) / CPU_NORM + 0.5 * (node.gpu_free_total - pod.gpu_demand) / GPU_NORM
        return NodeScore(int(100 * (1 - left)), tightest_gpus(node, pod))


@register
class DotProduct(Policy):
    """Tetris as the artifact reads it: the smallest dot product of free capacity and demand."""

    name = "dotprod"

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        dot = (node.cpu_free / CPU_NORM) * (pod.cpu_milli / CPU_NORM) + (node.gpu_free_total / GPU_NORM) * (
            pod.gpu_demand / GPU_NORM
        )
        return NodeScore(int(100 * (1 - dot / 2)), tightest_gpus(node, pod))


@register
class Packing(Policy):
    """Partially used GPUs first, then free GPUs on used nodes, then fresh (smaller) nodes."""

    name = "packing"

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        if pod.gpu_count == 0:
            return NodeScore(0, ())
        gpus = tightest_gpus(node, pod)
        full_free = node.full_gpus_free
        if full_free == node.spec.gpu_count:  # untouched GPUs
            return NodeScore(max(33 - full_free, full_free), gpus)
        if pod.is_slice:
            r = node.gpu_free[gpus[0]]
            if r < MILLI_PER_GPU:  # shares a partially used GPU
                return NodeScore(max(100 - (100 * r // MILLI_PER_GPU) // 10, 50), gpus)
        return NodeScore(max(50 - full_free, 33), gpus)


@register
class Clustering(Policy):
    """Keep pods of one GPU shape together; fuller nodes first."""

    name = "clustering"

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        if pod.gpu_count == 0:
            return NodeScore(0, ())
        value = 25 * (GPU_NORM - node.gpu_free_total) // GPU_NORM
        gpu_shapes = {s for s in node.shapes if s != "cpu"}
        shape = pod.shape()
        if not gpu_shapes:
            value += 25
        elif gpu_shapes == {shape}:
            value += 75
        elif shape in gpu_shapes:
            value += 50
        return NodeScore(value, tightest_gpus(node, pod))


@register
class RandomFit(Policy):
    """One feasible node drawn uniformly; a slice gets a random fitting GPU.

    Every feasible node scores the same and `random_ties` asks the caller to draw among them,
    which is the artifact's PreScore draw without scoring each node with its own random number.
    """

    name = "random"
    random_ties = True

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.rng = random.Random(ctx.seed)

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        return NodeScore(0, None)

    def pick_gpus(self, pod: PodRequest, node: NodeState) -> tuple[int, ...]:
        return random_gpus(node, pod, self.rng) if pod.gpu_count else ()

    def extender_scores(self, scores):
        if not scores:
            return []
        chosen = self.rng.randrange(len(scores))
        return [10 if i == chosen else 0 for i in range(len(scores))]
