"""Leader election on a coordination.k8s.io/v1 Lease: of several extender replicas, one binds.

Every replica watches the cluster and answers filter and prioritize from its own cache; only
the Lease holder commits binds, so two replicas can never hand one GPU slice to two pods. A
follower that gets a bind forwards it to the holder (http/forward.py): the holderIdentity names a
pod, which must be a Ready extender replica; the URL written on the Lease is only a hint for people.

The rules are client-go's leaderelection, written for this one use:
  * a Lease is taken when it is free or its record has not changed for `duration_s` on *our*
    clock (observed time, not the holder's timestamps, so clock skew between nodes is harmless);
  * updates carry the resourceVersion, so of two replicas racing for a free Lease one gets 409;
  * a holder that has not renewed within `renew_deadline_s` (< duration_s) stops binding at once,
    before any follower may take over: at most one replica binds at any moment;
  * a record naming us counts as ours only if it is the one we wrote (its resourceVersion): anyone who
    writes the Lease could otherwise name a follower, which then bound at once while the real holder
    still did until its own next round (two binders, one GPU given twice); such a record is waited
    out for `duration_s` like any other holder's;
  * a new holder runs `on_elected` (the extender: wait until its cache is synced) before its first
    bind. Binds its predecessor made just before dying reach it through its own watch: the old
    holder stopped binding at its renew deadline, `duration_s - renew_deadline_s` before anyone may
    take over, and each bind is one API call (Binding + annotations), so it is whole or absent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes.client import CoordinationV1Api
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION = "tessera.dev/leader-url"


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str  # this replica (its pod name)
    url: str  # where other replicas send binds to this replica, with the verbs' prefix
    duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.retry_s < self.renew_deadline_s < self.duration_s):
            raise ValueError("lease timings must satisfy 0 < retry < renew deadline < duration")
        if not self.identity or not self.name or not self.namespace:
            raise ValueError("a lease needs a name, a namespace and this replica's identity")


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Tries to hold the Lease every `retry_s`; `is_leader()` says whether this replica may bind now."""

    def __init__(self, api: CoordinationV1Api, cfg: LeaseConfig, on_elected: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.cfg, self.on_elected, self.clock = api, cfg, on_elected, clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # our clock, last successful acquire or renew
        self._ready = False  # elected and on_elected has finished
        self._observed: tuple | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._leader_url = ""
        self._holder = ""  # holderIdentity last read or written: a pod name, checked before any forward
        self._written = ""  # resourceVersion of the Lease as we last wrote it: a record naming us is ours only then

    # -- what the rest of the extender asks ---------------------------------------------------------

    def is_leader(self) -> bool:
        with self._lock:
            return (self._ready and self._renewed_at is not None
                    and self.clock() - self._renewed_at < self.cfg.renew_deadline_s)

    def leader_url(self) -> str:
        """The URL the holder wrote on the Lease ('' when unknown): a hint for people, never dialled."""
        with self._lock:
            return self._leader_url

    def holder(self) -> str:
        """The current holderIdentity ('' when free or unknown); ours when we hold the Lease."""
        with self._lock:
            return self._holder

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.try_once()
            except Exception as e:  # the API is down or slow: keep trying; is_leader() lapses by itself
                log.warning("lease %s/%s: %s", self.cfg.namespace, self.cfg.name, e)
            stop.wait(self.cfg.retry_s)
        self.release()

    def try_once(self) -> bool:
        """One acquire-or-renew round; True when we hold the Lease afterwards."""
        cfg = self.cfg
        try:
            lease = json.loads(self.api.read_namespaced_lease(cfg.name, cfg.namespace, _preload_content=False).data)
        except ApiException as e:
            if e.status != 404:
                raise
            return self._write(None)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        url = ((lease.get("metadata") or {}).get("annotations") or {}).get(LEADER_URL_ANNOTATION, "")
        version = (lease.get("metadata") or {}).get("resourceVersion")
        ours = holder == cfg.identity and bool(self._written) and version == self._written
        if not ours:
            with self._lock:
                self._renewed_at, self._ready = None, False
                self._leader_url = url if holder else ""
                self._holder = holder
            duration = float(spec.get("leaseDurationSeconds") or cfg.duration_s)
            if holder and now - self._observed_at < duration:
                return False  # held by a live replica
        return self._write(lease)

    def _write(self, lease: dict | None) -> bool:
        cfg, stamp = self.cfg, _now_micro()
        previous = (lease or {}).get("spec") or {}
        taking_over = previous.get("holderIdentity") != cfg.identity
        spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": int(cfg.duration_s),
            "acquireTime": stamp if taking_over else previous.get("acquireTime", stamp),
            "renewTime": stamp,
            "leaseTransitions": int(previous.get("leaseTransitions") or 0) + (1 if taking_over and lease else 0),
        }
        meta = {"name": cfg.name, "namespace": cfg.namespace, "annotations": {LEADER_URL_ANNOTATION: cfg.url}}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        try:
            if lease is None:
                resp = self.api.create_namespaced_lease(cfg.namespace, body, _preload_content=False)
            else:
                meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
                resp = self.api.replace_namespaced_lease(cfg.name, cfg.namespace, body, _preload_content=False)
        except ApiException as e:
            if e.status in (409, 422):  # another replica wrote first (or created it first)
                return False
            raise
        try:
            self._written = str((json.loads(resp.data).get("metadata") or {}).get("resourceVersion") or "")
        except (ValueError, AttributeError, TypeError):
            self._written = ""  # unreadable: the next round treats the record as foreign and waits it out
        with self._lock:
            self._renewed_at, self._leader_url, self._holder = self.clock(), cfg.url, cfg.identity
            elected = not self._ready  # newly elected, or on_elected failed last round
        if elected:
            log.info("lease %s/%s: %s is the leader", cfg.namespace, cfg.name, cfg.identity)
            self.on_elected()
            with self._lock:
                self._ready = True
        return True

    def release(self) -> None:
        """On shutdown: give the Lease up so a follower takes over at once, not after `duration_s`."""
        with self._lock:
            held, self._ready, self._renewed_at = self._ready, False, None
        if not held:
            return
        cfg = self.cfg
        try:
            lease = json.loads(self.api.read_namespaced_lease(cfg.name, cfg.namespace, _preload_content=False).data)
            if (lease.get("spec") or {}).get("holderIdentity") == cfg.identity:
                lease["spec"]["holderIdentity"] = ""
                self.api.replace_namespaced_lease(cfg.name, cfg.namespace, lease, _preload_content=False)
        except Exception as e:  # best effort: the Lease expires anyway
            log.warning("lease %s/%s: release failed: %s", cfg.namespace, cfg.name, e)
