import pytest

from extender.core.model import NodeSpec
from extender.sim.packing import inflate, replay_packing

from .conftest import pod


def test_inflate_resamples_to_130_percent_and_is_seeded():
    pods = [pod(f"p{i}", 1, 500) for i in range(10)]  # 5000 milli of demand
    out = inflate(pods, capacity_milli=10_000, seed=7)
    assert sum(p.gpu_demand for p in out) == 13_000
    assert {p.name for p in pods} <= {p.name for p in out}  # every original pod arrives once
    assert len({p.name for p in out}) == len(out)  # copies get their own names
    assert [p.name for p in inflate(pods, 10_000, seed=7)] == [p.name for p in out]
    assert [p.name for p in inflate(pods, 10_000, seed=8)] != [p.name for p in out]


def test_inflate_drops_pods_above_the_target():
    pods = [pod(f"p{i}", 1) for i in range(20)]  # 200% of capacity
    out = inflate(pods, capacity_milli=10_000, seed=1)
    assert sum(p.gpu_demand for p in out) == 13_000


def test_unallocated_curve_on_a_hand_computed_replay():
    # one node of 10 whole GPUs; every pod takes one: pod k brings arrived to 10k %
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=10, gpu_model="X")]
    r = replay_packing(nodes, [pod("w", 1, 1000, cpu=1)], "fgd", "ideal", seed=3)
    assert r.pods == 13 and r.rejected == 3
    assert r.unallocated_pct["50"] == pytest.approx(50)
    assert r.unallocated_pct["90"] == pytest.approx(10)
    for x in ("100", "110", "130"):
        assert r.unallocated_pct[x] == pytest.approx(0)
    assert r.unserved_pct["100"] == pytest.approx(0)


def test_k8s_default_holds_whole_gpus_for_slices():
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=10, gpu_model="X")]
    r = replay_packing(nodes, [pod("s", 1, 500, cpu=1)], "k8s-default", "kube", seed=3)
    # 26 half-GPU pods arrive; 10 get a whole GPU each; at 50% arrived the cluster is full
    assert r.unallocated_pct["50"] == pytest.approx(0)
    assert r.unserved_pct["100"] == pytest.approx(50)
    fgd = replay_packing(nodes, [pod("s", 1, 500, cpu=1)], "fgd", "kube", seed=3)
    assert fgd.unallocated_pct["100"] == pytest.approx(0)


def test_every_point_is_reported_even_when_pods_jump_over_it():
    """One node of 10 GPUs, one GPU a pod: arrivals land on 50, 60, ... 130% only. The ±1 neighbours fill 51 or 59;
    55 had nothing (a nan column, and a key missing from the JSON); it now holds the state the pod at 50% left."""
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=10, gpu_model="X")]
    r = replay_packing(nodes, [pod("w", 1, 1000, cpu=1)], "fgd", "ideal", seed=3)
    assert sorted(map(int, r.unallocated_pct)) == list(range(50, 131))
    assert r.unallocated_pct["55"] == r.unallocated_pct["50"] == pytest.approx(50)
    assert r.unallocated_pct["105"] == pytest.approx(0) and set(r.frag_pct) == set(r.unallocated_pct)


def test_a_trace_without_gpu_demand_is_refused_not_resampled_for_ever():
    """The resampling stops when the drawn pod would pass the GPU target: with no GPU pod it never did."""
    with pytest.raises(ValueError, match="no pod of the trace asks for a GPU"):
        inflate([pod("c", 0)], capacity_milli=10_000, seed=1)
