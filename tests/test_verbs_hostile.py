"""The verbs as a hostile client would use them (issue 11, items 2 and 4).

Anyone who reaches the port can post any pod: the verbs judge it and remember nothing; bind acts
only for a pod the watch knows, pending, under the posted UID and name, and only onto a node that
passes this extender's own filter for it now (fit, GPU model, taints). Every request's work is
bounded: a gang's size is checked against the cluster in O(1) (its admission's cost: tests/test_gangs.py),
bodies are limited to what the configured cluster needs, and filter reasons become a fixed set of
metric labels.
"""

from __future__ import annotations

import json
import re
import threading

import pytest

from extender.holds import MAX_WATCH_WAITS
from extender.http.app import create_app
from extender.service import BindError, Extender
from extender.translate.objects import node_inventory, pod_info
from testing.fuzzkit import refusal
from testing.ports import both

P = "/tessera"


def node(name, gpus=4, model="T4", taints=None):
    alloc = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": str(gpus)}
    obj = {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model}},
           "status": {"allocatable": alloc, "capacity": alloc}}
    if taints is not None:
        obj["spec"] = {"taints": taints}
    return obj


def kpod(name, gpus=1, uid=None, node_name="", gang=None, tolerations=None, model=None, phase="Pending"):
    ann = {} if gang is None else {"tessera.dev/gang-name": gang[0], "tessera.dev/gang-size": str(gang[1])}
    spec = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}}}],
            "nodeName": node_name}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if model is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": model}
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}", "annotations": ann},
            "spec": spec, "status": {"phase": phase}}


class Binder:
    def __init__(self):
        self.calls = []

    def bind(self, namespace, name, uid, node, annotations):
        self.calls.append((namespace, name, uid, node))


def cluster(*nodes, ext=None):
    ext = ext or Extender()
    for n in nodes:
        ext.upsert_node(node_inventory(n))
    ext.mark_synced()
    return ext


def bind_body(name, node_name, uid=None):
    return {"PodName": name, "PodNamespace": "ml", "PodUID": uid or f"uid-{name}", "Node": node_name}


TAINT = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


# --- the verbs remember nothing -----------------------------------------------------------------

def test_filter_prioritize_preempt_of_an_unknown_pod_remember_nothing():
    ext = cluster(node("a"), node("b"))
    before, learned = ext.snapshot(), dict(ext.learning.learner.counts)
    for i in range(30):  # enough posted pods to have relearned the workload if they were learned from
        p = pod_info(kpod(f"ghost-{i}", gpus=1 + i % 3))
        ext.filter(p, ["a", "b"])
        ext.prioritize(p, ["a", "b"])
        ext.preempt(p, {"a": []})
    assert ext.snapshot() == before  # pods included: none was added
    assert dict(ext.learning.learner.counts) == learned


def test_bind_of_a_pod_the_watch_never_saw_is_refused_in_words():
    ext, binder = cluster(node("a")), Binder()
    client = create_app(ext, binder).test_client()
    client.post(f"{P}/filter", json={"Pod": kpod("ghost"), "NodeNames": ["a"]})  # as a hostile client would
    before = ext.snapshot()
    answer = client.post(f"{P}/bind", json=bind_body("ghost", "a")).get_json()
    assert "unknown" in answer["Error"] and "watch" in answer["Error"]
    assert not binder.calls and ext.snapshot() == before


def test_bind_under_another_uid_is_refused():
    ext, binder = cluster(node("a")), Binder()
    ext.upsert_pod(pod_info(kpod("p")))  # the real pod, as the watch sees it
    client = create_app(ext, binder).test_client()
    client.post(f"{P}/filter", json={"Pod": kpod("p", uid="uid-evil"), "NodeNames": ["a"]})
    answer = client.post(f"{P}/bind", json=bind_body("p", "a", uid="uid-evil")).get_json()
    assert "unknown" in answer["Error"] and not binder.calls
    answer = client.post(f"{P}/bind", json=bind_body("other", "a", uid="uid-p")).get_json()  # the UID, another name
    assert "unknown" in answer["Error"] and not binder.calls and not ext.cluster.assignments
    assert client.post(f"{P}/bind", json=bind_body("p", "a")).get_json() == {"Error": ""}  # the real one binds


