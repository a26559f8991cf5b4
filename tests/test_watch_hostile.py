"""Hostile objects through the watch: each is recorded and skipped, and the watch goes on.

The cache runs its real threads against tests/fakeapi.py. Before the per-object guard, one pod whose
assignment MAC made the comparison raise (or one node inventory with 1e400) was retried forever:
later events were never applied and the first sync never completed.
"""

from __future__ import annotations

import json
import threading

import pytest

from extender import watch_health as health
from extender.http.app import create_app
from extender.kube.cache import ApiCache, EventSink
from extender.service import Extender
from extender.translate.objects import (
    ASSIGNMENT_ANNOTATION,
    INVENTORY_ANNOTATION,
    MAC_ANNOTATION,
    AssignmentSigner,
    node_inventory,
    pod_info,
)
from extender.watch_health import WatchHealth
from testing.kube_objects import k8s_node, k8s_pod
from testing.ports import both  # /readyz, /inspect and /metrics are on the admin listener

from .fakeapi import FakeApi, wait_for

KEY = AssignmentSigner(b"0123456789abcdef0123456789abcdef")


def signed(name, node, gpus, milli=1000, whole=None, uid=None, mac=None):
    """A pod Tessera bound: its assignment annotation and a valid MAC (or the `mac` given)."""
    pod = k8s_pod(name, milli=None if whole else milli, gpus=whole, node=node, phase="Running", uid=uid,
                  assignment={"node": node, "gpus": gpus, "milli": milli})
    body = pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
    pod["metadata"]["annotations"][MAC_ANNOTATION] = mac if mac is not None else KEY.mac(pod["metadata"]["uid"], body)
    return pod


def hostile_inventory_node(name):
    node = k8s_node(name, gpus=1)
    node["metadata"]["annotations"] = {INVENTORY_ANNOTATION: '{"gpus":[{"index":0,"uuid":"GPU-0","memory_mib":1e400}]}'}
    return node


@pytest.fixture
def world():
    api = FakeApi(watch_timeout_s=0.5)
    ext = Extender(signer=KEY)
    cache = ApiCache(api, ext)
    yield api, ext, cache
    cache.stop.set()
    for t in cache.threads:
        t.join(5)


def start(cache):
    threading.Thread(target=cache.start, daemon=True).start()


def held(ext, pod):
    a = ext.cluster.assignments.get(f"ml/{pod}")
    return (a.node, a.gpus, a.milli) if a else None


def bad_keys(ext):
    return {(b["kind"], b["key"]) for b in ext.watch_health.bad_objects()}


def test_a_non_ascii_assignment_mac_does_not_stop_later_events(world):
    api, ext, cache = world
    api.put("node", "ADDED", k8s_node("a", gpus=4))
    api.put("pod", "ADDED", signed("p1", "a", [0], whole=1))
    start(cache)
    wait_for(lambda: held(ext, "p1") == ("a", (0,), 1000), what="p1 counted at the first sync")
    api.put("pod", "ADDED", signed("evil", "a", [1], whole=1, mac="é" * 64))
    api.put("pod", "DELETED", signed("p1", "a", [0], whole=1))
    api.put("pod", "ADDED", k8s_pod("p2", milli=300))
    wait_for(lambda: held(ext, "p1") is None, what="the later delete of p1 released its GPU")
    wait_for(lambda: "uid-p2" in ext.pods, what="the later new pod p2 seen")
    # the hostile pod's assignment is set aside as forged; bound to a, it holds the one whole GPU the
    # device plugin would have given it (the lowest free when it came: p1 held GPU 0), never a claim of its own
    assert "uid-evil" in ext.forged and ("Pod", "ml/evil") not in bad_keys(ext)
    assert held(ext, "evil") == ("a", (1,), 1000)
    assert ext.cluster.by_name["a"].gpu_free == [1000, 0, 1000, 1000]


