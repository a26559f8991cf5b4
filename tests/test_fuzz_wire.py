"""Property-based bad input on every verb: never a 500, always an error in words, nothing changed.

Hypothesis generates the bodies: arbitrary JSON, arbitrary bytes (non-UTF-8 included), Pods
with the right keys but any JSON type in any field Tessera reads, deep nesting, unknown pods and
nodes. The extender under test holds real state (testing/fuzzkit.py) and its snapshot is compared
after every request.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.core.model import RequestError
from extender.translate.objects import pod_info
from testing.fuzzkit import NODES, P, check_answer, live, pod, refusal, refused

VERBS = ("filter", "prioritize", "bind", "preempt")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(
    ["", "1", "-1", "500", "1500", "inf", "NaN", "1e999999999", "9" * 5000, "2Gi", "gpu-a", "uid-waiting", "\udcff"])
any_json = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                        max_leaves=12)


def maybe(valid):
    """Mostly the right kind of value for a field, sometimes any JSON at all."""
    return st.one_of(valid, valid, any_json)


quantity = st.sampled_from(["1", "2", "500", "300m", "1Gi", "0", 7]) | scalars
RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "tessera.dev/gpu-milli"]
resources = st.dictionaries(st.sampled_from(RESOURCES), quantity, max_size=3)
container = st.fixed_dictionaries({}, optional={"name": maybe(st.text(max_size=5)), "resources": maybe(
    st.fixed_dictionaries({}, optional={"limits": maybe(resources), "requests": maybe(resources)}))})
ANNOTATIONS = ["tessera.dev/gang-name", "tessera.dev/gang-size", "tessera.dev/gpu-assignment", "x"]
ANNOTATION_VALUES = ["g", "2", "0", "99999999999", '{"node":"gpu-a","gpus":[1e400],"milli":5}']
annotations = st.dictionaries(st.sampled_from(ANNOTATIONS), maybe(st.sampled_from(ANNOTATION_VALUES)), max_size=3)
expr = st.fixed_dictionaries({}, optional={"key": maybe(st.just("nvidia.com/gpu.product")), "operator": maybe(st.just("In")),
                                           "values": maybe(st.lists(maybe(st.text(max_size=5)), max_size=3))})
term = st.fixed_dictionaries({"matchExpressions": maybe(st.lists(maybe(expr), max_size=2))})
required = st.fixed_dictionaries({"nodeSelectorTerms": maybe(st.lists(maybe(term), max_size=2))})
affinity = st.fixed_dictionaries({"nodeAffinity": maybe(st.fixed_dictionaries({
    "requiredDuringSchedulingIgnoredDuringExecution": maybe(required)}))})
metadata = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["waiting", "p"])), "uid": maybe(st.sampled_from(["uid-waiting", "uid-x"]))},
    optional={"namespace": maybe(st.just("ml")), "annotations": maybe(annotations)})
spec = st.fixed_dictionaries({}, optional={
    "containers": maybe(st.lists(maybe(container), max_size=3)),
    "initContainers": maybe(st.lists(maybe(container), max_size=2)),
    "nodeName": maybe(st.sampled_from(["", "gpu-a", "nowhere"])),
    "nodeSelector": maybe(st.dictionaries(st.text(max_size=5), maybe(st.text(max_size=5)))),
    "affinity": maybe(affinity)})
pod_like = st.fixed_dictionaries({"metadata": maybe(metadata)}, optional={
    "spec": maybe(spec), "status": maybe(st.fixed_dictionaries({"phase": maybe(st.sampled_from(["Running", "Succeeded"]))}))})
node_names = maybe(st.lists(maybe(st.sampled_from(NODES + ("nowhere", ""))), max_size=5))
node_like = st.fixed_dictionaries({"metadata": maybe(st.fixed_dictionaries({"name": maybe(st.sampled_from(NODES))}))})
extender_args = st.fixed_dictionaries({"Pod": maybe(pod_like)}, optional={
    "NodeNames": node_names, "Nodes": maybe(st.fixed_dictionaries({"items": maybe(st.lists(maybe(node_like), max_size=3))}))})
BIND_VALUES = {"PodName": ["waiting", "held", "ghost", ""], "PodNamespace": ["ml", "other"],
               "PodUID": ["uid-waiting", "uid-held", "uid-ghost"], "Node": list(NODES) + ["nowhere"]}
bind_args = st.fixed_dictionaries({}, optional={k: maybe(st.sampled_from(v)) for k, v in BIND_VALUES.items()})
meta_pod = st.fixed_dictionaries({"UID": maybe(st.sampled_from(["uid-bound", "uid-x"]))})
victims = st.dictionaries(st.sampled_from(NODES + ("nowhere",)), maybe(st.fixed_dictionaries({}, optional={
    "Pods": maybe(st.lists(maybe(meta_pod), max_size=2)), "NumPDBViolations": maybe(st.integers())})), max_size=3)
preempt_args = st.fixed_dictionaries({"Pod": maybe(pod_like)}, optional={"NodeNameToMetaVictims": maybe(victims),
                                                                          "NodeNameToVictims": maybe(victims)})
BODIES = {"filter": extender_args, "prioritize": extender_args, "bind": bind_args, "preempt": preempt_args}


@pytest.fixture(scope="module")
def world():
    return live()


def post(world, verb: str, data: bytes):
    before = world.extender.snapshot()
    calls = len(world.binder.calls)
    r = world.client.post(f"{P}/{verb}", data=data, content_type="application/json")
    answer = check_answer(r.status_code, r.data, verb)
    after = world.extender.snapshot()
    if refused(r.status_code, answer):
        assert after.placement == before.placement, f"{verb} refused {data[:200]!r} but changed the state"
        assert len(world.binder.calls) == calls
    assert after.pods == before.pods, f"{verb} {data[:200]!r} changed the pods known: only the watch adds pods"
    return r.status_code, answer


@pytest.mark.parametrize("verb", VERBS)
@FUZZ
@given(body=any_json)
def test_any_json_body_is_answered_without_a_crash_or_a_change(world, verb, body):
    post(world, verb, json.dumps(body).encode())


@pytest.mark.parametrize("verb", VERBS)
@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=50).map(lambda t: t.encode("utf-16")))
def test_any_bytes_are_answered_with_400_in_words(world, verb, raw):
    status, answer = post(world, verb, raw)
    try:
        parsed_ok = isinstance(json.loads(raw), dict)
    except (ValueError, RecursionError):
        parsed_ok = False
    assert parsed_ok or status == 400


@pytest.mark.parametrize("verb", VERBS)
@FUZZ
@given(data=st.data())
def test_bodies_of_the_right_shape_with_wrong_types_inside(world, verb, data):
    """The fields Tessera reads, each sometimes of the wrong type: a clear refusal or a real answer."""
    body = data.draw(BODIES[verb])
    status, answer = post(world, verb, json.dumps(body).encode())
    if verb == "bind" and not refused(status, answer):
        # only the pending pod bound as itself, or the reserved one retried on its own node, may succeed
        who = (body.get("PodUID"), body.get("PodName"), body.get("PodNamespace"))
        assert who == ("uid-waiting", "waiting", "ml") or (who == ("uid-held", "held", "ml") and body.get("Node") == "gpu-b")


@FUZZ
@given(body=pod_like)
def test_pod_info_returns_a_pod_or_a_request_error(body):
    try:
        info = pod_info(body)
    except RequestError as e:
        assert str(e)
        return
    assert info.request.gpu_count >= 0 and 0 <= info.request.gpu_milli <= 1000


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("depth", [100, 1_000, 100_000])
@pytest.mark.parametrize("where", ["top", "pod"])
def test_deep_nesting_is_refused_in_words(world, verb, depth, where):
    nested = "[" * depth + "]" * depth
    raw = nested if where == "top" else (
        '{"Pod":{"metadata":{"name":"n","uid":"u","annotations":{"x":' + nested + '}}},"NodeNames":[],'
        '"PodName":"n","PodNamespace":"ml","PodUID":"u","Node":"gpu-a"}')
    status, answer = post(world, verb, raw.encode())
    if where == "top" or depth > 1000:
        assert status == 400
    else:
        assert refused(status, answer)  # annotations must be strings: a RequestError in words


def test_unknown_pods_and_nodes_are_refused_in_words():
    world = live()  # its own: the fuzz tests above may have filtered other pods under uid-waiting
    ghost = pod("ghost", "uid-ghost", {"tessera.dev/gpu-milli": "200"})
    post(world, "filter", json.dumps({"Pod": ghost, "NodeNames": list(NODES)}).encode())  # judged, not remembered
    _, answer = post(world, "bind", json.dumps({"PodName": "ghost", "PodNamespace": "ml", "PodUID": "uid-ghost",
                                                "Node": "gpu-a"}).encode())
    assert "unknown" in answer["Error"]
    _, answer = post(world, "bind", json.dumps({"PodName": "waiting", "PodNamespace": "ml", "PodUID": "uid-waiting",
                                                "Node": "nowhere"}).encode())
    assert "not in its cache" in answer["Error"]
    _, answer = post(world, "bind", json.dumps({"PodName": "other", "PodNamespace": "ml", "PodUID": "uid-waiting",
                                                "Node": "gpu-a"}).encode())  # a known UID under another name
    assert "unknown" in answer["Error"]
    _, answer = post(world, "filter", json.dumps({"Pod": ghost, "NodeNames": ["nowhere", "gpu-c"]}).encode())
    assert answer["NodeNames"] == ["gpu-c"] and "not in its cache" in answer["FailedNodes"]["nowhere"]
    _, answer = post(world, "prioritize", json.dumps({"Pod": ghost, "NodeNames": ["nowhere"]}).encode())
    assert answer == [{"Host": "nowhere", "Score": 0}]
    _, answer = post(world, "preempt", json.dumps({"Pod": ghost, "NodeNameToMetaVictims": {
        "nowhere": {"Pods": [{"UID": "uid-x"}]}}}).encode())
    assert answer == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize("verb", VERBS)
def test_a_body_over_the_limit_gets_413_in_words(verb):
    small = live(max_body_bytes=64 * 1024)
    before = small.extender.snapshot()
    r = small.client.post(f"{P}/{verb}", data=b" " * (64 * 1024 + 1), content_type="application/json")
    assert r.status_code == 413 and "over 65536 bytes" in check_answer(r.status_code, r.data, verb)["Error"]
    assert small.extender.snapshot() == before


@pytest.mark.parametrize("verb, body, words", [
    ("filter", {"Pod": pod("p", "u", {"nvidia.com/gpu": "inf"}), "NodeNames": ["gpu-a"]}, "not a quantity"),
    ("filter", {"Pod": pod("p", "u", {"cpu": "1e999999999"}), "NodeNames": ["gpu-a"]}, "quantity"),
    ("filter", {"Pod": pod("p", "u", {"nvidia.com/gpu": "-2"}), "NodeNames": ["gpu-a"]}, "from 0"),
    ("filter", {"Pod": pod("p", "u", {}, annotations={"tessera.dev/gang-name": "g", "tessera.dev/gang-size": "9" * 12}),
                "NodeNames": ["gpu-a"]}, "gang-size"),
    ("filter", {"Pod": {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": "c"}}, "NodeNames": []},
     "Pod.spec.containers: expected an array, got string"),
    ("prioritize", {"Pod": {"metadata": {"name": "p", "uid": "u", "annotations": {"a": 1}}}, "NodeNames": []},
     "Pod.metadata.annotations['a']: expected a string, got number"),
    ("preempt", {"Pod": {"metadata": {"name": "p", "uid": "u"},
                         "spec": {"containers": [{"resources": {"limits": {"cpu": []}}}]}}}, "expected a quantity"),
    ("filter", {"Pod": pod("p", "u", {}), "Nodes": {"items": [{"metadata": 7}]}}, "Nodes.items[].metadata.name"),
    ("preempt", {"Pod": pod("p", "u", {}), "NodeNameToVictims": {"gpu-a": {"Pods": [{"metadata": 7}]}}}, "missing UID"),
])
def test_bad_pods_are_explained(world, verb, body, words):
    _, answer = post(world, verb, json.dumps(body).encode())
    assert words in refusal(answer)


def test_null_match_expressions_are_nil_not_a_crash():
    # found by schemathesis in CI: matchExpressions [null] passed the type check (null is Go's nil)
    # and then crashed the model reader with AttributeError (a 500)
    from extender.translate.objects import pod_request

    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [None, None]}]}}}}}
    assert pod_request(pod).gpu_models == frozenset()
