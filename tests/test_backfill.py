"""Reservations with backfill (extender/core/backfill.py), alone and in time mode."""

import pytest

from extender.core.backfill import Backfill, BackfillSettings, Reservation
from extender.core.model import NodeSpec
from extender.sim.timemode import replay_time
from extender.sim.trace import TracePod

from .conftest import cluster, node, pod

TWO_GPU = BackfillSettings(wait_bound_s={2: 30.0}, grace_s=60.0, max_share=1.0)


def two_nodes(ends: dict[str, float | None], settings: BackfillSettings = TWO_GPU):
    """Nodes a and b, 2 GPUs each: a1 on a's GPU 0, b1 and b2 on b's two GPUs; `ends` their expected ends."""
    c = cluster(node("a"), node("b"))
    c.place(pod("a1"), "a", (0,))
    c.place(pod("b1"), "b", (0,))
    c.place(pod("b2"), "b", (1,))
    return c, Backfill(c, ends.get, settings)


def test_the_node_that_frees_soonest_is_reserved():
    c, bf = two_nodes({"a1": 100.0, "b1": 50.0, "b2": 300.0})
    r = bf.reserve(pod("big", gpus=2), waited_s=40.0, now=10.0)
    assert (r.node, r.start_s, r.expires_s) == ("a", 100.0, 160.0)  # a frees both GPUs at 100, b at 300
    assert bf.by_node == {"a": r} and bf.held_milli() == 2000


def test_a_pod_reserves_only_past_its_class_bound():
    c, bf = two_nodes({"a1": 100.0, "b1": 50.0, "b2": 300.0})
    assert bf.reserve(pod("big", gpus=2), waited_s=29.0, now=10.0) is None
    assert bf.reserve(pod("one"), waited_s=10**6, now=10.0) is None  # 1-GPU pods are not named: never
    assert len(bf) == 0


def test_an_unknown_end_counts_as_never():
    c, bf = two_nodes({"b1": 50.0, "b2": 300.0})  # a1's run time unknown: a may never free its GPU 0
    assert bf.reserve(pod("big", gpus=2), waited_s=40.0, now=10.0).node == "b"
    c, bf = two_nodes({})
    assert bf.reserve(pod("big", gpus=2), waited_s=40.0, now=10.0) is None


def test_backfill_lets_a_short_pod_run_beside_the_reservation_and_refuses_a_long_one():
    c, bf = two_nodes({"a1": 100.0, "b1": 50.0, "b2": 300.0})
    bf.reserve(pod("big", gpus=2), waited_s=40.0, now=10.0)
    a = c.by_name["a"]
    assert bf.admits(pod("short"), a, (1,), now=10.0, runtime_s=90.0)  # ends at 100, when big starts
    assert not bf.admits(pod("long"), a, (1,), now=10.0, runtime_s=91.0)
    assert not bf.admits(pod("unknown"), a, (1,), now=10.0, runtime_s=None)
    # a CPU-only pod fits beside big (32 cores, big asks 1), whatever its run time; one taking the cores does not
    assert bf.admits(pod("cpu", gpus=0), a, (), now=10.0, runtime_s=None)
    assert not bf.admits(pod("hog", gpus=0, cpu=31_500), a, (), now=10.0, runtime_s=None)
    assert bf.admits(pod("big", gpus=2), a, (0, 1), now=10.0, runtime_s=None)  # the holder itself
    assert bf.admits(pod("long"), c.by_name["b"], (0,), now=10.0, runtime_s=None)  # b is not reserved


def test_reservations_never_hold_more_than_their_share():
    specs = [node(n) for n in "abcd"]  # 8 GPUs: a share of 0.5 is two 2-GPU reservations
    c = cluster(*specs)
    bf = Backfill(c, {}.get, BackfillSettings(wait_bound_s={2: 0.0}, max_share=0.5))
    assert bf.reserve(pod("p", gpus=2), 0.0, 0.0) and bf.reserve(pod("q", gpus=2), 0.0, 0.0)
    assert bf.reserve(pod("r", gpus=2), 0.0, 0.0) is None and bf.held_milli() == 4000
    assert bf.placed("p").pod == "p"  # p was placed: its share is free again
    assert bf.reserve(pod("r", gpus=2), 0.0, 0.0) is not None


