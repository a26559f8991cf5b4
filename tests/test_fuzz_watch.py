"""Property-based hostile objects on the watch path, the way tests/test_fuzz_wire.py fuzzes the verbs.

Hypothesis writes pods and nodes as a hostile tenant or a compromised node would: annotations with
any unicode, huge or deeply nested JSON, quantities like "1e400", "-1", "NaN" and 2^80, labels of any
type, wrong JSON types anywhere. Properties: the parsers answer an object or a RequestError (never
another exception: that is what used to stall the watch), ApiCache's apply path never raises, and
the legitimate objects' state (who holds which GPU) does not move.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.core.model import RequestError
from extender.http.inspect import cluster_map
from extender.kube.cache import ApiCache
from extender.translate.objects import (
    ASSIGNMENT_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    INVENTORY_ANNOTATION,
    MAC_ANNOTATION,
    MEMORY_LABEL,
    MODEL_LABEL,
    node_inventory,
    pod_info,
)
from testing.kube_objects import k8s_node
from tests.test_fuzz_wire import any_json, maybe
from tests.test_watch_hostile import KEY, signed

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                         HealthCheck.function_scoped_fixture])
LEGIT_NODES = ("gpu-a", "gpu-b")

numbers = st.sampled_from(["1e400", "-1", "NaN", "inf", "0", "1", "2Gi", "500m", "1.5", str(2**80), "9" * 5000, "²", "٣",
                           str(2**63 - 1), "8Ei",
                           "0x10", " 3 ", "1e-400", ""]) | st.integers() | st.floats() | st.booleans() | st.none()
hostile_text = (st.text(max_size=40) | st.sampled_from(["é" * 64, "\u0660" * 64, "\ufeff", "x" * 70_000, "[" * 5000])
                | any_json.map(json.dumps) | numbers.map(str))
gpu_entry = st.fixed_dictionaries({}, optional={k: maybe(numbers) for k in ("index", "memory_mib", "oob_memory_mib")} | {
    "uuid": maybe(hostile_text), "model": maybe(hostile_text), "healthy": maybe(st.booleans())})
inventory = (st.fixed_dictionaries({"gpus": maybe(st.lists(maybe(gpu_entry), max_size=4))}).map(json.dumps)
             | st.builds(lambda n: json.dumps({"gpus": [{"index": i} for i in range(n)]}), st.integers(0, 600))
             | hostile_text)
assignment = (st.fixed_dictionaries({"node": maybe(st.sampled_from(LEGIT_NODES)),
                                     "gpus": maybe(st.lists(maybe(numbers), max_size=4)),
                                     "milli": maybe(numbers)}).map(json.dumps) | hostile_text)
annotation_values = {ASSIGNMENT_ANNOTATION: assignment, MAC_ANNOTATION: hostile_text, GANG_NAME_ANNOTATION: hostile_text,
                     GANG_SIZE_ANNOTATION: numbers.map(str) | hostile_text, INVENTORY_ANNOTATION: inventory}
annotations = st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in annotation_values.items()}) | st.dictionaries(
    st.text(max_size=10), maybe(hostile_text), max_size=3)
labels = st.fixed_dictionaries({}, optional={MODEL_LABEL: maybe(hostile_text), MEMORY_LABEL: maybe(numbers.map(str) | numbers)})
RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "tessera.dev/gpu-milli"]
quantities = st.dictionaries(st.sampled_from(RESOURCES), maybe(numbers), max_size=4)
container = st.fixed_dictionaries({"name": st.just("c")}, optional={"resources": maybe(st.fixed_dictionaries(
    {}, optional={"limits": maybe(quantities), "requests": maybe(quantities)}))})


def hostile_pod(uids):
    meta = st.fixed_dictionaries({"uid": uids, "name": st.sampled_from(["h1", "h2"]), "namespace": st.just("evil")},
                                 optional={"annotations": maybe(annotations), "labels": maybe(labels)})
    spec = st.fixed_dictionaries({}, optional={"containers": maybe(st.lists(maybe(container), max_size=3)),
                                               "nodeName": maybe(st.sampled_from(LEGIT_NODES + ("", "nowhere")))})
    return st.fixed_dictionaries({"metadata": meta}, optional={
        "spec": maybe(spec), "status": maybe(st.fixed_dictionaries({"phase": maybe(st.sampled_from(["Running", "Failed"]))}))})


def hostile_node(names):
    meta = st.fixed_dictionaries({"name": names}, optional={"annotations": maybe(annotations), "labels": maybe(labels)})
    status = st.fixed_dictionaries({}, optional={"allocatable": maybe(quantities), "capacity": maybe(quantities)})
    return st.fixed_dictionaries({"metadata": meta}, optional={"status": maybe(status)})


class NoApi:
    """The apply path needs no API; Events on bad objects go nowhere here."""

    def create_namespaced_event(self, *_, **__):
        pass


@pytest.fixture(scope="module")
def world():
    from extender.service import Extender

    ext = Extender(signer=KEY)
    cache = ApiCache(NoApi(), ext)
    for name in LEGIT_NODES:
        cache._node("ADDED", k8s_node(name, gpus=4))
    legit = [signed("whole", "gpu-a", [0, 1], whole=2), signed("slice", "gpu-a", [2], milli=300),
             signed("other", "gpu-b", [3], milli=700)]
    for pod in legit:
        cache._pod("ADDED", pod)
    ext.mark_synced()
    assert set(ext.cluster.assignments) == {"ml/whole", "ml/slice", "ml/other"}
    return ext, cache, {p["metadata"]["uid"]: p for p in legit}


@FUZZ
@given(pod=hostile_pod(st.just("uid-h")), signer=st.sampled_from([None, KEY]))
def test_pod_info_answers_a_pod_or_a_request_error(pod, signer):
    try:
        info = pod_info(pod, signer)
    except RequestError as e:
        assert str(e)
        return
    assert info.assignment is None or not info.forged


@FUZZ
@given(node=hostile_node(st.sampled_from(["n", "", "x" * 300])))
def test_node_inventory_answers_a_node_or_a_request_error(node):
    try:
        inv = node_inventory(node)
    except RequestError as e:
        assert str(e)
        return
    assert 0 <= inv.spec.gpu_count <= 256 and all(0 <= r <= 1000 for r in inv.spec.gpu_reserved)
    assert 0 <= inv.spec.cpu_milli <= 2**53 and 0 <= inv.spec.memory_mib <= 2**53  # /inspect encodes them


@FUZZ
@given(pod=hostile_pod(st.sampled_from(["uid-h1", "uid-h2"])))
def test_a_hostile_pod_added_then_deleted_leaves_every_legit_pod_and_gpu_as_it_was(world, pod):
    ext, cache, _ = world
    before = ext.snapshot()
    cache._pod("ADDED", pod)  # never raises
    after = ext.snapshot()
    assert {a for a in after.assignments if not a[0].startswith("evil/")} == before.assignments
    assert all(all(0 <= f <= 1000 for f in gpus) for _, _, _, gpus in after.nodes)
    cache._pod("DELETED", {"metadata": {"uid": pod["metadata"]["uid"]}})
    assert ext.snapshot() == before


@FUZZ
@given(data=st.data())
def test_a_hostile_update_of_a_counted_pod_keeps_its_gpus(world, data):
    ext, cache, legit = world
    uid = data.draw(st.sampled_from(sorted(legit)))
    before = ext.snapshot()
    pod = json.loads(json.dumps(legit[uid]))
    pod["metadata"]["annotations"] = data.draw(maybe(annotations))
    pod["metadata"]["labels"] = data.draw(maybe(labels))
    cache._pod("MODIFIED", pod)
    after = ext.snapshot()
    assert (after.nodes, after.assignments) == (before.nodes, before.assignments), "a tenant's edit moved GPUs"
    cache._pod("MODIFIED", legit[uid])
    assert ext.snapshot() == before


@FUZZ
@given(node=hostile_node(st.sampled_from(["hn-1", "hn-2"])))
def test_a_hostile_node_added_then_deleted_leaves_the_legit_nodes_as_they_were(world, node):
    ext, cache, _ = world
    before = ext.snapshot()
    cache._node("ADDED", node)
    orjson.dumps(cluster_map(ext))  # /inspect can show whatever was accepted
    after = ext.snapshot()
    assert [n for n in after.nodes if n[0] in LEGIT_NODES] == list(before.nodes)
    assert after.assignments == before.assignments
    cache._node("DELETED", {"metadata": {"name": node["metadata"]["name"]}})
    assert ext.snapshot() == before


@FUZZ
@given(data=st.data())
def test_a_hostile_update_of_a_legit_node_loses_no_pod_and_a_refused_one_changes_nothing(world, data):
    ext, cache, _ = world
    name = data.draw(st.sampled_from(LEGIT_NODES))
    before = ext.snapshot()
    node = data.draw(hostile_node(st.just(name)))
    cache._node("MODIFIED", node)
    after = ext.snapshot()
    assert after.assignments == before.assignments  # no pod loses what it holds, whatever the node says
    if ("Node", name) in {(b["kind"], b["key"]) for b in ext.watch_health.bad_objects()}:
        assert after == before, "a refused node update changed the state"
    cache._node("MODIFIED", k8s_node(name, gpus=4))
    assert ext.snapshot() == before
