"""Who holds what on each GPU: Tessera's slices, and the memory nobody scheduled (out-of-band).

A process counts toward a slice when its pod holds a Tessera assignment that covers that GPU;
everything else on the GPU (a host process, a pod that Tessera did not place, a Tessera pod
straying onto a GPU it was not given) is out-of-band, and the extender withholds it from
placement. Memory NVML attributes to no process (the driver's own reservation) is not counted:
it is there on every GPU from the start and is part of what `memory_mib` cannot give.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from extender.kube.contract import ASSIGNMENT_ANNOTATION

from .devices import GpuDevice, GpuSample

TERMINAL_PHASES = ("Succeeded", "Failed")
OOB_STEP_MIB = 256  # out-of-band memory is published rounded up to this, so small drifts do not republish


@dataclass(frozen=True, slots=True)
class Slice:
    """One pod's Tessera assignment on this node."""

    uid: str
    pod: str  # namespace/name
    gpus: tuple[int, ...]
    milli: int


@dataclass(frozen=True, slots=True)
class SliceUse:
    pod: str
    gpu: int
    milli: int
    used_mib: int


@dataclass(frozen=True, slots=True)
class GpuReport:
    device: GpuDevice
    utilization_pct: float
    memory_used_mib: int
    oob_memory_mib: int  # exact, for metrics
    slices: tuple[SliceUse, ...]

    @property
    def oob_published_mib(self) -> int:
        """Out-of-band memory rounded up to OOB_STEP_MIB (0 stays 0): what the annotation carries."""
        return math.ceil(self.oob_memory_mib / OOB_STEP_MIB) * OOB_STEP_MIB


def slices_on_node(pods: list[dict]) -> tuple[Slice, ...]:
    """The live pods' Tessera assignments (pods as the API serves them, camelCase dicts)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        raw = (meta.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
        if not raw:
            continue
        try:
            body = json.loads(raw)
            out.append(Slice(str(meta.get("uid", "")), f"{meta.get('namespace', 'default')}/{meta.get('name', '')}",
                             tuple(int(g) for g in body["gpus"]), int(body["milli"])))
        except (ValueError, KeyError, TypeError):
            continue  # the extender reports unreadable assignments; here they simply hold nothing
    return tuple(out)


def gpu_reports(devices: tuple[GpuDevice, ...], samples: tuple[GpuSample, ...],
                slices: tuple[Slice, ...]) -> tuple[GpuReport, ...]:
    by_index = {s.index: s for s in samples}
    reports = []
    for d in devices:
        sample = by_index.get(d.index)
        here = [s for s in slices if d.index in s.gpus]
        owners = {s.uid for s in here}
        used_by: dict[str, int] = {}
        oob = 0
        for p in sample.processes if sample else ():
            if p.pod_uid and p.pod_uid in owners:
                used_by[p.pod_uid] = used_by.get(p.pod_uid, 0) + p.used_mib
            else:
                oob += p.used_mib
        reports.append(GpuReport(
            device=d, utilization_pct=sample.utilization_pct if sample else 0.0,
            memory_used_mib=sample.memory_used_mib if sample else 0, oob_memory_mib=oob,
            slices=tuple(SliceUse(s.pod, d.index, s.milli, used_by.get(s.uid, 0)) for s in sorted(here, key=lambda s: s.pod)),
        ))
    return tuple(reports)
