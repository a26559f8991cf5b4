"""Gang admission (extender/gangs.py) through the Extender, as kube-scheduler and the watch drive it.

Members arrive one at a time, as a Job or a training operator creates them; each is filtered by
kube-scheduler as it comes. A gang is admitted in the filter call of the member that completes it:
every member then holds its GPUs, kube-scheduler binds that member, Tessera binds the rest
(`gang_round`, kube/gang_binder.py). A real Extender and real placement; only the API's Binding
endpoint is a fake (tests.test_verbs_hostile.Binder).
"""

from __future__ import annotations

import pytest

from extender.binding import BindResult, BindTarget, bind_pod
from extender.gangs import BACKOFF_S, DEFAULT_TIMEOUT_S, MAX_KINDS, PEER_HOLD_S, TRIGGER_GRACE_S
from extender.kube.gang_binder import GangBinder
from extender.service import BindError, Extender
from extender.state import PodGroup
from extender.translate.objects import pod_info
from tests.test_verbs_hostile import Binder, cluster, counting, kpod, node


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def world(*nodes, gpus=4):
    clock = Clock()
    ext = cluster(*(node(n, gpus=gpus) for n in nodes), ext=Extender(clock=clock))
    ext.clock = clock
    return ext


def member(name, gang, size, gpus=1, **kw):
    return kpod(name, gpus=gpus, gang=(gang, size), **kw)


def grouped(name, group, gpus=1, **kw):
    pod = kpod(name, gpus=gpus, **kw)
    pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
    return pod


def arrive(ext, pod, names=("a", "b")):
    """What the field does: the watch delivers the new pod, then kube-scheduler filters it."""
    ext.upsert_pod(pod_info(pod))
    return ext.filter(pod_info(pod), list(names))


def held(ext):
    return {k: a.node for k, a in ext.cluster.assignments.items()}


def bind_rest(ext, binder=None):
    """What the gang binder does in one round, inline: bind every member Tessera binds itself."""
    binder = binder or Binder()
    done = []
    for uid, key, node_name in ext.gang_round():
        ns, _, name = key.partition("/")
        out = bind_pod(ext, binder, BindTarget(name, ns, uid, node_name))
        assert out.bound, out.message
        done.append(key)
    return sorted(done)


def watch_bound(ext, pod, node_name):
    """The watch shows the pod bound where Tessera put it (the annotation the bind wrote)."""
    a = ext.cluster.assignments[f"ml/{pod['metadata']['name']}"]
    bound = {**pod, "spec": {**pod["spec"], "nodeName": node_name}, "status": {"phase": "Running"}}
    bound["metadata"] = {**pod["metadata"], "annotations": {
        **pod["metadata"]["annotations"],
        "tessera.dev/gpu-assignment": f'{{"node":"{a.node}","gpus":{list(a.gpus)},"milli":{a.milli}}}'}}
    ext.upsert_pod(pod_info(bound))


# --- admission --------------------------------------------------------------------------------------


def test_the_member_that_completes_a_gang_admits_it_and_every_member_holds_its_gpus():
    ext = world("a", "b")
    pods = [member(f"g-{i}", "train", 3, gpus=2) for i in range(3)]
    first = arrive(ext, pods[0])
    assert first.passed == [] and "gang ml/train has 1 of its 3 members" in first.failed["a"]
    assert "waits for the other 2 to be created" in first.failed["a"] and not held(ext)
    assert arrive(ext, pods[1]).passed == [] and not held(ext)
    last = arrive(ext, pods[2])
    assert len(last.passed) == 1 and "held for this pod" in next(iter(last.failed.values()))
    assert set(held(ext)) == {"ml/g-0", "ml/g-1", "ml/g-2"}
    assert held(ext)["ml/g-2"] == last.passed[0]
    # Tessera binds the two kube-scheduler refused earlier; the last is kube-scheduler's to bind
    assert bind_rest(ext) == ["ml/g-0", "ml/g-1"]
    assert bind_pod(ext, Binder(), BindTarget("g-2", "ml", "uid-g-2", last.passed[0])).result is BindResult.BOUND


