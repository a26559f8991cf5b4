"""Tessera's own preemption (kube/preemptor.py, nominations.py) against a real Extender.

kube-scheduler 1.20.2 never calls the preempt verb, so Tessera plans, nominates and deletes the
victims itself. The API here is a recorder of the calls the Preemptor makes (the real control
plane is tests/e2e/test_preemption_e2e.py); what is tested is the plan, the nomination that keeps
the room, the budgets and the bounds.
"""

from types import SimpleNamespace

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube.preemptor import (
    PLANS_PER_NAMESPACE,
    PREEMPTED_REASON,
    PREEMPTING_REASON,
    DisruptionBudgets,
    Preemptor,
    selector_matches,
)
from extender.service import BindError
from extender.translate.objects import pod_info
from testing.kube_objects import k8s_pod
from tests.test_preemption import HIGH, Events, bound, cluster, preemptor

UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


class Api:
    """Records deletes; answers pod reads from `labels` and budget lists from `budgets` (policy/v1 shape)."""

    def __init__(self, labels=None, budgets=None, fail_delete: int = 0):
        self.deleted: list[tuple[str, str, str]] = []
        self.labels = labels or {}
        self.budgets = budgets or {}
        self.fail_delete = fail_delete
        self.api_client = None

    def delete_namespaced_pod(self, name, namespace, body, _preload_content):
        if self.fail_delete:
            raise ApiException(status=self.fail_delete)
        self.deleted.append((namespace, name, body["preconditions"]["uid"]))

    def read_namespaced_pod(self, name, namespace, _preload_content):
        return SimpleNamespace(data=orjson.dumps({"metadata": {"labels": self.labels.get(f"{namespace}/{name}", {})}}))

    def list_namespaced_pod_disruption_budget(self, namespace, _preload_content, limit=None):
        """As the API pages a list: at most `limit` items, and a continue token when there are more."""
        items = self.budgets.get(namespace, [])
        self.budget_lists = getattr(self, "budget_lists", 0) + 1
        more = limit is not None and len(items) > limit
        return SimpleNamespace(data=orjson.dumps({"metadata": {"continue": "next" if more else ""},
                                                  "items": items[:limit] if more else items}))


def waiting(milli=None, gpus=None, priority=HIGH, name="hi"):
    pod = k8s_pod(name, milli=milli, gpus=gpus)
    pod["spec"]["priority"] = priority
    pod["status"]["conditions"] = UNSCHEDULABLE
    return pod


def make(e, api=None, **kw) -> tuple[Preemptor, Api, Events]:
    api = api or Api()
    events = Events()
    return Preemptor(e, api, DisruptionBudgets(api, api), events, may_act=lambda: True, **kw), api, events


def run(p: Preemptor, e, pod, offered=None) -> object:
    """The pod as kube-scheduler leaves it: watched, filtered over the nodes its own filters passed (`offered`, by
    default all), marked Unschedulable, then handed to the preemptor."""
    info = pod_info(pod)
    e.upsert_pod(info)
    e.filter(info, sorted(e.cluster.by_name) if offered is None else offered)
    return p.handle(info)


def test_the_one_victim_that_frees_a_gpu_is_deleted_by_uid_and_both_pods_are_told():
    e = cluster(a=2)
    bound(e, "keeper", "a", (0,), 500, priority=HIGH)
    bound(e, "low-0", "a", (0,), 500)  # beside the keeper: taking it frees nothing usable
    bound(e, "low-1", "a", (1,), 500)
    p, api, events = make(e)
    plan = run(p, e, waiting(milli=600))
    assert plan is not None and plan.node == "a"
    assert api.deleted == [("ml", "low-1", "uid-low-1")]
    reasons = {(ev[2], ev[6]) for ev in events.offered}
    assert reasons == {("hi", PREEMPTING_REASON), ("low-1", PREEMPTED_REASON)}


def test_the_node_needing_one_victim_wins_over_one_needing_victims_on_two_gpus():
    e = cluster(a=2, b=2)
    bound(e, "a-0", "a", (0,), 1000)
    bound(e, "a-1", "a", (1,), 1000)
    bound(e, "b-0", "b", (0,), 1000)  # b's GPU 1 is free
    p, api, _ = make(e)
    run(p, e, waiting(gpus=2))
    assert [d[1] for d in api.deleted] == ["b-0"]


