from __future__ import annotations

from pathlib import Path

import pytest

from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest
from extender.core.workload import TargetWorkload, TaskType

OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"


def openb(name: str) -> Path:
    path = OPENB / name
    if not path.is_file():
        pytest.skip(f"openb trace not present at {path} (read from ../shared, never committed)")
    return path


def node(name: str, gpus: int = 2, cpu: int = 32_000, mem: int = 128_000, model: str = "T4") -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_model=model)


def pod(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000, mem: int = 1000, models=()) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus,
                      gpu_milli=milli if gpus else 0, gpu_models=frozenset(models))


def cluster(*specs: NodeSpec) -> Cluster:
    return Cluster(specs)


def workload(*types: tuple[TaskType, float]) -> TargetWorkload:
    return TargetWorkload(tuple(types))

# one Ray cluster per session, for tests/raybridge and tests/e2e, shut down after the last test that uses it
from .raybridge.fixtures import pytest_runtest_teardown, ray_nodes  # noqa: E402,F401