def test_a_reservation_expires_after_its_grace():
    c, bf = two_nodes({"a1": 100.0, "b1": 50.0, "b2": 300.0})
    r = bf.reserve(pod("big", gpus=2), waited_s=40.0, now=10.0)
    assert bf.expire(159.0) == []
    assert bf.expire(160.0) == [r] and len(bf) == 0
    assert bf.admits(pod("long"), c.by_name["a"], (1,), now=160.0, runtime_s=None)
    assert bf.due(pod("big", gpus=2), 150.0)  # still waiting: it may reserve afresh, on a new estimate


def test_settings_are_checked():
    with pytest.raises(ValueError):
        BackfillSettings(max_share=1.5)
    with pytest.raises(ValueError):
        BackfillSettings(grace_s=-1)


# one 2-GPU node; "big" asks both GPUs; 1-GPU pods arrive so that one GPU is always busy until 400
STARVING = [("s0", 0, 100, 1), ("big", 1, 10, 2), ("s1", 50, 100, 1), ("s2", 120, 100, 1), ("s3", 190, 100, 1),
            ("s4", 260, 100, 1), ("s5", 330, 70, 1), ("end", 500, 1, 0)]


def starving_replay(backfill: BackfillSettings | None):
    pods = [TracePod(pod(name, gpus, cpu=1), float(at), float(dur)) for name, at, dur, gpus in STARVING]
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=2, gpu_model="X")]
    return replay_time(nodes, pods, "fgd", "ideal", seed=0, node_count=1, backfill=backfill,
                       timeline=[(float(at), float(dur)) for _, at, dur, _ in STARVING])


def test_the_starving_pod_is_placed_earlier_with_a_reservation():
    # Without: each 1-GPU pod takes the GPU its predecessor freed (s1 at 50, s2 at 120 when s0 has left at 100,
    # ...), so both GPUs are free only when s5 leaves at 400: big waits 399 s.
    off = starving_replay(None)
    assert off.classes["2gpu"].max_s == pytest.approx(399.0) and off.reservations_made == 0
    # With a 30 s bound: big is retried by the 60 s flush at 90 (parked at 1), fails, and reserves n,
    # which frees at 150 (s0 leaves at 100, s1 at 150). s2 (arrives 120, would run to 220) is refused
    # there; big, backing off when s1 leaves, starts by 160 and s2 after it.
    on = starving_replay(TWO_GPU)
    assert on.reservations_made == 1 and on.reservations_expired == 0
    assert 149.0 <= on.classes["2gpu"].max_s <= 159.0
    assert on.classes["2gpu"].max_s < off.classes["2gpu"].max_s


POOL = BackfillSettings(wait_bound_s={2: 30.0}, grace_s=60.0, max_share=1.0, drain_pool=1, drain_pool_run_s=100.0)


def test_the_drain_pool_takes_only_short_runs_and_the_reserving_class():
    c = cluster(node("small", gpus=1), node("a"), node("b"))
    bf = Backfill(c, {}.get, POOL)
    assert bf.pool == {"a"}  # the first node that can hold a 2-GPU pod: "small" cannot
    a, b = c.by_name["a"], c.by_name["b"]
    assert bf.admits(pod("short"), a, (0,), now=0.0, runtime_s=100.0)
    assert not bf.admits(pod("long"), a, (0,), now=0.0, runtime_s=101.0)
    assert not bf.admits(pod("unknown"), a, (0,), now=0.0, runtime_s=None)  # an unknown run counts as long
    assert bf.admits(pod("big", gpus=2), a, (0, 1), now=0.0, runtime_s=None)  # the class the pool is kept for
    assert bf.admits(pod("long"), b, (0,), now=0.0, runtime_s=10**6)  # outside the pool: anyone
    assert bf.restricted("a", 0.0) and not bf.restricted("b", 0.0)


