"""`tessera agent`: the DaemonSet that tells Kubernetes what the node's GPUs are and hold.

Every interval: ask the backend (NVML, or a static file) for the GPUs and their processes, list
the pods on this node to tell Tessera's slices from out-of-band use, patch the Node when
anything the extender cares about changed, and refresh the Prometheus gauges.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from .devices import GpuBackend
from .metrics import AgentCollector
from .publish import NodePublisher
from .usage import GpuReport, gpu_reports, slices_on_node

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tick:
    reports: tuple[GpuReport, ...]
    patched: tuple[str, ...]


class Agent:
    def __init__(self, backend: GpuBackend, api, node_name: str, collector: AgentCollector | None = None) -> None:
        self.backend, self.api, self.node_name = backend, api, node_name
        self.publisher = NodePublisher(api, node_name)
        self.collector = collector or AgentCollector(node_name)
        self._warned: set[str] = set()  # UUIDs already reported unhealthy

    def pods_here(self) -> list[dict]:
        # resource_version="0": served from the apiserver's watch cache, not etcd, as kubelets read:
        # thousands of agents listing every interval must not reach the storage (a watch would be
        # cheaper still; a few seconds of staleness only delays an out-of-band verdict by a tick)
        resp = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node_name}",
                                                    resource_version="0", _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def tick(self) -> Tick:
        devices, samples = self.backend.inventory(), self.backend.sample()
        reports = gpu_reports(devices, samples, slices_on_node(self.pods_here()))
        patched = self.publisher.publish(reports)
        self.collector.update(reports)
        for r in reports:
            d = r.device
            if not d.healthy and d.uuid not in self._warned:
                self._warned.add(d.uuid)
                log.warning("GPU %d (%s) unhealthy: %s; withdrawn from placement; pods on it: %s", d.index, d.uuid,
                            d.health_reason or "reported by the backend", ", ".join(s.pod for s in r.slices) or "none")
        return Tick(reports, tuple(patched))

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Tick until `stop`; a failed tick (API or backend hiccup) is logged and retried next interval."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception as e:
                log.warning("tick failed (%s); retrying in %.0f s", e, interval_s)
                self.collector.failed()
            stop.wait(interval_s)
