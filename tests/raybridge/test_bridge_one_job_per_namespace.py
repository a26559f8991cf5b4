"""Issue 35, item 4: one namespace per Ray job. The job's Role grants `pods: patch` on every pod of its namespace (RBAC
cannot narrow a patch to some fields, nor to "my own pods": replacements get new names), so a job's namespace is its
trust boundary, and the bridge acts on a job's lost marks only where no other job could have written them.

Before: the bridge grouped a namespace's Ray pods by gang name and took every `tessera.dev/ray-lost` on them as the
word of the pod's own job. Job A's code, beside job B in one namespace, marked B's pods lost and the bridge replaced
them, and deleted B's replacements it had made; it renamed B's pods into its own gang and the bridge replaced and
deleted them as A's."""

from __future__ import annotations

import logging

import pytest

from raybridge.bridge import SHARED_JOBS_SAID, Bridge, pod_mac
from raybridge.contract import BRIDGE_MAC_ANNOTATION, CREATED_BY_ANNOTATION, LOST_ANNOTATION, REPLACES_ANNOTATION

from .test_bridge_k8s_only import KEY, Pods, Writer, hours_apart, started
from .test_contract_decide import pod

GANG = "tessera.dev/gang-name"


def two_jobs() -> Pods:
    """Jobs `a` and `b`, two members each, both started, in namespace ml."""
    return Pods([started(pod(f"{g}{i}", f"n-{g}{i}", gang=g)) for g in "ab" for i in range(2)])


