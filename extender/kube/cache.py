"""Feeds the `Extender` from the Kubernetes API: list, then watch from the list's resourceVersion.

A watch that ends (server timeout) resumes from the last resourceVersion it saw; one that gets
410 Gone (history compacted) relists. A relist does not start from empty: it upserts what it
finds and deletes what is gone, so bind reservations in flight survive it. The extender reports
NotReady until the first full list of nodes and pods has been applied.

A relist runs beside the other kind's watch (and a list is a snapshot that may be older than
events already applied), so every object's newest applied resourceVersion is kept, deletions
included: a state older than the one applied is skipped. Without this a pod deleted while a list
was in flight came back from the list and held its GPUs forever. resourceVersions are compared as
the integers etcd3 makes them; one that is not an integer is applied as it comes.

Every object is read on its own, and nothing one object holds can stop the watch: converting or
applying an object that raises anything at all records it as a bad object (watch_health.py: shown
in /inspect and the metrics, and an Event on it) and the watch goes on with the next event.
Skipping keeps the *last good state*: a pod the extender counts keeps its GPUs through a bad update
(releasing them would hand them out twice), a node keeps its last good inventory, and a deletion
is applied by UID or name whatever else its body holds. Before this, one pod whose assignment MAC
made the comparison raise was retried forever: deletions were never applied, new pods never seen,
and after a restart the first sync never completed.

The watch is read as raw JSON lines (no client model objects: they cost CPU per event and their
own validation could raise on an object the apiserver accepted), and the watch threads never die:
anything they meet is logged, backed off and retried, and a watch down for more than
watch_health.STALL_S turns /readyz false until it is back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from ..core.model import RequestError
from ..runtime import tune_gc
from ..service import Extender
from ..translate.objects import BOUND_REASON, AnnotationError, annotation_problems, node_inventory, pod_info
from .preemptor import Preemptor
from .waiting import WAITING_REASON, WaitingReasons, kube_said_tessera_words, kube_scheduler_message

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240
# a socket read that waits this long means a dead connection: the apiserver ends every watch at
# WATCH_TIMEOUT_S, so a healthy one is never silent longer than that
WATCH_READ_TIMEOUT_S = WATCH_TIMEOUT_S + 30
MAX_TOMBSTONES = 50_000  # a list takes seconds; this many deletions take far longer
MAX_BACKOFF_S = 10.0  # between tries of a failing watch: well under watch_health.STALL_S, so recovery shows quickly
EVENT_QUEUE = 1_000  # Events waiting to be written; beyond it they are dropped, never waited for
EVENTS_PER_MINUTE = 60  # a tenant writing thousands of bad objects must not make us flood the apiserver
EVENT_REASON = "TesseraIgnoredObject"
REFUSED_REASON = "TesseraRefused"  # a pending pod the watch cannot read: filter refuses it in the same words
ANNOTATION_REASON = "TesseraBadAnnotation"  # a bound pod's tessera.dev/ input that does nothing
BIND_EVENTS_PER_MINUTE = 600  # binds come faster than bad objects; beyond this the annotation still says it
API_VERSIONS = {"PodGroup": "scheduling.x-k8s.io/v1alpha1"}  # kinds an Event may be about that are not core v1 (podgroups.py)
MAX_REFUSALS_REMEMBERED = 10_000  # pending pods whose refusal was judged: its words, and whether we said them
# What every replica's watch says about the same object: one Event for all of them (event_name)
WATCH_REASONS = frozenset({EVENT_REASON, REFUSED_REASON, ANNOTATION_REASON, WAITING_REASON})
_EVENT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def _meta(obj) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _rv(obj) -> str:
    rv = _meta(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _pending(kind: str, obj) -> bool:
    """A pod no node holds (any JSON: this object may have failed its checks)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    return kind == "Pod" and not (spec.get("nodeName") if isinstance(spec, dict) else None)


