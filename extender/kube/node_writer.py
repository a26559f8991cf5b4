"""What a node's agent report becomes on its Node, written only when it changed.

The extender writes it (extender/kube/agents.py, the only caller), from the report it pulled from the agent pod
scheduled on that node: the agent itself has no API rights, so a compromised node cannot touch
any Node object. Three things:
  * annotation `tessera.dev/gpu-inventory`: per GPU its index, UUID, model, memory, health and the
    out-of-band memory the extender judged (the contract, tessera_contract/annotations.py);
  * label `nvidia.com/gpu.product`, only when missing (GPU feature discovery may own it);
  * status capacity `tessera.dev/gpu-milli`: 1000 per healthy GPU, so kubelet admits slices.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from tessera_contract import INVENTORY_ANNOTATION, MILLI_PER_GPU, MILLI_RESOURCE, MODEL_LABEL, encode_inventory
from tessera_contract.report import GpuDevice
from tessera_contract.values import quantity

log = logging.getLogger(__name__)

RESYNC_S = 300.0  # even with nothing new to say, compare with the Node this often (someone may have edited it)
OOB_STEP_MIB = 256  # out-of-band memory is published rounded up to this, so small drifts do not republish


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """One GPU as the extender publishes it: the device its agent reported, and the memory the
    extender found held by no valid Tessera assignment on it."""

    device: GpuDevice
    oob_memory_mib: int  # exact, for metrics

    @property
    def oob_published_mib(self) -> int:
        """Out-of-band memory rounded up to OOB_STEP_MIB (0 stays 0): what the annotation carries."""
        return math.ceil(self.oob_memory_mib / OOB_STEP_MIB) * OOB_STEP_MIB


def product_label(name: str) -> str:
    """An NVML product name as a label value, the way GPU feature discovery writes it ("NVIDIA A100" -> "NVIDIA-A100")."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "", re.sub(r"\s+", "-", name.strip()))[:63]
    return value.strip("-_.")


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the Node should say (from the report) or says (read back): comparable as a whole."""

    inventory: str
    product: str
    milli: int  # -1 when absent or unreadable


def desired_state(reports: tuple[GpuVerdict, ...], existing_product: str = "") -> NodeRecord:
    """The Node as its report says it should be. A product label already there names the model in the annotation
    too, so pods that select on the label and the extender's model filter agree."""
    model = existing_product or (product_label(reports[0].device.model) if reports else "")
    gpus = []
    for r in reports:
        d = r.device
        entry = {"index": d.index, "uuid": d.uuid, "model": model, "memory_mib": d.memory_mib,
                 "healthy": d.healthy, "oob_memory_mib": r.oob_published_mib}
        if d.health_reason:
            entry["health_reason"] = d.health_reason
        if d.mig_mode:
            entry["mig_mode"] = True
        if d.nvlink_peers:
            entry["nvlink_peers"] = list(d.nvlink_peers)
        gpus.append(entry)
    healthy = sum(1 for r in reports if r.device.healthy)
    return NodeRecord(encode_inventory(gpus), model, healthy * MILLI_PER_GPU)


def current_state(node: dict) -> NodeRecord:
    meta = node.get("metadata") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    try:  # the apiserver canonicalises quantities: "2000" reads back as "2k"
        milli = int(quantity(capacity[MILLI_RESOURCE], MILLI_RESOURCE))  # bounded: "1e999999999" would int() for minutes
    except (KeyError, ValueError):
        milli = -1
    return NodeRecord((meta.get("annotations") or {}).get(INVENTORY_ANNOTATION, ""),
                     (meta.get("labels") or {}).get(MODEL_LABEL, ""), milli)


class NodePublisher:
    """Patches one Node when what its report says differs from what the Node says.

    Between changes it makes no API call at all, except a read every RESYNC_S seconds.
    """

    def __init__(self, api, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.node_name, self._clock = api, node_name, clock
        self._last: tuple | None = None  # the reports last published (as compared), and when
        self._checked = float("-inf")
        self.patches = 0  # API writes made, for tests

    def publish(self, reports: tuple[GpuVerdict, ...]) -> list[str]:
        """Bring the Node up to date; returns what was patched ([] when nothing differed)."""
        key = tuple((r.device, r.oob_published_mib) for r in reports)
        if key == self._last and self._clock() - self._checked < RESYNC_S:
            return []
        node = json.loads(self.api.read_node(self.node_name, _preload_content=False).data)
        now = current_state(node)
        want = desired_state(reports, now.product)
        changed = []
        meta: dict = {}
        if want.inventory != now.inventory:
            meta["annotations"] = {INVENTORY_ANNOTATION: want.inventory}
            changed.append("inventory")
        if want.product and not now.product:
            meta["labels"] = {MODEL_LABEL: want.product}
            changed.append("label")
        if meta:
            self.api.patch_node(self.node_name, {"metadata": meta})
            self.patches += 1
        if want.milli != now.milli:
            self.api.patch_node_status(self.node_name, {"status": {"capacity": {MILLI_RESOURCE: str(want.milli)}}})
            self.patches += 1
            changed.append("capacity")
        if changed:
            log.info("node %s: published %s", self.node_name, ", ".join(changed))
        self._last, self._checked = key, self._clock()
        return changed