def test_no_drain_pool_by_default_and_bad_sizes_are_refused():
    assert Backfill(cluster(node("a")), {}.get, TWO_GPU).pool == frozenset()
    with pytest.raises(ValueError, match="drain pool"):
        BackfillSettings(drain_pool=-1)


def test_in_time_mode_a_drain_pool_node_starts_the_big_pod_within_the_pool_run():
    """Two 2-GPU nodes; three long 1-GPU pods arrive, then a 2-GPU pod. Without a pool the long pods
    take a GPU of each node and the 2-GPU pod waits for one to drain (~1000 s); with node a in the
    pool the long pods keep to b (the third waits) and the 2-GPU pod starts on a at once."""
    nodes = [NodeSpec("a", 64_000, 262_144, 2, "T4"), NodeSpec("b", 64_000, 262_144, 2, "T4")]
    timeline = [(0.0, 1000.0), (1.0, 1000.0), (2.0, 1000.0), (3.0, 10.0)]
    pods = [TracePod(pod(f"long{i}"), t, d) for i, (t, d) in enumerate(timeline[:3])] + [TracePod(pod("big", gpus=2), 3.0, 10.0)]
    runs = {pool: replay_time(nodes, pods, "tessera", "ideal", timeline=timeline, backfill=BackfillSettings(
        wait_bound_s={2: 0.0}, max_share=1.0, drain_pool=pool, drain_pool_run_s=100.0)) for pool in (0, 1)}
    assert runs[0].classes["2gpu"].max_s >= 990.0
    assert runs[1].classes["2gpu"].max_s == 0.0
    assert runs[1].classes["1gpu"].max_s >= 990.0  # the price: the third long pod waits for b


KEEP = BackfillSettings(wait_bound_s={2: 30.0}, grace_s=60.0, max_share=1.0, drain_keep=1, drain_pool_run_s=100.0)


def kinds():
    """s1, s2: 2 GPUs and 32 cores (any 2-GPU pod fits them); g: 2 GPUs and 64 cores, the only node for a pod
    asking more than 32 cores (openb's 120-core 8-GPU pods and its 128-core G3 nodes, in small)."""
    return cluster(node("s1"), node("s2"), node("g", cpu=64_000, mem=256_000))


def test_the_floating_pool_keeps_the_last_drainable_node_of_a_kind_for_the_pods_that_need_it():
    c = kinds()
    ends = {}
    bf = Backfill(c, ends.get, KEEP)
    assert bf.guarded(0.0).keys() == {"g"}  # the 64-core kind has one drainable node; the 32-core kind three
    g = c.by_name["g"]
    assert not bf.admits(pod("long"), g, (0,), now=0.0, runtime_s=10**6)
    assert not bf.admits(pod("unknown"), g, (0,), now=0.0, runtime_s=None)
    assert bf.admits(pod("short"), g, (0,), now=0.0, runtime_s=100.0)  # ends within the pool's bound
    assert not bf.admits(pod("wide", gpus=2), g, (0, 1), now=0.0, runtime_s=10**6)  # reserving, but fits s1, s2 too
    assert bf.admits(pod("tall", gpus=2, cpu=60_000), g, (0, 1), now=0.0, runtime_s=10**6)  # fits only g
    assert bf.admits(pod("long"), c.by_name["s1"], (0,), now=0.0, runtime_s=10**6)
    assert bf.restricted("g", 0.0) and not bf.restricted("s1", 0.0)
    assert not bf.drain_refuses(pod("long"), "s1", 0.0, None)


def test_the_floating_pool_guards_a_kind_only_when_few_of_its_nodes_drain():
    c = kinds()
    bf = Backfill(c, {"l1": 10**6, "l2": 10**6, "q": 50.0}.get, KEEP)

    def kinds_keeping(now: float) -> dict[str, int]:
        return {name: len(fits) for name, fits in bf.guarded(now).items()}

    c.place(pod("l1"), "s1", (0,))
    assert kinds_keeping(0.0) == {"g": 1}  # s2 and g still drain: the 32-core kind has two, so it keeps none
    c.place(pod("l2"), "s2", (0,))
    assert kinds_keeping(0.0) == {"g": 2}  # g is now the last node of both kinds that drains
    c.release("l2")
    c.place(pod("q"), "s2", (0,))  # ends at 50
    assert kinds_keeping(0.0) == {"g": 1}  # 50 is within the bound from 0: s2 drains again
    assert kinds_keeping(-100.0) == {"g": 2}  # but not from -100