def test_the_first_sync_completes_with_hostile_objects_listed_and_they_are_recorded(world):
    api, ext, cache = world
    api.put("node", "ADDED", hostile_inventory_node("evil-node"))
    api.put("node", "ADDED", k8s_node("a", gpus=2))
    api.put("pod", "ADDED", signed("evil", "a", [1], whole=1, mac="ü" * 64))
    deep = signed("deep2", "", [0], whole=1)
    nested = "[" * 20_000 + "]" * 20_000  # json.loads: RecursionError, not a ValueError
    deep["metadata"]["annotations"].update({ASSIGNMENT_ANNOTATION: nested, MAC_ANNOTATION: KEY.mac("uid-deep2", nested)})
    api.put("pod", "ADDED", deep)
    api.put("pod", "ADDED", signed("ok", "a", [0], whole=1))
    start(cache)
    wait_for(lambda: ext.synced, what="the first sync completed")
    assert set(ext.cluster.by_name) == {"a"}
    assert ("Node", "evil-node") in bad_keys(ext) and ("Pod", "ml/deep2") in bad_keys(ext)
    why = {b["key"]: b["reason"] for b in ext.watch_health.bad_objects()}
    assert "memory_mib" in why["evil-node"] and "gpu-inventory" in why["evil-node"]
    assert "not JSON" in why["ml/deep2"]
    assert held(ext, "ok") == ("a", (0,), 1000)
    client = both(create_app(ext, binder=None)).test_client()
    assert client.get("/readyz").status_code == 200
    listed = client.get("/inspect").get_json()["bad_objects"]
    assert {"kind": "Node", "key": "evil-node"}.items() <= next(b for b in listed if b["kind"] == "Node").items()
    metrics = client.get("/metrics").data.decode()
    assert 'tessera_bad_objects_total{kind="Node"} 1.0' in metrics
    assert 'tessera_bad_objects_listed{kind="Node"} 1.0' in metrics
    # a new node on the watch after it is still applied
    api.put("node", "ADDED", k8s_node("b", gpus=1))
    wait_for(lambda: "b" in ext.cluster.by_name, what="node b from the watch")


def test_an_out_of_range_float_in_a_node_update_keeps_the_last_good_node_and_later_events_apply(world):
    api, ext, cache = world
    api.put("node", "ADDED", k8s_node("a", gpus=4))
    api.put("node", "ADDED", k8s_node("gone", gpus=2))
    start(cache)
    wait_for(lambda: ext.synced and set(ext.cluster.by_name) == {"a", "gone"}, what="first sync")
    api.put("node", "MODIFIED", hostile_inventory_node("a"))
    api.put("node", "DELETED", k8s_node("gone"))
    api.put("node", "ADDED", k8s_node("b", gpus=8))
    wait_for(lambda: set(ext.cluster.by_name) == {"a", "b"}, what="the delete and the add after the bad update")
    assert ext.cluster.by_name["a"].spec.gpu_count == 4  # its last good state
    assert ("Node", "a") in bad_keys(ext)
    api.put("node", "MODIFIED", k8s_node("a", gpus=3))  # a good state again: applied, and no longer listed
    wait_for(lambda: ext.cluster.by_name["a"].spec.gpu_count == 3, what="the good update")
    assert ("Node", "a") not in bad_keys(ext)


def test_a_hostile_update_of_a_counted_pod_keeps_its_gpus_and_the_watch_goes_on(world):
    api, ext, cache = world
    api.put("node", "ADDED", k8s_node("a", gpus=4))
    api.put("pod", "ADDED", signed("p", "a", [2], milli=600))
    start(cache)
    wait_for(lambda: held(ext, "p") == ("a", (2,), 600), what="p counted")
    broken = signed("p", "a", [2], milli=600)
    broken["spec"]["containers"] = "not a list"  # RequestError: the update is skipped, the pod keeps its slice
    api.put("pod", "MODIFIED", broken)
    hostile = signed("p", "a", [2], milli=600, mac="\u0660" * 64)  # its latest state: a relist lists it too
    api.put("pod", "MODIFIED", hostile)
    api.put("pod", "ADDED", signed("q", "a", [3], milli=500))
    wait_for(lambda: held(ext, "q") == ("a", (3,), 500), what="q, after the hostile updates of p")
    assert held(ext, "p") == ("a", (2,), 600)
    assert ext.cluster.by_name["a"].gpu_free == [1000, 1000, 400, 500]
    # a deletion applies whatever its body holds
    api.put("pod", "DELETED", broken)
    wait_for(lambda: held(ext, "p") is None, what="p deleted")
    assert ("Pod", "ml/p") not in bad_keys(ext)


