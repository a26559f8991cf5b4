"""Gang admission: whether the members of a gang not placed yet all fit the cluster now, at once.

Like the coscheduling plugin's PreFilter: filter and bind refuse a gang member while its whole gang
cannot be placed, so no member holds GPUs that the rest cannot join. Pure: it reads the cluster
through the `Placer` (the policy's own feasibility, on requests as the policy accounts them) and
changes nothing; the Extender holds the gangs' members and calls `shortfall` under its lock.
"""

from __future__ import annotations

from .core.cluster import NodeState
from .core.model import MILLI_PER_GPU, PodRequest
from .core.placer import Placer
from .core.policy import tightest_gpus
from .state import Gang

# Distinct member shapes (request keys) a gang's fit check simulates; a gang with more gets the
# O(1) capacity check only. Real gangs have one to three (a head and its workers).
MAX_GANG_SHAPES = 8

Waiting = tuple[int, dict[tuple, list]]  # (members placed, {request key: [request, members still to place]})
Blocked = list[tuple[set[str], str]]  # tainted nodes the pod may not use, grouped, with the reason


def shortfall(placer: Placer, gang: Gang, waiting: Waiting, blocked: Blocked, max_gang_waits: int) -> tuple[str, bool]:
    """('', _) when every member not yet placed fits the cluster now, all at once; else (why not, never fits).

    Bounded work whatever the gang's size: O(1) checks first (the most binds that can wait
    at once, the cluster's healthy GPU capacity: both "never", preemption cannot help), then
    one pass over the nodes that packs as many members onto each as fit, biggest members
    first: at most one policy filter per member placed plus one per node and shape that
    stops fitting (it was members x nodes filters and scores). First fit is not the policy's
    own choice of node, so it can differ from the real placements at the margin; a gang
    admitted wrongly times out in its bind and gives everything back.
    """
    placed, groups = waiting
    todo = sum(c for _, c in groups.values())
    if todo <= 0:
        return "", False
    if gang.size > max_gang_waits + 1:
        return (f"tessera: gang {gang.name} has {gang.size} members; this extender binds a gang by holding all but "
                f"one bind open at once, and holds at most {max_gang_waits}, so gangs of at most "
                f"{max_gang_waits + 1} members (an admin raises this with tessera serve's --threads "
                f"and --max-gang-waits)", True)
    demand = sum(r.gpu_count * r.gpu_milli * c for r, c in groups.values())
    cluster = placer.cluster
    if demand > cluster.open_milli:
        return (f"tessera: gang {gang.name} needs {demand / MILLI_PER_GPU:g} GPUs for its {todo} members still to "
                f"place; the cluster has {cluster.open_milli / MILLI_PER_GPU:g} healthy GPUs in all", True)
    if len(groups) > MAX_GANG_SHAPES:  # too many shapes to simulate: the free totals decide
        whole = sum(r.gpu_count * c for r, c in groups.values() if r.gpu_milli == MILLI_PER_GPU)
        if demand <= cluster.free_milli and whole <= cluster.whole_gpus_free:
            return "", False
        return (f"tessera: gang {gang.name} needs {demand / MILLI_PER_GPU:g} GPUs free for its {todo} members "
                f"still to place; the cluster has {cluster.free_milli / MILLI_PER_GPU:g} free now", False)
    fitted = pack(placer, groups, todo, blocked)
    if fitted == todo:
        return "", False
    return (f"tessera: gang {gang.name} needs {gang.size} pods placed together; "
            f"only {placed + fitted} fit now, waiting for room for the whole gang", False)


def pack(placer: Placer, groups: dict[tuple, list], todo: int, blocked: Blocked) -> int:
    """How many of the waiting members fit the free capacity at once (first fit, biggest first)."""
    left = sorted(([r, c] for r, c in groups.values()),
                  key=lambda g: (g[0].gpu_count * g[0].gpu_milli, g[0].cpu_milli, g[0].memory_mib), reverse=True)
    fitted = 0
    for node in placer.cluster.nodes:
        if any(node.name in group for group, _ in blocked):
            continue
        scratch: NodeState | None = None
        for g in left:
            request: PodRequest = g[0]
            while g[1] and placer.fits(request, scratch or node) is None:
                if scratch is None:  # a copy of what is free: the real node is never touched
                    scratch = _copy(node)
                _take(scratch, request)
                g[1] -= 1
                fitted += 1
                if fitted == todo:
                    return fitted
        left = [g for g in left if g[1]]
    return fitted


def _copy(node: NodeState) -> NodeState:
    scratch = NodeState(node.spec, -1)
    scratch.cpu_free, scratch.memory_free = node.cpu_free, node.memory_free
    scratch.gpu_free = list(node.gpu_free)
    return scratch


def _take(scratch: NodeState, request: PodRequest) -> None:
    scratch.cpu_free -= request.cpu_milli
    scratch.memory_free -= request.memory_mib
    for gpu in tightest_gpus(scratch, request):
        scratch.gpu_free[gpu] -= request.gpu_milli
