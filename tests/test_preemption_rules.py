"""Issue 35, items 1 and 2: preemption and moves follow Kubernetes' rules in full, and no offer is lost.

1. A pod whose PriorityClass says `preemptionPolicy: Never` may jump the queue but never evict: kube-scheduler 1.20's
   DefaultPreemption skips it (PodEligibleToPreemptOthers). Before, Tessera's preemptor had a Never pod at priority 1000
   delete a priority-0 pod of another namespace, and the mover moved trainers for one. Only pods of the schedulerNames
   Tessera serves are acted for (before: any, default-scheduler's in second-scheduler mode too).
2. An offer the preemptor could not plan for at once (the minute's plans, the namespace's share, a full queue) was
   dropped, and kube-scheduler retrying the pod with the same message makes no watch event to offer it again. Now it
   waits in a bounded, fair set that a timer re-offers (kube/retries.py), and a pod that cannot fit even with every
   lower-priority pod gone spends no plan (the cheap check, `Extender.room_possible`).

Against a real Extender; the API is the recorder of tests/test_preemptor.py. The real control plane is
tests/e2e/test_preemption_rules_e2e.py.
"""

from __future__ import annotations

import random

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube.preemptor import (
    CHECKS_PER_NAMESPACE,
    PLANS_PER_NAMESPACE,
    RETRY_S,
    DisruptionBudgets,
    Preemptor,
)
from extender.kube.retries import RetrySet
from extender.kube.waiting import WaitingReasons
from extender.translate.objects import pod_info
from tessera_contract import RequestError
from testing.kube_objects import k8s_pod
from tests.test_moves import big, layout
from tests.test_preemption import HIGH, Events, bound, cluster, preemptor
from tests.test_preemptor import Api, make, run, waiting
from tests.test_service import Clock


def never(pod: dict) -> dict:
    pod["spec"]["preemptionPolicy"] = "Never"
    return pod


def named(pod: dict, scheduler: str) -> dict:
    pod["spec"]["schedulerName"] = scheduler
    return pod


def in_namespace(pod: dict, namespace: str) -> dict:
    pod["metadata"]["namespace"] = namespace
    return pod


def one_victim() -> object:
    """Node a: one GPU held 600 by a priority-0 pod of another namespace; a 600-milli priority-1000 pod needs it gone."""
    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    return e


# --- 1. the rules: preemptionPolicy Never, the schedulerNames served --------------------------------------------


@pytest.mark.parametrize("policy, preempts", [(None, True), ("PreemptLowerPriority", True), ("Never", False)])
def test_pod_info_reads_the_preemption_policy(policy, preempts):
    pod = k8s_pod("p", milli=100)
    if policy is not None:
        pod["spec"]["preemptionPolicy"] = policy
    assert pod_info(pod).preempts is preempts


@pytest.mark.parametrize("value", ["never", "PreemptAll", "", 1, ["Never"], {"Never": True}, "Never\n" * 200])
def test_any_other_preemption_policy_is_refused_in_words_on_a_pending_pod_and_preempts_nothing_once_bound(value):
    pod = k8s_pod("p", milli=100)
    pod["spec"]["preemptionPolicy"] = value
    with pytest.raises(RequestError, match="spec.preemptionPolicy must be PreemptLowerPriority or Never") as e:
        pod_info(pod)
    assert len(str(e.value)) < 200
    placed = k8s_pod("q", milli=100, node="a", phase="Running")
    placed["spec"]["preemptionPolicy"] = value
    assert pod_info(placed).preempts is False  # a bound pod holds what it holds; it preempts nothing any more


@pytest.mark.parametrize("value, read", [(None, "default-scheduler"), ("tessera-scheduler", "tessera-scheduler"),
                                         ("", ""), (7, ""), ("x" * 254, ""), (["default-scheduler"], "")])
def test_pod_info_reads_the_scheduler_name_bounded(value, read):
    pod = k8s_pod("p", milli=100)
    if value is not None:
        pod["spec"]["schedulerName"] = value
    assert pod_info(pod).scheduler_name == read


def test_the_preempt_verb_answers_no_victim_for_a_never_pod_and_the_victim_for_the_same_pod_without_it():
    e = one_victim()
    assert e.preempt(preemptor(pod=never(k8s_pod("hi", milli=600))), {"a": []}) == {}
    assert e.preempt(preemptor(milli=600), {"a": []}) == {"a": ["uid-low"]}