def test_unreadable_watch_lines_and_objects_without_names_are_recorded_not_fatal(world):
    api, ext, cache = world
    start(cache)
    wait_for(lambda: ext.synced, what="first sync")
    api.put_raw("pod", "{not json")
    api.put_raw("pod", json.dumps({"type": "ADDED", "object": [1, 2]}))
    api.put("pod", "ADDED", {"metadata": {"uid": 7, "name": "x"}})  # uid of the wrong type
    api.put("node", "ADDED", {"metadata": {"name": ""}})
    api.put("pod", "ADDED", k8s_pod("after", milli=100))
    wait_for(lambda: "uid-after" in ext.pods, what="the pod after the garbage")
    assert len(ext.watch_health.bad_objects()) >= 3


def test_readyz_is_503_while_a_watch_is_down_past_the_bound_and_200_once_it_resumes(world, monkeypatch):
    monkeypatch.setattr(health, "STALL_S", 0.3)
    api, ext, cache = world
    client = both(create_app(ext, binder=None)).test_client()
    r = client.get("/readyz")
    assert r.status_code == 503 and "first sync" in r.get_json()["reason"]
    api.put("node", "ADDED", k8s_node("a", gpus=1))
    start(cache)
    wait_for(lambda: client.get("/readyz").status_code == 200, what="ready after the first sync")
    api.down = True
    wait_for(lambda: client.get("/readyz").status_code == 503, what="not ready while the watch is down")
    assert "watch has been down" in client.get("/readyz").get_json()["reason"]
    api.down = False
    api.put("node", "ADDED", k8s_node("b", gpus=1))
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=15, what="ready again once the watch resumes")
    wait_for(lambda: "b" in ext.cluster.by_name, what="the event made while it was down")
    assert all(t.is_alive() for t in cache.threads)


def test_a_410_relists_and_the_watch_resumes(world):
    api, ext, cache = world
    api.put("node", "ADDED", k8s_node("a", gpus=1))
    start(cache)
    wait_for(lambda: ext.synced, what="first sync")
    api.compacted = api.rv + 100  # every watch from an older version gets 410 Gone
    api.put("node", "ADDED", k8s_node("b", gpus=1))
    wait_for(lambda: "b" in ext.cluster.by_name, what="b, from the relist after 410")
    api.compacted = 0


def test_bad_objects_get_one_event_per_state_and_events_are_rate_limited():
    api = FakeApi()
    stop = threading.Event()
    ext = Extender()
    cache = ApiCache(api, ext, stop)
    cache.events = sink = EventSink(api, stop, per_minute=3)
    threading.Thread(target=sink.run, daemon=True).start()
    node = hostile_inventory_node("evil")
    node["metadata"]["resourceVersion"] = "5"
    for _ in range(3):  # a relist meets the same state again: one record, one Event
        cache._node("ADDED", node)
    wait_for(lambda: len(api.events) == 1, what="one Event")
    ns, body = api.events[0]
    assert ns == "default" and body["involvedObject"]["name"] == "evil" and body["involvedObject"]["kind"] == "Node"
    assert body["type"] == "Warning" and "memory_mib" in body["message"]
    for i in range(10):
        evil = k8s_pod(f"evil{i}", milli=100)
        evil["spec"]["containers"] = 5
        # kube-scheduler's own checks refused it first: only Tessera's Event can say why it cannot be read
        evil["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": "0/1 nodes are available: 1 Insufficient cpu."}]
        cache._pod("ADDED", evil)
    wait_for(lambda: sink.written + sink.dropped == 11, what="every Event written or dropped")
    stop.set()
    assert len(api.events) == 3 and sink.dropped == 8
    assert api.events[1][0] == "ml" and api.events[1][1]["involvedObject"]["uid"] == "uid-evil0"
    assert ext.watch_health.bad_totals() == {"Node": 1, "Pod": 10}


def test_the_bad_object_record_is_bounded_oldest_dropped():
    h = WatchHealth(limit=3)
    for i in range(5):
        assert h.record_bad("Pod", f"u{i}", f"ml/p{i}", f"u{i}", "bad", "1")
    assert [b["key"] for b in h.bad_objects()] == ["ml/p2", "ml/p3", "ml/p4"]
    assert h.bad_totals() == {"Pod": 5} and h.bad_counts() == {"Pod": 3}
    h.record_bad("Pod", "u2", "ml/p2", "u2", "worse", "2")  # a new state of p2: now the newest
    assert [b["key"] for b in h.bad_objects()] == ["ml/p3", "ml/p4", "ml/p2"]


