"""The embedded default workload: an openb-like cluster and trace generated from statistics.

`data/openb_default_stats.json` holds aggregates of the openb trace (node types, pod request
types with their counts, duration quantiles; see tools/derive_openb_stats.py). From them we
generate, with a fixed seed, a cluster of the same node mix and a trace whose pods are drawn from
the request-type distribution, both at `SCALE` of openb's size. Only the pods' order matters to time mode,
so creation times are a unit-rate sequence.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import cache
from importlib import resources

from ..core.model import NodeSpec, PodRequest
from ..core.workload import TaskType, Workload
from .trace import TracePod

GENERATION_SEED = 2023
TRACE_NAME = "embedded-openb"
#: half of openb's cluster and trace, same mix: `tessera simulate` with no arguments runs every
#: policy in both settings in under a minute on 2 cores (the full openb files are for bench/)
SCALE = 0.5


@cache
def stats() -> dict:
    return json.loads(resources.files(__package__).joinpath("data/openb_default_stats.json").read_text())


def default_nodes(scale: float = SCALE) -> list[NodeSpec]:
    nodes = []
    for t in stats()["node_types"]:
        for _ in range(max(1, round(t["count"] * scale))):
            nodes.append(
                NodeSpec(
                    name=f"node-{len(nodes):04d}", cpu_milli=t["cpu_milli"], memory_mib=t["memory_mib"],
                    gpu_count=t["gpu_count"], gpu_model=t["gpu_model"],
                )
            )
    return nodes


def _duration(rng: random.Random, quantiles: list[float]) -> float:
    """Inverse-CDF draw from the quantile table, interpolating linearly between quantiles."""
    x = rng.random() * (len(quantiles) - 1)
    i = int(x)
    if i >= len(quantiles) - 1:
        return quantiles[-1]
    return quantiles[i] + (x - i) * (quantiles[i + 1] - quantiles[i])


def default_trace(seed: int = GENERATION_SEED, scale: float = SCALE) -> list[TracePod]:
    s = stats()
    rng = random.Random(seed)
    types = s["pod_types"]
    weights = [t["count"] for t in types]
    quantiles = s["duration_quantiles_s"]
    pods = []
    for i, t in enumerate(rng.choices(types, weights=weights, k=round(s["pods"] * scale))):
        request = PodRequest(
            name=f"pod-{i:05d}", cpu_milli=t["cpu_milli"], memory_mib=t["memory_mib"],
            gpu_count=t["gpu_count"], gpu_milli=t["gpu_milli"],
        )
        pods.append(TracePod(request, creation_time=float(i), duration=max(1.0, _duration(rng, quantiles))))
    return pods


def task_mix() -> Workload:
    """The openb default trace's task mix: `tessera serve` starts its extender from it (the prior until
    the extender has learned the mix of the pods it sees)."""
    counts: Counter[TaskType] = Counter()
    for t in stats()["pod_types"]:
        counts[TaskType(t["cpu_milli"], t["gpu_milli"] if t["gpu_count"] else 0, t["gpu_count"])] += t["count"]
    return Workload.from_counts(counts)