def test_a_gang_that_does_not_fit_holds_nothing_and_says_how_many_fit():
    ext = world("a", "b")
    arrive(ext, kpod("x", gpus=1, node_name="a", phase="Running"))
    arrive(ext, member("i-0", "pair", 2, gpus=4))
    out = arrive(ext, member("i-1", "pair", 2, gpus=4))
    assert out.passed == [] and set(out.failed) == {"a", "b"}
    assert "gang ml/pair needs 2 pods placed together; only 1 fit now" in out.failed["a"]
    assert set(held(ext)) == {"ml/x"}  # nothing held while it waits


def test_a_gang_larger_than_the_cluster_is_unresolvable_so_nobody_is_preempted_for_it():
    ext = world("a", "b")
    out = [arrive(ext, member(f"h-{i}", "big", 3, gpus=4)) for i in range(3)][-1]
    assert out.passed == [] and set(out.unresolvable) == {"a", "b"}
    assert "gang ml/big needs 12 GPUs for the 3 members still to place; the cluster has 8 healthy GPUs" in out.unresolvable["a"]


def test_a_late_last_member_is_admitted_at_its_own_filter_whatever_came_before():
    """The field's case: three members, the fourth seconds later. Nothing waits for kube-scheduler's 60-s flush:
    the fourth's filter admits the gang and the three refused earlier are bound by Tessera in the same round."""
    ext = world("a", "b")
    pods = [member(f"t-{i}", "late", 4) for i in range(4)]
    for p in pods[:3]:
        assert arrive(ext, p).passed == []
    ext.clock.now += 4.0
    assert len(arrive(ext, pods[3]).passed) == 1
    assert bind_rest(ext) == ["ml/t-0", "ml/t-1", "ml/t-2"]


def test_two_gangs_that_fit_alone_but_not_together_one_runs_and_the_other_holds_nothing():
    ext = world("a", "b")  # 8 GPUs: each gang needs 6
    for i in range(2):  # interleaved, as two controllers create them
        arrive(ext, member(f"a-{i}", "ga", 3, gpus=2))
        arrive(ext, member(f"b-{i}", "gb", 3, gpus=2))
    assert len(arrive(ext, member("a-2", "ga", 3, gpus=2)).passed) == 1
    out = arrive(ext, member("b-2", "gb", 3, gpus=2))
    assert out.passed == [] and "only 1 fit now" in out.failed["a"]
    assert set(held(ext)) == {"ml/a-0", "ml/a-1", "ml/a-2"}


def test_twenty_interleaved_gangs_on_room_for_ten_ten_run_whole_and_the_rest_follow_as_they_leave():
    ext = world(*(f"n{i}" for i in range(5)))  # 20 GPUs; gangs of 2 x 1 GPU
    names = [f"n{i}" for i in range(5)]
    pods = {(g, m): member(f"g{g}-{m}", f"g{g}", 2) for g in range(20) for m in range(2)}
    for m in range(2):
        for g in range(20):
            arrive(ext, pods[g, m], names)
    running = {k.partition("/")[2].split("-")[0] for k in held(ext)}
    assert len(running) == 10 and len(held(ext)) == 20  # ten whole gangs, no half of any other
    for key in bind_rest(ext):
        name = key.partition("/")[2]
        g, m = name[1:].split("-")
        watch_bound(ext, pods[int(g), int(m)], held(ext)[key])
    for gang in sorted(running)[:3]:  # three gangs finish: their pods are deleted
        for m in range(2):
            ext.delete_pod(f"uid-{gang}-{m}")
    for m in range(2):  # kube-scheduler retries the waiting pods (its move on a bound pod's deletion)
        for g in range(20):
            if f"g{g}" not in running:
                arrive(ext, pods[g, m], names)
    now = {k.partition("/")[2].split("-")[0] for k in held(ext)}
    assert len(now) == 10 and len(held(ext)) == 20 and len(now - running) == 3
    assert all(sum(1 for k in held(ext) if k.startswith(f"ml/{g}-")) == 2 for g in now)


