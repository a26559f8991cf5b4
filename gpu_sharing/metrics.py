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
            "loose": GaugeMetricFamily("tessera_gpu_unattributed_memory_bytes",
                                       "GPU memory held by processes in no pod (the extender counts it out-of-band)",
                                       labels=labels),
            "healthy": GaugeMetricFamily("tessera_gpu_healthy", "1 when the GPU is healthy, 0 when withdrawn", labels=labels),
        }
        # per pod UID, not name: the agent reads no pod (it has no API rights); the extender's
        # tessera_gpu_out_of_band_memory_bytes says which of it is outside Tessera's assignments
        pod_used = GaugeMetricFamily("tessera_gpu_pod_memory_used_bytes", "GPU memory used by a pod's processes",
                                     labels=["node", "gpu", "uuid", "pod_uid"])
        for r in reports:
            d = r.device
            lv = [self.node, str(d.index), d.uuid, d.model]
            fams["util"].add_metric(lv, r.utilization_pct / 100.0)
            fams["used"].add_metric(lv, r.memory_used_mib * MIB)
            fams["total"].add_metric(lv, d.memory_mib * MIB)
            fams["loose"].add_metric(lv, r.unattributed_mib * MIB)
            fams["healthy"].add_metric(lv, 1.0 if d.healthy else 0.0)
            for uid, mib in r.pod_memory_mib:
                pod_used.add_metric([self.node, str(d.index), d.uuid, uid], mib * MIB)
        up = GaugeMetricFamily("tessera_agent_backend_up", "1 when the last sample of the GPUs succeeded", labels=["node"])
        up.add_metric([self.node], ok)
        yield from fams.values()
        yield pod_used
        yield up


def registry_for(collector: AgentCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry
