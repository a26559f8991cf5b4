"""The extender's HTTP verbs against the bodies kube-scheduler 1.20 really sends (../shared fixtures)."""

import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from extender.http.app import BindFailure, create_app
from extender.service import Extender
from extender.translate.objects import ASSIGNMENT_ANNOTATION, VISIBLE_DEVICES_ANNOTATION, node_inventory, pod_info
from testing.fuzzkit import refusal

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "extender-wire"
P = "/tessera"


def fixture(name: str):
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"wire fixtures not present at {FIXTURES}")
    return json.loads(path.read_text())


class RecordingBinder:
    """Stands in for the API server's Binding endpoint: records calls, can be told to fail."""

    def __init__(self):
        self.calls = []
        self.fail_with: BindFailure | None = None
        self.lock = threading.Lock()

    def bind(self, namespace, name, uid, node, annotations):
        with self.lock:
            self.calls.append((namespace, name, uid, node, annotations))
        if self.fail_with:
            raise self.fail_with


@pytest.fixture
def setup():
    extender = Extender()
    for n in fixture("filter-request.nodecache-false.json")["Nodes"]["items"]:
        extender.upsert_node(node_inventory(n))
    binder = RecordingBinder()
    app = create_app(extender, binder)
    return extender, binder, app.test_client()


def fill(extender, node, gpus):
    """Hold whole GPUs on `node` by a bound pod seen through the watch."""
    pod = copy.deepcopy(fixture("filter-request.nodecache-true.json")["Pod"])
    pod["metadata"].update(name=f"filler-{node}", uid=f"uid-filler-{node}")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod["spec"]["nodeName"] = node
    extender.upsert_pod(pod_info(pod))


def test_filter_answers_error_until_the_cache_has_synced(setup):
    extender, _, client = setup
    r = client.post(f"{P}/filter", json=fixture("filter-request.nodecache-true.json"))
    body = r.get_json()
    assert r.status_code == 200 and "not synced" in body["Error"]
    assert set(fixture("filter-response.error.json")) <= set(body)


def test_filter_with_node_names(setup):
    extender, _, client = setup
    extender.mark_synced()
    fill(extender, "gpu-node-1", 4)
    body = client.post(f"{P}/filter", json=fixture("filter-request.nodecache-true.json")).get_json()
    expected = fixture("filter-response.nodecache-true.json")
    assert set(expected) <= set(body)
    assert body["NodeNames"] == ["gpu-node-2"] and body["Nodes"] is None and body["Error"] == ""
    assert "whole GPUs free" in body["FailedNodes"]["gpu-node-1"]
    assert "gpu-node-1" not in (body.get("FailedAndUnresolvableNodes") or {})  # preemption can help


def test_filter_with_full_node_objects_returns_those_objects(setup):
    extender, _, client = setup
    extender.mark_synced()
    fill(extender, "gpu-node-1", 4)
    request = fixture("filter-request.nodecache-false.json")
    body = client.post(f"{P}/filter", json=request).get_json()
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [n for n in request["Nodes"]["items"] if n["metadata"]["name"] == "gpu-node-2"]
    assert set(fixture("filter-response.nodecache-false.json")) <= set(body)


def test_keys_are_read_case_insensitively_and_unresolvable_nodes_are_marked(setup):
    extender, _, client = setup
    extender.mark_synced()
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "6"}}
    lower = {"pod": request["Pod"], "nodenames": request["NodeNames"]}
    body = client.post(f"{P}/filter", json=lower).get_json()
    assert body["NodeNames"] == ["gpu-node-2"]
    assert "node has 4 GPUs, pod needs 6" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
    # and in FailedNodes too: kube-scheduler 1.20 ignores the other key, and the pod's event would give no reason
    assert body["FailedNodes"]["gpu-node-1"] == body["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_prioritize_returns_integer_scores_with_the_best_node_at_10(setup):
    extender, _, client = setup
    extender.mark_synced()
    half = copy.deepcopy(fixture("filter-request.nodecache-true.json"))
    half["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"tessera.dev/gpu-milli": "500"}}
    half["Pod"]["metadata"].update(name="half", uid="uid-half")
    half["Pod"]["spec"]["nodeName"] = "gpu-node-1"
    extender.upsert_pod(pod_info(half["Pod"]))  # gpu-node-1's GPU 0 has 500 milli free
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"tessera.dev/gpu-milli": "500"}}
    # the 500 slice fills that GPU exactly; on gpu-node-2 it would leave a 500 fragment
    r = client.post(f"{P}/prioritize", json=request)
    scores = json.loads(r.data)
    assert isinstance(scores, list) and {s["Host"] for s in scores} == {"gpu-node-1", "gpu-node-2"}
    assert all(type(s["Score"]) is int and 0 <= s["Score"] <= 10 for s in scores)
    assert max(scores, key=lambda s: s["Score"]) == {"Host": "gpu-node-1", "Score": 10}
    assert b"Score\":10" in r.data and b"10.0" not in r.data  # a float would fail kube-scheduler's decode


