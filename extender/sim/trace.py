"""Reading traces and clusters in the openb CSV format (Alibaba cluster-trace-gpu-v2023).

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
and optionally `gpu_spec` (allowed models joined by `|`) and the times `creation_time`,
`deletion_time`, `scheduled_time` (seconds). A malformed row is an error naming file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..core.model import NodeSpec, PodRequest, RequestError


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod of a trace: its request plus when it arrived and how long it ran (seconds)."""

    request: PodRequest
    creation_time: float = 0.0
    duration: float = 0.0


class TraceError(ValueError):
    pass


def _int(row: dict, key: str, where: str, default: int | None = None) -> int:
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is not None:
            return default
        raise TraceError(f"{where}: column {key!r} is empty")
    try:
        return int(float(raw))
    except ValueError:
        raise TraceError(f"{where}: column {key!r} is not a number: {raw!r}") from None


def _rows(path: Path, required: set[str]):
    try:
        f = open(path, newline="")
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        missing = required - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {', '.join(sorted(missing))}")
        for i, row in enumerate(reader, start=2):
            yield f"{path}:{i}", row


def load_nodes(path: str | Path) -> list[NodeSpec]:
    nodes = []
    for where, row in _rows(Path(path), {"sn", "cpu_milli", "memory_mib", "gpu", "model"}):
        try:
            nodes.append(
                NodeSpec(
                    name=row["sn"].strip(),
                    cpu_milli=_int(row, "cpu_milli", where),
                    memory_mib=_int(row, "memory_mib", where),
                    gpu_count=_int(row, "gpu", where, 0),
                    gpu_model=(row.get("model") or "").strip(),
                )
            )
        except RequestError as e:
            raise TraceError(f"{where}: {e}") from None
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    pods = []
    for where, row in _rows(Path(path), {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}):
        spec = (row.get("gpu_spec") or "").strip()
        count = _int(row, "num_gpu", where, 0)
        try:
            request = PodRequest(
                name=row["name"].strip(),
                cpu_milli=_int(row, "cpu_milli", where, 0),
                memory_mib=_int(row, "memory_mib", where, 0),
                gpu_count=count,
                gpu_milli=_int(row, "gpu_milli", where, 0) if count else 0,
                gpu_models=frozenset(m for m in spec.split("|") if m),
            )
        except RequestError as e:
            raise TraceError(f"{where}: {e}") from None
        created = _int(row, "creation_time", where, 0)
        start = _int(row, "scheduled_time", where, created)
        end = _int(row, "deletion_time", where, start)
        pods.append(TracePod(request, float(created), float(max(1, end - start))))
    return pods
