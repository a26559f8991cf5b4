"""Moves of elastic trainers in the server (extender/moves.py, kube/preemptor.py) against a real Extender.

The API is a recorder of the Preemptor's calls (the real control plane, Ray and the bridge are in
tests/e2e/test_moves_e2e.py). What is tested: only trainers whose owner opted in move, within their
job's budget; the waiting pod's room is held; the replacement is steered to the planned node; the
opt-in is refused in words where it cannot work; the move is tried before any preemption.
"""

from __future__ import annotations

import pytest

from extender.kube.preemptor import MOVED_REASON, MOVING_REASON, PREEMPTED_REASON
from extender.service import Extender
from extender.translate.objects import pod_info
from tessera_contract import AnnotationError, RequestError
from testing.kube_objects import k8s_pod
from tests.test_preemption import HIGH, cluster
from tests.test_preemptor import Api, make, run, waiting

JOB = {"tessera.dev/runtime": "ray", "tessera.dev/gang-name": "job", "tessera.dev/gang-size": "2",
       "tessera.dev/entrypoint": "raybridge.examples.resnet:build", "tessera.dev/movable": "true"}


def trainer(e: Extender, name: str, node: str, gpu: int, ann: dict | None = None, priority: int = 0) -> None:
    """A bound member of the elastic job `job` holding one whole GPU."""
    ann = JOB if ann is None else ann
    pod = k8s_pod(name, gpus=1, node=node, phase="Running", ann=ann,
                  assignment={"node": node, "gpus": [gpu], "milli": 1000, "uuids": [f"GPU-{node}{gpu}"]})
    pod["spec"]["priority"] = priority
    e.upsert_pod(pod_info(pod))


def filler(e: Extender, name: str, node: str, gpus: tuple[int, ...]) -> None:
    """A bound pod that is not movable, holding whole GPUs."""
    pod = k8s_pod(name, gpus=len(gpus), node=node, phase="Running",
                  assignment={"node": node, "gpus": list(gpus), "milli": 1000, "uuids": [f"GPU-{node}{g}" for g in gpus]})
    e.upsert_pod(pod_info(pod))


def layout(on: bool = True) -> Extender:
    """a: t0 alone (7 GPUs free); b: 5 GPUs of a filler and t1 (2 free); c: full. An 8-GPU pod fits nowhere,
    and moving t0 to b is the one plan."""
    e = cluster(a=8, b=8, c=8)
    e.moves.on = on
    trainer(e, "t0", "a", 0)
    filler(e, "keep-b", "b", (0, 1, 2, 3, 4))
    trainer(e, "t1", "b", 5)
    filler(e, "keep-c", "c", tuple(range(8)))
    return e


def big(priority: int = 0) -> dict:
    return waiting(gpus=8, priority=priority, name="big")


def test_the_one_trainer_in_the_way_moves_and_both_pods_are_told():
    e = layout()
    p, api, events = make(e, preempt=False)
    plan = run(p, e, big())
    assert plan is not None and plan.node == "a" and plan.moves == {"ml/t0": "b"}
    assert api.deleted == [("ml", "t0", "uid-t0")], "the trainer's pod is deleted by UID; nothing else"
    assert {(ev[2], ev[6]) for ev in events.offered} == {("big", MOVING_REASON), ("t0", MOVED_REASON)}
    assert "ml/t0 to b" in next(ev[5] for ev in events.offered if ev[2] == "big")
    assert e.moves.made == 1 and e.moves.listing() == [{"moved": "ml/t0", "destination": "b"}]


def test_with_moves_off_nothing_is_planned_or_deleted():
    e = layout(on=False)
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []


def test_a_pod_without_the_opt_in_is_never_moved():
    e = cluster(a=8, b=8)
    e.moves.on = True
    trainer(e, "t0", "a", 0, ann={k: v for k, v in JOB.items() if k != "tessera.dev/movable"})
    trainer(e, "t1", "b", 0, ann={**JOB, "tessera.dev/movable": "false"})
    filler(e, "keep-b", "b", (1, 2, 3, 4))
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []


def test_a_trainer_of_higher_priority_than_the_waiting_pod_is_not_moved():
    e = cluster(a=8, b=8)
    e.moves.on = True
    trainer(e, "t0", "a", 0, priority=HIGH)
    filler(e, "keep-b", "b", (0, 1, 2, 3, 4))
    trainer(e, "t1", "b", 5, priority=HIGH)
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []
    assert run(p, e, waiting(gpus=8, priority=HIGH, name="big-high")) is not None


def test_a_job_at_its_minimum_world_or_mid_move_is_not_moved():
    e = cluster(a=8, b=8)
    e.moves.on = True
    trainer(e, "t0", "a", 0, ann={**JOB, "tessera.dev/gang-size": "1"})  # world 1: a move would leave none
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None

    e = layout()
    e.upsert_pod(pod_info(k8s_pod("t2", gpus=1, ann=JOB)))  # a member pending: the job has not regrown yet
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []


def test_one_job_is_not_moved_again_within_the_interval():
    e = layout()
    info = pod_info(big())
    e.upsert_pod(info)
    e.filter(info, sorted(e.cluster.by_name))
    plan = e.plan_move(info)
    assert plan is not None and e.nominate(plan)
    e.drop_nomination(info.uid)  # the move lapsed (say its delete failed): nothing changed in the cluster
    assert e.plan_move(info) is None, "within --move-interval the job is not moved again"
    e.moves.min_interval_s = 0.0
    assert e.plan_move(info) is not None


