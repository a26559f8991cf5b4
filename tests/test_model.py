import pytest

from extender.core.cluster import PlacementError
from extender.core.model import PodRequest, RequestError

from .conftest import cluster, node, pod


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"gpu_count": 1, "gpu_milli": 0}, "1..1000"),
        ({"gpu_count": 1, "gpu_milli": 1001}, "1..1000"),
        ({"gpu_count": 2, "gpu_milli": 500}, "must be whole"),
        ({"cpu_milli": -1}, "negative"),
        ({"gpu_count": 0, "gpu_milli": 300}, "without a GPU count"),
    ],
)
def test_invalid_requests_are_refused_in_words(kwargs, words):
    with pytest.raises(RequestError, match=words):
        PodRequest(name="p", **kwargs)


def test_slice_and_shapes():
    assert pod("a", 1, 250).is_slice and pod("a", 1, 250).shape() == "slice"
    assert not pod("b", 1, 1000).is_slice and pod("b", 4).shape() == "4"
    assert pod("c", 0).shape() == "cpu" and pod("c", 0).gpu_demand == 0
    assert pod("d", 4).gpu_demand == 4000


def test_place_and_release_roundtrip():
    c = cluster(node("n1", gpus=2))
    a = c.place(pod("p", 1, 300, cpu=2000, mem=10), "n1", (1,))
    n = c.by_name["n1"]
    assert n.gpu_free == [1000, 700] and n.cpu_free == 30_000 and n.memory_free == 127_990
    assert a.gpus == (1,) and a.milli == 300 and n.version == 1
    c.release("p")
    assert n.gpu_free == [1000, 1000] and n.cpu_free == 32_000 and not c.assignments


@pytest.mark.parametrize(
    "request_, gpus, words",
    [
        (pod("big", 1, 800), (0,), "has 500 milli free"),
        (pod("two", 1, 200), (0, 1), "distinct"),
        (pod("cpu", 1, 100, cpu=10**9), (1,), "insufficient cpu"),
        (pod("nogpu", 1, 100), (7,), "no GPU 7"),
    ],
)
def test_overcommit_is_refused_and_changes_nothing(request_, gpus, words):
    c = cluster(node("n1", gpus=2))
    c.place(pod("half", 1, 500), "n1", (0,))
    before = (list(c.by_name["n1"].gpu_free), c.by_name["n1"].cpu_free, c.by_name["n1"].version)
    with pytest.raises(PlacementError, match=words):
        c.place(request_, "n1", gpus)
    n = c.by_name["n1"]
    assert (n.gpu_free, n.cpu_free, n.version) == before
    assert set(c.assignments) == {"half"}


def test_a_pod_is_placed_once_and_unknowns_are_refused():
    c = cluster(node("n1"))
    c.place(pod("p", 1, 100), "n1", (0,))
    with pytest.raises(PlacementError, match="already placed"):
        c.place(pod("p", 1, 100), "n1", (1,))
    with pytest.raises(PlacementError, match="unknown node"):
        c.place(pod("q", 1, 100), "nope", (0,))
    with pytest.raises(PlacementError, match="unknown pod"):
        c.release("ghost")


def test_node_updates_recount_free_and_removal_drops_its_pods():
    c = cluster(node("n1", gpus=2, cpu=8000))
    c.place(pod("p", 1, 600, cpu=6000), "n1", (1,))
    c.upsert_node(node("n1", gpus=4, cpu=8000))  # the agent found two more GPUs
    n = c.by_name["n1"]
    assert n.gpu_free == [1000, 400, 1000, 1000] and n.cpu_free == 2000
    c.upsert_node(node("n1", gpus=4, cpu=4000))  # a shrunk node takes nothing new
    assert c.by_name["n1"].cpu_free == -2000
    with pytest.raises(PlacementError, match="insufficient cpu"):
        c.place(pod("q", 1, 100, cpu=1), "n1", (0,))
    assert [a.pod for a in c.remove_node("n1")] == ["p"] and not c.assignments and not c.nodes
    c.add_node(node("n1"))
    assert c.nodes[0].index == 1  # indices are never reused


def test_adopt_refuses_an_assignment_that_would_give_a_slice_twice():
    from extender.core.model import Assignment

    c = cluster(node("n1", gpus=1))
    c.adopt(Assignment("a", "n1", (0,), 700))
    with pytest.raises(PlacementError, match="cannot hold 400"):
        c.adopt(Assignment("b", "n1", (0,), 400))
    assert c.by_name["n1"].gpu_free == [300] and set(c.assignments) == {"a"}
