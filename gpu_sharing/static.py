"""A backend that reads the node's GPUs from a file: for clusters without NVML, and for tests.

The file is JSON (or YAML when PyYAML is installed and the name ends in .yaml/.yml) and is read
again whenever it changes, so an operator (or a test) can mark a GPU unhealthy or add use:

    {"gpus": [
      {"index": 0, "uuid": "GPU-0a1b...", "model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920,
       "healthy": true,                 # optional, default true
       "health_reason": "",             # optional, why not healthy
       "mig_mode": false,               # optional
       "nvlink_peers": ["GPU-..."],     # optional
       "utilization_pct": 35.0,         # optional, 0..100, default 0
       "memory_used_mib": 1024,         # optional, at most memory_mib, default: the processes' sum
       "processes": [                   # optional: what runs on it
         {"pid": 4242, "used_mib": 1024, "pod_uid": "0b5c9c4e-..."}]}]}   # pod_uid "" or absent: no pod's
"""

from __future__ import annotations

import json
import math
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
            try:
                text = self.path.read_text()
            except OSError as e:  # a directory: "[Errno 21]" named no flag
                raise BackendUnavailable(f"inventory file {self.path}: {e.strerror}") from None
            except UnicodeDecodeError:  # a binary file: the codec's message named neither the flag nor the file
                raise BackendUnavailable(f"inventory file {self.path}: not UTF-8 text (the inventory is JSON or YAML)") from None
            self._parsed = parse_inventory(text, self.path)
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
    listed = body.get("gpus") if isinstance(body, dict) else None
    if not isinstance(listed, list):  # `{}`, `[]` or `{"gpus": 3}`: no GPU entry is at fault, the file's shape is
        raise BackendUnavailable(f'inventory file {where}: wants {{"gpus": [...]}}, a list of GPUs '
                                 "(gpu_sharing/static.py shows one)")
    devices, samples = [], []
    for n, g in enumerate(listed):
        try:
            device, sample = _gpu(g)
        except KeyError as e:
            raise BackendUnavailable(f"inventory file {where}: gpus[{n}] has no {e.args[0]!r}; "
                                     "each GPU needs index, uuid, model, memory_mib") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise BackendUnavailable(f"inventory file {where}: gpus[{n}]: {e}") from None
        devices.append(device)
        samples.append(sample)
    if sorted(d.index for d in devices) != list(range(len(devices))):
        raise BackendUnavailable(f"inventory file {where}: GPU indices must be 0..n-1")
    if any(d.memory_mib <= 0 for d in devices) or any(p.used_mib < 0 for s in samples for p in s.processes):
        raise BackendUnavailable(f"inventory file {where}: memory must be positive, process use not negative")
    seen: dict[str, int] = {}
    for d in devices:  # the extender keys a GPU by its UUID: two GPUs under one would be counted as one
        if d.uuid in seen:
            raise BackendUnavailable(f"inventory file {where}: GPUs {seen[d.uuid]} and {d.index} have the same uuid "
                                     f"{d.uuid!r}")
        seen[d.uuid] = d.index
    order = sorted(range(len(devices)), key=lambda i: devices[i].index)
    return tuple(devices[i] for i in order), tuple(samples[i] for i in order)


def _gpu(g: dict) -> tuple[GpuDevice, GpuSample]:
    """One entry of the file; KeyError for a field it lacks, TypeError or ValueError naming the field that is wrong.

    What the agent serves here is what the extender places pods by, so a value no GPU can have (memory
    `Infinity`, `NaN` utilisation, more memory used than the GPU has, no UUID) is refused, not passed on."""
    if not isinstance(g, dict) or not all(isinstance(p, dict) for p in g.get("processes") or []):
        raise TypeError("each GPU, and each of its processes, is a JSON object")
    procs = tuple(GpuProcess(_whole(p["pid"], "pid"), _whole(p["used_mib"], "used_mib"), str(p.get("pod_uid") or ""))
                  for p in g.get("processes") or [])
    device = GpuDevice(
        index=_whole(g["index"], "index"), uuid=_text(g["uuid"], "uuid"), model=_text(g["model"], "model"),
        memory_mib=_whole(g["memory_mib"], "memory_mib"), mig_mode=_bool(g.get("mig_mode", False), "mig_mode"),
        healthy=_bool(g.get("healthy", True), "healthy"), health_reason=str(g.get("health_reason", "")),
        nvlink_peers=tuple(str(p) for p in g.get("nvlink_peers") or ()),
    )
    used = _whole(g.get("memory_used_mib", sum(p.used_mib for p in procs)), "memory_used_mib")
    if used > device.memory_mib:
        raise ValueError(f"memory used ({used} MiB) is more than memory_mib ({device.memory_mib})")
    utilization = _number(g.get("utilization_pct", 0.0), "utilization_pct")
    if not 0 <= utilization <= 100:
        raise ValueError(f"utilization_pct must be 0..100, got {utilization:g}")
    return device, GpuSample(device.index, utilization, used, procs)


def _number(value, what: str) -> float:
    """A finite number: float() takes "nan", and JSON's NaN and Infinity, which no count or percentage is."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {str(value)[:40]!r}") from None
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {str(value)[:40]}")
    return number


def _whole(value, what: str) -> int:
    return int(_number(value, what))


def _text(value, what: str) -> str:
    if value is None or not str(value).strip():
        raise ValueError(f"{what} must not be empty")
    return str(value)


def _bool(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"{what} must be true or false, got {value!r}")
