"""Run estimates, the server's side: what a silent pod of a namespace will likely run, from that namespace's finished pods.

The estimate is core/run_history.py's, the one time mode measures (`tessera simulate --mode time --short-first on
--short-first-estimate on`); this module feeds it what only the server knows, from the watch:

  * a run: from the pod's `status.startTime` to its last container's `state.terminated.finishedAt` (both the
    kubelet's), read when the watch first shows the pod Succeeded or Failed; a pod deleted while it ran ends when
    the deletion reaches the watch. A pod without a start time never ran and records nothing. A run is recorded
    once per pod (uid), so a relist after a restart does not count a finished pod twice; a restarted extender
    starts with no history, and estimates again once `min_runs` pods of a key have finished.
  * the key: the pod's namespace and GPU shape (whole GPUs, or the milli of a slice). One tenant's runs never speak for
    another tenant's pods: a namespace is the unit Kubernetes gives tenants (RBAC, quotas), and a tenant can
    make pods only in its own.
  * the pods still running, per key, with their start (kept by `RunHistory`, `started`): each counts as a run at
    least as long as it has run so far (`RunHistory.estimate`: the Kaplan-Meier quantile of finished and running
    runs).

What a tenant can do with it: make many short pods so that its silent long pods count as short. It only fools
itself for a while and at a price: the estimate is the run 75% of the key's runs finished within, so at most one
run in four can be long, a long one weighs against the key while it runs, not only once it ends, and every short
run it made held a GPU for as long as it ran. A pod counted short by its estimate is not
held behind shorter runs and holds long pods off the nodes where it fits for at most the hold bound
(`--short-first-hold`), as a pod with a short deadline does (docs/security.md).

Bounded: `RunHistory` keeps 50 runs per key and 4,096 keys; its running pods are only bound GPU pods (each holds a
GPU the tenant was given), and an estimate reads at most 50 of a key's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tessera_contract import TERMINAL_PHASES

from .core.run_history import RunHistory
from .state import PodInfo

RunKey = tuple[str, int, int]  # (namespace, GPU count, milli per GPU)


def run_key(info: PodInfo) -> RunKey | None:
    """The pods whose runs speak for `info`'s: its namespace's of its GPU shape; None for a pod asking no GPU."""
    request = info.request
    if not request.gpu_count:
        return None
    return info.key.split("/", 1)[0], request.gpu_count, request.gpu_milli


class RunEstimates:
    """Finished runs per (namespace, GPU shape), fed by the watch (`watched`, `gone`); asked by shortest runs first
    (`estimate`). Off (`on` False): records nothing and estimates nothing. Hold the extender's lock."""

    def __init__(self, on: bool = False, clock: Callable[[], float] = time.time, history: RunHistory | None = None) -> None:
        self.on, self.clock = on, clock
        self.history = history or RunHistory()
        self.key_of: dict[str, RunKey] = {}  # running uid -> its key (the history keeps its start)
        self.recorded: set[str] = set()  # uids whose run is on record (dropped when the pod is deleted)

    def watched(self, info: PodInfo) -> None:
        if not self.on or info.uid in self.recorded:
            return
        key = run_key(info)
        if key is None or not info.node or info.started_s is None:
            return
        self.history.started(key, info.uid, info.started_s)
        self.key_of[info.uid] = key
        if info.phase in TERMINAL_PHASES:
            self._end(info.uid, info.finished_s if info.finished_s is not None else self.clock())

    def gone(self, uid: str) -> None:
        """The pod was deleted: a pod that was running ends now."""
        self._end(uid, self.clock())
        self.recorded.discard(uid)

    def _end(self, uid: str, at: float) -> None:
        key = self.key_of.pop(uid, None)
        if key is not None:
            self.history.ended(key, uid, at)
            self.recorded.add(uid)

    def estimate(self, info: PodInfo) -> float | None:
        """The run `info` will likely finish within, from its namespace's pods of its shape; None: not known."""
        key = run_key(info) if self.on else None
        return None if key is None else self.history.estimate(key, self.clock())
