"""Events where users look (issue 16, item 3): at bind, which GPUs and how much of each.

Before, kube-scheduler's Scheduled event named only the node; the GPUs were in an annotation only.
"""

from __future__ import annotations

import threading

from extender.http.app import create_app
from extender.kube.cache import EventSink
from extender.service import Extender
from extender.translate.objects import BOUND_REASON, node_inventory, pod_info
from testing.kube_objects import k8s_node, k8s_pod

from .fakeapi import FakeApi, wait_for
from .test_gpu_health import gpus
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


# --- a waiting pod's GPU-level reason, even when kube's own checks refused it first ----------------

def unschedulable(pod):
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/1 nodes are available: 1 Insufficient cpu."}]
    return pod


def model_pod(name, model="A100", milli=500):
    pod = unschedulable(k8s_pod(name, milli=milli))
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": model}
    return pod


def waiting_world(clock):
    from extender.kube.waiting import WaitingReasons

    ext = Extender()
    ext.upsert_node(node_inventory(k8s_node("node-7", gpus=2, inventory=gpus(2))))
    ext.mark_synced()
    events = Offers()
    return ext, events, WaitingReasons(ext, events, clock=clock)


def test_a_waiting_pod_gets_the_gpu_level_reason_once_and_again_only_when_it_changes():
    """Before: kube-scheduler never asked Tessera (its own checks failed first), so no GPU-level word anywhere."""
    from extender.kube.waiting import PER_POD_S, WAITING_REASON

    now = [0.0]
    ext, events, waiting = waiting_world(lambda: now[0])
    pod = model_pod("big")
    info = pod_info(pod)
    ext.upsert_pod(info)
    said = waiting.judge(info, "5")
    assert said == "on GPUs, no node of 1 fits this pod: 1 node: no node has GPU model A100; the cluster's models: T4"
    [(kind, ns, name, uid, rv, message, reason)] = events.offered
    assert (kind, ns, name, uid, rv, reason) == ("Pod", "ml", "big", "uid-big", "5", WAITING_REASON)
    assert waiting.judge(info, "6") == ""  # kube-scheduler retries: no new word within PER_POD_S
    now[0] += PER_POD_S + 1
    assert waiting.judge(info, "7") == ""  # nor later while the reason is the same
    fits = pod_info(model_pod("big", model="T4"))
    now[0] += PER_POD_S + 1
    assert "1 of 1 nodes would fit this pod now (e.g. node-7)" in waiting.judge(fits, "8")
    assert len(events.offered) == 2


def test_only_unschedulable_pending_gpu_pods_are_judged_and_the_rate_is_bounded():
    now = [0.0]
    ext, events, waiting = waiting_world(lambda: now[0])
    waiting.offer(pod_info(k8s_pod("fresh", milli=500)), k8s_pod("fresh", milli=500), "1")  # not marked unschedulable
    cpu = unschedulable(k8s_pod("cpu"))
    waiting.offer(pod_info(cpu), cpu, "1")
    assert waiting._queue.qsize() == 0
    waiting.per_minute = 3
    for i in range(10):
        waiting.judge(pod_info(model_pod(f"p{i}")), "1")
    assert len(events.offered) == 3 and waiting.dropped == 7


def test_one_namespace_cannot_fill_the_waiting_queue_or_the_minutes_judgements():
    """A tenant's 1,000 unschedulable pods, touched over and over, filled the queue and every judgement of the
    minute, and another tenant's pod got its Event minutes late: each pod is queued once, and one namespace holds
    at most QUEUED_PER_NAMESPACE of the queue and JUDGED_PER_NAMESPACE of the minute's judgements."""
    from extender.kube.waiting import JUDGED_PER_NAMESPACE, QUEUED_PER_NAMESPACE

    now = [0.0]
    ext, events, waiting = waiting_world(lambda: now[0])
    flood = []
    for i in range(QUEUED_PER_NAMESPACE + 50):
        pod = model_pod(f"p{i}")
        pod["metadata"]["namespace"] = "greedy"
        flood.append(pod)
    for _ in range(3):  # touched again and again
        for pod in flood:
            waiting.offer(pod_info(pod), pod, "1")
    assert waiting._queue.qsize() == QUEUED_PER_NAMESPACE
    theirs = model_pod("theirs")
    waiting.offer(pod_info(theirs), theirs, "1")
    assert waiting._queue.qsize() == QUEUED_PER_NAMESPACE + 1
    for pod in flood:
        waiting.judge(pod_info(pod), "1")
    assert len(events.offered) == JUDGED_PER_NAMESPACE
    assert waiting.judge(pod_info(theirs), "1"), "another namespace is still judged this minute"


def test_the_gpu_view_drops_no_hold():
    ext, _, _ = waiting_world(lambda: 0.0)
    info = pod_info(k8s_pod("slice", milli=300))
    ext.upsert_pod(info)
    ext.filter(info, ["node-7"])
    ext.reserve(info.uid, info.key, "node-7")
    assert info.uid in ext.bind_holds
    ext.gpu_view(info)  # a filter here would drop the hold as a retry: the background judge must not
    assert info.uid in ext.bind_holds


def test_the_watch_hands_an_unschedulable_pod_to_the_waiting_thread_and_its_event_is_written():
    from extender.kube.cache import ApiCache
    from extender.kube.waiting import WAITING_REASON

    api, stop = FakeApi(), threading.Event()
    ext = Extender()
    cache = ApiCache(api, ext, stop)
    cache._node("ADDED", k8s_node("node-7", gpus=2, inventory=gpus(2)))
    ext.mark_synced()
    for target in (cache.waiting_events.run, lambda: cache.waiting.run(stop)):
        threading.Thread(target=target, daemon=True).start()
    cache._pod("ADDED", model_pod("big"))
    wait_for(lambda: api.events, what="the waiting Event")
    stop.set()
    body = api.events[0][1]
    assert body["reason"] == WAITING_REASON and body["type"] == "Warning"
    assert body["message"] == ("tessera: on GPUs, no node of 1 fits this pod: 1 node: no node has GPU model A100; "
                               "the cluster's models: T4")