def _why(e: BaseException) -> str:
    """A RequestError says what is wrong in words; anything else is a bug worth its type name."""
    return str(e) if isinstance(e, RequestError) else f"{type(e).__name__}: {str(e)[:300]}"


def event_name(name: str, uid: str, reason: str, message: str) -> str:
    """The Event's own name: the object's, and a digest of whom it is about and what it says.

    The same words about the same object get the same name wherever and whenever they are written, so the
    apiserver keeps one Event (a second create is 409 AlreadyExists). The shipped Deployment runs two replicas,
    each with its own watch, and each wrote every TesseraRefused, TesseraWaiting and TesseraBadAnnotation
    under a generated name: a user saw each of them twice. A restarted extender, which remembers nothing it
    said, wrote them again too."""
    digest = hashlib.sha256("\0".join((uid, name, reason, message)).encode()).hexdigest()[:20]
    stem = name[:200].rstrip("-.")
    return f"{stem if _EVENT_NAME.fullmatch(stem) else 'object'}.tessera-{digest}"


# An Event waits at most this long for a gap between the verbs kube-scheduler waits on: under a steady stream of
# pods it is written late, never dropped for it (a bind Event says what is already true)
MAX_DEFER_S = 0.5
DEFER_POLL_S = 0.001


class EventSink:
    """Kubernetes Events, written by a background thread so the watch never waits.

    One Event per thing said: the caller says a thing once, and for what every replica's watch says
    (WATCH_REASONS) event_name makes a repeat, from another replica or from this one after a restart,
    the same Event. Binds and preemptions are said by the replica that acts, once per act, under a
    generated name. At most EVENTS_PER_MINUTE, and a full queue drops rather than blocks. Failures
    (no RBAC, no apiserver) are logged once.
    """

    def __init__(self, api, stop: threading.Event, per_minute: int = EVENTS_PER_MINUTE,
                 defer_while: Callable[[], bool] | None = None) -> None:
        """`defer_while`: while it says True (a filter or prioritize is being answered), a write waits, up to
        MAX_DEFER_S: the writer's CPU would otherwise come out of the call kube-scheduler is waiting on."""
        self.api, self.stop, self.per_minute = api, stop, per_minute
        self.defer_while = defer_while
        self._queue: queue.Queue = queue.Queue(maxsize=EVENT_QUEUE)
        self._sent: list[float] = []
        self.written = self.dropped = 0
        self.already = 0  # said before, by another replica or by this one before a restart: the apiserver's 409
        self._warned = False

    def offer(self, kind: str, namespace: str, name: str, uid: str, rv: str, message: str,
              reason: str = EVENT_REASON) -> None:
        try:
            self._queue.put_nowait((kind, namespace, name, uid, rv, message, reason))
        except queue.Full:
            self.dropped += 1

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            now = time.monotonic()
            self._sent = [t for t in self._sent if now - t < 60.0]
            if len(self._sent) >= self.per_minute:
                self.dropped += 1
                continue
            self._sent.append(now)
            self._wait_for_a_gap()
            try:
                self._write(*item)
                self.written += 1
            except ApiException as e:
                if e.status == 409:  # this very Event exists: said already
                    self.already += 1
                else:
                    self._failed(e)
            except Exception as e:  # RBAC, apiserver down, a name it refuses: the record in /inspect stays
                self._failed(e)

    def _wait_for_a_gap(self) -> None:
        if self.defer_while is None:
            return
        deadline = time.monotonic() + MAX_DEFER_S
        while self.defer_while() and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(DEFER_POLL_S)

    def _failed(self, e: Exception) -> None:
        self.dropped += 1
        if not self._warned:
            self._warned = True
            log.warning("cannot write Events on bad objects (%s); they stay listed in /inspect", _why(e))

    def _write(self, kind: str, namespace: str, name: str, uid: str, rv: str, message: str,
               reason: str = EVENT_REASON) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        involved = {"apiVersion": API_VERSIONS.get(kind, "v1"), "kind": kind, "name": name, "uid": uid}
        if rv:
            involved["resourceVersion"] = rv
        if namespace:
            involved["namespace"] = namespace
        text = (f"tessera ignored this state of the {kind.lower()}: {message}" if reason == EVENT_REASON
                else f"tessera will not place this pod until this is fixed: {message}"
                if reason == REFUSED_REASON else f"tessera: {message}")[:1024]
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"namespace": namespace or "default", **({"name": event_name(name, uid, reason, text)}
                             if reason in WATCH_REASONS else {"generateName": "tessera-"})},
                "involvedObject": involved, "reason": reason, "type": "Normal" if reason == BOUND_REASON else "Warning",
                "message": text,
                "source": {"component": "tessera-extender"}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        self.api.create_namespaced_event(namespace or "default", body, _preload_content=False)


