"""One Event per refusal, where a user looks (issue 33, item 6, "Words").

A new user saw every refusal twice in `kubectl describe pod`. Three writers said the same words:
kube-scheduler's FailedScheduling (it carries filter's refusal whenever Tessera's filter is asked),
Tessera's TesseraRefused, once per state of the pod (kube-scheduler's own status write is a second
state), and, with the shipped two replicas, each replica's watch. Now Tessera says only what
kube-scheduler's Event cannot, once per pod and words, and the replicas' Events are one Event.
tests/e2e/test_words_e2e.py counts them through a real kube-scheduler 1.20.2.
"""

from __future__ import annotations

import dataclasses
import re
import threading

from kubernetes.client.exceptions import ApiException

from extender.kube.cache import ANNOTATION_REASON, REFUSED_REASON, ApiCache, EventSink, event_name
from extender.kube.waiting import KUBE_SAID, WAITING_REASON, kube_named_every_node, kube_said_tessera_words
from extender.service import Extender
from extender.translate.objects import pod_info
from testing.kube_objects import k8s_node, k8s_pod

from .fakeapi import FakeApi, wait_for
from .test_bind_events import Offers, model_pod, waiting_world

KUBE_OWN = "0/1 nodes are available: 1 Insufficient cpu."  # kube's own checks refused every node: Tessera never asked


def marked(pod: dict, message: str, rv: int) -> dict:
    """The pod as kube-scheduler leaves it after a try: PodScheduled=False, Unschedulable, its message (a new state)."""
    pod = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(rv)}, "status": dict(pod["status"])}
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": message}]
    return pod


def world():
    ext = Extender()
    cache = ApiCache(FakeApi(), ext, threading.Event())
    cache.events = Offers()  # what the watch offers, as it offers it
    cache._node("ADDED", k8s_node("a", gpus=2))
    return ext, cache


def test_a_refusal_filter_said_to_kube_scheduler_gets_no_second_event():
    ext, cache = world()
    pod = k8s_pod("p", milli=500, ann={"tessera.dev/gang-nmae": "g"})
    pod["metadata"]["resourceVersion"] = "1"
    cache._pod("ADDED", pod)  # not tried yet: kube-scheduler's first try comes at once
    words = "tessera: unknown annotation tessera.dev/gang-nmae (did you mean tessera.dev/gang-name?)"
    for rv in (2, 3, 4):  # kube-scheduler's status write, a retry, the kubelet's: each a new state
        cache._pod("MODIFIED", marked(pod, words, rv))
    assert cache.events.offered == []
    assert ext.watch_health.annotation_totals() == {"unknown-key": 1}  # one refusal, counted once (was per state)
    assert [b["key"] for b in ext.watch_health.bad_objects()] == ["ml/p"]  # still listed in /inspect


def test_a_refusal_kube_scheduler_could_not_say_is_said_once():
    ext, cache = world()
    pod = k8s_pod("p", milli=500, ann={"tessera.dev/gang-nmae": "g"})
    for rv in (2, 3, 4, 5):
        cache._pod("MODIFIED", marked(pod, KUBE_OWN, rv))
    [(kind, ns, name, uid, rv, message, reason)] = cache.events.offered
    assert (kind, ns, name, uid, rv, reason) == ("Pod", "ml", "p", "uid-p", "2", REFUSED_REASON)
    assert message == "unknown annotation tessera.dev/gang-nmae (did you mean tessera.dev/gang-name?)"
    # the user mends one mistake and makes another: a new refusal, said again
    pod["metadata"]["annotations"] = {"tessera.dev/gang-size": "2"}
    cache._pod("MODIFIED", marked(pod, KUBE_OWN, 6))
    assert len(cache.events.offered) == 2 and "without tessera.dev/gang-name" in cache.events.offered[1][5]
    assert ext.watch_health.annotation_totals() == {"unknown-key": 1, "half-gang": 1}
    pod["metadata"]["annotations"] = {}
    cache._pod("MODIFIED", marked(pod, KUBE_OWN, 7))  # mended: readable, forgotten
    assert cache._refusals == {} and ext.watch_health.bad_objects() == []


