"""A lower bound on unallocated GPUs that no placement policy can beat.

A slice of m > 500 milli cannot share its GPU with another such slice, so the room it leaves,
1000 - m, can only be filled by slices no larger than that room. For a room size u, take the big
slices that leave at most u (rooms W_u if all are placed) and the slices of at most u milli (S_u in
all). Every placement pays twice over, and must cover the larger of the two:

* unallocated = (capacity - arrived demand) + the demand it refused;
* unallocated >= (rooms of the big slices it placed) - S_u, since only slices <= u fill them.

Refusing a big slice of m lowers the second by 1000 - m and raises the first by m, so the best any
policy can do is to refuse just enough of them, the smallest first (most room given up per milli
refused), that the two meet. The bound is that meeting point, maximised over u. On the openb default
trace at 100% arrived it is about 2.5% of capacity, from the 810-milli slices (13% of pods): at most
(W_u - S_u) * 810 / 1000, not W_u - S_u, because refusing one of them frees a whole GPU for others.

An earlier version returned W_u - S_u itself (3.12% on openb), counting a refused slice's demand
and its room as if both were lost; four whole-GPU pods and ten 600-milli slices on ten GPUs show the
difference: six slices placed and four refused leave 2400 milli, under the 4000 it claimed.
bench/slice_lp.py gives the stronger floor over every slice size (3.10% on openb), with an LP solver.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.model import MILLI_PER_GPU, PodRequest


def sliver_lower_bound_milli(pods: Iterable[PodRequest], capacity_milli: int) -> int:
    """The least unallocated milli-GPU of any placement of `pods` on `capacity_milli` of GPUs."""
    pods = list(pods)
    slack = capacity_milli - sum(p.gpu_demand for p in pods)  # unallocated even if every pod is placed
    slices = sorted(p.gpu_milli for p in pods if p.is_slice)
    best = max(0, slack)
    for u in {MILLI_PER_GPU - m for m in slices if 2 * m > MILLI_PER_GPU}:
        big = [m for m in slices if 2 * m > MILLI_PER_GPU and MILLI_PER_GPU - m <= u]  # ascending
        best = max(best, _meeting_point(slack, sum(MILLI_PER_GPU - m for m in big) - sum(m for m in slices if m <= u), big))
    return best


def _meeting_point(refused: int, unfilled: int, big: list[int]) -> int:
    """min over refusals of max(refused demand, unfilled room): refuse the smallest big slices first."""
    for m in big:
        if refused + m >= unfilled - (MILLI_PER_GPU - m):  # they meet within this slice, refused in part
            return refused + max(0, unfilled - refused) * m // MILLI_PER_GPU
        refused, unfilled = refused + m, unfilled - (MILLI_PER_GPU - m)
    return max(refused, unfilled)


def arrived_prefix(pods: list[PodRequest], capacity_milli: int, arrived_pct: float = 100.0) -> list[PodRequest]:
    """The pods that have arrived by the time `arrived_pct` of capacity was requested."""
    out, total = [], 0
    limit = capacity_milli * arrived_pct / 100
    for p in pods:
        total += p.gpu_demand
        if total > limit:
            break
        out.append(p)
    return out
