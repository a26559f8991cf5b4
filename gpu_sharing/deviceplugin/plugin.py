"""Which GPUs a container gets: those of the signed assignment of the pod Tessera bound, and no others.

The kubelet 1.20 asks a device plugin for devices without saying for which pod (`Allocate` carries only
device IDs; the pod identity arrived in 1.21's PodResources API and is still not in `Allocate`). This is the
anchors' known failure: gpushare's and HAMi's plugins guess the pod by its size or by a node lock and give
the wrong GPU when two wait at once. Tessera closes the gap the other way round:

1. `preferred` (GetPreferredAllocation, which the kubelet calls first, 1.19+): among the pods bound to this
   node whose assignment's MAC verifies and which still wait for devices, the one the kubelet is admitting
   (its PodResources API tells: podresources.py), else the oldest first whose assigned GPUs are free and of
   the asked number: those GPUs.
2. `allocate` (Allocate): the devices must be, exactly, GPUs of one such pod's assignment that no container
   of it got yet. Otherwise it refuses: the kubelet then fails the pod (UnexpectedAdmissionError) and no
   container of it starts. So a container gets either GPUs Tessera assigned to a pod that asked for them,
   or nothing: a forged or copied annotation (its MAC fails), a pod placed by hand on the node with an
   assignment of its own making, or one bound by another scheduler get no device.

What a container gets: the device nodes of its GPUs (`/dev/nvidia<index>`, plus the driver's control
nodes that exist: nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset), which runc creates in the
container and allows in its device cgroup, and `NVIDIA_VISIBLE_DEVICES` with their UUIDs (a slice also
`TESSERA_GPU_MILLI`). The device nodes are the boundary: the container's own environment cannot add a
device node. A slice's share of its GPU's memory and compute is not enforced by a device node: that is
tessera-launch's (docs/gpu-sharing.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tessera_contract import (
    ASSIGNMENT_ANNOTATION,
    GPU_RESOURCE,
    MAC_ANNOTATION,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    RequestError,
    decode_assignment,
)
from tessera_contract.keyring import AssignmentSigner

from ..devices import GpuDevice

log = logging.getLogger(__name__)

GUESS = "given as the oldest of several waiting pods: the kubelet's PodResources did not tell which it admits"
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
    units: Mapping[str, int]  # GPU UUID -> devices of this resource its signed assignment gives it there
    guess: bool = False  # one of several waiting pods the kubelet's PodResources could not tell apart (oldest first)


SLICE_SEP = "::"  # a slice device's ID: <GPU UUID>::<0000..0999>, one per milli of the GPU


class GpuPlugin:
    """The decisions of the device plugin for one resource; the gRPC server (server.py) calls it.

    `nvidia.com/gpu` (GPU_RESOURCE): one device per GPU, its ID the GPU's UUID. `tessera.dev/gpu-milli`
    (MILLI_RESOURCE): a thousand devices per GPU, so that the kubelet counts a slice's milli as devices and a
    slice pod's container is given devices of exactly one GPU: its assignment's. The same rules for both: a
    waiting pod's signed assignment says how many devices of which GPU it may have.

    `pods` returns the pods bound to this node (raw API objects); it is called on each request, so the
    decision reads the API as it is then (the kubelet learnt of the pod from the same API a moment before).
    `kubelet_pods` (podresources.py: resource -> {namespace/name: devices the kubelet holds}) tells which of
    several waiting pods the kubelet is admitting; without it, or when it cannot be read, the oldest goes first.
    """

    def __init__(self, node: str, inventory: Iterable[GpuDevice], signer: AssignmentSigner,
                 pods: Callable[[], list[Mapping]], dev_root: Path = Path("/dev"), dev_view: Path | None = None,
                 resource: str = GPU_RESOURCE, kubelet_pods: Callable[[str], Mapping[str, int]] | None = None) -> None:
        if resource not in (GPU_RESOURCE, MILLI_RESOURCE):
            raise ValueError(f"a device plugin for {GPU_RESOURCE} or {MILLI_RESOURCE}, not {resource!r}")
        self.node, self.signer, self.pods, self.dev_root, self.resource = node, signer, pods, Path(dev_root), resource
        self.dev_view = Path(dev_view) if dev_view else self.dev_root  # where this process sees dev_root (a pod: /host/dev)
        self.kubelet_pods = kubelet_pods
        self.gpus = {g.uuid: g for g in inventory}
        self._by_index = {str(g.index): g.uuid for g in self.gpus.values()}
        self._given: dict[str, set[str]] = {}  # pod uid -> device IDs its containers got
        self._lock = threading.Lock()
        # Allocate's answers since the start, for /metrics; "guessed" counts the given ones that went to the oldest of
        # several waiting pods because the kubelet's PodResources could not tell which it admits
        self.answers = {"given": 0, "refused": 0, "guessed": 0}

    @property
    def slices(self) -> bool:
        return self.resource == MILLI_RESOURCE

    def refresh(self, inventory: Iterable[GpuDevice]) -> bool:
        """Take the backend's list again (health changes); True when the device list the kubelet sees changed."""
        before = self.devices()
        self.gpus = {g.uuid: g for g in inventory}
        self._by_index = {str(g.index): g.uuid for g in self.gpus.values()}
        return self.devices() != before

    def devices(self) -> list[tuple[str, bool]]:
        """(device ID, healthy) for ListAndWatch."""
        gpus = sorted(self.gpus.values(), key=lambda g: g.index)
        if not self.slices:
            return [(g.uuid, g.healthy) for g in gpus]
        return [(f"{g.uuid}{SLICE_SEP}{k:04d}", g.healthy) for g in gpus for k in range(MILLI_PER_GPU)]

    def gpu_of(self, device: str) -> str:
        return device.split(SLICE_SEP, 1)[0] if self.slices else device

    def entitled(self) -> list[Entitled]:
        """Pods waiting for devices of this resource here whose assignment Tessera signed, oldest first: of several,
        only those the kubelet may be admitting now (`_admitting`)."""
        out = []
        try:
            pods = self.pods()
        except Exception as e:  # noqa: BLE001 (any failure of the API read: the kubelet is told, in words)
            with self._lock:
                self.answers["refused"] += 1
            raise Refused(f"node {self.node}: cannot read this node's pods from the API ({type(e).__name__}: "
                          f"{str(e)[:200]}); no device given until it can") from None
        for raw in pods:
            pod = BoundPod.of(raw)
            if pod.phase != "Pending" or not _asks_for(raw, self.resource):
                continue
            units = self._assigned(pod)
            if units:
                out.append(Entitled(pod, units))
        out.sort(key=lambda e: (e.pod.created, e.pod.key))
        live = {e.pod.uid for e in out}
        with self._lock:
            for uid in [u for u in self._given if u not in live]:
                del self._given[uid]  # running or gone: the kubelet's checkpoint keeps what it holds
        return self._admitting(out)

    def _admitting(self, waiting: list[Entitled]) -> list[Entitled]:
        """Of several waiting pods, those the kubelet lists without all their devices: the one it is admitting
        (podresources.py says why there is one), or more only where a pod it rejected still shows Pending. A list
        the kubelet cannot give, or one naming none of them, leaves the order by age (and counts a guess)."""
        if self.kubelet_pods is None or len(waiting) < 2:
            return waiting
        try:
            held = self.kubelet_pods(self.resource)
        except Exception as e:  # noqa: BLE001 (the kubelet's socket: gone while it restarts, or not mounted)
            log.warning("node %s: the kubelet's PodResources cannot be read (%s: %s): of %d waiting pods the oldest "
                        "goes first", self.node, type(e).__name__, str(e)[:200], len(waiting))
            held = {}
        now = [e for e in waiting if e.pod.key in held and held[e.pod.key] < sum(e.units.values())]
        return now if len(now) == 1 else [replace(e, guess=True) for e in now or waiting]

    def _assigned(self, pod: BoundPod) -> dict[str, int]:
        body = pod.annotations.get(ASSIGNMENT_ANNOTATION)
        if not body:
            return {}
        if not self.signer.check(pod.uid, body, pod.annotations.get(MAC_ANNOTATION)).ok:
            log.warning("%s: %s does not verify: no device for it", pod.key, MAC_ANNOTATION)
            return {}
        try:
            a = decode_assignment(body, pod.key)
        except RequestError as e:
            log.warning("%s", e)
            return {}
        if a.node != self.node or not a.milli or (not self.slices and a.milli != MILLI_PER_GPU):
            return {}
        uuids = self._uuids_of(a.gpus, a.uuids)
        if not uuids or any(u not in self.gpus for u in uuids) or (self.slices and len(uuids) != 1):
            log.warning("%s: its assignment names GPUs this node does not have: %s", pod.key, list(a.uuids or a.gpus))
            return {}
        return {u: a.milli if self.slices else 1 for u in uuids}

    def _uuids_of(self, gpus: tuple[int, ...], ids: tuple[str, ...]) -> tuple[str, ...]:
        """This node's UUID of each assigned GPU. The assignment names a GPU by UUID, or by its index as text where
        the extender did not know the UUID (tessera_contract's GpuAssignment: a node whose kubelet advertised GPUs
        before its agent's first report, 10 s apart at most; seen on real nodes, tests/e2e/
        test_second_install_e2e.py). An index text counts only in its own GPU's place; "" for one unknown here."""
        if not ids:
            return tuple(self._by_index.get(str(g), "") for g in gpus)
        if len(ids) != len(gpus):
            return ()
        return tuple(u if u in self.gpus else self._by_index.get(u, "") if u == str(g) else ""
                     for g, u in zip(gpus, ids, strict=True))

    def _left(self, e: Entitled) -> dict[str, int]:
        """GPU -> how many more devices of it the pod may get."""
        given = self._given.get(e.pod.uid, set())
        return {u: n - sum(1 for d in given if self.gpu_of(d) == u) for u, n in e.units.items()}

    def preferred(self, available: Iterable[str], must_include: Iterable[str], size: int) -> list[str]:
        """The devices the kubelet should pick for a container asking `size`: of the oldest waiting pod's GPUs."""
        free, must = sorted(set(available)), list(must_include)
        for e in self.entitled():
            with self._lock:
                left, given = self._left(e), self._given.get(e.pod.uid, set())
            if any(self.gpu_of(d) not in left for d in must):
                continue
            chosen, taken = list(must), set(must) | given
            for u, n in left.items():
                room = n - sum(1 for d in chosen if self.gpu_of(d) == u)
                chosen += [d for d in free if self.gpu_of(d) == u and d not in taken][:max(room, 0)]
            if len(chosen) >= size:
                return chosen[:size]
        return free[:size]  # nobody waits with these: Allocate will say so

    def allocate(self, ids: Iterable[str]) -> tuple[Entitled, list[str], int]:
        """The pod these devices belong to, its GPUs among them and how many devices; Refused when they are no
        waiting pod's."""
        want = list(ids)
        per_gpu: dict[str, int] = {}
        for d in want:
            per_gpu[self.gpu_of(d)] = per_gpu.get(self.gpu_of(d), 0) + 1
        for e in self.entitled():
            with self._lock:
                left, given = self._left(e), self._given.get(e.pod.uid, set())
                if len(set(want)) == len(want) and not set(want) & given \
                        and all(left.get(u, 0) >= n for u, n in per_gpu.items()):
                    self._given.setdefault(e.pod.uid, set()).update(want)
                    self.answers["given"] += 1
                    self.answers["guessed"] += e.guess
                    log.info("%s: %s %s", e.pod.key, self.resource, per_gpu)
                    if e.guess:
                        log.warning("%s: %s", e.pod.key, GUESS)
                    return e, list(per_gpu), len(want)
        with self._lock:
            self.answers["refused"] += 1
        shown = want if len(want) <= 8 else [*want[:8], f"... {len(want)} in all"]
        raise Refused(f"node {self.node}: no pod bound here waits for {self.resource} devices {shown} with an "
                      f"assignment Tessera signed ({ASSIGNMENT_ANNOTATION} and a valid {MAC_ANNOTATION}); no device given")

    def container_devices(self, uuids: Iterable[str], count: int = 0) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """(environment, [(host path, container path)]) for a container given these GPUs (`count` devices)."""
        uuids = list(uuids)
        nodes = [(str(self.dev_root / f"nvidia{self.gpus[u].index}"), f"/dev/nvidia{self.gpus[u].index}") for u in uuids]
        nodes += [(str(self.dev_root / n), f"/dev/{n}") for n in CONTROL_NODES if (self.dev_view / n).exists()]
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids), "TESSERA_VISIBLE_DEVICES": ",".join(uuids)}
        if self.slices:
            env["TESSERA_GPU_MILLI"] = str(count)  # what tessera-launch caps to (gpu_sharing/assignment.py)
        return env, nodes


def _asks_for(pod: Mapping, resource: str) -> bool:
    """Whether a container of the pod asks for `resource` (a limit, or a request: extended resources take either)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        r = c.get("resources") or {}
        if resource in (r.get("limits") or {}) or resource in (r.get("requests") or {}):
            return True
    return False
