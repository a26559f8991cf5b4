"""`gpu_sharing.apply()`: enforce the pod's slice from inside a Python entrypoint (no tessera-launch).

Call it first thing, before anything initialises CUDA: it sets the visible devices in
os.environ (CUDA reads them once, at initialisation) and caps PyTorch's memory to the slice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

from ._boot.tessera_torchcap import cap_torch
from .assignment import AssignmentError, SliceAssignment, read_assignment
from .enforce import slice_environment


@dataclass(frozen=True, slots=True)
class Applied:
    assignment: SliceAssignment
    environment: dict[str, str]  # what was set
    memory_cap: str  # what happened to PyTorch's memory, in words


def apply(env: MutableMapping[str, str] | None = None) -> Applied:
    """Read the assignment (downward API), set the environment, cap PyTorch; AssignmentError when there is none."""
    env = os.environ if env is None else env
    a = read_assignment(env)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise AssignmentError("gpu_sharing.apply() ran after CUDA initialised: the visible devices can no longer "
                              "change; call it before the first CUDA use")
    changes = slice_environment(a, env, python_hook=False)
    env.update(changes)
    if a.milli >= 1000 or a.milli == 0:
        cap = "whole GPUs: no memory cap" if a.milli else "no GPU assigned: none visible"
    elif torch is None and importlib.util.find_spec("torch") is None:
        cap = "torch not installed: no memory cap"
    else:
        import torch

        cap = cap_torch(torch, a.fraction)
    return Applied(a, changes, cap)
