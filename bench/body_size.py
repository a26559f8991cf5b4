"""How large is the largest legitimate request body, and how long does the app take to read it?

kube-scheduler with `nodeCacheCapable: false` sends every candidate Node object in full with each
filter and prioritize call. The wire fixtures' nodes (../shared/fixtures) are from a bare test
cluster, so this builds a production-sized GPU node on top of one: 50 images (kubelet's default
nodeStatusMaxImages) with a tag and a digest name each, 60 labels (GPU feature discovery and node
feature discovery publish dozens), a Tessera inventory annotation for 8 GPUs, and managedFields from
five field managers, each owning its own fields (kube-scheduler 1.20 does not strip them). It prints the body size
for 1000 and 5000 such nodes next to the limit for that many nodes without nodeCacheCapable
(limits.max_body_bytes), and the time the app takes to answer the
5000-node body (the answer is a filter `Error` here: the cache is empty, so only reading counts).

    python bench/body_size.py
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

from extender.http.app import create_app
from extender.http.limits import max_body_bytes
from extender.service import Extender

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "extender-wire" / "filter-request.nodecache-false.json"


def fat_node(base: dict, i: int) -> dict:
    node = copy.deepcopy(base)
    name = f"gpu-node-{i:05d}"
    meta = node["metadata"]
    meta["name"] = name
    meta.setdefault("labels", {}).update({f"feature.node.kubernetes.io/cpu-cpuid.FEATURE{k:02d}": "true" for k in range(50)})
    gfd = ("product", "memory", "count", "family", "machine", "compute.major", "compute.minor", "cuda.driver.major",
           "cuda.runtime.major", "replicas")
    meta["labels"].update({f"nvidia.com/gpu.{k}": f"value-{k}-{i}" for k in gfd})
    gpus = [{"index": g, "uuid": f"GPU-{i:08x}-{g:04x}-4bd2-8c3e-0123456789ab", "model": "NVIDIA-A100-SXM4-80GB",
             "memory_mib": 81920, "healthy": True} for g in range(8)]
    meta.setdefault("annotations", {}).update({
        "tessera.dev/gpu-inventory": json.dumps({"gpus": gpus}),
        "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "nfd.node.kubernetes.io/feature-labels": ",".join(f"cpu-cpuid.FEATURE{k:02d}" for k in range(50)),
    })
    owners = {"kubelet": [k for k in meta["labels"] if k.startswith("kubernetes.io/") or k.startswith("beta.")],
              "nfd-master": [k for k in meta["labels"] if k.startswith("feature.node")],
              "gpu-feature-discovery": [k for k in meta["labels"] if k.startswith("nvidia.com/")],
              "tessera": [], "kube-controller-manager": []}
    conditions = {f'k:{{"type":"{c}"}}': {".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {},
                                          "f:reason": {}, "f:status": {}, "f:type": {}}
                  for c in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")}
    status_fields = {"f:conditions": conditions, "f:images": {}, "f:nodeInfo": {}, "f:allocatable": {}, "f:capacity": {}}
    meta["managedFields"] = [
        {"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-11-30T07:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in keys}},
                      **({"f:status": status_fields} if m == "kubelet" else {})}}
        for m, keys in owners.items()]
    node["status"]["images"] = [{"names": [f"registry.example.com/team-{k % 7}/image-{k:03d}@sha256:{k:064x}",
                                           f"registry.example.com/team-{k % 7}/image-{k:03d}:v1.{k}.0-cuda12.4"],
                                 "sizeBytes": 1_000_000_000 + k} for k in range(50)]
    return node


def main() -> int:
    if not FIXTURE.is_file():
        print(f"needs the wire fixtures at {FIXTURE}")
        return 1
    request = json.loads(FIXTURE.read_text())
    base = request["Nodes"]["items"][0]
    one = len(json.dumps(fat_node(base, 0), separators=(",", ":")))
    print(f"one production-sized GPU node: {one / 1024:.1f} KiB (the fixture's bare node: "
          f"{len(json.dumps(base, separators=(',', ':'))) / 1024:.1f} KiB)")
    for n in (1000, 5000):
        limit = max_body_bytes(n, node_cache_capable=False)
        client = create_app(Extender(), binder=None, max_body_bytes=limit).test_client()
        request["Nodes"]["items"] = [fat_node(base, i) for i in range(n)]
        body = json.dumps(request, separators=(",", ":")).encode()
        started = time.perf_counter()
        r = client.post("/tessera/filter", data=body, content_type="application/json")
        took = time.perf_counter() - started
        print(f"{n:>5} nodes: body {len(body) / 2**20:6.1f} MiB = {len(body) / limit:.2f} of the {limit / 2**20:.0f} MiB limit;"
              f" read and answered in {took:.2f} s (status {r.status_code}: {r.get_json()['Error'][:40]!r})")
    return 0


if __name__ == "__main__":
    # it takes no options: --help says what it measures (exit 0), anything else is refused (exit 2) before the 105 MiB run
    argparse.ArgumentParser(prog="python bench/body_size.py", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
