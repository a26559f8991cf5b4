"""The privileged bridge, driven with plain API dicts: it replaces lost pods, deletes only its own,
and has nothing in it that could run a tenant's code.

Before (main): the bridge imported Ray and torch, started each job's trainers from the tenant's
`tessera.dev/entrypoint` and `ray.get` (unpickled) their results; it deleted any lost pod carrying
`tessera.dev/created-by: tessera-bridge` and `tessera.dev/replaces`, annotations a tenant can write.
"""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path

import pytest

from raybridge.bridge import Bridge, pod_mac, serve
from raybridge.contract import (
    BRIDGE_MAC_ANNOTATION,
    CREATED_BY_ANNOTATION,
    LOST_ANNOTATION,
    PHASE_ANNOTATION,
    REPLACES_ANNOTATION,
)

from .test_contract_decide import pod

ROOT = Path(__file__).resolve().parents[2]
KEY = b"k" * 32


class Pods:
    def __init__(self, pods):
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}

    def snapshot(self):
        return list(self.pods.values())


class Writer:
    def __init__(self, pods: Pods):
        self.pods, self.created, self.deleted, self.events = pods, [], [], []

    def create(self, body):
        body = json.loads(json.dumps(body))
        body["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
        self.pods.pods[f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = body
        self.created.append(body)
        return body["metadata"]["uid"]

    def delete(self, key, uid):
        self.deleted.append((key, uid))
        self.pods.pods.pop(key, None)

    def event(self, *a, **k):
        self.events.append(a)


def hours_apart():
    """A clock an hour on at each reading: no replacement waits for the bridge's backoff (test_bridge_hostile.py tests it)."""
    return itertools.count(0, 3600).__next__


def started(p, phase="Running"):
    p["metadata"]["annotations"][PHASE_ANNOTATION] = phase
    return p


def test_the_bridge_imports_nothing_that_runs_or_unpickles_tenant_code():
    """Every module the bridge's process loads from the repo (the RBAC scan's import walk): none imports
    ray, torch, pickle or importlib, and none calls eval/exec/__import__."""
    from tests.test_manifests import _component_files

    files = _component_files("raybridge/bridge.py")
    assert ROOT / "raybridge/kube.py" in files and ROOT / "raybridge/decide.py" in files
    banned = {"ray", "torch", "pickle", "cloudpickle", "importlib", "dill", "marshal"}
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [(node.module or "").split(".")[0]]
            assert not set(names) & banned, f"{f.relative_to(ROOT)} imports {set(names) & banned}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "__import__", "compile"), f"{f.relative_to(ROOT)}: {node.func.id}"


def test_a_lost_member_is_replaced_once_and_only_the_bridges_own_pod_is_deleted():
    pods = Pods([started(pod("a", "n1")), started(pod("b", "n2"))])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    bridge.turn()
    assert not w.created
    pods.pods["ml/b"]["metadata"]["annotations"][LOST_ANNOTATION] = "trainer lost"  # the job says so
    bridge.turn()
    bridge.turn()
    (new,) = w.created
    ann = new["metadata"]["annotations"]
    assert new["metadata"]["name"] == "b-r1" and ann[REPLACES_ANNOTATION] == "ml/b" and "nodeName" not in new["spec"]
    assert ann[BRIDGE_MAC_ANNOTATION] == pod_mac(KEY, "ml", "b-r1", "ml/b", "job") and LOST_ANNOTATION not in ann
    assert w.deleted == [], "b is the tenant's own pod: never deleted"
    # the replacement is lost too: replaced, and deleted by UID (it is the bridge's)
    pods.pods["ml/b-r1"]["metadata"]["annotations"].update({PHASE_ANNOTATION: "Running", LOST_ANNOTATION: "x"})
    bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b-r1", "b-r2"] and w.deleted == [("ml/b-r1", "uid-b-r1")]


def test_forged_created_by_annotations_do_not_make_the_bridge_delete_a_pod():
    """Before: a lost pod carrying created-by: tessera-bridge and replaces was deleted by the bridge."""
    forged = started(pod("victim", "n1", extra={CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "ml/old",
                                                BRIDGE_MAC_ANNOTATION: "00" * 32, LOST_ANNOTATION: "x"}))
    copied = started(pod("other", "n2", extra={CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "ml/old",
                                               # a real MAC, copied from another pod of the bridge's: it names that pod
                                               BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "ml", "victim", "ml/old", "job"),
                                               LOST_ANNOTATION: "x"}))
    pods = Pods([forged, copied, started(pod("c", "n3", size=3))])
    for p in pods.pods.values():
        p["metadata"]["annotations"]["tessera.dev/gang-size"] = "3"
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert w.deleted == []


def test_a_restarted_bridge_knows_its_pods_by_their_mac_and_deletes_with_the_uid_as_precondition():
    pods = Pods([started(pod("a", "n1")), started(pod("b-r1", "n2", extra={
        CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "ml/b",
        BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "ml", "b-r1", "ml/b", "job"), LOST_ANNOTATION: "x"}))])
    w = Writer(pods)
    Bridge(pods, w, b"another key, another bridge....." * 2).turn()
    assert w.deleted == [], "not this bridge's key"
    Bridge(pods, w, KEY).turn()
    assert w.deleted == [("ml/b-r1", "uid-b-r1")]


