"""The preemptor's waiting room: each pod offered for a plan waits here, once, until it is due; bounded and fair.

Why not a queue that drops (issue 35): kube-scheduler 1.20 writes a pod's PodScheduled condition only when what it
says changes, so a pod it retries with the same Unschedulable message makes no watch event (issue 35 saw none for
150 s), and an offer the preemptor dropped (its queue of 1,000 full, the minute's 60 plans or the
namespace's 12 spent) was not made again: five namespaces' never-fitting pods had another tenant's priority-1000 pod
wait unplanned until its message changed. Here an offer is never dropped for a rate: the pod waits, due when a plan
is free for it, and the preemptor's timer (`Preemptor.step`, every RETRY_TICK_S) takes what is due.

Bounds: at most `bound` pods (RETRY_SET) wait, each once whatever the watch repeats. A full set makes room for a
pod by letting go the newest pod of the namespace with the most pods waiting, unless that namespace has at most one
more than the newcomer's (then the newcomer is let go): a tenant with few pods waiting is never crowded out by one
with many. A pod let go is counted (`dropped`) and offered again on its next watch event.

Fair order: what is due comes back round-robin over namespaces (each namespace's first pod, then each one's second,
...), namespaces with fewer plans in the last minute first within a round (the caller's `weight`), so when one plan
frees the tenant that had none gets it before a namespace that had its share.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

RETRY_SET = 10_000  # pods waiting at most (a uid and a namespace each: about 2 MB full)


class RetrySet:
    """uid -> (when due, namespace); safe to call from the watch thread and the preemptor's at once."""

    def __init__(self, bound: int = RETRY_SET) -> None:
        self.bound = bound
        self._due: dict[str, tuple[float, str]] = {}
        self._by_namespace: dict[str, dict[str, None]] = {}  # namespace -> its waiting uids, oldest first
        self._earliest = math.inf  # no pod is due before this
        self._mutex = threading.Lock()
        self.dropped = 0  # pods let go because the set was full (each offered again on its next watch event)

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, uid: str) -> bool:
        return uid in self._due

    def add(self, uid: str, namespace: str, due: float) -> bool:
        """The pod waits until `due` (the earlier of two dues if it already waits); False if it was let go instead."""
        with self._mutex:
            held = self._due.get(uid)
            if held is not None:
                if due < held[0]:
                    self._due[uid] = (due, held[1])
                    self._earliest = min(self._earliest, due)
                return True
            if len(self._due) >= self.bound and not self._make_room(namespace):
                self.dropped += 1
                return False
            self._due[uid] = (due, namespace)
            self._by_namespace.setdefault(namespace, {})[uid] = None
            self._earliest = min(self._earliest, due)
            return True

    def _make_room(self, namespace: str) -> bool:
        """Let go the newest pod of the namespace with the most waiting, if it has more than one over `namespace`."""
        largest = max(self._by_namespace, key=lambda ns: len(self._by_namespace[ns]))
        if len(self._by_namespace[largest]) <= len(self._by_namespace.get(namespace, ())) + 1:
            return False
        self._remove(next(reversed(self._by_namespace[largest])))
        self.dropped += 1
        return True

    def _remove(self, uid: str) -> None:
        _, namespace = self._due.pop(uid)
        mine = self._by_namespace[namespace]
        del mine[uid]
        if not mine:
            del self._by_namespace[namespace]

    def discard(self, uid: str) -> None:
        with self._mutex:
            if uid in self._due:
                self._remove(uid)

    def take_due(self, now: float, weight: Callable[[str], int] = lambda namespace: 0) -> list[tuple[str, str]]:
        """(uid, namespace) of every pod due by `now`, taken out, in the fair order (module docstring)."""
        with self._mutex:
            if now < self._earliest:
                return []
            due = sorted((d, uid, ns) for uid, (d, ns) in self._due.items() if d <= now)
            for _, uid, _ in due:
                self._remove(uid)
            self._earliest = min((d for d, _ in self._due.values()), default=math.inf)
        rounds: dict[str, int] = {}
        weights: dict[str, int] = {}
        order = []
        for d, uid, ns in due:
            rounds[ns] = rounds.get(ns, -1) + 1
            if ns not in weights:
                weights[ns] = weight(ns)
            order.append((rounds[ns], weights[ns], d, uid, ns))
        order.sort()
        return [(uid, ns) for *_, uid, ns in order]


class MinuteBudget:
    """At most `per_minute` uses in any 60 s, of which one namespace's at most `per_namespace` (a sliding window)."""

    def __init__(self, per_minute: int, per_namespace: int) -> None:
        self.per_minute, self.per_namespace = per_minute, min(per_minute, per_namespace)
        self.spent: list[float] = []  # when each use of the last minute was made, oldest first
        self._spent_in: dict[str, list[float]] = {}  # the same per namespace

    def _prune(self, now: float) -> None:
        self.spent = [t for t in self.spent if now - t < 60.0]
        self._spent_in = {ns: kept for ns, ts in self._spent_in.items() if (kept := [t for t in ts if now - t < 60.0])}

    def wait(self, namespace: str, now: float) -> float:
        """Seconds until the namespace may use the budget (0: now)."""
        self._prune(now)
        mine = self._spent_in.get(namespace, [])
        wait = mine[-self.per_namespace] + 60.0 - now if len(mine) >= self.per_namespace else 0.0
        if len(self.spent) >= self.per_minute:
            wait = max(wait, self.spent[-self.per_minute] + 60.0 - now)
        return wait

    def spend(self, namespace: str, now: float) -> None:
        self.spent.append(now)
        self._spent_in.setdefault(namespace, []).append(now)

    def used(self, namespace: str, now: float) -> int:
        """The namespace's uses in the minute before `now`."""
        return sum(now - t < 60.0 for t in self._spent_in.get(namespace, ()))
