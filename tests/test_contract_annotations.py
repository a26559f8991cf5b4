"""No tessera.dev/ input taken silently (issue 16, item 5).

Before: `gang-size` without `gang-name` bound the pod alone, a misspelt key was ignored, and
`tessera.dev/gpu-milli: 0` bound the pod with no GPU, all without a word. Now a pending pod with any
of these is refused at filter in words, and a bound one keeps what it holds but gets a Warning Event
and a count in tessera_pod_annotation_problems_total{category}.
"""

from __future__ import annotations

import json
import pathlib
import re
import threading

import pytest

from extender.http.app import create_app
from extender.kube.cache import ANNOTATION_REASON, ApiCache, EventSink
from extender.service import Extender
from extender.translate.objects import (
    ANNOTATION_CATEGORIES,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    KNOWN_POD_KEYS,
    AnnotationError,
    annotation_problems,
    pod_info,
)
from testing.fuzzkit import refusal
from testing.kube_objects import k8s_node, k8s_pod
from testing.ports import both

from .fakeapi import FakeApi, wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent


def filter_body(pod):
    return {"Pod": pod, "NodeNames": ["a"]}


def refused(pod) -> str:
    """The filter verb's answer for a pending pod on a one-node cluster: its Error ('' when it passes)."""
    ext = Extender()
    from extender.translate.objects import node_inventory
    ext.upsert_node(node_inventory(k8s_node("a", gpus=2)))
    ext.mark_synced()
    client = create_app(ext, binder=None).test_client()
    body = client.post("/tessera/filter", data=json.dumps(filter_body(pod)), content_type="application/json").get_json()
    return refusal(body)


@pytest.mark.parametrize("ann, milli, words, category", [
    ({GANG_SIZE_ANNOTATION: "4"}, 500, "without tessera.dev/gang-name", "half-gang"),
    ({GANG_NAME_ANNOTATION: "job"}, 500, "without tessera.dev/gang-size", "half-gang"),
    ({"tessera.dev/gang-sise": "4", GANG_NAME_ANNOTATION: "job"}, 500, "did you mean tessera.dev/gang-size?", "unknown-key"),
    ({"tessera.dev/gpu-milli": "500"}, None, "is a resource", "unknown-key"),
    ({GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: "0"}, 500, "gang-size must be a whole number 1..10000, got '0'",
     "bad-value"),
    ({}, 0, "gpu-milli is 0", "zero-gpu-milli"),
    ({}, 1500, "gpu-milli must be a whole number 1..1000 (one GPU at most), got 1500", "bad-value"),
    # the Ray job contract: before, filter placed these and the bridge only logged why it would not run them
    ({"tessera.dev/runtime": "ray", "tessera.dev/entrypoint": "m:f"}, 500, "needs tessera.dev/gang-name", "half-gang"),
    ({"tessera.dev/runtime": "Ray", GANG_NAME_ANNOTATION: "j", GANG_SIZE_ANNOTATION: "1"}, 500, 'must be "ray"',
     "bad-value"),
    ({"tessera.dev/runtime": "ray", GANG_NAME_ANNOTATION: "j", GANG_SIZE_ANNOTATION: "1"}, 500,
     "needs tessera.dev/entrypoint", "bad-value"),
    ({"tessera.dev/runtime": "ray", GANG_NAME_ANNOTATION: "j", GANG_SIZE_ANNOTATION: "1", "tessera.dev/entrypoint": "m:f",
      "tessera.dev/train-config": "{steps: 10"}, 500, "train-config: not JSON", "bad-value"),
    ({"tessera.dev/runtime": "ray", GANG_NAME_ANNOTATION: "j", GANG_SIZE_ANNOTATION: "1", "tessera.dev/entrypoint": "m:f",
      "tessera.dev/train-config": "[1]"}, 500, "must be a JSON object", "bad-value"),
    ({"tessera.dev/entrypoint": "m:f"}, 500, "does nothing without tessera.dev/runtime: ray", "bad-value"),
    # echoed into filter reasons, Events and `tessera inspect`: an ESC sequence or a newline would act on a terminal
    ({GANG_NAME_ANNOTATION: "x\x1b[2J\nFAKE: all healthy", GANG_SIZE_ANNOTATION: "2"}, 500, "printable characters",
     "bad-value"),
])
def test_a_pending_pod_with_input_that_would_be_taken_silently_is_refused_at_filter(ann, milli, words, category):
    pod = k8s_pod("p", milli=milli, ann=ann)
    if milli == 0:  # k8s_pod drops a falsy amount: write the 0 a tenant writes
        pod["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-milli"] = "0"
    assert category in ANNOTATION_CATEGORIES
    with pytest.raises(AnnotationError) as e:
        pod_info(pod)
    assert e.value.category == category and words in str(e.value)
    error = refused(pod)
    assert error.startswith("tessera: ") and words in error


