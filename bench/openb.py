"""All policies side by side on openb traces: unallocated GPUs at 100% arrived, 10 seeds.

Prints, per trace and scheduler, the mean ± sd of each policy (laid out as the paper's table in
docs/fragmentation.md §7), its ratio to `fgd` measured in the same run, the paper's figure where there
is one, the share of capacity not serving demand (`unserved`: differs from unallocated only for
k8s-default, which holds a whole GPU for a slice), and the sliver lower bound that no policy can
beat. Also the wall time of the whole run.

    python bench/openb.py ../shared/data/openb/openb_pod_list_default.csv [more CSVs] \
        [--nodes ../shared/data/openb/openb_node_list_gpu_node.csv] [--seeds 42-51] \
        [--policy all] [--scheduler ideal,kube] [--movable-share 0.3] [--json results.jsonl]

With `--movable-share F` (ideal scheduler only) a share F of GPU pods may be moved to place a pod that
fits nowhere (core/defrag.py); the table then also gives the moves made and the pods they placed, per seed.

Data: Alibaba cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from extender.cli.args import names_arg, number_arg, seeds_arg, share_arg
from extender.cli.simulate import check_movable_share, check_packable, check_trace_labels
from extender.core.policy import policy_names
from extender.sim.bounds import arrived_prefix, sliver_lower_bound_milli
from extender.sim.packing import inflate
from extender.sim.runner import Job, run_jobs, trace_label
from extender.sim.schedulers import SCHEDULERS
from extender.sim.trace import load_nodes, load_pods

# The paper artifact's means at 100% arrived (docs/fragmentation.md §7), for reference.
PAPER = {
    "default": {"fgd": 4.77, "bestfit": 7.14, "packing": 8.22, "clustering": 8.35, "dotprod": 9.38, "random": 13.70},
    "gpushare40": {"fgd": 6.04, "bestfit": 8.56}, "gpushare60": {"fgd": 8.75, "bestfit": 10.94},
    "gpushare80": {"fgd": 10.92, "bestfit": 13.34}, "gpushare100": {"fgd": 13.36, "bestfit": 15.38},
    "multigpu20": {"fgd": 4.47, "bestfit": 6.27}, "multigpu30": {"fgd": 3.64, "bestfit": 5.43},
    "multigpu40": {"fgd": 3.09, "bestfit": 4.90}, "multigpu50": {"fgd": 2.91, "bestfit": 4.38},
    "gpuspec10": {"fgd": 5.34, "bestfit": 6.90}, "gpuspec20": {"fgd": 5.34, "bestfit": 11.54},
    "gpuspec25": {"fgd": 6.09, "bestfit": 14.33}, "gpuspec33": {"fgd": 12.16, "bestfit": 19.61},
    "cpu050": {"fgd": 5.00, "bestfit": 6.44}, "cpu100": {"fgd": 4.79, "bestfit": 6.74},
    "cpu200": {"fgd": 5.18, "bestfit": 7.85}, "cpu250": {"fgd": 6.80, "bestfit": 8.79},
}


def lower_bound_pct(trace: str, nodes: str, seeds: list[int]) -> float:
    pods = [p.request for p in load_pods(trace)]
    capacity = sum(n.gpu_count for n in load_nodes(nodes)) * 1000
    bounds = [sliver_lower_bound_milli(arrived_prefix(inflate(pods, capacity, s), capacity), capacity) for s in seeds]
    return 100 * statistics.mean(bounds) / capacity


def main() -> int:
    default_nodes = Path(__file__).resolve().parents[2] / "shared/data/openb/openb_node_list_gpu_node.csv"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--nodes", default=str(default_nodes))
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(42, 52)))
    ap.add_argument("--policy", type=names_arg("policy", policy_names()), default=policy_names())
    ap.add_argument("--scheduler", type=names_arg("scheduler", SCHEDULERS), default=list(SCHEDULERS))
    ap.add_argument("--movable-share", type=share_arg, default=0.0, metavar="F",
                    help="share of GPU pods that may be moved (ideal scheduler only); default 0: no moves")
    ap.add_argument("--workers", type=number_arg(int, 1), default=None)
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write every run as a JSON line to PATH")
    args = ap.parse_args()
    for path in [*args.traces, *([args.nodes] if args.nodes else [])]:
        if Path(path).is_dir():
            ap.error(f"{path} is a directory, not a CSV file")
        if not Path(path).is_file():
            ap.error(f"cannot read {path}: no such file (the openb CSVs are in ../shared/data/openb)")
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        ap.error(f"--json {args.json}: not a file in an existing directory")
    try:
        check_movable_share(args.movable_share, "packing", args.scheduler)
        check_trace_labels(args.traces)
        for trace in args.traces:  # what the workers would otherwise raise as tracebacks, said here in one line
            check_packable(trace, args.nodes)
    except ValueError as e:  # TraceError too
        ap.error(str(e))

    jobs = [Job(t, args.nodes, p, s, seed, movable_share=args.movable_share) for t in args.traces
            for s in args.scheduler for p in args.policy for seed in args.seeds]
    started = time.perf_counter()
    per_run = defaultdict(list)
    out = args.json.open("w") if args.json else None
    for r in run_jobs(jobs, args.workers):
        per_run[(r.trace, r.scheduler, r.policy)].append(r)
        if out:
            out.write(json.dumps(r.as_json()) + "\n")
        print(f"\r{sum(map(len, per_run.values()))}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    print(file=sys.stderr)

    print(f"Unallocated GPUs (% of capacity) at 100% arrived, mean ± sd over seeds {args.seeds[0]}..{args.seeds[-1]}"
          f" ({len(args.seeds)}); ratio = policy / fgd in the same run")
    for trace in args.traces:
        label = trace_label(trace)
        bound = lower_bound_pct(trace, args.nodes, args.seeds)
        for sched in args.scheduler:
            rows = []
            fgd = [r.unallocated_pct["100"] for r in per_run.get((label, sched, "fgd"), [])]
            for p in args.policy:
                vals = [r.unallocated_pct["100"] for r in per_run[(label, sched, p)]]
                mean = statistics.mean(vals)
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                ratio = f"{mean / statistics.mean(fgd):.3f}" if fgd else "-"
                paper = PAPER.get(label, {}).get(p) if sched == "ideal" else None
                cpu_s = statistics.mean(r.elapsed_s for r in per_run[(label, sched, p)])
                unserved = statistics.mean(r.unserved_pct["100"] for r in per_run[(label, sched, p)])
                rows.append((mean, p, sd, ratio, paper, cpu_s, unserved, _moves(per_run[(label, sched, p)])))
            share = f", movable share {args.movable_share:g}" if args.movable_share else ""
            print(f"\n{label} / {sched} scheduler{share}   (lower bound from slivers: {bound:.2f})")
            print(f"  {'policy':<12}{'unalloc %':>10}{'sd':>7}{'/ fgd':>8}{'paper':>8}{'unserved %':>11}{'s/run':>7}"
                  + (f"{'moves':>8}{'placed':>8}" if args.movable_share else ""))
            for mean, p, sd, ratio, paper, cpu_s, unserved, moves in sorted(rows, key=lambda r: r[6]):
                paper_s = f"{paper:.2f}" if paper else "-"
                print(f"  {p:<12}{mean:>10.2f}{sd:>7.2f}{ratio:>8}{paper_s:>8}{unserved:>11.2f}{cpu_s:>7.1f}{moves}")
    print(f"\n{len(jobs)} runs in {wall:.1f} s wall on {args.workers or 'all'} worker(s)")
    return 0


def _moves(runs: list) -> str:
    """Moves made and pods placed thanks to them, means per seed; '' for runs without a movable share."""
    if not runs or runs[0].defrag is None:
        return ""
    return (f"{statistics.mean(r.defrag['moves'] for r in runs):>8.1f}"
            f"{statistics.mean(r.defrag['placed_by_moves'] for r in runs):>8.1f}")


if __name__ == "__main__":
    sys.exit(main())
