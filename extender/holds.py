"""Bind holds: GPUs a bind has taken for a pod before the watch shows the pod bound.

kube-scheduler binds in parallel goroutines, so bind's select-and-commit records the pod's GPUs at
once (under the extender's lock) and only then calls the API; the watch confirms the hold when the
pod shows up bound with Tessera's annotation. A hold the watch never confirms (the pod vanished,
the API call was lost) expires after a TTL (60 s by default, twice the 30 s httpTimeout the
manifests give kube-scheduler for a call to Tessera); a hold whose API call is still in flight never
expires, or a slow API server would see the same GPUs handed out twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_HOLD_TTL_S = 60.0
# A bind can arrive before the watch delivers its pod (kube-scheduler's informer was faster; the
# e2e stream saw it for 5 pods of 200): the bind waits up to WATCH_WAIT_S for it rather than
# failing the pod into a backoff. At most MAX_WATCH_WAITS such binds wait at once, so binds for
# pods that do not exist cannot hold more than that many serving threads; others are refused.
WATCH_WAIT_S = 1.0
MAX_WATCH_WAITS = 4


@dataclass(frozen=True, slots=True)
class BindHolds:
    """uid -> expiry of its hold, and the uids whose bind API call is in flight.

    Only bookkeeping: giving the GPUs back is the caller's (it holds the cluster and the lock).
    Frozen: the Extender's `reservations` and `_binding` return these very objects, so they are changed, never replaced.
    """

    ttl_s: float = DEFAULT_HOLD_TTL_S
    clock: Callable[[], float] = time.monotonic
    expiry: dict[str, float] = field(default_factory=dict)  # uid -> expiry (clock seconds)
    binding: set[str] = field(default_factory=set)  # uids whose bind API call is in flight

    def hold(self, uid: str) -> None:
        """Bind took GPUs for `uid` and is about to call the API."""
        self.expiry[uid] = self.clock() + self.ttl_s
        self.binding.add(uid)

    def drop(self, uid: str) -> None:
        """The hold ends: the watch confirmed it, the pod is gone, or its GPUs were given back."""
        self.expiry.pop(uid, None)

    def expired(self) -> list[str]:
        """Holds past their TTL whose API call has returned: the watch will not confirm them now."""
        now = self.clock()
        return [uid for uid, expiry in self.expiry.items() if expiry <= now and uid not in self.binding]

    def awaiting_watch(self, uid: str) -> bool:
        """`uid` holds GPUs and its bind call has returned: a filter for it now means kube-scheduler is retrying."""
        return uid in self.expiry and uid not in self.binding


class Arrivals:
    """Binds waiting for the watch to deliver their pod (WATCH_WAIT_S, at most MAX_WATCH_WAITS at once).

    Built on the extender's lock: a waiting bind releases it, so the watch gets in and says `arrived`.
    """

    def __init__(self, lock: threading.RLock, wait_s: float = WATCH_WAIT_S, slots: int = MAX_WATCH_WAITS) -> None:
        self.wait_s = wait_s
        self.waiting = 0  # binds waiting now (under the lock)
        self._seen = threading.Condition(lock)
        self._slots = threading.BoundedSemaphore(slots)

    def arrived(self) -> None:
        """The watch delivered a pod it had not seen (hold the lock)."""
        self._seen.notify_all()

    def await_pod(self, uid: str, pods: dict) -> object | None:
        """`pods[uid]` once the watch delivers it, waiting up to `wait_s`; None when it does not come or every slot is
        taken (hold the lock: it is released while waiting)."""
        if self.wait_s <= 0 or not self._slots.acquire(blocking=False):
            return None
        self.waiting += 1
        try:
            deadline = time.monotonic() + self.wait_s
            while (info := pods.get(uid)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._seen.wait(left)
            return info
        finally:
            self.waiting -= 1
            self._slots.release()