def test_an_admitted_members_gpus_go_back_after_the_timeout_and_the_gang_backs_off():
    ext = world("a")
    for i in range(2):
        arrive(ext, member(f"p-{i}", "pair", 2), ["a"])
    assert len(held(ext)) == 2
    ext.clock.now += DEFAULT_TIMEOUT_S + 1  # nobody bound them (a leader that stepped down, say)
    ext.expire_reservations()
    assert not held(ext)
    out = ext.filter(pod_info(member("p-0", "pair", 2)), ["a"])
    assert out.passed == [] and "were bound within 60 s" in out.failed["a"] and "admitted again in" in out.failed["a"]
    ext.clock.now += BACKOFF_S + 1
    assert len(ext.filter(pod_info(member("p-1", "pair", 2)), ["a"]).passed) == 1


def test_a_bind_in_flight_keeps_its_member_held_past_the_timeout():
    ext = world("a")
    for i in range(2):
        arrive(ext, member(f"p-{i}", "pair", 2), ["a"])
    ext.reserve("uid-p-0", "ml/p-0", "a")  # its Binding call is being written
    ext.clock.now += DEFAULT_TIMEOUT_S + 1
    ext.expire_reservations()
    assert set(held(ext)) == {"ml/p-0"}  # the other goes back; this one waits for its call's answer


def test_renaming_the_members_of_a_gang_that_backs_off_keeps_the_backoff():
    ext = world("a")
    for i in range(2):
        arrive(ext, member(f"p-{i}", "pair", 2), ["a"])
    ext.clock.now += DEFAULT_TIMEOUT_S + 1
    ext.expire_reservations()
    for i in range(2):
        out = arrive(ext, member(f"p-{i}", "renamed", 2), ["a"])
    assert out.passed == [] and "admitted again in" in out.failed["a"] and not held(ext)


# --- what kube-scheduler offered -----------------------------------------------------------------------


def test_members_are_placed_only_where_kube_scheduler_offered_their_kube_shape():
    ext = world("a", "b")
    arrive(ext, member("o-0", "only-b", 2), ["b"])
    arrive(ext, member("o-1", "only-b", 2), ["b"])  # kube-scheduler's own checks passed b alone
    assert set(held(ext).values()) == {"b"}


def test_a_member_of_another_kube_shape_that_kube_scheduler_never_offered_a_node_keeps_the_gang_waiting():
    ext = world("a", "b")
    arrive(ext, member("w-0", "mixed", 2), ["a", "b"])
    launcher = member("w-1", "mixed", 2, tolerations=[{"key": "x", "operator": "Exists"}])
    ext.upsert_pod(pod_info(launcher))  # kube-scheduler's own checks refused it every node: never filtered
    out = ext.filter(pod_info(member("w-0", "mixed", 2)), ["a", "b"])
    assert "kube-scheduler has not yet offered nodes to 1 of them" in out.failed["a"] and not held(ext)
    assert len(ext.filter(pod_info(launcher), ["a"]).passed) == 1  # it is offered a node: both fit, both held
    assert set(held(ext)) == {"ml/w-0", "ml/w-1"}


def test_a_gated_member_kube_scheduler_never_offers_a_node_is_neither_planned_nor_bound_past_its_gate():
    """A queue (Kueue, 1.26+ scheduling gates) holds a pod back by spec.schedulingGates: it shares no kube shape with
    its ungated twins, so their offer does not make it ready, and the gang waits for it."""
    ext = world("a", "b")
    gated = member("q-1", "queued", 2)
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    ext.upsert_pod(pod_info(gated))
    out = arrive(ext, member("q-0", "queued", 2))
    assert "has not yet offered nodes to 1 of them" in out.failed["a"] and not held(ext)
    del gated["spec"]["schedulingGates"]  # the queue admits it: now kube-scheduler's twin's offer speaks for it
    ext.upsert_pod(pod_info(gated))
    assert len(ext.filter(pod_info(member("q-0", "queued", 2)), ["a", "b"]).passed) == 1 and len(held(ext)) == 2


