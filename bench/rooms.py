"""Where the unallocated GPUs are at 100% arrived, and how much of it any rearrangement could still use.

Packing mode leaves a few percent of GPU capacity unallocated when the arrived workload reaches 100%.
This splits that free capacity by the size of the room it sits in: whole free GPUs, and partial rooms
by 100-milli bucket. It then gives the most a perfect mover could reach if it filled every whole free
GPU and every partial room of `--fillable` milli or more (default 200) and nothing smaller: rooms under
200 milli take only slices of under 200, 1.3% of openb default's pods and fewer than its 810-milli
slices' rooms alone, the sliver floor of extender/sim/bounds.py. That "best" is no bound (a different
packing leaves different rooms) but shows what moves of placed pods into the rooms that exist can do.

    python bench/rooms.py ../shared/data/openb/openb_pod_list_default.csv \
        --nodes ../shared/data/openb/openb_node_list_gpu_node.csv [--policy tessera] [--seeds 42-51] \
        [--movable-share 0.3 [--repack]] [--fillable 200]

Data: Alibaba cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import statistics

from extender.cli.args import names_arg, seeds_arg, share_arg
from extender.cli.simulate import check_packable
from extender.core.cluster import Cluster
from extender.core.model import MILLI_PER_GPU, NodeSpec, PodRequest
from extender.core.policy import PolicyContext, make_policy, policy_names
from extender.core.workload import TargetWorkload
from extender.sim.bounds import arrived_prefix, sliver_lower_bound_milli
from extender.sim.packing import Mover, inflate, place_each
from extender.sim.schedulers import DEFAULT_EXTENDER_WEIGHT, Scheduler, make_scheduler
from extender.sim.trace import load_nodes, load_pods

BUCKETS = tuple(range(0, MILLI_PER_GPU, 100))


def rooms_at_full(nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int, share: float,
                  largest_first: bool = False, repack: bool = False) -> dict[str, float]:
    """Percent of GPU capacity: unallocated, in whole free GPUs, in each room bucket; and the sliver floor.
    `largest_first`: the same arrived pods, all known in advance, placed by GPU demand, largest first (offline).
    `repack` (with a movable share): at 100% arrived, lift every movable pod and place the lifted pods and the
    refused ones again, largest first, by the policy: the most one rearrangement of all the movable pods at once
    does with this placement rule (`moved`, `placed_after`; `dropped`: lifted pods it could not place again, which
    a real move may never do, so a run with any is no plan)."""
    cluster = Cluster(nodes)
    capacity = cluster.gpu_capacity_milli
    chooser = make_scheduler("ideal", cluster, make_policy(policy, PolicyContext(TargetWorkload.from_pods(pods), seed)),
                             seed, DEFAULT_EXTENDER_WEIGHT, "all")
    arrivals = inflate(pods, capacity, seed)
    if largest_first:
        arrivals = sorted(arrived_prefix(arrivals, capacity), key=lambda p: (p.gpu_demand, p.gpu_milli, p.cpu_milli),
                          reverse=True)
    arrived = 0
    mover = Mover(share, seed) if share > 0 else None
    refused: list[PodRequest] = []
    for pod, request, choice in place_each(chooser, arrivals, mover):
        arrived += pod.gpu_demand
        if choice is None:
            refused.append(request)
        if arrived >= capacity:
            break
    extra = _repack(chooser, mover, refused) if repack and mover is not None else {}
    out = {"whole": 0.0, **{f"{b}-{b + 99}": 0.0 for b in BUCKETS}}
    for node in cluster.nodes:
        for free in node.gpu_free:
            key = "whole" if free == MILLI_PER_GPU else f"{free // 100 * 100}-{free // 100 * 100 + 99}"
            out[key] += 100.0 * free / capacity
    out["unallocated"] = sum(out.values())
    out["floor"] = 100.0 * sliver_lower_bound_milli(arrived_prefix(arrivals, capacity), capacity) / capacity
    return out | extra


def _repack(chooser: Scheduler, mover: Mover, refused: list[PodRequest]) -> dict[str, float]:
    """Lift every placed movable pod, then place them again and then the refused pods, each largest GPU demand first."""
    cluster = chooser.cluster
    lifted = {name: cluster.release(name) for name in mover.movable if name in cluster.assignments}
    moved = placed = dropped = 0
    def largest_first(pods: list[PodRequest]) -> list[PodRequest]:
        return sorted(pods, key=lambda p: (p.gpu_demand, p.gpu_milli, p.cpu_milli), reverse=True)

    # the lifted pods first: a move may not leave a running pod without a place
    for request in largest_first([t.request for t in mover.movable.values() if t.request.name in lifted]) + \
            largest_first(refused):
        choice = chooser.choose(request)
        if choice is None:
            dropped += request.name in lifted
            continue
        cluster.place(request, choice.node.name, choice.gpus)
        was = lifted.get(request.name)
        if was is None:
            placed += 1
        elif (was.node, was.gpus) != (choice.node.name, choice.gpus):
            moved += 1
    return {"moved": float(moved), "placed_after": float(placed), "lifted": float(len(lifted)), "dropped": float(dropped)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--policy", type=lambda t: names_arg("policy", policy_names())(t)[0], default="tessera")
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(42, 52)))
    ap.add_argument("--movable-share", type=share_arg, default=0.0)
    ap.add_argument("--fillable", type=int, default=200, choices=range(0, MILLI_PER_GPU + 1, 100), metavar="MILLI",
                    help="the smallest room (milli) a perfect mover fills: 0 to 1000 in steps of 100 (rooms are counted"
                         " in 100-milli buckets; default 200)")
    ap.add_argument("--largest-first", action="store_true",
                    help="place the arrived pods offline, largest GPU demand first, instead of in arrival order")
    ap.add_argument("--repack", action="store_true",
                    help="at 100%% arrived, lift every movable pod and place it and the refused pods again, largest first")
    args = ap.parse_args()
    if args.repack and not args.movable_share:
        ap.error("--repack lifts the movable pods: give --movable-share above 0")
    try:
        check_packable(args.trace, args.nodes)  # no pods, no GPU pod, no GPU node: said in one line
        nodes, pods = load_nodes(args.nodes), [p.request for p in load_pods(args.trace)]
        runs = [rooms_at_full(nodes, pods, args.policy, s, args.movable_share, args.largest_first, args.repack)
                for s in args.seeds]
    except ValueError as e:  # TraceError too
        ap.error(str(e))
    mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
    print(f"{args.policy}, ideal scheduler, {'largest first' if args.largest_first else 'arrival order'}, "
          f"movable share {args.movable_share}, seeds {args.seeds[0]}-{args.seeds[-1]}: "
          "% of GPU capacity free at 100% arrived (mean over seeds)")
    print(f"  unallocated {mean['unallocated']:.2f} (sd {statistics.pstdev(r['unallocated'] for r in runs):.2f}),"
          f" sliver floor {mean['floor']:.2f}")
    if args.repack:
        print(f"  after lifting the movable pods ({mean['lifted']:.0f} a seed) and placing them, then the refused pods,"
              f" each largest first: {mean['moved']:.0f} moved, {mean['placed_after']:.0f} refused pods placed,"
              f" {mean['dropped']:.0f} lifted pods placed nowhere")
    print(f"  whole free GPUs {mean['whole']:.2f}")
    for b in BUCKETS:
        print(f"  rooms {b:3d}-{b + 99:3d} milli {mean[f'{b}-{b + 99}']:.2f}")
    unusable = sum(mean[f"{b}-{b + 99}"] for b in BUCKETS if b + 99 < args.fillable)
    print(f"  a perfect mover filling every free GPU and every room of {args.fillable}+ milli: {unusable:.2f} left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
