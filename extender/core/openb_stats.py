"""The openb trace's aggregates, embedded: the simulator generates its default cluster from them, and the
extender takes their task mix as its workload prior until it has seen pods of its own.

`data/openb_default_stats.json` holds node types, pod request types with their counts and duration
quantiles (tools/derive_openb_stats.py makes it). It lives in the core, not the simulator, because
the server needs the prior too and the server must not import the simulator (tests/test_import_graph.py).
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from importlib import resources

from .workload import TargetWorkload, TaskType


@cache
def stats() -> dict:
    return json.loads(resources.files(__package__).joinpath("data/openb_default_stats.json").read_text())


def default_workload() -> TargetWorkload:
    """The openb default trace's task mix: the prior until the extender has seen pods of its own."""
    counts: Counter[TaskType] = Counter()
    for t in stats()["pod_types"]:
        counts[TaskType(t["cpu_milli"], t["gpu_milli"] if t["gpu_count"] else 0, t["gpu_count"])] += t["count"]
    return TargetWorkload.from_counts(counts)
