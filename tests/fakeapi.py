"""An apiserver in memory for ApiCache: lists are snapshots, watches stream the events after a resourceVersion.

Just enough of CoreV1Api (list_node, list_pod_for_all_namespaces with and without watch=True,
create_namespaced_event) for the watch to run its real loop in its real threads: a test puts
objects, updates and deletions, and can make the watch fail (an apiserver that is down).
FakeApiClient answers the hand-built PodGroup requests (ApiClient.param_serialize and call_api) of
extender/kube/podgroups.py from the same store, with or without the CRD, with or without the RBAC rule.
Objects are stored and streamed as given, hostile ones included: nothing here validates.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlencode

from kubernetes.client.exceptions import ApiException

KINDS = ("node", "pod", "podgroup")
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"


class _Stream:
    """One watch response: the history after `rv`, then new events as they come, until the timeout."""

    def __init__(self, api: FakeApi, which: str, rv: int, timeout_s: float) -> None:
        self.api, self.which, self.rv, self.deadline = api, which, rv, time.monotonic() + timeout_s
        self.status = 200
        self.closed = False

    def stream(self, amt=None, decode_content=False):
        while not self.closed and time.monotonic() < self.deadline:
            with self.api.cond:
                if self.api.down:
                    raise ConnectionResetError("fake apiserver went away")
                if self.rv < self.api.compacted:
                    line = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
                    yield (line + "\n").encode()
                    return
                new = [(rv, kind, obj) for rv, w, kind, obj in self.api.history if w == self.which and rv > self.rv]
                if not new:
                    self.api.cond.wait(0.05)
                    continue
            for rv, kind, obj in new:
                self.rv = rv
                raw = obj if isinstance(obj, str) else json.dumps({"type": kind, "object": obj})
                yield (raw + "\n").encode()

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class FakeApi:
    def __init__(self, watch_timeout_s: float = 1.0) -> None:
        self.cond = threading.Condition()
        self.rv = 1
        self.store: dict[str, dict[str, dict]] = {k: {} for k in KINDS}  # which -> key -> object
        self.history: list[tuple[int, str, str, object]] = []  # (rv, which, type, object or a raw line)
        self.compacted = 0
        self.down = False
        self.watch_timeout_s = watch_timeout_s
        self.events: list[tuple[str, dict]] = []
        self.watch_calls = 0

    # -- what a test does --------------------------------------------------------------------------

    def put(self, which: str, kind: str, obj: dict) -> int:
        """ADDED / MODIFIED / DELETED one object (it gets the next resourceVersion), as the apiserver would."""
        with self.cond:
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            meta = obj["metadata"]
            key = {"pod": meta.get("uid"), "podgroup": f"{meta.get('namespace')}/{meta.get('name')}"}.get(which, meta.get("name"))
            if kind == "DELETED":
                self.store[which].pop(key, None)
            else:
                self.store[which][key] = obj
            self.history.append((self.rv, which, kind, obj))
            self.cond.notify_all()
            return self.rv

    def put_raw(self, which: str, line: str) -> None:
        """A line on the watch that is not a well-formed event (a test of the reader, not of the objects)."""
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, which, "", line))
            self.cond.notify_all()

    # -- what ApiCache calls -----------------------------------------------------------------------

    def _call(self, which: str, watch: bool = False, resource_version: str | None = None, timeout_seconds=None, **_):
        with self.cond:
            if self.down:
                raise ApiException(status=0, reason="fake apiserver is down")
            if watch:
                self.watch_calls += 1
                return _Stream(self, which, int(resource_version), min(self.watch_timeout_s, timeout_seconds or 1e9))
            items = list(self.store[which].values())
            return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": str(self.rv)}, "items": items}))

    def list_node(self, **kw):
        return self._call("node", **kw)

    def list_pod_for_all_namespaces(self, **kw):
        return self._call("pod", **kw)

    def create_namespaced_event(self, namespace, body, **_):
        with self.cond:
            self.events.append((namespace, body))


class _Answer:
    """A finished HTTP answer as call_api returns it (kubernetes.client.rest.RESTResponse's status and read)."""

    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data, self.response = status, data, self

    def read(self) -> bytes:
        return self.data

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FakeApiClient:
    """ApiClient.param_serialize and call_api for the PodGroups of `api`: 404 while `crd_installed` is False (as an
    apiserver without the CRD answers), 403 while `forbidden`, a failed connection while `api.down`."""

    def __init__(self, api: FakeApi, crd_installed: bool = True, forbidden: bool = False) -> None:
        self.api, self.crd_installed, self.forbidden = api, crd_installed, forbidden
        self.requests: list[tuple[str, str]] = []  # (method, url) of every request sent

    def param_serialize(self, method, resource_path, path_params=None, query_params=None, header_params=None, **_):
        assert not path_params and "{" not in resource_path
        url = resource_path + (f"?{urlencode(query_params)}" if query_params else "")
        return method, url, dict(header_params or {}), None, None

    def call_api(self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        self.requests.append((method, url))
        path, _, query = url.partition("?")
        q = dict(parse_qsl(query))
        if self.api.down:
            raise ConnectionResetError("fake apiserver is down")
        if method != "GET" or path != PODGROUPS or not self.crd_installed:
            return _Answer(404, b'{"kind":"Status","code":404,"reason":"NotFound"}')
        if self.forbidden:
            return _Answer(403, b'{"kind":"Status","code":403,"reason":"Forbidden"}')
        if q.get("watch") == "true":
            stream = self.api._call("podgroup", watch=True, resource_version=q["resourceVersion"],
                                    timeout_seconds=int(q["timeoutSeconds"]))
            return SimpleNamespace(status=200, response=stream, read=lambda: b"")
        return _Answer(200, self.api._call("podgroup").data.encode())


def wait_for(condition, timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)