def test_a_long_pod_of_the_reserving_class_reserves_around_the_floating_pool():
    c = kinds()
    bf = Backfill(c, {"b": 80.0}.get, KEEP)
    c.place(pod("b", gpus=2), "s1", (0, 1))  # s1 frees at 80, within the pool's 100 s bound
    c.place(pod("b2", gpus=2), "s2", (0, 1))  # no known end: s2 never frees
    assert bf.reserve(pod("wide", gpus=2), waited_s=40.0, now=0.0, runtime_s=10**6).node == "s1"  # g is kept
    bf.placed("wide")
    assert bf.reserve(pod("brief", gpus=2), waited_s=40.0, now=0.0, runtime_s=60.0).node == "g"


def test_a_pod_of_the_reserving_class_whose_own_nodes_stay_busy_past_the_bound_may_use_a_larger_kinds_kept_node():
    """Kinds nest: g fits every pod s1 and s2 fit. When neither takes `wide` now or within the pool's bound, g stays
    open to it: the pool keeps nodes for the pods that need them, not against pods that have nowhere else to go
    (openb seed 44, load 1.0: 64-core 8-GPU pods waited up to 5.4 h while 88-core ones took the kept nodes)."""
    c = kinds()
    ends = {"b": 500.0}
    bf = Backfill(c, ends.get, KEEP)
    c.place(pod("b", gpus=2), "s1", (0, 1))  # s1 frees at 500: past the bound
    c.place(pod("b2", gpus=2), "s2", (0, 1))  # never
    g = c.by_name["g"]
    assert bf.admits(pod("wide", gpus=2), g, (0, 1), now=0.0, runtime_s=10**6)
    assert not bf.admits(pod("long"), g, (0,), now=0.0, runtime_s=10**6)  # not of the reserving class: still kept
    assert bf.reserve(pod("wide", gpus=2), waited_s=40.0, now=0.0, runtime_s=10**6).node == "g"
    bf.placed("wide")
    assert not bf.admits(pod("wide", gpus=2), g, (0, 1), now=450.0, runtime_s=10**6)  # s1 now frees within 100 s
    c.release("b")
    assert not bf.admits(pod("wide", gpus=2), g, (0, 1), now=0.0, runtime_s=10**6)  # s1 takes it now


def test_a_fixed_and_a_floating_pool_exclude_each_other_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="exclude each other"):
        BackfillSettings(drain_pool=2, drain_keep=2)
    with pytest.raises(ValueError, match="must not be negative"):
        BackfillSettings(drain_keep=-1)
    assert Backfill(kinds(), {}.get, TWO_GPU).guarded(0.0) == {}


def test_in_time_mode_the_floating_pool_keeps_the_rare_big_node_for_the_pod_that_needs_it():
    """s (A10) and g (T4, twice the cores). A short A10 pod holds a GPU of s; a long 2-GPU pod that fits either
    node arrives, then one asking 60 cores, which fits only g. Without the floating pool the long pod takes g
    and the tall one waits for it (~1000 s); with it the long pod waits 9 s for s and the tall one starts at once."""
    nodes = [NodeSpec("s", 32_000, 128_000, 2, "A10"), NodeSpec("g", 64_000, 256_000, 2, "T4")]
    requests = [pod("blip", models=("A10",)), pod("wide", gpus=2), pod("tall", gpus=2, cpu=60_000)]
    timeline = [(0.0, 10.0), (1.0, 1000.0), (2.0, 50.0)]
    pods = [TracePod(r, t, d) for r, (t, d) in zip(requests, timeline, strict=True)]
    runs = {keep: replay_time(nodes, pods, "tessera", "ideal", timeline=timeline, backfill=BackfillSettings(
        wait_bound_s={2: 0.0}, max_share=1.0, drain_keep=keep, drain_pool_run_s=100.0)) for keep in (0, 1)}
    assert runs[0].classes["2gpu"].max_s >= 990.0
    assert runs[1].classes["2gpu"].max_s <= 60.0  # wide waits for s, tall waits not at all
    assert runs[1].wait_mean_s < runs[0].wait_mean_s


