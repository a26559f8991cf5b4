"""How a policy's node scores become one choice: the paper's way, and kube-scheduler's way.

`ideal`: full score resolution, ties go to a fixed seeded node order (the FGD artifact's
vendored scheduler picks the smallest node name, and names carry a seeded permutation index).

`kube`: what upstream kube-scheduler 1.20 does with an extender (docs/wire-protocol.md
§5): the extender's integer 0..10 score times its weight times 10, plus the default score
plugins that vary with node state (LeastAllocated + BalancedAllocation, 0..100 each), the
highest total wins and ties are broken uniformly at random. The shipped configuration sends every
pod to the extender (`extender_sees="all"`); `extender_sees="gpu"` models one whose
managedResources list the GPU resources, so that CPU-only pods are placed by kube's plugins alone
(measured on openb: that costs Tessera 4.8 points of unallocated GPUs).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from ..core.cluster import Cluster, NodeState
from ..core.kube_scores import MAX_PLUGINS_SCORE, default_plugins_score
from ..core.model import PodRequest
from ..core.node_memo import NodeMemo
from ..core.policy import NodeScore, Policy
from ..core.verdicts import VerdictCache

SCHEDULERS = ("ideal", "kube")
EXTENDER_SEES = ("gpu", "all")  # which pods kube-scheduler sends to the extender
DEFAULT_EXTENDER_WEIGHT = 100


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeState
    gpus: tuple[int, ...]


class Scheduler:
    """Chooses a node and GPUs for one pod at a time against a live `Cluster`."""

    def __init__(self, cluster: Cluster, policy: Policy, seed: int) -> None:
        self.cluster = cluster
        self.policy = policy
        self.rng = random.Random(seed)
        self._cache = VerdictCache(policy)

    def verdicts(self, pod: PodRequest, nodes=None) -> list[tuple[NodeState, NodeScore]]:
        return self._cache.feasible(pod, self.cluster.nodes if nodes is None else nodes)

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        raise NotImplementedError

    def _choice(self, pod: PodRequest, node: NodeState, verdict: NodeScore) -> Choice:
        gpus = verdict.gpus if verdict.gpus is not None else self.policy.pick_gpus(pod, node)
        return Choice(node, gpus)

    def reasons(self, pod: PodRequest) -> Counter[str]:
        """Why each node refuses the pod, counted: the words of a FitError."""
        return Counter(r for n in self.cluster.nodes if (r := self.policy.filter(pod, n)) is not None)


class IdealScheduler(Scheduler):
    def __init__(self, cluster: Cluster, policy: Policy, seed: int) -> None:
        super().__init__(cluster, policy, seed)
        self.order = list(cluster.nodes)
        random.Random(seed).shuffle(self.order)

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        found = self.verdicts(pod, self.order if nodes is None else nodes)
        if not found:
            return None
        if self.policy.random_ties:
            top = max(v.value for _, v in found)
            node, v = self.rng.choice([(n, v) for n, v in found if v.value == top])
            return self._choice(pod, node, v)
        best_node, best = found[0]
        for node, v in found:
            if v.value > best.value:
                best_node, best = node, v
        return self._choice(pod, best_node, best)


class KubeScheduler(Scheduler):
    def __init__(
        self, cluster: Cluster, policy: Policy, seed: int, weight: int = DEFAULT_EXTENDER_WEIGHT, extender_sees: str = "all"
    ) -> None:
        super().__init__(cluster, policy, seed)
        if extender_sees not in EXTENDER_SEES:
            raise ValueError(f"extender_sees must be one of {', '.join(EXTENDER_SEES)}")
        self.weight = weight
        self.extender_sees = extender_sees
        # kube's own state-dependent score per node version and (cpu, memory) request
        self._plugin_memo = NodeMemo()  # per node: {request key: kube plugins' score}

    def choose(self, pod: PodRequest, nodes=None) -> Choice | None:
        found = self.verdicts(pod, nodes)
        if not found:
            return None
        if len(found) == 1:  # kube-scheduler skips scoring when one node is left
            node, v = found[0]
            return self._choice(pod, node, v)
        if self.policy.uses_extender and (pod.gpu_count or self.extender_sees == "all"):
            ext = self.policy.extender_scores([v for _, v in found])
        else:
            ext = [0] * len(found)
        scale = self.weight * 10
        # one extender level outweighs the plugins (200 at most): only the top level can win
        floor = max(ext) if scale > MAX_PLUGINS_SCORE else None
        key = (pod.cpu_milli, pod.memory_mib)
        plugin_memo = self._plugin_memo.of
        best_total, ties = -1, []
        own = not self.policy.uses_extender  # stock kube-scheduler: its score *is* the plugins' sum
        for (node, v), e in zip(found, ext, strict=True):
            if floor is not None and e != floor:
                continue
            if own:
                total = v.value
                if total > best_total:
                    best_total, ties = total, [(node, v)]
                elif total == best_total:
                    ties.append((node, v))
                continue
            memo = plugin_memo(node)
            plugins = memo.get(key)
            if plugins is None:
                plugins = memo[key] = default_plugins_score(pod, node)
            total = e * scale + plugins
            if total > best_total:
                best_total, ties = total, [(node, v)]
            elif total == best_total:
                ties.append((node, v))
        node, v = ties[0] if len(ties) == 1 else self.rng.choice(ties)
        return self._choice(pod, node, v)


def make_scheduler(
    kind: str, cluster: Cluster, policy: Policy, seed: int, weight: int = DEFAULT_EXTENDER_WEIGHT, extender_sees: str = "all"
) -> Scheduler:
    if kind == "ideal":
        return IdealScheduler(cluster, policy, seed)
    if kind == "kube":
        return KubeScheduler(cluster, policy, seed, weight, extender_sees)
    raise ValueError(f"unknown scheduler {kind!r}; known: {', '.join(SCHEDULERS)}")