def test_a_held_member_whose_node_kube_scheduler_no_longer_offers_moves_to_one_it_does():
    ext = world("a", "b")
    arrive(ext, member("m-0", "move", 2))
    arrive(ext, member("m-1", "move", 2))
    first = held(ext)["ml/m-0"]
    other = "b" if first == "a" else "a"
    out = ext.filter(pod_info(member("m-0", "move", 2)), [other])
    assert out.passed == [other] and held(ext)["ml/m-0"] == other


# --- the pod the request posts -------------------------------------------------------------------------


def test_a_posted_member_the_watch_never_saw_moves_nothing_and_is_told_why():
    ext = world("a", "b")
    before = ext.snapshot()
    out = ext.filter(pod_info(member("ghost", "g", 1)), ["a"])
    assert out.passed == [] and "not seen through the API watch" in out.failed["a"]
    assert ext.snapshot() == before
    arrive(ext, member("real-0", "g2", 2))
    before = ext.snapshot()
    forged = member("real-1", "g2", 2, uid="uid-real-0")  # another name under a watched member's UID
    ext.filter(pod_info(forged), ["a", "b"])
    assert ext.snapshot().placement == before.placement


def test_a_bind_for_a_member_of_a_gang_that_is_not_admitted_is_refused_in_words():
    ext = world("a")
    arrive(ext, member("b-0", "bind", 3), ["a"])
    with pytest.raises(BindError, match="has 1 of its 3 members"):
        ext.reserve("uid-b-0", "ml/b-0", "a")
    assert not held(ext)


def test_a_bind_on_the_leader_admits_the_gang_with_that_member_on_the_node_it_names():
    """High availability: a follower forwarded the filter; the bind reaches the leader, which admits here."""
    ext = world("a", "b")
    arrive(ext, member("l-0", "lead", 2), ["a", "b"])
    ext.upsert_pod(pod_info(member("l-1", "lead", 2)))
    assignment, _ = ext.reserve("uid-l-1", "ml/l-1", "b")
    assert assignment.node == "b" and set(held(ext)) == {"ml/l-0", "ml/l-1"}


def test_kube_schedulers_bind_of_a_member_tessera_bound_already_is_no_error():
    ext = world("a")
    pods = [member(f"k-{i}", "race", 2) for i in range(2)]
    arrive(ext, pods[0], ["a"])
    arrive(ext, pods[1], ["a"])
    ext.clock.now += TRIGGER_GRACE_S + 1  # kube-scheduler was slow: Tessera binds the trigger too
    assert bind_rest(ext) == ["ml/k-0", "ml/k-1"]
    watch_bound(ext, pods[1], "a")
    assert bind_pod(ext, Binder(), BindTarget("k-1", "ml", "uid-k-1", "a")).result is BindResult.ALREADY_BOUND


# --- sizes, sources, kinds ------------------------------------------------------------------------------


def test_members_that_disagree_on_the_size_are_told_so_and_a_finished_runs_pods_do_not_count():
    ext = world("a", "b")
    arrive(ext, member("d-0", "dis", 2))
    out = arrive(ext, member("d-1", "dis", 3))
    assert "disagree on tessera.dev/gang-size: this pod says 3, other members say 2" in out.failed["a"] and not held(ext)
    ext.upsert_pod(pod_info(member("d-1", "dis", 3, phase="Succeeded")))
    assert len(arrive(ext, member("d-2", "dis", 2)).passed) == 1


