"""What the node's GPUs hold, per pod UID: the agent measures, the extender judges.

The agent maps each GPU process to the pod whose cgroup holds it (gpu_sharing/cgroups.py) and
reports the memory per pod UID, plus the memory of processes in no pod. It does not decide what
is out-of-band: that needs the pods' assignments and the key that signs them, which only the
extender holds (extender/kube/agents.py). A compromised node can lie about its own GPUs, as it
always could; it cannot make another pod's memory count as in-band anywhere but on itself.
Memory NVML attributes to no process (the driver's own reservation) is not counted: it is there
on every GPU from the start and is part of what `memory_mib` cannot give.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_contract.report import GpuUse, encode_report

from .devices import GpuDevice, GpuSample


@dataclass(frozen=True, slots=True)
class GpuReport:
    device: GpuDevice
    utilization_pct: float
    memory_used_mib: int
    pod_memory_mib: tuple[tuple[str, int], ...]  # (pod UID, MiB its processes hold), sorted by UID
    unattributed_mib: int  # processes in no pod (host daemons, users on the node)


def gpu_reports(devices: tuple[GpuDevice, ...], samples: tuple[GpuSample, ...]) -> tuple[GpuReport, ...]:
    by_index = {s.index: s for s in samples}
    reports = []
    for d in devices:
        sample = by_index.get(d.index)
        per_pod: dict[str, int] = {}
        loose = 0
        for p in sample.processes if sample else ():
            if p.pod_uid:
                per_pod[p.pod_uid] = per_pod.get(p.pod_uid, 0) + p.used_mib
            else:
                loose += p.used_mib
        reports.append(GpuReport(d, sample.utilization_pct if sample else 0.0, sample.memory_used_mib if sample else 0,
                                 tuple(sorted(per_pod.items())), loose))
    return tuple(reports)


def report_document(node: str, reports: tuple[GpuReport, ...]) -> bytes:
    """The JSON the agent serves at /report: the contract's encoding (tessera_contract/report.py), which the extender
    decodes distrustfully."""
    return encode_report(node, tuple(GpuUse(r.device, r.pod_memory_mib, r.unattributed_mib, r.memory_used_mib)
                                     for r in reports))
