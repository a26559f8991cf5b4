"""scheduler-plugins' PodGroups on the real 1.20.2 apiserver (tests/crds/podgroup.yaml, installed by the `crds`
fixture): `tessera serve`, started before the CRD existed, picks it up at its next look (kube/podgroups.py asks again
every RECHECK_S), reads each PodGroup as its watch delivers it, sets a bad one aside in words (the log, /inspect and
an Event on the PodGroup) and applies a deletion.

What is observed is what the watch says: the extender's log (the harness writes it to cluster['dir']/tessera.log),
/inspect's bad_objects and the Events. Placing a PodGroup's pods as a gang is the gang admission's (issue 33, a
separate change), so no pod is scheduled here.
"""

from __future__ import annotations

import time

from extender.kube.podgroups import RECHECK_S

from .harness import create_or_keep

NS = "podgroups-e2e"


def _log(cluster) -> str:
    return (cluster["dir"] / "tessera.log").read_text(errors="replace")


def _until(what: str, found, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not (got := found()):
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.5)
    return got


def _podgroup(name: str, **spec) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def test_tessera_serve_picks_up_the_crd_installed_after_it_and_reads_each_podgroup(cluster, crds):
    from kubernetes import client

    core, kind = cluster["api"], crds["PodGroup"]
    custom = client.CustomObjectsApi(core.api_client)
    create_or_keep(core.create_namespace, {"metadata": {"name": NS}})
    # as Kubeflow's training operator writes one (minResources filled), and one the CRD admits that Tessera refuses
    good = _podgroup("trainer", minMember=3, scheduleTimeoutSeconds=45, minResources={"nvidia.com/gpu": "3", "cpu": "12"})
    bad = _podgroup("week-long-wait", minMember=2, scheduleTimeoutSeconds=7 * 86_400)
    for obj in (good, bad):
        create_or_keep(custom.create_namespaced_custom_object, kind.group, kind.version, NS, kind.plural, obj)

    wait = RECHECK_S + 40  # the CRD may have come just after a look; then the list, the watch and the log
    _until("the extender to read the good PodGroup",
           lambda: f"podgroup {NS}/trainer: a gang of 3 (scheduleTimeoutSeconds: 45 s)" in _log(cluster), wait)
    log = _log(cluster)
    assert "PodGroups (scheduling.x-k8s.io/v1alpha1) are served" in log
    refused = f"podgroup {NS}/week-long-wait ignored: PodGroup {NS}/week-long-wait: spec.scheduleTimeoutSeconds must be"
    _until("the bad one set aside in words", lambda: refused in _log(cluster), 30)
    assert "from 1 to 86400 (a day); got 604800" in _log(cluster)
    assert f"podgroup {NS}/week-long-wait: a gang" not in _log(cluster)

    listed = [b for b in cluster["extender"].inspect()["bad_objects"] if b["kind"] == "PodGroup"]
    assert [b["key"] for b in listed] == [f"{NS}/week-long-wait"] and "604800" in listed[0]["reason"]
    event = _until("a Warning Event on the bad PodGroup", lambda: next(
        (e for e in core.list_namespaced_event(NS).items
         if e.involved_object.kind == "PodGroup" and e.involved_object.name == "week-long-wait"), None), 30)
    assert event.type == "Warning" and event.reason == "TesseraIgnoredObject"
    assert event.involved_object.api_version == "scheduling.x-k8s.io/v1alpha1"
    assert "spec.scheduleTimeoutSeconds" in event.message

    custom.delete_namespaced_custom_object(kind.group, kind.version, NS, kind.plural, "trainer")
    custom.delete_namespaced_custom_object(kind.group, kind.version, NS, kind.plural, "week-long-wait")
    _until("the deletion applied", lambda: f"podgroup {NS}/trainer deleted" in _log(cluster), 30)
    _until("the bad record cleared by the deletion", lambda: not [
        b for b in cluster["extender"].inspect()["bad_objects"] if b["kind"] == "PodGroup"], 30)