def test_a_podgroup_gang_waits_for_its_podgroup_then_starts_with_min_member_of_its_pods():
    ext = world("a")
    for i in range(3):
        arrive(ext, kpod(f"x-{i}", gpus=1, node_name="a", phase="Running"))  # 1 GPU of a's 4 left
    out = arrive(ext, grouped("pg-0", "job"), ["a"])
    assert "PodGroup ml/job (the pod's label scheduling.x-k8s.io/pod-group) does not exist" in out.failed["a"]
    ext.upsert_pod_group(PodGroup("ml/job", min_member=2))
    for i in range(1, 3):
        arrive(ext, grouped(f"pg-{i}", "job"), ["a"])
    assert not [k for k in held(ext) if "pg" in k]  # minMember 2, room for 1
    ext.delete_pod("uid-x-0")
    out = ext.filter(pod_info(grouped("pg-0", "job")), ["a"])
    assert len(out.passed) == 1 and len([k for k in held(ext) if "pg" in k]) == 2
    third = next(i for i in range(3) if f"ml/pg-{i}" not in held(ext))
    out = ext.filter(pod_info(grouped(f"pg-{third}", "job")), ["a"])  # the gang runs: judged as any pod
    assert out.passed == [] and "whole GPUs free" in out.failed["a"]


def test_a_podgroup_below_its_replica_count_starts_with_every_pod_that_fits():
    ext = world("a")
    ext.upsert_pod_group(PodGroup("ml/elastic", min_member=2))
    arrive(ext, grouped("e-0", "elastic"), ["a"])
    assert len(arrive(ext, grouped("e-1", "elastic"), ["a"]).passed) == 1  # minMember: admitted, both held
    assert set(held(ext)) == {"ml/e-0", "ml/e-1"}
    out = arrive(ext, grouped("e-2", "elastic"), ["a"])  # above minMember: placed as any pod, held by its own bind
    assert out.passed == ["a"] and set(held(ext)) == {"ml/e-0", "ml/e-1"}


def test_a_podgroup_made_after_its_pods_is_tried_by_the_binder_without_another_filter():
    ext = world("a")
    for i in range(2):
        arrive(ext, grouped(f"late-{i}", "late"), ["a"])
    ext.upsert_pod_group(PodGroup("ml/late", min_member=2))
    assert len(ext.gang_round()) == 2 and len(held(ext)) == 2


def test_a_gang_of_too_many_kinds_of_member_is_refused_in_words():
    ext = world(*(f"n{i}" for i in range(10)), gpus=8)
    size = MAX_KINDS + 1
    for i in range(size):  # each asks a different CPU amount: a kind each
        pod = member(f"k-{i}", "kinds", size)
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = f"{100 + i}m"
        out = arrive(ext, pod, [f"n{j}" for j in range(10)])
    assert f"at most {MAX_KINDS} kinds of member" in out.failed["n0"] and not held(ext)


# --- bounded work ---------------------------------------------------------------------------------------


def test_admitting_a_gang_of_hundreds_costs_about_one_fit_check_per_member_and_node():
    nodes = [f"n{i:03d}" for i in range(100)]
    ext = world(*nodes, gpus=8)
    pods = [member(f"h-{i}", "hundreds", 400) for i in range(400)]
    for p in pods[:-1]:
        ext.upsert_pod(pod_info(p))
    ext.filter(pod_info(pods[0]), nodes)  # checked in: members from one template share the offer
    calls = counting(ext)
    assert len(arrive(ext, pods[-1], nodes).passed) == 1 and len(held(ext)) == 400
    assert calls["n"] <= 3 * (400 + len(nodes)), calls["n"]


def test_a_refused_gang_is_not_planned_again_until_something_changes():
    ext = world("a", "b")
    arrive(ext, kpod("x", gpus=1, node_name="a", phase="Running"))
    arrive(ext, member("r-0", "refused", 2, gpus=4))
    arrive(ext, member("r-1", "refused", 2, gpus=4))
    calls = counting(ext)
    out = ext.filter(pod_info(member("r-0", "refused", 2, gpus=4)), ["a", "b"])
    assert "only 1 fit now" in out.failed["a"] and calls["n"] == 0
    ext.delete_pod("uid-x")  # room: planned again, and it fits
    assert len(ext.filter(pod_info(member("r-0", "refused", 2, gpus=4)), ["a", "b"]).passed) == 1


# --- the binder -------------------------------------------------------------------------------------------


class Events:
    def __init__(self):
        self.offered = []

    def offer(self, *args, **kw):
        self.offered.append(args)


