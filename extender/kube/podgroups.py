"""scheduler-plugins' PodGroups (`scheduling.x-k8s.io/v1alpha1`, kind PodGroup) as a gang source: each object read
strictly, and the extender's copy kept by one watch of all namespaces.

What Tessera reads of a PodGroup
--------------------------------
`spec.minMember` (that many pods labelled `scheduling.x-k8s.io/pod-group: <name>` are placed together before any
is bound) and `spec.scheduleTimeoutSeconds` (how long an admitted gang's GPUs wait for the members not bound yet).
Nothing else:

* `spec.minResources` is ignored, well-formed or not. Kubeflow's training operator and KubeRay fill it with the sum
  of the members' requests, and scheduler-plugins' coscheduling uses it as a cluster-wide pre-check before it tries
  a gang. Tessera's gang admission places every member not yet placed on the cluster (extender/gangs.py), which
  answers the same question per node and per GPU; a coarser sum would add a quantity parser, and its own
  ways to fail, for a check that is already made better.
* `status` belongs to the coscheduling controller, which need not run beside Tessera.

The reader's bounds
-------------------
* metadata: namespace an RFC 1123 label, name an RFC 1123 subdomain (what the apiserver enforces for both).
* minMember: a whole number from 1 to MAX_GANG_SIZE (Tessera's bound for its own gangs: the gang check is bounded
  work). The CRD scheduler-plugins publishes today says `minimum: 1` and has no default; its older CRDs had no
  minimum, and coscheduling reads a missing or 0 minMember as a gang of 0 that every pod passes. Tessera refuses
  both in words rather than guess a size: a PodGroup exists to ask for all-or-nothing.
* scheduleTimeoutSeconds: absent (or null) means Tessera's default; otherwise a whole number from 1 to 86400. The
  CRD bounds it only as an int32. Coscheduling uses its own default (60 s) when it is absent and waits exactly what
  is written otherwise, so 0 is a gang that cannot wait for its second member and a negative number means nothing:
  both refused. A day is the top: GPUs held longer than that for members that have not come are a leak, not a wait.
* Anything else in the spec is ignored: newer scheduler-plugins fields must not make a PodGroup unreadable.

A PodGroup state that fails these is recorded (watch_health: /inspect's `bad_objects`, the
`tessera_bad_objects{kind="PodGroup"}` counter, a log line and a Warning Event once per state) and the group is
forgotten until a good state comes: its pods then name a PodGroup Tessera does not know and wait. The pod watch
keeps a pod's last good state because its GPUs must not be handed out twice; a PodGroup holds nothing, and its
last good size could bind a gang smaller than the one its owner now asks for.

The watch
---------
Like the pod watch (cache.py, whose line reader and helpers it uses): list, then watch from the list's
resourceVersion, raw JSON lines, every object read on its own and a bad one skipped, a state older than the one
applied skipped, deletions applied by namespace/name, a relist on 410 Gone (deleting what the list no longer has),
backoff on errors, and a thread that no exception ends. Its requests are built by `param_serialize` from literal
paths, which tests/test_manifests.py reads to check the ClusterRole. Three states of the API are told to the
extender (`pod_groups_served`, so pods that name a PodGroup are refused in the same words) and logged once each:

* 404 on the list: the CRD is not installed. Asked again every RECHECK_S, so a CRD installed later is picked up.
* 403: the ClusterRole lacks the rule; the words name it. Asked again every RECHECK_S.
* the list or watch failing for longer than watch_health.STALL_S: the copy may be stale, so PodGroup gangs wait
  until the watch is back. This watch does not turn /readyz false: an extender whose nodes and pods are current
  keeps placing everything else.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from tessera_contract.keys import MAX_GANG_SIZE, MAX_NAME_CHARS

from ..core.model import RequestError
from ..service import Extender
from ..state import PodGroup
from ..watch_health import STALL_S
from .cache import (
    MAX_BACKOFF_S,
    MAX_TOMBSTONES,
    WATCH_READ_TIMEOUT_S,
    WATCH_TIMEOUT_S,
    EventSink,
    _Gone,
    _lines,
    _meta,
    _rv,
    _why,
    watch_event,
)

log = logging.getLogger(__name__)

KIND = "PodGroup"
MAX_TIMEOUT_S = 86_400  # a day: scheduleTimeoutSeconds above it is refused (the module docstring says why)
RECHECK_S = 60.0  # a cluster without the CRD, or without the RBAC rule, is asked again this often
LIST_TIMEOUT = (10, 60)  # (connect, read) seconds for one list
MISSING = "the PodGroup CRD (scheduling.x-k8s.io/v1alpha1) is not installed in this cluster"
FORBIDDEN = ("the API refused to {verb} PodGroups (HTTP 403): tessera's ClusterRole needs the rule apiGroups "
             "[scheduling.x-k8s.io], resources [podgroups], verbs [list, watch] (manifests/base/extender/rbac.yaml "
             "has it: apply it again)")

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAMESPACE = re.compile(_LABEL)
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


# -- one PodGroup ----------------------------------------------------------------------------------

def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _got(value: object) -> str:
    """What a field held, in a few bounded characters (huge numbers, long strings and control characters included)."""
    if value is None:
        return "nothing"
    if _whole(value) and abs(value) >= 10**18:
        return f"a {value.bit_length()}-bit number"
    kind = {str: "a string", bool: "a boolean", float: "a decimal number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__)
    if isinstance(value, list | dict):
        return kind
    text = repr(value)
    text = text if len(text) <= 40 else f"{text[:37]}..."
    return text if _whole(value) else f"{text} ({kind})"


def pod_group_key(obj: object) -> str:
    """`namespace/name` of a PodGroup object, both as the apiserver allows them; RequestError in words otherwise."""
    if not isinstance(obj, dict):
        raise RequestError(f"a PodGroup must be a JSON object; got {_got(obj)}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise RequestError(f"a PodGroup's metadata must be an object; got {_got(meta)}")
    namespace, name = meta.get("namespace"), meta.get("name")
    if not (isinstance(namespace, str) and _NAMESPACE.fullmatch(namespace)):
        raise RequestError("a PodGroup's metadata.namespace must be a namespace name (an RFC 1123 label: lower-case "
                           f"letters, digits and '-', at most 63); got {_got(namespace)}")
    if not (isinstance(name, str) and len(name) <= MAX_NAME_CHARS and _NAME.fullmatch(name)):
        raise RequestError(f"PodGroup in {namespace}: metadata.name must be an RFC 1123 subdomain (lower-case letters, "
                           f"digits, '-' and '.', at most {MAX_NAME_CHARS}); got {_got(name)}")
    return f"{namespace}/{name}"


def read_pod_group(obj: object) -> PodGroup:
    """One PodGroup object as Tessera reads it (the module docstring gives the bounds and why), or RequestError."""
    key = pod_group_key(obj)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise RequestError(f"PodGroup {key}: spec must be an object holding minMember (1 to {MAX_GANG_SIZE}); "
                           f"got {_got(spec)}")
    members = spec.get("minMember")
    if members is None:
        raise RequestError(f"PodGroup {key}: spec.minMember is missing; it must be a whole number from 1 to "
                           f"{MAX_GANG_SIZE}, the pods that start together (the CRD has no default, and Tessera "
                           "will not guess a gang's size)")
    if not (_whole(members) and 1 <= members <= MAX_GANG_SIZE):
        zero = _whole(members) and members == 0
        raise RequestError(f"PodGroup {key}: spec.minMember must be a whole number from 1 to {MAX_GANG_SIZE}; "
                           f"got {_got(members)}"
                           + (" (the PodGroup CRD's minimum is 1: a gang of 0 holds nothing together)" if zero else ""))
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and not (_whole(timeout) and 1 <= timeout <= MAX_TIMEOUT_S):
        raise RequestError(f"PodGroup {key}: spec.scheduleTimeoutSeconds must be absent (Tessera's default) or a whole "
                           f"number of seconds from 1 to {MAX_TIMEOUT_S} (a day); got {_got(timeout)}")
    return PodGroup(key, members, None if timeout is None else float(timeout))


# -- the watch --------------------------------------------------------------------------------------

class _Unserved(Exception):
    """The API serves no PodGroups to this extender: 404 (no CRD) or 403 (no RBAC rule), with why in words."""

    def __init__(self, why: str, status: int) -> None:
        super().__init__(why)
        self.why, self.status = why, status


def _check(resp, verb: str) -> None:
    """Raise for an answer that is not 2xx: _Unserved (404, 403), _Gone (410), RuntimeError (anything else)."""
    status = getattr(resp, "status", 200)
    if 200 <= status <= 299:
        return
    try:
        body = bytes(resp.read() or b"")[:300].decode("utf-8", "replace")
    except Exception:
        body = ""
    if status == 404:
        raise _Unserved(MISSING, 404)
    if status == 403:
        raise _Unserved(FORBIDDEN.format(verb=verb), 403)
    if status == 410:
        raise _Gone()
    raise RuntimeError(f"the PodGroup {verb} answered HTTP {status}: {body!r}")


def _close(resp) -> None:
    for close in ("close", "release_conn"):
        try:
            getattr(getattr(resp, "response", resp), close, lambda: None)()
        except Exception:
            pass


class PodGroupWatch:
    """Keeps `extender`'s PodGroups (upsert_pod_group, delete_pod_group, pod_groups_served) as the API has them.

    One thread runs `run`; `api_client` is a kubernetes ApiClient (or anything with its param_serialize and call_api).
    """

    def __init__(self, api_client, extender: Extender, stop: threading.Event | None = None,
                 events: EventSink | None = None, recheck_s: float = RECHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client, self.extender, self.events = api_client, extender, events
        self.health = extender.watch_health
        self.stop = stop or threading.Event()
        self.recheck_s, self.clock = recheck_s, clock
        self.served = False  # what the extender was last told
        self._applied: dict[str, PodGroup] = {}  # key -> the state the extender holds
        self._present: set[str] = set()  # keys whose latest state is not a deletion, good or bad
        self._newest: dict[str, int] = {}  # key -> newest resourceVersion applied, deletions included
        self._deleted: OrderedDict[str, None] = OrderedDict()  # tombstones, oldest first
        self._rv = ""  # where the watch resumes; "" lists first
        self._said = ""  # the unserved state last logged, so each is said once
        self._failing_since: float | None = None

    # -- the API's answers -------------------------------------------------------------------------

    def _list(self) -> dict:
        method, url, headers, _, _ = self.api_client.param_serialize(
            "GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = self.api_client.call_api(method, url, header_params=headers, _request_timeout=LIST_TIMEOUT)
        try:
            _check(resp, "list")
            return json.loads(resp.read())
        finally:
            _close(resp)

    def _open_watch(self, rv: str):
        method, url, headers, _, _ = self.api_client.param_serialize(
            "GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
            query_params=[("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", WATCH_TIMEOUT_S),
                          ("allowWatchBookmarks", "true")],
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = self.api_client.call_api(method, url, header_params=headers,
                                        _request_timeout=(10, WATCH_READ_TIMEOUT_S))
        try:
            _check(resp, "watch")
        except BaseException:
            _close(resp)
            raise
        return resp

    # -- applying objects --------------------------------------------------------------------------

    def _in_order(self, kind: str, key: str, obj: dict) -> bool:
        """Record `obj`'s resourceVersion and say to apply it, unless a newer state of the group was applied."""
        try:
            rv = int(_rv(obj))
        except ValueError:
            return True
        if self._newest.get(key, -1) > rv:
            return False
        self._newest[key] = rv
        if kind == "DELETED":
            self._deleted[key] = None
            if len(self._deleted) > MAX_TOMBSTONES:
                self._newest.pop(self._deleted.popitem(last=False)[0], None)
        else:
            self._deleted.pop(key, None)
        return True

    def _apply(self, kind: str, obj: dict) -> None:
        """One PodGroup state: applied, or recorded as bad; nothing it holds escapes."""
        try:
            key = pod_group_key(obj)
        except Exception as e:
            self._bad("?", obj, e)
            return
        try:
            if not self._in_order(kind, key, obj):
                return
            if kind == "DELETED":  # by namespace/name, whatever else the body holds
                self._forget(key)
                return
            self._present.add(key)
            group = read_pod_group(obj)
            self.extender.upsert_pod_group(group)
        except Exception as e:
            self._drop(key)
            self._bad(key, obj, e)
            return
        self.health.forget_bad(KIND, key)
        if self._applied.get(key) != group:
            wait = "Tessera's default" if group.timeout_s is None else f"{group.timeout_s:.0f} s"
            log.info("podgroup %s: a gang of %d (scheduleTimeoutSeconds: %s)", key, group.min_member, wait)
        self._applied[key] = group

    def _drop(self, key: str) -> None:
        self._applied.pop(key, None)
        try:
            self.extender.delete_pod_group(key)
        except Exception as e:
            log.warning("podgroup %s: forgetting it failed: %s", key, _why(e), exc_info=e)

    def _forget(self, key: str) -> None:
        if key in self._applied:
            log.info("podgroup %s deleted", key)
        self._present.discard(key)
        self._drop(key)
        self.health.forget_bad(KIND, key)

    def _bad(self, key: str, obj, e: BaseException) -> None:
        """Record one PodGroup state that could not be read or applied (once per state), and move on."""
        meta = _meta(obj)
        uid = meta.get("uid") if isinstance(meta.get("uid"), str) else ""
        why, rv = _why(e), _rv(obj)
        if not self.health.record_bad(KIND, key, "" if key == "?" else key, uid, why, rv):
            return
        log.warning("podgroup %s ignored: %s", key, why, exc_info=None if isinstance(e, RequestError) else e)
        if key != "?" and self.events is not None:
            namespace, name = key.split("/", 1)
            self.events.offer(KIND, namespace, name, uid, rv, why)

    # -- list and watch ----------------------------------------------------------------------------

    def relist(self) -> str:
        """List every PodGroup, apply each, delete what is gone; the list's resourceVersion."""
        body = self._list()
        body = body if isinstance(body, dict) else {}
        meta, items = body.get("metadata"), body.get("items") or []
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(rv, str) or not isinstance(items, list):
            raise RequestError("the PodGroup list answered without a resourceVersion or a list of items")
        seen = set()
        for obj in items:
            self._apply("ADDED", obj)
            try:
                seen.add(pod_group_key(obj))
            except RequestError:
                pass
        for gone in self._present - seen:  # at the list's version
            namespace, name = gone.split("/", 1)
            self._apply("DELETED", {"metadata": {"namespace": namespace, "name": name, "resourceVersion": rv}})
        self._connected(f"{len(seen)} listed")
        return rv

    def _watch(self, rv: str) -> None:
        """One watch request from `rv` until the apiserver ends it; self._rv follows each event."""
        resp = self._open_watch(rv)
        try:
            self._connected("")
            for line in _lines(getattr(resp, "response", resp)):
                if self.stop.is_set():
                    break
                self._rv = self._event(line, self._rv)
        finally:
            _close(resp)

    def _event(self, line: bytes, rv: str) -> str:
        return watch_event(line, "PodGroup", self._apply, lambda e: self._bad("?", {}, e), rv)

    def _connected(self, listed: str) -> None:
        """The API answered: PodGroups are served, and the extender is told when that is news."""
        self._failing_since = None
        if not self.served:
            self.extender.pod_groups_served(True)
            log.info("PodGroups (scheduling.x-k8s.io/v1alpha1) are served%s; watching all namespaces",
                     f": {listed}" if listed else " again")
        self.served, self._said = True, ""

    def _unserved(self, e: _Unserved) -> None:
        if e.status == 404:  # no CRD: no PodGroup exists any more
            for key in self._present | set(self._applied):
                self._forget(key)
            self._newest.clear()
            self._deleted.clear()
        self.served = False
        self.extender.pod_groups_served(False, e.why)
        if e.why != self._said:
            self._said = e.why
            log.warning("%s; asking again every %.0f s", e.why, self.recheck_s)

    def _failing(self, why: str) -> None:
        """A list or watch failed; past STALL_S the copy may be stale, and PodGroup gangs wait until it is back."""
        now = self.clock()
        since = self._failing_since = now if self._failing_since is None else self._failing_since
        if self.served and now - since > STALL_S:
            self.served = False
            words = f"the PodGroup watch has been failing for {now - since:.0f} s ({why}); PodGroups may have changed"
            self.extender.pod_groups_served(False, words)
            log.warning("%s: their gangs wait until it is back", words)

    def _step(self) -> float:
        """List if needed, then watch once; the seconds to wait before the next step."""
        try:
            if not self._rv:
                self._rv = self.relist()
            self._watch(self._rv)
            return 0.0
        except _Gone:
            log.info("podgroup watch expired (410); relisting")
            self._rv = ""
            return 0.0
        except _Unserved as e:
            self._rv = ""
            self._unserved(e)
            return self.recheck_s

    def run(self) -> None:
        """For as long as the extender runs: no exception ends this thread."""
        backoff = 1.0
        while not self.stop.is_set():
            try:
                wait = self._step()
                backoff = 1.0
            except Exception as e:  # network errors, apiserver restarts, a failed list: back off, then resume
                try:
                    self._failing(_why(e))
                except Exception as e2:
                    log.warning("podgroup watch: %s", _why(e2), exc_info=e2)
                log.warning("podgroup %s failed (%s); retrying in %.0f s", "watch" if self._rv else "list", _why(e),
                            backoff)
                wait, backoff = backoff, min(2 * backoff, MAX_BACKOFF_S)
            if wait:
                self.stop.wait(wait)


def start(api_client, extender: Extender, stop: threading.Event) -> PodGroupWatch:
    """The PodGroup watch in a daemon thread, with its own Event budget (serve.py calls it after the pod cache)."""
    from kubernetes.client import CoreV1Api

    events = EventSink(CoreV1Api(api_client), stop)
    threading.Thread(target=events.run, daemon=True, name="podgroup-events").start()
    watch = PodGroupWatch(api_client, extender, stop, events)
    threading.Thread(target=watch.run, daemon=True, name="watch-podgroups").start()
    return watch
