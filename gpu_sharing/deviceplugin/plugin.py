"""Which GPUs a container gets: those of the signed assignment of the pod Tessera bound, and no others.

The kubelet 1.20 asks a device plugin for devices without saying for which pod (`Allocate` carries only
device IDs; the pod identity arrived in 1.21's PodResources API and is still not in `Allocate`). This is the
anchors' known failure: gpushare's and HAMi's plugins guess the pod by its size or by a node lock and give
the wrong GPU when two wait at once. Tessera closes the gap the other way round:

1. `preferred` (GetPreferredAllocation, which the kubelet calls first, 1.19+): among the pods bound to this
   node whose assignment's MAC verifies and which still wait for devices, oldest first (the order in which
   the kubelet admits pods), the first whose assigned GPUs are free and of the asked number: those GPUs.
2. `allocate` (Allocate): the devices must be, exactly, GPUs of one such pod's assignment that no container
   of it got yet. Otherwise it refuses: the kubelet then fails the pod (UnexpectedAdmissionError) and no
   container of it starts. So a container gets either GPUs Tessera assigned to a pod that asked for them,
   or nothing: a forged or copied annotation (its MAC fails), a pod placed by hand on the node with an
   assignment of its own making, or one bound by another scheduler get no device.

What a container gets: the device nodes of its GPUs (`/dev/nvidia<index>`, plus the driver's control
nodes that exist: nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset), which runc creates in the
container and allows in its device cgroup, and `NVIDIA_VISIBLE_DEVICES` with their UUIDs. The device
nodes are the boundary: the container's own environment cannot add a device node. Slices
(`tessera.dev/gpu-milli`) are not this resource yet (docs/gpu-sharing.md says what is left).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera_contract import ASSIGNMENT_ANNOTATION, MAC_ANNOTATION, MILLI_PER_GPU, RequestError, decode_assignment
from tessera_contract.keyring import AssignmentSigner

from ..devices import GpuDevice

log = logging.getLogger(__name__)

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class Refused(Exception):
    """Allocate refused, in words the kubelet puts in the pod's status."""


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod on this node as the API shows it: the fields the plugin decides by, read once."""

    key: str  # namespace/name
    uid: str
    created: str  # metadata.creationTimestamp (RFC 3339: sorts as text)
    phase: str
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, pod: Mapping) -> BoundPod:
        meta = pod.get("metadata") or {}
        return cls(f"{meta.get('namespace', '')}/{meta.get('name', '')}", str(meta.get("uid", "")),
                   str(meta.get("creationTimestamp", "")), str((pod.get("status") or {}).get("phase", "")),
                   dict(meta.get("annotations") or {}))


@dataclass(frozen=True, slots=True)
class Entitled:
    pod: BoundPod
    uuids: tuple[str, ...]  # the GPUs its signed assignment names, on this node


class GpuPlugin:
    """The decisions of the device plugin for whole GPUs (`nvidia.com/gpu`, GPU_RESOURCE); the gRPC server (server.py) calls it.

    `pods` returns the pods bound to this node (raw API objects); it is called on each request, so the
    decision reads the API as it is then (the kubelet learnt of the pod from the same API a moment before).
    """

    def __init__(self, node: str, inventory: Iterable[GpuDevice], signer: AssignmentSigner,
                 pods: Callable[[], list[Mapping]], dev_root: Path = Path("/dev"), dev_view: Path | None = None) -> None:
        self.node, self.signer, self.pods, self.dev_root = node, signer, pods, Path(dev_root)
        self.dev_view = Path(dev_view) if dev_view else self.dev_root  # where this process sees dev_root (a pod: /host/dev)
        self.gpus = {g.uuid: g for g in inventory}
        self._by_index = {str(g.index): g.uuid for g in self.gpus.values()}
        self._given: dict[str, set[str]] = {}  # pod uid -> GPUs its containers got
        self._lock = threading.Lock()
        self.answers = {"given": 0, "refused": 0}  # Allocate's answers since the start, for /metrics

    def refresh(self, inventory: Iterable[GpuDevice]) -> bool:
        """Take the backend's list again (health changes); True when the device list the kubelet sees changed."""
        before = self.devices()
        self.gpus = {g.uuid: g for g in inventory}
        self._by_index = {str(g.index): g.uuid for g in self.gpus.values()}
        return self.devices() != before

    def devices(self) -> list[tuple[str, bool]]:
        """(device ID, healthy) for ListAndWatch: the GPUs' UUIDs."""
        return [(g.uuid, g.healthy) for g in sorted(self.gpus.values(), key=lambda g: g.index)]

    def entitled(self) -> list[Entitled]:
        """Pods waiting for devices here whose assignment Tessera signed, oldest first."""
        out = []
        for raw in self.pods():
            pod = BoundPod.of(raw)
            if pod.phase != "Pending":
                continue
            uuids = self._assigned(pod)
            if uuids:
                out.append(Entitled(pod, uuids))
        out.sort(key=lambda e: (e.pod.created, e.pod.key))
        live = {e.pod.uid for e in out}
        with self._lock:
            for uid in [u for u in self._given if u not in live]:
                del self._given[uid]  # running or gone: the kubelet's checkpoint keeps what it holds
        return out

    def _assigned(self, pod: BoundPod) -> tuple[str, ...]:
        body = pod.annotations.get(ASSIGNMENT_ANNOTATION)
        if not body:
            return ()
        if not self.signer.check(pod.uid, body, pod.annotations.get(MAC_ANNOTATION)).ok:
            log.warning("%s: %s does not verify: no device for it", pod.key, MAC_ANNOTATION)
            return ()
        try:
            a = decode_assignment(body, pod.key)
        except RequestError as e:
            log.warning("%s", e)
            return ()
        if a.node != self.node or a.milli != MILLI_PER_GPU:
            return ()
        uuids = a.uuids or tuple(self._by_index.get(str(i), "") for i in a.gpus)
        if not uuids or any(u not in self.gpus for u in uuids):
            log.warning("%s: its assignment names GPUs this node does not have: %s", pod.key, list(uuids))
            return ()
        return tuple(uuids)

    def _left(self, e: Entitled) -> list[str]:
        return [u for u in e.uuids if u not in self._given.get(e.pod.uid, set())]

    def preferred(self, available: Iterable[str], must_include: Iterable[str], size: int) -> list[str]:
        """The GPUs the kubelet should pick for a container asking `size`: the oldest waiting pod's."""
        free, must = set(available), list(must_include)
        for e in self.entitled():
            with self._lock:
                left = self._left(e)
            if len(left) >= size and set(must) <= set(left) and set(left[:size]) | set(must) <= free:
                chosen = must + [u for u in left if u not in must]
                return chosen[:size]
        return sorted(free)[:size]  # nobody waits with these: Allocate will say so

    def allocate(self, ids: Iterable[str]) -> tuple[Entitled, list[str]]:
        """The pod these devices belong to and the devices; Refused when they are no waiting pod's."""
        want = list(ids)
        for e in self.entitled():
            with self._lock:
                if set(want) <= set(self._left(e)):
                    self._given.setdefault(e.pod.uid, set()).update(want)
                    self.answers["given"] += 1
                    log.info("%s: GPUs %s", e.pod.key, want)
                    return e, want
        with self._lock:
            self.answers["refused"] += 1
        raise Refused(f"node {self.node}: no pod bound here waits for GPUs {want} with an assignment Tessera "
                      f"signed ({ASSIGNMENT_ANNOTATION} and a valid {MAC_ANNOTATION}); no device given")

    def container_devices(self, uuids: Iterable[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """(environment, [(host path, container path)]) for a container given these GPUs."""
        uuids = list(uuids)
        nodes = [(str(self.dev_root / f"nvidia{self.gpus[u].index}"), f"/dev/nvidia{self.gpus[u].index}") for u in uuids]
        nodes += [(str(self.dev_root / n), f"/dev/{n}") for n in CONTROL_NODES if (self.dev_view / n).exists()]
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "TESSERA_VISIBLE_DEVICES": ",".join(uuids)}
        return env, nodes
