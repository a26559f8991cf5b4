"""WorkloadLearning's own rules: when the extender rebuilds its policy for the mix it has watched."""

from collections import Counter

from extender.core.model import PodRequest
from extender.core.workload import TargetWorkload, TaskType
from extender.learning import WorkloadLearning, close_enough, noise_tolerance, relearn_due

SLICE = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=500)
WHOLE = PodRequest("w", cpu_milli=1000, gpu_count=1, gpu_milli=1000)


def mix(**shares: int) -> TargetWorkload:
    kinds = {"slice": TaskType.of(SLICE), "whole": TaskType.of(WHOLE)}
    return TargetWorkload.from_counts(Counter({kinds[k]: n for k, n in shares.items()}), coverage=1.0)


def test_relearning_doubles_until_5000_pods_then_goes_every_5000():
    learned_at = 0
    due = []
    for n in range(1, 20_001):
        if relearn_due(n, learned_at):
            due.append(n)
            learned_at = n
    assert due == [20, 40, 80, 160, 320, 640, 1280, 2560, 7560, 12560, 17560]


def test_the_noise_tolerance_is_three_standard_errors_with_a_two_point_floor():
    assert noise_tolerance(100) == 0.15  # 1.5 / sqrt(100)
    assert noise_tolerance(1_000_000) == 0.02


def test_close_enough_needs_the_same_task_types_within_the_tolerance():
    assert close_enough(mix(slice=50, whole=50), mix(slice=52, whole=48), 0.03)
    assert not close_enough(mix(slice=50, whole=50), mix(slice=60, whole=40), 0.03)
    assert not close_enough(mix(slice=50, whole=50), mix(slice=100), 1.0)  # a type appeared or vanished


def test_a_new_mix_builds_a_new_policy_and_the_same_mix_does_not():
    learning = WorkloadLearning("tessera", memo_limit=123)
    running = mix(whole=1)
    results = [learning.observe(SLICE, running) for _ in range(20)]
    assert results[:19] == [None] * 19 and learning.learned_at == 20
    policy = results[19]
    assert policy is not None and policy.ctx.options["memo_limit"] == 123
    assert dict(policy.ctx.workload.types) == {TaskType.of(SLICE): 1.0}
    again = [learning.observe(SLICE, policy.ctx.workload) for _ in range(20)]
    assert again == [None] * 20 and learning.learned_at == 40  # relearned at 40, found the same mix


def test_a_fixed_workload_counts_pods_but_never_relearns():
    learning = WorkloadLearning("tessera", memo_limit=10, fixed=mix(whole=1))
    assert all(learning.observe(SLICE, mix(whole=1)) is None for _ in range(100))
    assert sum(learning.learner.counts.values()) == 100 and learning.learned_at == 0


CPU_ONLY = PodRequest("c", cpu_milli=1000)


def test_one_namespace_churning_pods_cannot_take_over_the_mix():
    """5000 CPU-only pods from one tenant against 100 GPU pods of another: without the cap the 95% rule would keep
    the CPU-only type alone and every GPU placement would look the same to the measure."""
    learning = WorkloadLearning("tessera", memo_limit=10)
    for i in range(100):
        learning.observe(SLICE if i % 2 else WHOLE, mix(whole=1), "team")
    for _ in range(5000):
        learning.observe(CPU_ONLY, mix(whole=1), "churner")
    learned = dict(learning.learner.workload().types)
    assert learned[TaskType.of(CPU_ONLY)] == 0.5
    assert learned[TaskType.of(SLICE)] == learned[TaskType.of(WHOLE)] == 0.25


def test_a_single_namespace_counts_in_full():
    learning = WorkloadLearning("tessera", memo_limit=10)
    for i in range(100):
        learning.observe(CPU_ONLY if i < 90 else WHOLE, mix(whole=1), "only")
    learned = dict(learning.learner.workload().types)
    assert learned[TaskType.of(CPU_ONLY)] == 0.9 and learned[TaskType.of(WHOLE)] == 0.1


def test_distinct_task_types_are_bounded_in_the_mix_and_in_the_counters():
    """30,000 pods with distinct CPU requests made a 24,731-type mix and an 814 ms prioritize over 300 nodes."""
    from extender.core.workload import MAX_COUNTED, MAX_LEARNED_TYPES

    learning = WorkloadLearning("tessera", memo_limit=10)
    for _ in range(100):
        learning.observe(WHOLE, mix(whole=1), "team")
    for i in range(30_000):
        learning.observe(PodRequest(f"p{i}", cpu_milli=1 + i), mix(whole=1), "churner")
    pairs = sum(len(c) for c in learning.learner.by_namespace.values())
    assert pairs <= MAX_COUNTED and learning.learner.observed == 30_100
    learned = dict(learning.learner.workload().types)
    assert len(learned) <= MAX_LEARNED_TYPES
    assert learned[TaskType.of(WHOLE)] >= 0.5, "the common type survives the pruning, and the churner weighs half"
