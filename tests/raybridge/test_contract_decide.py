"""The bridge's pure parts, driven with plain API dicts: contract, decisions, recovery plans, placement."""

from __future__ import annotations

import json

import pytest

from raybridge.contract import (
    CONFIG_ANNOTATION,
    CREATED_BY_ANNOTATION,
    ENTRYPOINT_ANNOTATION,
    REPLACES_ANNOTATION,
    ContractError,
    Slice,
    member,
)
from raybridge.decide import controlling_owner, decide, group_jobs, replacement_pod
from raybridge.placement import node_resources, trainer_options
from raybridge.policy import Outcome, plan_recovery
from raybridge.workload import load_entrypoint, shard


def pod(name, node="", gpus=(0,), milli=500, size=2, gang="job", phase="Running", extra=None, deleting=False):
    ann = {"tessera.dev/runtime": "ray", "tessera.dev/gang-name": gang, "tessera.dev/gang-size": str(size),
           ENTRYPOINT_ANNOTATION: "raybridge.examples.resnet:build", CONFIG_ANNOTATION: '{"steps": 100}'}
    if node:
        ann["tessera.dev/gpu-assignment"] = json.dumps({"node": node, "gpus": list(gpus), "milli": milli,
                                                       "uuids": [f"GPU-{node}-{g}" for g in gpus]})
        ann["tessera.dev/visible-devices"] = ",".join(f"GPU-{node}-{g}" for g in gpus)
    ann.update(extra or {})
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": ann, "labels": {"app": "train"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {"containers": [{"name": "c", "image": "img", "resources": {"limits": {"tessera.dev/gpu-milli": str(milli)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_member_reads_the_contract():
    m = member(pod("a", node="n1", gpus=(1,), milli=250))
    assert m.key == "ml/a" and m.job.key == "ml/job" and m.job.size == 2
    assert m.slice == Slice("n1", (1,), 250, ("GPU-n1-1",)) and m.slice.num_gpus == 0.25
    assert m.job.config == {"steps": 100}


@pytest.mark.parametrize("change, words", [
    ({ENTRYPOINT_ANNOTATION: "nocolon"}, "package.module:function"),
    ({CONFIG_ANNOTATION: "{bad"}, "not JSON"),
    ({CONFIG_ANNOTATION: "[1]"}, "JSON object"),
    ({"tessera.dev/gang-size": "two"}, "whole number"),
    ({"tessera.dev/gang-name": ""}, "needs tessera.dev/gang-name"),
])
def test_bad_pods_get_an_error_in_words(change, words):
    with pytest.raises(ContractError, match=words):
        member(pod("a", extra=change))


def test_assignment_on_another_node_is_refused():
    p = pod("a", node="n1")
    p["spec"]["nodeName"] = "n2"
    with pytest.raises(ContractError, match="names node 'n1'"):
        member(p)


def test_a_job_starts_only_when_its_whole_gang_is_bound():
    jobs = group_jobs([pod("a", node="n1"), pod("b")])
    d = decide(jobs.members["ml/job"], running=None)
    assert not d.start and d.waiting == "1 of 2 pods bound with a Tessera assignment"
    jobs = group_jobs([pod("a", node="n1"), pod("b", node="n2", gpus=(0, 1), milli=1000)])
    d = decide(jobs.members["ml/job"], running=None)
    assert dict(d.start) == {"ml/a": Slice("n1", (0,), 500, ("GPU-n1-0",)),
                             "ml/b": Slice("n2", (0, 1), 1000, ("GPU-n2-0", "GPU-n2-1"))}


def test_a_lost_pod_is_replaced_once_and_its_replacement_joins():
    pods = [pod("a", node="n1"), pod("b", node="n2", phase="Failed")]
    members = group_jobs(pods).members["ml/job"]
    d = decide(members, running=frozenset({"ml/a", "ml/b"}))
    assert d.remove == ("ml/b",) and d.replace == ("ml/b",) and d.delete == () and d.add == ()
    # the trainer of "a" died in Ray (node lost) while its pod still says Running
    d = decide(members, running=frozenset({"ml/b"}), lost_in_ray=frozenset({"ml/a"}), replaced=frozenset({"ml/b"}))
    assert d.replace == ("ml/a",)
    new = replacement_pod(pods[1], taken={"ml/a", "ml/b"})
    assert new["metadata"]["name"] == "b-r1" and "nodeName" not in new["spec"]
    ann = new["metadata"]["annotations"]
    assert ann[REPLACES_ANNOTATION] == "ml/b" and ann[CREATED_BY_ANNOTATION] == "tessera-bridge"
    assert "tessera.dev/gpu-assignment" not in ann and ann["tessera.dev/gang-name"] == "job"
    bound = dict(new, spec=dict(new["spec"], nodeName="n3"), status={"phase": "Pending"})
    bound["metadata"]["annotations"]["tessera.dev/gpu-assignment"] = json.dumps({"node": "n3", "gpus": [0], "milli": 500})
    members = group_jobs(pods + [bound]).members["ml/job"]
    d = decide(members, running=frozenset({"ml/a"}))
    assert d.add == (("ml/b-r1", Slice("n3", (0,), 500, ())),) and d.replace == ()


