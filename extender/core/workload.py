"""The target workload: which kinds of pod the cluster expects next, and how often.

The fragmentation measure is taken against this mix (FGD paper; docs/fragmentation.md §2).
The paper's rule (`GetTypicalPods`): key pods by (CPU, per-GPU milli, GPU count, GPU models),
weight each pod 1, keep the most common keys until they cover 95% of pods, renormalise.
`WorkloadLearner` applies the same rule online to the pods the extender has seen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
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
class TargetWorkload:
    """A probability distribution over task types (weights sum to 1): the FGD paper's "target workload".

    Named for the paper's term so that it is not confused with raybridge's `Workload` (what a training
    entrypoint returns, a name users write in their own code).
    """

    types: tuple[tuple[TaskType, float], ...]

    def __post_init__(self) -> None:
        if not self.types:
            raise ValueError("a workload needs at least one task type")
        total = sum(p for _, p in self.types)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"workload weights sum to {total}, not 1")

    @classmethod
    def from_counts(cls, counts: Mapping[TaskType, float], coverage: float = PAPER_COVERAGE,
                    max_types: int | None = None) -> TargetWorkload:
        """The paper's rule: most common types until `coverage` of pods (or `max_types` of them), renormalised."""
        if not counts:
            raise ValueError("no pods to learn a workload from")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        kept: list[tuple[TaskType, float]] = []
        covered = 0.0
        for task, n in ranked:
            kept.append((task, n))
            covered += n
            if covered >= coverage * total or len(kept) == max_types:
                break
        return cls(tuple((task, n / covered) for task, n in kept))

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], coverage: float = PAPER_COVERAGE) -> TargetWorkload:
        return cls.from_counts(Counter(TaskType.of(p) for p in pods), coverage)

    def weighted_by_demand(self) -> TargetWorkload:
        """The same types weighted by GPU demand instead of pod count (CPU-only types dropped)."""
        w = [(t, p * t.gpu_count * t.gpu_milli) for t, p in self.types if t.gpu_count]
        total = sum(x for _, x in w)
        return TargetWorkload(tuple((t, x / total) for t, x in w))


# A running extender learns from pods anyone may create, so what one tenant makes is bounded:
MAX_LEARNED_TYPES = 256  # task types in a learned mix: openb's traces keep 21-124 (gpuspec33 the most)
MAX_COUNTED = 4096  # (namespace, task type) pairs counted; past it the rarer half is dropped


class WorkloadLearner:
    """Counts the pods seen so far; `workload()` gives the paper's 95%-coverage mix of them.

    Counted per namespace, and no namespace weighs more than all the others together: a tenant who
    creates and deletes 5000 CPU-only pods would otherwise make the mix CPU-only, every GPU placement
    would then look alike to the measure, and packing would stop for everyone. With one namespace
    there is nobody to protect, and it counts in full. Distinct task types are bounded twice: the mix
    keeps at most `MAX_LEARNED_TYPES` (30,000 pods of distinct CPU requests made one prioritize over
    300 nodes take 814 ms instead of 4 ms before), and the counters at most `MAX_COUNTED` pairs.
    """

    def __init__(self, coverage: float = PAPER_COVERAGE, max_types: int = MAX_LEARNED_TYPES,
                 max_counted: int = MAX_COUNTED) -> None:
        self.coverage = coverage
        self.max_types = max_types
        self.max_counted = max_counted
        self.by_namespace: dict[str, Counter[TaskType]] = {}
        self.observed = 0  # every pod ever counted, for the relearning schedule
        self._pairs = 0

    def observe(self, pod: PodRequest, namespace: str = "") -> None:
        counts = self.by_namespace.setdefault(namespace, Counter())
        task = TaskType.of(pod)
        self._pairs += task not in counts
        counts[task] += 1
        self.observed += 1
        if self._pairs > self.max_counted:
            self._drop_rarer_half()

    def _drop_rarer_half(self) -> None:
        pairs = sorted((n, ns, task.sort_key(), task) for ns, c in self.by_namespace.items() for task, n in c.items())
        for _, ns, _, task in pairs[: len(pairs) // 2]:
            del self.by_namespace[ns][task]
        self.by_namespace = {ns: c for ns, c in self.by_namespace.items() if c}
        self._pairs = sum(len(c) for c in self.by_namespace.values())

    @property
    def counts(self) -> Counter[TaskType]:
        """Pods per task type, each namespace scaled down to at most the others' total (with two or more)."""
        totals = {ns: sum(c.values()) for ns, c in self.by_namespace.items()}
        everyone = sum(totals.values())
        out: Counter[TaskType] = Counter()
        for ns, c in self.by_namespace.items():
            others = everyone - totals[ns]
            scale = min(1.0, others / totals[ns]) if len(totals) > 1 else 1.0
            for task, n in c.items():
                out[task] += n * scale
        return out

    def workload(self) -> TargetWorkload:
        return TargetWorkload.from_counts(self.counts, self.coverage, self.max_types)