def test_bind_of_a_pod_already_bound_is_refused():
    ext = cluster(node("a"), node("b"))
    ext.upsert_pod(pod_info(kpod("big", gpus=4, node_name="a", phase="Running")))
    # bound to a full node by another binder: its GPUs could not be counted there, only its CPU and memory
    ext.upsert_pod(pod_info(kpod("p", gpus=4, node_name="a", phase="Running")))
    assert ext.cluster.assignments["ml/p"].gpus == () and "uid-p" in ext.rejected
    with pytest.raises(BindError, match="already bound to a"):
        ext.reserve("uid-p", "ml/p", "b")
    assert ext.cluster.by_name["b"].gpu_free == [1000] * 4


def test_bind_onto_a_node_the_pods_own_filter_refuses_is_refused():
    ext = cluster(node("a"), node("tainted", taints=[TAINT]), node("v100", model="V100"))
    ext.upsert_pod(pod_info(kpod("p", gpus=2, model="T4")))
    ext.upsert_pod(pod_info(kpod("filler", gpus=3, node_name="a", phase="Running")))
    for target, words in (("tainted", "taint dedicated=infra:NoSchedule"), ("v100", "GPU model V100 not in T4"),
                          ("a", "only 1 whole GPUs free")):
        with pytest.raises(BindError, match=words):
            ext.reserve("uid-p", "ml/p", target)
    assert "ml/p" not in ext.cluster.assignments


def test_a_filter_again_drops_a_stale_hold_only_for_the_watched_pod_with_its_uid():
    ext = cluster(node("a"))
    ext.upsert_pod(pod_info(kpod("p")))
    ext.reserve("uid-p", "ml/p", "a")
    ext.bind_done("uid-p", True)  # bound as far as the binder knows; the watch has not confirmed yet
    ext.filter(pod_info(kpod("p", uid="uid-evil")), ["a"])  # same name, another UID: not the pod
    assert "ml/p" in ext.cluster.assignments
    ext.filter(pod_info(kpod("p")), ["a"])  # kube-scheduler retrying the pod itself
    assert "ml/p" not in ext.cluster.assignments and not ext.bind_holds


def until(condition):
    """Poll until `condition()` holds (each poll yields); nothing about time is asserted."""
    for _ in range(3000):
        if condition():
            return
        threading.Event().wait(0.01)


def test_a_bind_that_arrives_before_the_watch_delivers_its_pod_waits_for_it():
    ext = cluster(node("a"), ext=Extender(watch_wait_s=30))
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("a", ext.reserve("uid-p", "ml/p", "a")))
    t.start()
    until(lambda: ext.arrivals.waiting > 0)
    assert not result  # waiting, and not holding the lock: the watch gets in
    ext.upsert_pod(pod_info(kpod("p")))
    t.join(30)
    assert result["a"][0].node == "a" and "ml/p" in ext.cluster.assignments


def test_binds_for_pods_never_created_hold_few_threads_and_the_rest_are_refused_at_once():
    ext = cluster(node("a"), ext=Extender(watch_wait_s=30))
    errors = []

    def bind(i):
        try:
            ext.reserve(f"uid-ghost-{i}", f"ml/ghost-{i}", "a")
        except BindError as e:
            errors.append(str(e))

    waiting = [threading.Thread(target=bind, args=(i,)) for i in range(MAX_WATCH_WAITS)]
    for t in waiting:
        t.start()
    until(lambda: ext.arrivals.waiting == MAX_WATCH_WAITS)
    with pytest.raises(BindError, match="unknown"):
        ext.reserve("uid-ghost-x", "ml/ghost-x", "a")  # no slot left: refused without waiting
    assert not errors
    for i in range(MAX_WATCH_WAITS):  # pods with those UIDs appear, under other names: still not these pods
        ext.upsert_pod(pod_info(kpod(f"real-{i}", uid=f"uid-ghost-{i}")))
    for t in waiting:
        t.join(30)
    assert len(errors) == MAX_WATCH_WAITS and all("unknown" in e for e in errors) and not ext.cluster.assignments