def test_nothing_is_deleted_when_no_set_of_victims_helps():
    e = cluster(a=1)
    bound(e, "peer", "a", (0,), 500, priority=HIGH)  # equal priority: never a victim
    bound(e, "low", "a", (0,), 400)
    p, api, events = make(e)
    assert run(p, e, waiting(milli=600)) is None
    assert api.deleted == [] and events.offered == []
    assert run(p, e, waiting(milli=600, priority=0, name="lo")) is None  # nothing is lower than priority 0 here
    assert api.deleted == []


def test_the_room_stays_the_preemptors_until_it_binds():
    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    p, api, _ = make(e)
    pod = waiting(milli=600)
    assert run(p, e, pod) is not None
    e.delete_pod("uid-low")  # the watch sees the victim go
    other = pod_info(k8s_pod("other", milli=500))  # priority 0, arrived meanwhile
    e.upsert_pod(other)
    refused = e.filter(other, ["a"])
    assert refused.passed == [] and "being cleared for ml/hi" in refused.failed["a"]
    with pytest.raises(BindError, match="being cleared"):
        e.reserve(other.uid, other.key, "a")
    assert e.filter(pod_info(pod), ["a"]).passed == ["a"]
    e.reserve("uid-hi", "ml/hi", "a")
    assert "uid-hi" not in e.nominations.by_uid  # placed: the node is anyone's again
    assert e.filter(pod_info(k8s_pod("small", milli=400)), ["a"]).passed == ["a"]


def test_a_pod_that_fits_beside_the_preemptor_may_use_the_node():
    e = cluster(a=2)
    bound(e, "low", "a", (0,), 1000)
    bound(e, "other", "a", (1,), 1000, priority=HIGH)
    p, _, _ = make(e)
    assert run(p, e, waiting(milli=600)) is not None
    e.delete_pod("uid-low")
    beside = pod_info(k8s_pod("beside", milli=400))
    assert e.filter(beside, ["a"]).passed == ["a"]  # 600 + 400 share the freed GPU
    crowding = pod_info(k8s_pod("crowding", milli=500))
    assert e.filter(crowding, ["a"]).passed == []


def test_a_nomination_lapses_once_its_victims_are_gone_and_the_ttl_passes():
    now = [0.0]
    e = cluster(a=1)
    e.nominations.clock = lambda: now[0]
    bound(e, "low", "a", (0,), 600)
    p, _, _ = make(e, clock=lambda: now[0])
    assert run(p, e, waiting(milli=600)) is not None
    now[0] = 500.0  # the victim is still there (terminating): the nomination holds
    e.filter(pod_info(k8s_pod("x", milli=100)), ["a"])
    assert "uid-hi" in e.nominations.by_uid
    e.delete_pod("uid-low")
    now[0] += e.nominations.ttl_s + 1
    assert e.filter(pod_info(k8s_pod("y", milli=500)), ["a"]).passed == ["a"]
    assert e.nominations.by_uid == {}


def test_a_pod_is_planned_at_most_once_per_retry_interval_and_gangs_never():
    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    p, api, _ = make(e, api=Api(fail_delete=500))
    with pytest.raises(ApiException):
        run(p, e, waiting(milli=600))
    assert e.nominations.by_uid == {}  # the delete failed: the node is not held for nothing
    assert run(p, e, waiting(milli=600)) is None  # within RETRY_S: not planned again
    gang = waiting(milli=600, name="g")
    gang["metadata"]["annotations"] = {"tessera.dev/gang-name": "g", "tessera.dev/gang-size": "2"}
    p.offer(pod_info(gang), gang)
    assert "uid-g" not in p.waiting and "uid-hi" in p.waiting  # the gang member never waits; "hi" waits its RETRY_S


def test_a_follower_replica_never_deletes():
    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    api, events = Api(), Events()
    p = Preemptor(e, api, DisruptionBudgets(api, api), events, may_act=lambda: False)
    assert run(p, e, waiting(milli=600)) is None and api.deleted == []