def test_tessera_evicts_nothing_for_a_never_pod_and_exactly_the_victim_once_it_may_preempt():
    """The issue's case: a Never pod at priority 1000 had a priority-0 pod of another namespace deleted."""
    e = one_victim()
    p, api, events = make(e)
    hi = never(in_namespace(waiting(milli=600), "team-b"))
    p.offer(pod_info(hi), hi)
    assert len(p.waiting) == 0, "a Never pod does not even wait for a plan"
    assert run(p, e, hi) is None and api.deleted == [] and events.offered == []
    assert p.plans.spent == [], "and it spends none of the minute's plans"
    hi["spec"]["preemptionPolicy"] = "PreemptLowerPriority"
    plan = run(p, e, hi)
    assert plan is not None and api.deleted == [("ml", "low", "uid-low")]


def test_the_mover_moves_nothing_for_a_never_pod():
    e = layout()
    p, api, _ = make(e, preempt=False)
    assert run(p, e, never(big())) is None and api.deleted == [] and e.moves.made == 0
    assert e.plan_move(pod_info(never(big()))) is None
    assert run(p, e, big()).moves == {"ml/t0": "b"}, "the same pod without Never has the trainer moved"


def test_the_pending_reason_offers_no_preemption_for_a_never_pod():
    e = cluster(a=2)
    bound(e, "low-0", "a", (0,), 500)
    bound(e, "low-1", "a", (1,), 500)
    pod = waiting(milli=600)
    said = WaitingReasons(e, Events()).judge(pod_info(pod), "1")
    assert "preempting 1 lower-priority pod" in said
    quiet = WaitingReasons(e, Events()).judge(pod_info(never(waiting(milli=600))), "1")
    assert "preempting" not in quiet and quiet.endswith("no GPU has 600 milli free"), quiet


@pytest.mark.parametrize("scheduler", ["my-own-scheduler", "tessera-scheduler", "", "default-scheduler\x1b[2J"])
def test_a_pod_of_a_scheduler_name_tessera_does_not_serve_gets_no_preemption_anywhere(scheduler):
    """A tenant picks its pod's schedulerName: naming one Tessera does not serve (a scheduler of its own, one that does
    not exist, Tessera's second-scheduler profile in a control-plane install) must evict and move nothing."""
    e = one_victim()
    p, api, _ = make(e)
    pod = named(waiting(milli=600), scheduler)
    info = pod_info(pod)
    assert e.displace_refusal(info).startswith("its schedulerName")
    assert e.preempt(info, {"a": []}) == {} and e.preemption_plan(info, ["a"]) == {}
    p.offer(info, pod)
    assert len(p.waiting) == 0
    assert run(p, e, pod) is None and api.deleted == []


def test_in_second_scheduler_mode_only_tessera_schedulers_pods_are_acted_for():
    """The issue: the preemptor acted for default-scheduler pods in second-scheduler mode, where the cluster's own
    scheduler places them."""
    e = one_victim()
    e.scheduler_names = frozenset({"tessera-scheduler"})
    p, api, _ = make(e)
    assert run(p, e, waiting(milli=600)) is None and api.deleted == []  # schedulerName unset: default-scheduler
    plan = run(p, e, named(waiting(milli=600, name="mine"), "tessera-scheduler"))
    assert plan is not None and api.deleted == [("ml", "low", "uid-low")]


def test_moves_follow_the_scheduler_names_too():
    e = layout()
    e.scheduler_names = frozenset({"tessera-scheduler"})
    p, api, _ = make(e, preempt=False)
    assert run(p, e, big()) is None and api.deleted == []
    assert run(p, e, named(big(), "tessera-scheduler")).moves == {"ml/t0": "b"}


# --- 2. no offer is lost: the waiting set, its timer, the cheap check ---------------------------------------------


def flood_layout(nodes: int) -> object:
    """`nodes` nodes of one GPU, each held 600 by a priority-0 pod (low-N): a 600-milli priority-1000 pod may take any."""
    e = cluster(**{f"n{i:03d}": 1 for i in range(nodes)})
    for i in range(nodes):
        bound(e, f"low-{i}", f"n{i:03d}", (0,), 600)
    return e


def clocked(e, api: Api | None = None, may_act=lambda: True, **kw) -> tuple[Preemptor, Api, Clock]:
    """A Preemptor on a clock the test moves (its timer is `step`, called by hand)."""
    clock, api = Clock(), api or Api()
    return Preemptor(e, api, DisruptionBudgets(api, api), Events(), may_act=may_act, clock=clock, **kw), api, clock