@pytest.mark.parametrize("inventory, words", [
    ('{"gpus":[{"index":0,"memory_mib":1e400}]}', "memory_mib"),
    ('{"gpus":[{"index":0,"oob_memory_mib":-1}]}', "oob_memory_mib"),
    ('{"gpus":[{"index":1e400}]}', "index"),
    ('{"gpus":[{"index":true}]}', "index"),
    ('{"gpus":[{"index":0,"uuid":' + json.dumps("x" * 1000) + '}]}', "uuid"),
    ('{"gpus":' + json.dumps([{"index": i} for i in range(1000)]) + '}', "at most 256"),
    ("[" * 20_000 + "]" * 20_000, "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "65536 characters"),
    ('{"gpus":[{"index":0,"memory_mib":' + "9" * 5000 + '}]}', "not JSON"),
    ('{"gpus":{"index":0}}', "gpus"),
    ('{"gpus":["x"]}', "object"),
])
def test_hostile_inventories_are_refused_in_words(inventory, words):
    node = k8s_node("n", gpus=1)
    node["metadata"]["annotations"] = {INVENTORY_ANNOTATION: inventory}
    with pytest.raises(ValueError, match=words) as e:
        node_inventory(node)
    assert type(e.value).__name__ == "RequestError"


@pytest.mark.parametrize("mutate, words", [
    (lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "9223372036854775807"}), "more than 256"),
    (lambda n: n["status"]["allocatable"].update({"cpu": "1" * 5000}), "not a quantity"),
    (lambda n: n["status"]["allocatable"].update({"memory": "1e400"}), "finite quantity"),
    (lambda n: n["status"]["allocatable"].update({"cpu": True}), "not a quantity"),
    (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.product": 7}), "gpu.product"),
    (lambda n: n.update({"status": ["x"]}), "must be objects"),
    # found by bench/watch_fuzz.py: 9.2e21 CPU milli passed, and /inspect could not encode it (a 500)
    (lambda n: n["status"]["allocatable"].update({"cpu": "9223372036854775807"}), "over 2"),
])
def test_hostile_node_status_and_labels_are_refused_in_words(mutate, words):
    node = k8s_node("n", gpus=1)
    mutate(node)
    with pytest.raises(ValueError, match=words) as e:
        node_inventory(node)
    assert type(e.value).__name__ == "RequestError"


def test_inspect_and_metrics_answer_with_the_largest_amounts_a_node_may_claim():
    ext = Extender()
    cache = ApiCache(FakeApi(), ext)
    node = k8s_node("big", gpus=256, cpu="9007199254740", memory="8Ei")  # 2^53 milli CPU at most; 8 EiB is 2^43 MiB
    cache._node("ADDED", node)
    assert "big" in ext.cluster.by_name
    huge = k8s_node("huge", cpu="9223372036854775807")
    cache._node("ADDED", huge)
    assert "huge" not in ext.cluster.by_name and ("Node", "huge") in bad_keys(ext)
    ext.mark_synced()
    client = both(create_app(ext, binder=None)).test_client()
    assert client.get("/inspect").status_code == 200 and client.get("/metrics").status_code == 200


def test_a_non_ascii_digit_in_the_memory_label_is_not_a_crash():
    node = k8s_node("n", gpus=1)
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "²"  # str.isdigit() says yes, int() says no
    assert node_inventory(node).spec.gpu_memory_mib == 0


