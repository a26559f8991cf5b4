"""A small live extender and the checks every fuzz test makes (shared by tests/test_fuzz_*.py and bench/fuzz.py).

The extender holds real state so that a request that wrongly changed something would show:
three GPU nodes, a pod bound through the watch, a pod reserved by bind and not yet confirmed,
and a pending pod the watch knows and that was filtered (so bind has something it *could* act on).
Pods enter through `upsert_pod`, the watch's door, as in a cluster: the verbs never add one.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from extender.core.model import NodeSpec
from extender.http.app import create_app
from extender.service import Extender
from extender.translate.objects import GpuInfo, NodeInventory, pod_info
from testing.ports import both

P = "/tessera"
NODES = ("gpu-a", "gpu-b", "gpu-c")


def pod(name: str, uid: str, limits: dict, node: str = "", annotations: dict | None = None) -> dict:
    meta = {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations or {}}
    spec = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


class RecordingBinder:
    """Stands in for the API's Binding call: records what would have been written."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._lock = threading.Lock()

    def bind(self, namespace, name, uid, node, annotations) -> None:
        with self._lock:
            self.calls.append((namespace, name, uid, node, annotations))


@dataclass
class Live:
    extender: Extender
    binder: RecordingBinder
    app: object
    pending: dict = field(default_factory=dict)  # a valid filter body for a pod filtered but not bound

    @property
    def client(self):
        return self.app.test_client()


def live(max_body_bytes: int | None = None) -> Live:
    ext = Extender(watch_wait_s=0)  # a bind for a pod never created is refused at once, not after a wait
    for i, name in enumerate(NODES):
        spec = NodeSpec(name, 64_000, 512 * 1024, 8, ("A100", "V100", "T4")[i])
        ext.upsert_node(NodeInventory(spec, tuple(GpuInfo(g, f"GPU-{name}-{g}") for g in range(8))))
    ext.upsert_pod(pod_info(pod("bound", "uid-bound", {"nvidia.com/gpu": "2"}, node="gpu-a")))
    ext.mark_synced()
    held = pod("held", "uid-held", {"tessera.dev/gpu-milli": "300"})
    ext.upsert_pod(pod_info(held))
    ext.filter(pod_info(held), NODES)
    ext.reserve("uid-held", "ml/held", "gpu-b")  # a bind in flight: a reservation the watch has not confirmed
    waiting = pod("waiting", "uid-waiting", {"tessera.dev/gpu-milli": "500"})
    ext.upsert_pod(pod_info(waiting))
    ext.filter(pod_info(waiting), NODES)
    binder = RecordingBinder()
    kwargs = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    app = both(create_app(ext, binder, prefix=P, **kwargs), prefix=P)  # verbs + admin paths
    return Live(ext, binder, app, {"Pod": waiting, "NodeNames": list(NODES)})


def check_answer(status: int, body: bytes, verb: str) -> dict | list:
    """What every answer to any request must be: not a crash, JSON, and an error in words when refused."""
    assert status < 500, f"{verb}: server error {status}: {body[:300]!r}"
    answer = json.loads(body)
    if status >= 400:
        assert isinstance(answer, dict) and isinstance(answer.get("Error"), str) and len(answer["Error"]) > 10, answer
        assert answer["Error"].startswith("tessera:"), answer
    return answer


def refused(status: int, answer) -> bool:
    """A 4xx, or an extender answer whose Error is not empty or that fails every node for the pod: turned down."""
    return status >= 400 or (isinstance(answer, dict) and bool(refusal(answer)))


def refusal(answer: dict) -> str:
    """The words an answer says against the pod itself: its Error, or the one reason filter fails every node with
    and passes none (how filter answers an invalid pod, extender/http/app.py); '' when neither."""
    if answer.get("Error"):
        return answer["Error"]
    failed = answer.get("FailedNodes") or {}
    reasons = set(failed.values())
    unresolvable = answer.get("FailedAndUnresolvableNodes") or {}
    if len(reasons) == 1 and not answer.get("NodeNames") and set(unresolvable) == set(failed):
        return reasons.pop()
    return ""
