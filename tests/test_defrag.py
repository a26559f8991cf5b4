"""The defragmentation planner (extender/core/defrag.py) on hand-built clusters, and packing mode's moves.

Every cluster here is small enough to check by hand: nodes of two T4s, fixed pods that never move,
trainers that may, and one waiting pod that fits nowhere until something moves.
"""

from __future__ import annotations

import json

import pytest

from extender.cli import main
from extender.core.cluster import Cluster, PlacementError, fit_reason
from extender.core.defrag import ONE_POD_JOBS, Budgets, DefragPlan, JobBudget, MovableTrainer, apply, plan
from extender.core.model import AccountedRequest, NodeSpec
from extender.core.placer import Placer
from extender.core.policy import PolicyContext, make_policy
from extender.core.workload import TargetWorkload
from extender.sim.packing import Mover, replay_packing
from extender.sim.schedulers import make_scheduler

from .conftest import pod as pod_request


def pod(name: str, gpus: int = 1, milli: int = 1000, **kw) -> AccountedRequest:
    """A request as bestfit and fgd account it (unchanged): what the planner and the placer take."""
    return Placer(Cluster([]), make_policy("bestfit", PolicyContext(MIX))).request_for(pod_request(name, gpus, milli, **kw))


MIX = TargetWorkload.from_pods([pod_request("waiting", 1, 1000)])
WHOLE = pod("waiting", 1, 1000)  # one whole GPU


def node(name: str, gpus: int = 2) -> NodeSpec:
    return NodeSpec(name, cpu_milli=64_000, memory_mib=256_000, gpu_count=gpus, gpu_model="T4")


def setup(*names: str) -> tuple[Cluster, Placer]:
    cluster = Cluster([node(n) for n in names])
    return cluster, Placer(cluster, make_policy("bestfit", PolicyContext(TargetWorkload.from_pods([WHOLE]))))


def put(cluster: Cluster, name: str, where: str, gpu: int, milli: int) -> MovableTrainer:
    """A slice of `milli` on GPU `gpu` of `where`; returned as a one-pod job's trainer (movable only if the caller says)."""
    request = pod(name, 1, milli)
    cluster.place(request, where, (gpu,))
    return MovableTrainer(request, job=name)


def one_move_cluster(movable: bool = True) -> tuple[Cluster, Placer, dict[str, MovableTrainer]]:
    """a: a 400 trainer on GPU 0, a fixed 700 on GPU 1; b: fixed 500s on both GPUs (500 free each).
    No GPU is whole, so WHOLE fits nowhere; moving the 400 to b frees a/GPU 0."""
    cluster, placer = setup("a", "b")
    t = put(cluster, "t400", "a", 0, 400)
    put(cluster, "fixed-a", "a", 1, 700)
    put(cluster, "fixed-b0", "b", 0, 500)
    put(cluster, "fixed-b1", "b", 1, 500)
    return cluster, placer, ({t.request.name: t} if movable else {})


def test_a_one_move_plan_where_the_pod_fits_nowhere_otherwise():
    cluster, placer, movable = one_move_cluster()
    assert placer.choose(WHOLE) is None
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert found is not None and found.target == "a" and found.gpus == (0,)
    assert [(m.pod.name, m.source, m.dest) for m in found.moves] == [("t400", "a", "b")]
    assert found.cost == (1, 400)


def test_planning_changes_nothing():
    cluster, placer, movable = one_move_cluster()
    before = ({n.name: (n.version, list(n.gpu_free)) for n in cluster.nodes}, dict(cluster.assignments))
    plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert ({n.name: (n.version, list(n.gpu_free)) for n in cluster.nodes}, dict(cluster.assignments)) == before


def test_no_plan_when_only_non_movable_pods_block():
    cluster, placer, movable = one_move_cluster(movable=False)
    assert plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS) is None


def test_a_non_movable_pod_is_never_moved():
    """Both pods on a/GPU 0 must go for a whole GPU; only one is movable, so nothing is planned there, and
    the plan found elsewhere moves only the movable one."""
    cluster, placer = setup("a", "b", "c")
    t1 = put(cluster, "t200", "a", 0, 200)
    put(cluster, "fixed-a0", "a", 0, 200)
    put(cluster, "fixed-a1", "a", 1, 700)
    put(cluster, "fixed-b0", "b", 0, 500)
    put(cluster, "fixed-b1", "b", 1, 500)
    t2 = put(cluster, "t450", "c", 0, 450)
    put(cluster, "fixed-c1", "c", 1, 700)
    found = plan(cluster, placer, WHOLE, {t1.request.name: t1, t2.request.name: t2}, ONE_POD_JOBS)
    assert found is not None and found.target == "c"
    assert [m.pod.name for m in found.moves] == ["t450"]


