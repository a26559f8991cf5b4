"""Drain leases (core/backfill.py `drain_lease`, queue_reservations.py, kube/preemptor.py): a pod that no other node
takes may use a node the drain pool keeps for the largest pods, for the pool's bound at a time: at the bound Tessera
deletes it if a reservation holds the node, and renews the lease otherwise.

The world is test_queue_reservations.py's: nodes a and b of 2 GPUs, busy, and c, empty, the fixed pool's one node
(kept for 2-GPU pods; other pods must declare a run of at most an hour). The pods come from a Job (a controller
ownerReference), as the field makes them; the API is the preemptor tests' recorder of calls.
"""

from __future__ import annotations

import pytest

from extender.core.backfill import BackfillSettings
from extender.http.admin import create_admin_app
from extender.http.app import create_app
from extender.kube.preemptor import LEASE_ENDED_REASON
from extender.service import BindError
from extender.translate.objects import SAFE_TO_EVICT_ANNOTATION, pod_info
from testing.ports import both

from .test_preemptor import make
from .test_queue_reservations import T0, filtered, iso, pending, running, world

POOL = BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.5, drain_pool=1, drain_pool_run_s=3600.0,
                        drain_lease=True)


def from_job(pod: dict, job: str = "train") -> dict:
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"uid-job-{job}",
                                           "controller": True, "blockOwnerDeletion": True}]
    return pod


def leased_world():
    ext, clock = world(settings=POOL, nodes=("c", "a", "b"), big_created=None)
    assert ext.queue_reservations.backfill.pool == {"c"}
    return ext, clock


def reserve_c(ext, now: float):
    """A 2-GPU pod past its bound reserves c (b frees as soon; the test wants c's lease to be what it waits for)."""
    big = ext.placer.request_for(pod_info(pending("big", gpus=2)).request)
    r = ext.queue_reservations.backfill.reserve(big, 1200.0, now, allowed=lambda name: name == "c")
    assert r is not None and r.node == "c"
    return r


def test_a_kept_node_is_lent_only_when_no_other_node_takes_the_pod():
    ext, _ = leased_world()
    long = from_job(pending("long", gpus=1))
    # b has a free GPU: the pool keeps c from the pod, as without leases
    both = filtered(ext, long, nodes=("c", "b"))
    assert both.passed == ["b"] and "kept drainable" in both.unresolvable["c"]
    # kube-scheduler's own filters left c alone (b full to it, say): c is lent
    assert filtered(ext, long, nodes=("c",)).passed == ["c"]


@pytest.mark.parametrize("why, pod", [
    ("a bare pod: deleted, it would be gone", pending("bare", gpus=1)),
    ("its owner said not to evict it", from_job(pending("kept", gpus=1, ann={SAFE_TO_EVICT_ANNOTATION: "False"}))),
])
def test_a_pod_no_controller_would_replace_is_never_lent_a_kept_node(why, pod):
    ext, _ = leased_world()
    out = filtered(ext, pod, nodes=("c",))
    assert out.passed == [] and "kept drainable" in out.unresolvable["c"], why


def test_leases_off_lend_nothing():
    ext, _ = world(settings=BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.5, drain_pool=1),
                   nodes=("c", "a", "b"), big_created=None)
    assert filtered(ext, from_job(pending("long", gpus=1)), nodes=("c",)).passed == []


def test_a_lent_node_counts_the_pod_gone_at_the_bound_and_the_pod_is_deleted_there_once_a_reservation_waits():
    ext, clock = leased_world()
    long = from_job(pending("long", gpus=1))
    ext.upsert_pod(pod_info(long))
    assert filtered(ext, long, nodes=("c",)).passed == ["c"]
    ext.reserve("uid-long", "ml/long", "c")
    q = ext.queue_reservations
    assert q.expected_end("ml/long") == T0 + 3600  # it declared nothing: the lease is its only known end
    assert "c" in q.backfill.pool  # still kept: every pod there ends within the bound
    registry = both(create_app(ext, binder=None)).extensions["tessera"]["registry"]
    admin = create_admin_app(ext, registry).test_client()
    assert admin.get("/inspect").get_json()["drain_leases"] == [{"pod": "ml/long", "node": "c", "ends": iso(T0 + 3600)}]
    assert "tessera_drain_leases 1.0" in admin.get("/metrics").get_data(as_text=True)
    from extender.cli.inspect import render_summary
    from extender.http.inspect import summary

    assert f"ml/long runs on c on a drain lease: deleted at {iso(T0 + 3600)} if still there" in render_summary(summary(ext))
    p, api, events = make(ext)
    clock.now = T0 + 3599
    p.step()
    assert api.deleted == []
    # at the bound nobody waits for c: the lease is renewed, the pod runs on, and its node still drains by the bound
    clock.now = T0 + 3600
    p.step()
    assert api.deleted == [] and p.leases_ended == 0 and q.leases_renewed == 1
    assert q.expected_end("ml/long") == T0 + 7200 and "c" in q.backfill.pool
    assert admin.get("/inspect").get_json()["drain_leases"] == [{"pod": "ml/long", "node": "c", "ends": iso(T0 + 7200)}]
    assert "tessera_drain_leases_renewed_total 1.0" in admin.get("/metrics").get_data(as_text=True)
    # a 2-GPU pod reserves c (the node the pool keeps for it): at the renewed lease's end the leased pod is deleted
    r = reserve_c(ext, clock.now)
    assert r.start_s == T0 + 7200
    clock.now = T0 + 7200
    p.step()
    assert api.deleted == [("ml", "long", "uid-long")] and p.leases_ended == 1 and q.leases_renewed == 1
    assert "tessera_drain_leases_ended_total 1.0" in admin.get("/metrics").get_data(as_text=True)
    assert [e for e in events.offered if e[6] == LEASE_ENDED_REASON and "drain lease on c" in e[5]]
    p.step()
    assert len(api.deleted) == 1  # asked once
    # its Job's next pod is not lent the node again: its runs outlast the bound
    again = from_job(pending("long-2", gpus=1))
    assert filtered(ext, again, nodes=("c",)).passed == []
    # another Job's pod still is, once the reservation has gone (while it holds c, a 1 h lease would delay it)
    assert filtered(ext, from_job(pending("other", gpus=1), job="eval"), nodes=("c",)).passed == []
    q.backfill.placed(r.pod)
    assert filtered(ext, from_job(pending("other", gpus=1), job="eval"), nodes=("c",)).passed == ["c"]