def offered(p: Preemptor, e, pod: dict) -> str:
    """The pod watched, filtered over every node, marked Unschedulable and offered as the watch offers it."""
    info = pod_info(pod)
    e.upsert_pod(info)
    e.filter(info, sorted(e.cluster.by_name))
    p.offer(info, pod)
    return info.uid


def test_a_rate_limited_pod_waits_and_the_timer_plans_for_it_without_another_watch_event():
    """The minute's plans spent: the pod is planned when the first of them is a minute old, with no update of its own
    (kube-scheduler retrying it with the same message writes nothing). Before, it was dropped for good."""
    e = flood_layout(4)
    p, api, clock = clocked(e, per_minute=2)
    for i in range(2):
        offered(p, e, waiting(milli=600, name=f"first-{i}"))
        p.step()
        clock.now += 1.0
    assert len(api.deleted) == 2
    offered(p, e, in_namespace(waiting(milli=600, name="late"), "team-b"))
    assert p.step() == 1 and len(api.deleted) == 2 and "uid-late" in p.waiting
    clock.now = 59.0
    assert p.step() == 0, "not due before the first plan is a minute old"
    clock.now = 60.0
    p.step()
    assert len(api.deleted) == 3 and "uid-late" not in p.waiting and p.dropped == 0


def test_a_namespaces_thirteenth_pod_of_the_minute_is_planned_once_its_share_frees():
    e = flood_layout(PLANS_PER_NAMESPACE + 2)
    p, api, clock = clocked(e)
    for i in range(PLANS_PER_NAMESPACE + 1):
        offered(p, e, waiting(milli=600, name=f"p-{i}"))
    p.step()
    assert len(api.deleted) == PLANS_PER_NAMESPACE and len(p.waiting) == 1
    other = offered(p, e, in_namespace(waiting(milli=600, name="other"), "team-b"))
    p.step()
    assert len(api.deleted) == PLANS_PER_NAMESPACE + 1 and other not in p.waiting, "another namespace is not held"
    clock.now = 60.0
    p.step()
    assert len(api.deleted) == PLANS_PER_NAMESPACE + 2 and len(p.waiting) == 0


def test_offers_past_a_thousand_all_wait_none_dropped():
    """The queue held 1,000 and dropped the rest; the set keeps every pod (each once, however often offered)."""
    e = one_victim()
    p, _, _ = clocked(e)
    for i in range(1500):
        pod = waiting(milli=600, name=f"w-{i}")
        p.offer(pod_info(pod), pod)
        p.offer(pod_info(pod), pod)
    assert len(p.waiting) == 1500 and p.dropped == 0


def test_a_full_set_lets_go_the_largest_namespaces_newest_never_a_small_tenants_pod():
    s = RetrySet(bound=10)
    for i in range(10):
        assert s.add(f"flood-{i}", "flood", 0.0)
    assert s.add("tenant-0", "tenant", 0.0), "a tenant with none waiting gets in"
    assert "flood-9" not in s and "tenant-0" in s and s.dropped == 1
    assert not s.add("flood-10", "flood", 0.0), "the largest namespace's own newcomer is let go"
    for i in range(1, 5):
        assert s.add(f"tenant-{i}", "tenant", 0.0)
    assert not s.add("tenant-5", "tenant", 0.0), "5 and 5: no namespace is crowded out below the other"
    assert len(s) == 10 and s.dropped == 7


def test_what_is_due_comes_back_round_robin_with_namespaces_that_had_fewer_plans_first():
    s = RetrySet()
    for i in range(3):
        s.add(f"a-{i}", "a", float(i))
        s.add(f"b-{i}", "b", float(i))
    s.add("c-0", "c", 2.0)
    s.add("later", "c", 10.0)
    plans = {"a": 5, "b": 1, "c": 0}
    assert [u for u, _ in s.take_due(5.0, plans.get)] == ["c-0", "b-0", "a-0", "b-1", "a-1", "b-2", "a-2"]
    assert s.take_due(5.0) == [] and len(s) == 1