# --- taints -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tolerations, passes", [
    (None, False),
    ([{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}], True),
    ([{"key": "dedicated", "value": "infra"}], True),  # empty operator is Equal, empty effect matches all
    ([{"key": "dedicated", "operator": "Exists"}], True),
    ([{"operator": "Exists"}], True),  # empty key with Exists tolerates everything
    ([{"key": "dedicated", "operator": "Equal", "value": "other"}], False),
    ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": "dedicated", "operator": "Gt", "value": "infra"}], False),  # no such operator: tolerates nothing
])
def test_a_tainted_node_is_filtered_out_unless_tolerated(tolerations, passes):
    ext = cluster(node("a"), node("tainted", taints=[TAINT, {"key": "soft", "effect": "PreferNoSchedule"}]))
    out = ext.filter(pod_info(kpod("p", tolerations=tolerations)), ["a", "tainted"])
    if passes:
        assert out.passed == ["a", "tainted"]
    else:
        assert out.passed == ["a"] and "does not tolerate" in out.unresolvable["tainted"]


def test_a_taint_added_later_and_removed_again_is_followed():
    ext = cluster(node("a"))
    p = pod_info(kpod("p"))
    assert ext.filter(p, ["a"]).passed == ["a"]
    ext.upsert_node(node_inventory(node("a", taints=[{"key": "gone", "effect": "NoExecute"}])))
    assert ext.filter(p, ["a"]).passed == []
    ext.upsert_node(node_inventory(node("a")))
    assert ext.filter(p, ["a"]).passed == ["a"]


def test_bad_tolerations_are_refused_in_words():
    from extender.core.model import RequestError

    with pytest.raises(RequestError, match="tolerations"):
        pod_info(kpod("p", tolerations=[{"key": 7}]))
    with pytest.raises(RequestError, match="tolerations"):
        pod_info(kpod("p", tolerations="all"))


# --- bounded work -------------------------------------------------------------------------------

def counting(ext):
    """Count the policy calls (filter and score) the extender makes: the unit of its work."""
    calls = {"n": 0}
    policy = ext.policy
    for name in ("filter", "score"):
        real = getattr(policy, name)

        def wrapped(*a, _real=real, **k):
            calls["n"] += 1
            return _real(*a, **k)
        setattr(policy, name, wrapped)
    return calls


NODES = 30  # x 8 GPUs: 240 GPUs


def test_a_gang_larger_than_the_cluster_is_refused_in_constant_work_as_soon_as_its_first_member_comes():
    """10,000 members declared, one created: said at once (not after 9,999 more pods), with no placement tried."""
    ext = cluster(*(node(f"n{i:02d}", gpus=8) for i in range(NODES)))
    ext.upsert_pod(pod_info(kpod("g-0", gang=("huge", 10_000))))
    calls = counting(ext)
    out = ext.filter(pod_info(kpod("g-0", gang=("huge", 10_000))), [f"n{i:02d}" for i in range(NODES)])
    assert calls["n"] == 0  # was 240 placements x 30 nodes: 7,200 filters and as many scores
    assert out.passed == [] and "needs 10000 GPUs" in out.unresolvable["n00"] and "240 healthy GPUs" in out.unresolvable["n00"]


def test_a_body_over_the_default_limit_gets_413():
    ext = cluster(node("a"))
    before = ext.snapshot()
    client = create_app(ext, Binder()).test_client()
    r = client.post(f"{P}/filter", data=b" " * (16 * 1024 * 1024), content_type="application/json")
    assert r.status_code == 413 and "bytes" in r.get_json()["Error"]
    assert ext.snapshot() == before


