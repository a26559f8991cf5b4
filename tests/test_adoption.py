"""Adoption's own rules: what a bound pod holds is counted once, guesses yield, over-commits are refused."""

import threading

import pytest

from extender.adoption import Adoption
from extender.core.cluster import Cluster
from extender.core.model import Assignment, NodeSpec, PodRequest
from extender.holds import BindHolds
from extender.translate.objects import PodInfo


@pytest.fixture
def adoption():
    lock = threading.RLock()
    a = Adoption(Cluster([NodeSpec("a", 8000, 32768, 2, "T4")]), {}, BindHolds(clock=lambda: 0.0))
    with lock:  # the extender's lock, held as by every caller
        yield a


def watch(adoption, name, gpus=1, milli=1000, assignment=None, forged="", phase="Running", node="a"):
    info = PodInfo(f"uid-{name}", f"ml/{name}", PodRequest(f"ml/{name}", 1000, 0, gpus, milli), node, None,
                   assignment, phase=phase, forged=forged)
    adoption.pods[info.uid] = info
    adoption.watched(info)
    return info


def test_a_guessed_holder_moves_aside_for_a_tessera_assignment_and_is_guessed_again(adoption):
    watch(adoption, "foreign")  # another binder's whole-GPU pod: the lowest free GPU
    assert adoption.cluster.assignments["ml/foreign"].gpus == (0,) and adoption.guessed == {"ml/foreign"}
    watch(adoption, "p", assignment=Assignment("ml/p", "a", (0,), 1000, 1000))
    assert adoption.cluster.assignments["ml/p"].gpus == (0,)
    assert adoption.cluster.assignments["ml/foreign"].gpus == (1,) and adoption.guessed == {"ml/foreign"}
    assert adoption.rejected == {}


def test_a_tessera_assignment_that_would_overcommit_is_refused_with_a_reason_and_counts_nothing(adoption):
    watch(adoption, "p", assignment=Assignment("ml/p", "a", (0,), 700, 1000))
    watch(adoption, "evil", milli=700, assignment=Assignment("ml/evil", "a", (0,), 700, 1000))
    assert "ml/evil" not in adoption.cluster.assignments and "uid-evil" in adoption.rejected
    assert adoption.cluster.by_name["a"].gpu_free == [300, 1000]  # the real holder was not pushed out
    watch(adoption, "evil", milli=700, assignment=Assignment("ml/evil", "a", (1,), 700, 1000))
    assert adoption.rejected == {} and adoption.cluster.by_name["a"].gpu_free == [300, 300]


def test_a_forged_slice_counts_where_there_is_most_room_and_gpus_that_do_not_fit_still_count_cpu(adoption):
    """The kubelet counted the forged slice's milli against the node when it admitted it: Tessera counts it too
    (it held none, and Tessera offered milli the kubelet would refuse), on the GPU with the most room."""
    watch(adoption, "p", milli=300, assignment=Assignment("ml/p", "a", (0,), 300, 1000))
    watch(adoption, "slice", milli=500, forged="no MAC")
    assert adoption.cluster.assignments["ml/slice"].gpus == (1,) and adoption.cluster.by_name["a"].gpu_free == [700, 500]
    watch(adoption, "three", gpus=3)
    assert adoption.cluster.assignments["ml/three"].gpus == () and "do not fit" in adoption.rejected["uid-three"]
    assert adoption.cluster.by_name["a"].cpu_free == 5000, "what the kubelet admitted it to is counted all the same"


def test_the_watch_confirms_a_hold_and_a_finished_pod_gives_its_gpus_back(adoption):
    held = adoption.cluster.place(PodRequest("ml/p", 1000, 0, 1, 400), "a", (1,))
    adoption.holds.hold("uid-p")
    adoption.holds.binding.discard("uid-p")
    watch(adoption, "p", milli=400, assignment=held)
    assert adoption.holds.expiry == {} and adoption.cluster.assignments["ml/p"] == held  # confirmed, not re-adopted
    watch(adoption, "p", milli=400, assignment=held, phase="Succeeded")
    assert "ml/p" not in adoption.cluster.assignments
