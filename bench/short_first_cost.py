"""What shortest runs first (`--short-first on`) costs one filter call of a held pod, at worst.

A held pod is refused the nodes where a short pod waiting fits now (core/short_first.py `contested`). Tenants
choose the short pods' shapes and constraints, so the worst case is theirs to make, on a cluster of idle nodes
the held pod fits (the server reads only the nodes the held pod passed). Two cases, each against a baseline in
the same run:
  * shapes that pass the quick CPU, memory and GPU-room checks on every node and then fail on the GPU model:
    `contested` with its bounds (`MAX_SHAPES` shapes, `MAX_CHECKS` steps), and without them (every node
    against 32 shapes);
  * shapes that fit every node and carry the largest node affinity the contract reads (`MAX_NODE_EXPRESSIONS`
    expressions of 64 values, the last failing on every node), tested through `NodeTerms.admits` as the server
    does: the budget counting each test's lookups, and counting a test as one step (the budget before 2026-12-02);
    and that affinity checked once on every node, as a plan for the pod does, against values kept as tuples.

    python bench/short_first_cost.py [--nodes 5000] [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

from extender.cli.args import number_arg
from extender.core import short_first
from extender.core.cluster import Cluster
from extender.core.model import NodeSpec, PodRequest
from extender.state import NodeTerms
from extender.translate.objects import MAX_NODE_EXPRESSIONS, node_terms


def per_call_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def padded_affinity() -> dict:
    """The largest node affinity the contract reads: every expression passes on the bench's nodes but the last."""
    values = [f"zone-{k}" for k in range(64)]
    passing = [{"key": "zone", "operator": "NotIn", "values": values}] * (MAX_NODE_EXPRESSIONS - 1)
    failing = [{"key": "zone", "operator": "In", "values": values}]
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": passing + failing}]}}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=number_arg(int, 1), default=5000)
    parser.add_argument("--calls", type=number_arg(int, 1), default=50)
    args = parser.parse_args()
    cluster = Cluster([NodeSpec(f"n{i:05d}", 64_000, 262_144, 8, "T4") for i in range(args.nodes)])
    shapes = [(PodRequest(f"s{k}", 1000 + k, 1024, 1, 1000, frozenset({"A100"})), None, 0) for k in range(32)]
    bounded = per_call_ms(lambda: short_first.contested(shapes, cluster.nodes), args.calls)
    with mock.patch.object(short_first, "MAX_SHAPES", len(shapes)), \
            mock.patch.object(short_first, "MAX_CHECKS", len(shapes) * args.nodes):
        unbounded = per_call_ms(lambda: short_first.contested(shapes, cluster.nodes), args.calls)
    print(f"{args.nodes} idle nodes, short pods of {len(shapes)} shapes that fit none of them; median per call:")
    print(f"  contested, bounded ({short_first.MAX_SHAPES} shapes, {short_first.MAX_CHECKS} steps): {bounded:.2f} ms")
    print(f"  baseline, unbounded (every node against {len(shapes)} shapes): {unbounded:.2f} ms")

    terms = node_terms(padded_affinity())
    labels = {"zone": "elsewhere"}
    assert terms is not None and terms.size == MAX_NODE_EXPRESSIONS and not terms.admits("n00000", labels)
    heavy = [(PodRequest(f"a{k}", 1000 + k, 1024, 1, 1000), lambda name: terms.admits(name, labels), terms.size)
             for k in range(32)]
    weighed = per_call_ms(lambda: short_first.contested(heavy, cluster.nodes), args.calls)
    one_step = per_call_ms(lambda: short_first.contested([(r, go, 0) for r, go, _ in heavy], cluster.nodes), args.calls)
    print(f"{args.nodes} idle nodes, short pods of {len(heavy)} shapes that fit every node, each with "
          f"{MAX_NODE_EXPRESSIONS} affinity expressions of 64 values failing at the last; median per call:")
    print(f"  contested, each constraint test weighed by its lookups: {weighed:.2f} ms")
    print(f"  baseline, each constraint test counted as one step: {one_step:.2f} ms")

    # a plan for such a pod (`Judge.offered_nodes`) checks its affinity once per node of the cluster
    as_tuples = NodeTerms(terms.selector, tuple(tuple((k, op, tuple(v)) for k, op, v in t) for t in terms.terms))
    names = [n.name for n in cluster.nodes]
    with_sets = per_call_ms(lambda: [terms.admits(n, labels) for n in names], max(1, args.calls // 10))
    with_tuples = per_call_ms(lambda: [as_tuples.admits(n, labels) for n in names], max(1, args.calls // 10))
    print(f"the same affinity checked on each of {args.nodes} nodes (a plan for the pod); median per plan:")
    print(f"  In/NotIn values as sets: {with_sets:.1f} ms")
    print(f"  baseline, the same values as tuples (scanned, as before 2026-12-02): {with_tuples:.1f} ms")


if __name__ == "__main__":
    main()
