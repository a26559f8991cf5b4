"""What gang admission costs (extender/gangs.py): gangs of 8, 64 and 512 members on 5,000 nodes x 8 GPUs.

Members arrive as a controller makes them: each is delivered by the watch, then filtered by kube-scheduler
with every node's name (nodeCacheCapable), and the last one's filter admits the gang. Timed under the
extender's lock, as the server runs them:

  * waiting: one member's filter while the gang is incomplete (median over its members);
  * admit: the completing member's filter, which places every member and holds their GPUs;
  * bind list: the gang binder's round that lists the members Tessera binds itself (kube/gang_binder.py);
  * refused / again: a gang of whole-node members on a cluster with one node too few free, its first
    refusal (a full plan, then everything given back) and the next member's (nothing changed: no second plan);
  * baseline, in the same run: a pod in no gang filtered over the same nodes (median of 21).

Also the policy's filter and score calls for the admission, and the peak memory it allocated (tracemalloc, in a
second run of the same gang: tracing slows Python several times over, so the times come from an untraced run).
Before the admitting filter a pod in no gang of the members' shape is filtered and prioritized, untimed, as
kube-scheduler does for every pod: the watch delivering dozens of pods can make the extender relearn its workload
mix (extender/learning.py), and the first filter after that judges every node afresh for the new policy (10,000
policy calls on 5,000 nodes) and the first prioritize sorts them again (about 18 ms), whoever asks.

    python bench/gang_bound.py [--nodes 5000] [--sizes 8,64,512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc

from extender.core.model import NodeSpec
from extender.service import Extender
from extender.translate.objects import GpuInfo, NodeInventory, pod_info


def pod(name: str, gpus: int, gang: tuple[str, int] | None = None, node: str = "") -> dict:
    ann = {"tessera.dev/gang-name": gang[0], "tessera.dev/gang-size": str(gang[1])} if gang else {}
    return {"metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": ann,
                         "creationTimestamp": "2026-12-04T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi",
                                                                          "nvidia.com/gpu": str(gpus)}}}],
                     "nodeName": node},
            "status": {"phase": "Running" if node else "Pending"}}


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - started) * 1000


def counting(ext: Extender) -> list[int]:
    calls = [0]
    for name in ("filter", "score"):
        real = getattr(ext.policy, name)

        def counted(*a, _real=real, **k):
            calls[0] += 1
            return _real(*a, **k)
        setattr(ext.policy, name, counted)
    return calls


def gang(ext: Extender, names: list[str], size: int, gpus: int, tag: str, traced: bool = False) -> dict:
    """Members arrive one by one and are filtered; the figures of one gang."""
    waiting = []
    members = [pod(f"{tag}-{i}", gpus, (tag, size)) for i in range(size)]
    for m in members[:-1]:
        ext.upsert_pod(pod_info(m))
        _, ms = timed(lambda m=m: ext.filter(pod_info(m), names))
        waiting.append(ms)
    last = members[-1]
    ext.upsert_pod(pod_info(last))
    warm = pod_info(pod(f"{tag}-warm", gpus))
    ext.prioritize(warm, ext.filter(warm, names).passed)  # not watched: judged as kube-scheduler does, remembered nowhere
    calls = counting(ext)
    if traced:
        tracemalloc.start()
    out, admit = timed(lambda: ext.filter(pod_info(last), names))
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    ext.policy.__dict__.pop("filter", None)
    ext.policy.__dict__.pop("score", None)
    binds, listing = timed(ext.gang_round)
    return {"waiting": statistics.median(waiting) if waiting else 0.0, "admit": admit, "passed": len(out.passed),
            "words": next(iter({**out.failed, **out.unresolvable}.values()), ""), "binds": len(binds),
            "list": listing, "calls": calls[0], "peak_kib": peak / 1024, "members": members}


def baseline(ext: Extender, names: list[str]) -> float:
    lone = pod("lone", 1)
    ext.upsert_pod(pod_info(lone))
    times = [timed(lambda: ext.filter(pod_info(lone), names))[1] for _ in range(21)]
    ext.delete_pod("uid-lone")
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--sizes", default="8,64,512")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ext = Extender()  # starts from openb's task mix, as tessera serve does
    for i in range(args.nodes):
        spec = NodeSpec(f"node-{i:05d}", 96_000, 786_432, 8, "A100")
        ext.upsert_node(NodeInventory(spec, tuple(GpuInfo(g) for g in range(8))))
    ext.mark_synced()
    names = [n.name for n in ext.cluster.nodes]
    print(f"gang admission on {args.nodes} nodes x 8 GPUs (members of 1 GPU each, filtered with every node's name)")
    print(f"{'members':>8} {'waiting ms':>11} {'admit ms':>9} {'bind list ms':>13} {'policy calls':>13} "
          f"{'peak KiB':>9} {'lone pod ms':>12}")
    for size in sizes:
        base = baseline(ext, names)
        g = gang(ext, names, size, 1, f"g{size}")
        assert g["passed"] == 1 and g["binds"] == size - 1, g["words"]
        for m in g["members"]:
            ext.delete_pod(m["metadata"]["uid"])
        traced = gang(ext, names, size, 1, f"t{size}", traced=True)
        for m in traced["members"]:
            ext.delete_pod(m["metadata"]["uid"])
        print(f"{size:>8} {g['waiting']:>11.2f} {g['admit']:>9.1f} {g['list']:>13.2f} {g['calls']:>13} "
              f"{traced['peak_kib']:>9.0f} {base:>12.2f}")
    # refusals: whole-node members, and one node too few free
    size = max(sizes)
    busy = [pod(f"busy-{i}", 1, node=n) for i, n in enumerate(names[size - 1:])]
    for b in busy:
        ext.upsert_pod(pod_info(b))
    g = gang(ext, names, size, 8, "whole")
    again, ms_again = timed(lambda: ext.filter(pod_info(g["members"][0]), names))
    assert g["passed"] == 0 and "only" in g["words"], g["words"]
    print(f"refused: a gang of {size} members of 8 GPUs with {size - 1} nodes free: first refusal {g['admit']:.1f} ms "
          f"({g['calls']} policy calls), the next member's {ms_again:.2f} ms (no second plan); lone pod "
          f"{baseline(ext, names):.2f} ms; words: {g['words'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
