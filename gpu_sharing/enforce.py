"""What enforcing a slice means inside the container, without LD_PRELOAD.

  * CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES: the assigned GPUs only (by UUID; by PCI bus
    order when only indices are known), so CUDA numbers them 0..n-1 and cannot reach the others;
  * PyTorch's caching allocator capped at the slice's share of memory
    (torch.cuda.set_per_process_memory_fraction), so an allocation beyond it raises OutOfMemoryError
    in this process instead of starving a co-tenant;
  * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = the slice's share of SMs, when an MPS daemon runs on the
    node (its pipe directory has a `control` pipe); otherwise GPUs are time-sliced and compute is
    shared, not divided.
docs/gpu-sharing.md says what holds and what does not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from .assignment import SliceAssignment

DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"
BOOT_DIR = Path(__file__).resolve().parent / "_boot"  # holds the sitecustomize that caps PyTorch in Python children


def mps_running(env: Mapping[str, str]) -> bool:
    return (Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIR) / "control").exists()


def slice_environment(a: SliceAssignment, env: Mapping[str, str], python_hook: bool = True) -> dict[str, str]:
    """The variables to set for a process confined to `a` (only the changed ones)."""
    devices = ",".join(a.devices)
    out = {
        "CUDA_VISIBLE_DEVICES": devices,
        "NVIDIA_VISIBLE_DEVICES": devices,
        "TESSERA_GPU_MILLI": str(a.milli),
        "TESSERA_GPU_MEMORY_FRACTION": f"{a.fraction:.3f}",
    }
    if a.by_index:  # CUDA's default order is fastest-first; NVML's and Kubernetes' is PCI bus order
        out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if mps_running(env) and a.milli:
        out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, math.ceil(a.milli / 10))))
    if python_hook and 0 < a.milli < 1000:
        path = env.get("PYTHONPATH", "")
        out["PYTHONPATH"] = str(BOOT_DIR) + (os.pathsep + path if path else "")
    return out
