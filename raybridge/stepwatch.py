"""Watching one training step: who completed it, whose group broke, who is dead, who is frozen.

Who is dead is never guessed from a slow answer:
  * a trainer whose process closed its liveness connection is dead (liveness.py: milliseconds after
    its node or pod dies); so is one that Ray names dead (ActorDiedError);
  * when a step fails or runs longer than `probe_after_s`, the trainers that have not answered are
    pinged in their `control` concurrency group, which answers even while a step is blocked; a ping
    unanswered for `probe_timeout_s` means a frozen process (SIGSTOP, a partition, a machine gone
    without a TCP reset): it is HUNG and the controller fences it (kills and replaces it). A slow but
    live trainer answers its ping, however long its step takes, and keeps its place;
  * once one is known dead or frozen, the trainers still inside the allreduce are told to leave it
    (`abort_group`) instead of waiting out the group timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .collective import CollectiveBroken
from .policy import Outcome


@dataclass
class StepResult:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    seen: float = 0.0  # when the first failure was seen (monotonic), 0 when none
    fenced: list[str] = field(default_factory=list)  # HUNG: pings unanswered


def watch_step(group, liveness, refs: dict, probe_after_s: float, probe_timeout_s: float,
               group_timeout_s: float, poll_s: float = 0.01) -> StepResult:
    """`refs`: train_step ref -> trainer name. Returns when every trainer's outcome is known."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    out = StepResult()
    began = time.monotonic()
    hard_deadline = began + group_timeout_s + probe_timeout_s + 5
    pending = dict(refs)
    pings: dict[str, tuple[object, float]] = {}  # name -> (ping ref, sent at)
    aborted = False
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
        now = time.monotonic()
        for ref in ready:
            name = pending.pop(ref)
            try:
                _, out.losses[name] = ray.get(ref)
                out.outcomes[name] = Outcome.DONE
            except CollectiveBroken:
                out.outcomes[name] = Outcome.BROKEN
            except (RayActorError, GetTimeoutError):
                out.outcomes[name] = Outcome.DEAD
        gone = liveness.gone()
        for ref, name in list(pending.items()):
            if name in gone:  # its process closed its connection: dead, whatever Ray says yet
                del pending[ref]
                out.outcomes[name] = Outcome.DEAD
                out.seen = min(out.seen or gone[name], gone[name])  # when the connection closed, not this poll
        failed = any(o is not Outcome.DONE for o in out.outcomes.values())
        if pending and (failed or now - began > probe_after_s):
            _probe(group, pending, pings, out, now, probe_timeout_s)
        if not out.seen and any(o is not Outcome.DONE for o in out.outcomes.values()):
            out.seen = now
        lost = any(o in (Outcome.DEAD, Outcome.HUNG) for o in out.outcomes.values())
        if lost and pending and not aborted:
            aborted = True
            for name in pending.values():
                group.control(name, "abort_group", group.prefix())
        if now > hard_deadline:
            break
    for name in pending.values():
        out.outcomes[name] = Outcome.HUNG
        out.fenced.append(name)
        out.seen = out.seen or time.monotonic()
    return out


def _probe(group, pending: dict, pings: dict, out: StepResult, now: float, probe_timeout_s: float) -> None:
    """Ping the trainers that have not answered; one whose ping stays unanswered is HUNG."""
    import ray
    from ray.exceptions import RayActorError

    for ref, name in list(pending.items()):
        sent = pings.get(name)
        if sent is None:
            pings[name] = (group.control(name, "ping"), now)
            continue
        ping, at = sent
        done, _ = ray.wait([ping], timeout=0)
        if done:
            try:
                ray.get(ping)
                if now - at > 0.2:  # alive; ask again now and then (it may freeze later)
                    pings[name] = (group.control(name, "ping"), now)
            except RayActorError:
                del pending[ref]
                out.outcomes[name] = Outcome.DEAD
        elif now - at > probe_timeout_s:
            del pending[ref]
            out.outcomes[name] = Outcome.HUNG
            out.fenced.append(name)


def wait_all(ray, liveness, refs: list, names: list[str], timeout_s: float) -> float:
    """Wait for `refs` (calls on the trainers `names`, outside a step: forming a group, copying a member's state): 0
    when all succeeded, else when a failure was seen. A closed liveness connection of one of `names` counts at once:
    Ray would name that actor dead only after its node's health check fails (hundreds of milliseconds)."""
    pending = list(refs)
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.01)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                return time.monotonic()
        gone = liveness.gone()
        if any(n in gone for n in names):
            return min(gone[n] for n in names if n in gone)
        if time.monotonic() > deadline:
            return time.monotonic()
    return 0.0


def unanswered(ray, group, liveness, names: list[str], probe_timeout_s: float) -> list[str]:
    """Which of `names` are dead after a failure outside a step: a closed liveness connection, no actor left, or a
    ping (the `control` concurrency group) unanswered for `probe_timeout_s`."""
    gone = liveness.gone()
    dead = []
    pings = {n: group.control(n, "ping") for n in names if n not in gone and n in group.actors}
    for n in names:
        if n in gone or n not in pings:
            dead.append(n)
            continue
        try:
            ray.get(pings[n], timeout=probe_timeout_s)
        except Exception:
            dead.append(n)
    return dead
