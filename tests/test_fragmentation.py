"""The FGD measure on hand-computed cases (docs/fragmentation.md §3)."""

import pytest

from extender.core.fragmentation import FragmentationIndex, FragmentationMeasure
from extender.core.workload import TargetWorkload, TaskType

from .conftest import cluster, node, pod, workload

HALF = TaskType(cpu_milli=4000, gpu_milli=500, gpu_count=1)
WHOLE = TaskType(cpu_milli=8000, gpu_milli=1000, gpu_count=1)
PAIR = TaskType(cpu_milli=8000, gpu_milli=1000, gpu_count=2)
CPU_ONLY = TaskType(cpu_milli=16000, gpu_milli=0, gpu_count=0)
T4_ONLY = TaskType(cpu_milli=0, gpu_milli=1000, gpu_count=1, gpu_models=frozenset({"T4"}))


@pytest.mark.parametrize(
    "types, cpu_free, gpu_free, model, expected",
    [
        # a half slice can use the 1000 GPU; only the 300 GPU is fragment for it; same for WHOLE
        (((HALF, 0.5), (WHOLE, 0.5)), 32000, [1000, 300], "A", 300),
        # nothing fits: all free GPU is fragment for both types
        (((HALF, 0.5), (WHOLE, 0.5)), 32000, [400, 300], "A", 700),
        # HALF fits (600 >= 500), nothing below 500 except 300 -> 300; WHOLE cannot run -> 900
        (((HALF, 0.5), (WHOLE, 0.5)), 32000, [600, 300], "A", 0.5 * 300 + 0.5 * 900),
        # lack of CPU makes everything fragment (q4_lack_cpu)
        (((HALF, 1.0),), 3999, [1000, 1000], "A", 2000),
        # CPU-only tasks see all free GPU as fragment
        (((CPU_ONLY, 1.0),), 32000, [1000, 250], "A", 1250),
        # a two-GPU task counts only fully free GPUs; partial ones are fragment
        (((PAIR, 1.0),), 32000, [1000, 1000, 500], "A", 500),
        (((PAIR, 1.0),), 32000, [1000, 999, 500], "A", 2499),
        # wrong model: no access
        (((T4_ONLY, 1.0),), 32000, [1000], "P100", 1000),
        (((T4_ONLY, 1.0),), 32000, [1000], "T4", 0),
        # a node with nothing free has no fragment
        (((HALF, 1.0),), 0, [0, 0], "A", 0),
    ],
)
def test_node_fragment_hand_computed(types, cpu_free, gpu_free, model, expected):
    m = FragmentationMeasure(TargetWorkload(types))
    assert m.node(cpu_free, gpu_free, model) == pytest.approx(expected)
    # the memo must not confuse equal states with different GPU order
    assert m.node(cpu_free, list(reversed(gpu_free)), model) == pytest.approx(expected)


def test_memo_separates_cpu_levels():
    m = FragmentationMeasure(TargetWorkload(((HALF, 0.5), (WHOLE, 0.5))))
    assert m.node(8000, [1000], "A") == 0
    assert m.node(7999, [1000], "A") == pytest.approx(500)  # WHOLE lacks CPU now
    assert m.node(3999, [1000], "A") == pytest.approx(1000)


def test_index_is_incremental_and_matches_a_full_recount():
    c = cluster(node("a", gpus=2), node("b", gpus=4), node("c", gpus=1))
    wl = workload((HALF, 0.5), (WHOLE, 0.3), (CPU_ONLY, 0.2))
    measure = FragmentationMeasure(wl)
    index = FragmentationIndex(c, measure)
    c.place(pod("p1", 1, 700, cpu=1000), "a", (0,))
    c.place(pod("p2", 2, cpu=20000), "b", (1, 2))
    c.place(pod("p3", 1, 200), "a", (1,))
    c.release("p2")
    fresh = sum(FragmentationMeasure(wl).of(n) for n in c.nodes)
    assert index.total == pytest.approx(fresh)
    # the CPU-only share of an idle cluster is fragment by definition
    assert index.amount_pct() > 0


