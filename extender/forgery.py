"""Forgery bookkeeping: the watched pods whose assignment annotation was set aside, and why.

A pod's assignment annotation counts only when Tessera's MAC over it verifies (translate/objects.py
decides and says why in `PodInfo.forged`). This ledger remembers that verdict per pod UID so that
/inspect, /metrics and `tessera inspect` can name every such pod, and so that the warning is
logged once per new verdict, not on every watch event: each status update of a forged pod
would otherwise repeat it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .state import PodInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ForgeryLedger:
    """uid -> why its assignment annotation was set aside; a pod leaves it when its annotation verifies or it is deleted."""

    reasons: dict[str, str] = field(default_factory=dict)

    def note(self, info: PodInfo) -> bool:
        """Record the watch's verdict on `info`; True when it is a new or changed forgery (then it was logged).

        What the pod holds is not decided here: it stays as Tessera recorded it, and a pod
        Tessera never placed is counted like one another binder placed (adoption.py).
        """
        if not info.forged:
            self.reasons.pop(info.uid, None)
            return False
        if self.reasons.get(info.uid) == info.forged:
            return False
        self.reasons[info.uid] = info.forged
        log.warning("pod %s: %s", info.key, info.forged)
        return True

    def forget(self, uid: str) -> None:
        """The pod is gone from the API."""
        self.reasons.pop(uid, None)
