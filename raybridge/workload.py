"""What a training entrypoint returns, and how the trainer loads it.

The entrypoint (`module:function`, given the job's config dict) builds a `Workload`. The data
function must be deterministic in (step, sample index): every step has one global batch, and
each of `world` trainers takes its share of it. That is what lets the job shrink and grow without
changing the training maths: the averaged gradient of a step is the same whatever the world size,
so the loss curve across a failure continues the curve without one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    model: Any  # torch.nn.Module
    optimizer: Any  # torch.optim.Optimizer over model.parameters()
    batch: Callable[[int, int, int], Any]  # (step, first, stop) -> samples [first, stop) of step's global batch
    loss_sum: Callable[[Any, Any], Any]  # (model, samples) -> summed (not averaged) loss, a scalar tensor
    global_batch: int


def load_entrypoint(entrypoint: str) -> Callable[[dict], Workload]:
    """Import `module:function`; ValueError in words when it is not there."""
    module_name, _, func_name = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"entrypoint {entrypoint!r}: cannot import {module_name}: {e}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"entrypoint {entrypoint!r}: {module_name} has no function {func_name}")
    return func


def shard(global_batch: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's contiguous share [first, stop) of a global batch; shares differ by at most one sample."""
    base, extra = divmod(global_batch, world)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)
