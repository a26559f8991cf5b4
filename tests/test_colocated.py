"""Second-scheduler install: Tessera binds only while the kube-scheduler in its own pod holds
kube-scheduler's Lease, and stops before any other kube-scheduler may take that Lease."""

from __future__ import annotations

import pytest

from extender.kube.colocated import SchedulerLeaseFollower, holder_pod, parse_lease_ref
from extender.serve import ServeOptions


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lease(holder: str, renew: str, transitions: int = 0) -> dict:
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": transitions,
                     "leaseDurationSeconds": 15}}


def follower(clock, elected=None) -> SchedulerLeaseFollower:
    return SchedulerLeaseFollower(api=None, namespace="tessera-system", name="tessera-scheduler", pod="tessera-scheduler-abc",
                                  on_elected=elected or (lambda: None), clock=clock)


def test_binds_only_while_this_pods_kube_scheduler_holds_the_lease_and_renews_it():
    clock, calls = Clock(), []
    f = follower(clock, lambda: calls.append(clock.t))
    assert not f.is_leader()
    f.observe(lease("tessera-scheduler-abc_0f3c", "t1"))
    assert f.is_leader() and calls == [100.0]
    for i in range(2, 10):  # kube-scheduler renews every 2 s: leadership holds, elected once
        clock.t += 2
        f.observe(lease("tessera-scheduler-abc_0f3c", f"t{i}"))
        assert f.is_leader()
    assert len(calls) == 1
    clock.t += 9.9  # the record stands still (kube-scheduler hung or gone): lapse at the renew deadline
    f.observe(lease("tessera-scheduler-abc_0f3c", "t9"))
    assert f.is_leader()
    clock.t += 0.2
    assert not f.is_leader()  # 10 s after the last renew we saw, < the 15 s another pod must wait


def test_another_pods_kube_scheduler_ends_leadership_at_once():
    clock = Clock()
    f = follower(clock)
    f.observe(lease("tessera-scheduler-abc_0f3c", "t1"))
    assert f.is_leader()
    f.observe(lease("tessera-scheduler-xyz_77aa", "t2", 1))
    assert not f.is_leader() and f.holder() == "tessera-scheduler-xyz"
    assert not f.observe(None) and not f.is_leader()  # no Lease: nobody binds


def test_a_pod_whose_name_only_starts_like_ours_is_not_us():
    clock = Clock()
    f = follower(clock)
    f.observe(lease("tessera-scheduler-abcd_0f3c", "t1"))  # another pod, name sharing our prefix
    assert not f.is_leader()
    assert holder_pod("a_b_c") == "a_b" and holder_pod("no-uuid") == ""


def test_not_leader_until_the_cache_is_synced():
    clock = Clock()
    seen = []

    def elected():
        seen.append(f.is_leader())  # during on_elected (waiting for the cache) no bind may pass

    f = follower(clock, elected)
    f.observe(lease("tessera-scheduler-abc_1", "t1"))
    assert seen == [False] and f.is_leader()


def test_bad_references_and_two_ways_of_choosing_a_binder_are_refused_in_words():
    assert parse_lease_ref("tessera-system/tessera-scheduler") == ("tessera-system", "tessera-scheduler")
    for bad in ("tessera-scheduler", "/x", "ns/", "a/b/c"):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_lease_ref(bad)
    with pytest.raises(ValueError, match="use one"):
        ServeOptions("127.0.0.1", 8888, leader_elect=True, bind_with_scheduler_lease="tessera-system/tessera-scheduler").check()
    ServeOptions("127.0.0.1", 8888, bind_with_scheduler_lease="tessera-system/tessera-scheduler").check()
    with pytest.raises(ValueError, match="POD_NAME"):
        SchedulerLeaseFollower(api=None, namespace="n", name="l", pod="")


class FakeLeases:
    def __init__(self, body: dict) -> None:
        self.body, self.reads = body, 0

    def read_namespaced_lease(self, name, namespace, _preload_content=False):
        import json
        from types import SimpleNamespace

        self.reads += 1
        return SimpleNamespace(data=json.dumps(self.body))


def test_a_bind_right_after_kube_scheduler_took_the_lease_reads_it_again_instead_of_refusing():
    """kube-scheduler binds its first pod within a second of taking the Lease, before the next poll:
    refusing would park the pod for up to a minute in kube-scheduler's unschedulable queue."""
    clock = Clock()
    api = FakeLeases(lease("tessera-scheduler-abc_1", "t1"))
    f = SchedulerLeaseFollower(api=api, namespace="tessera-system", name="tessera-scheduler", pod="tessera-scheduler-abc",
                               clock=clock)
    f.poll_once()  # the poll thread read the Lease a moment before kube-scheduler took it ...
    api.body = lease("tessera-scheduler-xyz_2", "t2", 1)
    f.poll_once()
    api.body = lease("tessera-scheduler-abc_3", "t3", 2)  # ... and a bind arrives right after it did
    assert f.is_leader() and api.reads == 3  # read afresh, not refused on the stale poll
    assert f.is_leader() and api.reads == 3  # leading: no read per bind
    api.body = lease("tessera-scheduler-xyz_4", "t4", 3)
    clock.t += 10  # the record we saw has lapsed; the fresh read shows another pod leads
    assert not f.is_leader() and api.reads == 4