class ApiCache:
    def __init__(self, api: CoreV1Api, extender: Extender, stop: threading.Event | None = None) -> None:
        self.api = api
        self.extender = extender
        self.health = extender.watch_health
        self.stop = stop or threading.Event()
        self.events = EventSink(api, self.stop)
        # waiting pods' GPU-level reasons: own queue, own rate, own Event budget (bad objects cannot starve it)
        self.waiting_events = EventSink(api, self.stop)
        self.waiting = WaitingReasons(extender, self.waiting_events)
        self.preemptor: Preemptor | None = None  # Tessera's own preemption (serve.py sets it; kube/preemptor.py)
        self.threads: list[threading.Thread] = []
        self._newest: dict[tuple[str, str], int] = {}  # (kind, name or uid) -> newest resourceVersion applied
        self._deleted: OrderedDict[tuple[str, str], None] = OrderedDict()  # tombstones, oldest first
        self._order = threading.Lock()  # check-and-apply is one step across the watch threads
        self._resume: dict[str, str] = {}  # watch kind -> the last resourceVersion it applied, kept across failures
        # pending pods refused for what they say: uid -> (the refusal's words, whether Tessera's Event said them)
        self._refusals: OrderedDict[str, tuple[str, bool]] = OrderedDict()

    # -- applying objects ------------------------------------------------------------------------

    def _in_order(self, kind: str, what: str, key: str, obj: dict) -> bool:
        """Record `obj` and say to apply it, unless a newer state of it was applied already (hold `_order`).

        Deleted objects' versions are kept a while (a list in flight must not bring them back), not forever.
        """
        try:
            rv = int(_rv(obj))
        except ValueError:
            return True
        if self._newest.get((what, key), -1) > rv:
            return False
        self._newest[(what, key)] = rv
        if kind == "DELETED":
            self._deleted[(what, key)] = None
            if len(self._deleted) > MAX_TOMBSTONES:
                self._newest.pop(self._deleted.popitem(last=False)[0], None)
        else:
            self._deleted.pop((what, key), None)
        return True

    def _bad(self, kind: str, ident: str, obj, e: BaseException, event: bool = True) -> bool:
        """Record one object state that could not be read or applied, and move on; True when the state is new.

        `event`: say it in an Event too (a pending pod's refusal is said by `_refused`, when kube-scheduler cannot)."""
        meta = _meta(obj)
        name, namespace, uid = (v if isinstance(v, str) else "" for v in (
            meta.get("name"), meta.get("namespace"), meta.get("uid")))
        key = f"{namespace}/{name}" if namespace else name
        why, rv = _why(e), _rv(obj)
        if not self.health.record_bad(kind, ident, key, uid, why, rv):
            return False  # this state was recorded already (a relist met it again)
        if isinstance(e, RequestError):
            log.warning("%s %s ignored: %s", kind.lower(), key or ident, why)
        else:
            log.warning("%s %s ignored: %s", kind.lower(), key or ident, why, exc_info=e)
        if name and event:
            self.events.offer(kind, namespace, name, uid, rv, why, REFUSED_REASON if _pending(kind, obj) else EVENT_REASON)
        return True

    def _refused(self, uid: str, obj: dict, e: BaseException) -> None:
        """A pending pod refused for what it says (filter refuses it in the same words): said once, where a user looks.

        Whenever kube-scheduler asks Tessera's filter about the pod, filter's refusal is the message of
        kube-scheduler's own FailedScheduling Event (`kubectl describe pod` shows it), so an Event of
        Tessera's with the same words said the refusal twice. Tessera's TesseraRefused Event now says only
        what kube-scheduler cannot: it is written once kube-scheduler has marked the pod unschedulable
        with a message that does not carry Tessera's words, i.e. when kube's own checks (CPU, taints, node
        affinity, the GPU count) refused every node and Tessera was never asked, or when the message is
        over the 1024 bytes the apiserver takes for an Event (kube-scheduler's Event was refused). Not
        before kube-scheduler has tried the pod: its first try comes at once, and its status write is a
        new watch event. Once per pod and words: every later state of the pod (kube-scheduler's status
        writes, the kubelet's, a relist) with the same refusal says nothing more, and the metric counts
        the refusal once too. Every replica judges alike, and event_name makes theirs one Event.
        """
        words = _why(e)
        last = self._refusals.pop(uid, None)
        said = last is not None and last[0] == words and last[1]
        if last is None or last[0] != words:  # a new refusal of this pod: counted once
            if isinstance(e, AnnotationError):
                self.health.count_annotation_problems(p.category for p in annotation_problems(obj))
        message = kube_scheduler_message(obj)
        if not said and message is not None and not kube_said_tessera_words(message):
            meta = _meta(obj)
            self.events.offer("Pod", str(meta.get("namespace") or ""), str(meta.get("name") or ""), uid, _rv(obj),
                              words, REFUSED_REASON)
            said = True
        self._refusals[uid] = (words, said)
        while len(self._refusals) > MAX_REFUSALS_REMEMBERED:
            self._refusals.popitem(last=False)

    def _node(self, kind: str, obj: dict) -> None:
        self._guarded("Node", "name", kind, obj, self._apply_node)

    def _apply_node(self, kind: str, name: str, obj: dict) -> None:
        if kind == "DELETED":
            self.extender.delete_node(name)
            self.health.forget_bad("Node", name)
            return
        try:
            inv = node_inventory(obj)
            self.extender.upsert_node(inv)
        except Exception as e:  # the node keeps its last good state
            self._bad("Node", name, obj, e)
            return
        self.health.forget_bad("Node", name)

    def _pod(self, kind: str, obj: dict) -> None:
        self._guarded("Pod", "uid", kind, obj, self._apply_pod)

    def _guarded(self, what: str, field: str, kind: str, obj: dict, apply) -> None:
        """Apply one object in resourceVersion order, keyed by its `field`; whatever it holds, the watch goes on."""
        try:
            key = _meta(obj).get(field)
            if not isinstance(key, str) or not key:
                raise RequestError(f"a {what} without a {field}")
            with self._order:
                if self._in_order(kind, what.lower(), key, obj):
                    apply(kind, key, obj)
        except Exception as e:
            self._bad(what, str(_meta(obj).get(field))[:253], obj, e)

    def _apply_pod(self, kind: str, uid: str, obj: dict) -> None:
        if kind == "DELETED":  # by UID, whatever else the body holds: its GPUs must come back
            self.extender.delete_pod(uid)
            self.health.forget_bad("Pod", uid)
            self.waiting.forget(uid)
            self._refusals.pop(uid, None)
            return
        try:
            info = pod_info(obj, self.extender.signer)
            self.extender.upsert_pod(info)
        except Exception as e:  # a pod the extender counts keeps what it holds: releasing it would double-allocate
            pending = _pending("Pod", obj)
            self._bad("Pod", uid, obj, e, event=not pending)
            if pending:
                self._refused(uid, obj, e)
            return
        self.health.forget_bad("Pod", uid)
        self._refusals.pop(uid, None)
        if info.node:
            self._warn_annotations(uid, obj)
            self.waiting.forget(uid)
        else:
            self.waiting.offer(info, obj, _rv(obj))  # judged off this thread, only if kube marked it unschedulable
            if self.preemptor is not None:
                self.preemptor.offer(info, obj)

    def _warn_annotations(self, uid: str, obj: dict) -> None:
        """A bound pod keeps what it holds, but its tessera.dev/ input that does nothing is said once.

        Once per pod and words, not per state: the kubelet writes a running pod's status several times, and
        each write said the same warning again."""
        problems = annotation_problems(obj)
        if not problems:
            return
        why = "; ".join(str(p) for p in problems)
        if not self.health.record_annotation_state(uid, why):  # keyed by what is said, not the resourceVersion
            return
        self.health.count_annotation_problems(p.category for p in problems)
        meta = _meta(obj)
        log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), why)
        self.events.offer("Pod", str(meta.get("namespace") or ""), str(meta.get("name") or ""), uid, _rv(obj),
                          f"annotations that do nothing on this bound pod: {why}", ANNOTATION_REASON)

    # -- list and watch --------------------------------------------------------------------------

    def _list(self, fn: Callable, apply: Callable[[str, dict], None], known: Callable[[], set[str]], key: str) -> str:
        resp = fn(_preload_content=False)
        body = json.loads(resp.data)
        rv = body["metadata"]["resourceVersion"]
        seen = set()
        for obj in body.get("items") or []:
            apply("ADDED", obj)
            ident = _meta(obj).get(key)
            if isinstance(ident, str):
                seen.add(ident)
        for gone in known() - seen:  # at the list's version: an object a watch added since stays
            apply("DELETED", {"metadata": {key: gone, "resourceVersion": rv}})
        return rv

    def relist(self) -> tuple[str, str]:
        nodes_rv = self._list(self.api.list_node, self._node, lambda: set(self.extender.cluster.by_name), "name")
        pods_rv = self._list(self.api.list_pod_for_all_namespaces, self._pod, lambda: set(self.extender.pods), "uid")
        self.extender.mark_synced()
        return nodes_rv, pods_rv

    def _watch(self, fn: Callable, apply: Callable[[str, dict], None], rv: str, what: str) -> str:
        """One watch request, from `rv` until the apiserver ends it; returns the last resourceVersion seen."""
        try:
            resp = fn(watch=True, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True,
                      _preload_content=False, _request_timeout=(10, WATCH_READ_TIMEOUT_S))
        except ApiException as e:
            if e.status == 410:
                raise _Gone() from None
            raise
        try:
            status = getattr(resp, "status", 200)
            if status == 410:
                raise _Gone()
            if not 200 <= status <= 299:
                raise RuntimeError(f"watch answered HTTP {status}")
            self.health.watch_ok(what)  # connected: the apiserver streams from rv on
            for line in _lines(resp):
                if self.stop.is_set():
                    break
                rv = self._resume[what] = self._event(line, apply, rv, what)
        finally:
            for close in ("close", "release_conn"):
                try:
                    getattr(resp, close, lambda: None)()
                except Exception:
                    pass
        return rv

    def _event(self, line: bytes, apply: Callable[[str, dict], None], rv: str, what: str) -> str:
        return watch_event(line, what, apply, lambda e: self._bad(what, "?", {}, e), rv)  # _node and _pod never raise

    def _loop(self, fn, apply, rv: str, which: int, what: str) -> None:
        """One kind's watch, for as long as the extender runs: no exception ends this thread."""
        backoff = 1.0
        while not self.stop.is_set():
            try:
                try:
                    rv = self._watch(fn, apply, rv, what)
                    backoff = 1.0
                except _Gone:
                    log.info("%s watch expired (410); relisting", what.lower())
                    rv = self.relist()[which]
            except Exception as e:  # network errors, apiserver restarts, a failed relist: back off and resume
                self.health.watch_failed(what, _why(e))
                log.warning("%s watch failed (%s); retrying in %.0f s", what.lower(), _why(e), backoff)
                self.stop.wait(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
                rv = self._resume.get(what, rv)  # a watch that broke mid-stream resumes after its last event
                try:
                    rv = self.relist()[which]
                except Exception as e2:
                    self.health.watch_failed(what, f"relist failed: {_why(e2)}")
                    log.warning("relist failed (%s)", _why(e2))

    def start(self) -> None:
        """First full sync (retrying until the API answers), then one watch thread per kind."""
        for name, target in (("events", self.events.run), ("waiting-events", self.waiting_events.run),
                             ("waiting", lambda: self.waiting.run(self.stop))):
            t = threading.Thread(target=target, daemon=True, name=name)
            t.start()
            self.threads.append(t)
        while not self.stop.is_set():
            try:
                nodes_rv, pods_rv = self.relist()
                tune_gc()  # the synced cache is the long-lived graph the collector should not rescan
                break
            except Exception as e:
                log.warning("initial list failed (%s); retrying", _why(e))
                self.stop.wait(2.0)
        else:
            return
        for fn, apply, rv, which, what in ((self.api.list_node, self._node, nodes_rv, 0, "Node"),
                                           (self.api.list_pod_for_all_namespaces, self._pod, pods_rv, 1, "Pod")):
            t = threading.Thread(target=self._loop, args=(fn, apply, rv, which, what), daemon=True, name=f"watch-{which}")
            t.start()
            self.threads.append(t)
        t = threading.Thread(target=self._expire, daemon=True, name="bind-holds")
        t.start()
        self.threads.append(t)

    def _expire(self) -> None:
        while not self.stop.wait(5.0):
            try:
                n = self.extender.expire_reservations()
            except Exception as e:
                log.warning("expiring reservations failed: %s", _why(e), exc_info=e)
                continue
            if n:
                log.info("dropped %d reservations the watch never confirmed", n)


def watch_event(line: bytes, what: str, apply: Callable[[str, dict], None], bad: Callable[[Exception], object],
                rv: str) -> str:
    """One line of a watch of `what` (Pod, Node, PodGroup): applied, or given to `bad` as unreadable; the
    resourceVersion to resume from. Only a 410 ends the watch (_Gone)."""
    try:
        event = json.loads(line)
        kind, raw = event["type"], event.get("object")
        if not isinstance(raw, dict) or not isinstance(kind, str):
            raise RequestError("a watch event without a type or an object")
    except Exception as e:
        bad(RequestError(f"unreadable {what} watch event ({_why(e)}): {line[:80]!r}"))
        return rv
    if kind == "ERROR":
        if raw.get("code") == 410:
            raise _Gone()
        log.warning("%s watch error: %s", what.lower(), str(raw.get("message"))[:300])
        return rv
    rv = _rv(raw) or rv
    if kind != "BOOKMARK":
        apply(kind, raw)
    return rv


def _lines(resp) -> Iterator[bytes]:
    """The watch's newline-separated JSON events, as bytes, from a streaming HTTP response.

    Each chunk is scanned once (a megabyte-sized pod arriving in small chunks is not rescanned per chunk).
    """
    parts: list[bytes] = []
    for chunk in resp.stream(amt=None, decode_content=False) if hasattr(resp, "stream") else iter([resp.data]):
        chunk = chunk if isinstance(chunk, bytes) else str(chunk).encode()
        while True:
            cut = chunk.find(b"\n")
            if cut < 0:
                if chunk:
                    parts.append(chunk)
                break
            parts.append(chunk[:cut])
            line, parts, chunk = b"".join(parts), [], chunk[cut + 1:]
            if line.strip():
                yield line
    line = b"".join(parts)
    if line.strip():
        yield line