def test_bind_writes_the_assignment_and_is_idempotent(setup):
    extender, binder, client = setup
    extender.mark_synced()
    extender.upsert_pod(pod_info(fixture("filter-request.nodecache-true.json")["Pod"]))  # the watch saw it created
    client.post(f"{P}/filter", json=fixture("filter-request.nodecache-true.json"))
    bind = fixture("bind-request.json")
    assert client.post(f"{P}/bind", json=bind).get_json() == fixture("bind-response.ok.json")
    ns, name, uid, node, annotations = binder.calls[0]
    assert (ns, name, uid, node) == ("ml", "train-0", bind["PodUID"], "gpu-node-2")
    assignment = json.loads(annotations[ASSIGNMENT_ANNOTATION])
    assert assignment["node"] == "gpu-node-2" and len(assignment["gpus"]) == 1 and assignment["milli"] == 1000
    assert annotations[VISIBLE_DEVICES_ANNOTATION] == ",".join(assignment["uuids"])
    held = list(extender.cluster.by_name["gpu-node-2"].gpu_free)
    assert client.post(f"{P}/bind", json=bind).get_json() == {"Error": ""}
    assert extender.cluster.by_name["gpu-node-2"].gpu_free == held  # the retry took nothing more
    assert binder.calls[1][4] == annotations


def test_a_failed_binding_gives_the_gpus_back_and_a_409_to_the_same_node_is_success(setup):
    extender, binder, client = setup
    extender.mark_synced()
    extender.upsert_pod(pod_info(fixture("filter-request.nodecache-true.json")["Pod"]))  # the watch saw it created
    client.post(f"{P}/filter", json=fixture("filter-request.nodecache-true.json"))
    binder.fail_with = BindFailure('pods "train-0" not found')
    body = client.post(f"{P}/bind", json=fixture("bind-request.json")).get_json()
    assert "not found" in body["Error"]
    assert extender.cluster.by_name["gpu-node-2"].gpu_free == [1000] * 8 and not extender.bind_holds
    binder.fail_with = BindFailure("already assigned", already_on="gpu-node-2")
    assert client.post(f"{P}/bind", json=fixture("bind-request.json")).get_json() == {"Error": ""}
    assert sum(extender.cluster.by_name["gpu-node-2"].gpu_free) == 7000


def test_bind_of_an_unknown_pod_is_refused_in_words(setup):
    extender, binder, client = setup
    extender.mark_synced()
    body = client.post(f"{P}/bind", json=fixture("bind-request.json")).get_json()
    assert "unknown" in body["Error"] and not binder.calls


def test_preempt_keeps_the_best_nodes_where_the_victims_free_enough_gpu(setup):
    extender, _, client = setup
    extender.mark_synced()
    fill(extender, "gpu-node-2", 8)
    victim = next(i for i in extender.pods.values() if i.node == "gpu-node-2")
    request = fixture("preempt-request.nodecache-true.json")
    request["NodeNameToMetaVictims"] = {
        "gpu-node-2": {"Pods": [{"UID": victim.uid}], "NumPDBViolations": 0},
        "gpu-node-1": {"Pods": [], "NumPDBViolations": 0},  # nothing evicted there, but it has room
        "cpu-node-9": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0},  # unknown to tessera
    }
    body = client.post(f"{P}/preempt", json=request).get_json()
    # only the best-ranked candidates are kept (kube-scheduler takes a node without victims first anyway)
    assert set(body["NodeNameToMetaVictims"]) == {"gpu-node-1"} and not body["NodeNameToMetaVictims"]["gpu-node-1"]["Pods"]
    del request["NodeNameToMetaVictims"]["gpu-node-1"]
    body = client.post(f"{P}/preempt", json=request).get_json()
    assert set(body["NodeNameToMetaVictims"]) == {"gpu-node-2"}
    assert body["NodeNameToMetaVictims"]["gpu-node-2"]["Pods"] == [{"UID": victim.uid}]
    assert set(fixture("preempt-response.json")) == set(body)
    full = client.post(f"{P}/preempt", json=fixture("preempt-request.nodecache-false.json")).get_json()
    assert "NodeNameToMetaVictims" in full