def test_a_refusal_too_long_for_kube_schedulers_event_is_said_by_tessera():
    """The apiserver takes an Event's note up to 1 kB: kube-scheduler 1.20's FailedScheduling with a longer message
    is refused ("Server rejected event" in its log), so only Tessera's Event can say it."""
    _, cache = world()
    pod = k8s_pod("p", milli=500, ann={f"tessera.dev/junk-{'x' * 50}-{i}": "v" for i in range(12)})
    long = "tessera: " + "; ".join(f"unknown annotation tessera.dev/junk-{'x' * 50}-{i}" for i in range(12))
    assert len(long.encode()) > 1024 and kube_said_tessera_words(long[:1000] + ".") is True
    cache._pod("MODIFIED", marked(pod, long, 2))
    assert [o[6] for o in cache.events.offered] == [REFUSED_REASON]


def test_kube_said_tessera_words_reads_filter_error_and_node_reasons():
    assert kube_said_tessera_words("tessera: gpu-milli is 0: ...")
    assert kube_said_tessera_words("0/3 nodes are available: 1 Insufficient cpu, 2 tessera: unknown annotation x.")
    assert not kube_said_tessera_words(KUBE_OWN)
    assert not kube_said_tessera_words("0/2 nodes are available: 2 node(s) had taint {tessera.dev/gpu-node: }, that "
                                       "the pod didn't tolerate.")  # Tessera's key in kube's words is not Tessera
    assert not kube_said_tessera_words("tessera: " + "é" * 600)  # 1209 bytes: kube-scheduler's Event was refused


def test_a_bound_pod_is_warned_once_whatever_the_kubelet_writes():
    _, cache = world()
    pod = k8s_pod("b", milli=500, node="a", phase="Pending", ann={"tesera.dev/gang-name": "g"},
                  assignment={"node": "a", "gpus": [0], "milli": 500})
    for rv, phase in ((2, "Pending"), (3, "Running"), (4, "Running")):  # the kubelet's status writes
        pod = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(rv)}, "status": {"phase": phase}}
        cache._pod("MODIFIED", pod)
    assert [o[6] for o in cache.events.offered] == [ANNOTATION_REASON]


# --- two replicas: each watch says the same, the apiserver keeps one Event ------------------------------------

class NamedEvents(FakeApi):
    """Events as the apiserver keeps them: by name, a second create of a name is 409 AlreadyExists."""

    def create_namespaced_event(self, namespace, body, **_):
        with self.cond:
            names = {(ns, b["metadata"].get("name")) for ns, b in self.events}
            if (namespace, body["metadata"].get("name")) in names:
                raise ApiException(status=409, reason="AlreadyExists")
            self.events.append((namespace, body))


def test_two_replicas_that_say_the_same_words_make_one_event():
    api, stop = NamedEvents(), threading.Event()
    replicas = []
    for _ in range(2):  # the shipped Deployment: two replicas, each with its own watch and its own Event writer
        cache = ApiCache(api, Extender(), stop)
        threading.Thread(target=cache.events.run, daemon=True).start()
        cache._node("ADDED", k8s_node("a", gpus=2))
        replicas.append(cache)
    pending = marked(k8s_pod("p", milli=500, ann={"tessera.io/gang-size": "2"}), KUBE_OWN, 2)
    bound = k8s_pod("b", milli=500, node="a", phase="Running", ann={"tessera.dev/gang-nmae": "g"},
                    assignment={"node": "a", "gpus": [0], "milli": 500})
    for cache in replicas:
        cache._pod("ADDED", pending)
        cache._pod("ADDED", bound)
    wait_for(lambda: sum(c.events.written + c.events.already for c in replicas) == 4, what="both replicas' Events")
    stop.set()
    assert sorted(b["reason"] for _, b in api.events) == sorted([REFUSED_REASON, ANNOTATION_REASON])
    assert sum(c.events.written for c in replicas) == 2 and sum(c.events.already for c in replicas) == 2
    assert all(c.events.dropped == 0 for c in replicas)  # a 409 is "said already", not a failure