def test_a_victim_its_budget_protects_is_spared_when_another_helps():
    e = cluster(a=1, b=1)
    bound(e, "guarded", "a", (0,), 1000)
    bound(e, "free", "b", (0,), 1000)
    budget = {"spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {"disruptionsAllowed": 0}}
    api = Api(labels={"ml/guarded": {"app": "db"}}, budgets={"ml": [budget]})
    p, _, _ = make(e, api=api)
    run(p, e, waiting(gpus=1))
    assert [d[1] for d in api.deleted] == ["free"]


def test_a_protected_victim_still_goes_when_nothing_else_helps_as_kube_scheduler_does():
    e = cluster(a=1)
    bound(e, "guarded", "a", (0,), 1000)
    budget = {"spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {"disruptionsAllowed": 0}}
    api = Api(labels={"ml/guarded": {"app": "db"}}, budgets={"ml": [budget]})
    p, _, _ = make(e, api=api)
    run(p, e, waiting(gpus=1))
    assert [d[1] for d in api.deleted] == ["guarded"]


def test_a_budget_allowing_one_disruption_protects_the_second_victim_only():
    api = Api(labels={"ml/x": {"app": "a"}, "ml/y": {"app": "a"}},
              budgets={"ml": [{"spec": {"selector": {"matchLabels": {"app": "a"}}}, "status": {"disruptionsAllowed": 1}}]})
    assert DisruptionBudgets(api, api).protected({"u1": "ml/x", "u2": "ml/y"}) == {"ml/y"}


@pytest.mark.parametrize(("selector", "labels", "v1", "matches"), [
    ({"matchLabels": {"app": "db"}}, {"app": "db"}, True, True),
    ({"matchLabels": {"app": "db"}}, {"app": "web"}, True, False),
    ({}, {"app": "web"}, True, True),  # policy/v1: empty selects every pod
    ({}, {"app": "web"}, False, False),  # policy/v1beta1 (1.20): empty selects none
    (None, {"app": "web"}, True, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}, {"tier": "gold"}, True, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}, {"tier": "gold"}, True, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, True, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True, True),
    ({"matchExpressions": [{"key": "tier", "operator": "Sometimes"}]}, {}, True, True),  # not understood: protects
    ({"matchLabels": "app=db"}, {}, True, True),
    ({"matchExpressions": [{"key": f"k{i}", "operator": "Exists"} for i in range(100)]}, {}, True, True),
    ("garbage", {}, True, True),
])
def test_selectors_read_bounded_and_err_towards_protecting(selector, labels, v1, matches):
    assert selector_matches(selector, labels, empty_matches_all=v1) is matches


def test_the_verb_vetoes_every_node_when_tessera_preempts_itself():
    e = cluster(a=2)
    bound(e, "low-0", "a", (0,), 500)
    bound(e, "low-1", "a", (1,), 500)
    e.verb_preempts = False
    assert e.preempt(preemptor(milli=600), {"a": []}) == {}


def test_no_second_set_when_kube_scheduler_already_preempted_on_its_nominated_node():
    """Whole GPUs are kube-scheduler's own resource: it preempts for them itself and nominates the node.
    While its victims terminate, Tessera plans nothing (kube-scheduler's own rule), and never picks a
    terminating pod as a victim."""
    e = cluster(a=1, b=1)
    bound(e, "leaving", "a", (0,), 1000)
    bound(e, "staying", "b", (0,), 1000)
    leaving = e.pods["uid-leaving"]
    e.upsert_pod(leaving.__class__(**{**{f: getattr(leaving, f) for f in leaving.__dataclass_fields__}, "terminating": True}))
    p, api, _ = make(e)
    nominated = waiting(gpus=1)
    nominated["status"]["nominatedNodeName"] = "a"
    assert run(p, e, nominated) is None and api.deleted == []
    p2, api2, _ = make(e)
    run(p2, e, waiting(gpus=1, name="other"))  # not nominated: b's pod is the only victim to take
    assert [d[1] for d in api2.deleted] == ["staying"]