def test_in_time_mode_a_node_the_floating_pool_lets_go_is_tried_again_without_a_departure():
    """g1 and g2, one kind, keep 1. Two 1-GPU pods fill one node until 1000; the other, the kind's last clean
    node, is kept from a long 1-GPU pod. From 700 the first node's pods end within the 300 s bound, the pool has
    two clean nodes and lets the second go, and the next retry (kube's periodic flush) must place the long pod
    there, not leave it waiting for the departures at 1000."""
    nodes = [NodeSpec(n, 64_000, 256_000, 2, "T4") for n in ("g1", "g2")]
    requests = [pod("hold1"), pod("hold2"), pod("late")]
    timeline = [(0.0, 1000.0), (0.5, 1000.0), (1.0, 10_000.0)]
    pods = [TracePod(r, t, d) for r, (t, d) in zip(requests, timeline, strict=True)]
    run = replay_time(nodes, pods, "tessera", "ideal", timeline=timeline, backfill=BackfillSettings(
        wait_bound_s={2: 0.0}, max_share=1.0, drain_keep=1, drain_pool_run_s=300.0))
    assert 699.0 <= run.classes["1gpu"].max_s <= 900.0


def test_a_node_busy_with_a_pod_that_needs_its_kind_stays_kept_and_so_does_a_reserved_one():
    """Once a 60-core pod (it fits only g) runs on g for long, g no longer drains, but it is still the kind's
    node: a long CPU-only pod must not settle beside it (that is how seed 43's only G3 node was lost for 8.8 h
    to a CPU-only pod while a 120-core 8-GPU pod waited). The same holds for a node reserved for such a pod."""
    c = kinds()
    bf = Backfill(c, {"tall": 10**6}.get, KEEP)
    c.place(pod("tall", gpus=2, cpu=60_000), "g", (0, 1))
    g = c.by_name["g"]
    assert "g" in bf.guarded(0.0)
    assert not bf.admits(pod("cpu", gpus=0, cpu=2_000), g, (), now=0.0, runtime_s=10**6)
    assert bf.admits(pod("cpu", gpus=0, cpu=2_000), g, (), now=0.0, runtime_s=60.0)
    c.release("tall")
    r = Reservation(pod("wide", gpus=2), "g", 0.0, 0.0, 600.0)  # made before the pool kept g
    bf.by_node["g"] = bf.by_pod["wide"] = r
    assert "g" in bf.guarded(1.0)  # reserved, still kept
    assert bf.admits(pod("wide", gpus=2), g, (0, 1), now=1.0, runtime_s=10**6)  # the holder keeps its hold
    assert not bf.admits(pod("cpu", gpus=0, cpu=2_000), g, (), now=1.0, runtime_s=10**6)


def test_in_time_mode_a_pod_with_nowhere_else_to_go_within_the_bound_takes_the_larger_kinds_kept_node():
    """s (32 cores) and g (64 cores), 2 GPUs each, keep 1, bound 100 s. A long 1-GPU pod is kept off g and takes s;
    a 2-GPU pod that fits both then finds s busy for 10,000 s. It starts on g at once instead of waiting for s."""
    nodes = [NodeSpec("s", 32_000, 128_000, 2, "T4"), NodeSpec("g", 64_000, 256_000, 2, "T4")]
    requests = [pod("hog"), pod("wide", gpus=2)]
    timeline = [(0.0, 10_000.0), (1.0, 1000.0)]
    pods = [TracePod(r, t, d) for r, (t, d) in zip(requests, timeline, strict=True)]
    run = replay_time(nodes, pods, "tessera", "ideal", timeline=timeline, backfill=BackfillSettings(
        wait_bound_s={2: 0.0}, max_share=1.0, drain_keep=1, drain_pool_run_s=100.0))
    assert run.classes["1gpu"].max_s == 0.0 and run.classes["2gpu"].max_s == 0.0