@pytest.mark.parametrize(
    "verb, body, words",
    [
        ("filter", b"{not json", "not JSON"),
        ("filter", b"\xff\xfe", "not JSON"),
        ("filter", b"[1,2]", "expected a JSON object"),
        ("filter", b'{"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}', "uid"),
        ("filter", b'{"Pod": {"metadata": {"name": "x", "uid": "u"}}, "NodeNames": "gpu-node-1"}', "array of strings"),
        ("prioritize", b'{"Pod": 7}', "Pod"),
        ("bind", b'{"PodName": "x"}', "podnamespace"),
        ("preempt", b'{"Pod": {"metadata": {"name": "x", "uid": "u"}}, "NodeNameToMetaVictims": []}', "victims map"),
    ],
)
def test_malformed_requests_get_400_in_words_and_change_nothing(setup, verb, body, words):
    extender, binder, client = setup
    extender.mark_synced()
    before = ({n.name: list(n.gpu_free) for n in extender.cluster.nodes}, dict(extender.pods))
    r = client.post(f"{P}/{verb}", data=body, content_type="application/json")
    assert r.status_code == 400 and words in r.get_json()["Error"]
    assert ({n.name: list(n.gpu_free) for n in extender.cluster.nodes}, dict(extender.pods)) == before
    assert not binder.calls


def test_an_invalid_gpu_request_is_explained_in_the_filter_error(setup):
    extender, _, client = setup
    extender.mark_synced()
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-milli"] = "1500"
    body = client.post(f"{P}/filter", json=request).get_json()
    # a GPU pod's entry is not ignorable: Error stops the attempt, and kube-scheduler starts no preemption for it
    assert "asks for both" in body["Error"] and body["NodeNames"] is None


def test_an_invalid_pod_without_gpus_fails_every_node_in_words(setup):
    """The every-pod entry is ignorable and kube-scheduler skips its Error: a CPU-only pod with a malformed
    tessera.dev/ annotation was bound by kube-scheduler alone. Every node now fails with the reason."""
    extender, _, client = setup
    extender.mark_synced()
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    request["Pod"]["metadata"].setdefault("annotations", {})["tessera.dev/gang-size"] = "2"
    body = client.post(f"{P}/filter", json=request).get_json()
    assert not body["Error"] and body["NodeNames"] == []
    assert set(body["FailedNodes"]) == set(body["FailedAndUnresolvableNodes"]) == set(request["NodeNames"])
    assert "without tessera.dev/gang-name" in refusal(body)


def test_1000_concurrent_binds_never_put_a_gpu_over_1000_milli(setup):
    extender, binder, client = setup
    extender.mark_synced()
    app = client.application
    base = fixture("filter-request.nodecache-true.json")
    pods = []
    for i in range(1000):
        req = copy.deepcopy(base)
        req["Pod"]["metadata"].update(name=f"s{i}", uid=f"uid-{i}")
        req["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"tessera.dev/gpu-milli": str(100 + 37 * (i % 20))}}
        pods.append(req)
        extender.upsert_pod(pod_info(req["Pod"]))  # created: the watch sees it
        extender.filter(pod_info(req["Pod"]), base["NodeNames"])  # kube-scheduler filters before binding

    def bind(req):
        meta = req["Pod"]["metadata"]
        node = f"gpu-node-{1 + int(meta['name'][1:]) % 2}"
        args = {"PodName": meta["name"], "PodNamespace": "ml", "PodUID": meta["uid"], "Node": node}
        return app.test_client().post(f"{P}/bind", json=args).get_json()["Error"]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(bind, pods))
    ok = results.count("")
    assert ok > 0 and ok + sum(1 for r in results if "no longer fits" in r) == 1000
    for node in extender.cluster.nodes:
        assert all(0 <= free <= 1000 for free in node.gpu_free)
    used = {}
    for _, _, _, node, annotations in binder.calls:
        a = json.loads(annotations[ASSIGNMENT_ANNOTATION])
        for g in a["gpus"]:
            used[(node, g)] = used.get((node, g), 0) + a["milli"]
    assert max(used.values()) <= 1000 and len(binder.calls) == ok


