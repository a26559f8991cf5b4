"""Queueing delay per pod class: the mean over all pods hides the pods that wait longest.

On 100 openb nodes an 8-GPU pod waits for a whole node to drain while slices take each freed
piece, so its waits are hours where a slice's are minutes; one figure over all pods (8152 of
them, 44 of 8 GPUs) shows neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..core.model import MILLI_PER_GPU, PodRequest

# the classes in report order; any other GPU count gets its own "<n>gpu" class after these
CLASSES = ("cpu", "slice", "1gpu", "2gpu", "4gpu", "8gpu")


def pod_class(request: PodRequest) -> str:
    """cpu (no GPU), slice (part of one GPU, under 1000 milli), or <n>gpu (n whole GPUs), by what the pod asked."""
    if request.gpu_count == 0:
        return "cpu"
    if request.gpu_milli < MILLI_PER_GPU:
        return "slice"
    return f"{request.gpu_count}gpu"


def class_order(names: Iterable[str]) -> list[str]:
    names = set(names)
    known = [c for c in CLASSES if c in names]
    return known + sorted(names - set(CLASSES), key=lambda c: (len(c), c))


def percentile(sorted_values: list[float], q: float) -> float:
    """The value at rank round(q x (n-1)) of the sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


@dataclass(frozen=True)
class WaitStats:
    """Waits of one class of pods, in seconds."""

    pods: int
    mean_s: float
    p50_s: float
    p99_s: float
    max_s: float

    @classmethod
    def of(cls, waits: Iterable[float]) -> WaitStats:
        values = sorted(waits)
        n = len(values)
        return cls(n, sum(values) / n if n else 0.0, percentile(values, 0.5), percentile(values, 0.99),
                   values[-1] if values else 0.0)

    def as_json(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def waits_by_class(classes: Iterable[str], waits: Iterable[float]) -> dict[str, WaitStats]:
    """class -> the statistics of its pods' waits, in report order (classes with no pod are left out)."""
    grouped: dict[str, list[float]] = {}
    for c, w in zip(classes, waits, strict=True):
        grouped.setdefault(c, []).append(w)
    return {c: WaitStats.of(grouped[c]) for c in class_order(grouped)}
