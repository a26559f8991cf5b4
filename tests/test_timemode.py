import pytest

from extender.core.model import NodeSpec
from extender.sim.kubequeue import EVENTS_ONLY, KUBE_1_20, SchedulingQueue
from extender.sim.timemode import compress, replay_time
from extender.sim.trace import TracePod
from extender.sim.waits import WaitStats, pod_class

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


def two_gpu_node():
    return [NodeSpec("n", cpu_milli=10**6, memory_mib=10**6, gpu_count=2, gpu_model="X")]


# (name, arrival, duration, GPUs, milli) on one 2-GPU node, arrivals in trace order
HAND_STREAM = [("a", 0, 30, 2, 1000), ("b", 1, 10, 1, 500), ("c", 2, 5, 0, 0), ("d", 3, 10, 1, 1000),
               ("e", 4, 10, 1, 1000), ("g", 5, 10, 2, 1000)]


def hand_replay(timings):
    pods = [tp(name, at, dur, gpus=gpus, milli=milli) for name, at, dur, gpus, milli in HAND_STREAM]
    return replay_time(two_gpu_node(), pods, "fgd", "ideal", seed=0, node_count=1, timings=timings,
                       timeline=[(float(at), float(dur)) for _, at, dur, _, _ in HAND_STREAM])


def test_waits_per_class_on_a_stream_worked_out_by_hand():
    # a holds both GPUs until 30. b (slice), d and e (1 GPU) and g (2 GPUs) wait; c needs no GPU.
    # c leaves at 7: a cluster event, every parked pod is tried again (2nd attempt) and parked at 7.
    # At 30 a leaves, every parked pod is moved (3rd attempt), oldest timestamp first: b and d take a
    # GPU each (waits 29 and 27); e and g fail and are parked at 30.
    # At 40 b and d leave (in that order). b's GPU: e (timestamp 30, before g's) takes it: wait 36;
    # g fails its 4th attempt, so when d leaves, still at 40, g is backing off 8 s (1 s doubled per
    # attempt after the first): tried at 48, it fails (e holds a GPU until 50), and its 5th attempt
    # backs it off 10 s (the cap): e leaves at 50, inside it, so g starts at 58: wait 53.
    r = hand_replay(KUBE_1_20)
    assert list(r.classes) == ["cpu", "slice", "1gpu", "2gpu"]  # report order; no class without pods
    assert r.classes["cpu"] == WaitStats(pods=1, mean_s=0.0, p50_s=0.0, p99_s=0.0, max_s=0.0)
    assert r.classes["slice"] == WaitStats(pods=1, mean_s=29.0, p50_s=29.0, p99_s=29.0, max_s=29.0)
    assert r.classes["1gpu"] == WaitStats(pods=2, mean_s=31.5, p50_s=27.0, p99_s=36.0, max_s=36.0)
    assert r.classes["2gpu"] == WaitStats(pods=2, mean_s=26.5, p50_s=0.0, p99_s=53.0, max_s=53.0)
    assert r.wait_mean_s == pytest.approx((0 + 29 + 0 + 27 + 36 + 53) / 6) and r.wait_max_s == 53.0
    record = r.as_json()
    assert record["classes"]["2gpu"] == {"pods": 2, "mean_s": 26.5, "p50_s": 0.0, "p99_s": 53.0, "max_s": 53.0}


def test_without_the_queue_timers_the_backoff_delay_is_gone():
    # the same stream with every parked pod retried at once when a pod leaves: g starts at 50, when e leaves
    r = hand_replay(EVENTS_ONLY)
    assert r.classes["2gpu"].max_s == 45.0
    assert r.classes["1gpu"] == hand_replay(KUBE_1_20).classes["1gpu"]


def test_pod_classes_are_what_the_pod_asked_for():
    assert [pod_class(pod("x", g, m)) for g, m in ((0, 0), (1, 100), (1, 999), (1, 1000), (2, 1000), (8, 1000), (3, 1000))] == [
        "cpu", "slice", "slice", "1gpu", "2gpu", "8gpu", "3gpu"]


