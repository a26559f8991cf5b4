"""The target workload: which kinds of pod the cluster expects next, and how often.

The fragmentation measure is taken against this mix (FGD paper; docs/fragmentation.md §2).
The paper's rule (`GetTypicalPods`): key pods by (CPU, per-GPU milli, GPU count, GPU models),
weight each pod 1, keep the most common keys until they cover 95% of pods, renormalise.
`WorkloadLearner` applies the same rule online to the pods the extender has seen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .model import PodRequest

PAPER_COVERAGE = 0.95


@dataclass(frozen=True, slots=True)
class TaskType:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only
    gpu_count: int
    gpu_models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pod: PodRequest) -> TaskType:
        return cls(pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_models)

    def sort_key(self) -> tuple:
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(sorted(self.gpu_models)))


@dataclass(frozen=True, slots=True)
class Workload:
    """A probability distribution over task types (weights sum to 1)."""

    types: tuple[tuple[TaskType, float], ...]

    def __post_init__(self) -> None:
        if not self.types:
            raise ValueError("a workload needs at least one task type")
        total = sum(p for _, p in self.types)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"workload weights sum to {total}, not 1")

    @classmethod
    def from_counts(cls, counts: Counter[TaskType], coverage: float = PAPER_COVERAGE) -> Workload:
        """The paper's rule: most common types until `coverage` of pods, renormalised."""
        if not counts:
            raise ValueError("no pods to learn a workload from")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        kept: list[tuple[TaskType, int]] = []
        covered = 0
        for task, n in ranked:
            kept.append((task, n))
            covered += n
            if covered >= coverage * total:
                break
        return cls(tuple((task, n / covered) for task, n in kept))

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], coverage: float = PAPER_COVERAGE) -> Workload:
        return cls.from_counts(Counter(TaskType.of(p) for p in pods), coverage)

    def weighted_by_demand(self) -> Workload:
        """The same types weighted by GPU demand instead of pod count (CPU-only types dropped)."""
        w = [(t, p * t.gpu_count * t.gpu_milli) for t, p in self.types if t.gpu_count]
        total = sum(x for _, x in w)
        return Workload(tuple((t, x / total) for t, x in w))


class WorkloadLearner:
    """Counts the pods seen so far; `workload()` gives the paper's 95%-coverage mix of them."""

    def __init__(self, coverage: float = PAPER_COVERAGE) -> None:
        self.coverage = coverage
        self.counts: Counter[TaskType] = Counter()

    def observe(self, pod: PodRequest) -> None:
        self.counts[TaskType.of(pod)] += 1

    def workload(self) -> Workload:
        return Workload.from_counts(self.counts, self.coverage)