def test_the_body_limit_fits_the_largest_legitimate_body_for_its_node_count():
    from extender.http.limits import MAX_BODY_BYTES, max_body_bytes

    for nodes in (10, 1000, 5000):
        names = [f"{i:0>253}" for i in range(nodes)]  # the longest legal node names
        fat = kpod("p")
        fat["metadata"]["annotations"]["big"] = "x" * (1536 * 1024)  # an object at etcd's size limit
        body = json.dumps({"Pod": fat, "NodeNames": names}, separators=(",", ":"))
        assert len(body) <= max_body_bytes(nodes)
        victims = {n: {"Pods": [{"UID": f"{k:036d}"} for k in range(110)], "NumPDBViolations": 0}
                   for n in names[: min(nodes, 2 * max(nodes // 10, 100))]}
        assert len(json.dumps({"Pod": fat, "NodeNameToMetaVictims": victims}, separators=(",", ":"))) <= max_body_bytes(nodes)
    assert MAX_BODY_BYTES == max_body_bytes(5000) <= 16 * 1024 * 1024
    assert max_body_bytes(5000, node_cache_capable=False) > 5000 * 21 * 1024  # full Node objects


def test_filter_reason_labels_come_from_a_fixed_set():
    ext = cluster(node("a"), node("tainted", taints=[TAINT]))
    client = both(create_app(ext, Binder())).test_client()  # /metrics is on the admin listener
    for i in range(40):  # each pod names its own GPU model: 40 different reason texts
        client.post(f"{P}/filter", json={"Pod": kpod(f"p{i}", model=f"model-{i}"), "NodeNames": ["a", "tainted", "nowhere"]})
    client.post(f"{P}/filter", json={"Pod": kpod("g", gang=("x" * 50, 100)), "NodeNames": ["a"]})
    text = client.get("/metrics").data.decode()
    labels = {line.split('reason="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("tessera_filter_rejections_total{")}
    assert labels and labels <= {"gpu-model", "taint", "not-cached", "gang"}, labels


# --- node affinity a tenant writes --------------------------------------------------------------
def with_affinity(p, key, values, field="matchExpressions"):
    p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {field: [{"key": key, "operator": "In", "values": values}]}]}}}
    return p


@pytest.mark.parametrize("values, words", [
    ([f"m{i:09d}" for i in range(65)], "names 65 GPU models"),  # 40,000 held the lock 22 s on 1000 nodes
    (["A100\x1b]0;pwned\x07\nNormal Scheduled ok"], "printable"),
    (["A" * 64], "GPU model"),  # longer than any label value
])
def test_gpu_models_a_pod_names_are_few_and_printable_or_the_pod_is_refused_in_words(values, words):
    from extender.core.model import RequestError

    p = with_affinity(kpod("m"), "nvidia.com/gpu.product", values)
    with pytest.raises(RequestError, match=words):
        pod_info(p)
    ext = cluster(node("n0"))
    body = create_app(ext, Binder()).test_client().post(f"{P}/filter", json={"Pod": p, "NodeNames": ["n0"]}).get_json()
    assert words.split()[0] in refusal(body) and "\x1b" not in refusal(body) and not body.get("NodeNames")


def test_a_bound_pod_naming_too_many_models_still_holds_its_gpus():
    ext = cluster(node("n0", gpus=1))
    bound = with_affinity(kpod("b", node_name="n0", phase="Running"), "nvidia.com/gpu.product",
                          [f"m{i}" for i in range(100)])
    ext.upsert_pod(pod_info(bound))
    assert ext.cluster.by_name["n0"].full_gpus_free == 0


def test_a_pod_refused_on_its_model_is_told_a_few_of_them_not_all():
    ext = cluster(node("n0", model="T4"), node("n1", model="model-05"))
    p = with_affinity(kpod("m"), "nvidia.com/gpu.product", [f"model-{i:02d}" for i in range(64)])
    body = create_app(ext, Binder()).test_client().post(f"{P}/filter", json={"Pod": p, "NodeNames": ["n0"]}).get_json()
    assert body["FailedNodes"]["n0"].endswith("model-03 (and 60 more)")


def test_match_fields_of_the_wrong_type_are_refused_in_words_not_a_500():
    p = kpod("f")
    p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": 5}]}}}
    r = create_app(cluster(node("n0")), Binder()).test_client().post(f"{P}/filter", json={"Pod": p, "NodeNames": ["n0"]})
    assert r.status_code == 200 and "matchFields" in refusal(r.get_json())


def refused_by_kube(p, message):
    p["spec"]["priority"] = 100
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
    return p


@pytest.mark.parametrize("padding, victim", [(0, "ml/low-z"), (64, None)])
def test_preemption_for_a_pod_kube_refused_never_reads_unreadable_affinity_as_every_node(padding, victim):
    """65 values are past what node_terms reads: read as "every node", another tenant's pod on a zone-y node was
    evicted for a pod that may only run in zone x."""
    nodes = []
    for name, zone in (("a", "y"), ("z", "x")):
        n = node(name, gpus=1)
        n["metadata"]["labels"]["zone"] = zone
        nodes.append(n)
    ext = cluster(*nodes)
    for n in ("a", "z"):
        ext.upsert_pod(pod_info(kpod(f"low-{n}", gpus=1, node_name=n, phase="Running")))
    p = refused_by_kube(with_affinity(kpod("hi"), "zone", ["x"] + [f"pad{i}" for i in range(padding)]),
                        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match node selector.")
    info = pod_info(p)
    ext.upsert_pod(info)
    plan = ext.plan_preemption(info)
    assert (plan and sorted(plan.victims.values())) == ([victim] if victim else None)


def gpu_container(name, gpus, cpu="1", restart=None):
    c = {"name": name, "resources": {"limits": {"cpu": cpu, "nvidia.com/gpu": str(gpus)}}}
    if restart:
        c["restartPolicy"] = restart
    return c


@pytest.mark.parametrize("init, containers, gpus, cpu_milli", [
    ([gpu_container("side", 2, restart="Always")], [gpu_container("c", 2)], 4, 2000),  # a sidecar runs beside them
    ([gpu_container("init", 3)], [gpu_container("c", 2)], 3, 1000),  # an init container runs before them
    ([gpu_container("side", 1, restart="Always"), gpu_container("init", 3)], [gpu_container("c", 1)], 4, 2000),
    ([gpu_container("init", 3), gpu_container("side", 1, restart="Always")], [gpu_container("c", 1)], 3, 2000),
])
def test_sidecars_count_with_the_containers_as_the_kubelet_counts_them(init, containers, gpus, cpu_milli):
    p = kpod("s")
    p["spec"]["initContainers"], p["spec"]["containers"] = init, containers
    request = pod_info(p).request
    assert (request.gpu_count, request.cpu_milli) == (gpus, cpu_milli)


@pytest.mark.parametrize("raw", ["0.0001", "1.5", "500m"])
def test_a_fraction_of_a_gpu_resource_is_refused_not_rounded_down(raw):
    """int() made "0.0001" GPUs none: the pod passed as CPU-only. The apiserver refuses such a pod; a verb's body
    is refused the same way."""
    from extender.core.model import RequestError

    p = kpod("f")
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = raw
    with pytest.raises(RequestError, match="a whole number"):
        pod_info(p)


def test_a_slice_asked_by_two_containers_is_refused_in_words():
    """Both would be capped at the whole slice by tessera-launch: 300 + 300 could use 600 each of a 600 slice."""
    from extender.core.model import RequestError

    p = kpod("two")
    p["spec"]["containers"] = [{"name": n, "resources": {"limits": {"tessera.dev/gpu-milli": "300"}}} for n in ("a", "b")]
    with pytest.raises(RequestError, match=r"asked by 2 containers \('a', 'b'\); a slice is for one container"):
        pod_info(p)


def test_gang_members_that_disagree_on_the_size_are_told_so():
    """Three members said 4 and one said 3 (copied manifests): two gangs of one name, each told its other members
    were never created, and the disagreement never named."""
    ext = cluster(node("a", gpus=8))
    for i in range(3):
        ext.upsert_pod(pod_info(kpod(f"m{i}", gang=("job", 4))))
    ext.upsert_pod(pod_info(kpod("m3", gang=("job", 3))))
    for name, size, other in (("m0", 4, "3"), ("m3", 3, "4")):
        out = ext.filter(pod_info(kpod(name, gang=("job", size))), ["a"])
        assert out.passed == [] and f"disagree on tessera.dev/gang-size: this pod says {size}, other members say " \
            f"{other}; give every member the same size" in out.failed["a"]
    ext.upsert_pod(pod_info(kpod("m3", gang=("job", 4))))  # mended: one gang of four, admitted as any
    assert ext.filter(pod_info(kpod("m0", gang=("job", 4))), ["a"]).passed == ["a"]


def test_a_finished_runs_pods_do_not_disagree_with_a_new_run_of_another_size():
    """A Job keeps its finished pods: a gang of 2 that Succeeded must not hold back a new run of the gang at 4."""
    ext = cluster(node("a", gpus=8))
    for i in range(2):
        ext.upsert_pod(pod_info(kpod(f"old{i}", gang=("job", 2), phase="Succeeded")))
    for i in range(4):
        ext.upsert_pod(pod_info(kpod(f"new{i}", gang=("job", 4))))
    assert ext.filter(pod_info(kpod("new0", gang=("job", 4))), ["a"]).passed == ["a"]


def test_a_bound_pod_whose_two_containers_ask_a_slice_is_counted_on_its_gpu():
    """Refusing such a pod at the request (not only a pending one) made a pod bound before the rule counted as a
    whole GPU guessed elsewhere: GPU 0 read 600 free while it was full."""
    from extender.translate.objects import encode_assignment
    from tessera_contract import GpuAssignment

    ext = cluster(node("a", gpus=2))
    for name, limits, milli in (("other", [400], 400), ("old", [300, 300], 600)):
        p = kpod(name, node_name="a", phase="Running")
        p["spec"]["containers"] = [{"name": f"c{i}", "resources": {"limits": {"tessera.dev/gpu-milli": str(m)}}}
                                   for i, m in enumerate(limits)]
        p["metadata"]["annotations"].update(encode_assignment(GpuAssignment(node="a", gpus=(0,), milli=milli)))
        ext.upsert_pod(pod_info(p))
    assert ext.cluster.by_name["a"].gpu_free == [0, 1000]


def test_a_model_no_node_has_is_said_with_the_models_there_are():
    ext = cluster(node("a", model="NVIDIA-A100-SXM4-80GB"), node("b", model="T4"))
    out = ext.filter(pod_info(kpod("m", model="A100")), ["a", "b"])
    assert out.passed == [] and set(out.unresolvable.values()) == {
        "tessera: no node has GPU model A100; the cluster's models: NVIDIA-A100-SXM4-80GB, T4"}
    assert ext.filter(pod_info(kpod("t", model="T4")), ["a", "b"]).passed == ["b"]


def padded_terms(terms: int, expressions: int) -> dict:
    """Every expression passes on a node labelled zone=z but the last of each term: the most a node check can cost."""
    values = [str(k) for k in range(64)]
    term = {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": values}] * (expressions - 1)
            + [{"key": "zone", "operator": "In", "values": values}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term] * terms}}}}


