"""WorkloadLearning's own rules: when the extender rebuilds its policy for the mix it has watched."""

from collections import Counter

from extender.core.model import PodRequest
from extender.core.workload import TaskType, Workload
from extender.learning import WorkloadLearning, close_enough, noise_tolerance, relearn_due

SLICE = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=500)
WHOLE = PodRequest("w", cpu_milli=1000, gpu_count=1, gpu_milli=1000)


def mix(**shares: int) -> Workload:
    kinds = {"slice": TaskType.of(SLICE), "whole": TaskType.of(WHOLE)}
    return Workload.from_counts(Counter({kinds[k]: n for k, n in shares.items()}), coverage=1.0)


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
