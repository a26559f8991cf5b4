"""An apiserver in memory for ApiCache: lists are snapshots, watches stream the events after a resourceVersion.

Just enough of CoreV1Api (list_node, list_pod_for_all_namespaces with and without watch=True,
create_namespaced_event) for the watch to run its real loop in its real threads: a test puts
objects, updates and deletions, and can make the watch fail (an apiserver that is down).
Objects are stored and streamed as given, hostile ones included: nothing here validates.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

from kubernetes.client.exceptions import ApiException

KINDS = ("node", "pod")


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
        self.store: dict[str, dict[str, dict]] = {"node": {}, "pod": {}}  # which -> key -> object
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
            key = obj["metadata"]["uid"] if which == "pod" else obj["metadata"]["name"]
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


def wait_for(condition, timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)
