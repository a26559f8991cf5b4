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
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from kubernetes import watch
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from ..core.model import RequestError
from ..runtime import tune_gc
from ..service import Extender
from .contract import node_inventory, pod_info

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240
MAX_TOMBSTONES = 50_000  # a list takes seconds; this many deletions take far longer


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class ApiCache:
    def __init__(self, api: CoreV1Api, extender: Extender, stop: threading.Event | None = None) -> None:
        self.api = api
        self.extender = extender
        self.stop = stop or threading.Event()
        self.threads: list[threading.Thread] = []
        self._newest: dict[tuple[str, str], int] = {}  # (kind, name or uid) -> newest resourceVersion applied
        self._deleted: OrderedDict[tuple[str, str], None] = OrderedDict()  # tombstones, oldest first
        self._order = threading.Lock()  # check-and-apply is one step across the watch threads

    # -- applying objects ------------------------------------------------------------------------

    def _in_order(self, kind: str, what: str, key: str, obj: dict) -> bool:
        """Record `obj` and say to apply it, unless a newer state of it was applied already (hold `_order`).

        Deleted objects' versions are kept a while (a list in flight must not bring them back), not forever.
        """
        try:
            rv = int((obj.get("metadata") or {}).get("resourceVersion"))
        except (TypeError, ValueError):
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

    def _node(self, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._order:
            if self._in_order(kind, "node", name, obj):
                self._apply_node(kind, name, obj)

    def _apply_node(self, kind: str, name: str, obj: dict) -> None:
        if kind == "DELETED":
            self.extender.delete_node(name)
            return
        try:
            self.extender.upsert_node(node_inventory(obj))
        except RequestError as e:
            log.warning("node %s ignored: %s", name, e)

    def _pod(self, kind: str, obj: dict) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        with self._order:
            if self._in_order(kind, "pod", uid, obj):
                self._apply_pod(kind, uid, obj)

    def _apply_pod(self, kind: str, uid: str, obj: dict) -> None:
        if kind == "DELETED":
            self.extender.delete_pod(uid)
            return
        try:
            self.extender.upsert_pod(pod_info(obj, self.extender.signer))
        except RequestError as e:
            log.warning("pod %s ignored: %s", uid, e)

    # -- list and watch --------------------------------------------------------------------------

    def _list(self, fn: Callable, apply: Callable[[str, dict], None], known: Callable[[], set[str]], key: str) -> str:
        resp = fn(_preload_content=False)
        body = json.loads(resp.data)
        rv = body["metadata"]["resourceVersion"]
        seen = set()
        for obj in body.get("items") or []:
            apply("ADDED", obj)
            seen.add(obj["metadata"][key])
        for gone in known() - seen:  # at the list's version: an object a watch added since stays
            apply("DELETED", {"metadata": {key: gone, "resourceVersion": rv}})
        return rv

    def relist(self) -> tuple[str, str]:
        nodes_rv = self._list(self.api.list_node, self._node, lambda: set(self.extender.cluster.by_name), "name")
        pods_rv = self._list(self.api.list_pod_for_all_namespaces, self._pod, lambda: set(self.extender.pods), "uid")
        self.extender.mark_synced()
        return nodes_rv, pods_rv

    def _watch(self, fn: Callable, apply: Callable[[str, dict], None], rv: str) -> str:
        w = watch.Watch()
        try:
            for event in w.stream(fn, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True):
                if self.stop.is_set():
                    break
                kind, raw = event["type"], event.get("raw_object") or {}
                if kind == "ERROR":
                    if raw.get("code") == 410:
                        raise _Gone()
                    log.warning("watch error: %s", raw.get("message"))
                    continue
                rv = (raw.get("metadata") or {}).get("resourceVersion", rv)
                if kind != "BOOKMARK":
                    apply(kind, raw)
        except ApiException as e:
            if e.status == 410:
                raise _Gone() from None
            raise
        finally:
            w.stop()
        return rv

    def _loop(self, fn, apply, rv: str, which: int) -> None:
        while not self.stop.is_set():
            try:
                rv = self._watch(fn, apply, rv)
            except _Gone:
                log.info("watch expired (410); relisting")
                rv = self.relist()[which]
            except Exception as e:  # network errors, apiserver restarts: back off and resume
                log.warning("watch failed (%s); retrying", e)
                self.stop.wait(1.0)
                try:
                    rv = self.relist()[which]
                except Exception as e2:
                    log.warning("relist failed (%s)", e2)
                    self.stop.wait(2.0)

    def start(self) -> None:
        """First full sync (retrying until the API answers), then one watch thread per kind."""
        while not self.stop.is_set():
            try:
                nodes_rv, pods_rv = self.relist()
                tune_gc()  # the synced cache is the long-lived graph the collector should not rescan
                break
            except Exception as e:
                log.warning("initial list failed (%s); retrying", e)
                self.stop.wait(2.0)
        else:
            return
        for fn, apply, rv, which in ((self.api.list_node, self._node, nodes_rv, 0),
                                     (self.api.list_pod_for_all_namespaces, self._pod, pods_rv, 1)):
            t = threading.Thread(target=self._loop, args=(fn, apply, rv, which), daemon=True, name=f"watch-{which}")
            t.start()
            self.threads.append(t)
        t = threading.Thread(target=self._expire, daemon=True, name="reservations")
        t.start()
        self.threads.append(t)

    def _expire(self) -> None:
        while not self.stop.wait(5.0):
            n = self.extender.expire_reservations()
            if n:
                log.info("dropped %d reservations the watch never confirmed", n)

