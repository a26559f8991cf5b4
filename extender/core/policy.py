"""What a placement policy is, and the registry that names them.

Modelled on kube-scheduler's framework (kubernetes-sigs/scheduler-plugins): a policy is a
small object that filters a node, scores it and picks the GPUs; who calls it (the simulator,
the HTTP extender) decides how the scores become a choice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .cluster import NodeState, fit_reason
from .fragmentation import FragmentationMeasure
from .model import PodRequest
from .workload import TargetWorkload

MAX_EXTENDER_SCORE = 10  # kube-scheduler's MaxExtenderPriority


@dataclass(frozen=True, slots=True)
class NodeScore:
    """A policy's verdict on one feasible node: higher `value` is better; `gpus` is its pick."""

    value: Any  # a number or a tuple; only compared with values of the same policy
    gpus: tuple[int, ...] | None  # None: ask `Policy.pick_gpus` once this node is chosen


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know beyond the node in front of it."""

    workload: TargetWorkload
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


class Policy:
    """Base: feasibility is the common fit check; subclasses score and pick GPUs."""

    name: ClassVar[str] = ""
    #: score depends only on (node state, pod request), so callers may cache it per node version
    cacheable: ClassVar[bool] = True
    #: False for stock kube-scheduler: no extender score, only kube's own plugins
    uses_extender: ClassVar[bool] = True
    #: equal best scores are to be drawn at random, not taken in a fixed order (Random-fit)
    random_ties: ClassVar[bool] = False
    #: extender scores are bins relative to the best verdict asked (`extender_bin`, `scores_from_bins`),
    #: and verdict values are totally ordered: prioritize may then answer from bins and a ranking kept
    #: per shape instead of reading every verdict (shape_index.Ranking)
    binned: ClassVar[bool] = False

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def request_for(self, pod: PodRequest) -> PodRequest:
        """The request as this policy accounts it (stock Kubernetes rounds a slice up to a GPU)."""
        return pod

    def filter(self, pod: PodRequest, node: NodeState) -> str | None:
        """Why `pod` may not go to `node`, in words; None when it may."""
        return fit_reason(pod, node)

    def score(self, pod: PodRequest, node: NodeState) -> NodeScore:
        """Score a node that passed `filter`, and choose its GPUs."""
        raise NotImplementedError

    def pick_gpus(self, pod: PodRequest, node: NodeState) -> tuple[int, ...]:
        """GPUs for a chosen node whose score left them open (cheap scores pick late)."""
        return lowest_gpus(node, pod)

    def extender_scores(self, scores: Sequence[NodeScore]) -> list[int]:
        """Map full-resolution scores to the 0..10 integers an extender's prioritize returns.

        The paper's policies score 0..100, so the default is a tenth, floored (⌊10·σ⌋ for FGD).
        """
        return [min(MAX_EXTENDER_SCORE, max(0, s.value // 10)) for s in scores]  # values are ints 0..100

    def extender_bin(self, verdict: NodeScore) -> int:
        """A `binned` policy's bin for one verdict: a small int, higher for better verdicts."""
        raise NotImplementedError

    def scores_from_bins(self, bins: list[int], top: int) -> list[int]:
        """A `binned` policy's `extender_scores`, from each verdict's bin and the index of the best verdict."""
        raise NotImplementedError


_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name {cls.name!r} missing or taken")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    from . import policies  # noqa: F401  (registers the built-in policies)

    return list(_REGISTRY)


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    names = policy_names()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(names)}")
    return _REGISTRY[name](ctx)


# --- helpers shared by several policies -------------------------------------------------------

def sigmoid_score(delta_milli: float) -> int:
    """FGD's ⌊100·σ(−Δ/1000)⌋: 50 for no change, higher when fragmentation falls."""
    x = delta_milli / 1000.0
    if x > 700:
        return 0
    return int(100.0 / (1.0 + math.exp(x)))


def lowest_gpus(node: NodeState, pod: PodRequest) -> tuple[int, ...]:
    """The lowest-indexed GPUs with room for the pod's per-GPU share."""
    d = pod.gpu_milli
    picked = [g for g, r in enumerate(node.gpu_free) if r >= d]
    return tuple(picked[: pod.gpu_count])


def tightest_gpus(node: NodeState, pod: PodRequest) -> tuple[int, ...]:
    """Best fit per GPU: a slice takes the GPU with the least room that still fits it."""
    if pod.gpu_count == 0:
        return ()
    if not pod.is_slice:
        return lowest_gpus(node, pod)
    d = pod.gpu_milli
    best = min((r, g) for g, r in enumerate(node.gpu_free) if r >= d)
    return (best[1],)


def random_gpus(node: NodeState, pod: PodRequest, rng: random.Random) -> tuple[int, ...]:
    d = pod.gpu_milli
    fitting = [g for g, r in enumerate(node.gpu_free) if r >= d]
    return tuple(sorted(rng.sample(fitting, pod.gpu_count)))


def measure_for(ctx: PolicyContext) -> FragmentationMeasure:
    """The policy's fragmentation measure; `options["memo_limit"]` bounds its memo (the extender's is small)."""
    limit = ctx.options.get("memo_limit")
    return FragmentationMeasure(ctx.workload) if limit is None else FragmentationMeasure(ctx.workload, int(limit))

