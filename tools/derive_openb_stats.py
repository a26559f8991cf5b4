"""Derive the embedded default workload's statistics from the openb trace.

Writes extender/core/data/openb_default_stats.json: node types with counts, pod request types
with counts, and duration quantiles. These aggregates (not the trace rows) are what the project
ships; the CSVs stay in ../shared (research-use data, Weng et al., USENIX ATC'23).

    python tools/derive_openb_stats.py ../shared/data/openb
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extender.sim.trace import load_nodes, load_pods  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "extender/core/data/openb_default_stats.json"
QUANTILES = 200


def main(data_dir: str) -> None:
    d = Path(data_dir)
    nodes = load_nodes(d / "openb_node_list_gpu_node.csv")
    pods = load_pods(d / "openb_pod_list_default.csv")
    node_types = Counter((n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_model) for n in nodes)
    pod_types = Counter(
        (p.request.cpu_milli, p.request.memory_mib, p.request.gpu_count, p.request.gpu_milli) for p in pods
    )
    durations = sorted(p.duration for p in pods)
    qs = [durations[round(i * (len(durations) - 1) / QUANTILES)] for i in range(QUANTILES + 1)]
    stats = {
        "source": "Alibaba cluster-trace-gpu-v2023 (openb), openb_node_list_gpu_node.csv and "
        "openb_pod_list_default.csv; aggregates only. Cite: Weng et al., Beware of Fragmentation, USENIX ATC'23.",
        "pods": len(pods),
        "node_types": [
            {"cpu_milli": c, "memory_mib": m, "gpu_count": g, "gpu_model": model, "count": n}
            for (c, m, g, model), n in sorted(node_types.items(), key=lambda kv: -kv[1])
        ],
        "pod_types": [
            {"cpu_milli": c, "memory_mib": m, "gpu_count": g, "gpu_milli": gm, "count": n}
            for (c, m, g, gm), n in sorted(pod_types.items(), key=lambda kv: -kv[1])
        ],
        "duration_quantiles_s": qs,
    }
    OUT.write_text(json.dumps(stats, indent=1) + "\n")
    print(f"wrote {OUT}: {len(node_types)} node types, {len(pod_types)} pod types")


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[2] / "shared/data/openb"  # beside the checkout, wherever it is run from
    ap = argparse.ArgumentParser(prog="python tools/derive_openb_stats.py", description=__doc__.splitlines()[0],
                                 epilog=f"writes {OUT}")
    ap.add_argument("openb_dir", nargs="?", default=str(default), metavar="OPENB_DIR",
                    help=f"the openb CSVs' directory (default {default})")
    args = ap.parse_args()
    try:
        main(args.openb_dir)
    except (ValueError, IndexError) as e:  # TraceError (a bad or missing file), or a trace with no pods
        sys.exit(f"derive_openb_stats: {e}")
