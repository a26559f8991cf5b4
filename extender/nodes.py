"""The watched nodes: capacity into the cluster, plus what placement and operators need beyond it.

Per node: the GPU UUIDs (bind writes them into the pod's visible-devices annotation), what the
node agent reports per GPU (an unhealthy GPU is withheld from placement and its holders named in
the log, /inspect and `tessera inspect`), and the NoSchedule/NoExecute taints, also grouped by
taint set: nodes share a few taint sets, so the filter checks a pod's tolerations once per set
(O(distinct sets)), not once per node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .core.cluster import Cluster
from .core.model import Assignment
from .state import GpuInfo, NodeInventory, NodeTerms, Taint, Tolerations

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeTable:
    """The cluster's nodes as the watch delivers them; no lock of its own (the extender's guards it)."""

    cluster: Cluster
    gpu_uuids: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> UUID per GPU index
    gpu_info: dict[str, tuple[GpuInfo, ...]] = field(default_factory=dict)  # node -> what its agent reports per GPU
    taints: dict[str, tuple[Taint, ...]] = field(default_factory=dict)  # node -> its NoSchedule/NoExecute taints
    tainted: dict[tuple[Taint, ...], set[str]] = field(default_factory=dict)  # the same, grouped by taint set
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> its labels (pods' node selectors)

    def upsert(self, inv: NodeInventory, warn: bool) -> None:
        """Apply a watched node; with `warn`, log each GPU that turned unhealthy with this update.

        `warn` is off until the first full list: it gives nodes before pods, so "pods on it:
        none" would be untrue then (warn_unhealthy names them once the pods are known).
        """
        name = inv.spec.name
        self.cluster.upsert_node(inv.spec)
        before = {g.index for g in self.gpu_info.get(name, ()) if not g.healthy}
        self.gpu_uuids[name] = tuple(g.uuid for g in inv.gpus)
        self.gpu_info[name] = inv.gpus
        self.labels[name] = dict(inv.labels)
        self._set_taints(name, inv.taints)
        for g in inv.gpus:
            if warn and not g.healthy and g.index not in before:
                self._warn(name, g)

    def remove(self, name: str) -> list[Assignment]:
        """Forget a deleted node; the assignments that were on it (the pods' holds end with it)."""
        dropped = self.cluster.remove_node(name)
        self.gpu_uuids.pop(name, None)
        self.gpu_info.pop(name, None)
        self.labels.pop(name, None)
        self._set_taints(name, ())
        return dropped

    def pods_on_gpu(self, node: str, gpu: int) -> list[str]:
        """namespace/name of every pod holding a share of GPU `gpu` of `node`."""
        state = self.cluster.by_name.get(node)
        return sorted(a.pod for a in state.pods.values() if gpu in a.gpus) if state else []

    def unhealthy_gpus(self) -> list[dict]:
        """Every GPU its agent reports unhealthy, with the pods still on it (they need moving)."""
        return [{"node": node, "gpu": g.index, "uuid": g.uuid, "pods": self.pods_on_gpu(node, g.index)}
                for node, gpus in sorted(self.gpu_info.items()) for g in gpus if not g.healthy]

    def warn_unhealthy(self, when: str) -> None:
        """Log every unhealthy GPU with its holders (at the first full sync, when every pod is counted)."""
        for node, gpus in sorted(self.gpu_info.items()):
            for g in gpus:
                if not g.healthy:
                    self._warn(node, g, when)

    def blocked(self, tolerations: Tolerations) -> list[tuple[set[str], str]]:
        """The tainted nodes a pod of these tolerations may not use, grouped by their taints, with the reason:
        O(distinct taint sets)."""
        out = []
        for taints, names in self.tainted.items():
            taint = tolerations.first_untolerated(taints)
            if taint is not None:
                out.append((names, f"tessera: node has taint {taint} that the pod does not tolerate"))
        return out

    def admit(self, tolerations: Tolerations, terms: NodeTerms, node: str) -> bool:
        """Whether a pod of these tolerations and node terms may go to `node` by its taints and labels."""
        return terms.admits(node, self.labels.get(node, {})) and tolerations.first_untolerated(self.taints.get(node, ())) is None

    def taint_refusal(self, tolerations: Tolerations, node: str) -> str | None:
        """Why a pod of these tolerations may not use `node` by its taints; None if it may."""
        taint = tolerations.first_untolerated(self.taints.get(node, ()))
        return None if taint is None else f"node has taint {taint} that the pod does not tolerate"

    def _warn(self, node: str, g: GpuInfo, when: str = "") -> None:
        pods = self.pods_on_gpu(node, g.index)
        log.warning("%snode %s GPU %d (%s) is unhealthy: withdrawn from placement; pods on it: %s", when,
                    node, g.index, g.uuid or "no UUID", ", ".join(pods) or "none")

    def _set_taints(self, name: str, taints: tuple[Taint, ...]) -> None:
        old = self.taints.pop(name, ())
        if old:
            group = self.tainted[old]
            group.discard(name)
            if not group:
                del self.tainted[old]
        if taints:
            self.taints[name] = taints
            self.tainted.setdefault(taints, set()).add(name)
