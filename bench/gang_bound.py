"""How much work one filter of a huge gang's member costs: policy calls (filter + score) and time.

A pod's gang annotation says how many members must fit at once; the fit check used to place
every missing member on a scratch cluster, trying every node for each (size x nodes policy
calls, under the extender's one lock). This filters one member of a gang of --size on --nodes
nodes x 8 GPUs, all free, in three cases: whole-GPU members (more than the cluster holds),
500-milli slices (--size of them fit), and the same slices with the extender's default cap on
gang waits. The gang-wait cap is lifted for the first two so that the fit check itself is
measured. Runs against any checkout (an attribute the extender does not know is ignored).

    python bench/gang_bound.py [--nodes 1000] [--size 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extender.cli import number_arg  # noqa: E402
from extender.core.model import NodeSpec  # noqa: E402
from extender.kube.contract import GpuInfo, NodeInventory, pod_info  # noqa: E402
from extender.service import Extender  # noqa: E402


def member(size: int, limits: dict) -> dict:
    return {"metadata": {"name": "g-0", "namespace": "bench", "uid": "uid-g-0",
                         "annotations": {"tessera.dev/gang-name": "huge", "tessera.dev/gang-size": str(size)}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi", **limits}}}]}}


def measure(nodes: int, size: int, limits: dict, lift_cap: bool) -> tuple[int, float, str]:
    ext = Extender()  # starts from openb's task mix, as tessera serve does
    for i in range(nodes):
        spec = NodeSpec(f"node-{i:05d}", 96_000, 786_432, 8, "A100")
        ext.upsert_node(NodeInventory(spec, tuple(GpuInfo(g) for g in range(8))))
    ext.mark_synced()
    if lift_cap:
        ext.max_gang_waits = 10 * size
    calls = [0]
    for name in ("filter", "score"):
        real = getattr(ext.policy, name)

        def counted(*a, _real=real, **k):
            calls[0] += 1
            return _real(*a, **k)
        setattr(ext.policy, name, counted)
    names = [n.name for n in ext.cluster.nodes]
    started = time.perf_counter()
    out = ext.filter(pod_info(member(size, limits)), names)
    took = time.perf_counter() - started
    reason = next(iter({**out.failed, **out.unresolvable}.values()), f"passed {len(out.passed)} nodes")
    return calls[0], took, reason


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=number_arg(int, 1), default=1000)
    ap.add_argument("--size", type=number_arg(int, 1, 10_000), default=10_000)
    args = ap.parse_args()
    print(f"one filter of a gang member, gang of {args.size} on {args.nodes} nodes x 8 GPUs")
    for label, limits, lift in (("whole GPUs, cap lifted", {"nvidia.com/gpu": "1"}, True),
                                ("500-milli slices, cap lifted", {"tessera.dev/gpu-milli": "500"}, True),
                                ("500-milli slices, default cap", {"tessera.dev/gpu-milli": "500"}, False)):
        calls, took, reason = measure(args.nodes, args.size, limits, lift)
        print(f"{label:>30}: {calls:>9} policy calls, {took:8.3f} s  ({reason[:90]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
