"""A trace's nodes and pods as the Node and Pod objects the real-cluster benches create (bench/kube_openb.py,
bench/kube_timeline.py), and where they read the openb trace from."""

from __future__ import annotations

import os
from pathlib import Path

# the data sit beside the checkout; a checkout elsewhere (a git worktree) names them with TESSERA_OPENB_DIR
SHARED = Path(os.environ.get("TESSERA_OPENB_DIR") or Path(__file__).resolve().parents[2] / "shared/data/openb")


def node_body(n) -> dict:
    capacity = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi", "pods": "1000", "nvidia.com/gpu": str(n.gpu_count)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n.name, "labels": {"nvidia.com/gpu.product": n.gpu_model}},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


def pod_body(p, name: str) -> dict:
    limits = {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"}
    if p.gpu_count and p.is_slice:
        limits["tessera.dev/gpu-milli"] = str(p.gpu_milli)
    elif p.gpu_count:
        limits["nvidia.com/gpu"] = str(p.gpu_count)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "none", "resources": {"limits": limits, "requests": limits}}],
                     "terminationGracePeriodSeconds": 0}}