def test_workload_keeps_the_common_types_until_95_percent():
    pods = [pod(f"w{i}", 1, 1000, cpu=8000) for i in range(60)]
    pods += [pod(f"s{i}", 1, 500, cpu=4000) for i in range(36)]
    pods += [pod(f"r{i}", 8, cpu=64000) for i in range(4)]  # 4% tail: dropped
    wl = TargetWorkload.from_pods(pods)
    weights = {t.gpu_milli if t.gpu_count == 1 else "8x": p for t, p in wl.types}
    assert set(weights) == {1000, 500}
    assert weights[1000] == pytest.approx(60 / 96) and weights[500] == pytest.approx(36 / 96)


def test_sliver_lower_bound():
    from extender.sim.bounds import arrived_prefix, sliver_lower_bound_milli

    # four 810 slices leave 4 x 190 of room, one 160 slice fills part of one: 600 unfilled if all are
    # placed; refusing 0.6 of an 810 slice (486 refused) leaves 600 - 0.6 x 190 = 486 unfilled
    pods = [pod(f"b{i}", 1, 810) for i in range(4)] + [pod("f", 1, 160), pod("w", 1, 1000)]
    assert sliver_lower_bound_milli(pods, 4400) == 486
    # capacity no pod asked for is unallocated whatever the placement
    assert sliver_lower_bound_milli(pods, 9000) == 9000 - 4400
    # rooms of 190 and 400 (a 600 slice); the 300 fits only the 400 room: 290 unfilled, or refuse the 600
    assert sliver_lower_bound_milli([pod("a", 1, 810), pod("b", 1, 600), pod("c", 1, 300)], 1710) == 174
    assert [p.name for p in arrived_prefix(pods, 2000, 100)] == ["b0", "b1"]


def test_the_sliver_bound_counts_a_refused_slice_once():
    """Four whole-GPU pods and ten 600-milli slices on ten GPUs: six slices placed, four refused.

    The earlier bound said 4000 (every room lost and nothing refused), more than this packing leaves.
    """
    from extender.sim.bounds import sliver_lower_bound_milli

    pods = [pod(f"w{i}") for i in range(4)] + [pod(f"s{i}", 1, 600) for i in range(10)]
    assert sliver_lower_bound_milli(pods, 10_000) == 2400 == best_packing_milli(pods, 10)


def best_packing_milli(pods, gpus: int) -> int:
    """The least unallocated milli of any placement of one-GPU `pods` on `gpus` GPUs, by search.

    GPUs are interchangeable, so a state is the sorted free milli of each GPU and the next pod's index.
    """
    from functools import cache

    sizes = [p.gpu_milli for p in pods]

    @cache
    def most_placed(i: int, free: tuple[int, ...]) -> int:
        if i == len(sizes):
            return 0
        best = most_placed(i + 1, free)  # refused
        for g in {free.index(room) for room in free}:  # one GPU of each free amount
            if free[g] >= sizes[i] and (sizes[i] < 1000 or free[g] == 1000):
                rest = tuple(sorted(free[:g] + (free[g] - sizes[i],) + free[g + 1:]))
                best = max(best, sizes[i] + most_placed(i + 1, rest))
        return best

    return gpus * 1000 - most_placed(0, (1000,) * gpus)


def test_no_packing_beats_the_sliver_bound():
    """The bound is a floor: on small random instances it never exceeds the best packing found by search."""
    import random

    from extender.sim.bounds import sliver_lower_bound_milli

    rng, above_zero = random.Random(42), 0
    for _ in range(300):
        gpus = rng.randint(1, 4)
        sizes = [1000, 810, 700, 600, 460, 300, 190, 150, 90]
        pods = [pod(f"p{i}", 1, rng.choice(sizes)) for i in range(rng.randint(2, 9))]
        bound = sliver_lower_bound_milli(pods, gpus * 1000)
        assert 0 <= bound <= best_packing_milli(pods, gpus), [p.gpu_milli for p in pods]
        above_zero += bound > 0
    assert above_zero > 100  # the bound says something on most instances, not only 0


def test_the_memo_stays_bounded_and_values_stay_exact():
    w = TargetWorkload(((TaskType(1000, 500, 1), 1.0),))
    bounded, free = FragmentationMeasure(w, memo_limit=3), FragmentationMeasure(w)
    states = [[r, 1000 - r] for r in range(0, 1000, 100)]
    for gpus in states + states:
        assert bounded.node(32_000, gpus, "T4") == free.node(32_000, gpus, "T4")
        assert len(bounded._memo) <= 3