def test_inspect_and_metrics_show_the_nomination():
    from prometheus_client import CollectorRegistry, generate_latest

    from extender.http.inspect import cluster_map, pod_reasons
    from extender.http.metrics import ClusterCollector

    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    p, _, _ = make(e)
    run(p, e, waiting(milli=600))
    assert cluster_map(e)["nominations"] == [{"pod": "ml/hi", "priority": HIGH, "node": "a", "victims_left": ["ml/low"]}]
    assert pod_reasons(e, "ml/hi")["why"].startswith("preempting on a; the room is held for it while ml/low terminates")
    registry = CollectorRegistry()
    registry.register(ClusterCollector(e))
    assert b"tessera_preemption_nominations 1.0" in generate_latest(registry)


def test_preemption_never_clears_a_node_a_reservation_keeps_closed_to_the_pod():
    """Node a is reserved for a waiting 2-GPU pod; a priority-1000 1-GPU pod that declares no run time may not use
    it however much room is made, so its victim is taken on b, never on a (a would win the tie by name)."""
    from extender.core.backfill import BackfillSettings, Reservation
    from extender.service import Extender

    e = cluster(Extender(backfill=BackfillSettings(max_share=1.0)), a=1, b=1)
    bound(e, "a-low", "a", (0,), 1000)
    bound(e, "b-low", "b", (0,), 1000)
    big = pod_info(k8s_pod("big", gpus=1))
    e.upsert_pod(big)
    held = Reservation(e.placer.request_for(big.request), "a", 0.0, 10.0, 10.0**12)
    e.queue_reservations.backfill.by_node["a"] = e.queue_reservations.backfill.by_pod["ml/big"] = held
    p, api, _ = make(e)
    plan = run(p, e, waiting(gpus=1))
    assert plan is not None and plan.node == "b" and [d[1] for d in api.deleted] == ["b-low"]


