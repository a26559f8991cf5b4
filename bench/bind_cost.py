"""What one bind costs the hot path afterwards: every cached shape's view brought up to date with the changed node.

A bind changes one node. The next filter or prioritize of each request shape re-judges that node in its view
(extender/core/shape_index.py) before answering; nothing else is recomputed. This bench places pods of five
shapes (250 and 500 milli, 1, 2 and 8 GPUs) one at a time on N nodes x 8 GPUs, 60% of the GPUs held first, and
after each placement times bringing all five views up to date. The baseline, in the same run: the same five view
reads with nothing changed (each a cache hit). In-process, no HTTP: the figure is the core's own.

    python bench/bind_cost.py [--nodes 5000] [--binds 500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from extender.cli.args import number_arg
from extender.core.model import PodRequest
from testing.load_cluster import build_extender, pct

SHAPES = (PodRequest("s250", 2000, 4096, 1, 250), PodRequest("s500", 2000, 4096, 1, 500),
          PodRequest("g1", 2000, 4096, 1, 1000), PodRequest("g2", 2000, 4096, 2, 1000),
          PodRequest("g8", 2000, 4096, 8, 1000))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=number_arg(int, 1), default=5000)
    ap.add_argument("--binds", type=number_arg(int, 1), default=500)
    args = ap.parse_args(argv)
    ext = build_extender(args.nodes, seed=args.nodes)
    placer = ext.placer
    requests = [placer.request_for(s) for s in SHAPES]
    for r in requests:
        placer.view(r)  # built once, as a running extender has them
    after_bind, unchanged, placed = [], [], 0
    for i in range(args.binds):
        request = requests[i % len(requests)]
        choice = placer.choose(request)
        if choice is None:
            continue
        ext.cluster.place(PodRequest(f"b{i}", 2000, 4096, request.gpu_count, request.gpu_milli), choice.node.name, choice.gpus)
        placed += 1
        t0 = time.perf_counter()
        for r in requests:
            placer.view(r)
        t1 = time.perf_counter()
        for r in requests:
            placer.view(r)
        t2 = time.perf_counter()
        after_bind.append((t1 - t0) * 1000)
        unchanged.append((t2 - t1) * 1000)
    if not placed:
        print("no pod could be placed: nothing measured", file=sys.stderr)
        return 1
    print(f"{args.nodes} nodes x 8 GPUs, {placed} binds, {len(requests)} shapes cached: ms to bring every view up to date")
    print(f"  after a bind   p50 {statistics.median(after_bind):.3f}  p99 {pct(after_bind, .99):.3f}  max {max(after_bind):.3f}")
    print(f"  nothing changed p50 {statistics.median(unchanged):.3f}  p99 {pct(unchanged, .99):.3f}  (baseline, same run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
