"""The bridge's thin Kubernetes side: watch pods, create and delete pods, write events.

Everything it reads becomes plain API dicts (camelCase) for decide.py; everything it writes is
one API call. The watch runs in its own thread and only fills a snapshot the main loop reads.
The bridge never patches pods: the job writes its own phase and progress (raybridge/job.py).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time

from .bridge import NEVER_NAMESPACES, Forbidden
from .contract import is_ray_pod

log = logging.getLogger("tessera.bridge")

# pods per list call: the apiserver's own default page for kubectl; one unpaged list of a
# 100,000-pod cluster is one response of hundreds of MiB held at once in the apiserver and here
LIST_PAGE = 500


class PodWatch:
    """A live snapshot of the Ray job pods, kept by list + watch (re-listed when the watch ends)."""

    def __init__(self, api, namespace: str | None = None) -> None:
        self.api, self.namespace = api, namespace
        self._pods: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self._stop = threading.Event()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self._pods.values())

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """List once, then watch from the list's resourceVersion, resuming after each normal end of
        the watch; list again only when the watch fails (410 Gone, API restarts)."""
        while not self._stop.is_set():
            try:
                pods, rv = self._list()
                with self._lock:
                    self._pods = {self._key(p): p for p in pods}
                self.synced.set()
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except Exception as e:  # API restarts, expired resource versions: list again
                log.warning("pod watch: %s; listing again", e)
                time.sleep(1)

    def _watch(self, rv: str) -> str:
        from kubernetes import watch

        w = watch.Watch()
        kwargs = {"resource_version": rv, "timeout_seconds": 240, "allow_watch_bookmarks": True}
        stream = (w.stream(self.api.list_namespaced_pod, self.namespace, **kwargs) if self.namespace
                  else w.stream(self.api.list_pod_for_all_namespaces, **kwargs))
        try:
            for event in stream:
                pod = event.get("raw_object") or self._dict(event["object"])
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch error: {pod.get('message', pod)}")
                rv = (pod.get("metadata") or {}).get("resourceVersion", rv)
                if event["type"] != "BOOKMARK":
                    with self._lock:
                        if event["type"] == "DELETED" or not is_ray_pod(pod):
                            self._pods.pop(self._key(pod), None)
                        else:
                            self._pods[self._key(pod)] = pod
                if self._stop.is_set():
                    break
        finally:
            w.stop()
        return rv

    def _list(self) -> tuple[list[dict], str]:
        """The Ray pods, listed LIST_PAGE at a time (limit/continue), and the list's resourceVersion.
        Only Ray pods are kept between pages. An expired continue token raises: run() lists again."""
        pods, token = [], None
        while True:
            kwargs = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
            page = (self.api.list_namespaced_pod(self.namespace, **kwargs) if self.namespace
                    else self.api.list_pod_for_all_namespaces(**kwargs))
            pods += [p for p in (self._dict(o) for o in page.items) if is_ray_pod(p)]
            token = getattr(page.metadata, "_continue", None)
            if not token:
                return pods, page.metadata.resource_version

    def _dict(self, obj) -> dict:
        return self.api.api_client.sanitize_for_serialization(obj)

    @staticmethod
    def _key(pod: dict) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


class PodWriter:
    """The bridge's writes: replacement pods, deletes of its own pods (by UID), events."""

    def __init__(self, api) -> None:
        self.api = api

    def event(self, key: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        ns, name = key.split("/", 1)
        now = datetime.datetime.now(datetime.UTC).isoformat()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
                "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
                "source": {"component": "tessera-bridge"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        self._quiet(lambda: self.api.create_namespaced_event(ns, body), f"event on {key}")

    def create(self, body: dict) -> str:
        """Create the pod; its UID ('' when refused: quota, admission, a name taken meanwhile). Raises Forbidden when
        the apiserver's RBAC refuses it (the namespace is not enabled for Ray jobs)."""
        from kubernetes.client.exceptions import ApiException

        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        _never(ns)
        try:
            created = self.api.create_namespaced_pod(ns, body)
        except ApiException as e:
            _raise_if_unauthorised(e, ns, "create")
            log.warning("create %s/%s: %s %s", ns, name, e.status, e.reason)
            return ""
        return str(getattr(created.metadata, "uid", "") or "")

    def delete(self, key: str, uid: str) -> None:
        """Delete exactly the pod with this UID: a same-named pod made since is left alone (409). Raises Forbidden
        when the apiserver's RBAC refuses it."""
        from kubernetes.client.exceptions import ApiException

        ns, name = key.split("/", 1)
        _never(ns)
        try:
            self.api.delete_namespaced_pod(name, ns, body={"preconditions": {"uid": uid}})
        except ApiException as e:
            _raise_if_unauthorised(e, ns, "delete")
            log.warning("delete %s: %s %s", key, e.status, e.reason)

    @staticmethod
    def _quiet(call, what: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call()
        except ApiException as e:
            log.warning("%s: %s %s", what, e.status, e.reason)


def _never(namespace: str) -> None:
    """The bridge's last word on NEVER_NAMESPACES: Bridge skips their jobs, and no write reaches them even if it did not."""
    if namespace in NEVER_NAMESPACES:
        raise ValueError(f"the bridge never writes pods in namespace {namespace}")


def _raise_if_unauthorised(e, namespace: str, verb: str) -> None:
    """Forbidden when the apiserver's authorizer refused the call: a 403 whose Status message says the user
    `cannot VERB resource "pods"` (kube-apiserver's words for an RBAC denial). Admission and quotas answer 403 too
    ("exceeded quota", "violates PodSecurity"): those pass, a refused create the slot's backoff retries."""
    if e.status != 403:
        return
    try:
        message = str(json.loads(e.body).get("message", ""))
    except (TypeError, ValueError, AttributeError):
        message = str(e.body or "")
    if f'cannot {verb} resource "pods"' in message:
        raise Forbidden(namespace, verb, message[:300]) from None