def test_a_pod_that_could_displace_nobody_spends_no_plan():
    """60 never-fitting priority-0 pods re-offered each minute took every plan of the minute, and the priority-1000
    pod behind them waited unplanned; priority 0 displaces nobody here, so they now spend nothing."""
    e = cluster(a=1)
    bound(e, "low", "a", (0,), 600)
    p, api, _ = make(e, per_minute=5)
    for i in range(20):
        junk = waiting(milli=1, priority=0, name=f"junk-{i}")
        junk["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "no-such-gpu"}
        assert run(p, e, junk) is None
    assert p.plans.spent == [] and p.dropped == 0
    assert run(p, e, waiting(milli=600)).node == "a" and api.deleted == [("ml", "low", "uid-low")]


def test_one_namespace_gets_at_most_its_share_of_the_plans():
    e = cluster(**{f"n{i:02d}": 1 for i in range(31)})
    for i in range(31):
        bound(e, f"low-{i}", f"n{i:02d}", (0,), 600)
    p, api, _ = make(e)
    for i in range(30):  # high priority, each one a plan could place (kube/retries.py: the rest wait, none is dropped)
        pod = waiting(milli=600, name=f"greedy-{i}")
        pod["metadata"]["namespace"] = "greedy"
        run(p, e, pod)
    assert len(p.plans.spent) == PLANS_PER_NAMESPACE and len(p.waiting) == 30 - PLANS_PER_NAMESPACE and p.dropped == 0
    assert run(p, e, waiting(milli=600)) is not None, "another namespace's pod is still planned this minute"


def two_held_nodes(milli: int) -> tuple:
    """Nodes a and b of one GPU each, each holding a priority-0 pod of `milli` (low-a, low-b): (extender, preemptor, api)."""
    e = cluster(a=1, b=1)
    bound(e, "low-a", "a", (0,), milli)
    bound(e, "low-b", "b", (0,), milli)
    p, api, _ = make(e)
    return e, p, api


def test_preemption_stays_on_the_nodes_kube_scheduler_offered():
    """kube-scheduler asks the extender only about nodes its own filters (node selector, affinity, ports) passed.
    A pod whose nodeSelector matched no node was never asked about, yet Tessera evicted for it, round after round."""
    e, p, api = two_held_nodes(600)
    never_offered = waiting(milli=600, name="nowhere")
    info = pod_info(never_offered)
    e.upsert_pod(info)
    assert p.handle(info) is None and api.deleted == []
    plan = run(p, e, waiting(milli=600, name="only-b"), offered=["b"])  # say its nodeSelector names b
    assert plan.node == "b" and api.deleted == [("ml", "low-b", "uid-low-b")]


def test_offers_survive_as_bits_and_are_forgotten_not_misread_when_node_names_churn():
    """Offers are kept as one bit per node (1000 pods each offered 4999 of 5000 nodes held 513 MB as name sets). When
    nodes came and went past 4 names per node, every bit is renumbered: an offer noted before must not then name
    another node; it is forgotten and noted again at the pod's next filter."""
    from extender.translate.objects import node_inventory

    e, p, api = two_held_nodes(600)
    pod = waiting(milli=600, name="only-b")
    info = pod_info(pod)
    e.upsert_pod(info)
    e.filter(info, ["b"])
    for i in range(256):  # autoscaled nodes, each seen at one filter, then gone: 257 bits, past 4 x 64
        name = f"tmp-{i}"
        e.upsert_node(node_inventory({"metadata": {"name": name, "labels": {}},
                                      "status": {"allocatable": {"cpu": "1", "memory": "1Gi"}}}))
        e.filter(pod_info(waiting(milli=600, name=f"other-{i}")), [name])
        e.delete_node(name)
    e.filter(pod_info(waiting(milli=600, name="only-a")), ["a"])  # renumbers: a takes the bit b had
    assert p.handle(info) is None and api.deleted == [], "forgotten, not read against renumbered bits"
    p, api, _ = make(e)  # a fresh preemptor: this one has just tried the pod
    plan = run(p, e, pod, offered=["b"])
    assert plan.node == "b" and api.deleted == [("ml", "low-b", "uid-low-b")]


def test_a_namespace_with_more_budgets_than_tessera_reads_is_protected_whole_and_read_once_a_plan():
    """5,000 budgets of 64 terms made each plan list 50 MB per victim namespace and spend 15 s on the preemptor's one
    thread. The list is asked for MAX_BUDGETS + 1 (the API pages it); more than MAX_BUDGETS protects the namespace,
    as an unreadable selector does, and one plan's rounds read a namespace's budgets once."""
    from extender.kube.preemptor import MAX_BUDGETS

    e = cluster(a=1, b=1)
    bound(e, "low-a", "a", (0,), 600)
    other = bound(e, "low-b", "b", (0,), 600)
    flood = [{"spec": {"selector": {"matchLabels": {f"k{i}": "v"}}}, "status": {"disruptionsAllowed": 1}}
             for i in range(MAX_BUDGETS + 1)]
    api = Api(budgets={"ml": flood})
    p, api, _ = make(e, api=api)
    assert p.budgets.protected({"uid-low-a": "ml/low-a"}) == {"ml/low-a"}
    assert p.budgets.protected({"uid-low-a": "ml/low-a", other: "ml/low-b"}) == {"ml/low-a", "ml/low-b"}
    assert api.budget_lists == 1, "read once within BUDGETS_TTL_S"


@pytest.mark.parametrize("message, planned", [
    ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", True),  # kube's own fit refused first: room cures it
    ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match node selector.", True),
    ("0/2 nodes are available: 2 node(s) didn't match node selector.", False),  # no room would ever let it in
    ("0/2 nodes are available: 1 node(s) had taint {x: y}, that the pod didn't tolerate, 1 node(s) didn't match "
     "Pod's node affinity.", False),
    ("", False),
    # a reason Tessera cannot place on a node: the cordoned node could be the one it would evict on
    ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable.", False),
    ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't have free ports for the requested "
     "pod ports.", False),
    ("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had taint {x: y}, that the pod didn't "
     "tolerate.", True),
])
def test_a_pod_kube_scheduler_refused_itself_is_planned_only_for_a_shortage(message, planned):
    """A whole-GPU pod that kube's own resource fit refuses everywhere is never offered to the extender, yet moves and
    preemption are for it; a pod refused only by its own constraints is not."""
    e, p, api = two_held_nodes(1000)
    pod = waiting(gpus=1)
    pod["status"]["conditions"] = [{**UNSCHEDULABLE[0], "message": message}]
    info = pod_info(pod)
    e.upsert_pod(info)
    assert (p.handle(info) is not None) is planned and bool(api.deleted) is planned


