"""The bind transaction (extender/binding.py): every exit tells the extender once, and gives the GPUs
back exactly when the Binding was not written.

A real Extender with real reservations; only the API's Binding endpoint is a fake. `bind_done` is
observed by wrapping the extender's own method (it still runs), so the counts are of real calls.
"""

from __future__ import annotations

import pytest

from extender.binding import BindResult, BindTarget, bind_pod
from extender.service import BindError, BindFailure, Extender, NotReady
from extender.translate.objects import pod_info
from tests.test_verbs_hostile import Binder, cluster, kpod, node


class FailingBinder(Binder):
    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def bind(self, namespace, name, uid, node, annotations):
        super().bind(namespace, name, uid, node, annotations)
        raise self.error


def world(*pods, ext=None):
    """Nodes a and b (4 T4 each), `pods` created (the watch saw them), and a log of bind_done calls."""
    ext = cluster(node("a"), node("b"), ext=ext)
    for p in pods:
        ext.upsert_pod(pod_info(p))
    done: list[tuple[str, bool]] = []
    real = ext.bind_done

    def bind_done(uid, ok):
        done.append((uid, ok))
        real(uid, ok)

    ext.bind_done = bind_done
    return ext, done


def target(name, node_name="a"):
    return BindTarget(name, "ml", f"uid-{name}", node_name)


def held(ext, name):
    return f"ml/{name}" in ext.cluster.assignments


def test_success_keeps_the_reservation_for_the_watch_and_says_so_once():
    ext, done = world(kpod("p", gpus=2))
    binder = Binder()
    outcome = bind_pod(ext, binder, target("p"))
    assert outcome.result is BindResult.BOUND and outcome.bound and outcome.message == ""
    assert outcome.assignment.node == "a" and len(outcome.assignment.gpus) == 2
    assert done == [("uid-p", True)] and held(ext, "p") and "uid-p" in ext.bind_holds
    assert binder.calls == [("ml", "p", "uid-p", "a")]


def test_an_unknown_pod_is_refused_before_anything_is_held_and_bind_done_is_not_called():
    ext, done = world()
    before = ext.snapshot()
    with pytest.raises(BindError, match="unknown"):
        bind_pod(ext, Binder(), target("ghost"))
    assert done == [] and ext.snapshot() == before


def test_a_refused_reserve_leaves_another_in_flight_bind_of_the_same_pod_alone():
    # a retried bind to another node while the first is still writing: giving "back" on this refusal
    # would free the first bind's GPUs under it
    ext, done = world(kpod("p"))
    ext.reserve("uid-p", "ml/p", "a")
    before = ext.snapshot()
    with pytest.raises(BindError, match="already holds GPUs on a"):
        bind_pod(ext, Binder(), target("p", "b"))
    assert done == [] and ext.snapshot() == before and held(ext, "p")


def test_not_ready_is_raised_before_anything_is_held():
    ext = Extender()
    ext.upsert_pod(pod_info(kpod("p")))
    with pytest.raises(NotReady):
        bind_pod(ext, Binder(), target("p"))
    assert not ext.cluster.assignments


def test_an_admitted_gang_members_failed_write_leaves_its_gpus_held_for_the_gang_until_its_timeout():
    """A member's Binding refused by the API: its GPUs stay the gang's (the gang binder tries again; the gang's
    timeout gives them back, gangs.py), and the extender is told once, as for any bind."""
    ext, done = world(kpod("g-0", gang=("team", 2)), kpod("g-1", gang=("team", 2)))
    for name in ("g-0", "g-1"):
        ext.filter(pod_info(kpod(name, gang=("team", 2))), ["a"])
    assert held(ext, "g-0") and held(ext, "g-1")
    outcome = bind_pod(ext, FailingBinder(BindFailure("500: etcd timed out")), target("g-0"))
    assert outcome.result is BindResult.API and "etcd timed out" in outcome.message
    assert done == [("uid-g-0", False)] and held(ext, "g-0") and "uid-g-0" not in ext.holds.binding
    assert bind_pod(ext, Binder(), target("g-0")).result is BindResult.BOUND


def test_a_lost_lease_writes_nothing_and_gives_the_gpus_back():
    ext, done = world(kpod("p"))
    binder = Binder()
    outcome = bind_pod(ext, binder, target("p"), is_leader=lambda: False)
    assert outcome.result is BindResult.LOST_LEASE and "lost the bind lease" in outcome.message
    assert done == [("uid-p", False)] and not held(ext, "p") and not binder.calls


@pytest.mark.parametrize("error", [BindFailure('pods "p" not found'), BindFailure("already assigned", already_on="b"),
                                   ConnectionResetError("apiserver went away")])
def test_a_failed_write_gives_the_gpus_back(error):
    ext, done = world(kpod("p"))
    outcome = bind_pod(ext, FailingBinder(error), target("p"))
    assert outcome.result is BindResult.API and str(error) in outcome.message and not outcome.bound
    assert done == [("uid-p", False)] and not held(ext, "p") and "uid-p" not in ext.bind_holds


def test_a_409_naming_this_node_is_an_earlier_try_that_won():
    ext, done = world(kpod("p"))
    binder = FailingBinder(BindFailure("already assigned", already_on="a"))
    outcome = bind_pod(ext, binder, target("p"))
    assert outcome.result is BindResult.ALREADY_BOUND and outcome.bound and outcome.message == ""
    assert done == [("uid-p", True)] and held(ext, "p") and "uid-p" in ext.bind_holds


def test_an_unexpected_exception_gives_the_gpus_back_and_propagates():
    ext, done = world(kpod("p"))

    def broken_lease() -> bool:
        raise RuntimeError("lease client bug")

    with pytest.raises(RuntimeError, match="lease client bug"):
        bind_pod(ext, Binder(), target("p"), is_leader=broken_lease)
    assert done == [("uid-p", False)] and not held(ext, "p")
