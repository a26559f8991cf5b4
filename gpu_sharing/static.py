"""A backend that reads the node's GPUs from a file: for clusters without NVML, and for tests.

The file is JSON (or YAML when PyYAML is installed and the name ends in .yaml/.yml) and is read
again whenever it changes, so an operator (or a test) can mark a GPU unhealthy or add use:

    {"gpus": [
      {"index": 0, "uuid": "GPU-0a1b...", "model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920,
       "healthy": true,                 # optional, default true
       "health_reason": "",             # optional, why not healthy
       "mig_mode": false,               # optional
       "nvlink_peers": ["GPU-..."],     # optional
       "utilization_pct": 35.0,         # optional, default 0
       "memory_used_mib": 1024,         # optional, default: the processes' sum
       "processes": [                   # optional: what runs on it
         {"pid": 4242, "used_mib": 1024, "pod_uid": "0b5c9c4e-..."}]}]}   # pod_uid "" or absent: no pod's
"""

from __future__ import annotations

import json
from pathlib import Path

from .devices import BackendUnavailable, GpuDevice, GpuProcess, GpuSample


class StaticBackend:
    name = "static"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._parsed: tuple[tuple[GpuDevice, ...], tuple[GpuSample, ...]] = ((), ())
        self._load()  # a bad file fails at start, in words

    def inventory(self) -> tuple[GpuDevice, ...]:
        return self._load()[0]

    def sample(self) -> tuple[GpuSample, ...]:
        return self._load()[1]

    def close(self) -> None:
        pass

    def _load(self):
        try:
            st = self.path.stat()
        except OSError as e:
            raise BackendUnavailable(f"inventory file {self.path}: {e.strerror}") from None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._parsed = parse_inventory(self.path.read_text(), self.path)
            self._stamp = stamp
        return self._parsed


def parse_inventory(text: str, where: Path | str = "inventory") -> tuple[tuple[GpuDevice, ...], tuple[GpuSample, ...]]:
    """The devices and the sample a file describes; BackendUnavailable in words when it is malformed."""
    try:
        if str(where).endswith((".yaml", ".yml")):
            import yaml

            body = yaml.safe_load(text)
        else:
            body = json.loads(text)
    except Exception as e:  # json.JSONDecodeError, or yaml.YAMLError (which is no ValueError)
        raise BackendUnavailable(f"inventory file {where}: not valid JSON/YAML: {e}") from None
    try:
        listed = body["gpus"]
        if not isinstance(listed, list):
            raise TypeError("gpus must be a list")
        devices, samples = [], []
        for g in listed:
            procs = tuple(GpuProcess(int(p["pid"]), int(p["used_mib"]), str(p.get("pod_uid") or ""))
                          for p in g.get("processes") or [])
            device = GpuDevice(
                index=int(g["index"]), uuid=str(g["uuid"]), model=str(g["model"]), memory_mib=int(g["memory_mib"]),
                mig_mode=_bool(g.get("mig_mode", False)), healthy=_bool(g.get("healthy", True)),
                health_reason=str(g.get("health_reason", "")), nvlink_peers=tuple(str(p) for p in g.get("nvlink_peers") or ()),
            )
            used = int(g.get("memory_used_mib", sum(p.used_mib for p in procs)))
            devices.append(device)
            samples.append(GpuSample(device.index, float(g.get("utilization_pct", 0.0)), used, procs))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BackendUnavailable(f"inventory file {where}: each GPU needs index, uuid, model, memory_mib ({e!r})") from None
    if sorted(d.index for d in devices) != list(range(len(devices))):
        raise BackendUnavailable(f"inventory file {where}: GPU indices must be 0..n-1")
    if any(d.memory_mib <= 0 for d in devices) or any(p.used_mib < 0 for s in samples for p in s.processes):
        raise BackendUnavailable(f"inventory file {where}: memory must be positive, process use not negative")
    order = sorted(range(len(devices)), key=lambda i: devices[i].index)
    return tuple(devices[i] for i in order), tuple(samples[i] for i in order)


def _bool(value) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"not a boolean: {value!r}")