def test_only_the_bridges_own_pods_are_deleted():
    mine = pod("b-r1", node="n3", phase="Failed", extra={REPLACES_ANNOTATION: "ml/b", CREATED_BY_ANNOTATION: "tessera-bridge"})
    theirs = pod("a", node="n1", deleting=True)
    d = decide(group_jobs([mine, theirs]).members["ml/job"], running=frozenset({"ml/a", "ml/b-r1"}))
    assert d.delete == ("ml/b-r1",) and set(d.replace) == {"ml/a", "ml/b-r1"}
    assert replacement_pod(mine, taken={"ml/b-r1"})["metadata"]["name"] == "b-r2"


def test_a_deleted_pod_is_replaced_but_a_job_being_deleted_is_not():
    members = group_jobs([pod("a", node="n1")]).members["ml/job"]
    d = decide(members, running=frozenset({"ml/a", "ml/b"}))  # b was deleted (evicted, preempted, by hand)
    assert d.remove == ("ml/b",) and d.replace == ("ml/b",)
    members = group_jobs([pod("a", node="n1", deleting=True), pod("b", node="n2", deleting=True)]).members["ml/job"]
    d = decide(members, running=frozenset({"ml/a", "ml/b"}))
    assert d.remove == ("ml/a", "ml/b") and d.replace == () and d.delete == ()


def test_a_restarted_bridge_skips_pods_that_were_replaced():
    old = pod("b", node="n2")  # its trainer died with its Ray node; the pod itself still says Running
    new = pod("b-r1", node="n3", extra={REPLACES_ANNOTATION: "ml/b", CREATED_BY_ANNOTATION: "tessera-bridge"})
    members = group_jobs([pod("a", node="n1"), old, new]).members["ml/job"]
    assert dict(decide(members, running=None).start).keys() == {"ml/a", "ml/b-r1"}
    assert decide(members, running=frozenset({"ml/a", "ml/b-r1"})).add == ()


def test_pods_that_disagree_do_not_start_a_job():
    jobs = group_jobs([pod("a", node="n1"), pod("b", node="n2", size=3)])
    assert "ml/job" not in jobs.members and "disagree" in jobs.errors[0]


def test_recovery_plan_takes_the_survivor_furthest_ahead():
    out = {"a": Outcome.BROKEN, "b": Outcome.DONE, "c": Outcome.DEAD}
    plan = plan_recovery(7, out, {"a": 6, "b": 7})
    assert plan.source == "b" and plan.lagging == ("a",) and plan.lost == ("c",) and plan.redone == 0
    plan = plan_recovery(7, {"a": Outcome.BROKEN, "b": Outcome.HUNG}, {"a": 6})
    assert plan.survivors == ("a",) and plan.lost == ("b",) and plan.redone == 1 and plan.resume_step == 6
    assert plan_recovery(7, {"a": Outcome.DEAD}, {}).survivors == ()


def test_placement_names_the_node_and_the_slice():
    assert node_resources("n1", 2) == {"tessera-node:n1": 1000.0, "tessera-gpu:n1:0": 1000.0, "tessera-gpu:n1:1": 1000.0}
    opts = trainer_options(Slice("n1", (1,), 250, ("GPU-x",)))
    assert opts["resources"] == {"tessera-node:n1": 1.0, "tessera-gpu:n1:1": 250.0}
    assert opts["num_gpus"] == 0.25 and opts["num_cpus"] == 0
    assert "num_gpus" not in trainer_options(Slice("n1"))


def test_shards_cover_the_global_batch_whatever_the_world():
    for world in range(1, 8):
        spans = [shard(30, r, world) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == 30
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_entrypoint_errors_are_words():
    with pytest.raises(ValueError, match="cannot import"):
        load_entrypoint("no_such_module_xyz:build")
    with pytest.raises(ValueError, match="has no function"):
        load_entrypoint("raybridge.workload:nope")


def test_a_pod_with_a_controlling_owner_is_left_to_its_owner():
    # a KubeRay worker pod: the RayCluster recreates it; a bridge replacement too would double it
    worker = pod("w", node="n1")
    worker["metadata"]["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "tessera-ray",
                                              "uid": "u", "controller": True}]
    assert controlling_owner(worker) == "RayCluster/tessera-ray"
    plain = pod("p", node="n1")
    plain["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "cm", "uid": "v"}]  # owned, not controlled
    assert controlling_owner(plain) == "" and controlling_owner(pod("q")) == ""


@pytest.mark.parametrize("status, taken", [
    ({"phase": "Pending"}, False),  # bound, and no kubelet wrote anything: its node is down, or not yet
    ({}, False),
    ({"phase": "Pending", "hostIP": "10.244.1.1"}, True),  # a kubelet took it (pulling its image, say)
    ({"phase": "Pending", "startTime": "2026-12-06T07:00:00Z"}, True),
    ({"phase": "Running"}, True),
    ({"phase": "Failed"}, True),
])
def test_a_member_says_whether_a_kubelet_took_its_pod(status, taken):
    p = pod("a", "n1")
    p["status"] = status
    assert member(p).claimed is taken