def test_the_queue_orders_by_priority_then_arrival():
    q = SchedulingQueue()
    for pod_index, (at, priority) in enumerate([(0, 0), (1, 10), (2, 0), (3, 10), (3, 0)]):
        q.add(pod_index, float(at), priority)
    assert [q.pop() for _ in range(6)] == [1, 3, 0, 2, 4, None]


def test_the_flush_refreshes_a_timestamp_so_newer_pods_go_first():
    q = SchedulingQueue()
    q.add(0, 0.0)
    assert q.pop() == 0
    q.park(0, 0.0)
    q.add(1, 40.0)
    assert q.pop() == 1
    q.park(1, 40.0)
    # flush ticks every 30 s move pods parked MORE than 60 s: pod 0 at 90 (60 is not more), pod 1 not yet
    assert q.next_timer() == 90.0
    q.on_timer(90.0)
    assert q.pop() == 0 and q.pop() is None
    q.park(0, 90.0)  # refused again: its timestamp is now 90, after pod 1's 40
    q.move_all(100.0)  # a pod leaves: both move (pod 0's 2 s backoff ran out at 92)
    assert [q.pop(), q.pop(), q.pop()] == [1, 0, None]


def test_a_pod_moved_while_backing_off_waits_for_its_backoff():
    q = SchedulingQueue()
    q.add(7, 10.0)
    for attempt, expected_backoff in enumerate([1, 2, 4, 8, 10, 10], start=1):
        assert q.pop() == 7 and q.attempts[7] == attempt
        q.park(7, 10.0)
        assert q.backoff_expiry(7) == 10.0 + expected_backoff
        q.move_all(10.5)
        assert q.pop() is None  # backing off: in backoffQ, not activeQ
        assert q.next_timer() == 10.0 + expected_backoff  # the 1 s timer's tick at or after the expiry
        q.on_timer(q.next_timer())


def test_with_moves_a_whole_gpu_pod_that_fits_nowhere_moves_a_pod_and_the_moved_run_is_longer():
    """n1 (model A) holds `a` alone, n2 (model B) holds `c`, which asks model B: `big` (2 GPUs) fits nowhere.
    The one plan moves `a` to n2; `big` starts at once on n1, and `a` leaves a move's cost later than its run."""
    from extender.core.defrag import MOVE_COST_S

    nodes = [NodeSpec("n1", 10**6, 10**6, 2, "A"), NodeSpec("n2", 10**6, 10**6, 2, "B")]
    stream = [("z1", 0.0, 0.5, ("B",)), ("z2", 0.0, 0.6, ("B",)), ("a", 0.1, 1000.0, ()), ("c", 1.0, 3000.0, ("B",)),
              ("big", 2.0, 2000.0, ()), ("late", 3.0, 10.0, ("B",))]  # late waits for `a` to leave n2
    pods = [TracePod(pod(n, 2 if n == "big" else 1, 1000, cpu=1, models=m), at, d) for n, at, d, m in stream]
    timeline = [(at, d) for _, at, d, _ in stream]

    def run(share):
        return replay_time(nodes, pods, "tessera", "ideal", seed=0, node_count=2, timeline=timeline,
                           movable_share=share)

    still = run(0.0)
    assert still.classes["2gpu"].max_s > 990 and still.defrag is None and "defrag" not in still.as_json()
    moved = run(1.0)
    assert moved.classes["2gpu"].max_s == 0.0, "placed on arrival, thanks to the move"
    assert moved.defrag["moves"] == 1 and moved.defrag["placed_by_moves"] == 1
    assert moved.defrag["trainer_s_lost"] == MOVE_COST_S == moved.defrag["trainer_s_per_move"]
    assert moved.classes["1gpu"].max_s == pytest.approx(0.1 + 1000.0 + MOVE_COST_S - 3.0), "a left n2 a move later"


