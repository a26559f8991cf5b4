"""Whether GPU sizes alone set a higher floor than the sliver bound: the cutting-stock LP of the slices.

extender/sim/bounds.py's sliver floor (2.53% on openb default at 100% arrived) counts only the rooms of
slices over 500 milli that smaller slices cannot fill. Mid-size slices leave waste too (two 470-milli
slices leave 60 milli), so a floor over every slice size is higher (3.10% on openb default). This computes one, ignoring
nodes, CPU, memory and GPU models (a relaxation, so still a floor):

* Every whole-GPU pod is placed (dropping one frees k GPUs that slices could at best refill), leaving
  B = GPUs - whole GPUs asked for the slices.
* Packing the slices (sizes s_i, n_i of each) into B GPUs of 1000 milli is a cutting-stock problem. Its
  linear relaxation over GPU patterns (how many of each size share one GPU) is solved by column
  generation: the LP over the patterns found so far, then a bounded knapsack over 1000 milli priced by
  the LP's duals finds a better pattern, until none is (Gilmore and Gomory, Operations Research 9(6),
  1961).
* The floor is certified by weak duality, whatever the solver's accuracy: for any prices y_i >= 0,
  packed milli <= B * max over patterns of sum(a_i (s_i - y_i)) + sum(n_i y_i), the maximum taken by
  the exact knapsack. Unallocated >= B * 1000 - that.

    python bench/slice_lp.py ../shared/data/openb/openb_pod_list_default.csv \
        --nodes ../shared/data/openb/openb_node_list_gpu_node.csv [--seeds 42-51]

Needs scipy (its HiGHS LP solver; not a dependency of tessera: `pip install scipy`). Data: Alibaba
cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from extender.cli.args import seeds_arg
from extender.cli.simulate import check_packable
from extender.core.model import MILLI_PER_GPU, PodRequest
from extender.sim.bounds import arrived_prefix, sliver_lower_bound_milli
from extender.sim.packing import inflate
from extender.sim.trace import load_nodes, load_pods

Pattern = dict[int, int]  # size index -> how many of that size share one GPU


def best_pattern(sizes: list[int], counts: list[int], prices: list[float]) -> tuple[float, Pattern]:
    """The bounded knapsack over one GPU: the pattern of most sum(price), at most counts[i] of size i."""
    best: list[tuple[float, Pattern]] = [(0.0, {})] * (MILLI_PER_GPU + 1)
    for i, (size, count, price) in enumerate(zip(sizes, counts, prices, strict=True)):
        if price <= 0:
            continue
        left, chunk = min(count, MILLI_PER_GPU // size), 1
        while left:  # binary split of the bound: each chunk is one 0/1 item
            take, left, chunk = min(chunk, left), left - min(chunk, left), chunk * 2
            weight, value = size * take, price * take
            for room in range(MILLI_PER_GPU, weight - 1, -1):
                got = best[room - weight][0] + value
                if got > best[room][0] + 1e-9:
                    pattern = dict(best[room - weight][1])
                    pattern[i] = pattern.get(i, 0) + take
                    best[room] = (got, pattern)
    return max(best, key=lambda b: b[0])


def slice_floor_milli(pods: list[PodRequest], gpus: int) -> tuple[int, int]:
    """(the LP floor on unallocated milli, column-generation rounds) for the arrived `pods` on `gpus` GPUs."""
    import numpy as np
    from scipy.optimize import linprog

    whole = sum(p.gpu_count for p in pods if p.gpu_count and not p.is_slice)
    by_size = Counter(p.gpu_milli for p in pods if p.is_slice)
    if not by_size:  # no slice: nothing is left in rooms, and the LP has no column to solve for
        return 0, 0
    sizes = sorted(by_size)
    counts = [by_size[s] for s in sizes]
    bins = gpus - whole
    patterns: list[Pattern] = [{i: min(counts[i], MILLI_PER_GPU // s)} for i, s in enumerate(sizes)]
    rounds = 0
    while True:
        rounds += 1
        a = np.zeros((len(sizes) + 1, len(patterns)))
        a[0, :] = 1  # each pattern uses one GPU
        for j, pattern in enumerate(patterns):
            for i, k in pattern.items():
                a[1 + i, j] = k
        value = -(a[1:].T @ np.array(sizes, float))  # linprog minimises
        lp = linprog(value, A_ub=a, b_ub=np.array([bins, *counts], float), bounds=(0, None), method="highs")
        if lp.status != 0:
            raise RuntimeError(f"the LP failed: {lp.message}")
        duals = [max(0.0, -m) for m in lp.ineqlin.marginals]
        per_gpu, pattern = best_pattern(sizes, counts, [s - y for s, y in zip(sizes, duals[1:], strict=True)])
        if per_gpu <= duals[0] + 1e-6 or pattern in patterns:
            break
        patterns.append(pattern)
    packed_at_most = bins * per_gpu + sum(n * y for n, y in zip(counts, duals[1:], strict=True))
    return max(0, int(bins * MILLI_PER_GPU - packed_at_most)), rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(42, 52)))
    args = ap.parse_args()
    try:
        import scipy  # noqa: F401
    except ImportError:
        ap.error("needs scipy for its LP solver (pip install scipy); tessera itself does not")
    try:
        check_packable(args.trace, args.nodes)  # no pods, no GPU pod, no GPU node: said in one line
        nodes, pods = load_nodes(args.nodes), [p.request for p in load_pods(args.trace)]
    except ValueError as e:  # TraceError too
        ap.error(str(e))
    gpus = sum(n.gpu_count for n in nodes)
    capacity = gpus * MILLI_PER_GPU
    print("seed  sliver floor %  slice LP floor %  rounds")
    sliver, lp = [], []
    for seed in args.seeds:
        arrived = arrived_prefix(inflate(pods, capacity, seed), capacity)
        floor, rounds = slice_floor_milli(arrived, gpus)
        sliver.append(100 * sliver_lower_bound_milli(arrived, capacity) / capacity)
        lp.append(100 * floor / capacity)
        print(f"{seed:4d}  {sliver[-1]:15.2f}  {lp[-1]:16.2f}  {rounds:6d}")
    print(f"mean  {statistics.mean(sliver):15.2f}  {statistics.mean(lp):16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
