"""What shortest runs first (`--short-first on`) costs one filter call of a held pod, at worst.

A held pod is refused the nodes where a short pod waiting fits now (core/short_first.py `contested`). Tenants
choose the short pods' shapes, so the worst case is theirs to make: shapes that pass the quick CPU, memory and
GPU-room checks on every node and then fail on the GPU model, on a cluster of idle nodes the held pod fits
(the server reads only the nodes the held pod passed). This times `contested` on --nodes idle 8-GPU nodes
against 16 such shapes, with its bounds (`MAX_SHAPES` shapes, `MAX_CHECKS` fit tests) and, as the baseline in
the same run, without them (every node tested against 32 shapes).

    python bench/short_first.py [--nodes 5000] [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extender.cli import number_arg  # noqa: E402
from extender.core import short_first  # noqa: E402
from extender.core.cluster import Cluster  # noqa: E402
from extender.core.model import NodeSpec, PodRequest  # noqa: E402


def per_call_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=number_arg(int, 1), default=5000)
    parser.add_argument("--calls", type=number_arg(int, 1), default=50)
    args = parser.parse_args()
    cluster = Cluster([NodeSpec(f"n{i:05d}", 64_000, 262_144, 8, "T4") for i in range(args.nodes)])
    shapes = [PodRequest(f"s{k}", 1000 + k, 1024, 1, 1000, frozenset({"A100"})) for k in range(32)]
    bounded = per_call_ms(lambda: short_first.contested(shapes, cluster.nodes), args.calls)
    with mock.patch.object(short_first, "MAX_SHAPES", len(shapes)), \
            mock.patch.object(short_first, "MAX_CHECKS", len(shapes) * args.nodes):
        unbounded = per_call_ms(lambda: short_first.contested(shapes, cluster.nodes), args.calls)
    print(f"{args.nodes} idle nodes, short pods of {len(shapes)} shapes that fit none of them; median per call:")
    print(f"  contested, bounded ({short_first.MAX_SHAPES} shapes, {short_first.MAX_CHECKS} fit tests): {bounded:.2f} ms")
    print(f"  baseline, unbounded (every node against {len(shapes)} shapes): {unbounded:.2f} ms")


if __name__ == "__main__":
    main()
