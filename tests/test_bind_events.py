"""Events where users look (issue 16, item 3): at bind, which GPUs and how much of each.

Before, kube-scheduler's Scheduled event named only the node; the GPUs were in an annotation only.
"""

from __future__ import annotations

import threading

from extender.http.app import create_app
from extender.kube.cache import BOUND_REASON, EventSink
from extender.kube.contract import node_inventory, pod_info
from extender.service import Extender

from .fakeapi import FakeApi, wait_for
from .test_gpu_health import gpus
from .test_service import k8s_node, k8s_pod
from .test_verbs_hostile import Binder, bind_body


class Offers:
    def __init__(self):
        self.offered = []

    def offer(self, *args):
        self.offered.append(args)


def bound(pod, inventory, fail=False):
    ext = Extender()
    ext.upsert_node(node_inventory(k8s_node("node-7", gpus=len(inventory), inventory=inventory)))
    ext.mark_synced()
    info = pod_info(pod)
    ext.upsert_pod(info)  # the watch saw it created
    events, binder = Offers(), Binder()
    if fail:
        binder.bind = lambda *a: (_ for _ in ()).throw(RuntimeError("apiserver down"))
    client = create_app(ext, binder, events=events).test_client()
    client.post("/tessera/filter", json={"Pod": pod, "NodeNames": ["node-7"]})
    answer = client.post("/tessera/bind", json=bind_body(pod["metadata"]["name"], "node-7")).get_json()
    return answer, events.offered


def test_a_bind_offers_an_event_naming_the_gpus_and_the_share_of_each():
    answer, offered = bound(k8s_pod("slice", milli=300), gpus(2))
    assert answer["Error"] == ""
    [(kind, ns, name, uid, _rv, message, reason)] = offered
    assert (kind, ns, name, uid, reason) == ("Pod", "ml", "slice", "uid-slice", BOUND_REASON)
    assert message.startswith("bound to node-7 GPU ") and message.endswith(")") and " at 300 milli (GPU-" in message
    answer, offered = bound(k8s_pod("two", gpus=2), gpus(2))
    assert offered[0][5] == "bound to node-7 GPUs 0,1 at 1000 milli each (GPU-0, GPU-1)"


def test_a_failed_bind_offers_no_event():
    answer, offered = bound(k8s_pod("slice", milli=300), gpus(2), fail=True)
    assert "apiserver down" in answer["Error"] and offered == []


def test_the_bind_event_is_a_normal_event_in_tessera_words():
    api, stop = FakeApi(), threading.Event()
    sink = EventSink(api, stop)
    threading.Thread(target=sink.run, daemon=True).start()
    sink.offer("Pod", "ml", "slice", "uid-slice", "", "bound to node-7 GPU 1 at 300 milli each", BOUND_REASON)
    wait_for(lambda: api.events, what="the Event")
    stop.set()
    ns, body = api.events[0]
    assert ns == "ml" and body["type"] == "Normal" and body["reason"] == BOUND_REASON
    assert body["message"] == "tessera: bound to node-7 GPU 1 at 300 milli each"
    assert "resourceVersion" not in body["involvedObject"] and body["involvedObject"]["uid"] == "uid-slice"