def test_a_pod_kube_refused_for_both_a_shortage_and_its_selector_is_planned_only_where_its_selector_admits():
    """kube's message counts reasons, not nodes: with a shortage and a selector mismatch both named, every node was a
    candidate. The pod's nodeSelector and required node affinity, read against the nodes' labels, narrow it."""
    from extender.service import Extender
    from extender.translate.objects import node_inventory
    from testing.kube_objects import k8s_node

    e = Extender()
    for name, zone in (("a", "east"), ("b", "west")):
        node = k8s_node(name, gpus=1, inventory=[{"index": 0, "uuid": f"GPU-{name}0", "model": "T4", "memory_mib": 15360}])
        node["metadata"]["labels"]["zone"] = zone
        e.upsert_node(node_inventory(node))
    e.mark_synced()
    bound(e, "low-a", "a", (0,), 1000)
    bound(e, "low-b", "b", (0,), 1000)
    p, api, _ = make(e)
    pod = waiting(gpus=1)
    pod["spec"]["nodeSelector"] = {"zone": "west"}
    pod["status"]["conditions"] = [{**UNSCHEDULABLE[0], "message": "0/2 nodes are available: 1 Insufficient "
                                    "nvidia.com/gpu, 1 node(s) didn't match node selector."}]
    info = pod_info(pod)
    e.upsert_pod(info)
    plan = p.handle(info)
    assert plan.node == "b" and api.deleted == [("ml", "low-b", "uid-low-b")]


@pytest.mark.parametrize("constraint", [
    {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}},
    {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                    "labelSelector": {"matchLabels": {"app": "x"}}}]},
    {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
])
def test_a_pod_kube_refused_with_constraints_tessera_does_not_read_is_planned_nowhere(constraint):
    """kube-scheduler 1.20 stops at a node's first failing filter, and resource fit comes before volume binding,
    topology spread and inter-pod affinity: "Insufficient nvidia.com/gpu" everywhere does not say those admit a node."""
    e, p, api = two_held_nodes(1000)
    pod = waiting(gpus=1)
    pod["spec"].update(constraint)
    pod["status"]["conditions"] = [{**UNSCHEDULABLE[0], "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]
    info = pod_info(pod)
    e.upsert_pod(info)
    assert p.handle(info) is None and api.deleted == []


@pytest.mark.parametrize("terms, name, labels, admits", [
    ({"nodeSelector": {"zone": "west"}}, "n", {"zone": "west"}, True),
    ({"nodeSelector": {"zone": "west"}}, "n", {"zone": "east"}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["3"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}]}}}}, "n", {"gpu": "8"}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["3"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}]}}}}, "special", {}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"},
                              {"key": "tier", "operator": "NotIn", "values": ["low"]}]}]}}}}, "n", {"tier": "low"}, False),
])
def test_node_terms_read_as_kube_schedulers_node_affinity_reads_them(terms, name, labels, admits):
    from extender.translate.objects import node_terms

    assert node_terms(terms).admits(name, labels) is admits


def test_inspect_says_kube_schedulers_refusal_for_a_pod_tessera_would_place():
    """A pod without a GPU asking for a misspelt resource fit every node by Tessera's count, and /inspect said
    'kube-scheduler has not bound it yet' while kube had marked it unschedulable for that resource."""
    from extender.http.inspect import pod_reasons

    e = cluster(a=1)
    pod = k8s_pod("cpu", gpus=None, milli=None)
    pod["status"]["conditions"] = [{**UNSCHEDULABLE[0], "message": "0/1 nodes are available: 1 Insufficient example.com/foo."}]
    e.upsert_pod(pod_info(pod))
    why = pod_reasons(e, "ml/cpu")["why"]
    assert "kube-scheduler's last attempt said: 0/1 nodes are available: 1 Insufficient example.com/foo." in why