def said(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_another_jobs_lost_mark_in_the_same_namespace_gets_nothing_replaced_and_is_said_once(caplog):
    pods = two_jobs()
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    bridge.turn()
    pods.pods["ml/b1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"  # job a's code: its Role patches every pod of ml
    with caplog.at_level(logging.INFO, logger="tessera.bridge"):
        for _ in range(5):
            bridge.turn()
    assert (w.created, w.deleted) == ([], [])
    (words,) = said(caplog, "holds Ray pods of")
    assert "namespace ml holds Ray pods of 2 jobs ('a', 'b')" in words
    assert "replaces and deletes no pod in ml until every pod that was there meanwhile is gone" in words
    assert "a namespace of its own" in words
    assert [(key, reason) for key, _, reason, _ in w.events] == [("ml/a0", "TesseraNamespaceShared"),
                                                                   ("ml/b0", "TesseraNamespaceShared")]
    assert bridge.shared_namespaces == 1 and not bridge.jobs, "what the jobs' pods said there is not kept"


def test_another_jobs_mark_on_the_bridges_own_replacement_gets_it_not_deleted():
    pods = Pods([started(pod(f"b{i}", f"n{i}", gang="b")) for i in range(2)])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    pods.pods["ml/b1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"  # b's own word, b alone in ml
    bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b1-r1"]
    pods.pods["ml/a0"] = started(pod("a0", "n9", gang="a"))  # a second job in ml
    bridge.turn()
    pods.pods["ml/b1-r1"]["metadata"]["annotations"].update({LOST_ANNOTATION: "x", "tessera.dev/ray-phase": "Running"})
    for _ in range(3):
        bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b1-r1"] and w.deleted == []


def test_a_pod_renamed_into_another_job_is_neither_replaced_nor_deleted(caplog):
    """All of b's pods renamed into gang `a` between two turns: one job in the namespace again, but not b's word."""
    pods = Pods([started(pod(f"b{i}", f"n{i}", gang="b")) for i in range(2)])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    pods.pods["ml/b1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"
    bridge.turn()
    for p in pods.pods.values():
        p["metadata"]["annotations"][GANG] = "a"
    pods.pods["ml/b1-r1"]["metadata"]["annotations"].update({LOST_ANNOTATION: "x", "tessera.dev/ray-phase": "Running"})
    with caplog.at_level(logging.WARNING, logger="tessera.bridge"):
        for _ in range(3):
            bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["b1-r1"] and w.deleted == []
    (words,) = said(caplog, "changed jobs")
    assert "namespace ml holds a pod that changed jobs (pod ml/b" in words and "was in job 'b', now 'a'" in words


def test_marks_written_while_the_namespace_held_two_jobs_stay_void_until_those_pods_are_gone(caplog):
    pods = two_jobs()
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    bridge.turn()
    pods.pods["ml/b1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"  # a's code, while a is there
    bridge.turn()
    for name in ("a0", "a1"):  # job a ends and its pods go: b is alone in ml, with a's mark on its pod
        del pods.pods[f"ml/{name}"]
    for _ in range(3):
        bridge.turn()
    assert w.created == [] and bridge.shared_namespaces == 1
    for name in ("b0", "b1"):  # b's pods go too; b runs again, a fresh gang of pods, one of them lost by its own word
        del pods.pods[f"ml/{name}"]
    pods.pods.update({f"ml/c{i}": started(pod(f"c{i}", f"m{i}", gang="b")) for i in range(2)})
    pods.pods["ml/c1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"
    with caplog.at_level(logging.INFO, logger="tessera.bridge"):
        bridge.turn()
        bridge.turn()
    assert [c["metadata"]["name"] for c in w.created] == ["c1-r1"] and bridge.shared_namespaces == 0
    assert said(caplog, "namespace ml: every pod that was there while it held more than one job is gone")


def test_one_shared_namespace_leaves_the_others_repaired():
    pods = two_jobs()
    alone = started(pod("x1", "n7", gang="x", extra={LOST_ANNOTATION: "x"}))
    other = started(pod("x0", "n8", gang="x"))
    for p in (alone, other):
        p["metadata"]["namespace"] = "team-b"
        pods.pods[f"team-b/{p['metadata']['name']}"] = p
    pods.pods["ml/b1"]["metadata"]["annotations"][LOST_ANNOTATION] = "x"
    w = Writer(pods)
    Bridge(pods, w, KEY, clock=hours_apart()).turn()
    assert [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in w.created] == [("team-b", "x1-r1")]


def test_many_jobs_in_one_namespace_cost_one_line_and_a_few_events(caplog):
    """A tenant making 500 gangs in its namespace gets nothing created and no flood of words."""
    pods = Pods([started(pod(f"p{i}", f"n{i}", size=1, gang=f"g{i:03}", extra={LOST_ANNOTATION: "x"})) for i in range(500)])
    w = Writer(pods)
    bridge = Bridge(pods, w, KEY, clock=hours_apart())
    with caplog.at_level(logging.WARNING, logger="tessera.bridge"):
        for _ in range(3):
            bridge.turn()
    assert w.created == [] and w.deleted == []
    (words,) = said(caplog, "holds Ray pods of")
    assert f"500 jobs ('g000', 'g001', 'g002', 'g003' and {500 - SHARED_JOBS_SAID} more)" in words
    assert len(w.events) == SHARED_JOBS_SAID


@pytest.mark.parametrize("gang", ["\n2026-01-01 CRITICAL tessera.bridge: forged", "x\x1b]0;pwned\x07"])
def test_a_gang_name_is_said_escaped(gang, caplog):
    """The bridge reads gang names raw here (a pod that breaks the contract still holds a gang): never a forged line."""
    pods = Pods([started(pod("a0", "n1", gang="a")), started(pod("z0", "n2", gang="a", extra={GANG: gang}))])
    with caplog.at_level(logging.WARNING, logger="tessera.bridge"):
        Bridge(pods, Writer(pods), KEY).turn()
    (words,) = said(caplog, "holds Ray pods of")
    assert "\n" not in words and "\x1b" not in words


def test_a_restarted_bridge_deletes_no_pod_of_its_own_that_another_jobs_code_moved_into_its_gang():
    """The MAC binds the job (its gang) too: a bridge restarted after b's replacement was renamed into gang `a` and
    marked lost never saw it move, and its MAC, over namespace, name and replaced pod alone, made it `a`'s to delete."""
    own = {CREATED_BY_ANNOTATION: "tessera-bridge", REPLACES_ANNOTATION: "ml/b1", LOST_ANNOTATION: "x",
           BRIDGE_MAC_ANNOTATION: pod_mac(KEY, "ml", "b1-r1", "ml/b1", "b")}
    for gang, deleted in (("a", []), ("b", [("ml/b1-r1", "uid-b1-r1")])):  # in its own gang it is the bridge's
        pods = Pods([started(pod("a0", "n1", gang=gang)), started(pod("b1-r1", "n2", gang=gang, extra=own))])
        w = Writer(pods)
        Bridge(pods, w, KEY).turn()
        assert w.deleted == deleted, gang
