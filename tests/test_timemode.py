import pytest

from extender.core.model import NodeSpec
from extender.sim.timemode import compress, replay_time
from extender.sim.trace import TracePod

from .conftest import pod


def tp(name, created, duration, gpus=1, milli=1000):
    return TracePod(pod(name, gpus, milli, cpu=1), float(created), float(duration))


def test_compress_hits_the_offered_load_and_keeps_order():
    pods = [tp(f"p{i}", i, 100 + 10 * i) for i in range(50)]
    timeline, window = compress(pods, capacity_milli=4000, load=0.8, seed=1)
    offered = sum(1000 * d for _, d in timeline) / (4000 * window)
    assert offered == pytest.approx(0.8, rel=1e-6)
    arrivals = [a for a, _ in timeline]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0


def test_a_pod_waits_until_the_gpu_it_needs_is_free():
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=1, gpu_model="X")]
    # d (CPU only) arrives last, at the end of the window, so a, b and c arrive early in it
    pods = [tp("a", 0, 1000), tp("b", 1, 1000), tp("c", 2, 10, milli=100), tp("d", 3, 1, gpus=0)]
    timeline, _ = compress(pods, 1000, load=2.0, seed=0)
    (a0, ad), (b0, bd), (c0, _), _ = timeline
    assert b0 < a0 + ad and c0 < a0 + ad  # both arrive while a holds the GPU
    r = replay_time(nodes, pods, "fgd", "ideal", seed=0, load=2.0, node_count=1)
    # when a leaves, b (first in line) takes the whole GPU, so the slice c waits for b as well
    b_wait = a0 + ad - b0
    c_wait = a0 + ad + bd - c0
    assert r.wait_max_s == pytest.approx(c_wait)
    assert r.wait_mean_s == pytest.approx((0 + b_wait + c_wait + 0) / 4)
    assert r.never_fit == 0


def test_a_load_the_pods_cannot_offer_is_refused():
    with pytest.raises(ValueError, match="more than these pods can offer"):
        compress([tp("a", 0, 10), tp("b", 1, 10)], 1000, load=2.5, seed=0)


def test_pods_that_fit_no_node_are_counted_not_queued_forever():
    nodes = [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=1, gpu_model="X")]
    r = replay_time(nodes, [tp("a", 0, 10), tp("huge", 1, 10, gpus=4)], "tessera", "kube", load=0.5, node_count=1)
    assert r.never_fit == 1 and r.wait_max_s == 0
