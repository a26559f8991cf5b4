"""scheduler-plugins' PodGroups (extender/kube/podgroups.py): the strict reader, and the watch run in its real thread
against tests/fakeapi.py (a CRD installed late, a 403, a bad object between good ones, deletions, a relist on 410)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import yaml

from extender.kube import podgroups
from extender.kube.cache import EventSink
from extender.kube.podgroups import MISSING, PodGroupWatch, read_pod_group
from extender.service import Extender
from extender.state import PodGroup
from tessera_contract.keys import MAX_GANG_SIZE

from .crd_schema import problems
from .fakeapi import PODGROUPS, FakeApi, FakeApiClient, wait_for
from .test_manifests import ROOT

CRD = yaml.safe_load((ROOT / "tests/crds/podgroup.yaml").read_text())


def pg(name="job", namespace="ml", **spec) -> dict:
    spec = {"minMember": 3} | spec
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {k: v for k, v in spec.items() if v is not ...}}


# -- the reader -------------------------------------------------------------------------------------

@pytest.mark.parametrize("obj,want", [
    (pg(), PodGroup("ml/job", 3, None)),
    (pg(minMember=1, scheduleTimeoutSeconds=1), PodGroup("ml/job", 1, 1.0)),
    (pg(minMember=MAX_GANG_SIZE, scheduleTimeoutSeconds=86_400), PodGroup("ml/job", MAX_GANG_SIZE, 86_400.0)),
    (pg(scheduleTimeoutSeconds=None), PodGroup("ml/job", 3, None)),  # null: as absent
    # what Kubeflow's training operator writes: minResources filled, a timeout from the job's schedulingPolicy
    (pg("pytorch-mnist.v2", "team-a", minMember=4, scheduleTimeoutSeconds=60,
        minResources={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 4}), PodGroup("team-a/pytorch-mnist.v2", 4, 60.0)),
])
def test_a_podgroup_reads_as_its_gang(obj, want):
    if obj["spec"].get("scheduleTimeoutSeconds", 0) is not None:  # the apiserver drops a null rather than store it
        assert problems(obj, CRD) == []  # each of these is what the CRD admits
    assert read_pod_group(obj) == want


def test_min_resources_status_and_unknown_spec_fields_are_ignored_even_when_malformed():
    """Tessera does its own fit check per member (gangs.py); minResources is not parsed, so it cannot refuse a group."""
    obj = pg(minResources={"nvidia.com/gpu": "lots", "cpu": [1]}, newerField={"x": 1})
    obj["status"] = {"phase": "Nonsense", "running": "many"}
    assert read_pod_group(obj) == PodGroup("ml/job", 3, None)


def _meta(**changes):
    obj = pg()
    obj["metadata"].update(changes)
    return {k: v for k, v in obj["metadata"].items() if v is not ...}


REFUSED = [  # (object, words the refusal must hold: the field, the range, what it got)
    (pg(minMember=...), ["spec.minMember is missing", f"1 to {MAX_GANG_SIZE}", "will not guess"]),
    (pg(minMember=0), ["spec.minMember", f"from 1 to {MAX_GANG_SIZE}", "got 0", "minimum is 1"]),
    (pg(minMember=-3), ["spec.minMember", "got -3"]),
    (pg(minMember=MAX_GANG_SIZE + 1), ["spec.minMember", f"got {MAX_GANG_SIZE + 1}"]),
    (pg(minMember=10**400), ["spec.minMember", "got a 1329-bit number"]),
    (pg(minMember=2**31), ["spec.minMember", "got 2147483648"]),
    (pg(minMember="3"), ["spec.minMember", "got '3' (a string)"]),
    (pg(minMember=3.0), ["spec.minMember", "got 3.0 (a decimal number)"]),
    (pg(minMember=True), ["spec.minMember", "got True (a boolean)"]),
    (pg(minMember=False), ["spec.minMember", "got False (a boolean)"]),
    (pg(minMember=[3]), ["spec.minMember", "got a list"]),
    (pg(minMember={"n": 3}), ["spec.minMember", "got an object"]),
    (pg(scheduleTimeoutSeconds=0), ["spec.scheduleTimeoutSeconds", "absent", "from 1 to 86400", "got 0"]),
    (pg(scheduleTimeoutSeconds=-60), ["spec.scheduleTimeoutSeconds", "got -60"]),
    (pg(scheduleTimeoutSeconds=86_401), ["spec.scheduleTimeoutSeconds", "got 86401"]),
    (pg(scheduleTimeoutSeconds="60s"), ["spec.scheduleTimeoutSeconds", "got '60s' (a string)"]),
    (pg(scheduleTimeoutSeconds=1e3), ["spec.scheduleTimeoutSeconds", "got 1000.0 (a decimal number)"]),
    (pg(scheduleTimeoutSeconds=10**30), ["spec.scheduleTimeoutSeconds", "bit number"]),
    ({**pg(), "spec": None}, ["spec must be an object", "minMember", "got nothing"]),
    ({k: v for k, v in pg().items() if k != "spec"}, ["spec must be an object", "got nothing"]),
    ({**pg(), "spec": [3]}, ["spec must be an object", "got a list"]),
    ({**pg(), "metadata": _meta(namespace=...)}, ["metadata.namespace", "RFC 1123 label", "got nothing"]),
    ({**pg(), "metadata": _meta(namespace="ML")}, ["metadata.namespace", "got 'ML' (a string)"]),
    ({**pg(), "metadata": _meta(namespace="a" * 64)}, ["metadata.namespace", "at most 63"]),
    ({**pg(), "metadata": _meta(name="")}, ["metadata.name", "RFC 1123 subdomain", "got '' (a string)"]),
    ({**pg(), "metadata": _meta(name="Job")}, ["metadata.name", "got 'Job'"]),
    ({**pg(), "metadata": _meta(name="job\n")}, ["metadata.name", r"got 'job\n'"]),
    ({**pg(), "metadata": _meta(name="a" * 254)}, ["metadata.name", "at most 253"]),
    ({**pg(), "metadata": _meta(name=7)}, ["metadata.name", "got 7"]),
    ({**pg(), "metadata": "ml/job"}, ["metadata must be an object", "(a string)"]),
    ({k: v for k, v in pg().items() if k != "metadata"}, ["metadata must be an object", "got nothing"]),
    ([pg()], ["must be a JSON object", "got a list"]),
]


@pytest.mark.parametrize("obj,words", REFUSED)
def test_a_bad_podgroup_is_refused_in_words_that_name_the_field_the_range_and_what_it_got(obj, words):
    with pytest.raises(ValueError) as e:
        read_pod_group(obj)
    for w in words:
        assert w in str(e.value)
    assert len(str(e.value)) < 400  # bounded, whatever the object held


def test_only_a_whole_zero_is_told_the_crds_minimum():
    for value in (False, 0.0, "0"):
        with pytest.raises(ValueError) as e:
            read_pod_group(pg(minMember=value))
        assert "minimum is 1" not in str(e.value)


def test_the_words_stay_short_for_a_huge_hostile_value():
    with pytest.raises(ValueError) as e:
        read_pod_group(pg(name="x" * 100_000))
    assert len(str(e.value)) < 400 and "metadata.name" in str(e.value)
    with pytest.raises(ValueError) as e:
        read_pod_group(pg(minMember="9" * 100_000))
    assert len(str(e.value)) < 400


def test_the_e2e_crds_fixture_installs_the_podgroup_crd():
    from tests.e2e.crds import crd_manifests

    (crd,) = [c for c in crd_manifests() if c["spec"]["names"]["kind"] == "PodGroup"]
    assert crd == CRD and crd["metadata"]["name"] == "podgroups.scheduling.x-k8s.io"
    assert crd["spec"]["scope"] == "Namespaced" and [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1"]


def test_the_crd_refuses_a_gang_of_zero_and_tessera_refuses_more_than_the_crd():
    """The CRD (like scheduler-plugins' own today) says minMember >= 1; Tessera's bounds are narrower still, so an
    object the apiserver stores can be refused here: a zero wait, a wait over a day, a gang over MAX_GANG_SIZE."""
    assert any("minMember" in p for p in problems(pg(minMember=0), CRD))
    assert problems(pg(minResources={"cpu": "2x"}), CRD)  # a quantity the CRD refuses
    for stored in (pg(scheduleTimeoutSeconds=0), pg(scheduleTimeoutSeconds=100_000), pg(minMember=MAX_GANG_SIZE + 1)):
        assert problems(stored, CRD) == []
        with pytest.raises(ValueError):
            read_pod_group(stored)


# -- the watch ----------------------------------------------------------------------------------------

class Offers:
    """An EventSink's offer, recorded."""

    def __init__(self) -> None:
        self.offered: list[tuple] = []

    def offer(self, *args, **kw) -> None:
        self.offered.append(args)


@pytest.fixture
def world():
    api = FakeApi(watch_timeout_s=0.3)
    client = FakeApiClient(api)
    ext = Extender()
    stop = threading.Event()
    watch = PodGroupWatch(client, ext, stop, Offers(), recheck_s=0.2)
    thread = threading.Thread(target=watch.run, daemon=True)
    yield api, client, ext, watch, thread
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def groups(ext: Extender) -> dict[str, tuple]:
    return {k: (g.min_member, g.timeout_s) for k, g in ext.gangs.groups.items()}


def bad(ext: Extender) -> dict[str, str]:
    return {b["key"] or "?": b["reason"] for b in ext.watch_health.bad_objects() if b["kind"] == "PodGroup"}


def test_the_watch_lists_then_follows_adds_changes_and_deletions(world):
    api, client, ext, watch, thread = world
    api.put("podgroup", "ADDED", pg("a", minMember=2))
    thread.start()
    wait_for(lambda: groups(ext) == {"ml/a": (2, None)}, what="a listed")
    assert ext.gangs.groups_missing == "" and watch.served
    api.put("podgroup", "ADDED", pg("b", "ns2", minMember=5, scheduleTimeoutSeconds=30))
    api.put("podgroup", "MODIFIED", pg("a", minMember=4))
    wait_for(lambda: groups(ext) == {"ml/a": (4, None), "ns2/b": (5, 30.0)}, what="b added, a changed")
    hostile = pg("a", minMember="gone", scheduleTimeoutSeconds=[1])  # a deletion applies by namespace/name alone
    api.put("podgroup", "DELETED", hostile)
    wait_for(lambda: groups(ext) == {"ns2/b": (5, 30.0)}, what="a deleted")
    assert bad(ext) == {}
    methods = {(m, url.partition("?")[0]) for m, url in client.requests}
    assert methods == {("GET", PODGROUPS)}  # list and watch: the calls the ClusterRole grants
    assert any("watch=true" in url for _, url in client.requests)


def test_a_bad_podgroup_between_good_ones_is_recorded_and_skipped_and_the_watch_goes_on(world):
    api, client, ext, watch, thread = world
    thread.start()
    wait_for(lambda: watch.served, what="served")
    api.put("podgroup", "ADDED", pg("a", minMember=3))
    api.put("podgroup", "ADDED", pg("b", minMember=0))
    api.put_raw("podgroup", '{"type": "ADDED", "object": ')  # a line that is no event at all
    api.put_raw("podgroup", '["not", "an", "event"]')
    api.put("podgroup", "ADDED", pg("c", minMember=2))
    wait_for(lambda: groups(ext) == {"ml/a": (3, None), "ml/c": (2, None)}, what="a and c, not b")
    reasons = bad(ext)
    assert "minMember" in reasons["ml/b"] and "got 0" in reasons["ml/b"]
    assert "unreadable PodGroup watch event" in reasons["?"]
    (event,) = [o for o in watch.events.offered if o[2] == "b"]
    assert event[:3] == ("PodGroup", "ml", "b") and "minMember" in event[5]
    api.put("podgroup", "MODIFIED", pg("b", minMember=4))  # fixed: read, and no longer listed as bad
    wait_for(lambda: groups(ext).get("ml/b") == (4, None), what="b fixed")
    assert "ml/b" not in bad(ext)


def test_a_bad_update_forgets_the_group_rather_than_keep_a_size_its_owner_changed(world):
    api, client, ext, watch, thread = world
    api.put("podgroup", "ADDED", pg("a", minMember=3))
    thread.start()
    wait_for(lambda: "ml/a" in ext.gangs.groups, what="a listed")
    api.put("podgroup", "MODIFIED", pg("a", minMember=MAX_GANG_SIZE * 10))
    wait_for(lambda: "ml/a" not in ext.gangs.groups, what="a forgotten")
    assert "ml/a" in bad(ext)
    api.put("podgroup", "DELETED", pg("a"))  # deleting a bad one clears its record
    wait_for(lambda: "ml/a" not in bad(ext), what="record gone")


def test_a_missing_crd_is_said_once_and_a_crd_installed_later_is_picked_up(world, caplog):
    api, client, ext, watch, thread = world
    client.crd_installed = False
    caplog.set_level(logging.INFO, logger="extender.kube.podgroups")
    thread.start()
    wait_for(lambda: ext.gangs.groups_missing == MISSING, what="the extender told")
    wait_for(lambda: len(client.requests) >= 4, what="asked again, several times")
    assert [r.getMessage() for r in caplog.records if MISSING in r.getMessage()] == [
        f"{MISSING}; asking again every 0 s"]
    assert not watch.served and ext.gangs.groups == {}
    api.put("podgroup", "ADDED", pg("late", minMember=2))
    client.crd_installed = True
    wait_for(lambda: groups(ext) == {"ml/late": (2, None)}, what="the CRD's first PodGroup")
    assert ext.gangs.groups_missing == "" and watch.served
    client.crd_installed = False  # removed again (its objects go with it): forgotten, and said again
    wait_for(lambda: ext.gangs.groups_missing == MISSING and ext.gangs.groups == {}, what="the CRD gone")
    assert sum(MISSING in r.getMessage() for r in caplog.records) == 2


def test_a_forbidden_list_names_the_missing_rbac_rule_and_is_picked_up_once_granted(world, caplog):
    api, client, ext, watch, thread = world
    client.forbidden = True
    api.put("podgroup", "ADDED", pg("a"))
    thread.start()
    wait_for(lambda: "403" in ext.gangs.groups_missing, what="the extender told")
    for words in ("scheduling.x-k8s.io", "podgroups", "list, watch", "manifests/base/extender/rbac.yaml"):
        assert words in ext.gangs.groups_missing
    wait_for(lambda: len(client.requests) >= 3, what="asked again")
    assert sum("403" in r.getMessage() for r in caplog.records) == 1
    client.forbidden = False
    wait_for(lambda: groups(ext) == {"ml/a": (3, None)} and ext.gangs.groups_missing == "", what="granted")


def test_a_relist_after_410_deletes_what_the_watch_missed(world):
    api, client, ext, watch, thread = world
    api.put("podgroup", "ADDED", pg("a"))
    api.put("podgroup", "ADDED", pg("b"))
    thread.start()
    wait_for(lambda: set(ext.gangs.groups) == {"ml/a", "ml/b"}, what="both listed")
    with api.cond:  # b deleted while history was compacted: no event for it will ever come
        del api.store["podgroup"]["ml/b"]
        api.rv += 1
        api.compacted = api.rv + 1
        api.cond.notify_all()
    wait_for(lambda: set(ext.gangs.groups) == {"ml/a"}, what="b gone after the relist")


def test_an_older_state_never_replaces_a_newer_one_nor_revives_a_deleted_group():
    ext = Extender()
    watch = PodGroupWatch(FakeApiClient(FakeApi()), ext)

    def at(rv, **spec):
        obj = pg("a", **spec)
        obj["metadata"]["resourceVersion"] = str(rv)
        return obj

    watch._apply("MODIFIED", at(10, minMember=5))
    watch._apply("ADDED", at(9, minMember=3))  # a list older than the event already applied
    assert groups(ext) == {"ml/a": (5, None)}
    watch._apply("DELETED", at(11))
    watch._apply("ADDED", at(10, minMember=5))
    assert groups(ext) == {}


def test_nothing_the_extender_raises_ends_the_watch(world, monkeypatch):
    api, client, ext, watch, thread = world
    real = ext.upsert_pod_group

    def upsert(group):
        if group.key == "ml/boom":
            raise RuntimeError("kaboom")
        real(group)

    monkeypatch.setattr(ext, "upsert_pod_group", upsert)
    thread.start()
    api.put("podgroup", "ADDED", pg("boom"))
    api.put("podgroup", "ADDED", pg("after"))
    wait_for(lambda: "ml/after" in ext.gangs.groups, what="the next group")
    assert "RuntimeError: kaboom" in bad(ext)["ml/boom"] and thread.is_alive()


def test_a_watch_down_past_the_stall_bound_makes_podgroup_gangs_wait_in_words_until_it_is_back():
    now = [0.0]
    ext = Extender()
    watch = PodGroupWatch(FakeApiClient(FakeApi()), ext, clock=lambda: now[0])
    watch._connected("1 listed")
    watch._failing("connection refused")
    now[0] = 20.0
    watch._failing("connection refused")
    assert ext.gangs.groups_missing == ""  # a hiccup: the copy stays in use
    now[0] = 31.0
    watch._failing("connection refused")
    assert "failing for 31 s (connection refused)" in ext.gangs.groups_missing and not watch.served
    watch._connected("")  # a watch that connects resumes from where it was: current again
    assert ext.gangs.groups_missing == "" and watch.served


def test_start_runs_the_watch_in_a_daemon_thread_and_stops_with_the_extender():
    api = FakeApi(watch_timeout_s=0.3)
    api.put("podgroup", "ADDED", pg("a", minMember=2))
    ext, stop = Extender(), threading.Event()
    watch = podgroups.start(FakeApiClient(api), ext, stop)
    try:
        wait_for(lambda: groups(ext) == {"ml/a": (2, None)}, what="a listed")
        assert isinstance(watch.events, EventSink)
        named = {t.name: t for t in threading.enumerate()}
        assert named["watch-podgroups"].daemon and named["podgroup-events"].daemon
    finally:
        stop.set()
    wait_for(lambda: not any(t.name == "watch-podgroups" for t in threading.enumerate()), what="stopped")


def test_an_event_about_a_podgroup_names_its_api_group():
    class Core:
        def __init__(self) -> None:
            self.bodies: list[dict] = []

        def create_namespaced_event(self, namespace, body, **_):
            self.bodies.append(body)

    core = Core()
    EventSink(core, threading.Event())._write("PodGroup", "ml", "b", "uid-b", "7", "minMember 0")
    (body,) = core.bodies
    assert body["involvedObject"] == {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "name": "b",
                                      "uid": "uid-b", "resourceVersion": "7", "namespace": "ml"}
    assert "tessera ignored this state of the podgroup: minMember 0" == body["message"]
    assert json.dumps(body)  # serialisable as sent
