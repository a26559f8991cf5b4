"""The job-side runner with a stand-in controller: what it reads and writes through the job's own
Kubernetes identity (its own namespace's pods, nothing else), without Ray."""

from __future__ import annotations

import json

import pytest

from raybridge.contract import LOST_ANNOTATION, PHASE_ANNOTATION, PROGRESS_ANNOTATION, REPLACES_ANNOTATION
from raybridge.controller import History, Recovery
from raybridge.job import UNCLAIMED_AFTER_S, JobRunner, OwnPods

from .test_contract_decide import pod


class Pods:
    def __init__(self, pods):
        self.pods = pods
        self.writes: list[tuple[str, dict]] = []

    def snapshot(self):
        return self.pods

    def annotate(self, key, annotations):
        self.writes.append((key, annotations))
        for p in self.pods:
            if f"{p['metadata']['namespace']}/{p['metadata']['name']}" == key:
                p["metadata"]["annotations"].update(annotations)


class Group:
    def __init__(self):
        self.actors, self.members = {}, []


class FakeController:
    def __init__(self):
        self.group, self.joining, self.history = Group(), (), History()
        self.phase, self.step_done, self.lost, self.added, self.closed = "Pending", 0, [], [], False
        self.abandoned = []

    @property
    def world(self):
        return len(self.group.members)

    @property
    def has_lost(self):
        return bool(self.lost)

    def start(self, slices):
        self.group.members = sorted(slices)
        self.group.actors = {n: object() for n in slices}
        self.phase = "Running"

    def add(self, name, s):
        self.added.append((name, s))

    def remove(self, name):
        pass

    def abandon(self, name):
        self.abandoned.append(name)

    def take_lost(self):
        lost, self.lost = self.lost, []
        return lost

    def step(self):
        self.step_done += 1
        self.history.losses[self.step_done] = 1.0
        if self.step_done == 3:  # a trainer dies at step 3
            self.group.members.remove("ml/b")
            del self.group.actors["ml/b"]
            self.lost.append("ml/b")
            self.history.recoveries.append(Recovery(3, ("ml/b",), 1, 0.05, 1, 0.02))

        class R:
            recovery = None
        return R()

    def run(self, n):
        self.phase = "Succeeded"

    def close(self):
        self.closed = True


def test_the_runner_starts_the_bound_gang_writes_progress_and_marks_the_lost_pod():
    pods = Pods([pod("a", "n1"), pod("b", "n2"), pod("other", "n3", gang="someone-else")])
    ctl = FakeController()
    runner = JobRunner(pods, "job", steps_per_turn=2, progress_every_s=0, controller_factory=lambda: ctl)
    assert runner.turn()
    assert ctl.group.members == ["ml/a", "ml/b"]
    started = {k for k, _ in pods.writes}
    assert started == {"ml/a", "ml/b"}, "only the job's own pods are written"
    assert not [k for k, a in pods.writes if LOST_ANNOTATION in a]
    runner.turn()  # steps 3-4: the loss at step 3 ends the turn early
    runner.turn()  # and is marked on the pod at once: the bridge replaces it
    marked = [k for k, a in pods.writes if LOST_ANNOTATION in a]
    assert marked == ["ml/b"]
    a = pods.pods[0]["metadata"]["annotations"]
    progress = json.loads(a[PROGRESS_ANNOTATION])
    assert a[PHASE_ANNOTATION] == "Running" and progress["recoveries"] == 1 and progress["steps_redone"] == 1
    assert progress["last_recovery_s"] == pytest.approx(0.07) and progress["last_detection_s"] == pytest.approx(0.02)
    runner.turn()
    assert [k for k, a in pods.writes if LOST_ANNOTATION in a] == ["ml/b"], "marked once"


def test_a_bound_pod_no_kubelet_takes_is_given_up_and_marked_lost(monkeypatch):
    """A replacement bound to a node whose kubelet stopped stays Pending with no status from a kubelet: after
    UNCLAIMED_AFTER_S its trainer is given up and the pod marked lost (the bridge replaces it); a pod a kubelet
    took (its host IP written), however long it stays Pending (an image pull), is waited for."""
    clock = [1000.0]
    monkeypatch.setattr("raybridge.job.time.monotonic", lambda: clock[0])
    pods = Pods([pod("a", "n1"), pod("b", "n2")])
    ctl = FakeController()
    runner = JobRunner(pods, "job", steps_per_turn=1, progress_every_s=0, controller_factory=lambda: ctl)
    assert runner.turn()
    stuck = pod("b-r1", "n2", phase="Pending", extra={REPLACES_ANNOTATION: "ml/b"})
    pulling = pod("c", "n1", phase="Pending")
    pulling["status"]["hostIP"] = "10.0.0.1"
    pods.pods += [stuck, pulling]
    runner.turn()
    assert [n for n, _ in ctl.added] == ["ml/b-r1", "ml/c"]
    clock[0] += UNCLAIMED_AFTER_S - 1
    runner.turn()
    assert ctl.abandoned == [] and "ml/b-r1" not in [k for k, a in pods.writes if LOST_ANNOTATION in a]
    clock[0] += 2
    runner.turn()
    assert ctl.abandoned == ["ml/b-r1"]
    assert [k for k, a in pods.writes if LOST_ANNOTATION in a].count("ml/b-r1") == 1
    clock[0] += 600
    runner.turn()
    assert ctl.abandoned == ["ml/b-r1"], "given up once; the pod a kubelet took is waited for"


def test_the_job_writes_only_its_own_namespace():
    class Api:
        def patch_namespaced_pod(self, *a):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="own namespace"):
        OwnPods(Api(), "ml").annotate("other-ns/pod", {"x": "y"})
