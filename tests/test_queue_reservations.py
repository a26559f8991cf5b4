"""Reservations with backfill in the server (extender/queue_reservations.py, issue 14 items 3 and 4).

Against the real Extender fed as the watch feeds it: pods with creationTimestamp (their waits),
bound pods with status.startTime and tessera.dev/expected-runtime (their expected ends).

The cluster: nodes a and b, 2 GPUs each. On a, x (ends in 30 min) and y (no declared run time: stays);
on b, z (ends in 1 h) holds GPU 0 and GPU 1 is free. `big` asks 2 GPUs and has waited 20 min, past its
10 min bound: it can start on b in 1 h, never on a, so it reserves b.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from extender.core.backfill import BackfillSettings
from extender.http.admin import create_admin_app
from extender.http.app import create_app
from extender.service import BindError, Extender
from extender.translate.objects import (
    EXPECTED_RUNTIME_ANNOTATION,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    node_inventory,
    pod_info,
)
from testing.kube_objects import k8s_node, k8s_pod
from testing.ports import both

from .test_contract_annotations import refused
from .test_service import Clock

T0 = 1_800_000_000.0  # the wall clock at the start of each test (epoch s)
SETTINGS = BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.5)
BOUND_AT = T0 - 600  # when the running pods started


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pending(name, gpus=None, created=T0 - 1200, runtime=None, ann=None, cpu="1"):
    annotations = dict(ann or {})
    if runtime:
        annotations[EXPECTED_RUNTIME_ANNOTATION] = runtime
    pod = k8s_pod(name, gpus=gpus, ann=annotations, cpu=cpu)
    pod["metadata"]["creationTimestamp"] = iso(created)
    return pod


def running(name, node, gpus, runtime=None):
    pod = pending(name, gpus=len(gpus), created=BOUND_AT - 60, runtime=runtime)
    pod["metadata"]["annotations"]["tessera.dev/gpu-assignment"] = (
        f'{{"node": "{node}", "gpus": {list(gpus)}, "milli": 1000}}')
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "startTime": iso(BOUND_AT)}
    return pod


def world(settings=SETTINGS, nodes=("a", "b"), clock=None, big_created=T0 - 1200):
    """(extender, wall clock) with the cluster of the module docstring, `big` watched (unless big_created is None)."""
    if clock is None:
        clock = Clock()
        clock.now = T0
    ext = Extender(backfill=settings, wall_clock=clock)
    for n in nodes:
        ext.upsert_node(node_inventory(k8s_node(n, gpus=2)))
    for pod in (running("x", "a", [0], runtime="1200"), running("y", "a", [1]), running("z", "b", [0], runtime="70m")):
        ext.upsert_pod(pod_info(pod))
    if big_created is not None:
        ext.upsert_pod(pod_info(pending("big", gpus=2, created=big_created)))
    ext.mark_synced()
    return ext, clock


def filtered(ext, pod, nodes=("a", "b")):
    return ext.filter(pod_info(pod), list(nodes))


def test_a_pod_past_its_bound_that_fits_nowhere_reserves_at_filter_the_node_that_frees_soonest():
    ext, clock = world(big_created=T0 - 598)
    filtered(ext, pending("big", gpus=2))  # 598 s: within its bound (and the sweep this verb ran saw the same)
    assert len(ext.queue_reservations.backfill) == 0
    clock.now = T0 + 3  # past the bound; the next sweep is 5 s after the last, so filter is what reserves
    assert filtered(ext, pending("big", gpus=2)).passed == []
    (r,) = ext.queue_reservations.backfill.by_pod.values()
    assert (r.pod, r.node, r.made_s, r.start_s, r.expires_s) == ("ml/big", "b", T0 + 3, BOUND_AT + 4200, BOUND_AT + 4500)


def test_a_pod_within_its_bound_or_not_watched_reserves_nothing():
    ext, _ = world(big_created=None)
    filtered(ext, pending("young", gpus=2, created=T0 - 60))  # not watched, and within its bound
    ext.upsert_pod(pod_info(pending("young", gpus=2, created=T0 - 60)))
    filtered(ext, pending("young", gpus=2, created=T0 - 60))
    assert len(ext.queue_reservations.backfill) == 0
    # a verb's posted pod is never believed for its age: only the watched pod's creationTimestamp counts
    ext.filter(pod_info(pending("young", gpus=2, created=T0 - 99_999)), ["a", "b"])
    assert len(ext.queue_reservations.backfill) == 0


def test_the_reserved_node_refuses_a_pod_that_would_delay_it_and_admits_one_that_ends_first_or_fits_beside():
    ext, _ = world()
    filtered(ext, pending("big", gpus=2))
    refused = filtered(ext, pending("long", gpus=1))  # no declared run: assumed to stay, would take big's GPU
    assert refused.passed == [] and "node reserved for ml/big" in refused.unresolvable["b"]
    assert filtered(ext, pending("short", gpus=1, runtime="30m")).passed == ["b"]  # ends before big starts
    assert filtered(ext, pending("late", gpus=1, runtime="2h")).passed == []  # ends after
    assert filtered(ext, pending("cpu", cpu="4")).passed == ["a", "b"]  # no GPU: fits beside the reservation


def test_bind_respects_the_reservation_between_filter_and_bind():
    ext, _ = world(big_created=None)
    ext.upsert_pod(pod_info(pending("long", gpus=1)))
    assert ext.filter(pod_info(pending("long", gpus=1)), ["b"]).passed == ["b"]  # nothing reserved yet
    ext.upsert_pod(pod_info(pending("big", gpus=2)))
    filtered(ext, pending("big", gpus=2))  # big reserves b before kube-scheduler binds long
    with pytest.raises(BindError, match="reserved for ml/big"):
        ext.reserve("uid-long", "ml/long", "b")
    ext.upsert_pod(pod_info(pending("short", gpus=1, runtime="30m")))
    assert ext.reserve("uid-short", "ml/short", "b")[0].gpus == (1,)


def test_the_reserved_pod_passes_only_whole_and_the_reservation_ends_when_it_is_placed():
    ext, clock = world()
    filtered(ext, pending("big", gpus=2))
    ext.delete_pod("uid-x")  # a frees, but y stays: one GPU is not two (never admitted piecewise)
    assert filtered(ext, pending("big", gpus=2)).passed == []
    clock.now = BOUND_AT + 4200
    ext.delete_pod("uid-z")
    assert filtered(ext, pending("big", gpus=2)).passed == ["b"]
    assignment, _ = ext.reserve("uid-big", "ml/big", "b")
    assert assignment.gpus == (0, 1)
    ext.expire_reservations()
    assert len(ext.queue_reservations.backfill) == 0


def test_a_reservation_ends_when_its_pod_is_deleted():
    ext, _ = world()
    filtered(ext, pending("big", gpus=2))
    ext.delete_pod("uid-big")
    assert len(ext.queue_reservations.backfill) == 0
    assert filtered(ext, pending("long", gpus=1)).passed == ["b"]


def test_a_reservation_expires_its_grace_after_the_expected_start():
    ext, clock = world()
    filtered(ext, pending("big", gpus=2))
    first = ext.queue_reservations.backfill.by_pod["ml/big"]
    clock.now = BOUND_AT + 4200 + 299
    ext.expire_reservations()
    assert ext.queue_reservations.backfill.by_pod["ml/big"] is first
    clock.now = BOUND_AT + 4200 + 300  # z overran its declared run: the reservation made at T0 ends
    gone = ext.queue_reservations.backfill.expire(clock.now)
    assert gone == [first] and len(ext.queue_reservations.backfill) == 0
    clock.now += 5
    # z's end is unknown now (it overran by the grace): b is no longer the node that frees soonest, nor is any
    assert filtered(ext, pending("long", gpus=1)).passed == ["b"]
    assert len(ext.queue_reservations.backfill) == 0 and ext.queue_reservations.expected_end("ml/z") is None


def test_reservations_never_hold_more_than_their_share():
    # 4 nodes of 2 GPUs, share 0.25: one 2-GPU reservation fills the cap, a second due pod gets none
    ext, _ = world(BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.25), nodes=("a", "b", "c", "d"))
    for name, node in (("c0", "c"), ("d0", "d")):
        ext.upsert_pod(pod_info(running(name, node, [0], runtime="2h")))
    ext.upsert_pod(pod_info(pending("big2", gpus=2)))
    filtered(ext, pending("big", gpus=2), ext.cluster.by_name)
    filtered(ext, pending("big2", gpus=2), ext.cluster.by_name)
    assert list(ext.queue_reservations.backfill.by_pod) == ["ml/big"]
    assert ext.queue_reservations.held_share() == 0.25


def test_a_gang_member_never_reserves_and_holds_nothing():
    ext, _ = world()
    gang = {GANG_NAME_ANNOTATION: "job", GANG_SIZE_ANNOTATION: "2"}
    for name in ("g0", "g1"):
        ext.upsert_pod(pod_info(pending(name, gpus=2, ann=gang)))
    for name in ("g0", "g1"):
        assert filtered(ext, pending(name, gpus=2, ann=gang)).passed == []
    ext.expire_reservations()  # the sweep skips gangs too
    assert "ml/g0" not in ext.queue_reservations.backfill.by_pod and "ml/g1" not in ext.queue_reservations.backfill.by_pod


def test_a_pod_kube_scheduler_never_sends_to_filter_reserves_at_the_sweep():
    ext, _ = world()
    ext.expire_reservations()  # the cache's 5 s tick (and every verb) runs the sweep
    assert ext.queue_reservations.backfill.by_pod["ml/big"].node == "b"


def test_a_restarted_extender_fed_the_same_watch_reaches_the_same_reservation():
    ext, clock = world()
    filtered(ext, pending("big", gpus=2))
    before = ext.queue_reservations.backfill.by_pod["ml/big"]
    clock.now = T0 + 900  # the new process starts 15 min later: waits and starts come from the API's timestamps
    fresh, _ = world(clock=clock)
    fresh.expire_reservations()
    after = fresh.queue_reservations.backfill.by_pod["ml/big"]
    assert (after.node, after.start_s, after.expires_s) == (before.node, before.start_s, before.expires_s)


def test_off_by_default_nothing_reserves():
    clock = Clock()
    clock.now = T0
    ext = Extender(wall_clock=clock)
    for n in ("a", "b"):
        ext.upsert_node(node_inventory(k8s_node(n, gpus=2)))
    for pod in (running("y", "a", [0, 1]), running("z", "b", [0], runtime="70m"), pending("big", gpus=2)):
        ext.upsert_pod(pod_info(pod))
    ext.mark_synced()
    ext.expire_reservations()
    assert filtered(ext, pending("big", gpus=2)).passed == [] and len(ext.queue_reservations.backfill) == 0
    assert filtered(ext, pending("long", gpus=1)).passed == ["b"]


def test_inspect_metrics_and_the_pending_reason_show_the_reservation():
    ext, _ = world()
    filtered(ext, pending("big", gpus=2))
    registry = both(create_app(ext, binder=None)).extensions["tessera"]["registry"]
    client = create_admin_app(ext, registry).test_client()
    (listed,) = client.get("/inspect").get_json()["queue_reservations"]
    assert listed == {"pod": "ml/big", "node": "b", "since": iso(T0), "expected_start": iso(BOUND_AT + 4200),
                      "expires": iso(BOUND_AT + 4500), "gpus": 2,
                      "waits_for": [{"pod": "ml/z", "expected_end": iso(BOUND_AT + 4200)}], "waits_for_more": 0}
    assert client.get("/inspect?summary=1").get_json()["queue_reservations"] == [listed]
    why = client.get("/inspect?pod=ml/big").get_json()["why"]
    assert f"node b is reserved for it from {iso(BOUND_AT + 4200)}" in why and "when ml/z is expected to end" in why
    metrics = client.get("/metrics").get_data(as_text=True)
    assert "tessera_queue_reservations 1.0" in metrics and "tessera_queue_reserved_gpu_share 0.5" in metrics


@pytest.mark.parametrize("value, words", [
    ("-5", "must be a duration"), ("0", "must be 1 s to"), ("31d", "30 days"), ("1e9", "must be a duration"),
    ("1.5h", "must be a duration"), ("2H", "must be a duration"), (" 90m", "must be a duration"), ("", "must be a duration"),
    ("²", "must be a duration"), ("9" * 5000, "must be a duration"), ("1h 30m", "must be a duration"),
    ("30m1h", "must be a duration"), ("99999999999999999999s", "must be a duration"),
])
def test_a_hostile_expected_runtime_is_refused_at_filter_in_words(value, words):
    pod = pending("p", gpus=1, runtime=None, ann={EXPECTED_RUNTIME_ANNOTATION: value})
    error = refused(pod)
    assert error.startswith("tessera: ") and EXPECTED_RUNTIME_ANNOTATION in error and words in error
    assert len(error) < 400  # a 5,000-character value is not echoed back


@pytest.mark.parametrize("value, seconds", [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("3600s", 3600), ("3600", 3600),
                                            ("30d", 30 * 86400), ("1", 1)])
def test_expected_runtimes_people_write_are_read(value, seconds):
    assert refused(pending("p", gpus=1, runtime=value)) == ""
    assert pod_info(pending("p", gpus=1, runtime=value)).expected_runtime_s == seconds


def test_a_bound_pod_with_an_unreadable_runtime_keeps_its_gpus_and_counts_as_staying():
    pod = running("q", "a", [0])
    pod["metadata"]["annotations"][EXPECTED_RUNTIME_ANNOTATION] = "forever"
    info = pod_info(pod)
    assert info.node == "a" and info.assignment is not None and info.expected_runtime_s is None


def test_the_pending_reason_says_which_node_is_reserved_and_what_it_waits_for():
    from extender.kube.waiting import WaitingReasons

    from .test_bind_events import Offers

    ext, _ = world()
    ext.expire_reservations()
    message = WaitingReasons(ext, Offers()).judge(pod_info(pending("big", gpus=2)), "1")
    assert message.startswith("on GPUs, no node of 2 fits this pod")
    assert f"node b is reserved for it from {iso(BOUND_AT + 4200)} (until {iso(BOUND_AT + 4500)})" in message
    assert message.endswith("when ml/z is expected to end")
    # a pod the reservation refuses is told why in the same words filter gives
    other = WaitingReasons(ext, Offers()).judge(pod_info(pending("long", gpus=1)), "1")
    assert "node reserved for ml/big (2 GPUs)" in other


def test_a_pod_that_fitted_its_reserved_node_and_was_not_bound_there_never_reserves_again():
    """kube-scheduler's own checks (a nodeSelector on another label) can keep a pod off a node Tessera sees it fit:
    re-reserving it at every expiry would restrict that node for as long as the pod waits."""
    ext, clock = world()
    ext.expire_reservations()
    ext.delete_pod("uid-z")  # b frees: big fits it whole, and kube-scheduler never binds it there
    clock.now = BOUND_AT + 4200 + 300
    ext.expire_reservations()
    assert ext.queue_reservations.shunned == {"ml/big"}
    ext.upsert_pod(pod_info(running("w", "b", [0], runtime="1h")))  # b is taken again: big fits nowhere
    clock.now += 60
    ext.expire_reservations()
    assert len(ext.queue_reservations.backfill) == 0
    ext.delete_pod("uid-big")
    assert ext.queue_reservations.shunned == set()


def test_the_snapshot_shows_a_reservation_made_by_filter_and_a_verb_for_an_unwatched_pod_makes_none():
    ext, _ = world(big_created=None)
    before = ext.snapshot()
    filtered(ext, pending("big", gpus=2, created=T0 - 99_999))  # posted, never watched: no reservation
    assert ext.snapshot() == before
    ext.upsert_pod(pod_info(pending("big", gpus=2)))
    filtered(ext, pending("big", gpus=2))
    assert ext.snapshot().placement != before.placement and ext.snapshot().queue_reserved == {("ml/big", "b")}


def test_tessera_inspect_prints_the_reservation():
    from extender.cli.inspect import render_summary
    from extender.http.inspect import summary

    ext, _ = world()
    ext.expire_reservations()
    text = render_summary(summary(ext))
    assert f"node b reserved for ml/big (2 GPUs) from {iso(BOUND_AT + 4200)} until {iso(BOUND_AT + 4500)}, " \
           "when ml/z should end" in text


def test_a_drain_pool_node_takes_only_pods_that_declare_a_short_run_or_ask_the_reserving_class():
    pool = BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.5, drain_pool=1, drain_pool_run_s=3600.0)
    ext, _ = world(settings=pool, nodes=("c", "a", "b"), big_created=None)  # c: the first node, empty
    assert ext.queue_reservations.backfill.pool == {"c"}
    refused = filtered(ext, pending("long", gpus=1), nodes=("c", "b"))
    assert refused.passed == ["b"] and "node kept drainable for pods of 2 GPUs" in refused.unresolvable["c"]
    assert filtered(ext, pending("short", gpus=1, runtime="30m"), nodes=("c", "b")).passed == ["c", "b"]
    assert filtered(ext, pending("big", gpus=2), nodes=("c",)).passed == ["c"]  # the class the pool is kept for
    ext.upsert_pod(pod_info(pending("long", gpus=1)))
    with pytest.raises(BindError, match="kept drainable"):
        ext.reserve("uid-long", "ml/long", "c")


def test_the_floating_pool_keeps_the_last_drainable_big_node_from_pods_that_fit_elsewhere():
    """c: 64 cores, the only node a 2-GPU pod asking 40 cores fits, empty (so it drains); a and b: 32 cores, busy
    with runs longer than the bound. With keep 1, c is the last drainable node of its kind."""
    keep = BackfillSettings(wait_bound_s={2: 600.0}, grace_s=300.0, max_share=0.5, drain_keep=1, drain_pool_run_s=600.0)
    ext, _ = world(settings=keep, big_created=None)
    ext.upsert_node(node_inventory(k8s_node("c", gpus=2, cpu="64", memory="256Gi")))
    assert set(ext.queue_reservations.backfill.guarded(T0)) == {"c"}
    long = filtered(ext, pending("long", gpus=1), nodes=("c", "b"))
    assert long.passed == ["b"] and "node kept drainable for pods of 2 GPUs" in long.unresolvable["c"]
    assert filtered(ext, pending("short", gpus=1, runtime="5m"), nodes=("c", "b")).passed == ["c", "b"]
    # wide fits a and b too, but neither takes it within the bound (y has no end, z ends in 70 min): c stays open
    assert filtered(ext, pending("wide", gpus=2), nodes=("c",)).passed == ["c"]
    assert filtered(ext, pending("tall", gpus=2, cpu="40"), nodes=("c",)).passed == ["c"]  # only c can hold it
    ext.upsert_pod(pod_info(pending("long", gpus=1)))
    with pytest.raises(BindError, match="kept drainable"):
        ext.reserve("uid-long", "ml/long", "c")
    ext.upsert_node(node_inventory(k8s_node("d", gpus=2)))  # an empty 32-core node: wide has a node of its own now
    assert filtered(ext, pending("wide", gpus=2), nodes=("c",)).passed == []


def test_a_run_time_edited_after_the_pod_overran_draws_no_reservation_back():
    """Annotations are mutable: a bound pod's owner bumped expected-runtime after each overrun, and the waiting pod
    reserved that node again, and the node refused other pods, every grace period. The run time it declared when
    first seen bound is the one that counts."""
    ext, clock = world()
    qr = ext.queue_reservations
    filtered(ext, pending("big", gpus=2))
    first = qr.backfill.by_pod["ml/big"]
    clock.now = first.expires_s + 5  # z overran its declared end by the grace: its end counts as unknown
    ext.expire_reservations()
    assert qr.expected_end("ml/z") is None
    ext.upsert_pod(pod_info(running("z", "b", [0], runtime=str(int(clock.now - BOUND_AT + 60)))))  # "ends in 60 s"
    assert qr.expected_end("ml/z") is None, "the edit is not taken"
    clock.now += 5
    filtered(ext, pending("big", gpus=2))
    again = qr.backfill.by_pod.get("ml/big")
    assert again is None or again.node != "b"
    assert "b" in filtered(ext, pending("other", gpus=1)).passed


def test_a_deadline_is_a_declared_run_for_reservations_and_the_shorter_of_the_two_counts():
    ext, _ = world()
    filtered(ext, pending("big", gpus=2))  # reserves b (z ends at BOUND_AT + 70 min)
    short = pending("short", gpus=1)
    short["spec"]["activeDeadlineSeconds"] = 1800  # the kubelet stops it by then: it ends before big starts
    assert filtered(ext, short).passed == ["b"]
    late = pending("late", gpus=1, runtime="20m")
    late["spec"]["activeDeadlineSeconds"] = 7200  # the hint is shorter than the deadline: the hint counts
    assert filtered(ext, late).passed == ["b"]
    both_long = pending("long", gpus=1, runtime="3h")
    both_long["spec"]["activeDeadlineSeconds"] = 7200
    assert filtered(ext, both_long).passed == []
    bound = running("w", "b", [1])
    bound["spec"]["activeDeadlineSeconds"] = 600
    ext.upsert_pod(pod_info(bound))
    assert ext.queue_reservations.expected_end("ml/w") == BOUND_AT + 600  # a running pod's deadline is its end
