"""Who recovers: after a failed step, decide survivors, the state source and the steps redone.

Pure: the controller feeds it what each trainer's step call ended in. Rules (docs/ray-notes.md §6):
a survivor's allreduce may have completed before the peer died while another's failed, so the
survivors may differ by one step; the one furthest ahead is the state source and the others
load its state. A trainer that neither answered nor failed within the group timeout is treated
as lost (a frozen peer) and is killed, so it cannot come back as a second copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    DONE = "done"  # the step completed on this trainer
    BROKEN = "broken"  # alive, but its group failed (a peer is gone)
    DEAD = "dead"  # the actor is gone (node lost, process killed)
    HUNG = "hung"  # no answer within the timeout


@dataclass(frozen=True, slots=True)
class Plan:
    survivors: tuple[str, ...]
    lost: tuple[str, ...]
    source: str  # survivor whose state the others adopt ("" when no survivor)
    lagging: tuple[str, ...]  # survivors that must load the source's state
    resume_step: int  # the source's completed step; the job continues at resume_step + 1
    redone: int  # steps that had been asked for and must run again (0 or 1 with survivors)


def plan_recovery(step: int, outcomes: dict[str, Outcome], steps: dict[str, int]) -> Plan:
    """`step`: the step that was asked for; `steps`: each survivor's completed step."""
    survivors = tuple(n for n, o in outcomes.items() if o in (Outcome.DONE, Outcome.BROKEN))
    lost = tuple(n for n, o in outcomes.items() if o in (Outcome.DEAD, Outcome.HUNG))
    if not survivors:
        return Plan((), lost, "", (), -1, -1)
    unknown = [n for n in survivors if n not in steps]
    if unknown:
        raise ValueError(f"no completed step reported for survivors {unknown}")
    source = max(survivors, key=lambda n: (steps[n], -survivors.index(n)))
    resume = steps[source]
    lagging = tuple(n for n in survivors if steps[n] != resume)
    return Plan(survivors, lost, source, lagging, resume, max(0, step - resume))
