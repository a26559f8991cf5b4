"""How long the core takes to score one pod against every node of the openb cluster (1213).

The cluster is first filled to 80% of its GPU capacity by replaying the default trace with the
policy (a realistic state), then 300 further pods are scored one at a time against all nodes:
filter + score + the 0..10 extender scores, with no per-node verdict cache (what one extender
`prioritize` call costs; the fragmentation memo, shared across calls, is warm). The baseline,
measured in the same run, is the bare feasibility check over the same nodes, so the ratio is the
policy's own cost.

    python bench/score_latency.py [--policy tessera,fgd] [--trace CSV --nodes CSV]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from extender.cli.args import existing_file, names_arg, number_arg
from extender.core.cluster import Cluster, fit_reason
from extender.core.policy import PolicyContext, make_policy, policy_names
from extender.core.workload import TargetWorkload
from extender.sim import default_workload
from extender.sim.packing import inflate
from extender.sim.schedulers import IdealScheduler
from extender.sim.trace import load_nodes, load_pods

SHARED = Path(__file__).resolve().parents[2] / "shared/data/openb"


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", type=names_arg("policy", policy_names()), default="tessera,fgd")
    ap.add_argument("--trace", type=existing_file, default=str(SHARED / "openb_pod_list_default.csv"))
    ap.add_argument("--nodes", default=str(SHARED / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", type=number_arg(int, 1), default=300)
    args = ap.parse_args()
    if Path(args.trace).is_file() and Path(args.nodes).is_file():
        nodes, pods, source = load_nodes(args.nodes), [p.request for p in load_pods(args.trace)], "openb"
    else:
        nodes, pods, source = default_workload.default_nodes(), [p.request for p in default_workload.default_trace()], "embedded"
    workload = TargetWorkload.from_pods(pods)
    print(f"{source}: {len(nodes)} nodes; scoring {args.pods} pods each against all nodes at 80% allocated")
    print(f"{'policy':<10}{'median ms':>10}{'p99 ms':>9}{'baseline ms':>12}{'ratio':>7}")
    for name in args.policy:
        cluster = Cluster(nodes)
        capacity = cluster.gpu_capacity_milli
        policy = make_policy(name, PolicyContext(workload, 42))
        sched = IdealScheduler(cluster, policy, 42)
        stream = inflate(pods, capacity, 42)
        i = arrived = 0
        while arrived < 0.8 * capacity:
            p = stream[i]
            i += 1
            arrived += p.gpu_demand
            c = sched.choose(p)
            if c:
                cluster.place(p, c.node.name, c.gpus)
        probe = [p for p in stream[i:] if p.gpu_count][: args.pods]
        times, base = [], []
        for p in probe:
            t0 = time.perf_counter()
            feasible = [n for n in cluster.nodes if fit_reason(p, n) is None]
            t1 = time.perf_counter()
            scores = [policy.score(p, n) for n in cluster.nodes if policy.filter(p, n) is None]
            if scores:
                policy.extender_scores(scores)
            t2 = time.perf_counter()
            base.append((t1 - t0) * 1000)
            times.append((t2 - t1) * 1000)
            assert len(feasible) == len(scores)
        med, p99, bmed = statistics.median(times), percentile(times, 0.99), statistics.median(base)
        print(f"{name:<10}{med:>10.3f}{p99:>9.3f}{bmed:>12.3f}{med / bmed:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