def test_event_names_are_one_per_object_and_words_and_valid():
    a = event_name("p", "uid-p", REFUSED_REASON, "x")
    assert a == event_name("p", "uid-p", REFUSED_REASON, "x")
    assert len({a, event_name("p", "uid-q", REFUSED_REASON, "x"), event_name("p", "uid-p", REFUSED_REASON, "y"),
                event_name("p", "uid-p", WAITING_REASON, "x")}) == 4
    dns = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
    for name in ("p", "a" * 253, "a" * 199 + "-b", "trainer-0.x", "Bad_Name", ""):
        made = event_name(name, "u", REFUSED_REASON, "x")
        assert dns.fullmatch(made) and len(made) <= 253, made


def test_binds_keep_generated_names():
    """A bind is said by the replica that binds, once per bind: no name of its own is needed."""
    api, stop = FakeApi(), threading.Event()
    sink = EventSink(api, stop)
    threading.Thread(target=sink.run, daemon=True).start()
    sink.offer("Pod", "ml", "p", "uid-p", "", "bound to a GPU 0 at 500 milli", "TesseraBound")
    sink.offer("Pod", "ml", "p", "uid-p", "", "x", REFUSED_REASON)
    wait_for(lambda: len(api.events) == 2, what="two Events")
    stop.set()
    assert api.events[0][1]["metadata"] == {"namespace": "ml", "generateName": "tessera-"}
    assert api.events[1][1]["metadata"]["name"].startswith("p.tessera-")


# --- TesseraWaiting: only what kube-scheduler's FailedScheduling cannot say ------------------------------------

A100_REASON = "tessera: no node has GPU model A100; the cluster's models: T4"


def test_kube_named_every_node_counts_tesseras_reasons_against_kubes_message():
    reasons = {"n1": "tessera: no GPU has 500 milli free (largest free share 300)", "n2": "tessera: no GPU has 500 "
               "milli free (largest free share 100)", "n3": A100_REASON}
    said = f"0/3 nodes are available: 1 {A100_REASON}, 2 tessera: no GPU has 500 milli free."
    assert kube_named_every_node(said, reasons, 3)
    assert not kube_named_every_node(said.replace("0/3", "0/4"), reasons, 3)  # another node count
    assert not kube_named_every_node("0/3 nodes are available: 1 Insufficient cpu, 2 tessera: no GPU has 500 milli "
                                     "free.", reasons, 3)  # kube refused one node itself: Tessera's view adds to it
    assert not kube_named_every_node(f"0/3 nodes are available: 1 {A100_REASON}, 12 tessera: no GPU has 500 milli "
                                     "free.", reasons, 3)  # "2 tessera: ..." inside "12 tessera: ..." is no entry
    assert not kube_named_every_node("", reasons, 3) and not kube_named_every_node("tessera: x", reasons, 3)
    long = f"0/3 nodes are available: 1 {A100_REASON}, 2 tessera: no GPU has 500 milli free" + " " * 1000 + "."
    assert not kube_named_every_node(long[:1000], reasons, 3)  # cut by pod_info: cannot tell


def test_a_waiting_pod_whose_reasons_kube_scheduler_gave_gets_no_tessera_waiting_event():
    now = [0.0]
    ext, events, waiting = waiting_world(lambda: now[0])
    info = dataclasses.replace(pod_info(model_pod("big")), kube_refusal=f"0/1 nodes are available: 1 {A100_REASON}.")
    ext.upsert_pod(info)
    assert waiting.judge(info, "5") == "" and events.offered == []
    ext.queue_reservations.note = lambda key: "; node node-7 is reserved for it from 10:00 (until 12:00)"
    now[0] += 301  # past PER_POD_S: judged again, and now Tessera has something of its own to add
    said = waiting.judge(info, "6")
    assert said == KUBE_SAID + "node node-7 is reserved for it from 10:00 (until 12:00)"
    assert [o[6] for o in events.offered] == [WAITING_REASON]


def test_a_waiting_pod_kube_refused_itself_still_gets_the_gpu_level_reason():
    now = [0.0]
    ext, events, waiting = waiting_world(lambda: now[0])
    info = pod_info(model_pod("big"))  # kube_refusal: "0/1 nodes are available: 1 Insufficient cpu."
    ext.upsert_pod(info)
    assert waiting.judge(info, "5") == f"on GPUs, no node of 1 fits this pod: 1 node: {A100_REASON.removeprefix('tessera: ')}"