def test_a_seventh_tenant_is_planned_before_six_flooding_namespaces_when_a_plan_frees():
    """Six namespaces' pods (each one a plan could help) spend the minute's plans, one every half second, and keep
    coming; a seventh tenant's priority-1000 pod waits, and the first plan that frees is its, not the flood's."""
    e = flood_layout(90)
    p, api, clock = clocked(e)
    for i in range(12):
        for n in range(6):
            offered(p, e, in_namespace(waiting(milli=600, name=f"f{n}-{i}"), f"flood-{n}"))
            p.step()
            clock.now += 0.5
    assert len(api.deleted) == 60 and len(p.waiting) == 12
    assert {p.checks.used(f"flood-{n}", clock.now) for n in range(6)} == {10}
    seventh = offered(p, e, in_namespace(waiting(milli=600, name="seventh"), "tenant-7"))
    p.step()
    assert seventh in p.waiting and len(api.deleted) == 60
    clock.now = 59.9
    p.step()
    assert len(api.deleted) == 60
    clock.now = 60.0  # the first plan of the minute frees, and only it
    p.step()
    assert len(api.deleted) == 61 and seventh not in p.waiting
    assert seventh in e.nominations.by_uid, "the freed plan went to the seventh tenant, not to a flooding namespace"


def test_pods_that_cannot_fit_even_with_every_lower_priority_pod_gone_spend_no_plan():
    """The issue's attack: five namespaces' pods outrank a bound pod but fit nowhere even were it gone (a 900-milli
    slice where a priority-1000 pod holds 400 or 500 of each GPU); they took the minute's 60 plans, and the seventh
    tenant's pod that one eviction would place was dropped. Now they spend no plan, only checks, at most 12 a minute per
    namespace (the rest wait), and the seventh tenant's pod is planned at once."""
    e = cluster(a=1, b=1)
    bound(e, "keeper", "a", (0,), 500, priority=HIGH)
    bound(e, "low-a", "a", (0,), 400)
    bound(e, "low-b", "b", (0,), 600)
    bound(e, "keeper-b", "b", (0,), 400, priority=HIGH)
    p, api, _ = clocked(e)
    for n in range(6):
        for i in range(20):
            pod = in_namespace(waiting(milli=900, name=f"j{n}-{i}"), f"flood-{n}")
            assert run(p, e, pod) is None
    assert p.plans.spent == [] and api.deleted == [] and p.skipped == 6 * CHECKS_PER_NAMESPACE
    assert len(p.waiting) == 6 * (20 - CHECKS_PER_NAMESPACE) and p.dropped == 0
    assert run(p, e, in_namespace(waiting(milli=600, name="seventh"), "tenant-7")).node == "b"
    assert api.deleted == [("ml", "low-b", "uid-low-b")]


def test_an_api_failure_is_retried_by_the_timer():
    e = one_victim()
    api = Api(fail_delete=500)
    p, _, clock = clocked(e, api=api)
    offered(p, e, waiting(milli=600))
    p.step()
    assert api.deleted == [] and "uid-hi" in p.waiting and e.nominations.by_uid == {}
    api.fail_delete = 0
    clock.now = RETRY_S
    p.step()
    assert api.deleted == [("ml", "low", "uid-low")]


def test_a_follower_keeps_its_offers_and_plans_for_them_once_it_binds():
    """A replica that does not hold the bind Lease acts for nobody; its offers used to be dropped, so a new leader
    planned for none of the pods already waiting."""
    e = one_victim()
    leader = [False]
    p, api, clock = clocked(e, may_act=lambda: leader[0])
    offered(p, e, waiting(milli=600))
    p.step()
    assert api.deleted == [] and "uid-hi" in p.waiting
    leader[0] = True
    clock.now = RETRY_S
    p.step()
    assert api.deleted == [("ml", "low", "uid-low")]


def test_a_pod_offered_again_within_the_retry_interval_waits_for_its_end_and_is_planned_then():
    """Planned once (its victim's delete failed), offered again 5 s later: one plan per pod per RETRY_S, so it waits
    the rest of RETRY_S and is planned then. Before, that second offer was ignored and nothing offered it again."""
    e = one_victim()
    api = Api(fail_delete=500)
    p, _, clock = clocked(e, api=api)
    hi = waiting(milli=600)
    with pytest.raises(ApiException):
        run(p, e, hi)
    api.fail_delete = 0
    clock.now = 5.0
    offered(p, e, hi)
    p.step()
    assert api.deleted == [] and "uid-hi" in p.waiting
    clock.now = RETRY_S - 0.1
    assert p.step() == 0
    clock.now = RETRY_S
    p.step()
    assert api.deleted == [("ml", "low", "uid-low")]