def two_ways() -> tuple[Cluster, Placer, dict[str, MovableTrainer]]:
    """a: two 200 trainers share GPU 0 (2 moves, 400 milli); c: one 450 trainer on GPU 0 (1 move, 450 milli);
    b and d: 500 free on each GPU, room for any one of them."""
    cluster, placer = setup("a", "b", "c", "d")
    trainers = [put(cluster, "t200-1", "a", 0, 200), put(cluster, "t200-2", "a", 0, 200),
                put(cluster, "t450", "c", 0, 450)]
    for name in ("a", "c"):
        put(cluster, f"fixed-{name}1", name, 1, 700)
    for name in ("b", "d"):
        put(cluster, f"fixed-{name}0", name, 0, 500)
        put(cluster, f"fixed-{name}1", name, 1, 500)
    return cluster, placer, {t.request.name: t for t in trainers}


def test_fewer_moves_win_over_less_milli_moved():
    cluster, placer, movable = two_ways()
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert found is not None and found.target == "c" and found.cost == (1, 450)


def test_two_moves_when_one_is_not_enough_each_to_its_own_node():
    cluster, placer, movable = two_ways()
    del movable["t450"]
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert found is not None and found.target == "a" and found.cost == (2, 400)
    dests = [m.dest for m in found.moves]
    assert len(set(dests)) == 2 and "a" not in dests  # one moved pod per destination, never the target


def test_among_single_moves_the_least_milli_wins():
    cluster, placer, movable = one_move_cluster()
    cluster.add_node(node("c"))
    small = put(cluster, "t300", "c", 0, 300)
    put(cluster, "fixed-c1", "c", 1, 700)
    movable[small.request.name] = small
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert found is not None and found.target == "c" and found.cost == (1, 300)


def test_every_destination_fits_the_moved_pod_and_is_not_the_target():
    cluster, placer, movable = two_ways()
    del movable["t450"]
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    for m in found.moves:
        dest = cluster.by_name[m.dest]
        assert m.dest != found.target and fit_reason(m.pod, dest) is None
        assert all(dest.gpu_free[g] >= m.pod.gpu_milli for g in m.gpus)


def test_applying_the_plan_places_the_waiting_pod_and_the_moved_ones():
    cluster, placer, movable = two_ways()
    del movable["t450"]
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    placed = apply(cluster, WHOLE, found)
    assert placed.node == "a" and cluster.assignments["waiting"].gpus == found.gpus
    for m in found.moves:
        assert cluster.assignments[m.pod.name].node == m.dest
    assert cluster.by_name["a"].gpu_free == [0, 300]


def test_a_stale_plan_is_refused_and_undone():
    cluster, placer, movable = one_move_cluster()
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    put(cluster, "late", "b", 0, 500)  # takes the room the move was to use
    before = dict(cluster.assignments), [list(n.gpu_free) for n in cluster.nodes]
    with pytest.raises(PlacementError):
        apply(cluster, WHOLE, found)
    assert (dict(cluster.assignments), [list(n.gpu_free) for n in cluster.nodes]) == before


def job_trainers(job_of: dict[str, str]) -> tuple:
    """(cluster, placer, WHOLE, trainers): two_ways without c's trainer, the 200s of the jobs `job_of`
    names, so a plan needs both of them."""
    cluster, placer, movable = two_ways()
    del movable["t450"]
    return cluster, placer, WHOLE, {n: MovableTrainer(t.request, job_of[n]) for n, t in movable.items()}


def test_one_move_in_flight_per_job():
    budgets = Budgets(jobs={"j": JobBudget(world=8), "k": JobBudget(world=8)})
    assert plan(*job_trainers({"t200-1": "j", "t200-2": "j"}), budgets) is None  # both of one job: never in one plan
    assert plan(*job_trainers({"t200-1": "j", "t200-2": "k"}), budgets).cost == (2, 400)
    moving = Budgets(jobs={"j": JobBudget(world=8, moving=True), "k": JobBudget(world=8)})
    assert plan(*job_trainers({"t200-1": "j", "t200-2": "k"}), moving) is None


def test_a_minimum_interval_between_moves_of_a_job():
    cluster, placer, movable = one_move_cluster()
    movable = {"t400": MovableTrainer(movable["t400"].request, "j")}
    recent = JobBudget(world=4, last_move_s=100.0)
    assert plan(cluster, placer, WHOLE, movable, Budgets({"j": recent}, now_s=130.0, min_interval_s=60.0)) is None
    assert plan(cluster, placer, WHOLE, movable, Budgets({"j": recent}, now_s=160.0, min_interval_s=60.0)) is not None


def test_never_below_the_minimum_world_size():
    cluster, placer, movable = one_move_cluster()
    movable = {"t400": MovableTrainer(movable["t400"].request, "j")}
    assert plan(cluster, placer, WHOLE, movable, Budgets({"j": JobBudget(world=2, min_world=2)})) is None
    assert plan(cluster, placer, WHOLE, movable, Budgets({"j": JobBudget(world=3, min_world=2)})) is not None


def test_a_job_without_a_budget_is_not_moved():
    cluster, placer, movable = one_move_cluster()
    assert plan(cluster, placer, WHOLE, movable, Budgets()) is None


