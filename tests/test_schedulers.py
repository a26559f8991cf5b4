"""The two ways scores become a choice: the paper's fixed order, and kube-scheduler's sum."""

from extender.core.kube_scores import balanced_allocation, default_plugins_score, least_allocated
from extender.core.policy import NodeScore, Policy, PolicyContext, make_policy
from extender.core.workload import TargetWorkload, TaskType
from extender.sim.schedulers import IdealScheduler, KubeScheduler

from .conftest import cluster, node, pod

WL = TargetWorkload(((TaskType(1000, 1000, 1), 1.0),))


def chosen(scheduler, request):
    """The scheduler's choice for `request` as its policy accounts it (the replay's `placer.request_for`, done once)."""
    return scheduler.choose(scheduler.placer.request_for(request))


def test_least_and_balanced_allocation_as_kube_1_20_computes_them():
    n = cluster(node("n", cpu=10_000, mem=10_000)).nodes[0]
    p = pod("p", 1, cpu=2_000, mem=6_000)
    assert least_allocated(p, n) == (80 + 40) // 2
    assert balanced_allocation(p, n) == int((1 - abs(0.2 - 0.6)) * 100)
    # a pod with no requests counts as 100m CPU and 200 MiB
    assert least_allocated(pod("z", 0, cpu=0, mem=0), n) == (99 + 98) // 2
    # over-committed CPU scores 0 for that resource, and BalancedAllocation gives 0
    assert default_plugins_score(pod("over", 0, cpu=20_000, mem=1_000), n) == (0 + 90) // 2 + 0


class Flat(Policy):
    """Every node scores the same: only the scheduler's tie rule decides."""

    name = "flat-test"

    def score(self, p, n):
        return NodeScore(5, (0,))

    def extender_scores(self, scores):
        return [5] * len(scores)


def test_ideal_breaks_ties_by_its_seeded_order_and_kube_at_random():
    c = cluster(*(node(f"n{i}") for i in range(10)))
    ideal = IdealScheduler(c, Flat(PolicyContext(WL)), seed=1)
    first = ideal.order[0].name
    assert {chosen(ideal, pod(f"p{i}", 1)).node.name for i in range(5)} == {first}
    kube = KubeScheduler(c, Flat(PolicyContext(WL)), seed=1)
    assert len({chosen(kube, pod(f"p{i}", 1)).node.name for i in range(30)}) > 3


def test_kube_extender_score_outweighs_plugins_by_weight():
    # fgd would put the slice on the half-used node; LeastAllocated prefers the idle one
    c = cluster(node("idle", cpu=64_000), node("used", cpu=16_000))
    c.place(pod("x", 1, 500, cpu=8_000), "used", (0,))
    mix = TargetWorkload(((TaskType(1000, 500, 1), 0.5), (TaskType(1000, 1000, 1), 0.5)))
    fgd = make_policy("fgd", PolicyContext(mix))  # used: Δ=-250 -> 5; idle: Δ=+250 -> 4
    assert chosen(KubeScheduler(c, fgd, seed=0, weight=10), pod("s", 1, 500)).node.name == "used"
    k8s = make_policy("k8s-default", PolicyContext(WL))
    assert chosen(KubeScheduler(c, k8s, seed=0), pod("s", 1, 1000)).node.name == "idle"


def test_kube_skips_scoring_when_one_node_is_feasible():
    c = cluster(node("a", gpus=1), node("b", gpus=2))
    k = KubeScheduler(c, make_policy("fgd", PolicyContext(WL)), seed=0)
    assert chosen(k, pod("two", 2)).node.name == "b"
    assert chosen(k, pod("three", 3)) is None
    assert k.reasons(pod("three", 3)) == {"node has 1 GPUs, pod needs 3": 1, "node has 2 GPUs, pod needs 3": 1}


class PreferUsed(Policy):
    """Extender scores: 10 for the node named 'used', 0 elsewhere."""

    name = "prefer-used-test"

    def score(self, p, n):
        return NodeScore(1 if n.name == "used" else 0, ())

    def extender_scores(self, scores):
        return [10 * int(s.value) for s in scores]


def test_cpu_only_pods_skip_the_extender_when_it_manages_gpu_resources_only():
    c = cluster(node("idle", cpu=64_000), node("used", cpu=16_000))
    c.place(pod("x", 0, cpu=8_000), "used", ())
    cpu_pod = pod("c", 0, cpu=1_000)
    via_all = chosen(KubeScheduler(c, PreferUsed(PolicyContext(WL)), seed=0, extender_sees="all"), cpu_pod)
    via_gpu = chosen(KubeScheduler(c, PreferUsed(PolicyContext(WL)), seed=0, extender_sees="gpu"), cpu_pod)
    assert via_all.node.name == "used"  # the extender decides
    assert via_gpu.node.name == "idle"  # kube's LeastAllocated decides
    gpu_pod = pod("g", 1, 500)
    assert chosen(KubeScheduler(c, PreferUsed(PolicyContext(WL)), seed=0, extender_sees="gpu"), gpu_pod).node.name == "used"
