"""The server and time mode lend the same nodes on a drain lease, at the same moments (core/backfill.py `drain_lease`).

Both call `Backfill.lease_admits`; each keeps its own account of what it reads: time mode `_Replay` (its `ends`, its
reservations, `_Leases`), the server `QueueReservations` (started, declared runs, leases, its own `Backfill`), fed
by the watch. As tests/test_queue_differential.py does for shortest runs first, this replays one stream through time
mode and mirrors every event to a server `QueueReservations` on time mode's own cluster, as the watch and the verbs
would deliver it: a pod arriving (pending), reserving (a filter that passes no node), starting (bind: its check, then
the watch showing it bound), leaving (finished, or deleted at its lease's end). At every decision both must agree:
- whenever time mode lends nodes to a pod that nothing else takes, the server's filter passes exactly those nodes;
- every start onto a node time mode admitted, bind admits too, and a lent start makes the same lease;
- the lease time mode ends is the one the server's preemptor would be handed then, and a lease time mode renews (no
  reservation on its node) the server renews too, to the same end;
- every reservation made or expired is the same on both sides.

The stream: openb's default trace in time mode, 100 nodes, kube scoring, seed 42, load 1.2, users' declarations,
the shipped short-first rule, reservations at once for 8-GPU pods, a floating pool of 16 per kind, 50 min leases (the
setting docs/queueing.md measured). Every openb pod counts as made by a controller of its own. Measured: 191,877 lent
decisions (most lend nothing on either side), 1,754 starts onto kept or reserved nodes, 90 leases ended, 144 renewed
and 515,506 reservation states compared, all alike. The server hands its preemptor every lease lapsed by then at once, where time
mode ends them one event at a time at the same instant: the mirror keeps what was handed until time mode ends it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.core.backfill import BackfillSettings
from extender.core.short_first import ShortFirstSettings
from extender.queue_reservations import QueueReservations
from extender.sim import timemode
from extender.sim.timemode import replay_time
from extender.sim.trace import load_nodes, load_pods
from extender.state import NodeTerms, PodInfo

from .conftest import openb

SETTINGS = BackfillSettings(wait_bound_s={8: 0.0}, drain_keep=16, drain_pool_run_s=3000.0, drain_lease=True)


class Mirrored(timemode._Replay):
    """Time mode's replay, each event also sent to a server's QueueReservations, each lease decision asked of both."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock = 0.0
        self.server = QueueReservations(self.cluster, self.chooser.placer, lambda _tolerations: [], self.backfill.settings,
                                        clock=lambda: self.clock)
        self.infos: dict[int, PodInfo] = {}
        self.handed: dict[str, object] = {}  # leases the server handed its preemptor that time mode has not ended yet
        self.lent_compared = self.binds_compared = self.leases_compared = self.reservations_compared = 0
        self.renewals_compared = 0
        self.differences: list[str] = []

    def info(self, i: int, **status) -> PodInfo:
        base = self.infos.get(i) or PodInfo(
            uid=f"u{i}", key=self.requests[i].name, request=self.pods[i].request, node="", gang=None, assignment=None,
            phase="Pending", node_terms=NodeTerms(), created_s=self.timeline[i][0], deadline_s=self.declared[i],
            controller_uid=f"c{i}")
        self.infos[i] = info = replace(base, **status)
        return info

    def differ(self, what: str) -> None:
        if len(self.differences) < 20:
            self.differences.append(what)

    def arrive(self, i: int, now: float) -> None:
        super().arrive(i, now)
        self.clock = now
        self.server.watched(self.info(i))

    def lendable(self, i, among, taken, now):
        lent = super().lendable(i, among, taken, now)
        self.clock = now
        request, placer = self.requests[i], self.chooser.placer
        fitting = [n.name for n in among if placer.verdict(request, n) is not None]
        passed, _ = self.server.narrow(self.info(i), self.info(i), fitting, reserve=False)
        self.lent_compared += 1
        if set(passed) != {n.name for n in lent}:
            self.differ(f"t={now:.0f} pod {i}: time mode lends {sorted(n.name for n in lent)}, the server's filter "
                        f"passes {sorted(passed)}")
        return lent

    def start(self, i: int, choice, now: float, placed: bool = False) -> None:
        self.clock = now
        lent = self.leases.offered == (i, choice.node.name)
        if self.backfill.restricted(choice.node.name, now):
            self.binds_compared += 1
            why = self.server.refusal(self.info(i), choice.node, choice.gpus)
            if why is not None:
                self.differ(f"t={now:.0f} pod {i} on {choice.node.name}: time mode placed it, bind refuses: {why}")
        lease = self.server.leases.get(self.requests[i].name)
        if lent != (lease is not None) or (lease is not None and lease.ends_s != now + SETTINGS.drain_pool_run_s):
            self.differ(f"t={now:.0f} pod {i}: time mode lent {choice.node.name}: {lent}; the server's lease: {lease}")
        super().start(i, choice, now, placed)
        self.server.watched(self.info(i, node=choice.node.name, phase="Running", started_s=now))
        self.same_reservations(now)

    def release(self, i: int, now: float) -> None:
        super().release(i, now)
        self.clock = now
        self.server.gone(f"u{i}", self.info(i))
        self.infos[i] = replace(self.infos[i], node="", phase="Pending", started_s=None)

    def lapse(self, now: float) -> None:
        self.clock = now
        i, ended = self.leases.next_pod(), self.leases.count
        name = self.requests[i].name
        self.handed.update((lease.key, lease) for lease in self.server.lapsed())  # all that lapsed by now, at once
        super().lapse(now)
        if self.leases.count == ended:  # time mode renewed it: the server must have too, to the same end
            self.renewals_compared += 1
            theirs = self.server.leases.get(name)
            if name in self.handed or theirs is None or theirs.ends_s != now + self.leases.bound_s:
                self.differ(f"t={now:.0f}: time mode renews pod {i}'s lease, the server "
                            f"{'hands it to its preemptor' if name in self.handed else 'does not renew it'}")
            elif self.server.expected_end(name) != self.ends[name]:
                self.differ(f"t={now:.0f}: pod {i}'s renewed end: time mode {self.ends[name]}, "
                            f"server {self.server.expected_end(name)}")
            return
        self.leases_compared += 1
        lease = self.handed.pop(name, None)
        if lease is None:
            self.differ(f"t={now:.0f}: time mode ends pod {i}'s lease, the server's preemptor is not handed it")
        else:
            self.server.lease_over(lease)  # the preemptor deleted it
        self.server.watched(self.info(i))  # its controller's new pod, pending

    def reserve(self, i: int, now: float) -> None:
        super().reserve(i, now)
        self.clock = now
        self.server.narrow(self.info(i), self.info(i), [], reserve=True)
        self.same_reservations(now)

    def expire(self, now: float) -> None:
        super().expire(now)
        self.server.backfill.expire(now)
        self.same_reservations(now)

    def same_reservations(self, now: float) -> None:
        mine = {(r.pod, r.node, r.start_s) for r in self.backfill.by_pod.values()}
        theirs = {(r.pod, r.node, r.start_s) for r in self.server.backfill.by_pod.values()}
        self.reservations_compared += 1
        if mine != theirs:
            self.differ(f"t={now:.0f}: reservations differ: time mode {sorted(mine - theirs)}, "
                        f"server {sorted(theirs - mine)}")


@pytest.fixture(scope="module")
def mirrored():
    pods, nodes = load_pods(openb("openb_pod_list_default.csv")), load_nodes(openb("openb_node_list_gpu_node.csv"))
    made: list[Mirrored] = []

    class Capture(Mirrored):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timemode, "_Replay", Capture)
        result = replay_time(nodes, pods, "tessera", "kube", seed=42, load=1.2, backfill=SETTINGS,
                             short_first=ShortFirstSettings(), declarations="users")
    return made[0], result


def test_the_server_lends_binds_and_ends_leases_as_time_mode_does(mirrored):
    replay, result = mirrored
    assert replay.differences == []
    assert replay.handed == {}  # the server ended no lease that time mode did not
    # the comparisons happened, in numbers that matter: hundreds of leases ended, thousands of lent decisions
    assert result.leases_ended >= 50 and replay.leases_compared == result.leases_ended
    assert result.leases_renewed >= 100 and replay.renewals_compared == result.leases_renewed
    assert replay.lent_compared >= 1000 and replay.binds_compared >= 1000 and replay.reservations_compared >= 10_000
