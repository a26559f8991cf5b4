"""Adoption: counting what the API says a bound pod holds, whoever bound it.

The watch shows three kinds of bound pods: Tessera's own binds (confirming a reservation), pods
with a Tessera assignment found at start-up or after a lost bind, and pods another binder placed
(CPU-only pods, or GPU pods bound by kube-scheduler's default binder or by hand). All hold
resources, so all are counted: Tessera's by their signed assignment, the others by a *guess* (whole
GPUs on the lowest free indices, where the device plugin would put them). A guess yields to a
Tessera assignment that names its GPUs, since a restart's list may deliver the guessed pod first;
an assignment that would over-commit a GPU is refused and reported, never counted, so a slice is
never given twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tessera_contract import TERMINAL_PHASES

from .core.cluster import Cluster, PlacementError
from .core.model import Assignment
from .holds import BindHolds
from .state import PodInfo

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Adoption:
    """What watched pods hold in `cluster`; shares the extender's pods, holds and lock (the caller holds it)."""

    cluster: Cluster
    pods: dict[str, PodInfo]  # uid -> the pod as the watch shows it (the extender's own map)
    holds: BindHolds
    rejected: dict[str, str] = field(default_factory=dict)  # uid -> why a watched assignment was not counted
    guessed: set[str] = field(default_factory=set)  # pod keys counted where we guessed (another binder's)

    def watched(self, info: PodInfo) -> None:
        """Account a watched pod: give back what a finished one held, confirm or adopt what a bound one holds."""
        held = self.cluster.assignments.get(info.key)
        if info.phase in TERMINAL_PHASES:
            if held:
                self.release(info.uid, info.key)
            return
        if not info.node:
            return
        a = info.assignment
        if a is None:
            if not held:  # bound by someone else: count its CPU and memory, and GPUs where we guess
                self.adopt(info, self.guess(info), guessed=True)
            return
        if held and (held.node, held.gpus, held.milli) == (a.node, a.gpus, a.milli):
            self.holds.drop(info.uid)  # the watch confirms our bind
            return
        if held:
            self.release(info.uid, info.key)
        self.adopt(info, a)

    def gone(self, uid: str, info: PodInfo | None) -> None:
        """The pod was deleted: what it held and every record of it go."""
        if info is not None and info.key in self.cluster.assignments:
            self.release(uid, info.key)
        self.holds.drop(uid)
        self.rejected.pop(uid, None)

    def release(self, uid: str, key: str) -> None:
        """Give back what the pod holds (its hold too)."""
        self.holds.drop(uid)
        self.guessed.discard(key)
        if key in self.cluster.assignments:
            self.cluster.release(key)

    def adopt(self, info: PodInfo, assignment: Assignment | None, guessed: bool = False) -> None:
        """Count an assignment read from the API; `guessed` ones (another binder's pods) yield to Tessera's."""
        if assignment is None:
            return
        try:
            try:
                self.cluster.adopt(assignment)
            except PlacementError:
                if guessed or not self._make_room(assignment):
                    raise
            if len(assignment.gpus) == info.request.gpu_count:  # a guess short of GPUs stays reported
                self.rejected.pop(info.uid, None)
            if guessed:
                self.guessed.add(assignment.pod)
            else:
                self.guessed.discard(assignment.pod)
        except PlacementError as e:
            self.rejected[info.uid] = str(e)
            log.warning("pod %s: assignment not counted: %s", info.key, e)

    def guess(self, info: PodInfo) -> Assignment | None:
        """Where a pod bound without (valid) Tessera annotations holds GPUs, as far as we can tell.

        Whole GPUs: the lowest free ones, where the device plugin would put them. A slice, forged or
        not: the GPU with the most room that holds it (its own claim is never read), since the kubelet
        counted its share of the node's gpu-milli when it admitted the pod (a forged slice held none,
        and Tessera then offered milli the kubelet would refuse). GPUs that do not fit are reported,
        and the pod's CPU and memory still count.
        """
        node = self.cluster.by_name.get(info.node)
        if node is None:
            return None
        r = info.request
        gpus: tuple[int, ...] = ()
        if r.gpu_count:
            fitting = [g for g, free in enumerate(node.gpu_free) if free >= r.gpu_milli]
            if r.is_slice:  # most room first; among equals the last, so a forged claim of GPU 0 rarely lands there
                fitting.sort(key=lambda g: (-node.gpu_free[g], -g))
            gpus = tuple(fitting[: r.gpu_count])
            if len(gpus) < r.gpu_count:
                self.rejected[info.uid] = f"bound to {info.node} without Tessera, and its GPUs do not fit there"
                return Assignment(r.name, info.node, (), 0, r.cpu_milli, r.memory_mib, r.shape())
        return Assignment(r.name, info.node, gpus, r.gpu_milli, r.cpu_milli, r.memory_mib, r.shape())

    def uid_of(self, key: str) -> str:
        """The UID of the watched pod named `key` (namespace/name), "" if none: O(pods), for rare events only."""
        return next((uid for uid, i in self.pods.items() if i.key == key), "")

    def _make_room(self, assignment: Assignment) -> bool:
        """Move guessed holders off the GPUs a Tessera assignment names (the watch may list them first)."""
        node = self.cluster.by_name.get(assignment.node)
        if node is None:
            return False
        wanted = set(assignment.gpus)
        movable = [a for a in node.pods.values() if a.pod in self.guessed and wanted & set(a.gpus)]
        if not movable:
            return False
        for a in movable:
            self.cluster.release(a.pod)
        try:
            self.cluster.adopt(assignment)
        except PlacementError:
            for a in movable:  # the guessed pods were not the obstacle: put them back as they were
                self.cluster.adopt(a)
            return False
        for a in movable:
            self.guessed.discard(a.pod)
            info = self.pods.get(self.uid_of(a.pod))
            if info is not None:
                self.adopt(info, self.guess(info), guessed=True)
        return True
