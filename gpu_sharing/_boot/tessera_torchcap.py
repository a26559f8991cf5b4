"""Cap PyTorch's CUDA caching allocator at a share of each visible GPU's memory.

The cap is `torch.cuda.set_per_process_memory_fraction(fraction, device)`: an allocation that
would take this process past `fraction` of the device's memory raises torch.OutOfMemoryError.
It is queued with torch's own deferral (`torch.cuda._lazy_call`, as torch.cuda.manual_seed does),
so it takes effect the moment CUDA initialises and importing torch does not initialise CUDA
(forking after `import torch` stays safe). Self-contained: no Tessera import.
"""

from __future__ import annotations


def _cap(torch, fraction: float) -> None:
    for device in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def cap_torch(torch, fraction: float) -> str:
    """Arrange the cap on an imported torch module; returns what was done, in words."""
    if not 0 < fraction < 1:
        return f"fraction {fraction}: whole GPUs, no cap"
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not hasattr(cuda, "set_per_process_memory_fraction"):
        return "this torch has no CUDA memory cap"
    if cuda.is_initialized():
        _cap(torch, fraction)
        return f"capped {cuda.device_count()} device(s) at {fraction:.3f}"
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None:  # a torch without the deferral: cap now, if CUDA is there at all
        if not cuda.is_available():
            return "CUDA not available to torch: no cap"
        _cap(torch, fraction)
        return f"capped {cuda.device_count()} device(s) at {fraction:.3f}"

    def tessera_memory_cap() -> None:
        _cap(torch, fraction)

    tessera_memory_cap.tessera_fraction = fraction
    lazy_call(tessera_memory_cap)
    return f"cap {fraction:.3f} queued for when CUDA initialises"
