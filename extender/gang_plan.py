"""Where a gang's members go: the placement half of gang admission (gangs.py).

Members are placed on the live cluster (the caller keeps what was placed or gives it all back), each only on
nodes kube-scheduler offered its kube shape, never where its taints or another pod's claim (a reservation, a
nomination, another gang's drain) shut it out. Per kind of member (request, tolerations, kube shape), biggest
first: the nodes are ranked once by the policy's score and filled in that order, never stepping back (a node
that stopped fitting a kind does not fit its next member either: the gang only adds load). So a gang packs onto
few nodes, as the policy would order them, in O(nodes + members) fit checks per kind.
"""

from __future__ import annotations

from collections.abc import Callable

from .core.cluster import Cluster
from .core.model import MILLI_PER_GPU, Assignment, PodRequest
from .core.placer import Placer
from .offers import Mask, Offers
from .state import PodInfo, Tolerations

# Kinds of member one admission places (request, tolerations, kube shape): real gangs have one to three (a
# launcher, workers); each kind costs a ranking pass over the nodes.
MAX_KINDS = 16

Blocked = Callable[[Tolerations], list[tuple[set[str], str]]]  # tainted node groups a pod may not use, with why
Closed = Callable[[PodInfo], set[str]]  # nodes other pods' claims (reservations, nominations, drains) close to it
Placed = list[tuple[PodInfo, Assignment]]


class GangPlan:
    def __init__(self, cluster: Cluster, placer: Placer, offers: Offers, blocked: Blocked, closed: Closed) -> None:
        self.cluster, self.placer, self.offers, self.blocked, self.closed = cluster, placer, offers, blocked, closed

    def place(self, members: list[PodInfo], offers: dict[str, Mask | bool], title: str,
              pin: tuple[str, Mask] | None = None, prefer: frozenset[str] = frozenset()) -> Placed | str:
        """As many of `members` as fit, placed (`pin`: the one member a bind names, only on its node; `prefer`: nodes
        drained for the gang, filled first); or why the gang cannot be planned at all."""
        kinds: dict[tuple, list[tuple[PodInfo, PodRequest]]] = {}
        for i in members:
            r = self.placer.request_for(i.request)
            kinds.setdefault((r.key, i.tolerations, i.kube_shape, pin is not None and i.uid == pin[0]), []).append((i, r))
        if len(kinds) > MAX_KINDS:
            return (f"tessera: the members of {title} differ in {len(kinds)} ways (request, tolerations, "
                    f"kube-scheduler's own constraints); Tessera admits gangs of at most {MAX_KINDS} kinds of member")
        ranked: dict[tuple, list[str]] = {}
        done: Placed = []
        for (rkey, tolerations, shape, pinned), group in sorted(kinds.items(), key=lambda kv: _size(kv[1][0][1]),
                                                                reverse=True):
            if rkey not in ranked:
                order = self.ranked(group[0][1])
                # what the gang drained is its own: taken before anyone else's room
                ranked[rkey] = [n for n in order if n in prefer] + [n for n in order if n not in prefer] if prefer else order
            mask = pin[1] if pin is not None and pinned else offers.get(shape)
            if mask is not False:
                done += self._fill(group, ranked[rkey], mask, tolerations)
        return done

    def _fill(self, group: list[tuple[PodInfo, PodRequest]], order: list[str], mask: Mask,
              tolerations: Tolerations) -> Placed:
        shut = set().union(*(names for names, _ in self.blocked(tolerations)), self.closed(group[0][0]))
        by_name, done, cursor = self.cluster.by_name, [], 0
        for info, request in group:
            while cursor < len(order):
                name = order[cursor]
                node = by_name.get(name)
                if node is not None and name not in shut and self.offers.allows(mask, name) \
                        and self.placer.fits(request, node) is None:
                    verdict = self.placer.verdict(request, node)
                    if verdict is not None:
                        done.append((info, self.cluster.place(request, name, self.placer.gpus_for(request, node, verdict))))
                        break
                cursor += 1
            if cursor >= len(order):
                break
        return done

    def ranked(self, request: PodRequest) -> list[str]:
        """Every node the request fits now, best first by the policy's verdict."""
        return self.placer.best_first(request)

    def never(self, title: str, todo: list[PodInfo], need: int) -> str:
        """Words when the `need` members still to place could not fit even the empty cluster's healthy GPUs: the
        smallest that exist, and as many more as are not created yet, each asking what the smallest asks."""
        demand = sorted(self.placer.request_for(i.request).gpu_demand for i in todo)[:need]
        if not demand:
            return ""
        total = sum(demand) + demand[0] * (need - len(demand))
        if total <= self.cluster.open_milli:
            return ""
        return (f"tessera: {title} needs {total / MILLI_PER_GPU:g} GPUs for the {need} members still to place; "
                f"the cluster has {self.cluster.open_milli / MILLI_PER_GPU:g} healthy GPUs in all")

    def candidates(self, ready: list[PodInfo], offers: dict[str, Mask | bool]) -> list[str]:
        """The nodes every kind of `ready` was offered and none is shut out of: where a drain may take nodes."""
        shut = set().union(*(names for names, _ in self.blocked(ready[0].tolerations)), self.closed(ready[0]))
        masks = [m for m in offers.values() if m is not False]
        return [n.name for n in self.cluster.nodes if n.name not in shut and all(self.offers.allows(m, n.name) for m in masks)]


def _size(request: PodRequest) -> tuple:
    return request.gpu_demand, request.cpu_milli, request.memory_mib