def test_the_binder_binds_each_admitted_member_once_and_only_while_leader():
    ext = world("a")
    for i in range(3):
        arrive(ext, member(f"w-{i}", "work", 3), ["a"])
    binder, events = Binder(), Events()
    leader = [False]
    gb = GangBinder(ext, binder, events, lambda: leader[0])
    assert gb.round(lambda fn, *a: fn(*a)) == 0 and not binder.calls
    leader[0] = True
    queued = []
    assert gb.round(lambda fn, *a: queued.append((fn, a))) == 2
    assert gb.round(lambda fn, *a: queued.append((fn, a))) == 0  # in flight: not handed twice
    for fn, a in queued:
        fn(*a)
    assert sorted(c[1] for c in binder.calls) == ["w-0", "w-1"] and gb.bound == 2
    assert all("bound by Tessera" in e[5] for e in events.offered)


# --- a gang behind a stream of small pods ---------------------------------------------------------------


def test_a_gang_behind_a_stream_of_small_pods_drains_nodes_past_its_bound_and_runs_and_starves_without():
    """Every minute a 1-GPU pod leaves and another takes its GPU: a gang of 8 never finds 8 free at once. With
    reservations on it drains the 2 nodes that free soonest once it has waited 10 min, and runs when they are empty;
    the small pods keep the other nodes."""
    from extender.core.backfill import BackfillSettings

    def run(settings):
        wall, mono = Clock(), Clock()
        wall.now = 1_000_000.0
        ext = cluster(*(node(n, gpus=4) for n in "abcd"),
                      ext=Extender(clock=mono, wall_clock=wall, backfill=settings))
        names = list("abcd")
        small = []

        def place(name):
            pod = kpod(name)
            pod["metadata"]["creationTimestamp"] = time_of(wall.now)
            ext.upsert_pod(pod_info(pod))
            out = ext.filter(pod_info(pod), names)
            if not out.passed:
                return False
            assert bind_pod(ext, Binder(), BindTarget(name, "ml", f"uid-{name}", out.passed[0])).bound
            watch_bound(ext, pod, out.passed[0])
            small.append(name)
            return True

        for i in range(16):
            assert place(f"s{i}")
        members = [member(f"big-{i}", "big", 8) for i in range(8)]
        for m in members:
            m["metadata"]["creationTimestamp"] = time_of(wall.now)
            arrive(ext, m, names)
        drained: set[str] = set()
        for step in range(40):
            wall.now += 60.0
            ext.delete_pod(f"uid-{small.pop(0)}")  # the oldest small pod ends
            out = ext.filter(pod_info(members[0]), names)  # kube-scheduler retries the waiting pods on the delete
            if out.passed:
                return step, ext, drained
            drained |= ext.gangs.drained_nodes()
            place(f"n{step}")  # a new small pod arrives and takes what it can
        return None, ext, drained

    step, _, _ = run(None)
    assert step is None  # 40 minutes of small pods: the gang never fits without reservations
    step, ext, drained = run(BackfillSettings(wait_bound_s={8: 600.0}, max_share=0.5))
    assert step is not None and step <= 20 and len(drained) == 2, (step, drained)
    gang_nodes = [ext.cluster.assignments[f"ml/big-{i}"].node for i in range(8)]
    assert sum(1 for n in gang_nodes if n in drained) >= 6, (gang_nodes, drained)  # mostly on what it drained
    assert not ext.gangs.drains.by_gang  # its drain ended with its admission