def test_good_pods_and_tessera_own_keys_pass():
    ann = {GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: "2", "tessera.dev/runtime": "ray",
           "tessera.dev/entrypoint": "raybridge.examples.resnet:build", "tessera.dev/train-config": '{"steps": 3}',
           "tessera.dev/created-by": "tessera-bridge", "other.example/x": "y"}
    pod = k8s_pod("p", milli=500, ann=ann)
    assert annotation_problems(pod) == [] and pod_info(pod).gang.size == 2
    assert refused(pod) == ""
    assert refused(k8s_pod("cpu-only")) == ""  # no GPU asked for at all is fine


def test_many_misspelt_keys_make_one_bounded_message():
    pod = k8s_pod("p", milli=500, ann={f"tessera.dev/junk-{i}": "x" for i in range(1000)})
    problems = annotation_problems(pod)
    assert len(problems) == 6 and "and 995 more" in str(problems[-1])


def test_every_tessera_key_the_code_uses_on_pods_is_known():
    """One list in the contract: a key Tessera writes must never be reported as a misspelling."""
    # node, Lease, resource, the namespace label the agent's NetworkPolicy admits scrapers by, and the
    # namespace label an admin enables Ray jobs with (the bridge's RoleBinding loop selects it), and the node
    # label that opts a node in to the device plugin DaemonSet
    not_on_pods = {"tessera.dev/gpu-inventory", "tessera.dev/leader-url", "tessera.dev/gpu-milli",
                   "tessera.dev/metrics-scraper", "tessera.dev/ray-jobs", "tessera.dev/device-plugin"}
    used = set()
    for top in ("extender", "raybridge", "gpu_sharing", "tessera_contract", "manifests"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".py", ".yaml"):
                used |= set(re.findall(r"tessera\.dev/[a-z][a-z0-9-]*[a-z0-9]", path.read_text()))
    assert used - not_on_pods - KNOWN_POD_KEYS == set()


def watching():
    """A watch (ApiCache) on a fake API with its Event writer running, and one node `a` of 2 GPUs."""
    api = FakeApi()
    stop = threading.Event()
    ext = Extender()
    cache = ApiCache(api, ext, stop)
    cache.events = sink = EventSink(api, stop)
    threading.Thread(target=sink.run, daemon=True).start()
    cache._node("ADDED", k8s_node("a", gpus=2))
    return api, stop, ext, cache


def test_a_bound_pod_keeps_its_gpus_and_gets_one_warning_event_and_a_metric():
    api, stop, ext, cache = watching()
    pod = k8s_pod("bound", milli=500, node="a", phase="Running", ann={GANG_SIZE_ANNOTATION: "3", "tessera.dev/gang-nmae": "j"},
                  assignment={"node": "a", "gpus": [0], "milli": 500})
    pod["metadata"]["resourceVersion"] = "7"
    for _ in range(3):  # relists meet the same state: one Event, one count
        cache._pod("ADDED", pod)
    assert "ml/bound" in ext.cluster.assignments  # it still holds its GPU share
    wait_for(lambda: len(api.events) == 1, what="one Warning Event")
    body = api.events[0][1]
    assert body["reason"] == ANNOTATION_REASON and body["type"] == "Warning"
    assert "gang-nmae" in body["message"] and "without tessera.dev/gang-name" in body["message"]
    pending = k8s_pod("pending", milli=500, ann={GANG_SIZE_ANNOTATION: "2"})
    cache._pod("ADDED", pending)
    stop.set()
    assert ext.watch_health.annotation_totals() == {"unknown-key": 1, "half-gang": 2}
    metrics = both(create_app(ext, binder=None)).test_client().get("/metrics").data.decode()
    assert 'tessera_pod_annotation_problems_total{category="half-gang"} 2.0' in metrics
    assert 'tessera_pod_annotation_problems_total{category="zero-gpu-milli"} 0.0' in metrics