def test_the_target_is_held_and_the_replacement_is_sent_to_its_planned_node():
    e = cluster(a=8, b=8, c=8)
    e.moves.on = True
    trainer(e, "t0", "a", 0)
    trainer(e, "t1", "b", 0)
    filler(e, "keep-b", "b", (1, 2, 3, 4, 5, 6))  # b: 1 GPU free
    filler(e, "keep-c", "c", (0, 1, 2, 3, 4, 5))  # c: 2 GPUs free
    p, api, _ = make(e, preempt=False)
    plan = run(p, e, big())
    assert plan is not None and plan.node == "a" and set(plan.moves) == {"ml/t0"}
    dest = plan.moves["ml/t0"]
    e.delete_pod("uid-t0")  # the move's delete went through
    # another one-GPU pod may not take the target's room...
    loose = pod_info(k8s_pod("loose", gpus=1))
    e.upsert_pod(loose)
    out = e.filter(loose, ["a", "b", "c"])
    assert "a" not in out.passed and "moves trainers off it" in out.failed["a"]
    # ...the replacement goes where the plan said, and only there
    r1 = pod_info(k8s_pod("t0-r1", gpus=1, ann={**JOB, "tessera.dev/replaces": "ml/t0"}))
    e.upsert_pod(r1)
    out = e.filter(r1, ["a", "b", "c"])
    assert out.passed == [dest] and "replacement goes to" in out.failed[({"b", "c"} - {dest}).pop()]
    # a pod naming another namespace's trainer is refused in words while pending, and never steered
    forged = k8s_pod("x", gpus=1, ann={"tessera.dev/replaces": "ml/t0"})
    forged["metadata"]["namespace"] = "other"
    with pytest.raises(RequestError, match="must name a pod of this namespace as other/NAME"):
        pod_info(forged)
    forged["spec"]["nodeName"] = "c"
    assert pod_info(forged).replaces == ""
    # once the replacement is bound the steering ends; the waiting pod takes the target
    trainer(e, "t0-r1", dest, 7 if dest == "b" else 6, ann={**JOB, "tessera.dev/replaces": "ml/t0"})
    assert e.moves.dests == {}
    assert e.filter(pod_info(big()), ["a", "b", "c"]).passed == ["a"]


def test_a_move_is_tried_before_preemption_and_preemption_when_no_move_helps():
    e = layout()
    filler(e, "low", "c", ())  # nothing: c stays full of keep-c
    p, api, events = make(e)  # preemption on too
    plan = run(p, e, big(priority=HIGH))
    assert plan.moves and api.deleted == [("ml", "t0", "uid-t0")]
    assert PREEMPTED_REASON not in {ev[6] for ev in events.offered}

    e = cluster(a=8)
    e.moves.on = True
    filler(e, "keep-a", "a", (0,))  # not movable, priority 0
    p, api, events = make(e)
    plan = run(p, e, big(priority=HIGH))
    assert plan is not None and not plan.moves and api.deleted == [("ml", "keep-a", "uid-keep-a")]


def test_a_disruption_budget_keeps_a_trainer_where_it_is():
    e = layout()
    budget = {"spec": {"selector": {"matchLabels": {"job": "j"}}}, "status": {"disruptionsAllowed": 0}}
    api = Api(labels={"ml/t0": {"job": "j"}}, budgets={"ml": [budget]})
    p, api, _ = make(e, api=api, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []


@pytest.mark.parametrize("ann, words", [
    ({"tessera.dev/movable": "yes"}, 'must be "true" or "false"'),
    ({"tessera.dev/movable": "true"}, "needs tessera.dev/runtime: ray"),
    ({"tessera.dev/movable": "true", "tessera.dev/runtime": "ray"}, "needs tessera.dev/runtime: ray"),
])
def test_an_opt_in_that_cannot_work_is_refused_in_words(ann, words):
    with pytest.raises((AnnotationError, RequestError), match=words):
        pod_info(k8s_pod("p", gpus=1, ann=ann))
    bound_pod = k8s_pod("q", gpus=1, node="a", phase="Running", ann=ann)
    assert pod_info(bound_pod).movable is False, "a running pod keeps running; it is just never moved"


def test_no_trainer_is_sent_to_a_node_reservations_restrict():
    """A reserved or drain-pool node could refuse the replacement (filter narrows by reservations before it
    steers), so such a node is never a destination: here the only one, so no plan."""
    e = layout()
    info = pod_info(big())
    e.upsert_pod(info)
    e.filter(info, sorted(e.cluster.by_name))
    assert e.plan_move(info).moves == {"ml/t0": "b"}
    e.queue_reservations.restricted_nodes = lambda: {"b"}
    assert e.plan_move(info) is None


def test_no_trainer_moves_for_a_pod_kube_scheduler_offered_no_node():
    """A pod whose nodeSelector (or affinity) no node meets is never offered to the extender; moving a trainer for it
    freed room it could never take, again at every --move-interval."""
    e = layout()
    info = pod_info(big())
    e.upsert_pod(info)
    assert e.plan_move(info) is None
    e.filter(info, [])  # offered nothing at all
    assert e.plan_move(info) is None
    e.filter(info, sorted(e.cluster.by_name))
    assert e.plan_move(info) is not None


@pytest.mark.parametrize("value", ["other/t0", "ml/", "ml/a/b", "t0"])
def test_a_pending_pod_replacing_no_pod_of_its_namespace_is_refused_in_words(value):
    """Before, such a value was dropped without a word, though every other tessera.dev/ value out of range is refused."""
    with pytest.raises(AnnotationError, match="must name a pod of this namespace as ml/NAME"):
        pod_info(k8s_pod("x", gpus=1, ann={"tessera.dev/replaces": value}))
    assert pod_info(k8s_pod("x", gpus=1, ann={"tessera.dev/replaces": "ml/t0"})).replaces == "ml/t0"
