"""Which of Tessera's files one verb call crosses: a newcomer's reading list, counted.

Builds the synthetic cluster of the page's tests (testing/synthetic_cluster.py: nodes of three GPU
models, slices and whole GPUs held, pods pending), posts kube-scheduler's own filter and then
prioritize body (../shared/fixtures/extender-wire, the pod given a 500-milli slice, the node names
the cluster's) through the Flask app, and records every Python function those two calls run
(`sys.setprofile`). It prints the repository files they cross, grouped by layer (the layers of
tests/test_import_graph.py), and the counts.

    python bench/call_path.py [--nodes 50] [--json]

It counts the checkout Python imports `extender` from: the editable install's (`pip install -e .`), or
the working directory's with `PYTHONPATH=.`. So to count another checkout's files, run from its root:
`cd ../old && PYTHONPATH=. python ../main/bench/call_path.py` (a checkout older than testing/ takes the
synthetic cluster from the install's).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import extender

ROOT = Path(extender.__file__).resolve().parents[1]  # the checkout whose code is counted (see the docstring)
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "extender-wire"
PACKAGES = ("tessera_contract", "extender", "gpu_sharing", "raybridge")


def layer(rel: str) -> str:
    parts = Path(rel).with_suffix("").parts
    if parts[0] != "extender" or len(parts) == 1:
        return parts[0]
    if parts[1] in ("core", "translate", "kube", "http", "sim", "state", "serve", "cli"):
        return f"extender.{parts[1]}"
    return "extender.logic"


def crossed(nodes: int) -> list[str]:
    from extender.http.app import create_app
    from testing.synthetic_cluster import synthetic_extender

    ext = synthetic_extender(nodes=nodes, pending=6)
    client = create_app(ext, binder=None).test_client()
    body = json.loads((FIXTURES / "filter-request.nodecache-true.json").read_text())
    body = copy.deepcopy(body)
    pod = body["Pod"]
    pod["metadata"]["annotations"] = {}
    for c in pod["spec"]["containers"]:
        c["resources"] = {"limits": {"tessera.dev/gpu-milli": "500"}, "requests": {"tessera.dev/gpu-milli": "500"}}
    body["NodeNames"] = sorted(ext.cluster.by_name)
    body["Nodes"] = None
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    client.post("/tessera/filter", json=body)  # warm: imports and first-call caches are not the path
    seen.clear()
    sys.setprofile(profile)
    try:
        filtered = client.post("/tessera/filter", json=body)
        scored = client.post("/tessera/prioritize", json=body)
    finally:
        sys.setprofile(None)
    assert filtered.status_code == 200 and scored.status_code == 200, (filtered.data[:200], scored.data[:200])
    assert (filtered.get_json() or {}).get("NodeNames"), f"the pod passed no node: {filtered.data[:300]!r}"
    out = []
    for name in seen:
        try:
            rel = str(Path(name).resolve().relative_to(ROOT))
        except ValueError:
            continue
        if rel.split("/")[0] in PACKAGES:
            out.append(rel)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    files = crossed(args.nodes)
    by_layer: dict[str, list[str]] = {}
    for f in files:
        by_layer.setdefault(layer(f), []).append(f)
    if args.json:
        print(json.dumps({"checkout": str(ROOT), "files": len(files), "layers": len(by_layer), "by_layer": by_layer}))
        return
    print(f"filter + prioritize in {ROOT}: {len(files)} files in {len(by_layer)} layers")
    for name, group in sorted(by_layer.items()):
        print(f"  {name} ({len(group)}): {', '.join(Path(f).name for f in group)}")


if __name__ == "__main__":
    main()
