"""What the floating drain pool (`--drain-keep`) costs one filter call of the server, per call.

With a floating pool, every filter call is at a new `now`, so `Backfill.guarded` makes one pass over the
nodes (the baseline below), and a pod of the reserving class refused a kept node also asks
`_rarest_with_room`: one pass over the nodes it fits. This builds --nodes nodes of 8 GPUs in two kinds
(a tenth with twice the cores, as openb's rare large nodes), each node with four 1-GPU pods, three of
them running for hours but on one node in 500 (so a few nodes are kept), and times both per call, each
at a new `now`.

    python bench/floating_pool.py [--nodes 5000] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from extender.cli.args import number_arg
from extender.core.backfill import Backfill, BackfillSettings
from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest


def build(nodes: int) -> tuple[Cluster, dict[str, float]]:
    specs = [NodeSpec(f"n{i:05d}", 128_000 if i % 10 == 0 else 64_000, 786_432, 8, "A100") for i in range(nodes)]
    cluster, ends = Cluster(specs), {}
    for i, spec in enumerate(specs):
        for g in range(4):
            name = f"p{i}-{g}"
            cluster.place(PodRequest(name, 8_000, 16_384, 1, 1000), spec.name, (g,))
            ends[name] = 600.0 if g == 0 or i % 500 == 0 else 36_000.0  # three run for 10 hours, but on 1 node in 500
    return cluster, ends


def per_call_ms(fn, calls: int) -> float:
    times = []
    for k in range(calls):
        start = time.perf_counter()
        fn(1.0 + k)  # a new `now` each call, as the server's clock gives
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=number_arg(int, 1), default=5000)
    parser.add_argument("--calls", type=number_arg(int, 1), default=200)
    args = parser.parse_args()
    cluster, ends = build(args.nodes)
    pool = Backfill(cluster, ends.get, BackfillSettings(wait_bound_s={8: 0.0}, drain_keep=16))
    start = time.perf_counter()
    pool.guarded(0.0)
    first_ms = (time.perf_counter() - start) * 1e3
    wide = PodRequest("wide", 32_000, 65_536, 8, 1000)  # fits every node
    kept = sorted(pool.guarded(0.5))
    if not kept:
        sys.exit("no node is kept: the bench's cluster does not exercise the pool")
    guard_ms = per_call_ms(pool.guarded, args.calls)
    refuse_ms = per_call_ms(lambda now: pool.drain_refuses(wide, kept[0], now, None), args.calls)
    print(f"{args.nodes} nodes, {len(kept)} kept at the start; first pass {first_ms:.1f} ms")
    print(f"per call (median of {args.calls}, each at a new now): guarded {guard_ms:.2f} ms (baseline); "
          f"guarded and an 8-GPU pod's drain_refuses on a kept node {refuse_ms:.2f} ms")


if __name__ == "__main__":
    main()
