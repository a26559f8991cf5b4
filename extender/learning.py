"""Workload learning: the policy the extender runs is built for the task mix it has watched.

Tessera's fragmentation score weighs each node by the workload it expects (docs/fragmentation.md),
so a running extender starts from a prior (the openb default trace's mix, or the one `serve` was
given) and relearns from the pods the watch delivers. Relearning is not free: a new policy starts
its verdict caches afresh (a 5000-node cluster pays about 100 ms per request shape), so it happens
on a doubling schedule and only when the mix moved by more than sampling noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .core.model import PodRequest
from .core.policy import Policy, PolicyContext, make_policy
from .core.workload import TargetWorkload, WorkloadLearner

# the mix of the first 20 pods is already a usable estimate; past 5000 pods the doubling schedule's
# gaps would grow without bound, so relearning goes on every 5000 pods instead
FIRST_RELEARN = 20
RELEARN_EVERY = 5000


def relearn_due(seen: int, learned_at: int) -> bool:
    """At 20, 40, 80 ... pods seen, then every 5000: the mix settles quickly."""
    if seen < FIRST_RELEARN:
        return False
    return seen >= 2 * learned_at if seen <= RELEARN_EVERY else seen - learned_at >= RELEARN_EVERY


def noise_tolerance(seen: int) -> float:
    """How far a task type's share may move before it is a new mix: 3 standard errors of a share near 1/2.

    The standard error of a share p over n pods is sqrt(p(1-p)/n), 0.5/sqrt(n) at p = 1/2; never
    below 2 points, so a large cluster does not rebuild its caches for a drift nobody would notice.
    """
    return max(0.02, 1.5 / math.sqrt(seen))


def close_enough(a: TargetWorkload, b: TargetWorkload, tolerance: float) -> bool:
    """Same task types, each weight within `tolerance`: not worth recomputing every score for."""
    wa, wb = dict(a.types), dict(b.types)
    return wa.keys() == wb.keys() and all(abs(wa[t] - wb[t]) <= tolerance for t in wa)


@dataclass(slots=True)
class WorkloadLearning:
    """Counts the watched pods and says when the policy should be rebuilt for what they show.

    `fixed` (a workload `serve` was given) turns relearning off; the pods are still counted.
    """

    policy_name: str
    memo_limit: int
    fixed: TargetWorkload | None = None
    learner: WorkloadLearner = field(default_factory=WorkloadLearner)
    learned_at: int = 0  # pods seen at the last relearn
    seed: int = 0  # the policy's (Random-fit's draws, tessera's node order): a replay's seed reproduces it

    def policy_for(self, workload: TargetWorkload) -> Policy:
        """The extender's policy for `workload`, with its fragmentation memo bounded to `memo_limit` entries."""
        return make_policy(self.policy_name, PolicyContext(workload, self.seed, options={"memo_limit": self.memo_limit}))

    def observe(self, request: PodRequest, running: TargetWorkload, namespace: str = "") -> Policy | None:
        """Count a newly watched pod; a new policy when the mix learned so far is no longer `running`'s."""
        self.learner.observe(request, namespace)
        seen = self.learner.observed
        if self.fixed is not None or not relearn_due(seen, self.learned_at):
            return None
        self.learned_at = seen
        learned = self.learner.workload()
        if close_enough(learned, running, noise_tolerance(seen)):
            return None
        return self.policy_for(learned)