@pytest.mark.parametrize("where, key, value, words", [
    ("labels", "tessera.dev/gang-name", "g", "tessera.dev/gang-name is a label on this pod; Tessera reads it only as an"),
    ("labels", "tessera.dev/expected-runtime", "1h", "is a label on this pod"),
    ("annotations", "Tessera.dev/gang-name", "g", "write the prefix as tessera.dev/"),
    ("labels", "TESSERA.DEV/movable", "true", "write the prefix as tessera.dev/"),
])
def test_tessera_keys_where_tessera_does_not_read_them_are_refused_in_words(where, key, value, words):
    pod = k8s_pod("p", milli=500)
    pod["metadata"].setdefault(where, {})[key] = value
    assert words in refused(pod)


@pytest.mark.parametrize("resource", ["tessera.dev/gpu-mili", "tessera.dev/gpu", "Tessera.dev/gpu-milli"])
def test_a_misspelt_tessera_resource_is_refused_not_read_as_no_gpu(resource):
    pod = k8s_pod("p")
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "250"}}
    assert f"resource '{resource}' is not Tessera's; a slice is asked as tessera.dev/gpu-milli" in refused(pod)


def test_a_pending_pod_the_watch_cannot_read_is_told_it_is_refused_not_ignored():
    """'tessera ignored this state of the pod' read as 'the annotation was ignored and the pod goes on'; the pod is
    refused at filter until the user mends it, and the Event now says so."""
    from extender.kube.cache import REFUSED_REASON

    api, stop = FakeApi(), threading.Event()
    ext = Extender()
    cache = ApiCache(api, ext, stop)
    cache.events = sink = EventSink(api, stop)
    threading.Thread(target=sink.run, daemon=True).start()
    cache._node("ADDED", k8s_node("a", gpus=2))
    pod = k8s_pod("pending", milli=500, ann={"tessera.dev/gang_name": "j"})
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/1 nodes are available: 1 Insufficient cpu."}]  # Tessera never asked
    cache._pod("ADDED", pod)
    wait_for(lambda: len(api.events) == 1, what="one Warning Event")
    stop.set()
    body = api.events[0][1]
    assert body["reason"] == REFUSED_REASON and body["type"] == "Warning"
    assert body["message"].startswith("tessera will not place this pod until this is fixed: ")
    assert "did you mean tessera.dev/gang-name?" in body["message"]


@pytest.mark.parametrize("key, words", [
    ("tessera.dev/gpu-mili", "tessera.dev/gpu-milli is a resource"),  # was "did you mean tessera.dev/gpu-node?"
    ("tessera.dev/gpu_milli", "tessera.dev/gpu-milli is a resource"),
    ("tessera.dev/moveable", "did you mean tessera.dev/movable?"),
])
def test_a_misspelt_key_is_pointed_at_what_users_write(key, words):
    assert words in str(annotation_problems(k8s_pod("p", milli=500, ann={key: "x"}))[0])


# --- keys that miss the tessera.dev/ domain by a slip (issue 33, item 6) ----------------------------------------

@pytest.mark.parametrize("key, reads_as, without", [
    ("tesera.dev/gang-name", GANG_NAME_ANNOTATION, "placed alone, not as a gang"),  # rule 1: the domain one edit off
    ("tessra.dev/expected-runtime", "tessera.dev/expected-runtime", "declare no run time"),
    ("tessera-dev/gang-name", GANG_NAME_ANNOTATION, "placed alone"),
    ("tesesra.dev/movable", "tessera.dev/movable", "never be moved"),  # two neighbours swapped
    ("Tesera.dev/gang-name", GANG_NAME_ANNOTATION, "placed alone"),  # capitals too: the apiserver keeps them
    ("tessera.io/gang-size", GANG_SIZE_ANNOTATION, "placed alone"),  # rule 2: tessera.<other>/ and a user key
    ("tessera.ai/gang-nme", GANG_NAME_ANNOTATION, "placed alone"),
    ("tesera.com/runtime", "tessera.dev/runtime", "no Ray job"),
    ("tessera.dev.gang-name", GANG_NAME_ANNOTATION, "placed alone"),  # rule 3: no `/`
    ("tessera.devgang-size", GANG_SIZE_ANNOTATION, "placed alone"),
])
def test_a_key_that_misses_the_domain_is_refused_like_a_misspelt_key(key, reads_as, without):
    """Before: ignored without a word, and the pod ran with no gang (or no run time, no Ray job)."""
    pod = k8s_pod("p", milli=500, ann={key: "x"})
    [problem] = annotation_problems(pod)
    assert problem.category == "unknown-key"
    assert str(problem).startswith(f"unknown annotation {key} (did you mean {reads_as}?): its domain is not tessera.dev, "
                                   "so Tessera read it as another program's key and the pod would ")
    assert without in str(problem)
    assert refused(pod).startswith(f"tessera: unknown annotation {key} (did you mean {reads_as}?)")


