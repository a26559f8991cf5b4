"""Issue 12 item 5: a member can die at any moment, not only inside a step. Each test kills a node
exactly at one moment outside a step (the controller's `on_moment` hook runs in its own thread, just
before that moment's calls) and checks that it is a recovery like any other: the job goes on at
full speed with the survivors, the lost pod is handed to the bridge, a recovery is recorded, and
the loss curve is the failure-free one.

Before: killing the member whose state a warm joiner copies made `step()` raise ActorDiedError
(the bridge process exited); killing another member while the group formed stalled the job for
the whole group timeout and recorded no recovery; a kill while shrinking raised out of `remove`.
"""

from __future__ import annotations

import time

import pytest

from raybridge.contract import Slice

from .test_ray_recovery import assert_follows, controller, reference, slices  # noqa: F401

pytestmark = pytest.mark.ray


class KillAt:
    """Kill `node` the first time the controller reaches `moment`."""

    def __init__(self, ray_nodes, moment: str, node: str) -> None:
        self.ray_nodes, self.moment, self.node = ray_nodes, moment, node
        self.at = 0.0

    def __call__(self, what: str) -> None:
        if what == self.moment and not self.at:
            self.at = time.monotonic()
            self.ray_nodes.cluster.kill(self.node)


def grow_with_a_kill(ray_nodes, tmp_path, moment: str, victim_rank: int):
    nodes = ray_nodes.add(2)
    ctl = controller(tmp_path)
    ctl.start(slices(nodes))
    ctl.run(4)
    (new,) = ray_nodes.add(1)
    ctl.add("default/w9", Slice(new, (0,), 500, ()))
    ctl.wait_joiners(120)
    victim = ctl.group.members[victim_rank]
    ctl.on_moment = KillAt(ray_nodes, moment, nodes[victim_rank])
    t0 = time.monotonic()
    report = ctl.step()  # admits the joiner; the kill lands inside the admission
    took = time.monotonic() - t0
    ctl.on_moment = None
    return ctl, victim, report, took


@pytest.mark.parametrize("moment,victim_rank", [("admit", 0), ("form", 1)],
                         ids=["the-state-source-dies-while-a-joiner-copies-it", "another-member-dies-while-the-group-forms"])
def test_a_member_dying_while_a_replacement_joins(ray_nodes, reference, tmp_path, moment, victim_rank):  # noqa: F811
    ctl, victim, report, took = grow_with_a_kill(ray_nodes, tmp_path, moment, victim_rank)
    assert took < 5, f"the admission stalled {took:.1f} s (group timeout {ctl.options.group_timeout_s} s)"
    assert ctl.world == 2 and "default/w9" in ctl.group.members and victim not in ctl.group.members
    assert ctl.take_lost() == [victim], "the dead member is handed to the bridge for a replacement"
    ctl.run(ctl.step_done + 3)
    (rec,) = ctl.history.recoveries
    assert rec.lost == (victim,) and rec.redone <= 1 and rec.detection_s >= 0 and rec.total_s >= rec.seconds
    assert_follows(ctl.history.losses, reference, ctl.step_done)
    ctl.close()


def test_a_member_dying_at_a_checkpoint(ray_nodes, reference, tmp_path):  # noqa: F811
    nodes = ray_nodes.add(3)
    ctl = controller(tmp_path)  # checkpoint every 5 steps
    ctl.start(slices(nodes))
    ctl.on_moment = KillAt(ray_nodes, "checkpoint", nodes[0])
    ctl.run(12)
    assert ctl.on_moment.at, "the kill happened"
    assert ctl.world == 2 and ctl.take_lost() == ["default/w0"]
    (rec,) = ctl.history.recoveries
    assert rec.redone <= 1
    assert_follows(ctl.history.losses, reference, 12)
    ctl.close()


def test_a_member_dying_while_the_job_shrinks(ray_nodes, reference, tmp_path):  # noqa: F811
    nodes = ray_nodes.add(3)
    ctl = controller(tmp_path)
    ctl.start(slices(nodes))
    ctl.run(4)
    ctl.on_moment = KillAt(ray_nodes, "shrink", nodes[1])
    t0 = time.monotonic()
    ctl.remove("default/w0")  # a pod deleted; while the survivors regroup, another one's node dies
    took = time.monotonic() - t0
    ctl.on_moment = None
    assert took < 5, f"the shrink stalled {took:.1f} s"
    assert ctl.world == 1 and sorted(ctl.take_lost()) == ["default/w0", "default/w1"]
    ctl.run(8)
    assert len(ctl.history.recoveries) == 1 and ctl.history.recoveries[0].lost == ("default/w1",)
    assert_follows(ctl.history.losses, reference, 8)
    ctl.close()
