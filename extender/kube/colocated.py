"""Bind leadership for the second-scheduler install: Tessera binds only while the kube-scheduler in
its own pod holds kube-scheduler's Lease (one Lease for both).

In that install each pod runs kube-scheduler (profile `tessera-scheduler`) and `tessera serve` on
loopback. Only the leading kube-scheduler schedules, so only its pod's Tessera gets verbs; a second
Lease for Tessera could elect a Tessera in another pod, whose followers would then forward binds to
a pod IP where no verbs listen (they are on loopback). So Tessera takes no Lease of its own; it
reads kube-scheduler's and binds only while that Lease names this pod. kube-scheduler writes
`holderIdentity` as `<hostname>_<uuid>`, and a pod's hostname is its name.

Timing, as client-go's leaderelection does it (LeaseElector in lease.py): we trust a record only for
`renew_deadline_s` of our own clock after we last saw it change. kube-scheduler renews every 2 s;
another pod may take the Lease only after the record stood still for its lease duration (15 s), so
with the default renew deadline (10 s) and a poll of 1 s, this Tessera stops binding (a gang bind
that waited included: app.py checks again before the Binding) at least 4 s before any other
kube-scheduler may start. A restarted kube-scheduler in the same pod has a new uuid but the same
hostname: its old record lapses on its own and the new one counts once it renews.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from kubernetes.client import CoordinationV1Api
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def parse_lease_ref(ref: str) -> tuple[str, str]:
    """'NAMESPACE/NAME' -> (namespace, name); anything else is refused in words."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--bind-with-scheduler-lease {ref!r}: expected NAMESPACE/NAME of kube-scheduler's Lease")
    return namespace, name


def holder_pod(identity: str) -> str:
    """The hostname part of kube-scheduler's holderIdentity (`<hostname>_<uuid>`); '' when free."""
    host, sep, _ = identity.rpartition("_")
    return host if sep else ""


class SchedulerLeaseFollower:
    """`is_leader()` is True while kube-scheduler's Lease names this pod and was renewed recently."""

    def __init__(self, api: CoordinationV1Api, namespace: str, name: str, pod: str, renew_deadline_s: float = 10.0,
                 poll_s: float = 1.0, on_elected: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not pod:
            raise ValueError("--bind-with-scheduler-lease needs this pod's name (POD_NAME from the downward API)")
        if not 0 < poll_s < renew_deadline_s:
            raise ValueError("the poll must be shorter than the renew deadline")
        self.api, self.namespace, self.name, self.pod = api, namespace, name, pod
        self.renew_deadline_s, self.poll_s, self.on_elected, self.clock = renew_deadline_s, poll_s, on_elected, clock
        self._lock = threading.Lock()
        self._record: tuple | None = None
        self._changed_at: float | None = None  # our clock, when the record last changed while naming us
        self._ready = False  # on_elected finished for the current term

    def is_leader(self) -> bool:
        """Asked before every bind. A bind reaching a replica that thinks it is not leading is read
        against a fresh copy of the Lease first, every time: kube-scheduler binds its first pod
        milliseconds after it takes the Lease, a poll from just before then is stale, and a bind
        refused then leaves the pod in kube-scheduler's unschedulable queue for up to a minute.
        Only this pod's own kube-scheduler reaches the verbs (loopback), and it binds only while
        it leads, so these reads happen at a handover, not per pod."""
        if self._leading():
            return True
        if self.api is None:
            return False
        try:
            self.poll_once()
        except Exception as e:
            log.warning("kube-scheduler lease %s/%s: %s", self.namespace, self.name, e)
        return self._leading()

    def _leading(self) -> bool:
        with self._lock:
            return (self._ready and self._changed_at is not None
                    and self.clock() - self._changed_at < self.renew_deadline_s)

    def holder(self) -> str:
        with self._lock:
            return holder_pod(self._record[0]) if self._record else ""

    def observe(self, lease: dict | None) -> bool:
        """Take one read of the Lease (None: it does not exist); True when it names this pod."""
        spec = (lease or {}).get("spec") or {}
        record = (spec.get("holderIdentity") or "", spec.get("renewTime"), spec.get("leaseTransitions"))
        ours = holder_pod(record[0]) == self.pod
        elected = False
        with self._lock:
            if not ours:
                self._changed_at, self._ready = None, False
            elif record != self._record:
                elected = self._changed_at is None or not self._ready
                self._changed_at = self.clock()
            self._record = record
        if elected:
            log.info("kube-scheduler in this pod leads (%s/%s): binding once the cache is synced", self.namespace, self.name)
            self.on_elected()
            with self._lock:
                self._ready = self._changed_at is not None
        return ours

    def poll_once(self) -> bool:
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise
            return self.observe(None)
        return self.observe(json.loads(resp.data))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception as e:  # the API is slow or down: is_leader() lapses by itself
                log.warning("kube-scheduler lease %s/%s: %s", self.namespace, self.name, e)
            stop.wait(self.poll_s)