def verb_errors(app, verb, kind):
    return app.extensions["tessera"]["registry"].get_sample_value("tessera_verb_errors_total", {"verb": verb, "kind": kind})


@pytest.mark.parametrize("verb, status", [("filter", 200), ("bind", 200), ("prioritize", 503), ("preempt", 503)])
def test_not_ready_is_one_kind_on_every_verb_in_error_where_the_reply_has_that_field(setup, verb, status):
    # one table (extender/http/errors.py): filter's and bind's Error reach the pod's events, prioritize's
    # and preempt's replies have no Error field, so their status code says it (kube-scheduler 1.20 logs only it)
    extender, binder, client = setup
    extender.upsert_pod(pod_info(fixture("filter-request.nodecache-true.json")["Pod"]))
    bodies = {"bind": fixture("bind-request.json"), "preempt": fixture("preempt-request.nodecache-true.json")}
    r = client.post(f"{P}/{verb}", json=bodies.get(verb) or fixture("filter-request.nodecache-true.json"))
    assert r.status_code == status and r.get_json()["Error"].startswith("tessera: cluster cache not synced")
    assert verb_errors(client.application, verb, "not-ready") == 1 and not binder.calls


@pytest.mark.parametrize("verb, status", [("filter", 200), ("prioritize", 400), ("preempt", 400)])
def test_an_invalid_pod_is_one_kind_on_every_verb(setup, verb, status):
    extender, _, client = setup
    extender.mark_synced()
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-milli"] = "1500"
    r = client.post(f"{P}/{verb}", json=request)
    assert r.status_code == status and "asks for both" in refusal(r.get_json())
    assert verb_errors(client.application, verb, "bad-pod") == 1


def test_bind_counts_each_refusal_by_its_kind(setup):
    extender, binder, client = setup
    extender.mark_synced()
    assert "unknown" in client.post(f"{P}/bind", json=fixture("bind-request.json")).get_json()["Error"]
    extender.upsert_pod(pod_info(fixture("filter-request.nodecache-true.json")["Pod"]))
    binder.fail_with = BindFailure("apiserver down")
    assert "apiserver down" in client.post(f"{P}/bind", json=fixture("bind-request.json")).get_json()["Error"]
    app = client.application
    assert verb_errors(app, "bind", "refused") == 1 and verb_errors(app, "bind", "api") == 1


def test_filter_reasons_drop_what_differs_per_node_so_kube_scheduler_can_count_them(setup):
    """kube-scheduler joins one entry per distinct reason into the FailedScheduling event, and the apiserver
    refuses one over 1024 characters: reasons carrying each node's own figures made it refuse 945 events in one
    100-node bench run (bench/kube_timeline.py), and the pod showed no reason at all."""
    extender, _, client = setup
    extender.mark_synced()
    fill(extender, "gpu-node-1", 1)  # 4 GPUs: 3 free
    fill(extender, "gpu-node-2", 6)  # 8 GPUs: 2 free
    request = fixture("filter-request.nodecache-true.json")
    request["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    body = client.post(f"{P}/filter", json=request).get_json()
    assert body["FailedNodes"] == {"gpu-node-1": "tessera: fewer than 4 whole GPUs free",
                                   "gpu-node-2": "tessera: fewer than 4 whole GPUs free"}, body
    detail = extender.filter(pod_info(request["Pod"]), request["NodeNames"]).failed  # what /inspect shows per node
    assert "only 3 whole GPUs free" in detail["gpu-node-1"] and "only 2 whole GPUs free" in detail["gpu-node-2"]
