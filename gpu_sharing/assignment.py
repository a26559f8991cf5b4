"""The pod's GPU assignment as the container sees it: through the downward API.

Three places, first found wins:
  1. env TESSERA_ASSIGNMENT: the `tessera.dev/gpu-assignment` annotation's JSON
     (env `valueFrom.fieldRef.fieldPath: metadata.annotations['tessera.dev/gpu-assignment']`), or
     TESSERA_GPU_ASSIGNMENT, the name the Ray pods give it (manifests/examples/ray-training-job.yaml):
     read under that name only as the visible devices, a 250-milli slice ran uncapped as 1000;
  2. a downward API volume file of the pod's annotations: $TESSERA_PODINFO, default
     /etc/podinfo/annotations (`fieldPath: metadata.annotations`);
  3. env TESSERA_VISIBLE_DEVICES (the `tessera.dev/visible-devices` annotation) with TESSERA_GPU_MILLI
     (default 1000: whole GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# the shared contract imports only the standard library: a launch loads no kubernetes client
from tessera_contract import ASSIGNMENT_ANNOTATION, RequestError, decode_assignment, decode_visible_devices

DEFAULT_PODINFO = "/etc/podinfo/annotations"


class AssignmentError(ValueError):
    """No assignment to enforce, or one that cannot be read."""


@dataclass(frozen=True, slots=True)
class SliceAssignment:
    devices: tuple[str, ...]  # GPU UUIDs, or indices when the node's UUIDs were unknown; () for a CPU-only pod
    milli: int  # per GPU: 1..999 a slice of one GPU, 1000 whole GPUs; 0 with no GPU
    source: str  # where it was read, for messages

    def __post_init__(self) -> None:
        if not self.devices and self.milli == 0:
            return  # Tessera placed a CPU-only pod: it is given no GPU, so it sees none
        if not self.devices or any(not d for d in self.devices):
            raise AssignmentError(f"{self.source}: no GPU assigned")
        if not 1 <= self.milli <= 1000:
            raise AssignmentError(f"{self.source}: milli must be 1..1000, got {self.milli}")
        if self.milli < 1000 and len(self.devices) != 1:
            raise AssignmentError(f"{self.source}: a slice is one GPU, got {len(self.devices)}")

    @property
    def fraction(self) -> float:
        return self.milli / 1000

    @property
    def by_index(self) -> bool:
        return bool(self.devices) and all(d.isdigit() for d in self.devices)


def from_annotation(raw: str, source: str) -> SliceAssignment:
    """The annotation's GPUs (their UUIDs, or their indexes as text when the node's UUIDs were unknown) and milli."""
    try:
        a = decode_assignment(raw, source)
    except RequestError as e:
        raise AssignmentError(str(e)) from None
    return SliceAssignment(a.uuids or tuple(str(g) for g in a.gpus), a.milli, source)


_ESCAPE = re.compile(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[abfnrtv\\"\'])')
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}


def _unquote(text: str) -> str:
    """A Go-quoted string (strconv.Quote, as kubelet writes downward API files) back to its value."""
    return _ESCAPE.sub(lambda m: _SIMPLE.get(m.group(1)) or chr(int(m.group(1)[1:], 16)), text)


def parse_podinfo(text: str) -> dict[str, str]:
    """A downward API annotations file: one `key="quoted value"` per line."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and len(value) >= 2 and value[0] == value[-1] == '"':
            out[key.strip()] = _unquote(value[1:-1])
    return out


def read_assignment(env: Mapping[str, str]) -> SliceAssignment:
    """The assignment to enforce, from the first source present; AssignmentError in words when none is."""
    for name in ("TESSERA_ASSIGNMENT", "TESSERA_GPU_ASSIGNMENT"):
        if env.get(name):
            return from_annotation(env[name], f"env {name}")
    path = Path(env.get("TESSERA_PODINFO") or DEFAULT_PODINFO)
    if path.is_file():
        raw = parse_podinfo(path.read_text()).get(ASSIGNMENT_ANNOTATION)
        if raw:
            return from_annotation(raw, str(path))
    if env.get("TESSERA_VISIBLE_DEVICES"):
        try:
            milli = int(env.get("TESSERA_GPU_MILLI") or 1000)
        except ValueError:
            raise AssignmentError(f"TESSERA_GPU_MILLI must be a whole number, got {env['TESSERA_GPU_MILLI']!r}") from None
        try:
            devices = decode_visible_devices(env["TESSERA_VISIBLE_DEVICES"], "env TESSERA_VISIBLE_DEVICES")
        except RequestError as e:
            raise AssignmentError(str(e)) from None
        return SliceAssignment(devices, milli, "env TESSERA_VISIBLE_DEVICES")
    raise AssignmentError(f"no Tessera assignment: set TESSERA_ASSIGNMENT or TESSERA_VISIBLE_DEVICES from the pod's "
                          f"annotations, or mount them at {path} (downward API); was the pod bound by Tessera?")