def test_the_brief_example_reads_exactly():
    pod = k8s_pod("p", milli=500, ann={"tesera.dev/gang-name": "g", GANG_SIZE_ANNOTATION: "2"})
    assert str(annotation_problems(pod)[0]).startswith(
        "unknown annotation tesera.dev/gang-name (did you mean tessera.dev/gang-name?)")


def test_a_slipped_domain_with_an_unknown_name_is_still_refused_without_a_guess():
    [problem] = annotation_problems(k8s_pod("p", milli=500, ann={"tesera.dev/foo": "x"}))
    assert str(problem) == "unknown annotation tesera.dev/foo: its domain is not tessera.dev, so Tessera read it as " \
                           "another program's key"
    # compared by the name after the domain: the shared `tessera.dev/` made "junk-1" "did you mean tessera.dev/runtime?"
    assert [str(p) for p in annotation_problems(k8s_pod("p", milli=500, ann={"tessera.dev/junk-1": "x"}))] == [
        "unknown annotation tessera.dev/junk-1"]


OTHERS = ("nvidia.com/gpu.product", "kubectl.kubernetes.io/last-applied-configuration", "scheduling.x-k8s.io/pod-group",
          "volcano.sh/queue-name", "ray.io/node-type", "kueue.x-k8s.io/queue-name", "prometheus.io/scrape",
          "cluster-autoscaler.kubernetes.io/safe-to-evict", "sidecar.istio.io/inject", "tessera.example.com/x",
          "tessera.com/app", "tessa.dev/owner", "app.kubernetes.io/name", "helm.sh/chart", "gang-name", "runtime",
          "scheduling.k8s.io/group-name", "karpenter.sh/do-not-disrupt", "batch.kubernetes.io/job-name",
          "pod-template-hash", "controller-revision-hash", "kubernetes.io/psp", "seccomp.security.alpha.kubernetes.io/pod")


def test_other_programs_keys_and_labels_are_never_taken_for_tessera_keys():
    """Near means one edit from `tessera.dev`, or `tessera.<other>/` with a key users write: no vendor's key is."""
    pod = k8s_pod("p", milli=500, ann=dict.fromkeys(OTHERS, "x"))
    pod["metadata"]["labels"] = {**dict.fromkeys(OTHERS, "x"), "tesera.dev/gang-name": "g"}  # labels are not read
    assert annotation_problems(pod) == []
    assert refused(pod) == ""


def test_thousands_of_keys_are_looked_at_cheaply_and_reported_in_one_bounded_message():
    import time

    ann = {f"example{i}.com/key-{i}": "x" for i in range(20_000)}  # other programs' keys: never near
    ann.update({f"tesera.dev/k{i}": "x" for i in range(3_000)})
    pod = k8s_pod("p", milli=500, ann=ann)
    began = time.perf_counter()
    problems = annotation_problems(pod)
    took = time.perf_counter() - began
    assert len(problems) == 6 and str(problems[-1]) == \
        "and 2995 more unknown tessera.dev/ keys or keys that miss it by a slip"
    assert took < 1.0, f"{took:.2f} s for 23,000 keys (30 ms on the dev machine)"


def test_a_bound_pod_with_a_slipped_domain_gets_the_warning_event():
    api, stop, ext, cache = watching()
    pod = k8s_pod("bound", milli=500, node="a", phase="Running", ann={"tessera.io/gang-size": "3"},
                  assignment={"node": "a", "gpus": [0], "milli": 500})
    cache._pod("ADDED", pod)
    wait_for(lambda: len(api.events) == 1, what="one Warning Event")
    stop.set()
    body = api.events[0][1]
    assert body["reason"] == ANNOTATION_REASON and "unknown annotation tessera.io/gang-size (did you mean " \
        "tessera.dev/gang-size?)" in body["message"]