def test_with_moves_a_reservation_holder_has_the_trainers_left_on_its_node_moved_off():
    """`big` (2 GPUs) reserves n1, the node that drains soonest (`t` runs to 5000 s beside `s`, to 100 s); n2 and n3
    hold pods to 9000 s, n3 one GPU. Every pod is movable, but at `big`'s arrival no plan has room for two. Once `s`
    leaves, `t` is all that keeps n1: its own reserved node is a target for the holder (as on the server), so `t`
    moves to n3's free GPU and `big` starts there and then, not at 5000 s. No other pod may use n1 meanwhile,
    and no moved pod may land on it."""
    from extender.core.backfill import BackfillSettings

    nodes = [NodeSpec(n, 10**6, 10**6, 2, "A") for n in ("n1", "n2", "n3")]
    stream = [("t", 0.0, 5000.0, 1), ("s", 0.0, 100.0, 1), ("u", 0.0, 9000.0, 2), ("v", 0.0, 9000.0, 1),
              ("big", 1.0, 1000.0, 2)]
    pods = [TracePod(pod(n, g, 1000, cpu=1), at, d) for n, at, d, g in stream]
    timeline = [(at, d) for _, at, d, _ in stream]
    settings = BackfillSettings(wait_bound_s={2: 0.0}, max_share=1.0)
    without = replay_time(nodes, pods, "tessera", "ideal", seed=0, node_count=3, timeline=timeline, backfill=settings)
    assert without.classes["2gpu"].max_s == pytest.approx(5000.0 - 1.0), "it waits for t to end"
    moved = replay_time(nodes, pods, "tessera", "ideal", seed=0, node_count=3, timeline=timeline, backfill=settings,
                        movable_share=1.0)
    assert moved.defrag["moves"] == 1 and moved.defrag["placed_by_moves"] == 1
    assert 99.0 <= moved.classes["2gpu"].max_s <= 99.0 + 10.0, "placed when s left (up to a backoff later)"


def test_remembered_refusals_of_the_planner_change_no_wait(monkeypatch):
    """`_Replay.move_for` skips the planner for a shape it refused since the last freed room, move or budget change.
    A crowded random stream with reservations and every pod movable gives the same waits with that memory as
    without it (a set that never remembers), so the memory only saves work."""
    import random

    from extender.core.backfill import BackfillSettings
    from extender.sim import timemode

    class Forgetful(set):
        def __contains__(self, item):
            return False

    rng = random.Random(7)
    nodes = [NodeSpec(f"n{k}", 10**6, 10**6, 4 if k % 2 else 8, "A") for k in range(6)]
    pods, timeline = [], []
    for k in range(300):
        gpus, milli = rng.choice([(1, 300), (1, 600), (1, 1000), (2, 1000), (4, 1000), (8, 1000)])
        at, run = k * 20.0, rng.uniform(100.0, 3000.0)
        pods.append(TracePod(pod(f"p{k}", gpus, milli, cpu=1), at, run))
        timeline.append((at, run))
    settings = BackfillSettings(wait_bound_s={8: 0.0, 4: 600.0}, max_share=0.5)

    def run():
        return replay_time(nodes, pods, "tessera", "ideal", seed=1, node_count=6, timeline=timeline, backfill=settings,
                           movable_share=0.5).as_json()

    remembered = run()
    init = timemode._Replay.__init__

    def forgetting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.unmovable = Forgetful()

    monkeypatch.setattr(timemode._Replay, "__init__", forgetting)
    forgot = run()
    assert remembered["defrag"]["moves"] > 0, "the stream must make moves, or it shows nothing"
    assert remembered["defrag"]["plans_asked"] < forgot["defrag"]["plans_asked"], "the memory must spare plans"
    for key in ("wait_mean_s", "wait_p99_s", "wait_max_s", "classes", "reservations_made"):
        assert remembered[key] == forgot[key], key
    assert remembered["defrag"]["moves"] == forgot["defrag"]["moves"]