def test_nothing_is_replaced_before_start_after_success_or_beyond_the_gang_size():
    pods = Pods([pod("a", "n1", phase="Failed"), pod("b", "n2")])
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert not w.created, "the job never started (no phase written): the bridge does nothing"
    pods = Pods([started(pod("a", "n1"), "Succeeded"), started(pod("b", "n2", phase="Failed"), "Succeeded")])
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert not w.created, "a finished job is not repaired"
    pods = Pods([started(pod(n, f"n{i}", phase="Failed"), "Succeeded") for i, n in enumerate("ab")])
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    assert not w.created, "nor when its members failed after (its driver, and so its Ray head, exited)"
    # a hostile job marks every pod lost over and over: never more live pods than its gang size
    pods = Pods([started(pod(n, f"n{i}")) for i, n in enumerate("ab")])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    for _ in range(6):
        for p in list(pods.pods.values()):
            p["metadata"]["annotations"].update({LOST_ANNOTATION: "x", PHASE_ANNOTATION: "Running"})
        bridge.turn()
        live = [p for p in pods.pods.values() if LOST_ANNOTATION not in p["metadata"]["annotations"]]
        assert len(live) <= 2
    assert len(w.created) == 12 and len(pods.pods) <= 4, "churned one for one; its own lost pods deleted"
    assert len({c["metadata"]["name"] for c in w.created}) == 12, "no name reused (a reused name would never be replaced)"


def test_a_deleted_member_is_replaced_from_its_last_seen_body():
    pods = Pods([started(pod("a", "n1")), started(pod("b", "n2"))])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY)
    bridge.turn()
    del pods.pods["ml/a"]
    bridge.turn()
    bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["a-r1"]


def test_a_pod_deleted_while_the_bridge_was_away_is_replaced_from_what_the_job_says_is_gone():
    """A move deletes a trainer's pod; a bridge killed then never saw it. Before, the restarted bridge
    created nothing and the job stayed a trainer short for good. The job lists it as gone in its progress."""
    from raybridge.contract import PROGRESS_ANNOTATION

    def progress(gone):
        return {PROGRESS_ANNOTATION: json.dumps({"step": 9, "world": 1, "gone": gone})}

    pods = Pods([started(pod("b", "n2", extra=progress(["ml/a"])))])  # "a" was deleted before this bridge started
    w = Writer(pods)
    Bridge(pods, w, KEY).turn()
    (new,) = w.created
    ann = new["metadata"]["annotations"]
    assert new["metadata"]["name"] == "a-r1" and ann[REPLACES_ANNOTATION] == "ml/a" and "nodeName" not in new["spec"]
    assert new["spec"]["containers"] == pods.pods["ml/b"]["spec"]["containers"], "modelled on a live member"
    assert ann[BRIDGE_MAC_ANNOTATION] == pod_mac(KEY, "ml", "a-r1", "ml/a", "job")

    # the tenant's word is bounded: another namespace's pod, a live member, or more than the gang size are not taken
    for gone, made in ((["other/x"], []), (["ml/c"], []), (["ml/p", "ml/q", "ml/r"], ["p-r1"])):
        pods = Pods([started(pod("c", "n1", extra=progress(gone)))])
        w = Writer(pods)
        Bridge(pods, w, KEY).turn()
        assert [c["metadata"]["name"] for c in w.created] == made, gone  # a gang of two one pod short: one at most


def test_a_bad_metrics_address_is_refused_in_words_before_the_pod_watch_starts(monkeypatch):
    """Before: port 99999 ended in an OverflowError from bind() once the watch had synced, and port 0 was taken."""
    monkeypatch.setattr("raybridge.kube.PodWatch", lambda *a: pytest.fail("the bridge started its pod watch"))
    for listen in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", "9500", "[::1]:-1"):
        with pytest.raises(ValueError, match=r"^--metrics-listen wants HOST:PORT, got ") as e:
            serve(object(), listen)
        assert repr(listen) in str(e.value)


def test_what_the_bridge_remembers_of_pods_goes_with_the_pods():
    """20,000 churned bad Ray pods left 20,000 logged messages in the bridge for good; and each pod it created
    stayed in `created` after it was deleted. Both now last as long as their pods."""
    pods = Pods([])
    bridge = Bridge(pods, Writer(pods), KEY)
    for i in range(300):
        bad = {"metadata": {"name": f"bad-{i}", "namespace": "ml", "uid": str(i), "annotations": {"tessera.dev/runtime": "ray"}}}
        pods.pods = {"ml/bad": bad}
        bridge.turn()
        assert len(bridge._reported) == 1
    pods.pods = {}
    bridge.turn()
    assert bridge._reported == set()
    pods.pods = {p["metadata"]["name"]: p for p in [started(pod("a", "n1")), started(pod("b", "n2"))]}
    pods.pods = {f"ml/{k}": v for k, v in pods.pods.items()}
    pods.pods["ml/b"]["metadata"]["annotations"][LOST_ANNOTATION] = "trainer lost"
    bridge.turn()
    assert "ml/b-r1" in bridge.created
    del pods.pods["ml/b-r1"]
    bridge.turn()
    assert "ml/b-r1" not in bridge.created
