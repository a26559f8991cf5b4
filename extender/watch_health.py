"""What the watch has to say about itself: the objects it could not read, and whether it is keeping up.

The API server is the extender's only source of truth, but what it serves was written by tenants
(annotations, labels) and by nodes (status, the agent's inventory). Each object is read on its own:
one that cannot be read is *recorded here and skipped*, never retried in a loop, so a single
hostile object can neither stop the watch nor hide the events behind it. The record is what an
operator sees (`/inspect`'s `bad_objects`, the `tessera_bad_objects*` metrics, an Event on the
object), bounded so that a flood of bad objects costs a fixed amount of memory.

Readiness follows the watch: a cache that cannot resume its watch is answering from a picture
that grows older every second, and `/readyz` says so after `STALL_S`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

# How long a watch may be down before /readyz turns false. Long enough that the ordinary hiccups do
# not flap readiness (the apiserver closes every watch at its timeout, a restarted apiserver needs
# ~10 s to answer, a relist of a large cluster takes a few seconds), short enough that a replica whose
# view is going stale is taken out of the Service well before kube-scheduler's bind of a pod placed
# on that view would matter: well under a reservation's TTL (60 s).
STALL_S = 30.0
MAX_BAD_OBJECTS = 10_000  # about 1 KiB each: a bounded 10 MiB, however many bad objects a tenant writes
MAX_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class BadObject:
    kind: str  # "Pod" or "Node"
    key: str  # namespace/name (pods) or name (nodes)
    uid: str
    reason: str
    resource_version: str
    seen_at: float  # wall-clock seconds, for people reading /inspect

    def as_dict(self) -> dict:
        return asdict(self)


class WatchHealth:
    """Thread-safe: both watch threads write, the HTTP threads read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, limit: int = MAX_BAD_OBJECTS) -> None:
        self._clock = clock
        self._limit = limit
        self._lock = threading.Lock()
        self._bad: OrderedDict[tuple[str, str], BadObject] = OrderedDict()  # (kind, uid or name), oldest first
        self.bad_seen: Counter[str] = Counter()  # kind -> bad states seen, ever (a Prometheus counter)
        self._failing: dict[str, tuple[float, str]] = {}  # watch kind -> (since, why)
        self.annotation_problems: Counter[str] = Counter()  # contract.ANNOTATION_CATEGORIES -> pod states, ever
        self._warned: OrderedDict[str, str] = OrderedDict()  # pod uid -> resourceVersion whose problems were said

    # -- tessera.dev/ input that does nothing ------------------------------------------------------

    def count_annotation_problems(self, categories) -> None:
        """One more pod state with these problems (each category counted once per state)."""
        with self._lock:
            for category in set(categories):
                self.annotation_problems[category] += 1

    def record_annotation_state(self, uid: str, resource_version: str) -> bool:
        """True the first time this state of a bound pod is warned about (a relist must not warn again)."""
        with self._lock:
            if self._warned.get(uid) == resource_version:
                return False
            self._warned.pop(uid, None)
            self._warned[uid] = resource_version
            while len(self._warned) > self._limit:
                self._warned.popitem(last=False)
            return True

    def annotation_totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self.annotation_problems)

    # -- bad objects -----------------------------------------------------------------------------

    def record_bad(self, kind: str, ident: str, key: str, uid: str, reason: str, resource_version: str) -> bool:
        """Remember that this state of an object was skipped; True when this state is new (not seen before).

        A state seen again (a relist lists the same object) counts once, so an operator's counter
        and the Events follow what tenants wrote, not how often the extender relisted.
        """
        reason = reason[:MAX_REASON_CHARS]
        with self._lock:
            old = self._bad.get((kind, ident))
            if old is not None and old.resource_version == resource_version and old.reason == reason:
                return False
            self._bad.pop((kind, ident), None)
            self._bad[(kind, ident)] = BadObject(kind, key, uid, reason, resource_version, time.time())
            while len(self._bad) > self._limit:
                self._bad.popitem(last=False)
            self.bad_seen[kind] += 1
            return True

    def forget_bad(self, kind: str, ident: str) -> None:
        """The object was read fine (or deleted): it is no longer a bad object."""
        with self._lock:
            self._bad.pop((kind, ident), None)

    def bad_objects(self) -> list[dict]:
        with self._lock:
            return [b.as_dict() for b in self._bad.values()]

    def bad_totals(self) -> dict[str, int]:
        """kind -> bad states seen since start (only grows: a Prometheus counter)."""
        with self._lock:
            return dict(self.bad_seen)

    def bad_counts(self) -> dict[str, int]:
        """kind -> objects listed now (each object once, however many bad states it had)."""
        with self._lock:
            return dict(Counter(kind for kind, _ in self._bad))

    # -- the watches -----------------------------------------------------------------------------

    def watch_ok(self, kind: str) -> None:
        with self._lock:
            self._failing.pop(kind, None)

    def watch_failed(self, kind: str, why: str) -> None:
        """The watch of `kind` is down; the clock starts at the first failure, not the latest."""
        with self._lock:
            since = self._failing.get(kind, (self._clock(), ""))[0]
            self._failing[kind] = (since, why[:MAX_REASON_CHARS])

    def failing(self) -> dict[str, float]:
        """kind -> seconds its watch has been down."""
        now = self._clock()
        with self._lock:
            return {kind: now - since for kind, (since, _) in self._failing.items()}

    def stalled(self) -> str:
        """'' while every watch is up or recovering within STALL_S; else why not ready, in words."""
        now = self._clock()
        with self._lock:
            late = sorted((since, kind, why) for kind, (since, why) in self._failing.items() if now - since > STALL_S)
        if not late:
            return ""
        since, kind, why = late[0]
        return f"the {kind} watch has been down for {now - since:.0f} s (over {STALL_S:.0f} s): {why}"