def test_node_affinity_is_read_only_up_to_a_total_of_expressions_and_checks_values_in_one_step():
    """64 terms x 64 expressions x 64 values passed the per-list caps: one node check cost 3.1 ms, and a held pod's
    filter 12 s under the lock (audit, 2026-12-02). Now the selector and every term's expressions count together."""
    from extender.translate.objects import MAX_NODE_EXPRESSIONS, node_terms

    assert node_terms(padded_terms(64, 64)) is None  # past the total: admits no node in any plan
    assert node_terms(padded_terms(2, MAX_NODE_EXPRESSIONS // 2 + 1)) is None
    assert node_terms({"nodeSelector": {f"k{i}": "v" for i in range(8)}, **padded_terms(1, MAX_NODE_EXPRESSIONS - 7)}) is None
    read = node_terms(padded_terms(1, MAX_NODE_EXPRESSIONS))
    assert read is not None and read.size == MAX_NODE_EXPRESSIONS
    assert not read.admits("n", {"zone": "z"}) and read.admits("n", {"zone": "0"}) is False
    assert all(isinstance(values, frozenset) for term in read.terms for _, op, values in term if op in ("In", "NotIn"))


@pytest.mark.parametrize("terms, admits", [
    ([None], False),  # the API's rule: a null or empty term matches no node
    ([{}], False),
    ([{}, {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}], True),
])
def test_an_empty_node_selector_term_matches_no_node(terms, admits):
    from extender.translate.objects import node_terms

    read = node_terms({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}})
    assert read is not None and read.admits("n", {"zone": "x"}) is admits


@pytest.mark.parametrize("affinity, words", [
    ({"podAffinity": "x"}, "podAffinity: expected an object"),
    ({"podAntiAffinity": [1]}, "podAntiAffinity: expected an object"),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["x"]}}},
     r"nodeSelectorTerms\[0\]: expected an object"),
])
def test_inter_pod_affinity_of_the_wrong_type_is_refused_in_words_not_a_500(affinity, words):
    p = kpod("f")
    p["spec"]["affinity"] = affinity
    client = create_app(cluster(node("n0")), Binder()).test_client()
    r = client.post(f"{P}/filter", json={"Pod": p, "NodeNames": ["n0"]})
    assert r.status_code == 200 and re.search(words, refusal(r.get_json()))
    for verb in ("prioritize", "preempt"):
        body = {"Pod": p, "NodeNames": ["n0"]} if verb == "prioritize" else {"Pod": p, "NodeNameToMetaVictims": {}}
        assert client.post(f"{P}/{verb}", json=body).status_code == 400
