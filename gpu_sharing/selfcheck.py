"""The GPU-machine check (scripts/gpu-check.sh): NVML against nvidia-smi, and a 250-milli slice's memory cap.

    python -m gpu_sharing.selfcheck [--milli 250] [--json]

1. The NVML backend's inventory against `nvidia-smi --query-gpu=index,uuid,name,memory.total`:
   every GPU, its UUID, name and memory must agree.
2. A PyTorch child started by tessera-launch with a slice of GPU 0 allocates 256 MiB blocks
   until PyTorch refuses; it must stop at the slice's share of memory. A second child with the
   whole GPU allocates past that share (up to twice it), which shows the cap, not the card, stopped the first.
Each part prints one line; the exit code is 0 only when every part that could run passed.
Without a driver it says so and exits 2; without torch+CUDA the cap part is reported as skipped.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys

from .devices import BackendUnavailable, GpuDevice

SMI_FIELDS = "index,uuid,name,memory.total"
BLOCK_MIB = 256

ALLOCATE = r"""
import json, sys, torch
limit = float(sys.argv[1])
total = torch.cuda.get_device_properties(0).total_memory
block, blocks = 256 << 20, []
try:
    while (len(blocks) + 1) * block <= limit * total:
        blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    stopped = "reached the limit asked"
except torch.OutOfMemoryError:
    stopped = "OutOfMemoryError"
print(json.dumps({"total": total, "allocated": len(blocks) * block, "stopped": stopped,
                  "visible": torch.cuda.device_count()}))
"""


def parse_smi(text: str) -> list[dict]:
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 4:
            continue
        index, uuid, name, memory = (c.strip() for c in row)
        rows.append({"index": int(index), "uuid": uuid, "name": name, "memory_mib": int(memory.split()[0])})
    return rows


def compare(devices: tuple[GpuDevice, ...], smi: list[dict]) -> list[str]:
    """Every disagreement between the NVML backend and nvidia-smi, in words ([] when they agree)."""
    if len(devices) != len(smi):
        return [f"NVML sees {len(devices)} GPUs, nvidia-smi {len(smi)}"]
    out = []
    for d, s in zip(devices, sorted(smi, key=lambda r: r["index"]), strict=True):
        for field, ours, theirs in (("index", d.index, s["index"]), ("uuid", d.uuid, s["uuid"]),
                                    ("name", d.model, s["name"]), ("memory_mib", d.memory_mib, s["memory_mib"])):
            if ours != theirs:
                out.append(f"GPU {d.index} {field}: NVML {ours!r}, nvidia-smi {theirs!r}")
    return out


def check_inventory() -> dict:
    from .nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        devices, samples = backend.inventory(), backend.sample()
    finally:
        backend.close()
    if not shutil.which("nvidia-smi"):
        return {"part": "inventory", "ok": None, "why": "nvidia-smi not on PATH", "gpus": len(devices)}
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    problems = compare(devices, parse_smi(smi))
    return {"part": "inventory", "ok": not problems, "problems": problems, "gpus": len(devices),
            "devices": [{"index": d.index, "uuid": d.uuid, "model": d.model, "memory_mib": d.memory_mib, "mig": d.mig_mode,
                         "healthy": d.healthy, "nvlink_peers": len(d.nvlink_peers)} for d in devices],
            "samples": [{"index": s.index, "util_pct": s.utilization_pct, "used_mib": s.memory_used_mib,
                         "processes": len(s.processes)} for s in samples]}


def _child(uuid: str, milli: int, limit: float) -> dict:
    env = dict(os.environ, TESSERA_ASSIGNMENT=json.dumps({"node": "check", "gpus": [0], "milli": milli, "uuids": [uuid]}),
               TESSERA_PODINFO="/nonexistent")
    done = subprocess.run([sys.executable, "-m", "gpu_sharing.launch", "--verbose", "--", sys.executable, "-c", ALLOCATE,
                           str(limit)], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_cap(milli: int) -> dict:
    try:
        import torch
    except ImportError:
        return {"part": "memory cap", "ok": None, "why": "torch not installed (pip install -e '.[ray]' with a CUDA wheel)"}
    if not torch.cuda.is_available():
        return {"part": "memory cap", "ok": None, "why": f"torch {torch.__version__} sees no CUDA device"}
    from .nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        uuid = backend.inventory()[0].uuid
    finally:
        backend.close()
    share = milli / 1000
    capped = _child(uuid, milli, 1.0)
    whole = _child(uuid, 1000, min(1.0, 2 * share))
    capped_share, whole_share = capped["allocated"] / capped["total"], whole["allocated"] / whole["total"]
    ok = (capped["stopped"] == "OutOfMemoryError" and capped_share <= share
          and capped_share >= share - 2 * (BLOCK_MIB << 20) / capped["total"] - 0.01 and whole_share > share
          and capped["visible"] == 1)
    return {"part": "memory cap", "ok": ok, "milli": milli, "capped_share": round(capped_share, 4),
            "capped_stopped": capped["stopped"], "whole_gpu_share": round(whole_share, 4), "visible_devices": capped["visible"],
            "total_mib": capped["total"] >> 20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--milli", type=int, default=250)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.milli < 1000:
        parser.error("--milli must be a slice: 1..999")
    results = []
    try:
        results.append(check_inventory())
    except BackendUnavailable as e:
        print(f"gpu-check: no GPU driver here: {e}", file=sys.stderr)
        return 2
    try:
        results.append(check_cap(args.milli))
    except (RuntimeError, subprocess.SubprocessError, ValueError) as e:
        results.append({"part": "memory cap", "ok": False, "why": str(e)})
    for r in results:
        if args.json:
            print(json.dumps(r))
            continue
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[r["ok"]]
        detail = {k: v for k, v in r.items() if k not in ("part", "ok", "devices", "samples")}
        print(f"{verdict} {r['part']}: {json.dumps(detail)}")
        for d in r.get("devices", []):
            print(f"     GPU {d['index']} {d['uuid']} {d['model']} {d['memory_mib']} MiB mig={d['mig']} healthy={d['healthy']} "
                  f"nvlink_peers={d['nvlink_peers']}")
    return 0 if all(r["ok"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
