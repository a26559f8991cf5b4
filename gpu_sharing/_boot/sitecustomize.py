"""Runs at the start of every Python child of tessera-launch (its directory leads PYTHONPATH).

It waits for `import torch` and then caps PyTorch's memory at TESSERA_GPU_MEMORY_FRACTION
(tessera_torchcap.py). It imports nothing heavy itself, and afterwards runs the sitecustomize this
one shadows (a distribution's own), so the interpreter behaves as before in every other way.
"""

import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when torch is about to be imported, wraps its loader to cap it afterwards."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, fraction = spec.loader, self.fraction
        original = loader.exec_module

        def exec_module(module):
            original(module)
            from tessera_torchcap import cap_torch

            done = cap_torch(module, fraction)
            if os.environ.get("TESSERA_LAUNCH_VERBOSE"):
                print(f"tessera-launch: torch: {done}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


def _install() -> None:
    try:
        fraction = float(os.environ.get("TESSERA_GPU_MEMORY_FRACTION", ""))
    except ValueError:
        return
    if 0 < fraction < 1 and os.environ.get("TESSERA_TORCH_CAP", "1") != "0" and "torch" not in sys.modules:
        sys.meta_path.insert(0, _TorchWatcher(fraction))


def _chain() -> None:
    """Import the sitecustomize this file shadows, if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    for entry in rest:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_install()
_chain()