def test_a_pod_bound_or_deleted_while_it_waits_is_let_go():
    e = one_victim()
    p, api, clock = clocked(e, per_minute=1)
    offered(p, e, waiting(milli=600, name="first"))
    p.step()
    offered(p, e, waiting(milli=600, name="second"))
    p.step()
    assert "uid-second" in p.waiting
    e.delete_pod("uid-second")
    clock.now = 60.0
    assert p.step() == 0 and len(p.waiting) == 0


@pytest.mark.parametrize("seed", range(40))
def test_the_cheap_check_says_no_exactly_when_the_plan_finds_nothing(seed):
    """`room_possible` (one trial fit per node) is false only for pods no preemption plan helps, on random clusters:
    it never turns away a pod a plan would place."""
    rng = random.Random(seed)
    e = cluster(**{f"n{i}": rng.choice((1, 2)) for i in range(rng.randint(1, 5))})
    for i, node in enumerate(list(e.cluster.by_name)):
        for g in range(e.cluster.by_name[node].spec.gpu_count):
            free = 1000
            for j in range(rng.randint(0, 3)):
                milli = rng.choice((100, 200, 300, 500, 1000))
                if milli > free:
                    continue
                free -= milli
                bound(e, f"p{i}-{g}-{j}", node, (g,), milli, priority=rng.choice((0, 0, 500, 1000, 2000)))
    info = preemptor(milli=rng.choice((300, 500, 700, 1000)), priority=rng.choice((500, 1000)))
    e.upsert_pod(info)
    e.filter(info, sorted(e.cluster.by_name))
    assert e.room_possible(info) == (e.plan_preemption(info) is not None)


# --- tessera serve --scheduler-name ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, names", [
    ([], ("default-scheduler",)),  # manifests/scheduler: the cluster's kube-scheduler, one profile
    (["--scheduler-name", "tessera-scheduler"], ("tessera-scheduler",)),  # manifests/second-scheduler's extender
    (["--scheduler-name", "gpu", "--scheduler-name", "default-scheduler", "--scheduler-name", "gpu"],
     ("gpu", "default-scheduler")),
])
def test_the_scheduler_names_default_to_the_shipped_profile_of_the_install(argv, names):
    from extender.cli import build_parser
    from extender.cli.serve import served_scheduler_names

    assert served_scheduler_names(build_parser().parse_args(["serve", *argv])) == names


@pytest.mark.parametrize("name", ["Default-Scheduler", "default_scheduler", "-x", "x" * 254, "", "a\x1b[2Jb"])
def test_a_scheduler_name_no_pod_can_carry_is_refused_before_connecting(name, capsys):
    from extender.cli import main

    code = main(["serve", f"--scheduler-name={name}"])
    assert code == 2 and "is not a schedulerName a pod can have" in capsys.readouterr().err


def test_more_than_sixteen_scheduler_names_are_refused():
    from extender.serve import ServeOptions

    with pytest.raises(ValueError, match="at most 16 profiles"):
        ServeOptions("127.0.0.1", 8888, scheduler_names=tuple(f"s{i}" for i in range(17))).check()


def test_serve_gives_the_extender_the_names_it_serves():
    from extender.serve import ServeOptions, make_extender

    e = make_extender(ServeOptions("127.0.0.1", 8888, scheduler_names=("tessera-scheduler",)), None)
    assert e.scheduler_names == frozenset({"tessera-scheduler"})


def test_the_preemptors_thread_plans_for_an_offer_at_once_and_stops():
    """run: an offer wakes the thread (no wait for the 1-s tick), and `stop` ends it."""
    import threading
    import time

    e = one_victim()
    api = Api()
    p = Preemptor(e, api, DisruptionBudgets(api, api), Events(), may_act=lambda: True)
    stop = threading.Event()
    thread = threading.Thread(target=p.run, args=(stop,), daemon=True)
    thread.start()
    pod = waiting(milli=600)
    info = pod_info(pod)
    e.upsert_pod(info)
    e.filter(info, ["a"])
    start = time.monotonic()
    p.offer(info, pod)
    while not api.deleted and time.monotonic() - start < 5:
        time.sleep(0.01)
    stop.set()
    thread.join(3)
    assert api.deleted == [("ml", "low", "uid-low")] and not thread.is_alive()