@pytest.mark.parametrize("assignment", [
    '{"node":"a","gpus":[0,0],"milli":1000}',  # one GPU named twice would be counted twice
    '{"node":"a","gpus":[1e400],"milli":5}',
    '{"node":"a","gpus":"01","milli":5}',
    '{"node":"a","gpus":[0],"milli":5000}',
    '{"node":["a"],"gpus":[0],"milli":5}',
    '[' * 100_000 + ']' * 100_000,
])
def test_a_bound_pod_with_an_unreadable_assignment_is_counted_like_another_binders_pod(assignment):
    pod = k8s_pod("p", gpus=1, node="a", phase="Running", ann={ASSIGNMENT_ANNOTATION: assignment,
                                                                 "tessera.dev/gang-name": "g",
                                                                 "tessera.dev/gang-size": "lots"})
    info = pod_info(pod)  # no exception: its GPU is real, whatever its annotations say
    assert info.assignment is None and "unreadable" in info.forged and info.gang is None
    ext = Extender()
    ext.upsert_node(node_inventory(k8s_node("a", gpus=2)))
    ext.upsert_pod(info)
    assert held(ext, "p") == ("a", (0,), 1000)
    pending = k8s_pod("q", gpus=1, ann={ASSIGNMENT_ANNOTATION: assignment})
    with pytest.raises(ValueError, match="unreadable"):
        pod_info(pending)


def test_pods_a_tenant_binds_itself_count_for_what_the_kubelet_admitted_them_to():
    """spec.nodeName set at create skips the scheduler; the kubelet admits the pod against the node's gpu-milli.
    Before, gpu-milli 1500 or both GPU resources made the pod a bad object counted for nothing (not even its CPU),
    and a forged slice held no GPU: Tessera saw node a all free while the kubelet had 3400 of 4000 milli taken."""
    ext = Extender(signer=AssignmentSigner(b"0123456789abcdef0123456789abcdef"))
    cache = ApiCache(FakeApi(), ext, threading.Event())
    cache._node("ADDED", k8s_node("a", gpus=4, cpu="16"))
    ext.mark_synced()
    pods = [k8s_pod("self-1500", milli=1500, node="a", phase="Running", cpu="4"),
            k8s_pod("self-both", milli=500, gpus=1, node="a", phase="Running", cpu="4"),
            k8s_pod("self-forged", milli=900, node="a", phase="Running", cpu="4",
                    assignment={"node": "a", "gpus": [0], "milli": 900})]
    for i, p in enumerate(pods):
        p["metadata"]["resourceVersion"] = str(10 + i)
        cache._pod("ADDED", p)
    held = {k: (len(a.gpus), a.milli) for k, a in ext.cluster.assignments.items()}
    assert held == {"ml/self-1500": (2, 1000), "ml/self-both": (1, 1000), "ml/self-forged": (1, 900)}
    assert ext.cluster.by_name["a"].cpu_free == 4000 and sum(ext.cluster.by_name["a"].gpu_free) == 100
    assert "counted as 2 whole GPUs" in ext.forged["uid-self-1500"] and "counted as 1 whole GPU" in ext.forged["uid-self-both"]
    assert ext.filter(pod_info(k8s_pod("next", milli=1000)), ["a"]).passed == []


def test_a_pod_on_gpus_its_node_no_longer_reports_is_released_whole():
    """A node that shrank under its pods (a GPU off the bus, or a node lying) made the deletion of a pod on a vanished
    GPU raise half way: the pod left the cache but kept its GPUs, and the node regrew with a dead pod's GPUs held."""
    inventory = [{"index": i, "uuid": f"GPU-{i}", "model": "T4", "memory_mib": 15360} for i in range(8)]
    ext = Extender()
    cache = ApiCache(FakeApi(), ext, threading.Event())
    first = k8s_node("n1", inventory=inventory)
    first["metadata"]["resourceVersion"] = "1"
    cache._node("ADDED", first)
    ext.mark_synced()
    pod = k8s_pod("db-0", gpus=2, node="n1", phase="Running",
                  assignment={"node": "n1", "gpus": [2, 6], "milli": 1000, "uuids": ["GPU-2", "GPU-6"]})
    pod["metadata"]["resourceVersion"] = "10"
    cache._pod("ADDED", pod)
    assert "ml/db-0" in ext.cluster.assignments
    for version, count in (("11", 4), ("13", 8)):
        node = k8s_node("n1", inventory=inventory[:count])
        node["metadata"]["resourceVersion"] = version
        cache._node("MODIFIED", node)
        if version == "11":
            cache._pod("DELETED", {"metadata": {"uid": pod["metadata"]["uid"], "resourceVersion": "12",
                                                "name": "db-0", "namespace": "ml"}})
            assert "ml/db-0" not in ext.cluster.assignments and not bad_keys(ext)
    assert ext.cluster.by_name["n1"].gpu_free == [1000] * 8
