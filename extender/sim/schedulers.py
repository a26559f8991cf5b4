"""How a policy's node scores become one choice: the paper's way, and kube-scheduler's way.

`ideal`: full score resolution, ties go to a fixed seeded node order (the FGD artifact's
vendored scheduler picks the smallest node name, and names carry a seeded permutation index).

`kube`: what upstream kube-scheduler 1.20 does with an extender (docs/extender-protocol.md
§2.8): the extender's integer 0..10 score times its weight times 10, plus the default score
plugins that vary with node state (LeastAllocated + BalancedAllocation, 0..100 each), the
highest total wins and ties are broken uniformly at random.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from ..core.cluster import Cluster, NodeState
from ..core.kube_scores import MAX_PLUGINS_SCORE, default_plugins_score
from ..core.model import PodRequest
from ..core.policy import NodeScore, Policy

SCHEDULERS = ("ideal", "kube")
DEFAULT_EXTENDER_WEIGHT = 100


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeState
    gpus: tuple[int, ...]


class _ScoreCache:
    """Per-node memo of a policy's verdicts, dropped whenever the node's state changes."""

    def __init__(self, policy: Policy, cluster: Cluster) -> None:
        self.policy = policy
        self._entries: list[tuple[int, dict]] = [(-1, {}) for _ in cluster.nodes]

    def verdict(self, pod: PodRequest, key: tuple, node: NodeState) -> NodeScore | None:
        version, memo = self._entries[node.index]
        if version != node.version:
            memo = {}
            self._entries[node.index] = (node.version, memo)
        else:
            hit = memo.get(key, memo)
            if hit is not memo:
                return hit
        verdict = None if self.policy.filter(pod, node) is not None else self.policy.score(pod, node)
        if self.policy.cacheable:
            memo[key] = verdict
        return verdict


class Scheduler:
    """Chooses a node and GPUs for one pod at a time against a live `Cluster`."""

    def __init__(self, cluster: Cluster, policy: Policy, seed: int) -> None:
        self.cluster = cluster
        self.policy = policy
        self.rng = random.Random(seed)
        self._cache = _ScoreCache(policy, cluster)

    def verdicts(self, pod: PodRequest, nodes=None):
        key = pod.key
        verdict = self._cache.verdict
        for node in self.cluster.nodes if nodes is None else nodes:
            v = verdict(pod, key, node)
            if v is not None:
                yield node, v

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        raise NotImplementedError

    def reasons(self, pod: PodRequest) -> Counter[str]:
        """Why each node refuses the pod, counted: the words of a FitError."""
        return Counter(r for n in self.cluster.nodes if (r := self.policy.filter(pod, n)) is not None)


class IdealScheduler(Scheduler):
    def __init__(self, cluster: Cluster, policy: Policy, seed: int) -> None:
        super().__init__(cluster, policy, seed)
        self.order = list(cluster.nodes)
        random.Random(seed).shuffle(self.order)

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        best_node, best = None, None
        for node, v in self.verdicts(pod, self.order if nodes is None else nodes):
            if best is None or v.value > best.value:
                best_node, best = node, v
        return None if best is None else Choice(best_node, best.gpus)


class KubeScheduler(Scheduler):
    def __init__(self, cluster: Cluster, policy: Policy, seed: int, weight: int = DEFAULT_EXTENDER_WEIGHT) -> None:
        super().__init__(cluster, policy, seed)
        self.weight = weight

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        found = list(self.verdicts(pod, nodes))
        if not found:
            return None
        if len(found) == 1:  # kube-scheduler skips scoring when one node is left
            node, v = found[0]
            return Choice(node, v.gpus)
        if self.policy.uses_extender:
            ext = self.policy.extender_scores([v for _, v in found])
        else:
            ext = [0] * len(found)
        scale = self.weight * 10
        candidates = zip(found, ext, strict=True)
        if scale > MAX_PLUGINS_SCORE:  # one extender level outweighs the plugins: only the top level can win
            top = max(ext)
            candidates = [(f, e) for f, e in zip(found, ext, strict=True) if e == top]
        best_total, ties = None, []
        for (node, v), e in candidates:
            total = e * scale + default_plugins_score(pod, node)
            if best_total is None or total > best_total:
                best_total, ties = total, [(node, v)]
            elif total == best_total:
                ties.append((node, v))
        node, v = ties[0] if len(ties) == 1 else self.rng.choice(ties)
        return Choice(node, v.gpus)


def make_scheduler(kind: str, cluster: Cluster, policy: Policy, seed: int, weight: int = DEFAULT_EXTENDER_WEIGHT) -> Scheduler:
    if kind == "ideal":
        return IdealScheduler(cluster, policy, seed)
    if kind == "kube":
        return KubeScheduler(cluster, policy, seed, weight)
    raise ValueError(f"unknown scheduler {kind!r}; known: {', '.join(SCHEDULERS)}")
