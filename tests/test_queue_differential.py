"""The server and time mode run one set of queue rules: the same pods held, the same nodes refused them (issue 37).

Shortest runs first is core/short_first.py's rule and core/run_history.py's estimate; each side keeps its own
account of what feeds them: time mode `_Replay` and `_ShortPods` (extender/sim/timemode.py), the server
`ShortFirstQueue` (short_first_queue.py) and `RunEstimates` (run_estimates.py), fed by the watch. As
tests/test_differential.py does for placement, this replays one stream through time mode and mirrors every event
to the server's objects, as the watch would deliver it, on time mode's own cluster: a pod arriving (pending, not yet
tried), a pod refused (kube-scheduler's Unschedulable condition for want of GPUs: both sides count a short pod from
then), a pod starting (bound, running since now), a pod leaving (finished now). At every attempt of a pod the rule looks at,
both sides must say the same: held or not, and for a held pod, which nodes a waiting short pod takes from it.

The stream: openb's default trace in time mode, 100 nodes, kube scoring, seed 42, load 1.2 (the rule holds pods
tens of thousands of times there), each pod declaring its run as users do (40% declare nothing, so the estimate
decides most silent pods), with the shipped rule: 20 short pods, 1 h runs, 2 h hold, estimates on.

Where the two differ by design, the test says so: the server drops short pods past the hold bound every 5 s, not at
every call (`PRUNE_S`, set to 0 here: with it, a short pod may count up to 5 s too long); and a live pod gets more
watch events while it waits (each refusal rewrites its status), each reading the estimate anew, where time mode
reads it once, at arrival.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import extender.short_first_queue as server_side
from extender.core.short_first import ShortFirstSettings
from extender.run_estimates import RunEstimates
from extender.short_first_queue import ShortFirstQueue
from extender.sim import timemode
from extender.sim.timemode import replay_time
from extender.sim.trace import load_nodes, load_pods
from extender.state import NodeTerms, PodInfo

from .conftest import openb

REFUSED = "0/100 nodes are available: 100 Insufficient nvidia.com/gpu."
CONTESTED_EVERY = 25  # held attempts between two comparisons of the refused nodes (each costs a `contested` call)


class Mirrored(timemode._Replay):
    """Time mode's replay, each event also sent to the server's queue objects, each decision asked of both."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock = 0.0
        rule = self.short_first
        self.estimates = RunEstimates(rule.estimate_silent, lambda: self.clock)
        self.server = ShortFirstQueue(self.cluster, self.chooser.placer, lambda *_: True, rule, lambda: self.clock,
                                      self.estimates.estimate)
        self.infos: dict[int, PodInfo] = {}
        self.asked = self.held_decisions = self.nodes_compared = 0
        self.differences: list[str] = []

    def info(self, i: int, **status) -> PodInfo:
        base = self.infos.get(i) or PodInfo(
            uid=f"u{i}", key=f"ml/p{i}", request=self.pods[i].request, node="", gang=None, assignment=None,
            phase="Pending", node_terms=NodeTerms(), created_s=self.timeline[i][0], deadline_s=self.declared[i])
        self.infos[i] = info = replace(base, **status)
        return info

    def arrive(self, i: int, now: float) -> None:
        super().arrive(i, now)
        self.clock = now
        self.server.watched(self.info(i))

    def refused(self, i: int, now: float) -> None:
        super().refused(i, now)
        self.clock = now
        self.server.watched(self.info(i, kube_refusal=REFUSED))

    def start(self, i: int, choice, now: float, placed: bool = False) -> None:
        super().start(i, choice, now, placed)
        self.clock = now
        running = self.info(i, node=choice.node.name, phase="Running", kube_refusal="", started_s=now)
        self.server.watched(running)
        self.estimates.watched(running)

    def depart(self, now: float) -> None:
        t, i = self.departures[0]
        super().depart(now)
        self.clock = t
        finished = self.info(i, phase="Succeeded", finished_s=t)
        self.server.watched(finished)
        self.estimates.watched(finished)

    def held_back(self, i: int, now: float) -> bool:
        held = super().held_back(i, now)
        self.clock = now
        known = self.info(i)
        server_held = bool(self.server.hold(known, known, exempt=False))
        self.asked += 1
        self.held_decisions += held
        if held != server_held and len(self.differences) < 10:
            self.differences.append(f"pod {i} at {now:.0f} s: time mode held {held}, the server {server_held}")
        return held

    def held_choice(self, i: int, now: float):
        choice = super().held_choice(i, now)
        if self.held % CONTESTED_EVERY == 0:
            names = [n.name for n in self.cluster.nodes]
            server_taken = set(self.server.contested(0, names))
            self.nodes_compared += 1
            if server_taken != self.contested_nodes[1] and len(self.differences) < 10:
                self.differences.append(f"pod {i} at {now:.0f} s: time mode refused {sorted(self.contested_nodes[1])}, "
                                        f"the server {sorted(server_taken)}")
        return choice


def mirror(server_estimates: bool = True) -> tuple[Mirrored, object]:
    """The replay with every decision asked of both sides; `server_estimates` False: a server that reads every silent
    pod as long, to show the comparison can fail."""
    pods = load_pods(openb("openb_pod_list_default.csv"))
    nodes = load_nodes(openb("openb_node_list_gpu_node.csv"))
    made: list[Mirrored] = []

    class Kept(Mirrored):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)
            if not server_estimates:
                self.server.estimate = lambda _info: None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timemode, "_Replay", Kept)
        patch.setattr(server_side, "PRUNE_S", 0.0)
        result = replay_time(nodes, pods, "tessera", "kube", seed=42, load=1.2, short_first=ShortFirstSettings(
            estimate_silent=True), declarations="users")
    return made[0], result


def test_the_server_holds_the_pods_time_mode_holds_and_refuses_them_the_same_nodes():
    replay, result = mirror()
    assert replay.differences == []
    # measured 2026-12-07: 302,140 decisions, 90,852 of them held, the refused nodes compared 3,631 times
    assert replay.asked > 100_000 and replay.held_decisions > 10_000 and replay.nodes_compared > 1_000
    assert result.short_first["attempts_held"] == replay.held


def test_the_comparison_fails_for_a_server_that_reads_silent_pods_as_long():
    replay, _ = mirror(server_estimates=False)
    assert replay.differences and "time mode held True, the server False" in replay.differences[0]