def test_a_restarted_extender_forgets_its_leases_and_deletes_no_pod_it_lent_before():
    """Leases live in memory (queue_reservations.py): after a restart (a new leader, a rollout) the leased pod is what
    the watch shows, a bound pod that declared nothing, of unknown end. Tessera then has no record that it lent the
    node, so nothing is deleted at the old lease's end; nor can a big pod reserve that node while the pod stays (no
    end is known for it to wait for): the big pod waits for the run to end by itself, as without leases."""
    ext, clock = leased_world()
    long = from_job(pending("long", gpus=1))
    ext.upsert_pod(pod_info(long))
    assert filtered(ext, long, nodes=("c",)).passed == ["c"]
    ext.reserve("uid-long", "ml/long", "c")
    assert ext.queue_reservations.expected_end("ml/long") == T0 + 3600
    restarted, clock = leased_world()  # the new process lists the same cluster: the pod bound on c, running
    restarted.upsert_pod(pod_info(from_job(running("long", "c", [0]))))
    q = restarted.queue_reservations
    assert q.leases == {} and q.expected_end("ml/long") is None
    p, api, _ = make(restarted)
    big = restarted.placer.request_for(pod_info(pending("big", gpus=2)).request)
    assert q.backfill.reserve(big, 1200.0, clock.now, allowed=lambda name: name == "c") is None
    for at in (T0 + 3600, T0 + 7200, T0 + 86_400):
        clock.now = at
        p.step()
    assert api.deleted == [] and p.leases_ended == 0 and q.leases_renewed == 0


def test_a_pod_its_disruption_budget_protects_keeps_running_past_its_lease_and_is_asked_again_later():
    ext, clock = leased_world()
    long = from_job(pending("long", gpus=1))
    long["metadata"]["labels"] = {"app": "train"}
    ext.upsert_pod(pod_info(long))
    filtered(ext, long, nodes=("c",))
    ext.reserve("uid-long", "ml/long", "c")
    from .test_preemptor import Api
    budget = {"spec": {"selector": {"matchLabels": {"app": "train"}}}, "status": {"disruptionsAllowed": 0}}
    api = Api(labels={"ml/long": {"app": "train"}}, budgets={"ml": [budget]})
    p, _, _ = make(ext, api=api)
    reserve_c(ext, clock.now)
    clock.now = T0 + 3600
    p.step()
    assert api.deleted == [] and p.leases_ended == 0
    clock.now = T0 + 3600 + 10
    p.step()
    assert api.budget_lists == 1  # not asked again within the retry interval
    # past the grace its end is unknown again: the node no longer counts as draining by the bound
    clock.now = T0 + 3600 + 301
    assert ext.queue_reservations.expected_end("ml/long") is None


def test_a_bind_onto_a_kept_node_without_a_lease_is_still_refused():
    ext, _ = leased_world()
    bare = pending("bare", gpus=1)
    ext.upsert_pod(pod_info(bare))
    with pytest.raises(BindError, match="kept drainable"):
        ext.reserve("uid-bare", "ml/bare", "c")
    assert ext.queue_reservations.leases == {}


