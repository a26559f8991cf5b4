"""The agent's Prometheus metrics: read from the latest reports at scrape time, never stored twice."""

from __future__ import annotations

import threading

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily

from .usage import GpuReport

MIB = 1024 * 1024


class AgentCollector:
    """Holds the last tick's reports (the agent hands them over) and turns them into gauges on scrape."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._reports: tuple[GpuReport, ...] = ()
        self._backend_ok = 0.0

    def update(self, reports: tuple[GpuReport, ...], ok: bool = True) -> None:
        with self._lock:
            self._reports, self._backend_ok = reports, 1.0 if ok else 0.0

    def failed(self) -> None:
        """The last tick could not sample the GPUs: keep the previous figures, flag them stale."""
        with self._lock:
            self._backend_ok = 0.0

    def collect(self):
        with self._lock:
            reports, ok = self._reports, self._backend_ok
        labels = ["node", "gpu", "uuid", "model"]
        fams = {
            "util": GaugeMetricFamily("tessera_gpu_utilization_ratio", "GPU busy share over the last sample (0..1)",
                                      labels=labels),
            "used": GaugeMetricFamily("tessera_gpu_memory_used_bytes", "GPU memory in use", labels=labels),
            "total": GaugeMetricFamily("tessera_gpu_memory_total_bytes", "GPU memory", labels=labels),
            "oob": GaugeMetricFamily("tessera_gpu_out_of_band_memory_bytes",
                                     "memory held by processes of no Tessera assignment", labels=labels),
            "healthy": GaugeMetricFamily("tessera_gpu_healthy", "1 when the GPU is healthy, 0 when withdrawn", labels=labels),
        }
        slice_milli = GaugeMetricFamily("tessera_slice_milli", "milli-GPU assigned to a pod on this GPU",
                                        labels=["node", "gpu", "uuid", "namespace", "pod"])
        slice_used = GaugeMetricFamily("tessera_slice_memory_used_bytes", "GPU memory used by a pod's processes",
                                       labels=["node", "gpu", "uuid", "namespace", "pod"])
        for r in reports:
            d = r.device
            lv = [self.node, str(d.index), d.uuid, d.model]
            fams["util"].add_metric(lv, r.utilization_pct / 100.0)
            fams["used"].add_metric(lv, r.memory_used_mib * MIB)
            fams["total"].add_metric(lv, d.memory_mib * MIB)
            fams["oob"].add_metric(lv, r.oob_memory_mib * MIB)
            fams["healthy"].add_metric(lv, 1.0 if d.healthy else 0.0)
            for s in r.slices:
                ns, _, name = s.pod.partition("/")
                slice_milli.add_metric([self.node, str(d.index), d.uuid, ns, name], s.milli)
                slice_used.add_metric([self.node, str(d.index), d.uuid, ns, name], s.used_mib * MIB)
        up = GaugeMetricFamily("tessera_agent_backend_up", "1 when the last sample of the GPUs succeeded", labels=["node"])
        up.add_metric([self.node], ok)
        yield from fams.values()
        yield slice_milli
        yield slice_used
        yield up


def registry_for(collector: AgentCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
