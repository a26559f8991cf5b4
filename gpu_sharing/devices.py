"""What a node's GPUs are and what they hold: the data every backend returns and the agent publishes.

A backend (NVML on a GPU node, a static file elsewhere) is a small object with two methods:
`inventory()` for what changes rarely (which GPUs, their memory, health) and `sample()` for what
changes all the time (utilisation, memory used, the processes on each GPU). Everything above the
backend (publishing, metrics, out-of-band accounting) is the same for both, so the static
backend's tests exercise the same code a GPU node runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tessera_contract.report import GpuDevice  # noqa: F401 (the device as the report carries it; backends build it)


class BackendUnavailable(RuntimeError):
    """The backend cannot see any GPU (no driver, no NVML library, unreadable inventory file)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_mib: int
    pod_uid: str = ""  # the pod whose cgroup holds the process; "" when it is no pod's


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    utilization_pct: float
    memory_used_mib: int
    processes: tuple[GpuProcess, ...] = ()


class GpuBackend(Protocol):
    """Where the agent learns about the node's GPUs."""

    name: str

    def inventory(self) -> tuple[GpuDevice, ...]: ...

    def sample(self) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...