def test_a_forged_controller_reference_only_puts_the_tenants_own_pod_at_risk():
    """A tenant can write a controller ownerReference on a bare pod: the pod is then lent the node and deleted at the
    bound, and nothing makes a new one. No other pod is touched."""
    ext, clock = leased_world()
    forged = from_job(pending("forged", gpus=1), job="nonexistent")
    ext.upsert_pod(pod_info(forged))
    filtered(ext, forged, nodes=("c",))
    ext.reserve("uid-forged", "ml/forged", "c")
    p, api, _ = make(ext)
    reserve_c(ext, clock.now)
    clock.now = T0 + 3600
    p.step()
    assert api.deleted == [("ml", "forged", "uid-forged")]


# --- time mode: the same rule, with the kubelet's and the controller's part played by the replay ---------------------

def _replay(third_run: float, lease: bool, big: bool = False, late: bool = False):
    """Nodes a (the fixed pool's, kept for 2-GPU pods; 100 s bound) and b, 2 GPUs each. Two 1000 s 1-GPU pods fill b;
    a third 1-GPU pod declaring nothing arrives at t=2; with `big`, a 2-GPU pod at t=3; with `late`, a 10 s 1-GPU pod
    at t=1100 (the replay runs until the last pod has arrived and none waits: this one keeps it going past t=1002)."""
    from extender.core.model import NodeSpec
    from extender.sim.declarations import Declaration
    from extender.sim.timemode import replay_time
    from extender.sim.trace import TracePod

    from .conftest import pod

    nodes = [NodeSpec("a", 64_000, 262_144, 2, "T4"), NodeSpec("b", 64_000, 262_144, 2, "T4")]
    timeline = [(0.0, 1000.0), (1.0, 1000.0), (2.0, third_run)] + ([(3.0, 10.0)] if big else [])
    pods = [TracePod(pod(f"p{i}"), t, d) for i, (t, d) in enumerate(timeline[:3])]
    pods += [TracePod(pod("big", gpus=2), 3.0, 10.0)] if big else []
    drawn = [Declaration(1000.0, 1000.0), Declaration(1000.0, 1000.0), Declaration(None, third_run)]
    drawn += [Declaration(10.0, 10.0)] if big else []
    if late:
        timeline.append((1100.0, 10.0))
        pods.append(TracePod(pod("late"), 1100.0, 10.0))
        drawn.append(Declaration(10.0, 10.0))
    settings = BackfillSettings(wait_bound_s={2: 0.0}, max_share=1.0, drain_pool=1, drain_pool_run_s=100.0,
                                drain_lease=lease)
    return replay_time(nodes, pods, "tessera", "ideal", timeline=timeline, backfill=settings,
                       declarations="users", drawn=drawn)


def test_in_time_mode_a_silent_short_pod_runs_on_a_lent_node_instead_of_waiting_for_a_long_run():
    without, lent = _replay(50.0, lease=False), _replay(50.0, lease=True)
    assert without.wait_max_s >= 990.0  # it waited for b: the pool keeps a from a pod that declares nothing
    assert lent.wait_max_s == 0.0 and lent.leases_ended == 0  # it ran on a and ended within the lease


def test_in_time_mode_a_lease_ends_at_the_bound_the_big_pod_starts_there_and_the_lost_run_counts_as_wait():
    run = _replay(1000.0, lease=True, big=True)
    assert run.leases_ended == 1 and run.lease_lost_gpu_h == pytest.approx(100.0 / 3600)
    assert run.classes["2gpu"].max_s <= 100.0  # started when the lease ended (t=102), not when the run would have (1002)
    # the third pod ran 100 s for nothing, then waited for b like a pod never leased: its wait counts from its arrival
    assert run.classes["1gpu"].max_s >= 990.0
    assert run.pods == 4 and run.never_fit == 0


def test_in_time_mode_a_lease_nobody_waits_for_is_renewed_and_its_long_run_finishes():
    """No 2-GPU pod comes, so no reservation ever holds a: the silent 1000 s pod's 100 s lease is renewed nine times
    (at 102, 202, ..., 902; the tenth lease outlasts the run) and its run is never cut."""
    run = _replay(1000.0, lease=True, late=True)
    assert run.leases_ended == 0 and run.leases_renewed == 9 and run.lease_lost_gpu_h == 0.0
    assert run.wait_max_s == 0.0  # it ran on a from its arrival


def test_a_lease_without_a_drain_pool_or_with_reservations_off_is_refused_in_words():
    from extender.cli import build_parser
    from extender.cli.serve import backfill_settings

    def settings(*flags):
        return backfill_settings(build_parser().parse_args(["serve", *flags]))

    with pytest.raises(ValueError, match="--drain-lease on needs a drain pool"):
        settings("--reservations", "on", "--drain-lease", "on")
    with pytest.raises(ValueError, match="--drain-lease shapes reservations, which are off"):
        settings("--drain-lease", "on")
    assert settings("--reservations", "on", "--drain-keep", "16", "--drain-lease", "on").drain_lease
    assert not settings("--reservations", "on", "--drain-keep", "16").drain_lease
    with pytest.raises(ValueError, match="drain leases need a drain pool"):
        BackfillSettings(drain_lease=True)
