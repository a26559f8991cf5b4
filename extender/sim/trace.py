"""Reading traces and clusters in the openb CSV format (Alibaba cluster-trace-gpu-v2023).

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
and optionally `gpu_spec` (allowed models joined by `|`) and the times `creation_time`,
`deletion_time`, `scheduled_time` (seconds). A malformed row is an error naming file and line: a number that
is not whole, a row with more or fewer fields than the header, a pod name given twice, a deletion before the
start, a `gpu_milli` without `num_gpu`. Time mode needs every pod's `deletion_time` (`TracePod.timed`).
An empty `gpu_spec` means any model; so do `nan`, `none` and `null`, which pandas and other tools
write for an empty cell (read as a model name, they made those pods unplaceable without a word).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.cluster import never_fits
from ..core.model import NodeSpec, PodRequest, RequestError


@dataclass(frozen=True, slots=True)
class TracePod:
    """A pod of a trace: its request plus when it arrived and how long it ran (seconds)."""

    request: PodRequest
    creation_time: float = 0.0
    duration: float = 0.0
    timed: bool = True  # the row gave a deletion time: time mode needs it (openb's multigpu traces give none)


class TraceError(ValueError):
    pass


NO_CONSTRAINT = frozenset({"", "nan", "none", "null", "na", "n/a"})  # empty cells as tools write them


def gpu_models(spec: str) -> frozenset[str]:
    """The models a `gpu_spec` cell allows; empty (any model) for an empty cell however it was written."""
    return frozenset(m.strip() for m in spec.split("|") if m.strip().lower() not in NO_CONSTRAINT)


def unmeetable(pods: Iterable[TracePod], nodes: Iterable[NodeSpec]) -> Counter[str]:
    """GPU pods whose models no GPU node has: 'A|B' -> how many. They can never be placed, whatever the policy."""
    have = {n.gpu_model for n in nodes if n.gpu_count}
    out: Counter[str] = Counter()
    for p in pods:
        r = p.request
        if r.gpu_count and r.gpu_models and not r.gpu_models & have:
            out["|".join(sorted(r.gpu_models))] += 1
    return out


def fit_nowhere(pods: Iterable[TracePod], nodes: Iterable[NodeSpec]) -> list[TracePod]:
    """Pods that no node could hold even were it empty: more GPUs, CPU or memory than any node has (models
    aside: `unmeetable` reports those). Judged once per request shape and node kind (openb: 8152 pods, 1213 nodes)."""
    kinds = list({(n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_model): n for n in nodes}.values())
    verdicts: dict[tuple, bool] = {}
    out = []
    for p in pods:
        r = p.request
        key = (r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli)
        got = verdicts.get(key)
        if got is None:
            anywhere = replace(r, gpu_models=frozenset())
            got = verdicts[key] = all(never_fits(anywhere, kind) for kind in kinds)
        if got:
            out.append(p)
    return out


def _int(row: dict, key: str, where: str, default: int | None = None) -> int:
    """A whole number ("12000", or "12000.0" as pandas writes it); a fraction, inf or nan is refused, not truncated
    (a `num_gpu` of 0.5 read as 0 made a GPU pod CPU-only without a word)."""
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is not None:
            return default
        raise TraceError(f"{where}: column {key!r} is empty")
    try:
        value = float(raw)
        if value != int(value):
            raise ValueError
    except (ValueError, OverflowError):  # int(inf) overflows; nan != nan
        raise TraceError(f"{where}: column {key!r} is not a whole number: {raw[:40]!r}") from None
    return int(value)


MAX_NODE_GPUS = 256  # the contract's bound on one node (tessera_contract.keys.MAX_GPUS_PER_NODE)


def _gpus(row: dict, where: str) -> int:
    """A node's GPU count, 0..256: 10^12 made packing mode resample towards an unreachable target for good."""
    count = _int(row, "gpu", where, 0)
    if not 0 <= count <= MAX_NODE_GPUS:
        raise TraceError(f"{where}: column 'gpu' is {count}; a node has 0 to {MAX_NODE_GPUS} GPUs")
    return count


def _rows(path: Path, required: set[str]):
    """Each row with where it is; a row with fewer or more fields than the header is refused (csv fills or drops
    them silently). `utf-8-sig`: a UTF-8 file saved with a byte-order mark (Excel's "CSV UTF-8") reads as one."""
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    with f:
        try:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            if not fields:  # an empty file read as "missing columns" every one of them
                raise TraceError(f"{path} is empty (a CSV starts with its header row)")
            missing = required - set(fields)
            if missing:
                raise TraceError(f"{path}: missing columns {', '.join(sorted(missing))}")
            for i, row in enumerate(reader, start=2):
                if None in row or None in row.values():
                    got = len(fields) - sum(v is None for v in row.values()) + len(row.get(None) or ())
                    raise TraceError(f"{path}:{i}: {got} fields, the header has {len(fields)}")
                yield f"{path}:{i}", row
        except UnicodeDecodeError as e:
            raise TraceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None


def load_nodes(path: str | Path) -> list[NodeSpec]:
    nodes = []
    for where, row in _rows(Path(path), {"sn", "cpu_milli", "memory_mib", "gpu", "model"}):
        try:
            nodes.append(
                NodeSpec(
                    name=row["sn"].strip(),
                    cpu_milli=_int(row, "cpu_milli", where),
                    memory_mib=_int(row, "memory_mib", where),
                    gpu_count=_gpus(row, where),
                    gpu_model=(row.get("model") or "").strip(),
                )
            )
        except RequestError as e:
            raise TraceError(f"{where}: {e}") from None
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    pods = []
    first: dict[str, str] = {}  # pod name -> where it was first seen: a replay places each name once
    for where, row in _rows(Path(path), {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}):
        spec = (row.get("gpu_spec") or "").strip()
        count = _int(row, "num_gpu", where, 0)
        milli = _int(row, "gpu_milli", where, 0)
        if milli and not count:
            raise TraceError(f"{where}: gpu_milli {milli} with num_gpu 0: give num_gpu 1 for a slice (or gpu_milli 0)")
        name = row["name"].strip()
        if name in first:
            raise TraceError(f"{where}: pod {name[:60]!r} again (first at {first[name]}); pod names must be unique")
        first[name] = where
        try:
            request = PodRequest(
                name=name,
                cpu_milli=_int(row, "cpu_milli", where, 0),
                memory_mib=_int(row, "memory_mib", where, 0),
                gpu_count=count,
                gpu_milli=milli if count else 0,
                gpu_models=gpu_models(spec),
            )
        except RequestError as e:
            raise TraceError(f"{where}: {e}") from None
        created = _int(row, "creation_time", where, 0)
        start = _int(row, "scheduled_time", where, created)
        timed = bool((row.get("deletion_time") or "").strip())
        end = _int(row, "deletion_time", where, start)
        if end < start:
            raise TraceError(f"{where}: deletion_time {end} is before the pod started ({start})")
        pods.append(TracePod(request, float(created), float(max(1, end - start)), timed))
    return pods