def test_packing_mover_places_through_a_plan_and_counts():
    cluster, _, movable = one_move_cluster()
    chooser = make_scheduler("ideal", cluster, make_policy("bestfit", PolicyContext(TargetWorkload.from_pods([WHOLE]))), 1)
    mover = Mover(share=1.0, seed=1, movable=movable)
    choice = mover.rescue(chooser, WHOLE)
    assert choice is not None and choice.node.name == "a" and cluster.assignments["waiting"].node == "a"
    assert (mover.plans, mover.moves, mover.placed) == (1, 1, 1)


def test_the_movable_draw_is_seeded_per_pod_and_skips_cpu_pods():
    def drawn(seed: int) -> set[str]:
        m = Mover(share=0.3, seed=seed)
        for i in range(200):
            m.placed_pod(pod(f"p{i}", 1, 500))
        m.placed_pod(pod("cpu-only", 0))
        return set(m.movable)

    assert drawn(42) == drawn(42) and drawn(42) != drawn(43)
    assert 30 <= len(drawn(42)) <= 90 and "cpu-only" not in drawn(42)


def packing_inputs() -> tuple[list[NodeSpec], list]:
    nodes = [node(f"n{i}", 4) for i in range(6)]
    pods = [pod(f"s{i}", 1, m) for i, m in enumerate([810, 470, 320, 650, 230, 1000, 500] * 4)]
    return nodes, pods + [pod(f"w{i}", 2, 1000) for i in range(4)]


def test_movable_share_zero_changes_nothing_in_packing_mode():
    nodes, pods = packing_inputs()
    plain, zero = replay_packing(nodes, pods, "tessera", seed=5), replay_packing(nodes, pods, "tessera", seed=5,
                                                                                  movable_share=0.0)
    a, b = plain.as_json(), zero.as_json()
    a.pop("elapsed_s"), b.pop("elapsed_s")
    assert json.dumps(a) == json.dumps(b) and "defrag" not in b


def test_a_movable_share_moves_pods_and_reports_it():
    """Not "never rejects more": a pod placed thanks to moves takes room a later pod may have fitted."""
    nodes, pods = packing_inputs()
    moved = replay_packing(nodes, pods, "tessera", seed=5, movable_share=1.0)
    assert set(moved.defrag) == {"movable_share", "movable_pods", "plans_asked", "moves", "placed_by_moves"}
    assert moved.defrag["moves"] >= moved.defrag["placed_by_moves"] >= 1
    assert moved.as_json()["defrag"] == moved.defrag
    with pytest.raises(ValueError, match="0..1"):
        replay_packing(nodes, pods, "tessera", seed=5, movable_share=1.5)


@pytest.mark.parametrize("argv, words", [
    (["--movable-share", "-0.1"], "a share is from 0 to 1"),
    (["--movable-share", "1.5"], "a share is from 0 to 1"),
    (["--movable-share", "nan"], "a share is from 0 to 1"),
    (["--movable-share", "lots"], "a share is a number from 0 to 1"),
])
def test_bad_movable_shares_are_refused_in_words(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--movable-share", "0.3"], "needs --scheduler ideal"),  # the default runs kube too
    (["--movable-share", "0.3", "--scheduler", "kube"], "needs --scheduler ideal"),
])
def test_a_movable_share_where_it_means_nothing_is_refused_before_the_run(argv, words, capsys, monkeypatch):
    import extender.sim.runner as runner

    monkeypatch.setattr(runner, "run_jobs", lambda *a: pytest.fail("ran before refusing"))
    code = main(["simulate", "--plot", "none", *argv])
    captured = capsys.readouterr()
    assert code == 2 and words in captured.err and captured.out == ""


@pytest.mark.parametrize("bound", ["SEARCH_BUDGET", "PLAN_NODES"])
def test_the_work_is_bounded(bound, monkeypatch):
    """With no trial fit (or no node) allowed, the one-move plan above is not found: the bounds are obeyed."""
    import extender.core.defrag as defrag

    cluster, placer, movable = one_move_cluster()
    monkeypatch.setattr(defrag, bound, 0)
    assert plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS) is None


def test_the_plan_is_plain_frozen_data():
    cluster, placer, movable = one_move_cluster()
    found = plan(cluster, placer, WHOLE, movable, ONE_POD_JOBS)
    assert isinstance(found, DefragPlan)
    with pytest.raises(AttributeError):
        found.target = "b"  # type: ignore[misc]


def test_simulate_prints_the_moves_and_writes_them_in_the_json(capsys):
    argv = ["simulate", "--policy", "tessera", "--scheduler", "ideal", "--seeds", "42", "--plot", "none", "--workers", "1"]
    assert main([*argv, "--movable-share", "0.3"]) == 0
    table = capsys.readouterr().out
    assert "Moves of movable pods" in table and "unalloc@100" in table
    assert main([*argv, "--movable-share", "0.3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["defrag"]["movable_share"] == 0.3 and record["defrag"]["moves"] >= record["defrag"]["placed_by_moves"]
    assert main(argv) == 0 and "Moves of movable pods" not in capsys.readouterr().out
