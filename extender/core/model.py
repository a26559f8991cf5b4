"""Plain data: what a node offers, what a pod asks for, and what it was given.

Milli-GPU is the unit of GPU share throughout: 1000 milli is one whole GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Both are the contract's (MILLI_PER_GPU is what tessera.dev/gpu-milli counts in; RequestError the one error
# a caller's invalid input raises, in the extender as in the agent and the bridge): re-exported for the core.
from tessera_contract import MILLI_PER_GPU, RequestError  # noqa: F401


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node's allocatable capacity. Every GPU of a node has the same model (as in openb)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    gpu_memory_mib: int = 0  # per GPU; 0 when unknown
    # per GPU, milli that placement must not hand out: memory held out-of-band (processes that
    # belong to no Tessera assignment) or 1000 for an unhealthy GPU; () when nothing is withheld
    gpu_reserved: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise RequestError("a node needs a name")
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_count < 0:
            raise RequestError(f"node {self.name}: capacities must not be negative")
        if len(self.gpu_reserved) > self.gpu_count or any(not 0 <= r <= MILLI_PER_GPU for r in self.gpu_reserved):
            raise RequestError(f"node {self.name}: gpu_reserved must give 0..1000 milli for at most {self.gpu_count} GPUs")

    def gpu_open(self, g: int) -> int:
        """Milli of GPU `g` that placement may hand out when no pod holds any of it."""
        return MILLI_PER_GPU - (self.gpu_reserved[g] if g < len(self.gpu_reserved) else 0)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for.

    `gpu_milli` is the share of *each* GPU: 1..999 is a fractional slice of one GPU, 1000 means
    whole GPUs (`gpu_count` of them). `gpu_models` empty means any model is fine.
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_count < 0:
            raise RequestError(f"pod {self.name}: requests must not be negative")
        if self.gpu_count == 0:
            if self.gpu_milli not in (0, MILLI_PER_GPU):
                raise RequestError(f"pod {self.name}: gpu_milli {self.gpu_milli} without a GPU count")
            object.__setattr__(self, "gpu_milli", 0)
        elif not 1 <= self.gpu_milli <= MILLI_PER_GPU:
            raise RequestError(f"pod {self.name}: gpu_milli must be 1..1000, got {self.gpu_milli}")
        elif self.gpu_count > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise RequestError(
                f"pod {self.name}: a slice (gpu_milli < 1000) is one GPU; {self.gpu_count} GPUs must be whole"
            )

    @property
    def key(self) -> tuple:
        """Everything placement depends on; pods with equal keys are placed alike."""
        return (self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli, self.gpu_models)

    @property
    def is_slice(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_demand(self) -> int:
        """Total milli-GPU asked for."""
        return self.gpu_count * self.gpu_milli

    def shape(self) -> str:
        """The GPU shape used by the Clustering policy: 'cpu', 'slice' or the GPU count."""
        if self.gpu_count == 0:
            return "cpu"
        return "slice" if self.is_slice else str(self.gpu_count)


@dataclass(frozen=True, slots=True)
class AccountedRequest(PodRequest):
    """A pod's request as the placement policy accounts it; `Placer.request_for` is the one place that makes it.

    Stock Kubernetes counts a slice as a whole GPU (`k8s-default`), so the same pod asks for
    different capacity under different policies. The server once skipped that transform at one of
    its 17 call sites and admitted a slice the simulator refused. Every `Placer` method that judges
    or places takes this type and refuses a bare `PodRequest` with a TypeError, so a missed call
    fails where it is made instead of placing a pod by the wrong arithmetic.
    """


@dataclass(frozen=True, slots=True)
class Assignment:
    """The placement of one pod: a node and, per GPU index, the milli taken from it."""

    pod: str
    node: str
    gpus: tuple[int, ...]
    milli: int  # per GPU in `gpus`
    cpu_milli: int = 0
    memory_mib: int = 0
    shape: str = ""

    @property
    def gpu_demand(self) -> int:
        return len(self.gpus) * self.milli
