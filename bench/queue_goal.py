"""Issue 37's goal for waits, checked: Tessera against stock Kubernetes and FGD in time mode, load by load.

Time mode (openb trace, 100 sampled nodes, kube-scheduler's scoring and 1.20 queue), seeds 42-46, loads
0.7 to 1.33. `k8s-default` and `fgd` run as those systems do: kube-scheduler's queue and none of
Tessera's remedies. `tessera` runs with the queue settings given by `--tessera` (simulate's flags; empty:
`tessera serve`'s defaults). The same pods and declarations go to all three (`--declarations`: users,
exact or both).

The goal, at every load: Tessera's all-pod mean wait at most FGD's and at most 20% of k8s-default's; its
8-GPU pods' p99 wait at most 60 min in every seed; no pod class's mean more than 10% (or 1 minute, whichever
is larger) above FGD's for that class. Each line says which of these hold.

    python bench/queue_goal.py [--tessera "--short-first on --reservations on --drain-keep 16"] \
        [--declarations users,exact] [--seeds 42-46] [--loads 0.7,0.9,1.1,1.2,1.33] [--json out.jsonl]

Data: Alibaba cluster-trace-gpu-v2023 (research use). Cite Weng et al., USENIX ATC'23.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import mean

from extender.cli import build_parser
from extender.cli.args import csv_file, loads_arg, names_arg, seeds_arg
from extender.cli.serve import backfill_settings, short_first_settings
from extender.sim.declarations import DECLARATIONS
from extender.sim.runner import Job, run_jobs

DATA = Path(__file__).resolve().parents[2] / "shared/data/openb"
CLASSES = ("cpu", "slice", "1gpu", "2gpu", "4gpu", "8gpu")
P99_8GPU_MAX_S = 3600.0
SHARE_OF_K8S = 0.2
CLASS_SLACK, CLASS_SLACK_S = 0.10, 60.0


def tessera_settings(flags: str):
    """(reservations, shortest runs first) from simulate's flags, as `tessera simulate` reads them."""
    args = build_parser().parse_args(["simulate", "--mode", "time", *shlex.split(flags)])
    return backfill_settings(args), short_first_settings(args)


def verdict(rows: dict[str, list[dict]]) -> dict:
    """One load's figures and which parts of the goal hold; `rows`: policy -> its runs (one per seed)."""
    def class_mean(policy: str, c: str) -> float | None:
        got = [r["classes"][c]["mean_s"] for r in rows[policy] if c in r["classes"]]
        return mean(got) if got else None

    means = {p: mean(r["wait_mean_s"] for r in rs) for p, rs in rows.items()}
    p99 = max(r["classes"].get("8gpu", {}).get("p99_s", 0.0) for r in rows["tessera"])
    over = {}
    for c in CLASSES:
        t, f = class_mean("tessera", c), class_mean("fgd", c)
        if t is not None and f is not None and t > max(f * (1 + CLASS_SLACK), f + CLASS_SLACK_S):
            over[c] = (t, f)
    return {
        "mean_min": {p: m / 60 for p, m in means.items()},
        "p99_8gpu_worst_min": p99 / 60,
        "classes_min": {p: {c: (m / 60 if (m := class_mean(p, c)) is not None else None) for c in CLASSES} for p in rows},
        "stopped": mean(r.get("deadline_stopped", 0) for r in rows["tessera"]),
        "ok": {"le_fgd": means["tessera"] <= means["fgd"],
               "le_20pct_k8s": means["tessera"] <= SHARE_OF_K8S * means["k8s-default"],
               "p99_8gpu": p99 <= P99_8GPU_MAX_S,
               "classes": not over},
        "classes_over": {c: [t / 60, f / 60] for c, (t, f) in over.items()},
    }


def kept_baselines(path: Path, declarations: list[str], loads: list[float], seeds: list[int]) -> list[dict]:
    """k8s-default's and fgd's runs from an earlier --json file, for the declarations, loads and seeds asked."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in runs if r["policy"] in ("k8s-default", "fgd") and r["declarations"] in declarations
            and r["load"] in loads and r["seed"] in seeds]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=csv_file, default=None, help="pod list CSV (default: ../shared's openb default trace)")
    ap.add_argument("--nodes", type=csv_file, default=None, help="node list CSV (default: ../shared's openb GPU nodes)")
    ap.add_argument("--tessera", default="",
                    help="simulate's queue flags for the tessera row (default: none, as `tessera serve` ships)")
    ap.add_argument("--declarations", type=names_arg("declarations", DECLARATIONS), default=["users"])
    ap.add_argument("--baselines", type=Path, default=None,
                    help="take k8s-default's and fgd's runs from this --json file of an earlier run, not run them again")
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(42, 47)))
    ap.add_argument("--loads", type=loads_arg, default=loads_arg("0.7,0.9,1.1,1.2,1.33"))
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every run's JSON here, one per line")
    args = ap.parse_args(argv)
    try:
        backfill, short_first = tessera_settings(args.tessera)
    except (ValueError, SystemExit) as e:
        print(f"--tessera {args.tessera!r}: {e}", file=sys.stderr)
        return 2
    kept = kept_baselines(args.baselines, args.declarations, args.loads, args.seeds) if args.baselines else []
    baselines = () if kept else ("k8s-default", "fgd")
    trace = args.trace or csv_file(str(DATA / "openb_pod_list_default.csv"))
    nodes = args.nodes or csv_file(str(DATA / "openb_node_list_gpu_node.csv"))
    jobs = [Job(trace=trace, nodes=nodes, policy=p, scheduler="kube", seed=s, mode="time", load=load,
                declarations=d, **({"backfill": backfill, "short_first": short_first} if p == "tessera" else {}))
            for d in args.declarations for load in args.loads for s in args.seeds for p in (*baselines, "tessera")]
    started = time.perf_counter()
    runs = kept + [r.as_json() for r in run_jobs(jobs, args.workers)]
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in runs))
    grouped: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        grouped[(r["declarations"], r["load"])][r["policy"]].append(r)
    label = args.tessera or "(serve defaults)"
    print(f"tessera: {label}; seeds {args.seeds[0]}-{args.seeds[-1]}; mean wait in min "
          f"(over seeds), 8-GPU p99: the worst seed's")
    print(f"{'declared':8} {'load':>5} {'k8s':>6} {'fgd':>6} {'tessera':>7} {'/k8s':>5} {'8g p99':>7} {'stopped':>7}  goal")
    met = True
    for (d, load), rows in sorted(grouped.items()):
        v = verdict(rows)
        m, ok = v["mean_min"], v["ok"]
        met &= all(ok.values())
        failed = [k for k, good in ok.items() if not good]
        over = ", ".join(f"{c} {t:.1f} vs fgd {f:.1f}" for c, (t, f) in v["classes_over"].items())
        print(f"{d:8} {load:5.2f} {m['k8s-default']:6.1f} {m['fgd']:6.1f} {m['tessera']:7.1f} "
              f"{m['tessera'] / m['k8s-default'] if m['k8s-default'] else 0:5.2f} {v['p99_8gpu_worst_min']:7.0f} "
              f"{v['stopped']:7.0f}  {'met' if not failed else 'NOT ' + ','.join(failed)}{' (' + over + ')' if over else ''}")
        cls = v["classes_min"]
        print("        class means, tessera / fgd: " + "  ".join(
            f"{c} {cls['tessera'][c]:.1f}/{cls['fgd'][c]:.1f}" for c in CLASSES
            if cls["tessera"][c] is not None and cls["fgd"][c] is not None))
    print(f"\ngoal {'met' if met else 'NOT met'} in every row; {len(runs)} runs in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