def time_of(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_drained_node_refuses_other_pods_in_words_but_not_one_of_higher_priority():
    from extender.core.backfill import BackfillSettings

    wall, mono = Clock(), Clock()
    wall.now = 1_000_000.0
    ext = cluster(node("a", gpus=4), node("b", gpus=4),
                  ext=Extender(clock=mono, wall_clock=wall, backfill=BackfillSettings(wait_bound_s={8: 0.0}, max_share=1.0)))
    arrive(ext, kpod("x", gpus=1, node_name="a", phase="Running"))
    arrive(ext, kpod("y", gpus=1, node_name="b", phase="Running"))
    for i in range(8):
        m = member(f"g-{i}", "g", 8)
        m["metadata"]["creationTimestamp"] = time_of(wall.now - 1)
        out = arrive(ext, m)
    assert "nodes a, b are held for it as they drain" in out.failed["a"], out.failed["a"]
    small = kpod("small")
    ext.upsert_pod(pod_info(small))
    refused = ext.filter(pod_info(small), ["a", "b"])
    assert refused.passed == [] and "node held for gang ml/g" in refused.unresolvable["a"]
    urgent = kpod("urgent")
    urgent["spec"]["priority"] = 1000
    ext.upsert_pod(pod_info(urgent))
    assert ext.filter(pod_info(urgent), ["a", "b"]).passed == ["a", "b"]


def kept_apart(gang: str) -> list[dict]:
    """Gang `gang`'s two members, s-0 and s-1, each required on a node without the other (anti-affinity)."""
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": gang}}, "topologyKey": "kubernetes.io/hostname"}]}}
    pods = [member(f"s-{i}", gang, 2) for i in range(2)]
    for p in pods:
        p["metadata"]["labels"] = {"job": gang}
        p["spec"]["affinity"] = apart
    return pods


def test_members_placed_by_their_peers_are_left_to_kube_scheduler_to_bind():
    """Anti-affinity between a gang's own members (one per node): an offer made before the others were placed cannot
    show it, so Tessera never binds such a member itself; kube-scheduler's filter moves its hold where it may go."""
    ext = world("a", "b")
    pods = kept_apart("spread")
    for p in pods:
        arrive(ext, p)
    assert len(held(ext)) == 2 and ext.gang_round() == []  # admitted, held, but not Tessera's to bind
    first = held(ext)["ml/s-0"]
    other = "b" if first == "a" else "a"
    assert pod_info(pods[0]).placed_by_peers and not pod_info(member("plain", "g", 2)).placed_by_peers
    out = ext.filter(pod_info(pods[1]), [other])  # kube-scheduler's anti-affinity keeps it off s-0's node
    assert out.passed == [other] and held(ext)["ml/s-1"] == other


def test_a_member_placed_by_its_peers_is_held_until_kube_schedulers_flush_brings_it_back():
    """The field's order: s-0 comes first and is refused (its gang is incomplete), so it sits in kube-scheduler's
    unschedulable queue; s-1 admits the gang and kube-scheduler binds it. Nothing moves s-0 back before the queue's
    flush (up to 90 s after its refusal: 1.20 moves a pod on a sibling's bind for pod affinity only), so its GPUs are
    still held at 90 s, where a 60-s hold lapsed and sent the gang into a backoff; they go back after PEER_HOLD_S."""
    ext = world("a", "b")
    pods = kept_apart("apart")
    assert "waits for the other 1 to be created" in arrive(ext, pods[0]).failed["a"]
    assert arrive(ext, pods[1]).passed  # admitted: both held
    watch_bound(ext, pods[1], held(ext)["ml/s-1"])
    ext.clock.now += 90
    ext.expire_reservations()
    assert "ml/s-0" in held(ext)
    other = "b" if held(ext)["ml/s-1"] == "a" else "a"
    assert ext.filter(pod_info(pods[0]), [other]).passed == [other]
    lone = world("a", "b")  # the same gang, its last member never tried again: the hold ends, in words
    for p in pods:
        arrive(lone, p)
    lone.clock.now += PEER_HOLD_S + 1
    lone.expire_reservations()
    assert not held(lone)
    assert "were bound within 120 s" in lone.filter(pod_info(pods[0]), ["a", "b"]).failed["a"]
    plain = world("a")  # members not placed by peers keep the gang's own 60 s
    for i in range(2):
        arrive(plain, member(f"p-{i}", "pair", 2), ["a"])
    plain.clock.now += DEFAULT_TIMEOUT_S + 1
    plain.expire_reservations()
    assert not held(plain)
