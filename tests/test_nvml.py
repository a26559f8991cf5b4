"""The NVML backend against the real NVML library: runs on a GPU machine, skips (with the reason) elsewhere."""

import shutil
import subprocess

import pytest

from gpu_sharing.devices import BackendUnavailable, GpuDevice
from gpu_sharing.selfcheck import SMI_FIELDS, compare, parse_smi


@pytest.fixture(scope="module")
def backend():
    from gpu_sharing.nvml import NvmlBackend

    try:
        b = NvmlBackend()
    except BackendUnavailable as e:
        pytest.skip(f"NVML unavailable here: {e}")
    yield b
    b.close()


def test_inventory_matches_nvidia_smi(backend):
    if not shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi not on PATH")
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    devices = backend.inventory()
    assert devices and compare(devices, parse_smi(smi)) == []
    assert all(d.uuid.startswith(("GPU-", "MIG-")) for d in devices)


def test_samples_cover_every_gpu_within_bounds(backend):
    devices, samples = backend.inventory(), backend.sample()
    assert [s.index for s in samples] == [d.index for d in devices]
    for d, s in zip(devices, samples, strict=True):
        assert 0 <= s.utilization_pct <= 100 and 0 <= s.memory_used_mib <= d.memory_mib
        assert all(p.pid > 0 and p.used_mib >= 0 for p in s.processes)


def test_comparison_with_nvidia_smi_names_every_disagreement():
    """The comparison itself, on nvidia-smi's CSV as it prints it (runs everywhere)."""
    smi = parse_smi("0, GPU-aaaa, NVIDIA H200, 143771\n1, GPU-bbbb, NVIDIA H200, 143771\n")
    ours = (GpuDevice(0, "GPU-aaaa", "NVIDIA H200", 143771), GpuDevice(1, "GPU-cccc", "NVIDIA H200", 143770))
    assert compare(ours, smi) == ["GPU 1 uuid: NVML 'GPU-cccc', nvidia-smi 'GPU-bbbb'",
                                  "GPU 1 memory_mib: NVML 143770, nvidia-smi 143771"]
    assert compare(ours[:1], smi) == ["NVML sees 1 GPUs, nvidia-smi 2"]
